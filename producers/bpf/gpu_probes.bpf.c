// bcc C: the fleetprof USDT probes (native/include/fleetprof_probes.h) as uprobes, one record per event into three
// BPF ring buffers: launches (kernel_launch, with the stack), kernels (kernel_executed, graph_kernel_executed and
// memory_executed, told apart by `kind`) and ranges (launch_range; user space joins it to its launch).
// producers/gpu_probes.py compiles it (-D settings: MAX_SITES, LAUNCH_RING_PAGES, KERNEL_RING_PAGES,
// RANGE_RING_PAGES, WEIGHT_ENTRIES, MAX_REG, UNWIND_TABLES) and attaches each probe site of each ELF object by path.
// The launching thread's user stack is unwound by unwind.bpf.h (the agent's call-frame tables, else frame
// pointers): `launch_<slot>` tail-calls `handle_launch`, which starts the walk, and `gpu_unwind` (tail calls)
// finishes it and sends the record; a CPython process's launch goes on to `gpu_python` (python.bpf.h: its Python
// frames, after the native ones) first.
//
// One compiled program serves every object: where a probe's arguments live (register, memory, constant) differs
// per site and per build, so user space decodes the site's note into `sites[slot]`, and attaches the wrapper
// numbered `slot` (launch_<slot>, executed_<slot>, weight_<slot>, range_<slot>, graph_<slot>, memory_<slot>) there.
// A new object costs map writes and attaches, never a compile.
//
// Time: bpf_ktime_get_ns() is CLOCK_MONOTONIC; user space adds the Unix-minus-monotonic offset it measures when
// it reads the ring (see producers/gpu_probes.py). The executed probes' times (Unix ns by the probe ABI) are passed
// through as the probe gives them; user space rejects implausible ones.
#include <uapi/linux/ptrace.h>
#include "unwind.bpf.h"
#include "python.bpf.h"

#ifndef MAX_SITES
#define MAX_SITES 32
#endif
#ifndef LAUNCH_RING_PAGES
#define LAUNCH_RING_PAGES 512
#endif
#ifndef KERNEL_RING_PAGES
#define KERNEL_RING_PAGES 512
#endif
#ifndef RANGE_RING_PAGES
#define RANGE_RING_PAGES 64
#endif
#ifndef WEIGHT_ENTRIES
#define WEIGHT_ENTRIES 16384
#endif
#ifndef MAX_REG
#define MAX_REG 20  // the highest register index user space may name (x86_64 pt_regs: 21 words)
#endif

#define MAX_ARGS 9  // memory_executed's
#define API_NAME_MAX 64
#define KERNEL_NAME_MAX 4096            // characters of a kernel name kept
#define RANGE_PATH_MAX 512  // FLEETPROF_RANGE_PATH_MAX: a range path with its NUL, cut by the emitter
#define NAME_READ (KERNEL_NAME_MAX + 2)  // read one more than kept (and the NUL): a longer name is known to be cut
#define NATIVE_STACK (UNWIND_MAX_FRAMES + 1)  // native frames walked at most, and the [truncated] mark
#define MAX_STACK (NATIVE_STACK + PY_USED)     // and the Python part

#define ARG_NONE 0
#define ARG_REG 1
#define ARG_MEM 2
#define ARG_CONST 3
#define NO_REG 0xff

// Counters of what never reaches user space (index: keep in step with COUNTERS in producers/gpu_probes.py).
#define LOST_LAUNCHES 0
#define LOST_KERNELS 1
#define WEIGHTS_UNUSED 2  // a launch_weight whose kernel_launch on that thread had another correlation id
#define LOST_RANGES 3
#define N_COUNTERS 4

// places in unwind_progs of the handlers the wrappers tail-call: producers/gpu_probes.py TAIL_CALLED, in this order
#define HANDLE_LAUNCH 2
#define HANDLE_EXECUTED 3
#define HANDLE_WEIGHT 4
#define HANDLE_RANGE 5
#define HANDLE_GRAPH 6
#define HANDLE_MEMORY 7

// kernel_event.kind: which probe sent it
#define KIND_KERNEL 0
#define KIND_GRAPH_KERNEL 1
#define KIND_MEMORY 2

