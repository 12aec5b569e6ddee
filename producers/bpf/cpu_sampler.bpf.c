// bcc C: CPU stack sampling on a software perf_event (CPU clock), aggregated in the kernel (as bcc's tools/profile.py).
// producers/cpu_sampler.py compiles it with -D settings: MAX_ENTRIES, STACK_ENTRIES, KNOWN_PIDS, and FILTER_PID when
// filtering.
// Only helpers read the task: the headers bcc compiles against may be older than the running kernel, so struct
// offsets (task_struct->...) could be silently wrong.
//
// Double-buffered: samples go to the maps of the current generation (counts0/stacks0 or counts1/stacks1). User
// space flips `generation`, lets in-flight samples finish, then reads and clears the other pair at leisure, so no
// sample counted during a drain is lost and no stack id is freed while a new count still refers to it.
//
// The first sample of a process (and the first after it ran exec) also puts its pid on the `new_pids` ring, which
// wakes user space (new processes are rare, so the wake-ups are too): a process that lives a fraction of a second is
// read from /proc while it still runs, not at the next once-a-second look, when it may be gone.
#include <uapi/linux/ptrace.h>
#include <uapi/linux/bpf_perf_event.h>

#ifndef MAX_ENTRIES
#define MAX_ENTRIES 10240
#endif
#ifndef STACK_ENTRIES
#define STACK_ENTRIES 16384
#endif
#ifndef KNOWN_PIDS
#define KNOWN_PIDS 65536
#endif

// Keep in step with KEY_FIELDS in producers/cpu_sampler.py (a test compares the two).
struct key_t {
    u32 pid;  // tgid: the process
    u32 tid;
    s32 user_stack_id;    // negative: -errno from get_stackid (-EFAULT: no stack of that kind, else lost)
    s32 kernel_stack_id;
};

BPF_HASH(counts0, struct key_t, u64, MAX_ENTRIES);
BPF_HASH(counts1, struct key_t, u64, MAX_ENTRIES);
BPF_STACK_TRACE(stacks0, STACK_ENTRIES);
BPF_STACK_TRACE(stacks1, STACK_ENTRIES);
BPF_ARRAY(generation, u32, 1);  // which pair samples go to: its low bit
BPF_ARRAY(dropped, u64, 2);  // per generation: samples lost because that generation's counts map was full
BPF_HASH(known_pids, u32, u8, KNOWN_PIDS);  // processes whose first sample was announced on new_pids
BPF_RINGBUF_OUTPUT(new_pids, 4);  // 16 KiB: 4,096 announcements between two reads

static inline void announce(u32 tgid) {
    u8 one = 1;
    // insert fails when the pid is known already (or the map is full: then the once-a-second look finds it)
    if (known_pids.insert(&tgid, &one) == 0)
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

int on_cpu_clock(struct bpf_perf_event_data *ctx) {
    u64 pid_tgid = bpf_get_current_pid_tgid();
    u32 tgid = pid_tgid >> 32;
    if (tgid == 0)  // the idle task: not a process
        return 0;
#ifdef FILTER_PID
    if (tgid != FILTER_PID)
        return 0;
#endif
    announce(tgid);
    struct key_t key = {};
    key.pid = tgid;
    key.tid = (u32)pid_tgid;
    int idx = 0;
    u32 *gen = generation.lookup(&idx);
    int slot = gen ? (*gen & 1) : 0;
    u64 zero = 0, *count;
    // written out twice: bcc rewrites map calls only outside macros
    if (slot) {
        key.user_stack_id = stacks1.get_stackid(&ctx->regs, BPF_F_USER_STACK);
        key.kernel_stack_id = stacks1.get_stackid(&ctx->regs, 0);
        count = counts1.lookup_or_try_init(&key, &zero);
    } else {
        key.user_stack_id = stacks0.get_stackid(&ctx->regs, BPF_F_USER_STACK);
        key.kernel_stack_id = stacks0.get_stackid(&ctx->regs, 0);
        count = counts0.lookup_or_try_init(&key, &zero);
    }
    if (count) {
        __sync_fetch_and_add(count, 1);
    } else {
        u64 *lost = dropped.lookup(&slot);
        if (lost)
            __sync_fetch_and_add(lost, 1);
    }
    return 0;
}
