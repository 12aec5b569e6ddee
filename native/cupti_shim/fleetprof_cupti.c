/* libfleetprof_cupti.so: loaded into a CUDA process by the driver (CUDA_INJECTION64_PATH), it turns CUPTI's kernel,
 * graph, copy and set launch callbacks and their activity records into fleetprof's USDT probes
 * (native/include/fleetprof_probes.h): launches.c and activity.c for kernels and CUDA graphs, memory.c for copies
 * and sets. It is also an NVTX injection library (NVTX_INJECTION64_PATH, nvtx.c): the NVTX range path of the
 * launching thread goes with each sampled launch.
 *
 * Settings: FLEETPROF_LAUNCH_RATE (sampled kernel, copy and set launches per second per thread, default 1000, 0:
 * all), FLEETPROF_GRAPH_LAUNCH_RATE (sampled CUDA graph launches per second per thread, a rate limit of their own,
 * default 100, 0: all), FLEETPROF_CUPTI_ACTIVITY, FLEETPROF_CUPTI_BUFFERS, FLEETPROF_CUPTI_BUFFER_KB,
 * FLEETPROF_CUPTI_POLL_MS, FLEETPROF_CUPTI_FLUSH_MS, FLEETPROF_CUPTI_RECORD, FLEETPROF_CUPTI_LIBRARY.
 *
 * Cost with no agent attached: InitializeInjection only opens libcupti and starts one watcher thread. CUPTI itself
 * stays off: no subscriber, no callbacks, no activity kind. The watcher reads the probes' semaphores every
 * FLEETPROF_CUPTI_POLL_MS (100 ms); the kernel raises them when an agent attaches a uprobe, and only then does the
 * watcher subscribe to the launch callbacks and set up CONCURRENT_KERNEL records, and it turns both off again when
 * the agent goes. The price is up to one poll interval of launches missed after an attach. While attached, kernel
 * records are by default on only around the launches the rate limit samples (FLEETPROF_CUPTI_ACTIVITY=sampled; why
 * and how in activity.c), so CUPTI's work follows the sampling rate, not the launch rate. Per-call semaphore checks
 * alone would not do: an enabled callback or activity kind costs the application even when nothing reads it, and a
 * subscriber held while idle would lock other profilers (torch.profiler, Nsight) out of CUPTI.
 *
 * FLEETPROF_CUPTI_RECORD=path (self-check mode) keeps CUPTI on from the start and also appends every launch and
 * kernel record to that file as JSON lines, for machines without bcc (tests/gpu/validate.sh); kernel records are then
 * on all the time (every kernel, to compare with torch.profiler) unless FLEETPROF_CUPTI_ACTIVITY says otherwise.
 */
#define FLEETPROF_DEFINE_PROBE_SEMAPHORES
#include "fleetprof_probes.h"
#include "fleetprof_ratelimit.h"
#include "shim.h"

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SHIM_EXPORT __attribute__((visibility("default")))

struct cupti_api shim_cupti;
struct shim_settings shim_settings;
struct shim_counters shim_counters;

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t state_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t state_cv = PTHREAD_COND_INITIALIZER;
static pthread_t watcher;
static int watcher_started;
static int stopping;
static int cupti_on;      /* callbacks (if subscribed) and kernel records are on */
static int ever_on;
static int pool_ready;
static CUpti_SubscriberHandle subscriber;
static int subscribed;
static int warned_subscribe;
static int gave_up;       /* CUPTI refused to start: said once, not retried every poll */
static pid_t owner_pid;   /* a forked child has no watcher thread and must not join or flush the parent's */

void shim_warn(const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    fputs("fleetprof: ", stderr);
    vfprintf(stderr, fmt, args);
    fputc('\n', stderr);
    va_end(args);
}

const char *shim_result_string(CUptiResult result)
{
    const char *text = NULL;
    if (shim_cupti.get_result_string != NULL && shim_cupti.get_result_string(result, &text) == CUPTI_SUCCESS && text)
        return text;
    return "CUPTI error";
}