// How to read one probe argument: user space's decoding of the note's "size@operand".
struct arg_spec {
    s64 disp;   // ARG_CONST: the value; ARG_MEM: the displacement
    u8 kind;    // ARG_NONE, ARG_REG, ARG_MEM, ARG_CONST
    u8 size;    // bytes read for ARG_MEM, 1..8
    u8 base;    // register (pt_regs word index) of ARG_REG, base of ARG_MEM
    u8 index;   // index register of ARG_MEM, or NO_REG
    u8 scale;   // of the index register
    u8 pad[3];
};

struct site {
    struct arg_spec args[MAX_ARGS];
};

// Keep the records in step with LAUNCH_HEADER / KERNEL_HEADER / RANGE_HEADER in producers/gpu_records.py (a test
// compares them).
struct launch_event {
    u64 time_ns;  // bpf_ktime_get_ns()
    u32 pid;      // tgid
    u32 tid;
    u32 site;     // the slot whose wrapper fired: which object it came from
    u32 correlation_id;
    s32 callback_id;
    u32 weight;       // launches this one stands for: from launch_weight on this thread, else 1
    s32 stack_bytes;  // bytes of stack[] filled
    u32 pad;
    char api_name[API_NAME_MAX];
    u64 stack[MAX_STACK];  // user stack, leaf first; only stack_bytes of it are sent
};

struct kernel_event {
    u64 start_ns;
    u64 end_ns;
    u32 pid;
    u32 site;
    u32 correlation_id;
    u32 device_id;
    u32 stream_id;
    s32 name_bytes;  // what bpf_probe_read_user_str returned: bytes with the NUL (NAME_READ: cut), or -errno
    u64 name_addr;   // where the name is: a failed read (a page not resident) is retried by user space from there
    u64 bytes;          // memory_executed: bytes copied or set
    u64 graph_node_id;  // graph_kernel_executed, memory_executed: 0 when no graph replayed it
    u32 graph_id;
    u32 kind;         // KIND_KERNEL, KIND_GRAPH_KERNEL, KIND_MEMORY
    u32 memory_kind;  // memory_executed: FLEETPROF_MEMORY_KIND
    u32 pad;
    char name[NAME_READ];  // only name_bytes of it are sent (a memory record has none: name_bytes 0)
};

// launch_range: the launching thread's NVTX range path, joined to its launch by (pid, tid, correlation id) in user
// space (it fires right before kernel_launch on the same thread).
struct range_event {
    u32 pid;
    u32 tid;
    u32 site;
    u32 correlation_id;
    s32 path_bytes;  // what bpf_probe_read_user_str returned, or -errno (retried by user space from path_addr)
    u32 pad;
    u64 path_addr;
    char path[RANGE_PATH_MAX];  // only path_bytes of it are sent
};

struct weight_t {
    u32 correlation_id;
    u32 weight;
};

BPF_ARRAY(sites, struct site, MAX_SITES);
BPF_ARRAY(counters, u64, N_COUNTERS);
// Per thread, the weight announced for its next launch. LRU: a thread that never launches cannot fill it.
BPF_TABLE("lru_hash", u32, struct weight_t, weights, WEIGHT_ENTRIES);
// Records are built here (a kernel name is 4 KB, too big for the BPF stack) and sent with their used length only.
BPF_PERCPU_ARRAY(launch_scratch, struct launch_event, 1);
BPF_PERCPU_ARRAY(kernel_scratch, struct kernel_event, 1);
BPF_PERCPU_ARRAY(range_scratch, struct range_event, 1);
// [0]: gpu_unwind, [1]: gpu_python, [2..7]: the handlers the wrappers tail-call (HANDLE_*), put there by user space
BPF_PROG_ARRAY(unwind_progs, 8);
// The slot whose wrapper fired, for the handler it tail-calls on this CPU (the walk's scratch maps rely on the same).
BPF_PERCPU_ARRAY(hit_slot, u32, 1);
// Written with BPF_RB_NO_WAKEUP: while the reader keeps up, each record would otherwise queue a wake-up (an irq_work:
// a self-interrupt, on a VM an exit to the hypervisor), measured at +200 ns of program time alone per launch here,
// paid by the launching thread. The reader polls on a timer instead; a full ring loses records, counted.
BPF_RINGBUF_OUTPUT(launches, LAUNCH_RING_PAGES);
BPF_RINGBUF_OUTPUT(kernels, KERNEL_RING_PAGES);
BPF_RINGBUF_OUTPUT(ranges, RANGE_RING_PAGES);

