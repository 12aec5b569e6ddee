/* Memory copies and sets: their launch APIs (cudaMemcpy*, cudaMemset*, cuMemcpy*, cuMemsetD*, every _ptsz/_ptds
 * variant) are subscribed like kernel launches, sampled by the same per-thread rate limit and held on in sampled mode
 * (launches.c, activity.c), and their MEMCPY / MEMSET activity records fire memory_executed with the same rules as
 * kernel records: none for a copy whose launch was skipped, fired and counted for one whose launch was never seen.
 *
 * Peer-to-peer copies between two devices come as MEMCPY2 records (CUpti_ActivityMemcpyPtoP), enabled with MEMCPY
 * (a copy launch holds both on in sampled mode: any copy, cudaMemcpy with cudaMemcpyDefault too, may be between
 * devices) and fired as memory_executed like a MEMCPY record: copy kind PtoP, the source and destination memory
 * kinds, and the record's deviceId (where the copy runs; the source and destination devices are not passed on).
 */
#include "copy_apis.h"
#include "fleetprof_probes.h"
#include "shim.h"

/* Only fields of the common prefix are read; the memcpy record has them at these offsets from version 4 (CUDA 11) to
 * 6, the memset record from version 3 to 4. */
typedef CUpti_ActivityMemcpy6 memcpy_record;
typedef CUpti_ActivityMemset4 memset_record;
_Static_assert(offsetof(memcpy_record, bytes) == 8, "memcpy record layout");
_Static_assert(offsetof(memcpy_record, start) == 16, "memcpy record layout");
_Static_assert(offsetof(memcpy_record, deviceId) == 32, "memcpy record layout");
_Static_assert(offsetof(memcpy_record, streamId) == 40, "memcpy record layout");
_Static_assert(offsetof(memcpy_record, correlationId) == 44, "memcpy record layout");
_Static_assert(offsetof(memcpy_record, graphNodeId) == 64, "memcpy record layout");
_Static_assert(offsetof(memcpy_record, graphId) == 72, "memcpy record layout");
/* The peer-to-peer record has its own layout past the first 40 bytes; these offsets hold from version 3 (the first
 * with graphId) to 4 (CUDA 12). */
typedef CUpti_ActivityMemcpyPtoP4 memcpy2_record;
_Static_assert(offsetof(memcpy2_record, copyKind) == 4, "memcpy2 record layout");
_Static_assert(offsetof(memcpy2_record, srcKind) == 5, "memcpy2 record layout");
_Static_assert(offsetof(memcpy2_record, dstKind) == 6, "memcpy2 record layout");
_Static_assert(offsetof(memcpy2_record, bytes) == 8, "memcpy2 record layout");
_Static_assert(offsetof(memcpy2_record, start) == 16, "memcpy2 record layout");
_Static_assert(offsetof(memcpy2_record, end) == 24, "memcpy2 record layout");
_Static_assert(offsetof(memcpy2_record, deviceId) == 32, "memcpy2 record layout");
_Static_assert(offsetof(memcpy2_record, streamId) == 40, "memcpy2 record layout");
_Static_assert(offsetof(memcpy2_record, correlationId) == 60, "memcpy2 record layout");
_Static_assert(offsetof(memcpy2_record, graphNodeId) == 72, "memcpy2 record layout");
_Static_assert(offsetof(memcpy2_record, graphId) == 80, "memcpy2 record layout");
_Static_assert(offsetof(memset_record, bytes) == 8, "memset record layout");
_Static_assert(offsetof(memset_record, correlationId) == 44, "memset record layout");
_Static_assert(offsetof(memset_record, memoryKind) == 50, "memset record layout");
_Static_assert(offsetof(memset_record, graphNodeId) == 64, "memset record layout");
_Static_assert(offsetof(memset_record, graphId) == 72, "memset record layout");

static const CUpti_CallbackId runtime_copies[] = {SHIM_RUNTIME_COPIES};
static const CUpti_CallbackId runtime_sets[] = {SHIM_RUNTIME_SETS};
static const CUpti_CallbackId driver_copies[] = {SHIM_DRIVER_COPIES};
static const CUpti_CallbackId driver_sets[] = {SHIM_DRIVER_SETS};

#define MAX_CBID 1024
static uint8_t api_kinds[2][MAX_CBID]; /* [0] runtime, [1] driver: enum shim_api_kind, filled once */