static uint32_t env_u32(const char *name, uint32_t fallback, uint32_t low, uint32_t high)
{
    const char *text = getenv(name);
    if (text == NULL || *text == '\0')
        return fallback;
    char *end = NULL;
    unsigned long long value = strtoull(text, &end, 10);
    if (*end != '\0' || value < low || value > high) {
        shim_warn("%s=%s is not a number in [%u, %u]; using %u", name, text, low, high, fallback);
        return fallback;
    }
    return (uint32_t)value;
}

/* FLEETPROF_CUPTI_ACTIVITY: 1 sampled, 0 always. Unset: sampled, but always with the self-check file. */
static int activity_sampled_from_env(void)
{
    int fallback = !shim_recording();
    const char *text = getenv("FLEETPROF_CUPTI_ACTIVITY");
    if (text == NULL || *text == '\0')
        return fallback;
    if (strcmp(text, "sampled") == 0 || strcmp(text, "always") == 0)
        return text[0] == 's';
    shim_warn("FLEETPROF_CUPTI_ACTIVITY=%s is neither sampled nor always; using %s", text,
              fallback ? "sampled" : "always");
    return fallback;
}

static void read_settings(void)
{
    shim_settings.launch_rate = fleetprof_launch_rate_from_env();
    shim_settings.graph_launch_rate = env_u32(SHIM_GRAPH_LAUNCH_RATE_ENV, SHIM_GRAPH_LAUNCH_RATE_DEFAULT, 0,
                                              UINT32_MAX);
    shim_settings.buffers = env_u32("FLEETPROF_CUPTI_BUFFERS", 16, 2, 1024);
    shim_settings.buffer_bytes = (size_t)env_u32("FLEETPROF_CUPTI_BUFFER_KB", 1024, 64, 65536) * 1024;
    shim_settings.poll_ms = env_u32("FLEETPROF_CUPTI_POLL_MS", 100, 1, 10000);
    shim_settings.flush_ms = env_u32("FLEETPROF_CUPTI_FLUSH_MS", 250, 10, 60000);
    shim_settings.activity_sampled = activity_sampled_from_env(); /* after the record file is opened */
}

/* ---- loading libcupti ---- */

