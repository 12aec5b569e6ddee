/* libfleetprof_gpusim.so: a simulated GPU for machines without one (labelled simulated wherever it shows).
 *
 * gpusim_launch assigns a correlation id, queues the kernel on the calling thread's device and, as it returns, fires
 * kernel_launch on the calling thread (after launch_weight when the rate limit made it stand for several), as the
 * CUPTI shim does from its API-exit callback; a kernel cannot start before that, as on a GPU, so kernel_executed
 * never comes before its kernel_launch. One thread per device runs the queue in order. The device keeps its own
 * timeline on CLOCK_REALTIME: a kernel starts when the device is free and the kernel has been launched, and spans
 * exactly its duration there; the thread paces that timeline against the real clock (sleep, then spin the last
 * stretch) and fires kernel_executed with the kernel's start and end. On a busy host the thread may be preempted
 * and finish late: the timeline then waits for it (the next kernel starts later) instead of stretching the kernel,
 * so recorded durations are exactly the requested ones, as a GPU's are whatever the CPU does.
 *
 * Copies and sets (gpusim_memcpy, gpusim_memset) queue and launch like kernels and fire memory_executed. A graph
 * launch (gpusim_graph_launch) queues all its graph's nodes under one correlation id, decided once by the graph rate
 * limit, and each node fires graph_kernel_executed or memory_executed with the graph and node ids. A sampled launch
 * made inside NVTX ranges (ranges.c) fires launch_range before kernel_launch.
 */
#define FLEETPROF_DEFINE_PROBE_SEMAPHORES
#include "fleetprof_probes.h"
#include "fleetprof_ratelimit.h"
#include "gpusim.h"
#include "gpusim_internal.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SPIN_NS 100000u /* sleep until this close to the end, then spin: sleeps overshoot by tens of µs */

struct queued {
    uint64_t duration_ns;
    uint64_t bytes;
    uint64_t graph_node_id;
    uint32_t correlation_id;
    uint32_t stream_id;
    uint32_t state;
    uint32_t weight;
    uint32_t activity;
    uint32_t memory_kind;
    uint32_t graph_id;
    uint32_t api;
    uint32_t in_range;
    int launched; /* its launch probe has fired: as on a GPU, no kernel runs before its launch returned */
    char name[GPUSIM_NAME_MAX];
    char range[GPUSIM_RANGE_MAX];
};



struct device {
    pthread_mutex_t mu;
    pthread_cond_t work;    /* signalled when a kernel is queued */
    pthread_cond_t drained; /* broadcast when a kernel completes */
    struct queued queue[GPUSIM_QUEUE_DEPTH];
    uint32_t head;
    uint32_t count;
    uint64_t submitted;
    uint64_t completed;
    pthread_t thread;
    _Atomic int started;
    uint32_t id;
    uint64_t free_at_ns; /* CLOCK_REALTIME end of the last kernel on this device's timeline (device thread only) */
};

static struct device devices[GPUSIM_MAX_DEVICES];
static pthread_once_t setup_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t start_mu = PTHREAD_MUTEX_INITIALIZER;
static uint32_t device_count = 1;
static uint32_t launch_rate;
static uint32_t graph_launch_rate;
static _Atomic uint32_t next_correlation_id = 1;

static struct {
    _Atomic uint64_t launches, launches_decided, launches_sampled, weight_sum, kernels_executed, kernels_fired,
        queue_dropped, log_dropped, names_truncated, copies_executed, copies_fired, graph_launches,
        graph_launches_decided, graph_launches_sampled, graph_weight_sum, graph_nodes_executed, graph_nodes_fired,
        ranges_fired, range_paths_cut;
} counters;

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static struct gpusim_executed *log_entries;
static uint32_t log_capacity;
static uint32_t log_count;

static __thread uint32_t thread_device;
static __thread fleetprof_ratelimit_t thread_rate;
static __thread fleetprof_ratelimit_t thread_graph_rate;
static __thread char thread_range[GPUSIM_RANGE_MAX];

