// bcc C, included after unwind.bpf.h: the Python frames of the sampled thread, read from the interpreter itself
// (stock CPython, no -X perf, no frame pointers needed).
//
// A CPython process has an entry in `py_procs` (producers/python_procs.py writes it when the process's tables
// load): where `_PyRuntime` is and the struct offsets of its version. Per sample: the sampled thread's thread state
// (the interpreter's list of them, matched by native thread id; the last match per thread is kept in `py_threads`
// and checked again before use), then its frame chain from the innermost frame out: per frame the code object's
// address and the instruction offset in code units, packed into one word:
//
//     bit 63: an entry frame (the first Python frame of one _PyEval_EvalFrameDefault call)
//     bits 48-62: the instruction offset in code units (capped at 0x7fff)
//     bits 0-47: the code object's address
//
// User space (producers/python_frames.py) reads the code objects and puts each run of Python frames in place of the
// native evaluation frame that ran it. Frames go after the native ones, behind PY_MARK; a chain cut by the frame
// limit or a failed read (the thread runs on while it is read: expected now and then) ends in UNWIND_TRUNCATED.
//
// 3.11 marks entry frames itself (is_entry); from 3.12 the evaluator puts a frame owned by the C stack (a shim)
// before the first Python frame of each call instead: it is skipped, and the frame after it is the entry.

#define PY_MAX_FRAMES 64
#define PY_FRAMES_PER_CALL 32
#define PY_MAX_CALLS 2           // programs a Python walk spans: PY_MAX_FRAMES / PY_FRAMES_PER_CALL
#define PY_MAX_THREADS 128       // thread states (and interpreters) looked at to find the sampled thread's
#define PY_NONE 0xffff           // an offset the version does not have
#define PY_MARK 0xfffffffffffffffdULL  // producers/python_frames.py PY_MARK: Python frames follow
#define PY_FRAME_READ 80         // bytes of a frame read at once: every field the walk needs lies in them
#define PY_ENTRY (1ULL << 63)
#define PY_FRAMES_SLOTS 128     // a power of two above PY_MAX_FRAMES + 2: indexes are masked with it
#define PY_USED (PY_MAX_FRAMES + 2)  // the most of frames[] a walk uses
#ifndef PY_PROCS
#define PY_PROCS 4096
#endif

// Keep in step with PY_PROC in producers/python_procs.py.
struct py_proc {
    u64 runtime;                 // _PyRuntime's address in the process
    u16 interpreters_head;       // in _PyRuntimeState
    u16 threads_head;            // in PyInterpreterState
    u16 interp_next;             // in PyInterpreterState: the next (older) interpreter
    u16 tstate_next;
    u16 tstate_native_thread_id;
    u16 tstate_frame;            // 3.11, 3.12: cframe; 3.13+: current_frame
    u16 cframe_current_frame;    // PY_NONE: tstate_frame holds the frame itself
    u16 frame_code;
    u16 frame_previous;
    u16 frame_instr;             // prev_instr (3.11, 3.12) or instr_ptr (3.13+)
    u16 frame_owner;
    u16 frame_is_entry;          // PY_NONE from 3.12
    u16 code_adaptive;           // where the bytecode starts in a code object
    u8 owner_cstack;             // 0xff: no frames owned by the C stack (3.11)
    u8 pad[5];
};

// Python walk stats (index into `py_stats`; keep in step with PY_STATS in producers/python_procs.py).
#define PS_SAMPLES 0       // samples of a known CPython process
#define PS_NO_THREAD 1     // its thread has no thread state (a thread Python does not know, or not yet)
#define PS_FRAMES 2        // Python frames read
#define PS_READ_FAILED 3   // a frame or thread state could not be read: the chain ends there, marked
#define PS_LIMIT 4         // cut at PY_MAX_FRAMES, marked
#define PS_IDLE 5          // a Python thread with no frame running (between calls, or finishing)
#define N_PY_STATS 6

