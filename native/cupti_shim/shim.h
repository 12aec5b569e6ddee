/* What the CUPTI shim's translation units share: the CUPTI entry points resolved at run time, the settings, the
 * counters, and the functions each part offers the others. */
#ifndef FLEETPROF_SHIM_H
#define FLEETPROF_SHIM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <cupti.h>

/* libcupti is opened with dlopen, so one build runs on CUDA 12 and 13; the pointer types come from the headers,
 * so a call with the wrong arguments does not compile. Optional ones are NULL when this libcupti lacks them. */
struct cupti_api {
    __typeof__(&cuptiSubscribe) subscribe;
    __typeof__(&cuptiUnsubscribe) unsubscribe;
    __typeof__(&cuptiEnableCallback) enable_callback;
    __typeof__(&cuptiActivityRegisterCallbacks) activity_register_callbacks;
    __typeof__(&cuptiActivityEnable) activity_enable;
    __typeof__(&cuptiActivityDisable) activity_disable;
    __typeof__(&cuptiActivityGetNextRecord) activity_get_next_record;
    __typeof__(&cuptiActivityGetNumDroppedRecords) activity_get_num_dropped_records;
    __typeof__(&cuptiActivityFlushAll) activity_flush_all;
    __typeof__(&cuptiGetTimestamp) get_timestamp;
    __typeof__(&cuptiActivityRegisterTimestampCallback) activity_register_timestamp_callback; /* optional */
    __typeof__(&cuptiGetResultString) get_result_string;                                      /* optional */
};

/* FLEETPROF_GRAPH_LAUNCH_RATE: sampled CUDA graph launches per second per thread (0: all), a rate limit of their
 * own: one graph launch replays up to thousands of kernels, so graph launches are sampled apart from the kernel and
 * copy launches around them, with their own weights, and a stream of small launches cannot starve them. */
#define SHIM_GRAPH_LAUNCH_RATE_ENV "FLEETPROF_GRAPH_LAUNCH_RATE"
#define SHIM_GRAPH_LAUNCH_RATE_DEFAULT 100u

struct shim_settings {
    uint32_t launch_rate;  /* FLEETPROF_LAUNCH_RATE: sampled launches/s per thread, 0 = all */
    uint32_t graph_launch_rate; /* FLEETPROF_GRAPH_LAUNCH_RATE */
    uint32_t buffers;      /* FLEETPROF_CUPTI_BUFFERS: activity buffers in the fixed pool */
    size_t buffer_bytes;   /* FLEETPROF_CUPTI_BUFFER_KB */
    uint32_t poll_ms;      /* FLEETPROF_CUPTI_POLL_MS: how often the watcher looks at the semaphores */
    uint32_t flush_ms;     /* FLEETPROF_CUPTI_FLUSH_MS: how often completed records are pulled while on */
    int activity_sampled;  /* FLEETPROF_CUPTI_ACTIVITY=sampled: kernel records only for sampled launches */
};

/* Everything that can be lost or skipped is counted; the record file's summary and the exit warning show them. */
struct shim_counters {
    _Atomic uint64_t launches;          /* outermost launch API calls returned while on */
    _Atomic uint64_t launches_sampled;  /* of those, kept by the rate limit */
    _Atomic uint64_t launches_nested;   /* driver launches inside a runtime launch (counted once, as the runtime) */
    _Atomic uint64_t launches_failed;   /* launch APIs that returned an error: no kernel follows */
    _Atomic uint64_t kernels;           /* kernel records read */
    _Atomic uint64_t kernels_skipped;   /* their launch was skipped by the rate limit: no probe */
    _Atomic uint64_t kernels_unseen;    /* no launch known (before attach, or older than the correlation table) */
    _Atomic uint64_t kernels_incomplete;/* no timestamps (forced flush at exit before the kernel ended) */
    _Atomic uint64_t records_dropped;   /* CUPTI dropped them: no buffer was free */
    _Atomic uint64_t buffers_refused;   /* buffer requests refused because the pool was empty */
    _Atomic uint64_t activity_enables;  /* sampled launches that turned kernel records on (sampled mode) */
    _Atomic uint64_t activity_refused;  /* ... and found CUPTI refusing to: their kernels go untimed */
    _Atomic uint64_t copies;            /* memcpy and peer-to-peer (memcpy2) records read (memory.c) */
    _Atomic uint64_t sets;              /* memset records read */
    _Atomic uint64_t memory_skipped;    /* copies and sets whose launch the rate limit skipped: no probe */
    _Atomic uint64_t memory_unseen;     /* copies and sets with no known launch */
    _Atomic uint64_t memory_incomplete; /* copies and sets without timestamps */
    _Atomic uint64_t graph_kernels;     /* kernel records a CUDA graph replayed (graphId != 0), of `kernels` */
    _Atomic uint64_t graph_launches;    /* graph launch API calls returned (also in `launches`) */
    _Atomic uint64_t graph_launches_sampled; /* of those, kept by the graph rate limit */
    _Atomic uint64_t records_implausible; /* timestamps outside the record's plausible window: dropped, no probe */
    _Atomic uint64_t gpu_ns;            /* sum of end - start of every record read with plausible timestamps */
    _Atomic uint64_t launch_ranges;     /* launch_range paths built for sampled launches (nvtx.c) */
    _Atomic uint64_t nvtx_messages_cut; /* range messages longer than the copy kept */
    _Atomic uint64_t nvtx_paths_cut;    /* range paths longer than FLEETPROF_RANGE_PATH_MAX, ending in "..." */
    _Atomic uint64_t nvtx_too_deep;     /* pushes deeper than the stack keeps (counted, not named) */
    _Atomic uint64_t nvtx_pops_unmatched; /* pops with no range open */
    _Atomic uint64_t nvtx_starts_refused; /* start/end ranges not kept: the table of open ones was full */
};

