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

/* What the agent would have decided at launch: no agent attached, skipped by the rate limit, or sampled. */
#define GPUSIM_UNSEEN 0
#define GPUSIM_SKIPPED 1
#define GPUSIM_SAMPLED 2

/* One executed kernel, as the optional execution log keeps it (gpusim_log_start). */
struct gpusim_executed {
    uint64_t start_ns;    /* CLOCK_REALTIME */
    uint64_t end_ns;
    uint64_t duration_ns; /* as requested */
    uint32_t correlation_id;
    uint32_t device_id;
    uint32_t stream_id;
    uint32_t state;  /* GPUSIM_UNSEEN / _SKIPPED / _SAMPLED */
    uint32_t weight; /* the launch's weight when sampled, else 0 */
    uint32_t reserved;
    char name[GPUSIM_NAME_MAX];
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
GPUSIM_API uint32_t gpusim_attached(void);         /* bit per probe enabled by an agent: 1 launch, 2 executed, 4 weight */
GPUSIM_API void gpusim_stats(struct gpusim_stats *out);
GPUSIM_API uint32_t gpusim_sizeof(uint32_t which); /* sizeof the structs above (0: executed, 1: stats, 2: spec) */

/* The execution log: off until started; holds up to `capacity` kernels until drained. */
GPUSIM_API int gpusim_log_start(uint32_t capacity);
GPUSIM_API uint32_t gpusim_log_drain(struct gpusim_executed *out, uint32_t max);

/* Native launch paths with their own C call chains (frame pointers, no inlining, no tail calls). */
GPUSIM_API void gpusim_native_train_step(int steps);
GPUSIM_API uint32_t gpusim_native_kernels(const struct gpusim_kernel_spec **out);

#endif