static void setup(void)
{
    for (uint32_t i = 0; i < GPUSIM_MAX_DEVICES; i++) {
        pthread_mutex_init(&devices[i].mu, NULL);
        pthread_cond_init(&devices[i].work, NULL);
        pthread_cond_init(&devices[i].drained, NULL);
        devices[i].id = i;
    }
    const char *text = getenv("FLEETPROF_GPUSIM_DEVICES");
    if (text != NULL) {
        long n = strtol(text, NULL, 10);
        if (n >= 1 && n <= GPUSIM_MAX_DEVICES)
            device_count = (uint32_t)n;
    }
    launch_rate = fleetprof_launch_rate_from_env();
    graph_launch_rate = GPUSIM_GRAPH_LAUNCH_RATE_DEFAULT;
    text = getenv(GPUSIM_GRAPH_LAUNCH_RATE_ENV);
    if (text != NULL && *text != '\0') {
        char *end = NULL;
        unsigned long long value = strtoull(text, &end, 10);
        if (*end == '\0' && value <= UINT32_MAX)
            graph_launch_rate = (uint32_t)value;
    }
}

static uint64_t clock_ns(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_until(uint64_t monotonic_ns)
{
    struct timespec ts = {.tv_sec = (time_t)(monotonic_ns / 1000000000ull),
                          .tv_nsec = (long)(monotonic_ns % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

int gpusim_agent_attached(void)
{
    return fleetprof_kernel_launch_semaphore != 0 || fleetprof_kernel_executed_semaphore != 0 ||
           fleetprof_launch_weight_semaphore != 0 || fleetprof_launch_range_semaphore != 0 ||
           fleetprof_graph_kernel_executed_semaphore != 0 || fleetprof_memory_executed_semaphore != 0;
}

static void log_kernel(const struct queued *k, uint32_t device, uint64_t start_ns, uint64_t end_ns)
{
    pthread_mutex_lock(&log_mu);
    if (log_entries != NULL) {
        if (log_count == log_capacity) {
            atomic_fetch_add(&counters.log_dropped, 1);
        } else {
            struct gpusim_executed *e = &log_entries[log_count++];
            e->start_ns = start_ns;
            e->end_ns = end_ns;
            e->duration_ns = k->duration_ns;
            e->correlation_id = k->correlation_id;
            e->device_id = device;
            e->stream_id = k->stream_id;
            e->state = k->state;
            e->weight = k->weight;
            e->activity = k->activity;
            memcpy(e->name, k->name, sizeof(e->name));
            e->bytes = k->bytes;
            e->graph_node_id = k->graph_node_id;
            e->graph_id = k->graph_id;
            e->memory_kind = k->memory_kind;
            e->in_range = k->in_range;
            e->api = k->api;
            memcpy(e->range, k->range, sizeof(e->range));
        }
    }
    pthread_mutex_unlock(&log_mu);
}

/* Run one kernel: duration_ns on the device's timeline, paced against the real clock. */
static void execute(const struct queued *k, struct device *d)
{
    uint32_t device = d->id;
    uint64_t now_ns = clock_ns(CLOCK_REALTIME);
    uint64_t start_ns = d->free_at_ns > now_ns ? d->free_at_ns : now_ns;
    uint64_t end_ns = start_ns + k->duration_ns;
    d->free_at_ns = end_ns;
    uint64_t target = clock_ns(CLOCK_MONOTONIC) + (end_ns - now_ns);
    if (end_ns - now_ns > SPIN_NS)
        sleep_until(target - SPIN_NS);
    while (clock_ns(CLOCK_MONOTONIC) < target) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
    atomic_fetch_add(&counters.kernels_executed, 1);
    int memory = k->activity != GPUSIM_KERNEL;
    if (memory)
        atomic_fetch_add(&counters.copies_executed, 1);
    if (k->graph_id)
        atomic_fetch_add(&counters.graph_nodes_executed, 1);
    if (k->state != GPUSIM_SKIPPED) {
        int fired = memory ? FLEETPROF_ENABLED(memory_executed)
                           : k->graph_id ? FLEETPROF_ENABLED(graph_kernel_executed) : FLEETPROF_ENABLED(kernel_executed);
        if (fired) {
            atomic_fetch_add(&counters.kernels_fired, 1);
            if (memory)
                atomic_fetch_add(&counters.copies_fired, 1);
            if (k->graph_id)
                atomic_fetch_add(&counters.graph_nodes_fired, 1);
        }
        if (memory)
            FLEETPROF_MEMORY_EXECUTED(start_ns, end_ns, k->correlation_id, device, k->stream_id, k->bytes,
                                      k->memory_kind, k->graph_id, k->graph_node_id);
        else if (k->graph_id)
            FLEETPROF_GRAPH_KERNEL_EXECUTED(start_ns, end_ns, k->correlation_id, device, k->stream_id, k->name,
                                            k->graph_id, k->graph_node_id);
        else
            FLEETPROF_KERNEL_EXECUTED(start_ns, end_ns, k->correlation_id, device, k->stream_id, k->name);
    }
    log_kernel(k, device, start_ns, end_ns);
}

static void *device_main(void *arg)
{
    struct device *d = arg;
    struct queued k;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        while (d->count == 0 || !d->queue[d->head].launched)
            pthread_cond_wait(&d->work, &d->mu);
        k = d->queue[d->head];
        d->head = (d->head + 1) % GPUSIM_QUEUE_DEPTH;
        d->count--;
        pthread_mutex_unlock(&d->mu);
        execute(&k, d);
        pthread_mutex_lock(&d->mu);
        d->completed++;
        pthread_cond_broadcast(&d->drained);
    }
    return NULL;
}

static void start_device(struct device *d)
{
    pthread_mutex_lock(&start_mu);
    if (!d->started) {
        sigset_t all, old;
        sigfillset(&all); /* the device thread must not take the application's signals */
        pthread_sigmask(SIG_SETMASK, &all, &old);
        if (pthread_create(&d->thread, NULL, device_main, d) == 0) {
            char name[16];
            snprintf(name, sizeof(name), "gpusim-dev%u", d->id);
            pthread_setname_np(d->thread, name);
            pthread_detach(d->thread);
            d->started = 1;
        }
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    }
    pthread_mutex_unlock(&start_mu);
}

/* The rate limit applies while an agent is attached, as in the shim, whose callbacks are off otherwise. */
static uint32_t decide(uint32_t *state, int graph)
{
    if (!gpusim_agent_attached()) {
        *state = GPUSIM_UNSEEN;
        return 0;
    }
    fleetprof_ratelimit_t *rl = graph ? &thread_graph_rate : &thread_rate;
    uint64_t now = fleetprof_ratelimit_clock_ns();
    uint64_t seed = rl->rng ? 0 : ((uint64_t)syscall(SYS_gettid) << 32) ^ now ^ (uint64_t)graph; /* first call only */
    uint32_t weight = fleetprof_ratelimit_take(rl, graph ? graph_launch_rate : launch_rate, now, seed);
    atomic_fetch_add(graph ? &counters.graph_launches_decided : &counters.launches_decided, 1);
    *state = weight ? GPUSIM_SAMPLED : GPUSIM_SKIPPED;
    return weight;
}

static const char *const api_names[] = {GPUSIM_API_NAME, GPUSIM_MEMCPY_API_NAME, GPUSIM_MEMSET_API_NAME,
                                        GPUSIM_GRAPH_API_NAME};
static const int32_t api_callbacks[] = {GPUSIM_CALLBACK_ID, GPUSIM_MEMCPY_CALLBACK_ID, GPUSIM_MEMSET_CALLBACK_ID,
                                        GPUSIM_GRAPH_CALLBACK_ID};

/* noinline: launch stacks show it under the API function that called it, whichever the compiler */
__attribute__((noinline)) uint32_t gpusim_submit(const struct gpusim_work *w, uint32_t n, uint32_t stream, uint32_t api)
{
    pthread_once(&setup_once, setup);
    struct device *d = &devices[thread_device];
    if (!d->started)
        start_device(d);
    int graph = api == GPUSIM_API_GRAPH;
    int cut = 0;
    uint32_t in_range = (uint32_t)gpusim_range_path(thread_range, &cut);
    pthread_mutex_lock(&d->mu);
    if (n == 0 || n > GPUSIM_QUEUE_DEPTH - d->count) {
        pthread_mutex_unlock(&d->mu);
        atomic_fetch_add(&counters.queue_dropped, 1);
        return 0;
    }
    uint32_t correlation_id = atomic_fetch_add(&next_correlation_id, 1);
    uint32_t state;
    uint32_t weight = decide(&state, graph);
    uint32_t first = (d->head + d->count) % GPUSIM_QUEUE_DEPTH;
    for (uint32_t i = 0; i < n; i++) {
        struct queued *k = &d->queue[(first + i) % GPUSIM_QUEUE_DEPTH];
        k->duration_ns = w[i].duration_ns;
        k->bytes = w[i].bytes;
        k->graph_node_id = w[i].graph_node_id;
        k->correlation_id = correlation_id;
        k->stream_id = stream;
        k->state = state;
        k->weight = weight;
        k->activity = w[i].activity;
        k->memory_kind = w[i].memory_kind;
        k->graph_id = w[i].graph_id;
        k->api = api;
        k->in_range = in_range;
        if (in_range)
            memcpy(k->range, thread_range, sizeof(k->range));
        else
            k->range[0] = '\0';
        const char *name = w[i].name ? w[i].name : "";
        size_t length = strlen(name);
        if (length >= GPUSIM_NAME_MAX) {
            length = GPUSIM_NAME_MAX - 1;
            atomic_fetch_add(&counters.names_truncated, 1);
        }
        memcpy(k->name, name, length);
        k->name[length] = '\0';
        k->launched = 0;
    }
    d->count += n;
    d->submitted += n;
    pthread_mutex_unlock(&d->mu);

    atomic_fetch_add(graph ? &counters.graph_launches : &counters.launches, 1);
    if (weight) {
        atomic_fetch_add(graph ? &counters.graph_launches_sampled : &counters.launches_sampled, 1);
        atomic_fetch_add(graph ? &counters.graph_weight_sum : &counters.weight_sum, weight);
        if (weight > 1)
            FLEETPROF_LAUNCH_WEIGHT(correlation_id, weight);
        if (in_range && FLEETPROF_ENABLED(launch_range)) {
            atomic_fetch_add(&counters.ranges_fired, 1);
            if (cut)
                atomic_fetch_add(&counters.range_paths_cut, 1);
            FLEETPROF_LAUNCH_RANGE(correlation_id, thread_range);
        }
        FLEETPROF_KERNEL_LAUNCH(correlation_id, api_callbacks[api], api_names[api]);
    }
    pthread_mutex_lock(&d->mu);
    for (uint32_t i = 0; i < n; i++) /* the slots stay ours until the device takes them, which it cannot before */
        d->queue[(first + i) % GPUSIM_QUEUE_DEPTH].launched = 1;
    pthread_cond_signal(&d->work);
    pthread_mutex_unlock(&d->mu);
    return correlation_id;
}

GPUSIM_API uint32_t gpusim_launch(const char *kernel_name, uint64_t duration_ns, uint32_t stream)
{
    struct gpusim_work w = {.name = kernel_name, .duration_ns = duration_ns, .activity = GPUSIM_KERNEL};
    return gpusim_submit(&w, 1, stream, GPUSIM_API_KERNEL);
}

GPUSIM_API uint32_t gpusim_graph_launch_rate(void)
{
    pthread_once(&setup_once, setup);
    return graph_launch_rate;
}

GPUSIM_API void gpusim_synchronize(void)
{
    pthread_once(&setup_once, setup);
    for (uint32_t i = 0; i < device_count; i++) {
        struct device *d = &devices[i];
        pthread_mutex_lock(&d->mu);
        uint64_t until = d->submitted;
        while (d->completed < until)
            pthread_cond_wait(&d->drained, &d->mu);
        pthread_mutex_unlock(&d->mu);
    }
}

GPUSIM_API int gpusim_set_device(uint32_t device)
{
    pthread_once(&setup_once, setup);
    if (device >= device_count)
        return -1;
    thread_device = device;
    return 0;
}

GPUSIM_API uint32_t gpusim_device_count(void)
{
    pthread_once(&setup_once, setup);
    return device_count;
}

GPUSIM_API uint32_t gpusim_launch_rate(void)
{
    pthread_once(&setup_once, setup);
    return launch_rate;
}

GPUSIM_API uint32_t gpusim_attached(void)
{
    uint32_t launch = fleetprof_kernel_launch_semaphore != 0;
    uint32_t executed = fleetprof_kernel_executed_semaphore != 0;
    uint32_t weight = fleetprof_launch_weight_semaphore != 0;
    uint32_t range = fleetprof_launch_range_semaphore != 0;
    uint32_t graph = fleetprof_graph_kernel_executed_semaphore != 0;
    uint32_t memory = fleetprof_memory_executed_semaphore != 0;
    return launch | (executed << 1) | (weight << 2) | (range << 3) | (graph << 4) | (memory << 5);
}

GPUSIM_API void gpusim_stats(struct gpusim_stats *out)
{
    out->launches = atomic_load(&counters.launches);
    out->launches_decided = atomic_load(&counters.launches_decided);
    out->launches_sampled = atomic_load(&counters.launches_sampled);
    out->weight_sum = atomic_load(&counters.weight_sum);
    out->kernels_executed = atomic_load(&counters.kernels_executed);
    out->kernels_fired = atomic_load(&counters.kernels_fired);
    out->queue_dropped = atomic_load(&counters.queue_dropped);
    out->log_dropped = atomic_load(&counters.log_dropped);
    out->names_truncated = atomic_load(&counters.names_truncated);
    out->copies_executed = atomic_load(&counters.copies_executed);
    out->copies_fired = atomic_load(&counters.copies_fired);
    out->graph_launches = atomic_load(&counters.graph_launches);
    out->graph_launches_decided = atomic_load(&counters.graph_launches_decided);
    out->graph_launches_sampled = atomic_load(&counters.graph_launches_sampled);
    out->graph_weight_sum = atomic_load(&counters.graph_weight_sum);
    out->graph_nodes_executed = atomic_load(&counters.graph_nodes_executed);
    out->graph_nodes_fired = atomic_load(&counters.graph_nodes_fired);
    out->ranges_fired = atomic_load(&counters.ranges_fired);
    out->range_paths_cut = atomic_load(&counters.range_paths_cut);
    out->ranges_too_deep = atomic_load(&gpusim_range_counters.too_deep);
    out->range_pops_unmatched = atomic_load(&gpusim_range_counters.pops_unmatched);
}

GPUSIM_API uint32_t gpusim_sizeof(uint32_t which)
{
    switch (which) {
    case 0:
        return sizeof(struct gpusim_executed);
    case 1:
        return sizeof(struct gpusim_stats);
    case 2:
        return sizeof(struct gpusim_kernel_spec);
    case 3:
        return sizeof(struct gpusim_graph_node);
    default:
        return 0;
    }
}

GPUSIM_API int gpusim_log_start(uint32_t capacity)
{
    pthread_mutex_lock(&log_mu);
    free(log_entries);
    log_entries = capacity ? calloc(capacity, sizeof(*log_entries)) : NULL;
    log_capacity = log_entries ? capacity : 0;
    log_count = 0;
    pthread_mutex_unlock(&log_mu);
    return capacity == 0 || log_entries != NULL ? 0 : -1;
}

GPUSIM_API uint32_t gpusim_log_drain(struct gpusim_executed *out, uint32_t max)
{
    pthread_mutex_lock(&log_mu);
    uint32_t n = log_count < max ? log_count : max;
    if (n == 0) {
        pthread_mutex_unlock(&log_mu);
        return 0;
    }
    memcpy(out, log_entries, (size_t)n * sizeof(*out));
    memmove(log_entries, log_entries + n, (size_t)(log_count - n) * sizeof(*out));
    log_count -= n;
    pthread_mutex_unlock(&log_mu);
    return n;
}
