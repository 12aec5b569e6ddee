/* CONCURRENT_KERNEL, MEMCPY, MEMSET and MEMCPY2 (peer-to-peer copy) activity records: which kernels and copies CUPTI
 * times, a fixed pool of buffers handed to CUPTI, and one kernel_executed (graph_kernel_executed for a kernel a CUDA
 * graph replayed) probe per kernel record, with CUPTI's timestamps as Unix ns; copies and sets are memory.c's.
 *
 * Which kernels (FLEETPROF_CUPTI_ACTIVITY). With the kind enabled CUPTI instruments every kernel submitted and hands
 * over one record per kernel; on a launch-bound workload (tens of thousands of short kernels a second per thread) that
 * is most of the cost of being attached (parca-agent#3213: -64% vLLM throughput with a CUPTI shim), although the rate
 * limit keeps about FLEETPROF_LAUNCH_RATE launches a second per thread and the other records are read only to be
 * dropped. So the CUPTI work is made proportional to what is sampled:
 * - sampled (default): the kind is enabled in the enter callback of a launch the rate limit samples, as the last
 *   thing before the driver submits it, and disabled in its exit callback, as the first thing (a failed launch too).
 *   Enabling applies to work submitted while it is on, so that launch's kernels come with records (every kernel node
 *   of a graph launch included) and a skipped launch's kernels do not. The switch is process-wide (CUPTI has none per
 *   thread, and one per context would not separate threads on one GPU): a count of holders lets concurrent sampled
 *   launches nest (per kind: a kernel launch holds CONCURRENT_KERNEL on, a copy MEMCPY and MEMCPY2, a set MEMSET, a
 *   graph launch all of them for its whole submission, so every node of the replay is timed), and a skipped launch
 *   that another thread submits meanwhile still gets its records, which are
 *   counted (kernels_skipped) and dropped as before. Records per launch are the sampled fraction times one plus that
 *   overlap, which is about (other threads launching meanwhile) x (time inside a launch call / time between
 *   launches): 1 for one launching thread; weights are the rate limit's, so totals stay unbiased.
 * - always: on while an agent is attached, every kernel timed (the behaviour before sampled existed), for comparison.
 *   Also what runs with FLEETPROF_LAUNCH_RATE=0 (every launch sampled: one enable beats two calls per launch), when
 *   another tool holds CUPTI's one subscriber (no launch callbacks to enable from), and with the self-check file
 *   (FLEETPROF_CUPTI_RECORD), which is compared with torch.profiler kernel by kernel; that file with
 *   FLEETPROF_CUPTI_ACTIVITY=sampled set explicitly checks the sampled mode on a GPU instead.
 * Duty cycles (on for d ms of every D, records weighted D/d) were the alternative: a sampled launch outside a window
 * would lose its kernel, so sampling would have to follow the windows, and windows in step with a training loop's
 * period keep seeing the same part of each step, the bias the rate limit's independent draws avoid.
 * What CUPTI does not document, and a GPU run has to confirm: that enabling from inside an enter callback applies to
 * that very launch (and to graph launches whose graph was instantiated while the kind was off), that records of
 * kernels submitted while on still arrive after the disable, and what an enable/disable pair costs (counted here:
 * activity_enables; refusals: activity_refused, with a warning at exit).
 *
 * Memory stays bounded under CUDA graph replay (thousands of kernels per launch): the pool is allocated once
 * (FLEETPROF_CUPTI_BUFFERS x FLEETPROF_CUPTI_BUFFER_KB); when every buffer is out, the request is refused and CUPTI
 * drops records, and both are counted.
 *
 * Clock: kernel timestamps are taken on the GPU and converted by CUPTI to its CPU clock. Where libcupti has
 * cuptiActivityRegisterTimestampCallback (CUDA 12.x and later) we hand it CLOCK_REALTIME before enabling any record,
 * so records come out in Unix ns as they are. Otherwise the offset from cuptiGetTimestamp to CLOCK_REALTIME is
 * measured at each start and added to every record: of several readings, the one with the shortest CLOCK_REALTIME
 * bracket wins, its midpoint against CUPTI's value (error: half that bracket, well under a microsecond). CUPTI on
 * Linux defaults to CLOCK_REALTIME, so the measured offset is then below the jitter and taken as 0; the record file
 * keeps the measured value either way, as a check.
 */
#include "fleetprof_probes.h"
#include "shim.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

