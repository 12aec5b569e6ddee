/* Self-check mode (FLEETPROF_CUPTI_RECORD=path): every launch callback and kernel record, also appended to a file
 * as JSON lines, so a GPU machine without bcc can compare the shim with torch.profiler (tests/gpu/validate.sh).
 *
 *   {"type":"start","pid":..,"cupti_library":"..","launch_rate":..}
 *   {"type":"on","clock":"..","clock_offset_ns":..,"clock_measured_offset_ns":..,"activity":"always"}
 *                                                     activity: kernel records always on, or "sampled" (activity.c)
 *   {"type":"launch","correlation_id":..,"callback_id":..,"domain":"runtime","api":"..","tid":..,"ts_ns":..,
 *    "weight":..,"nested":false,"kind":"kernel"}         weight 0: skipped by the rate limit (no probe fired)
 *                                                     kind: kernel, copy, set or graph (its rate limit: graph's)
 *    ,"nvtx_range":".."                                 a sampled launch inside NVTX ranges: launch_range's path
 *   {"type":"kernel","correlation_id":..,"start_ns":..,"end_ns":..,"device_id":..,"stream_id":..,"name":"..",
 *    "fired":true,"graph_id":..,"graph_node_id":..}     fired: kernel_executed (graph_kernel_executed when graph_id
 *                                                     is not 0) fired for it (unless no agent)
 *   {"type":"memory","correlation_id":..,"start_ns":..,"end_ns":..,"device_id":..,"stream_id":..,"bytes":..,
 *    "memory_kind":..,"fired":true,"graph_id":..,"graph_node_id":..}  a copy or set (memory_executed; memory_kind:
 *                                                     FLEETPROF_MEMORY_KIND of fleetprof_probes.h)
 *                                                     (sampled mode: only sampled launches' kernels, and skipped
 *                                                     ones submitted while another thread's sampled launch held)
 *   {"type":"summary", counters...}                     at exit
 *
 * Lines from many threads go through one mutex: this is a debugging mode, not the production path.
 */
#include "shim.h"

#include <pthread.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t record_mu = PTHREAD_MUTEX_INITIALIZER;
static FILE *record_file;

/* A fork copies the stdio buffer: empty it first, or the child's exit would write the parent's lines again. */
static void before_fork(void)
{
    pthread_mutex_lock(&record_mu);
    if (record_file != NULL)
        fflush(record_file);
}

static void after_fork(void)
{
    pthread_mutex_unlock(&record_mu);
}

int shim_record_open(const char *path)
{
    record_file = fopen(path, "a");
    if (record_file == NULL)
        return -1;
    setvbuf(record_file, NULL, _IOFBF, 1 << 16);
    pthread_atfork(before_fork, after_fork, after_fork);
    return 0;
}

int shim_recording(void)
{
    return record_file != NULL;
}

static uint64_t realtime_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A JSON string: quotes, backslashes and control characters escaped, other bytes as they are. */
static void put_string(const char *text)
{
    fputc('"', record_file);
    for (const unsigned char *c = (const unsigned char *)(text ? text : ""); *c; c++) {
        if (*c == '"' || *c == '\\')
            fprintf(record_file, "\\%c", *c);
        else if (*c < 0x20)
            fprintf(record_file, "\\u%04x", *c);
        else
            fputc(*c, record_file);
    }
    fputc('"', record_file);
}

void shim_record_start(const char *cupti_library)
{
    if (record_file == NULL)
        return;
    pthread_mutex_lock(&record_mu);
    fprintf(record_file, "{\"type\":\"start\",\"pid\":%d,\"cupti_library\":", (int)getpid());
    put_string(cupti_library);
    fprintf(record_file, ",\"launch_rate\":%u,\"buffers\":%u,\"buffer_bytes\":%zu}\n", shim_settings.launch_rate,
            shim_settings.buffers, shim_settings.buffer_bytes);
    pthread_mutex_unlock(&record_mu);
}

void shim_record_on(void)
{
    if (record_file == NULL)
        return;
    pthread_mutex_lock(&record_mu);
    fputs("{\"type\":\"on\",\"clock\":", record_file);
    put_string(shim_clock_source());
    fprintf(record_file, ",\"clock_offset_ns\":%lld,\"clock_measured_offset_ns\":%lld,\"activity\":\"%s\","
            "\"ts_ns\":%llu}\n", (long long)shim_clock_offset_ns(), (long long)shim_clock_measured_offset_ns(),
            shim_activity_per_launch() ? "sampled" : "always", (unsigned long long)realtime_ns());
    pthread_mutex_unlock(&record_mu);
}

void shim_record_note(const char *what, const char *detail)
{
    if (record_file == NULL)
        return;
    pthread_mutex_lock(&record_mu);
    fputs("{\"type\":", record_file);
    put_string(what);
    fputs(",\"detail\":", record_file);
    put_string(detail);
    fprintf(record_file, ",\"ts_ns\":%llu}\n", (unsigned long long)realtime_ns());
    pthread_mutex_unlock(&record_mu);
}

static const char *const kind_names[] = {"none", "kernel", "copy", "set", "graph"};

