// bcc C, included by cpu_sampler.bpf.c and gpu_probes.bpf.c: a user stack unwound frame by frame from the call-frame
// tables the agent loads (producers/unwind_maps.py; rows compiled from .eh_frame / .debug_frame by
// producers/unwind_tables.py), from the registers of the sample.
//
// Per frame: the process's executable mapping holding the pc (a binary search in `unwind_procs`), then that file's
// rule for the pc (a binary search in its slice of `unwind_rows`): where the caller's frame (the CFA) is, and where
// the caller's RBP was saved. The return address is at CFA - 8 (x86_64). Code without tables (a mapping with no rows,
// a pc no row covers: JIT code, perf-map code, assembly without CFI) is walked by its frame pointer, as before; a
// process whose tables are not loaded yet is walked by frame pointers only.
//
// A walk ends cleanly at a frame whose rules say the return address is undefined (`_start`, `clone3`: the thread's
// root) or at a zero frame pointer / return address; any other end (the frame limit, an unreadable frame, a rule the
// walker cannot follow) appends UNWIND_TRUNCATED, which the symbolizer shows as `[truncated]`, and is counted.
//
// arm64 (not built yet): the same rows, with "RBP" read as the frame pointer x29, the CFA from SP or x29, and the
// return address of the leaf frame in the link register x30 until the prologue saves it (a third rule, "RA saved at
// CFA + n" or "RA in x30", which x86_64 does not need: its return address is always at CFA - 8).
//
// A walk spans programs: each walks UNWIND_FRAMES_PER_CALL frames and tail-calls the next (`unwind_progs`), its
// state per CPU in `unwind_states`. One program walking all 128 frames is past the verifier's million instructions
// (every frame holds two binary searches), and bcc 0.26 cannot hand bpf_loop a callback (it does not relocate a
// function's address: the verifier sees a scalar).
//
// Stack memory is copied a page at a time (from an address to the end of its page, which is mapped if the address
// is) and the words inside are read from the copy: one read per page, not per word.

#ifndef UNWIND_ROWS
#define UNWIND_ROWS (1 << 23)
#endif
#ifndef UNWIND_RULES
#define UNWIND_RULES 65536  // distinct rules of all loaded files (a 500 MB library has ~1,500)
#endif
#ifndef UNWIND_PROCS
#define UNWIND_PROCS 8192
#endif
#define UNWIND_MAPPINGS 512   // executable mappings of one process with a place in the table; a power of two
#define UNWIND_MAX_FRAMES 128
#ifndef UNWIND_FRAMES_PER_CALL
#define UNWIND_FRAMES_PER_CALL 16  // frames one program walks before it tail-calls the next (the verifier's limit)
#endif
#define UNWIND_MAX_CALLS 12         // tail calls a walk may make (the kernel allows 33 in all)
#define UNWIND_TRUNCATED 0xfffffffffffffffeULL  // schemas/wire.py TRUNCATED_FRAME
#define UNWIND_PAGE 4096

// Row kinds: keep in step with producers/unwind_tables.py.
#define CFA_NONE 0         // no rule covers the pc: frame pointers
#define CFA_RSP 1          // CFA = RSP + cfa_offset
#define CFA_RBP 2          // CFA = RBP + cfa_offset
#define CFA_PLT 3          // CFA = RSP + cfa_offset + ((RIP & 15) >= rbp_offset ? 8 : 0)
#define CFA_DEREF_RBP 4    // CFA = *(RBP + cfa_offset): stack realignment
#define CFA_DEREF_RSP 5    // CFA = *(RSP + cfa_offset)
#define CFA_SIGNAL 6       // a signal trampoline: the interrupted registers are in the ucontext at RSP
#define CFA_END 7          // the return address is undefined: the thread's root
#define RBP_SAME 0
#define RBP_SAVED 1        // the caller's RBP = *(CFA + rbp_offset)
#define RBP_UNKNOWN 2
#define RBP_AT_RBP 3       // the caller's RBP = *(RBP + rbp_offset): stack realignment