/* Only fields of the common prefix are read; every kernel record version from 4 to 13 (CUDA 12 and 13) has them at
 * these offsets (graphNodeId and graphId since version 5, CUDA 11), so a record of a newer libcupti reads correctly
 * through the CUDA 12 header's type. */
typedef CUpti_ActivityKernel9 kernel_record;
_Static_assert(offsetof(kernel_record, start) == 16, "kernel record layout");
_Static_assert(offsetof(kernel_record, end) == 24, "kernel record layout");
_Static_assert(offsetof(kernel_record, deviceId) == 40, "kernel record layout");
_Static_assert(offsetof(kernel_record, streamId) == 48, "kernel record layout");
_Static_assert(offsetof(kernel_record, correlationId) == 92, "kernel record layout");
_Static_assert(offsetof(kernel_record, name) == 104, "kernel record layout");
_Static_assert(offsetof(kernel_record, graphNodeId) == 144, "kernel record layout");
_Static_assert(offsetof(kernel_record, graphId) == 156, "kernel record layout");

static const CUpti_ActivityKind kinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                           CUPTI_ACTIVITY_KIND_MEMSET,
                                           CUPTI_ACTIVITY_KIND_MEMCPY2}; /* in SHIM_KIND_* bit order */
static const char *const refused_notes[] = {"kernel_refused", "memcpy_refused", "memset_refused", "memcpy2_refused"};
#define KIND_COUNT 4
#define KIND_BITS 4 /* a token is the generation above the kinds it holds */
#define LATEST_SLACK_NS 1000000000ull /* a record may end up to 1 s after its buffer's delivery: clock steps */

#define OFFSET_IS_ZERO_NS 1000 /* below this the measured offset is the measurement's own jitter */

static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static uint8_t *pool_memory;
static uint8_t **pool_free;
static uint32_t pool_free_count;
static int callbacks_registered;
static int timestamp_callback;
static const char *clock_source = "none";
static int64_t clock_offset_ns;    /* added to every record's timestamps */
static int64_t measured_offset_ns; /* CLOCK_REALTIME - cuptiGetTimestamp at the last start, a check */
static uint32_t kinds_available;   /* the kinds CUPTI took at the last start */
static uint64_t on_since_ns;       /* CLOCK_REALTIME when records came on, less a second: no record starts before */

/* sampled mode: records on while at least one sampled launch holds them */
static pthread_mutex_t hold_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int per_launch;  /* read without the lock by every sampled launch; written under it */
static uint32_t holders[KIND_COUNT]; /* under hold_mu */
static uint32_t generation = 1; /* under hold_mu: tokens of launches in flight across a stop or start are stale */

int shim_activity_init(void)
{
    size_t bytes = (size_t)shim_settings.buffers * shim_settings.buffer_bytes;
    pool_memory = aligned_alloc(64, bytes); /* CUPTI wants 8-byte aligned buffers */
    pool_free = calloc(shim_settings.buffers, sizeof(*pool_free));
    if (pool_memory == NULL || pool_free == NULL) {
        free(pool_memory);
        free(pool_free);
        return -1;
    }
    for (uint32_t i = 0; i < shim_settings.buffers; i++)
        pool_free[i] = pool_memory + (size_t)i * shim_settings.buffer_bytes;
    pool_free_count = shim_settings.buffers;
    return 0;
}

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    pthread_mutex_lock(&pool_mu);
    if (pool_free_count > 0) {
        *buffer = pool_free[--pool_free_count];
        *size = shim_settings.buffer_bytes;
    } else {
        *buffer = NULL;
        *size = 0;
        atomic_fetch_add(&shim_counters.buffers_refused, 1);
    }
    pthread_mutex_unlock(&pool_mu);
    *max_records = 0;
}

int shim_plausible(uint64_t start, uint64_t end, uint64_t latest)
{
    if (end >= start && start >= on_since_ns && end <= latest)
        return 1;
    atomic_fetch_add_explicit(&shim_counters.records_implausible, 1, memory_order_relaxed);
    return 0;
}

