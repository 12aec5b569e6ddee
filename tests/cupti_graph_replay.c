/* The long CUDA graph replay of tests/test_cupti_shim_graphs.py, in C so 25M records take seconds: loads the
 * simulated libcupti and the CUPTI shim as the CUDA driver would, raises the shim's kernel_launch semaphore as the
 * kernel does when an agent attaches, replays graphs, and prints what both sides counted and the process's memory.
 *
 *   cupti_graph_replay SIMULATED_CUPTI SHIM SEMAPHORE_OFFSET COUNTERS_OFFSET COUNTERS LAUNCHES NODES FLUSH_EVERY
 *                      [COPIES]
 * FLUSH_EVERY: launches between two cuptiActivityFlushAll (as CUPTI's own thread delivers full buffers); 0: never.
 * NODES kernel nodes and COPIES (default 0) device-to-device copy nodes per graph. flush_seconds: the time inside
 * the flushes, where the shim reads the records (bench/gpu_launch_overhead.py: the cost per record).
 * Prints one JSON object: the simulator's totals, the shim's counters (in struct shim_counters order, as numbers),
 * VmRSS after the first tenth of the launches and at the end, VmHWM, and the seconds taken. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef uint32_t (*graph_launch_fn)(uint32_t, uint32_t, const char *, const char *, uint32_t, uint32_t, uint32_t,
                                    uint64_t, uint64_t, uint32_t);

static long status_kb(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    size_t n = strlen(field);
    while (f != NULL && fgets(line, sizeof(line), f) != NULL)
        if (strncmp(line, field, n) == 0 && line[n] == ':')
            kb = strtol(line + n + 1, NULL, 10);
    if (f != NULL)
        fclose(f);
    return kb;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    if (argc != 9 && argc != 10) {
        fprintf(stderr, "usage: %s CUPTI SHIM SEMAPHORE_OFFSET COUNTERS_OFFSET COUNTERS LAUNCHES NODES FLUSH_EVERY\n",
                argv[0]);
        return 2;
    }
    void *cupti = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
    void *shim = cupti != NULL ? dlopen(argv[2], RTLD_NOW) : NULL;
    if (shim == NULL) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    int (*initialize)(void) = (int (*)(void))dlsym(shim, "InitializeInjection");
    int (*state)(void) = (int (*)(void))dlsym(cupti, "simcupti_state");
    int (*flush)(uint32_t) = (int (*)(uint32_t))dlsym(cupti, "cuptiActivityFlushAll");
    void (*totals)(uint64_t *) = (void (*)(uint64_t *))dlsym(cupti, "simcupti_totals");
    graph_launch_fn graph_launch = (graph_launch_fn)dlsym(cupti, "simcupti_graph_launch");
    Dl_info info;
    if (!initialize || !state || !flush || !totals || !graph_launch || !dladdr((void *)initialize, &info))
        return 1;
    initialize();
    uint8_t *base = info.dli_fbase;
    volatile unsigned short *semaphore = (volatile unsigned short *)(base + strtoull(argv[3], NULL, 0));
    const uint64_t *counters = (const uint64_t *)(base + strtoull(argv[4], NULL, 0));
    int count = atoi(argv[5]);
    uint64_t launches = strtoull(argv[6], NULL, 10), nodes = strtoull(argv[7], NULL, 10);
    uint64_t flush_every = strtoull(argv[8], NULL, 10);
    uint32_t copies = argc == 10 ? (uint32_t)strtoul(argv[9], NULL, 10) : 0;
    double flushing = 0;
    *semaphore = 1; /* an agent attached: the watcher subscribes within a poll */
    for (int i = 0; i < 5000 && (state() & 1) == 0; i++)
        usleep(1000);
    if ((state() & 1) == 0)
        return 3;
    double t0 = now_s();
    long rss_warm = 0;
    for (uint64_t i = 0; i < launches; i++) {
        graph_launch(0, 311, "cudaGraphLaunch", "k_replayed", 1 + (uint32_t)(i % 7), (uint32_t)nodes, copies, 4096,
                     1000, (uint32_t)(i % 4));
        if (flush_every && (i + 1) % flush_every == 0) {
            double f0 = now_s();
            flush(0);
            flushing += now_s() - f0;
        }
        if (i + 1 == launches / 10)
            rss_warm = status_kb("VmRSS");
    }
    flush(0);
    double seconds = now_s() - t0;
    uint64_t sim[5];
    totals(sim);
    printf("{\"generated\":%llu,\"dropped\":%llu,\"delivered\":%llu,\"generated_ns\":%llu,\"counters\":[",
           (unsigned long long)sim[0], (unsigned long long)sim[1], (unsigned long long)sim[2],
           (unsigned long long)sim[3]);
    for (int i = 0; i < count; i++)
        printf("%s%llu", i ? "," : "", (unsigned long long)counters[i]);
    printf("],\"rss_warm_kb\":%ld,\"rss_end_kb\":%ld,\"hwm_kb\":%ld,\"seconds\":%.3f,\"flush_seconds\":%.4f}\n",
           rss_warm, status_kb("VmRSS"), status_kb("VmHWM"), seconds, flushing);
    *semaphore = 0;
    return 0;
}