// The interrupted registers in a signal frame: struct ucontext_t's uc_mcontext (x86_64 kernel ABI).
#define SIGFRAME_RBP 120
#define SIGFRAME_RSP 160
#define SIGFRAME_RIP 168

// How walks ended, and what they met (index into `unwind_stats`; keep in step with UNWIND_STATS in
// producers/unwind_maps.py).
#define US_ROOT 0           // reached a frame whose return address is undefined
#define US_FP_END 1         // a frame-pointer walk ended at a zero frame pointer or return address
#define US_LIMIT 2          // cut at UNWIND_MAX_FRAMES
#define US_READ_FAILED 3    // a word of the stack could not be read
#define US_UNSUPPORTED 4    // a rule the walker cannot follow
#define US_BAD_FRAME 5      // a caller's frame that does not lie above its callee's (corrupt stack or rule)
#define US_NO_TABLES 6      // the process's tables were not loaded yet: walked by frame pointers
#define US_UNMAPPED 7       // a pc in no mapping the tables know (a library loaded since): frame pointers
#define US_FP_FRAMES 8      // frames walked by frame pointer
#define US_TABLE_FRAMES 9   // frames walked by table
#define US_SIGNAL_FRAMES 10
#define US_NO_USER 11       // no user registers (a kernel thread)
#define N_UNWIND_STATS 12

// A file's rows are (pc, rule): few rules are distinct across all files, so each is stored once, and a row takes 8
// bytes of kernel memory (a BPF array rounds its elements up to 8 bytes).
struct unwind_row {
    u32 pc;    // the file's virtual address where the rule starts; it holds until the next row's pc
    u32 rule;  // index into unwind_rules
};

// What producers/unwind_tables.py compiles per row (its 12-byte rows: pc, then these 8 bytes).
struct unwind_rule {
    s32 cfa_offset;
    s16 rbp_offset;  // CFA_PLT: the threshold instead
    u8 cfa_kind;
    u8 rbp_kind;
};

struct unwind_mapping {
    u64 start;       // the mapping's addresses [start, end)
    u64 end;
    u64 bias;        // pc - bias = the file's virtual address
    u32 rows_start;  // the file's rows in unwind_rows; rows_len 0: no table (frame pointers)
    u32 rows_len;
};

struct unwind_proc {
    u32 count;  // mappings used, sorted by start
    u32 pad;
    struct unwind_mapping maps[UNWIND_MAPPINGS];
};

// A walk in progress: it spans several programs (tail calls), so it lives here, per CPU, not on the BPF stack.
struct unwind_state {
    u64 pc, sp, bp;
    u64 hash;        // of the frames so far: equal stacks, equal hashes
    u32 tgid;
    u32 n;           // entries of stack[] used
    s32 end;         // how the walk ended (US_*), -1 while it goes on
    u8 bp_known;
    u8 exact;        // pc is where the frame is, not a return address just past a call
    u8 unmapped;     // a pc lay in no known mapping: the process's mappings should be read again
    u8 calls;        // tail calls so far
    u32 lo, hi;      // a binary search's bounds (see unwind_find_mapping)
    u32 last_map;    // 1 + the index of the last frame's mapping, 0: none yet
    u32 table_frames, fp_frames;
    u64 base;        // page holds the user memory [base, base + have)
    u64 have;
    u8 page[UNWIND_PAGE];
    u64 stack[UNWIND_MAX_FRAMES + 1];  // leaf first; one more than the frame limit, for the UNWIND_TRUNCATED mark
};

