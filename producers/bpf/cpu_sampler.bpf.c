// bcc C: CPU stack sampling on a software perf_event (CPU clock), aggregated in the kernel (as bcc's tools/profile.py).
// producers/cpu_sampler.py compiles it with -D settings: MAX_ENTRIES, STACK_ENTRIES, KNOWN_PIDS, FILTER_PID when
// filtering, UNWIND_TABLES (and UNWIND_ROWS, UNWIND_PROCS) when user stacks are unwound from the agent's call-frame
// tables (unwind.bpf.h; without it, by frame pointers).
// Only helpers read the task: the headers bcc compiles against may be older than the running kernel, so struct
// offsets (task_struct->...) could be silently wrong.
//
// Double-buffered: samples go to the maps of the current generation (counts0/stacks0/ustacks0 or the 1s). User
// space flips `generation`, lets in-flight samples finish, then reads and clears the other pair at leisure, so no
// sample counted during a drain is lost and no stack id is freed while a new count still refers to it.
//
// The first sample of a process (and the first after it ran exec) also puts its pid on the `new_pids` ring, which
// wakes user space (new processes are rare, so the wake-ups are too): a process that lives a fraction of a second is
// read from /proc while it still runs, not at the next once-a-second look, when it may be gone. A process whose stack
// reached a pc in no mapping its tables know (a library it loaded since) is announced again, at most once a second,
// so its mappings are read again.
//
// A CPython process's samples also get the thread's Python frames (python.bpf.h), after its native ones.
#include <uapi/linux/ptrace.h>
#include <uapi/linux/bpf_perf_event.h>
#include "unwind.bpf.h"
#include "python.bpf.h"

#ifndef MAX_ENTRIES
#define MAX_ENTRIES 10240
#endif
#ifndef STACK_ENTRIES
#define STACK_ENTRIES 16384
#endif
#ifndef KNOWN_PIDS
#define KNOWN_PIDS 65536
#endif
#define ANNOUNCE_AGAIN_NS 1000000000ULL

// Keep in step with KEY_FIELDS in producers/cpu_sampler.py (a test compares the two).
struct key_t {
    u32 pid;  // tgid: the process
    u32 tid;
    u64 user_stack;      // the user stack's hash: its key in ustacks
    s32 user_status;     // 0, -EFAULT (no user stack: a kernel thread), or -errno: its stack was lost
    s32 kernel_stack_id; // negative: -errno from get_stackid (-EFAULT: no kernel stack, else lost)
};

// Keep in step with USER_STACK in producers/cpu_sampler.py.
struct user_stack {
    u32 len;  // entries used: the native frames (an UNWIND_TRUNCATED mark included), then any Python part
    u32 pad;
    u64 addrs[UNWIND_MAX_FRAMES + 1 + PY_USED];
};

BPF_HASH(counts0, struct key_t, u64, MAX_ENTRIES);
BPF_HASH(counts1, struct key_t, u64, MAX_ENTRIES);
BPF_STACK_TRACE(stacks0, STACK_ENTRIES);  // kernel stacks
BPF_STACK_TRACE(stacks1, STACK_ENTRIES);
BPF_HASH(ustacks0, u64, struct user_stack, STACK_ENTRIES);
BPF_HASH(ustacks1, u64, struct user_stack, STACK_ENTRIES);
BPF_PERCPU_ARRAY(ustack_scratch, struct user_stack, 1);
BPF_ARRAY(generation, u32, 1);  // which set samples go to: its low bit
BPF_ARRAY(dropped, u64, 2);  // per generation: samples lost because that generation's counts map was full
BPF_HASH(known_pids, u32, u64, KNOWN_PIDS);  // processes announced on new_pids, with when (bpf_ktime_get_ns)
BPF_RINGBUF_OUTPUT(new_pids, 4);  // 16 KiB: 4,096 announcements between two reads

static inline void announce(u32 tgid, int again) {
    u64 now = bpf_ktime_get_ns();
    u64 *last = known_pids.lookup(&tgid);
    if (last) {
        if (!again || now - *last < ANNOUNCE_AGAIN_NS)
            return;
        *last = now;
    } else if (known_pids.insert(&tgid, &now) != 0) {  // the map is full: the once-a-second look finds it
        return;
    }
    new_pids.ringbuf_output(&tgid, sizeof(tgid), 0);  // 0: wake the reader if it waits
}

// A process that runs exec has new mappings: announce it again at its next sample.
TRACEPOINT_PROBE(sched, sched_process_exec) {
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    known_pids.delete(&tgid);
    return 0;
}

// Its pid may be reused: forget it when the whole process (its leader thread) exits.
TRACEPOINT_PROBE(sched, sched_process_exit) {
    u64 pid_tgid = bpf_get_current_pid_tgid();
    u32 tgid = pid_tgid >> 32;
    if ((u32)pid_tgid == tgid)
        known_pids.delete(&tgid);
    return 0;
}

// The thread's user registers: the sample's own when it interrupted user mode, else those saved at its entry into
// the kernel. 0 when there are none (a kernel thread).
static __always_inline int user_regs(struct bpf_perf_event_data *ctx, u64 *pc, u64 *sp, u64 *bp) {
    struct pt_regs regs = {};
    // read through the helper: the verifier refuses loads at computed offsets into the context
    bpf_probe_read_kernel(&regs, sizeof(regs), &ctx->regs);
    if ((regs.cs & 3) != 3) {
        void *saved = (void *)bpf_task_pt_regs(bpf_get_current_task_btf());
        if (!saved || bpf_probe_read_kernel(&regs, sizeof(regs), saved) < 0 || (regs.cs & 3) != 3)
            return 0;
    }
    if (regs.ip == 0)
        return 0;
    *pc = regs.ip;
    *sp = regs.sp;
    *bp = regs.bp;
    return 1;
}