#define RESOLVE(handle, field, symbol, required)                                               \
    do {                                                                                       \
        shim_cupti.field = (__typeof__(shim_cupti.field))dlsym(handle, #symbol);               \
        if (shim_cupti.field == NULL && (required) && missing == NULL)                         \
            missing = #symbol;                                                                 \
    } while (0)

static const char *resolve(void *handle)
{
    const char *missing = NULL;
    RESOLVE(handle, subscribe, cuptiSubscribe, 1);
    RESOLVE(handle, unsubscribe, cuptiUnsubscribe, 1);
    RESOLVE(handle, enable_callback, cuptiEnableCallback, 1);
    RESOLVE(handle, activity_register_callbacks, cuptiActivityRegisterCallbacks, 1);
    RESOLVE(handle, activity_enable, cuptiActivityEnable, 1);
    RESOLVE(handle, activity_disable, cuptiActivityDisable, 1);
    RESOLVE(handle, activity_get_next_record, cuptiActivityGetNextRecord, 1);
    RESOLVE(handle, activity_get_num_dropped_records, cuptiActivityGetNumDroppedRecords, 1);
    RESOLVE(handle, activity_flush_all, cuptiActivityFlushAll, 1);
    RESOLVE(handle, get_timestamp, cuptiGetTimestamp, 1);
    RESOLVE(handle, activity_register_timestamp_callback, cuptiActivityRegisterTimestampCallback, 0);
    RESOLVE(handle, get_result_string, cuptiGetResultString, 0);
    return missing;
}

/* The libcupti this process already has (torch preloads its own) comes first, so there is never a second copy; then
 * FLEETPROF_CUPTI_LIBRARY, then the usual names on the loader's path. */
static void *open_cupti(char *tried, size_t tried_size)
{
    static const char *const names[] = {"libcupti.so", "libcupti.so.13", "libcupti.so.12"};
    const size_t count = sizeof(names) / sizeof(names[0]);
    const char *chosen = getenv("FLEETPROF_CUPTI_LIBRARY");
    void *handle = NULL;
    for (size_t i = 0; i < count && handle == NULL; i++)
        handle = dlopen(names[i], RTLD_NOW | RTLD_NOLOAD);
    if (handle == NULL && chosen != NULL && *chosen != '\0')
        handle = dlopen(chosen, RTLD_NOW);
    for (size_t i = 0; i < count && handle == NULL; i++)
        handle = dlopen(names[i], RTLD_NOW);
    snprintf(tried, tried_size, "%s%s%s, %s, %s", chosen && *chosen ? chosen : "", chosen && *chosen ? ", " : "",
             names[0], names[1], names[2]);
    return handle;
}

/* ---- turning CUPTI on and off ---- */

static int agent_attached(void)
{
    return fleetprof_kernel_launch_semaphore != 0 || fleetprof_kernel_executed_semaphore != 0 ||
           fleetprof_launch_weight_semaphore != 0 || fleetprof_graph_kernel_executed_semaphore != 0 ||
           fleetprof_memory_executed_semaphore != 0;
}

static void turn_on(void)
{
    if (!pool_ready) {
        if (shim_activity_init() != 0) {
            shim_warn("cannot allocate %u CUPTI activity buffers of %zu KiB: lower FLEETPROF_CUPTI_BUFFERS",
                      shim_settings.buffers, shim_settings.buffer_bytes / 1024);
            gave_up = 1;
            return;
        }
        pool_ready = 1;
    }
    CUptiResult result = shim_cupti.subscribe(&subscriber, shim_on_api, NULL);
    subscribed = result == CUPTI_SUCCESS;
    if (!subscribed && !warned_subscribe) {
        warned_subscribe = 1;
        shim_warn("cannot subscribe to CUPTI callbacks (%s): another profiler holds CUPTI's one subscriber; "
                  "every kernel is still timed, their launches are not seen", shim_result_string(result));
        shim_record_note("subscribe_failed", shim_result_string(result));
    }
    /* per launch only where launches are seen and not all of them are sampled */
    int per_launch = subscribed && shim_settings.activity_sampled && shim_settings.launch_rate != 0;
    if (shim_activity_start(per_launch) != 0) {
        if (subscribed)
            shim_cupti.unsubscribe(subscriber);
        subscribed = 0;
        gave_up = 1;
        return;
    }
    if (subscribed)
        shim_enable_launch_callbacks(subscriber, 1);
    cupti_on = 1;
    ever_on = 1;
    shim_nvtx_on(1);
    shim_record_on();
}

static void turn_off(void)
{
    if (subscribed)
        shim_enable_launch_callbacks(subscriber, 0); /* first: no launch takes a hold on records any more */
    shim_activity_stop();
    if (subscribed) {
        shim_cupti.unsubscribe(subscriber);
        subscribed = 0;
    }
    cupti_on = 0;
    shim_nvtx_on(0);
    shim_record_note("off", "");
}

static uint64_t monotonic_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void *watch(void *unused)
{
    (void)unused;
    uint64_t last_flush = monotonic_ms();
    pthread_mutex_lock(&state_mu);
    while (!stopping) {
        int want = shim_recording() || agent_attached();
        if (want && !cupti_on && !gave_up)
            turn_on();
        else if (!want && cupti_on)
            turn_off();
        if (cupti_on && monotonic_ms() - last_flush >= shim_settings.flush_ms) {
            /* completed records reach the probes within a flush period even when the buffers are not full */
            shim_cupti.activity_flush_all(0);
            shim_record_flush();
            last_flush = monotonic_ms();
        }
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        uint64_t ns = (uint64_t)until.tv_nsec + (uint64_t)shim_settings.poll_ms * 1000000u;
        until.tv_sec += (time_t)(ns / 1000000000u);
        until.tv_nsec = (long)(ns % 1000000000u);
        pthread_cond_timedwait(&state_cv, &state_mu, &until);
    }
    pthread_mutex_unlock(&state_mu);
    return NULL;
}

static void warn_losses(void)
{
    uint64_t refused = atomic_load(&shim_counters.activity_refused);
    if (refused)
        shim_warn("CUPTI refused to turn kernel records on for %llu sampled launches, whose kernels went untimed: "
                  "set FLEETPROF_CUPTI_ACTIVITY=always", (unsigned long long)refused);
    uint64_t dropped = atomic_load(&shim_counters.records_dropped);
    uint64_t empty = atomic_load(&shim_counters.buffers_refused);
    if (dropped || empty)
        shim_warn("CUPTI dropped %llu kernel records (%llu buffer requests found the pool empty): raise "
                  "FLEETPROF_CUPTI_BUFFERS (now %u) or FLEETPROF_CUPTI_BUFFER_KB (now %zu)",
                  (unsigned long long)dropped, (unsigned long long)empty, shim_settings.buffers,
                  shim_settings.buffer_bytes / 1024);
}

static void at_exit(void)
{
    if (getpid() != owner_pid)
        return;
    pthread_mutex_lock(&state_mu);
    stopping = 1;
    pthread_cond_broadcast(&state_cv);
    pthread_mutex_unlock(&state_mu);
    if (watcher_started)
        pthread_join(watcher, NULL);
    if (cupti_on)
        shim_cupti.activity_flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED); /* what is still buffered, at the end */
    if (ever_on)
        warn_losses();
    shim_record_close();
}

