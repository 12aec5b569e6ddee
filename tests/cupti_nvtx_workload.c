/* A workload that marks its steps with NVTX the way applications do: the real NVTX3 header-only library
 * (nvidia-nvtx-cu12's nvtx3/nvToolsExt.h), which loads the shim through NVTX_INJECTION64_PATH at the first NVTX call,
 * and kernel launches through the simulated libcupti (FLEETPROF_CUPTI_LIBRARY) with the shim injected as the CUDA
 * driver would (CUDA_INJECTION64_PATH). tests/test_cupti_shim_nvtx.py reads the record file: each launch line says
 * which step it stands for (its api name is the step) and carries the range path the shim sent.
 *
 *   cupti_nvtx_workload            the scenario below
 *   cupti_nvtx_workload bench N    N push/pop pairs timed, printed as ns per pair (bench/gpu_launch_overhead.py)
 *   cupti_nvtx_workload launches N DEPTH LAUNCH_SEMAPHORE RANGE_SEMAPHORE
 *                                  N launches inside DEPTH ranges, all sampled, with the shim attached (the two
 *                                  semaphores at these offsets in the shim raised, as an agent's uprobes do): ns per
 *                                  launch, the range path built and sent each time when DEPTH > 0
 */
#define _GNU_SOURCE
#include <nvtx3/nvToolsExt.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <wchar.h>

typedef uint32_t (*launch_fn)(uint32_t, uint32_t, const char *, const char *, uint32_t, uint64_t, uint32_t, int, int);
static launch_fn launch;

static void step(const char *name)
{
    launch(0, 211, name, "k", 1, 1000, 0, 0, 0); /* cudaLaunchKernel's callback id; the api name says the step */
}

static void *end_elsewhere(void *id)
{
    nvtxRangeEnd(*(nvtxRangeId_t *)id); /* a start/end range may end on another thread */
    return NULL;
}

static nvtxEventAttributes_t ascii(const char *message)
{
    nvtxEventAttributes_t a = {0};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = message;
    return a;
}

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* What the CUDA driver does at cuInit: load the CUPTI shim named by CUDA_INJECTION64_PATH and initialize it. */
static int start_cuda(void)
{
    void *cupti = dlopen(getenv("FLEETPROF_CUPTI_LIBRARY"), RTLD_NOW | RTLD_GLOBAL);
    void *shim = cupti ? dlopen(getenv("CUDA_INJECTION64_PATH"), RTLD_NOW) : NULL;
    if (shim == NULL) {
        fprintf(stderr, "%s\n", dlerror());
        return -1;
    }
    launch = (launch_fn)dlsym(cupti, "simcupti_launch");
    ((int (*)(void))dlsym(shim, "InitializeInjection"))();
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 6 && strcmp(argv[1], "launches") == 0) {
        long n = atol(argv[2]), depth = atol(argv[3]);
        if (start_cuda() != 0)
            return 1;
        Dl_info info;
        if (!dladdr(dlsym(dlopen(getenv("CUDA_INJECTION64_PATH"), RTLD_NOW), "InitializeInjection"), &info))
            return 1;
        char *base = info.dli_fbase;
        *(volatile unsigned short *)(base + strtoul(argv[4], NULL, 0)) = 1;
        *(volatile unsigned short *)(base + strtoul(argv[5], NULL, 0)) = 1;
        int (*state)(void) = (int (*)(void))dlsym(dlopen(getenv("FLEETPROF_CUPTI_LIBRARY"), RTLD_NOW), "simcupti_state");
        for (int i = 0; i < 5000 && (state() & 1) == 0; i++)
            nanosleep(&(struct timespec){0, 1000000}, NULL);
        static const char *const names[] = {"step", "forward", "aten::linear", "aten::addmm", "layer", "block"};
        for (long i = 0; i < depth; i++)
            nvtxRangePushA(names[i % 6]);
        double t0 = now_ns();
        for (long i = 0; i < n; i++)
            launch(0, 211, "cudaLaunchKernel", "k", 0, 0, 0, 0, 0);
        printf("%.1f\n", (now_ns() - t0) / (double)n);
        return 0;
    }
    if (argc == 3 && strcmp(argv[1], "bench") == 0) {
        long n = atol(argv[2]);
        nvtxRangePop(); /* the first NVTX call loads the injection, if NVTX_INJECTION64_PATH names one */
        if (getenv("CUDA_INJECTION64_PATH") != NULL && start_cuda() != 0)
            return 1;
        double t0 = now_ns();
        for (long i = 0; i < n; i++) {
            nvtxRangePushA("bench_range_message");
            nvtxRangePop();
        }
        printf("%.2f\n", (now_ns() - t0) / (double)n);
        return 0;
    }
    nvtxRangePushA("early"); /* before CUDA starts (and the shim's record file): the shim cannot know its name */
    if (start_cuda() != 0) /* cuInit */
        return 1;

    step("early_only");
    nvtxRangePushA("step");
    nvtxRangePushA("forward");
    step("forward");
    nvtxRangePop();
    char *freed = strdup("backward");
    nvtxRangePushA(freed);
    memset(freed, 'x', strlen(freed)); /* the caller's string changes and goes: the copy stays */
    free(freed);
    step("backward");
    nvtxDomainHandle_t megatron = nvtxDomainCreateA("megatron");
    nvtxEventAttributes_t layer = ascii("layer0");
    nvtxDomainRangePushEx(megatron, &layer);
    nvtxEventAttributes_t attn = ascii(NULL);
    attn.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
    attn.message.registered = nvtxDomainRegisterStringA(megatron, "attn");
    nvtxDomainRangePushEx(megatron, &attn);
    step("domain");
    nvtxDomainRangePop(megatron);
    nvtxDomainRangePop(megatron);
    nvtxRangeId_t prefetch = nvtxRangeStartA("prefetch");
    nvtxRangePushW(L"wide");
    step("started");
    pthread_t other;
    pthread_create(&other, NULL, end_elsewhere, &prefetch);
    pthread_join(other, NULL);
    step("ended");
    nvtxRangePop();
    nvtxRangePop(); /* backward */
    nvtxRangePop(); /* step */
    char longer[201];
    memset(longer, 'm', 200);
    longer[200] = '\0';
    nvtxRangePushA(longer);
    step("long");
    nvtxRangePop();
    for (int i = 0; i < 40; i++)
        nvtxRangePushA("level");
    step("deep");
    for (int i = 0; i < 40; i++)
        nvtxRangePop();
    memset(longer, 'n', 90);
    longer[90] = '\0';
    for (int i = 0; i < 10; i++)
        nvtxRangePushA(longer);
    step("over"); /* a path of 10 x 90 bytes: more than launch_range takes */
    for (int i = 0; i < 10; i++)
        nvtxRangePop();
    for (int i = 0; i < 100; i++) /* started and ended between two launches: forgotten, never refused */
        nvtxRangeEnd(nvtxRangeStartA("brief"));
    nvtxRangeId_t kept = nvtxRangeStartA("kept");
    step("many_starts");
    nvtxRangeEnd(kept);
    nvtxRangePop(); /* early */
    step("outside");
    nvtxRangePop(); /* one too many */
    step("after");
    return 0;
}
