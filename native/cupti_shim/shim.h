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

struct shim_settings {
    uint32_t launch_rate;  /* FLEETPROF_LAUNCH_RATE: sampled launches/s per thread, 0 = all */
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
};

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
/* Kernel records on for work submitted from now until the release, process-wide and counted, so concurrent sampled
 * launches nest. Returns a token for the release: 0 when there is nothing to release (records on all the time, or
 * CUPTI refused). A token from before a stop or start is released as a no-op. */
uint32_t shim_activity_hold(void);
void shim_activity_release(uint32_t token);
const char *shim_clock_source(void);
int64_t shim_clock_offset_ns(void);
int64_t shim_clock_measured_offset_ns(void);

/* record.c: the self-check file (FLEETPROF_CUPTI_RECORD), JSON lines */
int shim_record_open(const char *path);
int shim_recording(void);
void shim_record_start(const char *cupti_library);
void shim_record_launch(uint32_t correlation_id, int32_t callback_id, const char *domain, const char *api,
                        uint32_t weight, int nested);
void shim_record_kernel(uint64_t start_ns, uint64_t end_ns, uint32_t correlation_id, uint32_t device_id,
                        uint32_t stream_id, const char *name, int fired);
void shim_record_note(const char *what, const char *detail);
void shim_record_on(void);
void shim_record_flush(void);
void shim_record_close(void);

/* fleetprof_cupti.c */
const char *shim_result_string(CUptiResult result);
void shim_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
