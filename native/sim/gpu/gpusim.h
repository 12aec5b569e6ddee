/* The simulated GPU's C API (libfleetprof_gpusim.so), used through ctypes by simulate/gpu.py.
 *
 * It stands in for CUDA + the CUPTI shim at the one boundary fleetprof does not own, the C ABI: it fires the same
 * USDT probes through the same header (native/include/fleetprof_probes.h), with the same per-thread rate limit, so
 * the agent attaches to it exactly as to the real shim. Everything it reports is simulated.
 */
#ifndef FLEETPROF_GPUSIM_H
#define FLEETPROF_GPUSIM_H

#include <stdint.h>

#define GPUSIM_API __attribute__((visibility("default")))
#define GPUSIM_NAME_MAX 256
#define GPUSIM_MAX_DEVICES 8
#define GPUSIM_QUEUE_DEPTH 4096 /* kernels queued per device; a launch finding it full is dropped and counted */
#define GPUSIM_CALLBACK_ID 211  /* what CUPTI reports for cudaLaunchKernel */
#define GPUSIM_API_NAME "gpusimLaunchKernel (simulated)"
/* Copies, sets and graph launches fire kernel_launch with API names of their own (simulated callback ids): the agent
 * tells a graph launch by its name (producers/kernel_records.py is_graph_launch). */
#define GPUSIM_MEMCPY_API_NAME "gpusimMemcpyAsync (simulated)"
#define GPUSIM_MEMSET_API_NAME "gpusimMemsetAsync (simulated)"
#define GPUSIM_GRAPH_API_NAME "gpusimGraphLaunch (simulated)"
#define GPUSIM_MEMCPY_CALLBACK_ID 41
#define GPUSIM_MEMSET_CALLBACK_ID 48
#define GPUSIM_GRAPH_CALLBACK_ID 311
/* Graph launches have a rate limit of their own, as in the CUPTI shim: FLEETPROF_GRAPH_LAUNCH_RATE (0: all). */
#define GPUSIM_GRAPH_LAUNCH_RATE_ENV "FLEETPROF_GRAPH_LAUNCH_RATE"
#define GPUSIM_GRAPH_LAUNCH_RATE_DEFAULT 100u
#define GPUSIM_MAX_GRAPHS 64
#define GPUSIM_GRAPH_MAX_NODES 256
#define GPUSIM_RANGE_MAX 512     /* FLEETPROF_RANGE_PATH_MAX */
#define GPUSIM_RANGE_DEPTH_MAX 32 /* NVTX ranges kept per thread; deeper ones are counted and the path ends in "..." */

/* What one executed record is (struct gpusim_executed.activity). */
#define GPUSIM_KERNEL 0
#define GPUSIM_MEMCPY 1
#define GPUSIM_MEMSET 2

/* What the agent would have decided at launch: no agent attached, skipped by the rate limit, or sampled. */
#define GPUSIM_UNSEEN 0
#define GPUSIM_SKIPPED 1
#define GPUSIM_SAMPLED 2

/* One executed kernel, copy or set, as the optional execution log keeps it (gpusim_log_start). */
struct gpusim_executed {
    uint64_t start_ns;    /* CLOCK_REALTIME */
    uint64_t end_ns;
    uint64_t duration_ns; /* as requested */
    uint32_t correlation_id;
    uint32_t device_id;
    uint32_t stream_id;
    uint32_t state;  /* GPUSIM_UNSEEN / _SKIPPED / _SAMPLED */
    uint32_t weight; /* the launch's weight when sampled, else 0 */
    uint32_t activity;    /* GPUSIM_KERNEL / _MEMCPY / _MEMSET */
    char name[GPUSIM_NAME_MAX];
    uint64_t bytes;        /* a copy's or set's */
    uint64_t graph_node_id;
    uint32_t graph_id;     /* 0: not replayed by a graph */
    uint32_t memory_kind;  /* a copy's or set's FLEETPROF_MEMORY_KIND */
    uint32_t in_range;     /* the launching thread was inside NVTX ranges */
    uint32_t api;          /* 0 kernel launch, 1 memcpy, 2 memset, 3 graph launch */
    char range[GPUSIM_RANGE_MAX]; /* the launching thread's range path at launch, as launch_range would send it */
};

/* A node of a simulated CUDA graph: a kernel (memory_kind 0) or a copy or set (memory_kind: FLEETPROF_MEMORY_KIND). */
struct gpusim_graph_node {
    const char *kernel_name; /* a kernel's */
    uint64_t duration_ns;
    uint64_t bytes;
    uint32_t memory_kind;
    uint32_t reserved;
};