// One array for the rows of every loaded file (the agent allocates each file a slice), written by user space
// through mmap; the rules; the per-process mappings keyed by tgid. The program that owns them (the CPU sampler) exports
// them; another program of the agent (the GPU probes, -DUNWIND_EXTERN) uses the same maps: one copy of the tables.
#ifdef UNWIND_EXTERN
BPF_TABLE("extern", u32, struct unwind_row, unwind_rows, UNWIND_ROWS);
BPF_TABLE("extern", u32, struct unwind_rule, unwind_rules, UNWIND_RULES);
BPF_TABLE("extern", u32, struct unwind_proc, unwind_procs, UNWIND_PROCS);
#else
BPF_F_TABLE("array", u32, struct unwind_row, unwind_rows, UNWIND_ROWS, BPF_F_MMAPABLE);
BPF_ARRAY(unwind_rules, struct unwind_rule, UNWIND_RULES);
BPF_F_TABLE("hash", u32, struct unwind_proc, unwind_procs, UNWIND_PROCS, BPF_F_NO_PREALLOC);
#ifdef UNWIND_TABLES
// what bcc's BPF_TABLE_PUBLIC adds to a table: the export (the macro cannot pass flags such as BPF_F_MMAPABLE)
__attribute__((section("maps/export"))) struct unwind_rows_table_t __unwind_rows;
__attribute__((section("maps/export"))) struct unwind_rules_table_t __unwind_rules;
__attribute__((section("maps/export"))) struct unwind_procs_table_t __unwind_procs;
#endif
#endif
BPF_PERCPU_ARRAY(unwind_stats, u64, N_UNWIND_STATS);
BPF_PERCPU_ARRAY(unwind_states, struct unwind_state, 1);

static __always_inline void unwind_count(int which, u64 n) {
    u64 *v = unwind_stats.lookup(&which);
    if (v)
        *v += n;  // per CPU: no other writer
}

// The word at user address `addr`, through the page copy; 0 on success.
static __always_inline int unwind_read(struct unwind_state *s, u64 addr, u64 *out) {
    if (addr >= s->base && addr + 8 <= s->base + s->have) {
        u64 off = addr - s->base;
        if (off > UNWIND_PAGE - 8)
            return -1;
        *out = *(u64 *)(s->page + off);
        return 0;
    }
    u32 rest = UNWIND_PAGE - (addr & (UNWIND_PAGE - 1));
    if (rest >= 8 && rest <= UNWIND_PAGE && bpf_probe_read_user(s->page, rest, (void *)addr) == 0) {
        s->base = addr;
        s->have = rest;
        *out = *(u64 *)(s->page);
        return 0;
    }
    s->have = 0;
    return bpf_probe_read_user(out, 8, (void *)addr) == 0 ? 0 : -1;  // a word across two pages
}

// The binary searches keep their bounds in the per-CPU state, not in registers: a bound read back from memory is
// unknown to the verifier, so the two sides of each halving reach the loop head as the same state. Kept in
// registers, every path through the halvings is a state of its own, 2^halvings of them, past the verifier's limit.
static __always_inline struct unwind_mapping *unwind_find_mapping(struct unwind_state *s, struct unwind_proc *proc,
                                                                  u64 pc) {
    // a caller is most often in the same file as its callee: try the last frame's mapping first
    struct unwind_mapping *last = &proc->maps[(s->last_map - 1) & (UNWIND_MAPPINGS - 1)];
    if (s->last_map && last->start <= pc && pc < last->end)
        return last;
    s->lo = 0;
    s->hi = proc->count;
#pragma clang loop unroll(disable)
    for (int i = 0; i < 10; i++) {  // log2(UNWIND_MAPPINGS) + 1 halvings
        u32 lo = s->lo, hi = s->hi;
        if (lo >= hi)
            break;
        u32 mid = (lo + hi) / 2;
        if (proc->maps[mid & (UNWIND_MAPPINGS - 1)].start <= pc)
            s->lo = mid + 1;
        else
            s->hi = mid;
    }
    u32 lo = s->lo;
    if (lo == 0 || lo > UNWIND_MAPPINGS)
        return 0;
    struct unwind_mapping *m = &proc->maps[(lo - 1) & (UNWIND_MAPPINGS - 1)];
    if (pc >= m->end)
        return 0;
    s->last_map = lo;
    return m;
}