static int enable_list(CUpti_SubscriberHandle subscriber, uint32_t enable, CUpti_CallbackDomain domain,
                       const CUpti_CallbackId *ids, size_t count, enum shim_api_kind kind)
{
    int enabled = 0;
    for (size_t i = 0; i < count; i++) {
        if (ids[i] < MAX_CBID)
            api_kinds[domain == CUPTI_CB_DOMAIN_DRIVER_API][ids[i]] = (uint8_t)kind;
        enabled += shim_cupti.enable_callback(enable, subscriber, domain, ids[i]) == CUPTI_SUCCESS;
    }
    return enabled;
}

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

int shim_enable_memory_callbacks(CUpti_SubscriberHandle subscriber, uint32_t enable)
{
    return enable_list(subscriber, enable, CUPTI_CB_DOMAIN_RUNTIME_API, runtime_copies, COUNT(runtime_copies),
                       SHIM_API_COPY) +
           enable_list(subscriber, enable, CUPTI_CB_DOMAIN_RUNTIME_API, runtime_sets, COUNT(runtime_sets),
                       SHIM_API_SET) +
           enable_list(subscriber, enable, CUPTI_CB_DOMAIN_DRIVER_API, driver_copies, COUNT(driver_copies),
                       SHIM_API_COPY) +
           enable_list(subscriber, enable, CUPTI_CB_DOMAIN_DRIVER_API, driver_sets, COUNT(driver_sets), SHIM_API_SET);
}

enum shim_api_kind shim_memory_api_kind(CUpti_CallbackDomain domain, CUpti_CallbackId cbid)
{
    return cbid < MAX_CBID ? (enum shim_api_kind)api_kinds[domain == CUPTI_CB_DOMAIN_DRIVER_API][cbid] : SHIM_API_NONE;
}

static void memory(uint64_t raw_start, uint64_t raw_end, uint32_t correlation_id, uint32_t device_id,
                   uint32_t stream_id, uint64_t bytes, uint32_t kind, uint32_t graph_id, uint64_t graph_node_id,
                   uint64_t latest)
{
    if (raw_start == 0 && raw_end == 0) {
        atomic_fetch_add_explicit(&shim_counters.memory_incomplete, 1, memory_order_relaxed);
        return;
    }
    uint64_t start = raw_start + (uint64_t)shim_clock_offset_ns();
    uint64_t end = raw_end + (uint64_t)shim_clock_offset_ns();
    if (!shim_plausible(start, end, latest))
        return;
    atomic_fetch_add_explicit(&shim_counters.gpu_ns, end - start, memory_order_relaxed);
    int state = shim_correlation_state(correlation_id);
    if (state == SHIM_CORR_SKIPPED)
        atomic_fetch_add_explicit(&shim_counters.memory_skipped, 1, memory_order_relaxed);
    else if (state == SHIM_CORR_UNSEEN)
        atomic_fetch_add_explicit(&shim_counters.memory_unseen, 1, memory_order_relaxed);
    int fire = state != SHIM_CORR_SKIPPED;
    if (fire)
        FLEETPROF_MEMORY_EXECUTED(start, end, correlation_id, device_id, stream_id, bytes, kind, graph_id,
                                  graph_node_id);
    if (shim_recording())
        shim_record_memory(start, end, correlation_id, device_id, stream_id, bytes, kind, fire, graph_id,
                           graph_node_id);
}

void shim_memcpy_record(const CUpti_Activity *record, uint64_t latest)
{
    const memcpy_record *m = (const memcpy_record *)record;
    atomic_fetch_add_explicit(&shim_counters.copies, 1, memory_order_relaxed);
    memory(m->start, m->end, m->correlationId, m->deviceId, m->streamId, m->bytes,
           FLEETPROF_MEMORY_KIND(m->copyKind, 0, m->srcKind, m->dstKind), m->graphId, m->graphNodeId, latest);
}

void shim_memcpy2_record(const CUpti_Activity *record, uint64_t latest)
{
    const memcpy2_record *m = (const memcpy2_record *)record;
    atomic_fetch_add_explicit(&shim_counters.copies, 1, memory_order_relaxed);
    memory(m->start, m->end, m->correlationId, m->deviceId, m->streamId, m->bytes,
           FLEETPROF_MEMORY_KIND(m->copyKind, 0, m->srcKind, m->dstKind), m->graphId, m->graphNodeId, latest);
}

void shim_memset_record(const CUpti_Activity *record, uint64_t latest)
{
    const memset_record *m = (const memset_record *)record;
    atomic_fetch_add_explicit(&shim_counters.sets, 1, memory_order_relaxed);
    memory(m->start, m->end, m->correlationId, m->deviceId, m->streamId, m->bytes,
           FLEETPROF_MEMORY_KIND(0, 1, 0, m->memoryKind), m->graphId, m->graphNodeId, latest);
}