static void kernel(const kernel_record *record, uint64_t latest)
{
    atomic_fetch_add_explicit(&shim_counters.kernels, 1, memory_order_relaxed);
    if (record->graphId != 0)
        atomic_fetch_add_explicit(&shim_counters.graph_kernels, 1, memory_order_relaxed);
    if (record->start == 0 && record->end == 0) {
        atomic_fetch_add(&shim_counters.kernels_incomplete, 1);
        return;
    }
    uint64_t start = record->start + (uint64_t)clock_offset_ns;
    uint64_t end = record->end + (uint64_t)clock_offset_ns;
    if (!shim_plausible(start, end, latest))
        return;
    atomic_fetch_add_explicit(&shim_counters.gpu_ns, end - start, memory_order_relaxed);
    const char *name = record->name != NULL ? record->name : "";
    /* a graph launch's records all carry its correlation id: the table entry is read, never consumed */
    int state = shim_correlation_state(record->correlationId);
    if (state == SHIM_CORR_SKIPPED)
        atomic_fetch_add_explicit(&shim_counters.kernels_skipped, 1, memory_order_relaxed);
    else if (state == SHIM_CORR_UNSEEN)
        atomic_fetch_add_explicit(&shim_counters.kernels_unseen, 1, memory_order_relaxed);
    int fire = state != SHIM_CORR_SKIPPED;
    if (fire && record->graphId != 0)
        FLEETPROF_GRAPH_KERNEL_EXECUTED(start, end, record->correlationId, record->deviceId, record->streamId, name,
                                        record->graphId, record->graphNodeId);
    else if (fire)
        FLEETPROF_KERNEL_EXECUTED(start, end, record->correlationId, record->deviceId, record->streamId, name);
    if (shim_recording())
        shim_record_kernel(start, end, record->correlationId, record->deviceId, record->streamId, name, fire,
                           record->graphId, record->graphNodeId);
}

static uint64_t CUPTIAPI realtime_ns(void);

static void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream_id, uint8_t *buffer, size_t size,
                                      size_t valid_size)
{
    (void)size;
    uint64_t latest = realtime_ns() + LATEST_SLACK_NS; /* read once per buffer */
    CUpti_Activity *record = NULL;
    while (buffer != NULL && shim_cupti.activity_get_next_record(buffer, valid_size, &record) == CUPTI_SUCCESS) {
        if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || record->kind == CUPTI_ACTIVITY_KIND_KERNEL)
            kernel((const kernel_record *)record, latest);
        else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY)
            shim_memcpy_record(record, latest);
        else if (record->kind == CUPTI_ACTIVITY_KIND_MEMSET)
            shim_memset_record(record, latest);
        else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY2)
            shim_memcpy2_record(record, latest);
    }
    size_t dropped = 0;
    if (shim_cupti.activity_get_num_dropped_records(context, stream_id, &dropped) == CUPTI_SUCCESS && dropped > 0)
        atomic_fetch_add(&shim_counters.records_dropped, dropped);
    if (buffer == NULL)
        return;
    pthread_mutex_lock(&pool_mu);
    if (pool_free_count < shim_settings.buffers)
        pool_free[pool_free_count++] = buffer;
    pthread_mutex_unlock(&pool_mu);
}

static uint64_t CUPTIAPI realtime_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int64_t measure_offset(void)
{
    uint64_t best = UINT64_MAX;
    int64_t offset = 0;
    for (int i = 0; i < 9; i++) {
        uint64_t cupti_ns = 0;
        uint64_t before = realtime_ns();
        if (shim_cupti.get_timestamp(&cupti_ns) != CUPTI_SUCCESS)
            return 0;
        uint64_t after = realtime_ns();
        if (after - before < best) {
            best = after - before;
            offset = (int64_t)(before + (after - before) / 2) - (int64_t)cupti_ns;
        }
    }
    return offset;
}

static void align_clock(void)
{
    /* registered before the first activity kind is enabled, as CUPTI requires; once is enough */
    if (!callbacks_registered && shim_cupti.activity_register_timestamp_callback != NULL)
        timestamp_callback = shim_cupti.activity_register_timestamp_callback(realtime_ns) == CUPTI_SUCCESS;
    measured_offset_ns = measure_offset();
    if (timestamp_callback) {
        clock_offset_ns = 0;
        clock_source = "cupti-timestamp-callback";
    } else if (measured_offset_ns > -OFFSET_IS_ZERO_NS && measured_offset_ns < OFFSET_IS_ZERO_NS) {
        clock_offset_ns = 0;
        clock_source = "cupti-realtime";
    } else {
        clock_offset_ns = measured_offset_ns;
        clock_source = "measured-offset";
    }
}

