/* libcupti_simulated.so: a simulated libcupti for testing the shim without a GPU (tests/test_cupti_shim.py).
 *
 * It is a test double at a C ABI fleetprof does not own: the CUPTI entry points the shim resolves, with CUPTI's own
 * types, behaving as the documentation describes (one subscriber, per-callback enabling, activity buffers requested
 * and completed through the registered callbacks, dropped records counted when no buffer is given). A test drives it
 * with simcupti_launch, which plays one launch API call: the enter and exit callbacks on the calling thread and the
 * kernel records it produces; simcupti_memory (a copy or set API call and its MEMCPY or MEMSET record),
 * simcupti_peer_copy (a copy between two devices and its MEMCPY2 record) and simcupti_graph_launch (a graph launch
 * whose kernel and copy nodes carry the graph id and node ids, CUDA 11's records) are in simulated_workloads.c.
 * Kernels do not run; their times come from the clock CUPTI would use. Records of the four kinds follow each other
 * in a buffer, each as long as its CUDA 12 type (simulated_records.c); simcupti_totals says what was generated,
 * dropped and delivered, and the GPU time generated, for exact totals.
 *
 * Activity enabling applies to work submitted afterwards: a launch's kernels produce records only when their kind was
 * enabled at the moment the launch submitted them, which is between its enter and exit callbacks (for a graph
 * launch, all of its kernel nodes at once). So a tool may enable the kind in the enter callback of the launches it
 * wants timed and disable it at their exit. The test double counts what that costs: the records it delivered in
 * completed buffers and the enable and disable calls (simcupti_records_delivered, simcupti_activity_calls).
 *
 * SIMULATED_CUPTI_CLOCK=monotonic makes cuptiGetTimestamp and the records use CLOCK_MONOTONIC and refuses the
 * timestamp callback, as an older CUPTI without it would: the shim must then measure the offset itself.
 */
#include <cupti.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "simulated_cupti.h"

#define MAX_CBID 1024

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static CUpti_CallbackFunc subscriber_fn;
static void *subscriber_data;
static int subscribed;
static unsigned char enabled[2][MAX_CBID]; /* [0] runtime, [1] driver */
static CUpti_BuffersCallbackRequestFunc buffer_requested;
static CUpti_BuffersCallbackCompleteFunc buffer_completed;
/* atomics, not under mu: a launch reads the switches without waiting for another thread's records */
static _Atomic int kernels_on;
static _Atomic int memcpy_on;
static _Atomic int memset_on;
static _Atomic int memcpy2_on; /* peer-to-peer copies */
static _Atomic uint64_t enable_calls; /* cuptiActivityEnable/Disable of the kernel kind */
static _Atomic uint64_t disable_calls;
static _Atomic uint64_t other_calls;  /* ... of the other kinds, enables and disables together */
static uint64_t records_delivered; /* records buffer_completed has returned from, under mu */
static uint64_t records_generated; /* records written into a buffer (not dropped), under mu */
static uint64_t records_dropped_total; /* under mu */
static uint64_t generated_ns;      /* sum of end - start of the records generated, under mu */
static pthread_mutex_t flush_mu = PTHREAD_MUTEX_INITIALIZER; /* one flush at a time: one returns when all is read */
static CUpti_TimestampCallbackFunc timestamp_fn;
static uint8_t *buffer;
static size_t buffer_size;
static size_t buffer_used;
static size_t dropped;
static size_t buffer_records;
#define MAX_PENDING 64
static struct pending {
    uint8_t *data;
    size_t size;
    size_t used;
    size_t records;
} pending[MAX_PENDING];
static int pending_count;
static uint32_t next_correlation_id;
static const char *names[64]; /* kernel names live as long as the library, as CUPTI's do */
static int name_count;

static int monotonic_clock(void)
{
    const char *clock = getenv("SIMULATED_CUPTI_CLOCK");
    return clock != NULL && strcmp(clock, "monotonic") == 0;
}