struct py_walk {
    u64 frame;     // the next frame to read; 0: the chain has ended
    u32 n;         // frames[] used
    u32 calls;
    u8 buf[136];   // one frame's first PY_FRAME_READ bytes; fields are read at offsets masked to 127
    u64 frames[PY_FRAMES_SLOTS];   // PY_MARK, the frames, and an UNWIND_TRUNCATED mark; the rest unused
};

// The CPU sampler owns the entries (and exports them); the GPU probes' program (-DPY_EXTERN) reads the same map.
#ifdef PY_EXTERN
BPF_TABLE("extern", u32, struct py_proc, py_procs, PY_PROCS);
#else
BPF_HASH(py_procs, u32, struct py_proc, PY_PROCS);
__attribute__((section("maps/export"))) struct py_procs_table_t __py_procs;  // what BPF_TABLE_PUBLIC adds
#endif
BPF_TABLE("lru_hash", u32, u64, py_threads, 16384);  // tid -> its thread state's address, when last found
BPF_PERCPU_ARRAY(py_walks, struct py_walk, 1);
BPF_PERCPU_ARRAY(py_stats, u64, N_PY_STATS);

static __always_inline void py_count(int which, u64 n) {
    u64 *v = py_stats.lookup(&which);
    if (v)
        *v += n;
}

static __always_inline int py_read(void *dst, u32 size, u64 addr) {
    return addr ? bpf_probe_read_user(dst, size, (void *)addr) : -1;
}

// The sampled thread's thread state: the one found last time if it still names the thread, else the interpreters'
// lists searched (the newest interpreter first, then the older ones: subinterpreters, then the main one; in each,
// the newest thread first). 0 when the thread has none.
static __always_inline u64 py_thread_state(struct py_proc *pp, u32 tid) {
    u64 ts = 0, id = 0;
    u64 *known = py_threads.lookup(&tid);
    if (known && py_read(&id, 8, *known + pp->tstate_native_thread_id) == 0 && id == tid)
        return *known;
    u64 interp = 0;
    if (py_read(&interp, 8, pp->runtime + pp->interpreters_head) || py_read(&ts, 8, interp + pp->threads_head))
        return 0;
    // one bound for threads and interpreters together: a second counter would multiply the verifier's states
#pragma clang loop unroll(disable)
    for (int i = 0; i < PY_MAX_THREADS; i++) {
        if (!ts) {  // this interpreter's threads are done: the next one's
            if (py_read(&interp, 8, interp + pp->interp_next) || !interp || py_read(&ts, 8, interp + pp->threads_head))
                return 0;
            continue;
        }
        if (py_read(&id, 8, ts + pp->tstate_native_thread_id))
            return 0;
        if (id == tid) {
            py_threads.update(&tid, &ts);
            return ts;
        }
        if (py_read(&ts, 8, ts + pp->tstate_next))
            return 0;
    }
    return 0;
}

// Starts the walk of the sampled thread's frames; 0 when it has none to walk.
static __always_inline int py_begin(struct py_proc *pp, struct py_walk *w, u32 tid) {
    w->n = 0;
    w->calls = 0;
    w->frame = 0;
    py_count(PS_SAMPLES, 1);
    u64 ts = py_thread_state(pp, tid);
    if (!ts) {
        py_count(PS_NO_THREAD, 1);
        return 0;
    }
    u64 at = 0;
    if (py_read(&at, 8, ts + pp->tstate_frame))
        goto failed;
    if (pp->cframe_current_frame != PY_NONE && py_read(&at, 8, at + pp->cframe_current_frame))
        goto failed;
    if (!at) {
        py_count(PS_IDLE, 1);
        return 0;
    }
    w->frames[0] = PY_MARK;
    w->n = 1;
    w->frame = at;
    return 1;
failed:
    py_count(PS_READ_FAILED, 1);
    w->frames[0] = PY_MARK;
    w->frames[1] = UNWIND_TRUNCATED;
    w->n = 2;
    return 0;
}