void shim_record_launch(uint32_t correlation_id, int32_t callback_id, const char *domain, const char *api,
                        uint32_t weight, int nested, enum shim_api_kind kind, const char *range_path)
{
    uint64_t now = realtime_ns();
    long tid = syscall(SYS_gettid);
    pthread_mutex_lock(&record_mu);
    if (record_file == NULL) { /* closed at exit while this thread was still launching */
        pthread_mutex_unlock(&record_mu);
        return;
    }
    fprintf(record_file, "{\"type\":\"launch\",\"correlation_id\":%u,\"callback_id\":%d,\"domain\":\"%s\",\"api\":",
            correlation_id, callback_id, domain);
    put_string(api);
    fprintf(record_file, ",\"tid\":%ld,\"ts_ns\":%llu,\"weight\":%u,\"nested\":%s,\"kind\":\"%s\"", tid,
            (unsigned long long)now, weight, nested ? "true" : "false", kind_names[kind <= SHIM_API_GRAPH ? kind : 0]);
    if (range_path != NULL) {
        fputs(",\"nvtx_range\":", record_file);
        put_string(range_path);
    }
    fputs("}\n", record_file);
    pthread_mutex_unlock(&record_mu);
}

void shim_record_kernel(uint64_t start_ns, uint64_t end_ns, uint32_t correlation_id, uint32_t device_id,
                        uint32_t stream_id, const char *name, int fired, uint32_t graph_id, uint64_t graph_node_id)
{
    pthread_mutex_lock(&record_mu);
    if (record_file == NULL) {
        pthread_mutex_unlock(&record_mu);
        return;
    }
    fprintf(record_file,
            "{\"type\":\"kernel\",\"correlation_id\":%u,\"start_ns\":%llu,\"end_ns\":%llu,\"device_id\":%u,"
            "\"stream_id\":%u,\"name\":",
            correlation_id, (unsigned long long)start_ns, (unsigned long long)end_ns, device_id, stream_id);
    put_string(name);
    fprintf(record_file, ",\"fired\":%s,\"graph_id\":%u,\"graph_node_id\":%llu}\n", fired ? "true" : "false",
            graph_id, (unsigned long long)graph_node_id);
    pthread_mutex_unlock(&record_mu);
}

void shim_record_memory(uint64_t start_ns, uint64_t end_ns, uint32_t correlation_id, uint32_t device_id,
                        uint32_t stream_id, uint64_t bytes, uint32_t memory_kind, int fired, uint32_t graph_id,
                        uint64_t graph_node_id)
{
    pthread_mutex_lock(&record_mu);
    if (record_file != NULL)
        fprintf(record_file,
                "{\"type\":\"memory\",\"correlation_id\":%u,\"start_ns\":%llu,\"end_ns\":%llu,\"device_id\":%u,"
                "\"stream_id\":%u,\"bytes\":%llu,\"memory_kind\":%u,\"fired\":%s,\"graph_id\":%u,"
                "\"graph_node_id\":%llu}\n",
                correlation_id, (unsigned long long)start_ns, (unsigned long long)end_ns, device_id, stream_id,
                (unsigned long long)bytes, memory_kind, fired ? "true" : "false", graph_id,
                (unsigned long long)graph_node_id);
    pthread_mutex_unlock(&record_mu);
}

void shim_record_flush(void)
{
    if (record_file == NULL)
        return;
    pthread_mutex_lock(&record_mu);
    fflush(record_file);
    pthread_mutex_unlock(&record_mu);
}

#define COUNTER(name) (unsigned long long)atomic_load(&shim_counters.name)

void shim_record_close(void)
{
    if (record_file == NULL)
        return;
    pthread_mutex_lock(&record_mu);
    fprintf(record_file,
            "{\"type\":\"summary\",\"launches\":%llu,\"launches_sampled\":%llu,\"launches_nested\":%llu,"
            "\"launches_failed\":%llu,\"kernels\":%llu,\"kernels_skipped\":%llu,\"kernels_unseen\":%llu,"
            "\"kernels_incomplete\":%llu,\"records_dropped\":%llu,\"buffers_refused\":%llu,"
            "\"activity_enables\":%llu,\"activity_refused\":%llu,",
            COUNTER(launches), COUNTER(launches_sampled), COUNTER(launches_nested), COUNTER(launches_failed),
            COUNTER(kernels), COUNTER(kernels_skipped), COUNTER(kernels_unseen), COUNTER(kernels_incomplete),
            COUNTER(records_dropped), COUNTER(buffers_refused), COUNTER(activity_enables), COUNTER(activity_refused));
    fprintf(record_file,
            "\"copies\":%llu,\"sets\":%llu,\"memory_skipped\":%llu,\"memory_unseen\":%llu,\"memory_incomplete\":%llu,"
            "\"graph_kernels\":%llu,\"graph_launches\":%llu,\"graph_launches_sampled\":%llu,"
            "\"records_implausible\":%llu,\"gpu_ns\":%llu,\"launch_ranges\":%llu,\"nvtx_messages_cut\":%llu,"
            "\"nvtx_paths_cut\":%llu,\"nvtx_too_deep\":%llu,\"nvtx_pops_unmatched\":%llu,"
            "\"nvtx_starts_refused\":%llu}\n",
            COUNTER(copies), COUNTER(sets), COUNTER(memory_skipped), COUNTER(memory_unseen),
            COUNTER(memory_incomplete), COUNTER(graph_kernels), COUNTER(graph_launches),
            COUNTER(graph_launches_sampled), COUNTER(records_implausible), COUNTER(gpu_ns), COUNTER(launch_ranges),
            COUNTER(nvtx_messages_cut), COUNTER(nvtx_paths_cut), COUNTER(nvtx_too_deep), COUNTER(nvtx_pops_unmatched),
            COUNTER(nvtx_starts_refused));
    fclose(record_file);
    record_file = NULL;
    pthread_mutex_unlock(&record_mu);
}
