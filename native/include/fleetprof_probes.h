/* fleetprof's USDT probe ABI (provider "fleetprof"), shared by the CUPTI shim and the GPU simulator so the two
 * cannot drift. The node agent attaches to any loaded ELF object that carries these probes.
 *
 *   kernel_launch(u32 correlation_id, s32 callback_id, const char *api_name)
 *       on the launching thread, as the launch returns: the agent captures the CPU stack here;
 *   kernel_executed(u64 start_ns, u64 end_ns, u32 correlation_id, u32 device_id, u32 stream_id,
 *                   const char *kernel_name)
 *       once per executed kernel record (CUPTI CONCURRENT_KERNEL activity, or the simulator's clock).
 *       start_ns and end_ns are Unix time in nanoseconds (CLOCK_REALTIME: ns since 1970-01-01 UTC), end >= start;
 *       the agent counts and dead-letters a record whose times are not (before 2000, after now + 1 day, or a kernel
 *       longer than a day). kernel_name must stay readable while the process lives (CUPTI's names do): the agent
 *       reads a name in a page not yet resident from the process at drain time.
 *   launch_weight(u32 correlation_id, u32 weight)
 *       before kernel_launch when a per-thread rate limit skipped launches: this one stands for `weight`.
 *
 * With a rate limit (native/include/fleetprof_ratelimit.h), kernel_launch fires only for sampled launches, and
 * kernel_executed is not fired for a kernel whose launch was seen and skipped; it still fires for a kernel whose launch
 * was never seen (launched before the agent attached), so those can be counted as unattributed GPU time.
 *
 * Each probe has a semaphore: the kernel increments it while an agent is attached (uprobe ref_ctr_offset), so with
 * no agent a probe site costs one load and a not-taken branch. Exactly one translation unit per ELF object defines
 * the semaphores with FLEETPROF_DEFINE_PROBE_SEMAPHORES before including this header.
 */
#ifndef FLEETPROF_PROBES_H
#define FLEETPROF_PROBES_H

#include <stdint.h>

#ifndef FLEETPROF_NO_SDT
#define _SDT_HAS_SEMAPHORES 1
#include <sys/sdt.h>
#else
/* A self-check build on a machine without <sys/sdt.h> (tests/gpu/validate.sh): no probe notes, so nothing can
 * attach and the semaphores stay 0; the library's record file is then its only output. */
#define STAP_PROBE2(provider, name, a1, a2) ((void)(a1), (void)(a2))
#define STAP_PROBE3(provider, name, a1, a2, a3) ((void)(a1), (void)(a2), (void)(a3))
#define STAP_PROBE6(provider, name, a1, a2, a3, a4, a5, a6) \
    ((void)(a1), (void)(a2), (void)(a3), (void)(a4), (void)(a5), (void)(a6))
#endif

#define FLEETPROF_SEMAPHORE_ATTRS __attribute__((visibility("hidden")))

#ifdef FLEETPROF_DEFINE_PROBE_SEMAPHORES
#define FLEETPROF_SEMAPHORE(name) \
    FLEETPROF_SEMAPHORE_ATTRS volatile unsigned short fleetprof_##name##_semaphore __attribute__((section(".probes"))) = 0
#else
#define FLEETPROF_SEMAPHORE(name) extern FLEETPROF_SEMAPHORE_ATTRS volatile unsigned short fleetprof_##name##_semaphore
#endif

FLEETPROF_SEMAPHORE(kernel_launch);
FLEETPROF_SEMAPHORE(kernel_executed);
FLEETPROF_SEMAPHORE(launch_weight);

#define FLEETPROF_ENABLED(name) __builtin_expect(fleetprof_##name##_semaphore != 0, 0)

#define FLEETPROF_KERNEL_LAUNCH(correlation_id, callback_id, api_name)                                \
    do {                                                                                              \
        if (FLEETPROF_ENABLED(kernel_launch))                                                          \
            STAP_PROBE3(fleetprof, kernel_launch, (uint32_t)(correlation_id), (int32_t)(callback_id), \
                        (const char *)(api_name));                                                    \
    } while (0)

#define FLEETPROF_KERNEL_EXECUTED(start_ns, end_ns, correlation_id, device_id, stream_id, kernel_name)         \
    do {                                                                                                       \
        if (FLEETPROF_ENABLED(kernel_executed))                                                                 \
            STAP_PROBE6(fleetprof, kernel_executed, (uint64_t)(start_ns), (uint64_t)(end_ns),                  \
                        (uint32_t)(correlation_id), (uint32_t)(device_id), (uint32_t)(stream_id),              \
                        (const char *)(kernel_name));                                                          \
    } while (0)

#define FLEETPROF_LAUNCH_WEIGHT(correlation_id, weight)                                                 \
    do {                                                                                                \
        if (FLEETPROF_ENABLED(launch_weight))                                                            \
            STAP_PROBE2(fleetprof, launch_weight, (uint32_t)(correlation_id), (uint32_t)(weight));       \
    } while (0)

/* Anything attached at all: skip work done only for the probes (timestamps, name lookups). */
#define FLEETPROF_ANY_ENABLED() \
    (FLEETPROF_ENABLED(kernel_launch) || FLEETPROF_ENABLED(kernel_executed))

#endif