static __always_inline u64 py_word(struct py_walk *w, u16 off) {
    return *(u64 *)(w->buf + (off & 127));
}

// Reads up to PY_FRAMES_PER_CALL frames; returns 1 when the chain has ended (cut and marked, if it had to be).
static __always_inline int py_frames(struct py_proc *pp, struct py_walk *w) {
#pragma clang loop unroll(disable)
    for (int k = 0; k < PY_FRAMES_PER_CALL; k++) {
        u64 at = w->frame;
        if (!at)
            return 1;
        u32 n = w->n;
        if (n > PY_MAX_FRAMES) {
            py_count(PS_LIMIT, 1);
            w->frames[PY_MAX_FRAMES + 1] = UNWIND_TRUNCATED;
            w->n = PY_MAX_FRAMES + 2;
            return 1;
        }
        if (py_read(w->buf, PY_FRAME_READ, at)) {
            py_count(PS_READ_FAILED, 1);
            w->frames[n & (PY_FRAMES_SLOTS - 1)] = UNWIND_TRUNCATED;  // masked for the verifier
            w->n = n + 1;
            return 1;
        }
        w->frame = py_word(w, pp->frame_previous);
        u8 owner = w->buf[pp->frame_owner & 127];
        if (owner == pp->owner_cstack) {
            // the shim frame a call of the evaluator starts with: the Python frame before it was that call's first
            if (n > 1)
                w->frames[(n - 1) & (PY_FRAMES_SLOTS - 1)] |= PY_ENTRY;
            continue;
        }
        u64 code = py_word(w, pp->frame_code);
        u64 instr = py_word(w, pp->frame_instr);
        u64 first = code + pp->code_adaptive;
        u64 units = instr > first ? (instr - first) >> 1 : 0;
        if (units > 0x7fff)
            units = 0x7fff;
        u64 word = (code & 0xffffffffffffULL) | (units << 48);
        if (pp->frame_is_entry != PY_NONE && w->buf[pp->frame_is_entry & 127])
            word |= PY_ENTRY;
        w->frames[n & (PY_FRAMES_SLOTS - 1)] = word;
        w->n = n + 1;
        py_count(PS_FRAMES, 1);
    }
    return w->frame == 0;
}

// Whether a sample or launch of `pid` goes on to its Python frames (the caller tail-calls the Python program then):
// the process is CPython, and the walk is set to begin.
static __always_inline int py_wanted(u32 pid) {
    int zero = 0;
    struct py_walk *w = py_walks.lookup(&zero);
    if (!w || !py_procs.lookup(&pid))
        return 0;
    w->calls = 0;
    w->n = 0;
    return 1;
}

// Ends a chain that the programs ran out on: cut here, marked.
static __always_inline void py_cut(struct py_walk *w) {
    u32 n = w->n;
    w->frames[n & (PY_FRAMES_SLOTS - 1)] = UNWIND_TRUNCATED;
    w->n = n + 1;
    py_count(PS_LIMIT, 1);
}

// One program's share of the walk of `tid`'s Python frames; 1 when the caller should tail-call the next program
// (and py_cut if that fails). The first program only finds the thread's state and first frame: the search and a
// frame loop in one program are past what the verifier takes (every path of the one through the other).
static __always_inline int py_step(u32 pid, u32 tid, struct py_walk *w) {
    struct py_proc *pp = py_procs.lookup(&pid);
    if (!pp)
        return 0;
    if (w->calls == 0) {
        int found = py_begin(pp, w, tid);  // 0: no frames to walk
        w->calls = 1;
        return found;
    }
    if (py_frames(pp, w))
        return 0;
    if (++w->calls <= PY_MAX_CALLS)
        return 1;
    py_cut(w);
    return 0;
}