static void new_generation(int sampled)
{
    pthread_mutex_lock(&hold_mu);
    for (int i = 0; i < KIND_COUNT; i++)
        holders[i] = 0;
    if (++generation >= (1u << (32 - KIND_BITS))) /* a token is the generation and the kinds held */
        generation = 1;
    atomic_store(&per_launch, sampled);
    pthread_mutex_unlock(&hold_mu);
}

int shim_activity_start(int sampled)
{
    align_clock();
    if (!callbacks_registered) {
        CUptiResult result = shim_cupti.activity_register_callbacks(buffer_requested, buffer_completed);
        if (result != CUPTI_SUCCESS) {
            shim_warn("cannot register CUPTI activity buffers (%s): GPU profiling is off", shim_result_string(result));
            return -1;
        }
        callbacks_registered = 1;
    }
    on_since_ns = realtime_ns() - LATEST_SLACK_NS;
    /* enabled here even in sampled mode: a refusal is said now, not found in a launch, and what CUPTI does at the
     * first enable (generating its timing code for the loaded modules: stalls of seconds, pytorch/kineto#542) is
     * done on this thread, not inside the application's first sampled launch */
    CUptiResult result = shim_cupti.activity_enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    if (result != CUPTI_SUCCESS) {
        shim_warn("cannot enable CUPTI kernel records (%s): GPU profiling is off", shim_result_string(result));
        return -1;
    }
    kinds_available = SHIM_KIND_KERNEL;
    for (int i = 1; i < KIND_COUNT; i++) { /* copies and sets are optional: kernels are timed without them */
        result = shim_cupti.activity_enable(kinds[i]);
        if (result == CUPTI_SUCCESS)
            kinds_available |= 1u << i;
        else
            shim_record_note(refused_notes[i], shim_result_string(result));
    }
    if (sampled)
        for (int i = 0; i < KIND_COUNT; i++)
            if (kinds_available & (1u << i))
                shim_cupti.activity_disable(kinds[i]);
    new_generation(sampled);
    return 0;
}

void shim_activity_stop(void)
{
    new_generation(0);
    for (int i = 0; i < KIND_COUNT; i++)
        if (kinds_available & (1u << i))
            shim_cupti.activity_disable(kinds[i]);
    shim_cupti.activity_flush_all(0);
}

int shim_activity_per_launch(void)
{
    return atomic_load(&per_launch);
}

uint32_t shim_activity_hold(uint32_t wanted)
{
    if (!atomic_load_explicit(&per_launch, memory_order_relaxed))
        return 0;
    uint32_t token = 0;
    pthread_mutex_lock(&hold_mu); /* held across the CUPTI calls: enable and disable stay in the holders' order */
    if (atomic_load_explicit(&per_launch, memory_order_relaxed)) {
        uint32_t held = 0;
        int refused = 0;
        for (int i = 0; i < KIND_COUNT; i++) {
            if (!(wanted & kinds_available & (1u << i)))
                continue;
            if (holders[i] > 0) {
                holders[i]++;
                held |= 1u << i;
            } else if (shim_cupti.activity_enable(kinds[i]) == CUPTI_SUCCESS) {
                holders[i] = 1;
                held |= 1u << i;
                if (i == 0)
                    atomic_fetch_add_explicit(&shim_counters.activity_enables, 1, memory_order_relaxed);
            } else {
                refused = 1;
            }
        }
        /* a refused kind is not held: the token names the kinds the release gives back */
        if (refused)
            atomic_fetch_add_explicit(&shim_counters.activity_refused, 1, memory_order_relaxed);
        if (held)
            token = generation << KIND_BITS | held;
    }
    pthread_mutex_unlock(&hold_mu);
    return token;
}

void shim_activity_release(uint32_t token)
{
    if (token == 0)
        return;
    pthread_mutex_lock(&hold_mu);
    for (int i = 0; i < KIND_COUNT && token >> KIND_BITS == generation; i++)
        if ((token & (1u << i)) && holders[i] > 0 && --holders[i] == 0)
            shim_cupti.activity_disable(kinds[i]);
    pthread_mutex_unlock(&hold_mu);
}

const char *shim_clock_source(void)
{
    return clock_source;
}

int64_t shim_clock_offset_ns(void)
{
    return clock_offset_ns;
}

int64_t shim_clock_measured_offset_ns(void)
{
    return measured_offset_ns;
}
