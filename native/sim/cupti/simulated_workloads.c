/* Workloads of the simulated libcupti (simulated_cupti.c, same library): single copy, set, peer copy and graph
 * launch API calls with their records; loops of launches on threads, for the launch-bound runs of simulate/cupti.py,
 * and long CUDA graph replays, for the shim's long-run test. */
#include "simulated_cupti.h"

#include <pthread.h>
#include <stdlib.h>

/* The enter and exit callbacks of one API call around its submission; returns whether records of `kind` were on
 * when it submitted. */
static int call(CUpti_CallbackDomain domain, uint32_t cbid, const char *api, uint32_t correlation_id, int *result,
                CUpti_ActivityKind kind)
{
    simcupti_api_call(domain, cbid, CUPTI_API_ENTER, api, correlation_id, result);
    int timed = simcupti_kind_on(kind);
    simcupti_api_call(domain, cbid, CUPTI_API_EXIT, api, correlation_id, result);
    return timed;
}

/* One memory copy (is_set = 0) or set API call and the one record it produces, if its kind (MEMCPY or MEMSET) was
 * on when the call submitted it. copy_kind, src_kind, dst_kind: CUPTI's CUpti_ActivityMemcpyKind and
 * CUpti_ActivityMemoryKind values (a set has only dst_kind). Returns the call's correlation id. */
SIM_API uint32_t simcupti_memory(uint32_t driver, uint32_t cbid, const char *api, int is_set, uint32_t copy_kind,
                                 uint32_t src_kind, uint32_t dst_kind, uint64_t bytes, uint64_t duration_ns,
                                 uint32_t stream, int fail)
{
    CUpti_CallbackDomain domain = driver ? CUPTI_CB_DOMAIN_DRIVER_API : CUPTI_CB_DOMAIN_RUNTIME_API;
    uint32_t correlation_id = simcupti_next_correlation_id();
    int result = fail ? 1 : 0;
    int timed = call(domain, cbid, api, correlation_id, &result, is_set ? CUPTI_ACTIVITY_KIND_MEMSET : CUPTI_ACTIVITY_KIND_MEMCPY);
    if (timed && !fail) {
        struct sim_record r = {.kind = is_set ? CUPTI_ACTIVITY_KIND_MEMSET : CUPTI_ACTIVITY_KIND_MEMCPY,
                               .bytes = bytes, .copy_kind = (uint8_t)(is_set ? 0 : copy_kind),
                               .src_kind = (uint8_t)(is_set ? 0 : src_kind), .dst_kind = (uint8_t)dst_kind};
        uint64_t start = simcupti_now_ns();
        simcupti_write_records(&r, 1, correlation_id, &start, duration_ns, stream);
    }
    return correlation_id;
}

/* One peer-to-peer copy API call (cudaMemcpyPeer, cuMemcpyPeerAsync, ...) between two devices and the MEMCPY2
 * record it produces, if MEMCPY2 was on when the call submitted it: copy kind PtoP, device memory on both sides,
 * `device` where the copy runs (the record's deviceId). Returns the call's correlation id. */
SIM_API uint32_t simcupti_peer_copy(uint32_t driver, uint32_t cbid, const char *api, uint32_t device,
                                    uint32_t src_device, uint32_t dst_device, uint64_t bytes, uint64_t duration_ns,
                                    uint32_t stream, int fail)
{
    CUpti_CallbackDomain domain = driver ? CUPTI_CB_DOMAIN_DRIVER_API : CUPTI_CB_DOMAIN_RUNTIME_API;
    uint32_t correlation_id = simcupti_next_correlation_id();
    int result = fail ? 1 : 0;
    if (call(domain, cbid, api, correlation_id, &result, CUPTI_ACTIVITY_KIND_MEMCPY2) && !fail) {
        struct sim_record r = {.kind = CUPTI_ACTIVITY_KIND_MEMCPY2, .bytes = bytes,
                               .copy_kind = CUPTI_ACTIVITY_MEMCPY_KIND_PTOP,
                               .src_kind = CUPTI_ACTIVITY_MEMORY_KIND_DEVICE,
                               .dst_kind = CUPTI_ACTIVITY_MEMORY_KIND_DEVICE, .device = device,
                               .src_device = src_device, .dst_device = dst_device};
        uint64_t start = simcupti_now_ns();
        simcupti_write_records(&r, 1, correlation_id, &start, duration_ns, stream);
    }
    return correlation_id;
}

