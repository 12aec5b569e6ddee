/* Launch callbacks (kernels, graphs, and the copies and sets of memory.c): on the launching thread, as the launch
 * API enters, the rate limit decides (graph launches have their own, FLEETPROF_GRAPH_LAUNCH_RATE; and in sampled
 * mode a sampled launch turns its kinds' records on for its own submission, see activity.c); as it returns,
 * launch_weight, launch_range (the thread's NVTX range path, nvtx.c) and the kernel_launch probe fire with CUPTI's
 * correlation id (the agent captures the CPU stack there).
 *
 * The decision of each correlation id is kept in a fixed direct-mapped table, so the kernel records that arrive
 * later (on CUPTI's thread) are told apart: sampled, skipped by the rate limit, or never seen. CUPTI's correlation
 * ids grow by one per API call, so a slot is only overwritten by an id 2^17 calls newer: the table remembers the
 * last 131072 launches in 1 MiB however many kernels a CUDA graph replays per launch.
 */
#include "fleetprof_probes.h"
#include "fleetprof_ratelimit.h"
#include "shim.h"

#include <sys/syscall.h>
#include <unistd.h>

/* Added in CUDA 13 (nvcc 13 compiles <<<...>>> into __cudaLaunchKernel); the CUDA 12 headers the shim builds
 * against do not name them. CUPTI never reuses a callback id, so enabling them on CUDA 12 just fails. */
#define CBID_RUNTIME___cudaLaunchKernel_v13000 505
#define CBID_RUNTIME___cudaLaunchKernel_ptsz_v13000 506

static const CUpti_CallbackId runtime_launches[] = {
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000,
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000,
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060,
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060,
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_v9000,
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_ptsz_v9000,
    CBID_RUNTIME___cudaLaunchKernel_v13000,
    CBID_RUNTIME___cudaLaunchKernel_ptsz_v13000,
};

static const CUpti_CallbackId driver_launches[] = {
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz,
};

static const CUpti_CallbackId runtime_graphs[] = {
    CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_v10000,
    CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_ptsz_v10000,
};

static const CUpti_CallbackId driver_graphs[] = {
    CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch,
    CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz,
};

#define MAX_CBID 1024
static uint8_t launch_kinds[2][MAX_CBID]; /* [0] runtime, [1] driver: SHIM_API_KERNEL or SHIM_API_GRAPH */

#define CORR_BITS 17
#define CORR_MASK ((1u << CORR_BITS) - 1)
static _Atomic uint64_t corr_table[1u << CORR_BITS]; /* (id << 2) | state; 0: empty. Untouched pages cost no RSS */

/* Per launching thread: the rate limit, and the launch API calls it is inside. A runtime launch may call a driver
 * launch (or, on CUDA 13, another runtime entry point): only the outermost call is a launch, but each nested id is
 * marked with the same decision, since the kernel record may carry either. */
static __thread fleetprof_ratelimit_t thread_rate;
static __thread fleetprof_ratelimit_t thread_graph_rate;
static __thread fleetprof_ratelimit_t *thread_limit; /* the one the outermost call in progress drew from */
static __thread uint32_t thread_kinds;  /* SHIM_KIND_* the outermost call holds records of */
static __thread uint32_t thread_depth;
static __thread uint32_t thread_weight; /* decision of the outermost call in progress */
static __thread int thread_decided;
static __thread uint32_t thread_hold;   /* token of the kernel records this thread's sampled launch holds on */
static __thread uint32_t thread_epoch;
static _Atomic uint32_t epoch = 1; /* bumped at each turn-on: a thread's state from before it is stale */

static void mark(uint32_t correlation_id, int state)
{
    uint64_t entry = ((uint64_t)correlation_id << 2) | (uint64_t)state;
    atomic_store_explicit(&corr_table[correlation_id & CORR_MASK], entry, memory_order_release);
}