struct gpusim_stats {
    uint64_t launches;          /* accepted launches */
    uint64_t launches_decided;  /* of those, made while an agent was attached (rate limit applied) */
    uint64_t launches_sampled;  /* of those, sampled: kernel_launch fired */
    uint64_t weight_sum;        /* sum of the sampled launches' weights */
    uint64_t kernels_executed;
    uint64_t kernels_fired;     /* kernel_executed fired (an agent was attached and the launch was not skipped) */
    uint64_t queue_dropped;     /* launches refused: the device queue was full */
    uint64_t log_dropped;       /* executed kernels not logged: the execution log was full */
    uint64_t names_truncated;   /* kernel names longer than GPUSIM_NAME_MAX - 1 */
    /* kernels_executed and kernels_fired count every executed record: kernels, copies, sets, graph nodes */
    uint64_t copies_executed;   /* copies and sets (graph nodes among them too) */
    uint64_t copies_fired;      /* memory_executed fired */
    uint64_t graph_launches;    /* accepted graph launches (not in `launches`) */
    uint64_t graph_launches_decided;
    uint64_t graph_launches_sampled;
    uint64_t graph_weight_sum;
    uint64_t graph_nodes_executed;
    uint64_t graph_nodes_fired; /* graph_kernel_executed or memory_executed with a graph id fired */
    uint64_t ranges_fired;      /* launch_range fired */
    uint64_t range_paths_cut;   /* of those, paths cut at GPUSIM_RANGE_MAX - 1 bytes (ending in "...") */
    uint64_t ranges_too_deep;   /* pushes beyond GPUSIM_RANGE_DEPTH_MAX */
    uint64_t range_pops_unmatched;
};

/* A kernel of the native launch paths: its C call path (root first, ';'-separated), name and duration. */
struct gpusim_kernel_spec {
    const char *path;
    const char *kernel_name;
    uint64_t duration_ns;
    uint32_t stream_id;
};

/* Queue a kernel on this thread's device; the correlation id, or 0 when the device queue was full (dropped). */
GPUSIM_API uint32_t gpusim_launch(const char *kernel_name, uint64_t duration_ns, uint32_t stream);
GPUSIM_API void gpusim_synchronize(void);
GPUSIM_API int gpusim_set_device(uint32_t device); /* this thread's device, like cudaSetDevice; -1 if out of range */
GPUSIM_API uint32_t gpusim_device_count(void);     /* FLEETPROF_GPUSIM_DEVICES, default 1 */
GPUSIM_API uint32_t gpusim_launch_rate(void);      /* the rate limit in force (FLEETPROF_LAUNCH_RATE) */
GPUSIM_API uint32_t gpusim_attached(void); /* bit per probe an agent enabled: 1 launch, 2 executed, 4 weight,
                                              8 range, 16 graph_kernel_executed, 32 memory_executed */
GPUSIM_API void gpusim_stats(struct gpusim_stats *out);
GPUSIM_API uint32_t gpusim_sizeof(uint32_t which); /* sizeof the structs (0 executed, 1 stats, 2 spec, 3 node) */
GPUSIM_API uint32_t gpusim_graph_launch_rate(void); /* FLEETPROF_GRAPH_LAUNCH_RATE in force */

/* Copies and sets: launched like kernels (kernel_launch under the launch rate limit, with the copy API's name), then
 * memory_executed when the device ran them. Kinds: CUPTI's CUpti_ActivityMemcpyKind and CUpti_ActivityMemoryKind.
 * The correlation id, or 0 when the device queue was full. */
GPUSIM_API uint32_t gpusim_memcpy(uint64_t bytes, uint32_t copy_kind, uint32_t src_kind, uint32_t dst_kind,
                                  uint64_t duration_ns, uint32_t stream);
GPUSIM_API uint32_t gpusim_memset(uint64_t bytes, uint32_t dst_kind, uint64_t duration_ns, uint32_t stream);

/* CUDA graphs: a graph is a list of nodes (kernels, copies, sets), node ids (graph_id << 32 | index + 1). A launch
 * fires kernel_launch once (graph rate limit) and each replayed node graph_kernel_executed or memory_executed with
 * the launch's correlation id. create: the graph id (1..GPUSIM_MAX_GRAPHS), 0 when full or too many nodes.
 * launch: the correlation id, 0 when the graph is unknown or the device queue cannot take all its nodes. */
GPUSIM_API uint32_t gpusim_graph_create(const struct gpusim_graph_node *nodes, uint32_t count);
GPUSIM_API uint32_t gpusim_graph_launch(uint32_t graph_id, uint32_t stream);

/* NVTX push/pop ranges of the calling thread (nvtxRangePushA / nvtxDomainRangePushEx): a sampled launch inside
 * ranges fires launch_range with the path first (root first, " > " between, "domain:name" for a non-default domain,
 * cut to GPUSIM_RANGE_MAX with the NUL ending in "...", ranges pushed while no agent was attached as
 * "[range before attach]"). pop: the depth left, -1 when there was none to pop (counted). */
GPUSIM_API void gpusim_range_push(const char *name);
GPUSIM_API void gpusim_range_push_domain(const char *domain, const char *name);
GPUSIM_API int gpusim_range_pop(void);

/* The execution log: off until started; holds up to `capacity` kernels until drained. */
GPUSIM_API int gpusim_log_start(uint32_t capacity);
GPUSIM_API uint32_t gpusim_log_drain(struct gpusim_executed *out, uint32_t max);

/* Native launch paths with their own C call chains (frame pointers, no inlining, no tail calls). */
GPUSIM_API void gpusim_native_train_step(int steps);
GPUSIM_API uint32_t gpusim_native_kernels(const struct gpusim_kernel_spec **out);

#endif
