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
 *   launch_range(u32 correlation_id, const char *range_path)
 *       before kernel_launch (after launch_weight) when the launching thread is inside NVTX ranges: the innermost
 *       range path, root first, elements joined by FLEETPROF_RANGE_SEP (" > "), a non-default domain's ranges as
 *       "domain:name". At most FLEETPROF_RANGE_PATH_MAX bytes with the NUL; a path cut there ends in "...".
 *       Ranges pushed before an agent attached are unknown to the shim: each stands as "[range before attach]".
 *   graph_kernel_executed(u64 start_ns, u64 end_ns, u32 correlation_id, u32 device_id, u32 stream_id,
 *                         const char *kernel_name, u32 graph_id, u64 graph_node_id)
 *       instead of kernel_executed for a kernel a CUDA graph launch replayed (CUPTI's graphId != 0): the
 *       correlation id is the graph launch's, so one sampled graph launch has many executed records.
 *   memory_executed(u64 start_ns, u64 end_ns, u32 correlation_id, u32 device_id, u32 stream_id, u64 bytes,
 *                   u32 memory_kind, u32 graph_id, u64 graph_node_id)
 *       once per executed memory copy or set (CUPTI MEMCPY / MEMSET activity), same rules and clock as
 *       kernel_executed; graph_id 0 when no graph replayed it. memory_kind: FLEETPROF_MEMORY_KIND below.
 *   Launches of copies and sets (cudaMemcpy*, cudaMemset*, cuMemcpy*, cuMemset*) fire kernel_launch like kernel
 *   launches, under the same rate limit; graph launches (cudaGraphLaunch, cuGraphLaunch and their _ptsz) under a
 *   rate limit of their own.
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
#define STAP_PROBE8(provider, name, a1, a2, a3, a4, a5, a6, a7, a8) \
    ((void)(a1), (void)(a2), (void)(a3), (void)(a4), (void)(a5), (void)(a6), (void)(a7), (void)(a8))
#define STAP_PROBE9(provider, name, a1, a2, a3, a4, a5, a6, a7, a8, a9) \
    ((void)(a1), (void)(a2), (void)(a3), (void)(a4), (void)(a5), (void)(a6), (void)(a7), (void)(a8), (void)(a9))
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
FLEETPROF_SEMAPHORE(launch_range);
FLEETPROF_SEMAPHORE(graph_kernel_executed);
FLEETPROF_SEMAPHORE(memory_executed);

#define FLEETPROF_RANGE_SEP " > "
#define FLEETPROF_RANGE_PATH_MAX 512
#define FLEETPROF_RANGE_BEFORE_ATTACH "[range before attach]"

/* memory_executed's memory_kind: bits 0-7 CUPTI's CUpti_ActivityMemcpyKind (0 for a set), bit 8 set for a memset,
 * bits 16-23 the source's and 24-31 the destination's CUpti_ActivityMemoryKind (1 pageable, 2 pinned, 3 device,
 * 4 array, 5 managed; 0 unknown; a set has only a destination). */
#define FLEETPROF_MEMORY_KIND(copy_kind, is_set, src_kind, dst_kind)                                   \
    ((uint32_t)((copy_kind) & 0xff) | ((is_set) ? 0x100u : 0u) | ((uint32_t)((src_kind) & 0xff) << 16) | \
     ((uint32_t)((dst_kind) & 0xff) << 24))
#define FLEETPROF_MEMORY_IS_SET 0x100u

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

#define FLEETPROF_LAUNCH_RANGE(correlation_id, range_path)                                             \
    do {                                                                                                 \
        if (FLEETPROF_ENABLED(launch_range))                                                              \
            STAP_PROBE2(fleetprof, launch_range, (uint32_t)(correlation_id), (const char *)(range_path)); \
    } while (0)

#define FLEETPROF_GRAPH_KERNEL_EXECUTED(start_ns, end_ns, correlation_id, device_id, stream_id, kernel_name,      \
                                        graph_id, graph_node_id)                                                \
    do {                                                                                                        \
        if (FLEETPROF_ENABLED(graph_kernel_executed))                                                            \
            STAP_PROBE8(fleetprof, graph_kernel_executed, (uint64_t)(start_ns), (uint64_t)(end_ns),             \
                        (uint32_t)(correlation_id), (uint32_t)(device_id), (uint32_t)(stream_id),               \
                        (const char *)(kernel_name), (uint32_t)(graph_id), (uint64_t)(graph_node_id));          \
    } while (0)

#define FLEETPROF_MEMORY_EXECUTED(start_ns, end_ns, correlation_id, device_id, stream_id, bytes, memory_kind,    \
                                  graph_id, graph_node_id)                                                      \
    do {                                                                                                        \
        if (FLEETPROF_ENABLED(memory_executed))                                                                  \
            STAP_PROBE9(fleetprof, memory_executed, (uint64_t)(start_ns), (uint64_t)(end_ns),                   \
                        (uint32_t)(correlation_id), (uint32_t)(device_id), (uint32_t)(stream_id),               \
                        (uint64_t)(bytes), (uint32_t)(memory_kind), (uint32_t)(graph_id),                       \
                        (uint64_t)(graph_node_id));                                                             \
    } while (0)

/* Anything attached at all: skip work done only for the probes (timestamps, name lookups). */
#define FLEETPROF_ANY_ENABLED() \
    (FLEETPROF_ENABLED(kernel_launch) || FLEETPROF_ENABLED(kernel_executed) ||                   \
     FLEETPROF_ENABLED(graph_kernel_executed) || FLEETPROF_ENABLED(memory_executed))

#endif