// The rule of the last row of [start, start + len) whose pc <= addr, or 0.
static __always_inline struct unwind_rule *unwind_find_rule(struct unwind_state *s, u32 start, u32 len, u64 addr) {
    s->lo = start;
    s->hi = start + len;
#pragma clang loop unroll(disable)
    for (int i = 0; i < 25; i++) {  // log2(UNWIND_ROWS) + 2 halvings
        u32 lo = s->lo, hi = s->hi;
        if (lo >= hi)
            break;
        u32 mid = lo + (hi - lo) / 2;
        struct unwind_row *row = unwind_rows.lookup(&mid);
        if (!row)
            return 0;
        if (row->pc <= addr)
            s->lo = mid + 1;
        else
            s->hi = mid;
    }
    u32 at = s->lo;
    if (at == start)
        return 0;
    at--;
    struct unwind_row *row = unwind_rows.lookup(&at);
    return row ? unwind_rules.lookup(&row->rule) : 0;
}

// A new walk from the registers of the sample; its state is returned (0 when the per-CPU state is missing).
static __always_inline struct unwind_state *unwind_begin(u32 tgid, u64 pc, u64 sp, u64 bp) {
    int zero = 0;
    struct unwind_state *s = unwind_states.lookup(&zero);
    if (!s)
        return 0;
    s->pc = pc;
    s->sp = sp;
    s->bp = bp;
    s->hash = 0xcbf29ce484222325ULL;
    s->tgid = tgid;
    s->n = 0;
    s->end = -1;
    s->bp_known = 1;
    s->exact = 1;
    s->unmapped = 0;
    s->calls = 0;
    s->last_map = 0;
    s->table_frames = s->fp_frames = 0;
    s->have = 0;
    return s;
}

