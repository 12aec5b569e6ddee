/* What the simulator's own files share (not part of its API). */
#ifndef FLEETPROF_GPUSIM_INTERNAL_H
#define FLEETPROF_GPUSIM_INTERNAL_H

#include <stdatomic.h>
#include <stdint.h>

/* What one launch queues: a kernel, a copy or a set, or one node of a graph. */
struct gpusim_work {
    const char *name;
    uint64_t duration_ns;
    uint64_t bytes;
    uint64_t graph_node_id;
    uint32_t activity;
    uint32_t memory_kind;
    uint32_t graph_id;
};

#define GPUSIM_API_KERNEL 0
#define GPUSIM_API_MEMCPY 1
#define GPUSIM_API_MEMSET 2
#define GPUSIM_API_GRAPH 3

/* Queue `n` records under one new correlation id on this thread's device and fire the launch probes (launch_weight,
 * launch_range, kernel_launch) for `api` (GPUSIM_API_*): a kernel, a copy or a set (n = 1), or a graph's nodes. The
 * correlation id, or 0 when the device queue cannot take them all (counted as dropped). */
uint32_t gpusim_submit(const struct gpusim_work *w, uint32_t n, uint32_t stream, uint32_t api);

/* Any of the six probes enabled by an agent. */
int gpusim_agent_attached(void);

/* The calling thread's NVTX range path as launch_range sends it, into out[GPUSIM_RANGE_MAX]: 1 when the thread is
 * inside ranges, else 0 (out is then ""). `cut` is set when the path was cut. */
int gpusim_range_path(char *out, int *cut);

struct gpusim_range_counters {
    _Atomic uint64_t too_deep, pops_unmatched;
};
extern struct gpusim_range_counters gpusim_range_counters;

#endif