int shim_correlation_state(uint32_t correlation_id)
{
    uint64_t entry = atomic_load_explicit(&corr_table[correlation_id & CORR_MASK], memory_order_acquire);
    if ((entry >> 2) != correlation_id)
        return SHIM_CORR_UNSEEN;
    return (int)(entry & 3);
}

static int enable_list(CUpti_SubscriberHandle subscriber, uint32_t enable, CUpti_CallbackDomain domain,
                       const CUpti_CallbackId *ids, size_t count, enum shim_api_kind kind)
{
    int enabled = 0;
    for (size_t i = 0; i < count; i++) {
        if (ids[i] < MAX_CBID)
            launch_kinds[domain == CUPTI_CB_DOMAIN_DRIVER_API][ids[i]] = (uint8_t)kind;
        enabled += shim_cupti.enable_callback(enable, subscriber, domain, ids[i]) == CUPTI_SUCCESS;
    }
    return enabled;
}

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

int shim_enable_launch_callbacks(CUpti_SubscriberHandle subscriber, uint32_t enable)
{
    if (enable)
        atomic_fetch_add(&epoch, 1);
    const CUpti_CallbackDomain runtime = CUPTI_CB_DOMAIN_RUNTIME_API, driver = CUPTI_CB_DOMAIN_DRIVER_API;
    return enable_list(subscriber, enable, runtime, runtime_launches, COUNT(runtime_launches), SHIM_API_KERNEL) +
           enable_list(subscriber, enable, driver, driver_launches, COUNT(driver_launches), SHIM_API_KERNEL) +
           enable_list(subscriber, enable, runtime, runtime_graphs, COUNT(runtime_graphs), SHIM_API_GRAPH) +
           enable_list(subscriber, enable, driver, driver_graphs, COUNT(driver_graphs), SHIM_API_GRAPH) +
           shim_enable_memory_callbacks(subscriber, enable);
}

static enum shim_api_kind api_kind(CUpti_CallbackDomain domain, CUpti_CallbackId cbid)
{
    if (cbid >= MAX_CBID)
        return SHIM_API_NONE;
    enum shim_api_kind kind = (enum shim_api_kind)launch_kinds[domain == CUPTI_CB_DOMAIN_DRIVER_API][cbid];
    return kind != SHIM_API_NONE ? kind : shim_memory_api_kind(domain, cbid);
}

static uint32_t kinds_of(enum shim_api_kind kind)
{
    switch (kind) {
    case SHIM_API_COPY: /* any copy may be between two devices (cudaMemcpyDefault too): those come as MEMCPY2 */
        return SHIM_KIND_MEMCPY | SHIM_KIND_MEMCPY2;
    case SHIM_API_SET:
        return SHIM_KIND_MEMSET;
    case SHIM_API_GRAPH:
        return SHIM_KIND_ALL;
    default:
        return SHIM_KIND_KERNEL;
    }
}

static void decide(enum shim_api_kind kind)
{
    uint64_t now = fleetprof_ratelimit_clock_ns();
    int graph = kind == SHIM_API_GRAPH;
    thread_limit = graph ? &thread_graph_rate : &thread_rate;
    uint64_t seed = thread_limit->rng ? 0 : ((uint64_t)syscall(SYS_gettid) << 32) ^ now ^ (uint64_t)graph;
    thread_weight = fleetprof_ratelimit_take(thread_limit, graph ? shim_settings.graph_launch_rate
                                                                 : shim_settings.launch_rate, now, seed);
    thread_kinds = kinds_of(kind);
    thread_decided = 1;
}

/* A launch that failed launched nothing: give its share back to the next sampled launch. */
static void undo(uint32_t weight)
{
    if (weight == 0)
        thread_limit->skipped--;
    else
        thread_limit->skipped += weight - 1;
}

/* A launch decided only at its exit (callbacks came on meanwhile) was submitted with kernel records off in sampled
 * mode: no kernel record will join it, so it counts as skipped and the next sampled launch carries its weight. */