/* The activity kinds, as bits: a sampled launch holds on the kinds its API produces. */
#define SHIM_KIND_KERNEL 1u
#define SHIM_KIND_MEMCPY 2u
#define SHIM_KIND_MEMSET 4u
#define SHIM_KIND_MEMCPY2 8u /* peer-to-peer copies: a copy launch holds MEMCPY2 with MEMCPY */
#define SHIM_KIND_ALL 15u

/* What a subscribed API call launches (launches.c and memory.c classify callback ids). */
enum shim_api_kind { SHIM_API_NONE = 0, SHIM_API_KERNEL, SHIM_API_COPY, SHIM_API_SET, SHIM_API_GRAPH };

extern struct cupti_api shim_cupti;
extern struct shim_settings shim_settings;
extern struct shim_counters shim_counters;

/* launches.c */
void CUPTIAPI shim_on_api(void *userdata, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void *data);
int shim_enable_launch_callbacks(CUpti_SubscriberHandle subscriber, uint32_t enable);

#define SHIM_CORR_UNSEEN 0
#define SHIM_CORR_SKIPPED 1
#define SHIM_CORR_SAMPLED 2
int shim_correlation_state(uint32_t correlation_id);

/* activity.c */
int shim_activity_init(void); /* allocates the buffer pool; 0 on success */
/* Registers the buffer callbacks and the clock; then kernel records are on until stop (per_launch = 0), or only
 * while a sampled launch holds them (per_launch = 1). */
int shim_activity_start(int per_launch);
void shim_activity_stop(void); /* disables kernel records and delivers what is buffered */
int shim_activity_per_launch(void);
/* Records of `kinds` (SHIM_KIND_*) on for work submitted from now until the release, process-wide and counted per
 * kind, so concurrent sampled launches nest. Returns a token for the release: 0 when there is nothing to release (records on all the time, or
 * CUPTI refused). A token from before a stop or start is released as a no-op. */
uint32_t shim_activity_hold(uint32_t kinds);
void shim_activity_release(uint32_t token);
/* Whether a record's times are plausible: end >= start, not before CUPTI was turned on, not after `latest` (the
 * delivery time plus slack). Counts an implausible one. */
int shim_plausible(uint64_t start, uint64_t end, uint64_t latest);

/* memory.c: the copy and set APIs and their records */
int shim_enable_memory_callbacks(CUpti_SubscriberHandle subscriber, uint32_t enable);
enum shim_api_kind shim_memory_api_kind(CUpti_CallbackDomain domain, CUpti_CallbackId cbid);
void shim_memcpy_record(const CUpti_Activity *record, uint64_t latest);
void shim_memcpy2_record(const CUpti_Activity *record, uint64_t latest); /* peer-to-peer copies */
void shim_memset_record(const CUpti_Activity *record, uint64_t latest);

/* nvtx.c: NVTX ranges (the shim is also an NVTX injection library) */
/* The launching thread's range path into `out` (FLEETPROF_RANGE_PATH_MAX bytes); 0 when it is in no range. */
int shim_nvtx_path(char *out);
void shim_nvtx_on(int on); /* the watcher: an agent attached or left (ranges pushed while off are unknown) */
const char *shim_clock_source(void);
int64_t shim_clock_offset_ns(void);
int64_t shim_clock_measured_offset_ns(void);

/* record.c: the self-check file (FLEETPROF_CUPTI_RECORD), JSON lines */
int shim_record_open(const char *path);
int shim_recording(void);
void shim_record_start(const char *cupti_library);
void shim_record_launch(uint32_t correlation_id, int32_t callback_id, const char *domain, const char *api,
                        uint32_t weight, int nested, enum shim_api_kind kind, const char *range_path);
void shim_record_kernel(uint64_t start_ns, uint64_t end_ns, uint32_t correlation_id, uint32_t device_id,
                        uint32_t stream_id, const char *name, int fired, uint32_t graph_id, uint64_t graph_node_id);
void shim_record_memory(uint64_t start_ns, uint64_t end_ns, uint32_t correlation_id, uint32_t device_id,
                        uint32_t stream_id, uint64_t bytes, uint32_t memory_kind, int fired, uint32_t graph_id,
                        uint64_t graph_node_id);
void shim_record_note(const char *what, const char *detail);
void shim_record_on(void);
void shim_record_flush(void);
void shim_record_close(void);

/* fleetprof_cupti.c */
const char *shim_result_string(CUptiResult result);
void shim_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