static void start_watcher(void)
{
    /* the watcher must not take the application's signals */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    watcher_started = pthread_create(&watcher, NULL, watch, NULL) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (watcher_started)
        pthread_setname_np(watcher, "fleetprof-cupti");
    else
        shim_warn("cannot start the watcher thread: an agent attaching later will not be seen");
}

static void initialize(void)
{
    const char *record = getenv("FLEETPROF_CUPTI_RECORD");
    if (record != NULL && *record != '\0' && shim_record_open(record) != 0)
        shim_warn("cannot open FLEETPROF_CUPTI_RECORD=%s for appending; self-check records are off", record);
    if (shim_recording())
        fleetprof_launch_range_semaphore++; /* the record file takes the NVTX range paths, as an agent would */
    read_settings();

    char tried[512];
    void *handle = open_cupti(tried, sizeof(tried));
    if (handle == NULL) {
        shim_warn("no libcupti found (tried %s): set FLEETPROF_CUPTI_LIBRARY to its path; GPU profiling is off",
                  tried);
        shim_record_note("no_cupti", tried);
        shim_record_close();
        return;
    }
    const char *missing = resolve(handle);
    if (missing != NULL) {
        shim_warn("libcupti lacks %s (too old?): GPU profiling is off", missing);
        shim_record_note("cupti_too_old", missing);
        shim_record_close();
        return;
    }
    Dl_info info;
    const char *path = dladdr((void *)shim_cupti.subscribe, &info) && info.dli_fname ? info.dli_fname : "libcupti";
    shim_record_start(path);

    owner_pid = getpid();
    pthread_mutex_lock(&state_mu);
    if (shim_recording())
        turn_on(); /* now, inside cuInit, so the first launch is already seen */
    pthread_mutex_unlock(&state_mu);
    start_watcher();
    atexit(at_exit);
}

/* Called by the CUDA driver during cuInit when CUDA_INJECTION64_PATH names this library. */
SHIM_EXPORT int InitializeInjection(void)
{
    pthread_once(&init_once, initialize);
    return 1;
}