static void decide_late(enum shim_api_kind kind)
{
    decide(kind);
    if (thread_weight && shim_activity_per_launch()) {
        thread_limit->skipped += thread_weight;
        thread_weight = 0;
    }
}

static void returned(CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const CUpti_CallbackData *data, int nested,
                     enum shim_api_kind kind)
{
    uint32_t correlation_id = data->correlationId;
    uint32_t weight = thread_weight;
    mark(correlation_id, weight ? SHIM_CORR_SAMPLED : SHIM_CORR_SKIPPED);
    const char *domain_name = domain == CUPTI_CB_DOMAIN_RUNTIME_API ? "runtime" : "driver";
    if (nested) {
        atomic_fetch_add(&shim_counters.launches_nested, 1);
        if (shim_recording())
            shim_record_launch(correlation_id, (int32_t)cbid, domain_name, data->functionName, weight, 1, kind, NULL);
        return;
    }
    thread_decided = 0;
    /* both cudaError_t and CUresult are enums whose success is 0 */
    if (data->functionReturnValue != NULL && *(const int *)data->functionReturnValue != 0) {
        atomic_fetch_add(&shim_counters.launches_failed, 1);
        undo(weight);
        return;
    }
    atomic_fetch_add_explicit(&shim_counters.launches, 1, memory_order_relaxed);
    if (kind == SHIM_API_GRAPH)
        atomic_fetch_add_explicit(&shim_counters.graph_launches, 1, memory_order_relaxed);
    char path[FLEETPROF_RANGE_PATH_MAX];
    int ranged = 0;
    if (weight) {
        atomic_fetch_add_explicit(&shim_counters.launches_sampled, 1, memory_order_relaxed);
        if (kind == SHIM_API_GRAPH)
            atomic_fetch_add_explicit(&shim_counters.graph_launches_sampled, 1, memory_order_relaxed);
        if (FLEETPROF_ENABLED(launch_range))
            ranged = shim_nvtx_path(path);
    }
    if (shim_recording())
        shim_record_launch(correlation_id, (int32_t)cbid, domain_name, data->functionName, weight, 0, kind,
                           ranged ? path : NULL);
    if (weight) {
        if (weight > 1)
            FLEETPROF_LAUNCH_WEIGHT(correlation_id, weight);
        if (ranged)
            FLEETPROF_LAUNCH_RANGE(correlation_id, path);
        FLEETPROF_KERNEL_LAUNCH(correlation_id, (int32_t)cbid, data->functionName);
    }
}

void CUPTIAPI shim_on_api(void *userdata, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void *cbdata)
{
    (void)userdata;
    if (domain != CUPTI_CB_DOMAIN_RUNTIME_API && domain != CUPTI_CB_DOMAIN_DRIVER_API)
        return;
    const CUpti_CallbackData *data = cbdata;
    enum shim_api_kind kind = api_kind(domain, cbid);
    uint32_t now_epoch = atomic_load_explicit(&epoch, memory_order_relaxed);
    if (thread_epoch != now_epoch) {
        /* a call that was in progress when callbacks went off never saw its exit */
        thread_epoch = now_epoch;
        thread_depth = 0;
        thread_decided = 0;
        thread_hold = 0; /* its generation is gone with the turn-off: nothing to release */
    }
    if (data->callbackSite == CUPTI_API_ENTER) {
        if (thread_depth++ == 0) {
            decide(kind);
            if (thread_weight) /* last: the driver submits right after this returns */
                thread_hold = shim_activity_hold(thread_kinds);
        }
        return;
    }
    if (thread_depth > 0)
        thread_depth--;
    if (thread_depth == 0 && thread_hold) {
        shim_activity_release(thread_hold); /* first: the launch has submitted its work, failed or not */
        thread_hold = 0;
    }
    if (!thread_decided)
        decide_late(kind); /* callbacks were turned on between this call's entry and its exit */
    returned(domain, cbid, data, thread_depth > 0, kind);
}