/* One graph launch API call (cudaGraphLaunch, cuGraphLaunch, ...) replaying graph `graph_id`: `kernels` kernel
 * nodes (graph node ids 1..kernels), then `copies` device-to-device copy nodes of `copy_bytes` each (node ids
 * after the kernels), every record carrying the launch's correlation id and the graph id, one after another from
 * the launch's return, `duration_ns` each. A kind's nodes produce records only if that kind was on when the launch
 * submitted the graph. Returns the correlation id. */
SIM_API uint32_t simcupti_graph_launch(uint32_t driver, uint32_t cbid, const char *api, const char *kernel,
                                       uint32_t graph_id, uint32_t kernels, uint32_t copies, uint64_t copy_bytes,
                                       uint64_t duration_ns, uint32_t stream)
{
    CUpti_CallbackDomain domain = driver ? CUPTI_CB_DOMAIN_DRIVER_API : CUPTI_CB_DOMAIN_RUNTIME_API;
    uint32_t correlation_id = simcupti_next_correlation_id();
    int result = 0;
    simcupti_api_call(domain, cbid, CUPTI_API_ENTER, api, correlation_id, &result);
    int kernels_timed = simcupti_kind_on(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    int copies_timed = simcupti_kind_on(CUPTI_ACTIVITY_KIND_MEMCPY);
    simcupti_api_call(domain, cbid, CUPTI_API_EXIT, api, correlation_id, &result);
    struct sim_record nodes[256];
    uint64_t t = simcupti_now_ns();
    uint32_t node = 0, total = kernels_timed ? kernels : 0;
    for (uint32_t done = 0; done < total;) { /* in batches: one lock per 256 records */
        uint32_t n = total - done < 256 ? total - done : 256;
        for (uint32_t i = 0; i < n; i++)
            nodes[i] = (struct sim_record){.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, .name = kernel,
                                           .graph_id = graph_id, .graph_node_id = ++node};
        simcupti_write_records(nodes, n, correlation_id, &t, duration_ns, stream);
        done += n;
    }
    node = kernels;
    for (uint32_t i = 0; i < copies && copies_timed; i++) {
        struct sim_record r = {.kind = CUPTI_ACTIVITY_KIND_MEMCPY, .bytes = copy_bytes,
                               .copy_kind = CUPTI_ACTIVITY_MEMCPY_KIND_DTOD,
                               .src_kind = CUPTI_ACTIVITY_MEMORY_KIND_DEVICE,
                               .dst_kind = CUPTI_ACTIVITY_MEMORY_KIND_DEVICE, .graph_id = graph_id,
                               .graph_node_id = ++node};
        simcupti_write_records(&r, 1, correlation_id, &t, duration_ns, stream);
    }
    return correlation_id;
}

struct loop {
    pthread_t thread;
    int started;
    uint32_t launches, kernels;
    uint64_t gap_ns;
};

static void *launch_loop(void *arg)
{
    const struct loop *loop = arg;
    for (uint32_t i = 0; i < loop->launches; i++) {
        simcupti_spin(loop->gap_ns);
        simcupti_launch(0, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000, "cudaLaunchKernel", "k_loop",
                        loop->kernels, 0, 0, 0, 0);
    }
    return NULL;
}

/* A launch-bound workload: `threads` threads (at most 64), each making `launches` cudaLaunchKernel calls of
 * `kernels` zero-duration kernels, with `gap_ns` of CPU work before each (a framework's own per-operation work).
 * Returns the threads that ran. */
SIM_API int simcupti_launch_loop(int threads, uint32_t launches, uint32_t kernels, uint64_t gap_ns)
{
    struct loop loops[64];
    int count = threads < 64 ? threads : 64, started = 0;
    for (int i = 0; i < count; i++) {
        loops[i] = (struct loop){.launches = launches, .kernels = kernels, .gap_ns = gap_ns};
        loops[i].started = pthread_create(&loops[i].thread, NULL, launch_loop, &loops[i]) == 0;
    }
    for (int i = 0; i < count; i++)
        if (loops[i].started) {
            pthread_join(loops[i].thread, NULL);
            started++;
        }
    return started;
}