static __always_inline void count(int which) {
    u64 *n = counters.lookup(&which);
    if (n)
        __sync_fetch_and_add(n, 1);
}

// One word of the probed thread's saved registers. pt_regs is read through the helper: the word is chosen at run
// time, and the verifier allows only constant offsets into the context itself.
static __always_inline u64 reg_value(struct pt_regs *ctx, u8 reg) {
    u64 value = 0;
    if (reg > MAX_REG)
        return 0;
    bpf_probe_read_kernel(&value, sizeof(value), (void *)((u64)ctx + (u64)reg * 8));
    return value;
}

// The value of one argument; a narrower one sits in the low bytes (the record's field type truncates it).
static __always_inline u64 read_arg(struct pt_regs *ctx, struct arg_spec *arg) {
    if (arg->kind == ARG_CONST)
        return (u64)arg->disp;
    u64 base = reg_value(ctx, arg->base);
    if (arg->kind == ARG_REG)
        return base;
    if (arg->kind != ARG_MEM)
        return 0;
    u64 addr = base + (u64)arg->disp;
    if (arg->index != NO_REG)
        addr += reg_value(ctx, arg->index) * arg->scale;
    u64 value = 0;
    u32 size = arg->size;
    if (size > sizeof(value))
        size = sizeof(value);
    bpf_probe_read_user(&value, size, (void *)addr);
    return value;
}

// Sends the launch whose walks have ended (unwind_finish has run): the native frames, then any Python part.
static __always_inline void send_launch(struct launch_event *e, struct unwind_state *s, struct py_walk *w) {
    u32 n = s->n;
    if (n > NATIVE_STACK)
        n = NATIVE_STACK;
    bpf_probe_read_kernel(e->stack, NATIVE_STACK * 8, s->stack);  // constant sizes: the verifier's choice
    u32 py = w ? w->n : 0;
    if (py > PY_USED)
        py = PY_USED;
    if (py)
        bpf_probe_read_kernel(&e->stack[n], PY_USED * 8, w->frames);
    e->stack_bytes = (n + py) * sizeof(e->stack[0]);
    u64 size = sizeof(*e) - sizeof(e->stack) + e->stack_bytes;
    // hidden from the compiler, which can prove the bound and drop the check; the verifier cannot without it
    asm volatile("" : "+r"(size));
    if (size > sizeof(*e))
        size = sizeof(*e);
    if (launches.ringbuf_output(e, size, BPF_RB_NO_WAKEUP) < 0)
        count(LOST_LAUNCHES);
}

static __always_inline int on_launch(struct pt_regs *ctx, u32 slot) {
    int zero = 0;
    struct site *site = sites.lookup(&slot);
    struct launch_event *e = launch_scratch.lookup(&zero);
    if (!site || !e)
        return 0;
    u64 pid_tgid = bpf_get_current_pid_tgid();
    e->time_ns = bpf_ktime_get_ns();
    e->pid = pid_tgid >> 32;
    e->tid = (u32)pid_tgid;
    e->site = slot;
    e->correlation_id = read_arg(ctx, &site->args[0]);
    e->callback_id = read_arg(ctx, &site->args[1]);
    u64 api = read_arg(ctx, &site->args[2]);
    if (bpf_probe_read_user_str(e->api_name, sizeof(e->api_name), (void *)api) < 0)
        e->api_name[0] = 0;
    e->weight = 1;
    struct weight_t *w = weights.lookup(&e->tid);
    if (w) {
        if (w->correlation_id == e->correlation_id)
            e->weight = w->weight;
        else
            count(WEIGHTS_UNUSED);
        weights.delete(&e->tid);
    }
    struct unwind_state *s = unwind_begin(e->pid, PT_REGS_IP(ctx), PT_REGS_SP(ctx), PT_REGS_FP(ctx));
    if (!s)
        return 0;
    // The walk itself is gpu_unwind's: one copy of it for every site, instead of one per site to verify and load.
    unwind_progs.call(ctx, 0);
    unwind_finish(s);
    send_launch(e, s, 0);  // only if the tail call failed: a stack of just the mark
    return 0;
}