static uint64_t now_ns(void)
{
    if (timestamp_fn != NULL)
        return timestamp_fn();
    struct timespec ts;
    clock_gettime(monotonic_clock() ? CLOCK_MONOTONIC : CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

SIM_API CUptiResult cuptiSubscribe(CUpti_SubscriberHandle *subscriber, CUpti_CallbackFunc callback, void *userdata)
{
    pthread_mutex_lock(&mu);
    CUptiResult result = CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
    if (!subscribed) {
        subscribed = 1;
        subscriber_fn = callback;
        subscriber_data = userdata;
        *subscriber = (CUpti_SubscriberHandle)&subscribed;
        result = CUPTI_SUCCESS;
    }
    pthread_mutex_unlock(&mu);
    return result;
}

SIM_API CUptiResult cuptiUnsubscribe(CUpti_SubscriberHandle subscriber)
{
    (void)subscriber;
    pthread_mutex_lock(&mu);
    subscribed = 0;
    memset(enabled, 0, sizeof(enabled));
    pthread_mutex_unlock(&mu);
    return CUPTI_SUCCESS;
}

SIM_API CUptiResult cuptiEnableCallback(uint32_t enable, CUpti_SubscriberHandle subscriber,
                                        CUpti_CallbackDomain domain, CUpti_CallbackId cbid)
{
    (void)subscriber;
    if (cbid >= MAX_CBID || (domain != CUPTI_CB_DOMAIN_RUNTIME_API && domain != CUPTI_CB_DOMAIN_DRIVER_API))
        return CUPTI_ERROR_INVALID_PARAMETER;
    enabled[domain == CUPTI_CB_DOMAIN_DRIVER_API][cbid] = enable != 0;
    return CUPTI_SUCCESS;
}

SIM_API CUptiResult cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc requested,
                                                   CUpti_BuffersCallbackCompleteFunc completed)
{
    if (requested == NULL || completed == NULL)
        return CUPTI_ERROR_INVALID_PARAMETER;
    buffer_requested = requested;
    buffer_completed = completed;
    return CUPTI_SUCCESS;
}

/* The switch of a kind this double produces (kernels, copies, sets, peer copies); NULL for the others. */
static _Atomic int *kind_switch(CUpti_ActivityKind kind)
{
    if (kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)
        return &kernels_on;
    if (kind == CUPTI_ACTIVITY_KIND_MEMCPY)
        return &memcpy_on;
    if (kind == CUPTI_ACTIVITY_KIND_MEMSET)
        return &memset_on;
    if (kind == CUPTI_ACTIVITY_KIND_MEMCPY2)
        return &memcpy2_on;
    return NULL;
}

SIM_API CUptiResult cuptiActivityEnable(CUpti_ActivityKind kind)
{
    _Atomic int *on = kind_switch(kind);
    if (on == NULL)
        return CUPTI_ERROR_NOT_SUPPORTED;
    atomic_store(on, 1);
    atomic_fetch_add(on == &kernels_on ? &enable_calls : &other_calls, 1);
    return CUPTI_SUCCESS;
}

SIM_API CUptiResult cuptiActivityDisable(CUpti_ActivityKind kind)
{
    _Atomic int *on = kind_switch(kind);
    if (on == NULL)
        return CUPTI_SUCCESS;
    atomic_store(on, 0);
    atomic_fetch_add(on == &kernels_on ? &disable_calls : &other_calls, 1);
    return CUPTI_SUCCESS;
}

/* Records of different kinds follow each other in a buffer, each as long as its type, as CUPTI's do. */
SIM_API CUptiResult cuptiActivityGetNextRecord(uint8_t *records, size_t valid_size, CUpti_Activity **record)
{
    uint8_t *next = *record == NULL ? records : (uint8_t *)*record + simcupti_record_size((*record)->kind);
    if (next + sizeof(CUpti_Activity) > records + valid_size ||
        next + simcupti_record_size(((CUpti_Activity *)next)->kind) > records + valid_size)
        return CUPTI_ERROR_MAX_LIMIT_REACHED;
    *record = (CUpti_Activity *)next;
    return CUPTI_SUCCESS;
}

SIM_API CUptiResult cuptiActivityGetNumDroppedRecords(CUcontext context, uint32_t stream_id, size_t *count)
{
    (void)context;
    (void)stream_id;
    *count = dropped;
    dropped = 0;
    return CUPTI_SUCCESS;
}

/* Hands a completed buffer to the tool (called without mu), and counts its records once the tool has read them. */
static void deliver(uint8_t *data, size_t size, size_t used, size_t records)
{
    buffer_completed(NULL, 0, data, size, used);
    pthread_mutex_lock(&mu);
    records_delivered += records;
    pthread_mutex_unlock(&mu);
}

/* A full buffer waits for the next flush, as with CUPTI's worker thread, so a small pool can run dry. */
static void retire(void)
{
    if (buffer == NULL)
        return;
    if (pending_count == MAX_PENDING) { /* cannot happen with the shim's pool sizes; keep the records anyway */
        pthread_mutex_unlock(&mu);
        deliver(buffer, buffer_size, buffer_used, buffer_records);
        pthread_mutex_lock(&mu);
    } else {
        pending[pending_count++] = (struct pending){buffer, buffer_size, buffer_used, buffer_records};
    }
    buffer = NULL;
    buffer_used = 0;
    buffer_records = 0;
}

SIM_API CUptiResult cuptiActivityFlushAll(uint32_t flag)
{
    (void)flag;
    if (buffer_completed == NULL)
        return CUPTI_ERROR_INVALID_OPERATION;
    pthread_mutex_lock(&flush_mu);
    pthread_mutex_lock(&mu);
    if (buffer_used > 0)
        retire();
    struct pending out[MAX_PENDING];
    int count = pending_count;
    memcpy(out, pending, sizeof(out[0]) * (size_t)count);
    pending_count = 0;
    int report_drops = count == 0 && dropped > 0;
    pthread_mutex_unlock(&mu);
    for (int i = 0; i < count; i++)
        deliver(out[i].data, out[i].size, out[i].used, out[i].records);
    if (report_drops)
        buffer_completed(NULL, 0, NULL, 0, 0);
    pthread_mutex_unlock(&flush_mu);
    return CUPTI_SUCCESS;
}

SIM_API CUptiResult cuptiGetTimestamp(uint64_t *timestamp)
{
    *timestamp = now_ns();
    return CUPTI_SUCCESS;
}

SIM_API CUptiResult cuptiActivityRegisterTimestampCallback(CUpti_TimestampCallbackFunc fn)
{
    if (monotonic_clock())
        return CUPTI_ERROR_NOT_SUPPORTED;
    timestamp_fn = fn;
    return CUPTI_SUCCESS;
}

SIM_API CUptiResult cuptiGetResultString(CUptiResult result, const char **text)
{
    *text = result == CUPTI_SUCCESS ? "CUPTI_SUCCESS (simulated)" : "CUPTI error (simulated)";
    return CUPTI_SUCCESS;
}

static const char *keep_name(const char *name)
{
    for (int i = 0; i < name_count; i++)
        if (strcmp(names[i], name) == 0)
            return names[i];
    if (name_count == (int)(sizeof(names) / sizeof(names[0])))
        return "simulated_kernel";
    names[name_count] = strdup(name);
    return names[name_count++];
}

/* Whether the kernels a launch submits now will be timed: the kind's state at submission, not when they run. */
static int submit(void)
{
    return atomic_load(&kernels_on);
}

/* Room for one record of `size` bytes in the current buffer (a fresh one asked for when there is none), or NULL
 * when the tool gave no buffer: the record is dropped and counted. Called with mu held. */
static void *record_room(size_t size)
{
    if (buffer == NULL) {
        /* asked with mu held: two launching threads must not each install a buffer (the tool's request callback
         * calls nothing of this library) */
        uint8_t *fresh = NULL;
        size_t fresh_size = 0, max_records = 0;
        buffer_requested(&fresh, &fresh_size, &max_records);
        if (fresh == NULL || fresh_size < sizeof(CUpti_ActivityKernel9)) {
            dropped++;
            records_dropped_total++;
            return NULL;
        }
        buffer = fresh;
        buffer_size = fresh_size;
    }
    if (buffer_used + size > buffer_size) {
        retire();
        return record_room(size);
    }
    void *room = buffer + buffer_used;
    memset(room, 0, size);
    buffer_used += size;
    buffer_records++;
    records_generated++;
    return room;
}

/* A full buffer (no room for the largest record) goes to the pending list. Called with mu held. */
static void maybe_retire(void)
{
    if (buffer != NULL && buffer_used + sizeof(CUpti_ActivityKernel9) > buffer_size)
        retire();
}

static void write_record(const struct sim_record *r, uint32_t correlation_id, uint64_t start, uint64_t end,
                         uint32_t stream)
{
    void *room = record_room(simcupti_record_size(r->kind));
    if (room == NULL)
        return;
    generated_ns += end - start;
    const char *name = r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL ? keep_name(r->name) : NULL;
    simcupti_fill_record(room, r, name, correlation_id, start, end, stream);
    maybe_retire();
}

static void kernel_record(uint32_t correlation_id, const char *name, uint64_t start, uint64_t end, uint32_t stream)
{
    struct sim_record r = {.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, .name = name};
    pthread_mutex_lock(&mu);
    write_record(&r, correlation_id, start, end, stream);
    pthread_mutex_unlock(&mu);
}

static void callback(CUpti_CallbackDomain domain, CUpti_CallbackId cbid, CUpti_ApiCallbackSite site,
                     const char *api, uint32_t correlation_id, int *result)
{
    CUpti_CallbackFunc fn = subscriber_fn;
    if (!subscribed || fn == NULL || !enabled[domain == CUPTI_CB_DOMAIN_DRIVER_API][cbid])
        return;
    CUpti_CallbackData data;
    memset(&data, 0, sizeof(data));
    data.callbackSite = site;
    data.functionName = api;
    data.functionReturnValue = result;
    data.correlationId = correlation_id;
    fn(subscriber_data, domain, cbid, &data);
}

/* The time a launch API call spends between its enter and exit callbacks before it submits its work
 * (SIMULATED_CUPTI_API_NS, default 0): a real cudaLaunchKernel takes microseconds there, which is how long a launch
 * that enabled the kernel kind holds it for every other thread. */
static uint64_t api_ns;

__attribute__((constructor)) static void read_api_ns(void)
{
    const char *text = getenv("SIMULATED_CUPTI_API_NS");
    api_ns = text != NULL ? strtoull(text, NULL, 10) : 0;
}

/* Busy for `ns`, as CPU work is: a sleep would give the core to the other threads. */
void simcupti_spin(uint64_t ns)
{
    if (ns == 0)
        return;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t until = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + ns;
    do
        clock_gettime(CLOCK_MONOTONIC, &ts);
    while ((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec < until);
}

/* One launch API call on the calling thread, then the `kernels` kernel records of `duration_ns` each that it
 * produced (a graph launch makes several), each only if the kernel kind was enabled when the call submitted them;
 * with `nested_driver` the call also makes a driver cuLaunchKernel call, as a runtime may, and that one submits;
 * `fail` makes the call return an error (no kernel). Returns the call's correlation id. */
SIM_API uint32_t simcupti_launch(uint32_t driver, uint32_t cbid, const char *api, const char *kernel, uint32_t kernels,
                                 uint64_t duration_ns, uint32_t stream, int nested_driver, int fail)
{
    CUpti_CallbackDomain domain = driver ? CUPTI_CB_DOMAIN_DRIVER_API : CUPTI_CB_DOMAIN_RUNTIME_API;
    uint32_t correlation_id = __atomic_add_fetch(&next_correlation_id, 1, __ATOMIC_SEQ_CST);
    int result = fail ? 1 : 0;
    int timed = 0;
    callback(domain, cbid, CUPTI_API_ENTER, api, correlation_id, &result);
    if (nested_driver) {
        uint32_t inner = __atomic_add_fetch(&next_correlation_id, 1, __ATOMIC_SEQ_CST);
        int inner_result = result;
        callback(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, CUPTI_API_ENTER, "cuLaunchKernel",
                 inner, &inner_result);
        simcupti_spin(api_ns);
        timed = submit();
        callback(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, CUPTI_API_EXIT, "cuLaunchKernel",
                 inner, &inner_result);
    } else {
        simcupti_spin(api_ns);
        timed = submit();
    }
    callback(domain, cbid, CUPTI_API_EXIT, api, correlation_id, &result);
    for (uint32_t i = 0; i < kernels && timed && !fail; i++) { /* the kernels run after the launch returns */
        uint64_t start = now_ns();
        kernel_record(correlation_id, kernel, start, start + duration_ns, stream);
    }
    return correlation_id;
}

uint32_t simcupti_next_correlation_id(void)
{
    return __atomic_add_fetch(&next_correlation_id, 1, __ATOMIC_SEQ_CST);
}

void simcupti_api_call(CUpti_CallbackDomain domain, uint32_t cbid, CUpti_ApiCallbackSite site, const char *api,
                       uint32_t correlation_id, int *result)
{
    callback(domain, cbid, site, api, correlation_id, result);
    if (site == CUPTI_API_ENTER)
        simcupti_spin(api_ns);
}

int simcupti_kind_on(CUpti_ActivityKind kind)
{
    _Atomic int *on = kind_switch(kind);
    return on != NULL && atomic_load(on);
}

uint64_t simcupti_now_ns(void)
{
    return now_ns();
}

/* `count` records of one call, back to back from *t, `duration_ns` each; *t ends after the last. */
void simcupti_write_records(const struct sim_record *records, uint32_t count, uint32_t correlation_id, uint64_t *t,
                            uint64_t duration_ns, uint32_t stream)
{
    pthread_mutex_lock(&mu);
    for (uint32_t i = 0; i < count; i++, *t += duration_ns)
        write_record(&records[i], correlation_id, *t, *t + duration_ns, stream);
    pthread_mutex_unlock(&mu);
}

/* What this double produced so far: out[0] records written into buffers, out[1] records dropped (no buffer),
 * out[2] records delivered to the tool, out[3] the sum of their durations (end - start) in ns, out[4]
 * cuptiActivityEnable/Disable calls of the memcpy, memset and memcpy2 kinds. */
SIM_API void simcupti_totals(uint64_t *out)
{
    pthread_mutex_lock(&mu);
    out[0] = records_generated;
    out[1] = records_dropped_total;
    out[2] = records_delivered;
    out[3] = generated_ns;
    pthread_mutex_unlock(&mu);
    out[4] = atomic_load(&other_calls);
}

/* 1 while the shim holds the subscriber, 2 while kernel records are on (both: 3); 4, 8 and 16 while memcpy, memset
 * and memcpy2 (peer-to-peer copy) records are on. */
SIM_API int simcupti_state(void)
{
    return (subscribed ? 1 : 0) | (atomic_load(&kernels_on) ? 2 : 0) | (atomic_load(&memcpy_on) ? 4 : 0) |
           (atomic_load(&memset_on) ? 8 : 0) | (atomic_load(&memcpy2_on) ? 16 : 0);
}

/* Kernel records delivered to the tool in completed buffers since the library was loaded (dropped ones are not). */
SIM_API uint64_t simcupti_records_delivered(void)
{
    pthread_mutex_lock(&mu);
    uint64_t delivered = records_delivered;
    pthread_mutex_unlock(&mu);
    return delivered;
}

/* cuptiActivityEnable (disable = 0) or cuptiActivityDisable (disable = 1) calls for the kernel kind so far. */
SIM_API uint64_t simcupti_activity_calls(int disable)
{
    return atomic_load(disable ? &disable_calls : &enable_calls);
}