// Walks up to UNWIND_FRAMES_PER_CALL frames; returns 1 when the walk has ended (s->end says how).
static __always_inline int unwind_frames(struct unwind_state *s) {
#ifdef UNWIND_TABLES
    struct unwind_proc *proc = unwind_procs.lookup(&s->tgid);
#else
    struct unwind_proc *proc = 0;
#endif
    if (!proc && s->n == 0)
        unwind_count(US_NO_TABLES, 1);
#pragma clang loop unroll(disable)
    for (int k = 0; k < UNWIND_FRAMES_PER_CALL; k++) {
        u32 i = s->n;
        if (i >= UNWIND_MAX_FRAMES) {
            s->end = US_LIMIT;
            return 1;
        }
        u64 pc = s->pc, sp = s->sp, bp = s->bp;
        s->stack[i & (UNWIND_MAX_FRAMES - 1)] = pc;
        s->n = i + 1;
        s->hash = (s->hash ^ pc) * 0x100000001b3ULL;
        struct unwind_rule *row = 0;
        if (proc) {
            struct unwind_mapping *m = unwind_find_mapping(s, proc, pc);
            if (!m)
                s->unmapped = 1;
            else if (m->rows_len)
                row = unwind_find_rule(s, m->rows_start, m->rows_len, pc - m->bias - (s->exact ? 0 : 1));
        }
        u64 cfa = 0, next_bp = bp, ra = 0;
        u8 kind = row ? row->cfa_kind : CFA_NONE;
        if (kind == CFA_END) {
            s->end = US_ROOT;
            return 1;
        }
        if (kind == CFA_SIGNAL) {
            u64 next_sp = 0;
            if (unwind_read(s, sp + SIGFRAME_RIP, &ra) || unwind_read(s, sp + SIGFRAME_RSP, &next_sp) ||
                unwind_read(s, sp + SIGFRAME_RBP, &next_bp)) {
                s->end = US_READ_FAILED;
                return 1;
            }
            unwind_count(US_SIGNAL_FRAMES, 1);
            s->pc = ra;
            s->sp = next_sp;
            s->bp = next_bp;
            s->bp_known = 1;
            s->exact = 1;  // the interrupted instruction itself
            if (ra == 0) {
                s->end = US_ROOT;
                return 1;
            }
            continue;
        }
        if (kind == CFA_NONE) {  // frame pointers: [bp] = the caller's bp, [bp + 8] = the return address
            if (!s->bp_known) {
                s->end = US_UNSUPPORTED;
                return 1;
            }
            if (bp == 0) {
                s->end = US_FP_END;
                return 1;
            }
            // A frame pointer below the stack pointer, or not 8-aligned, is no frame pointer (code without them
            // uses RBP for anything): end here rather than read there, where a fault costs microseconds.
            if (bp < sp || (bp & 7)) {
                s->end = US_BAD_FRAME;
                return 1;
            }
            if (unwind_read(s, bp, &next_bp) || unwind_read(s, bp + 8, &ra)) {
                s->end = US_READ_FAILED;
                return 1;
            }
            cfa = bp + 16;
            s->fp_frames++;
        } else {
            s32 off = row->cfa_offset;
            if (kind == CFA_RSP) {
                cfa = sp + off;
            } else if (kind == CFA_RBP && s->bp_known) {
                cfa = bp + off;
            } else if (kind == CFA_PLT) {
                cfa = sp + off + ((s64)(pc & 15) >= row->rbp_offset ? 8 : 0);
            } else if ((kind == CFA_DEREF_RBP && s->bp_known) || kind == CFA_DEREF_RSP) {
                if (unwind_read(s, (kind == CFA_DEREF_RBP ? bp : sp) + off, &cfa)) {
                    s->end = US_READ_FAILED;
                    return 1;
                }
            } else {
                s->end = US_UNSUPPORTED;
                return 1;
            }
            if (unwind_read(s, cfa - 8, &ra)) {
                s->end = US_READ_FAILED;
                return 1;
            }
            if (row->rbp_kind == RBP_SAVED || (row->rbp_kind == RBP_AT_RBP && s->bp_known)) {
                if (unwind_read(s, (row->rbp_kind == RBP_SAVED ? cfa : bp) + row->rbp_offset, &next_bp)) {
                    s->end = US_READ_FAILED;
                    return 1;
                }
            } else if (row->rbp_kind != RBP_SAME) {
                s->bp_known = 0;
            }
            s->table_frames++;
        }
        if (cfa <= sp) {  // a caller's frame lies above its callee's: anything else would loop, or is junk
            s->end = US_BAD_FRAME;
            return 1;
        }
        if (ra == 0) {
            s->end = kind == CFA_NONE ? US_FP_END : US_ROOT;
            return 1;
        }
        s->pc = ra;
        s->sp = cfa;
        s->bp = next_bp;
        s->exact = 0;
    }
    return 0;
}

// Ends the walk: marks a stack that did not reach its root, counts how it ended.
static __always_inline void unwind_finish(struct unwind_state *s) {
    if (s->end < 0)
        s->end = US_LIMIT;  // the tail calls ran out
    unwind_count(US_FP_FRAMES, s->fp_frames);
    unwind_count(US_TABLE_FRAMES, s->table_frames);
    unwind_count(s->end & 15, 1);
    if (s->unmapped)
        unwind_count(US_UNMAPPED, 1);
    if (s->end != US_ROOT && s->end != US_FP_END) {
        u32 at = s->n;
        if (at > UNWIND_MAX_FRAMES)
            at = UNWIND_MAX_FRAMES;
        s->stack[at] = UNWIND_TRUNCATED;
        s->n = at + 1;
        s->hash = (s->hash ^ UNWIND_TRUNCATED) * 0x100000001b3ULL;
    }
}