// The native walk has ended: a CPython process's launch goes on to its Python frames (gpu_python), any other's
// is sent.
static __always_inline void native_done(struct pt_regs *ctx, struct launch_event *e, struct unwind_state *s) {
    unwind_finish(s);
    if (py_wanted(e->pid))
        unwind_progs.call(ctx, 1);  // returns only if the tail call failed
    send_launch(e, s, 0);
}

// The rest of a launch's walk, UNWIND_FRAMES_PER_CALL frames at a time; the last one sends the record.
int gpu_unwind(struct pt_regs *ctx) {
    int zero = 0;
    struct launch_event *e = launch_scratch.lookup(&zero);
    struct unwind_state *s = unwind_states.lookup(&zero);
    if (!e || !s)
        return 0;
    if (!unwind_frames(s) && ++s->calls < UNWIND_MAX_CALLS)
        unwind_progs.call(ctx, 0);
    native_done(ctx, e, s);
    return 0;
}

// The launching thread's Python frames, PY_FRAMES_PER_CALL at a time; the last program sends the record.
int gpu_python(struct pt_regs *ctx) {
    int zero = 0;
    struct launch_event *e = launch_scratch.lookup(&zero);
    struct unwind_state *s = unwind_states.lookup(&zero);
    struct py_walk *w = py_walks.lookup(&zero);
    if (!e || !s || !w)
        return 0;
    if (py_step(e->pid, e->tid, w)) {
        unwind_progs.call(ctx, 1);
        py_cut(w);  // only if the tail call failed
    }
    send_launch(e, s, w);
    return 0;
}

// kernel_executed, graph_kernel_executed and memory_executed: their first five arguments are the same.
static __always_inline int on_executed(struct pt_regs *ctx, u32 slot, u32 kind) {
    int zero = 0;
    struct site *site = sites.lookup(&slot);
    struct kernel_event *e = kernel_scratch.lookup(&zero);
    if (!site || !e)
        return 0;
    e->start_ns = read_arg(ctx, &site->args[0]);
    e->end_ns = read_arg(ctx, &site->args[1]);
    e->pid = bpf_get_current_pid_tgid() >> 32;
    e->site = slot;
    e->correlation_id = read_arg(ctx, &site->args[2]);
    e->device_id = read_arg(ctx, &site->args[3]);
    e->stream_id = read_arg(ctx, &site->args[4]);
    e->kind = kind;
    e->bytes = 0;
    e->memory_kind = 0;
    e->graph_id = 0;
    e->graph_node_id = 0;
    e->pad = 0;
    u64 size = sizeof(*e) - sizeof(e->name);
    if (kind == KIND_MEMORY) {
        e->bytes = read_arg(ctx, &site->args[5]);
        e->memory_kind = read_arg(ctx, &site->args[6]);
        e->graph_id = read_arg(ctx, &site->args[7]);
        e->graph_node_id = read_arg(ctx, &site->args[8]);
        e->name_bytes = 0;
        e->name_addr = 0;
    } else {
        if (kind == KIND_GRAPH_KERNEL) {
            e->graph_id = read_arg(ctx, &site->args[6]);
            e->graph_node_id = read_arg(ctx, &site->args[7]);
        }
        u64 name = read_arg(ctx, &site->args[5]);
        // a BPF program cannot fault a page in: a name in a page the process never touched reads as -EFAULT
        long got = bpf_probe_read_user_str(e->name, sizeof(e->name), (void *)name);
        e->name_bytes = got;
        e->name_addr = name;
        if (got > 0)
            size += got;
    }
    asm volatile("" : "+r"(size));
    if (size > sizeof(*e))
        size = sizeof(*e);
    if (kernels.ringbuf_output(e, size, BPF_RB_NO_WAKEUP) < 0)
        count(LOST_KERNELS);
    return 0;
}

static __always_inline int on_range(struct pt_regs *ctx, u32 slot) {
    int zero = 0;
    struct site *site = sites.lookup(&slot);
    struct range_event *e = range_scratch.lookup(&zero);
    if (!site || !e)
        return 0;
    u64 pid_tgid = bpf_get_current_pid_tgid();
    e->pid = pid_tgid >> 32;
    e->tid = (u32)pid_tgid;
    e->site = slot;
    e->correlation_id = read_arg(ctx, &site->args[0]);
    e->pad = 0;
    u64 path = read_arg(ctx, &site->args[1]);
    long got = bpf_probe_read_user_str(e->path, sizeof(e->path), (void *)path);
    e->path_bytes = got;
    e->path_addr = path;
    u64 size = sizeof(*e) - sizeof(e->path);
    if (got > 0)
        size += got;
    asm volatile("" : "+r"(size));
    if (size > sizeof(*e))
        size = sizeof(*e);
    if (ranges.ringbuf_output(e, size, BPF_RB_NO_WAKEUP) < 0)
        count(LOST_RANGES);
    return 0;
}