BPF_PROG_ARRAY(unwind_progs, 2);  // [0]: cpu_unwind, [1]: cpu_python, put there by user space
BPF_PERCPU_ARRAY(sample_keys, struct key_t, 1);  // the sample's key while its walk spans programs

// Records the sample whose walks have ended (unwind_finish has run): its user stack, kernel stack and count.
static __always_inline void count_sample(struct bpf_perf_event_data *ctx, struct key_t *key, struct unwind_state *s,
                                         struct py_walk *w) {
    int zero = 0;
    struct user_stack *ustack = ustack_scratch.lookup(&zero);
    if (!ustack)
        return;
    if (s) {
        u32 n = s->n;
        if (n > UNWIND_MAX_FRAMES + 1)
            n = UNWIND_MAX_FRAMES + 1;
        bpf_probe_read_kernel(ustack->addrs, (UNWIND_MAX_FRAMES + 1) * 8, s->stack);
        u64 hash = s->hash;
        u32 py = w ? w->n : 0;
        if (py > PY_USED)
            py = PY_USED;
        if (py) {
            bpf_probe_read_kernel(&ustack->addrs[n], PY_USED * 8, w->frames);
#pragma clang loop unroll(disable)
            for (int i = 0; i < PY_USED && i < py; i++)
                hash = (hash ^ w->frames[i]) * 0x100000001b3ULL;
        }
        key->user_stack = hash;
        ustack->len = n + py;
    }
    announce(key->pid, s ? s->unmapped : 0);
    u32 *gen = generation.lookup(&zero);
    int slot = gen ? (*gen & 1) : 0;
    u64 none = 0, *count;
    int stored = 0;
    // written out twice: bcc rewrites map calls only outside macros
    if (slot) {
        if (s)
            stored = ustacks1.insert(&key->user_stack, ustack);
        key->kernel_stack_id = stacks1.get_stackid(&ctx->regs, 0);
    } else {
        if (s)
            stored = ustacks0.insert(&key->user_stack, ustack);
        key->kernel_stack_id = stacks0.get_stackid(&ctx->regs, 0);
    }
    if (stored < 0 && stored != -EEXIST)  // the same stack is there already: fine
        key->user_status = stored;
    count = slot ? counts1.lookup_or_try_init(key, &none) : counts0.lookup_or_try_init(key, &none);
    if (count) {
        __sync_fetch_and_add(count, 1);
    } else {
        u64 *lost = dropped.lookup(&slot);
        if (lost)
            __sync_fetch_and_add(lost, 1);
    }
}

// The native walk has ended: a CPython process's sample goes on to its Python frames (cpu_python), any other's
// is counted.
static __always_inline void native_done(struct bpf_perf_event_data *ctx, struct key_t *key, struct unwind_state *s) {
    unwind_finish(s);
    if (py_wanted(key->pid))
        unwind_progs.call(ctx, 1);  // returns only if the tail call failed
    count_sample(ctx, key, s, 0);
}

int on_cpu_clock(struct bpf_perf_event_data *ctx) {
    u64 pid_tgid = bpf_get_current_pid_tgid();
    u32 tgid = pid_tgid >> 32;
    if (tgid == 0)  // the idle task: not a process
        return 0;
#ifdef FILTER_PID
    if (tgid != FILTER_PID)
        return 0;
#endif
    int zero = 0;
    struct key_t *key = sample_keys.lookup(&zero);
    if (!key)
        return 0;
    __builtin_memset(key, 0, sizeof(*key));
    key->pid = tgid;
    key->tid = (u32)pid_tgid;
    u64 pc = 0, sp = 0, bp = 0;
    if (!user_regs(ctx, &pc, &sp, &bp)) {
        unwind_count(US_NO_USER, 1);
        key->user_status = -EFAULT;
        count_sample(ctx, key, 0, 0);
        return 0;
    }
    struct unwind_state *s = unwind_begin(tgid, pc, sp, bp);
    if (!s)
        return 0;
    if (!unwind_frames(s))
        unwind_progs.call(ctx, 0);  // cpu_unwind goes on; returns here only if the tail call failed
    native_done(ctx, key, s);
    return 0;
}

// The rest of a walk, UNWIND_FRAMES_PER_CALL frames at a time.
int cpu_unwind(struct bpf_perf_event_data *ctx) {
    int zero = 0;
    struct key_t *key = sample_keys.lookup(&zero);
    struct unwind_state *s = unwind_states.lookup(&zero);
    if (!key || !s)
        return 0;
    if (!unwind_frames(s) && ++s->calls < UNWIND_MAX_CALLS)
        unwind_progs.call(ctx, 0);
    native_done(ctx, key, s);
    return 0;
}

// The Python frames of a CPython process's sample, PY_FRAMES_PER_CALL at a time, then the count.
int cpu_python(struct bpf_perf_event_data *ctx) {
    int zero = 0;
    struct key_t *key = sample_keys.lookup(&zero);
    struct unwind_state *s = unwind_states.lookup(&zero);
    struct py_walk *w = py_walks.lookup(&zero);
    if (!key || !s || !w)
        return 0;
    if (py_step(key->pid, key->tid, w)) {
        unwind_progs.call(ctx, 1);
        py_cut(w);  // only if the tail call failed
    }
    count_sample(ctx, key, s, w);
    return 0;
}