static __always_inline int on_weight(struct pt_regs *ctx, u32 slot) {
    struct site *site = sites.lookup(&slot);
    if (!site)
        return 0;
    u32 tid = (u32)bpf_get_current_pid_tgid();
    struct weight_t w = {};
    w.correlation_id = read_arg(ctx, &site->args[0]);
    w.weight = read_arg(ctx, &site->args[1]);
    weights.update(&tid, &w);
    return 0;
}

// The handlers, one program each: a wrapper hands its slot over and tail-calls one. Written out per slot (as they
// were), the six handlers took clang ~0.33 s per slot: 14 s of every agent start at 32 slots, against ~3 s now.
static __always_inline u32 slot_hit(void) {
    int zero = 0;
    u32 *slot = hit_slot.lookup(&zero);
    return slot ? *slot : MAX_SITES;  // no such site: the handler's sites.lookup fails and it does nothing
}

int handle_launch(struct pt_regs *ctx) { return on_launch(ctx, slot_hit()); }
int handle_executed(struct pt_regs *ctx) { return on_executed(ctx, slot_hit(), KIND_KERNEL); }
int handle_weight(struct pt_regs *ctx) { return on_weight(ctx, slot_hit()); }
int handle_range(struct pt_regs *ctx) { return on_range(ctx, slot_hit()); }
int handle_graph(struct pt_regs *ctx) { return on_executed(ctx, slot_hit(), KIND_GRAPH_KERNEL); }
int handle_memory(struct pt_regs *ctx) { return on_executed(ctx, slot_hit(), KIND_MEMORY); }

static __always_inline int enter(struct pt_regs *ctx, u32 slot, int handler) {
    int zero = 0;
    u32 *hit = hit_slot.lookup(&zero);
    if (!hit)
        return 0;
    *hit = slot;
    unwind_progs.call(ctx, handler);
    return 0;  // only if the tail call failed
}

// The attachable programs: six per slot, thin enough to stay out of bcc's way (it rewrites map calls only
// outside macros, and every map call is in the functions above).
#define SITE(n)                                                                  \
    int launch_##n(struct pt_regs *ctx) { return enter(ctx, n, HANDLE_LAUNCH); }     \
    int executed_##n(struct pt_regs *ctx) { return enter(ctx, n, HANDLE_EXECUTED); } \
    int weight_##n(struct pt_regs *ctx) { return enter(ctx, n, HANDLE_WEIGHT); }     \
    int range_##n(struct pt_regs *ctx) { return enter(ctx, n, HANDLE_RANGE); }       \
    int graph_##n(struct pt_regs *ctx) { return enter(ctx, n, HANDLE_GRAPH); }       \
    int memory_##n(struct pt_regs *ctx) { return enter(ctx, n, HANDLE_MEMORY); }

SITE(0) SITE(1) SITE(2) SITE(3) SITE(4) SITE(5) SITE(6) SITE(7)
#if MAX_SITES > 8
SITE(8) SITE(9) SITE(10) SITE(11) SITE(12) SITE(13) SITE(14) SITE(15)
#endif
#if MAX_SITES > 16
SITE(16) SITE(17) SITE(18) SITE(19) SITE(20) SITE(21) SITE(22) SITE(23)
SITE(24) SITE(25) SITE(26) SITE(27) SITE(28) SITE(29) SITE(30) SITE(31)
#endif
#if MAX_SITES > 32
SITE(32) SITE(33) SITE(34) SITE(35) SITE(36) SITE(37) SITE(38) SITE(39)
SITE(40) SITE(41) SITE(42) SITE(43) SITE(44) SITE(45) SITE(46) SITE(47)
SITE(48) SITE(49) SITE(50) SITE(51) SITE(52) SITE(53) SITE(54) SITE(55)
SITE(56) SITE(57) SITE(58) SITE(59) SITE(60) SITE(61) SITE(62) SITE(63)
#endif
