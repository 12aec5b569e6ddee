/* A simulated libnvidia-ml.so.1: the NVML entry points fleetprof's collector reaches through nvidia-ml-py, with
 * values scripted over time by a scenario file. It exists so that the real binding and the collector run unchanged
 * on machines without a GPU; everything it reports says "simulated" (device names and the driver version).
 *
 * Entry points nvidia-ml-py looks up but this library does not define fail in the binding itself with
 * NVML_ERROR_FUNCTION_NOT_FOUND; defined ones answer NVML_ERROR_NOT_SUPPORTED for whatever the scenario leaves out.
 *
 * The scenario file is named by FLEETPROF_NVML_SIM_SCENARIO and read at the first nvmlInit. Text, one directive a
 * line, tokens separated by blanks, '#' starts a comment line:
 *
 *   start_ns NS               scenario time 0 is NS nanoseconds since the epoch (CLOCK_REALTIME); without this
 *                             line, time 0 is the first nvmlInit (CLOCK_MONOTONIC)
 *   driver TEXT               driver version (rest of line); " (simulated)" is appended unless TEXT says simulated
 *   proc_sample_ms N          per-process utilization is sampled every N ms of scenario time (default 1000)
 *   init_error CODE           nvmlInit fails with this NVML return code (e.g. 9: driver not loaded)
 *   device KEY uuid=U memory_total=BYTES power_limit=MW [parent=KEY] [gi=N] name=TEXT
 *                             one GPU; with parent= a MIG device of that (earlier) GPU, gi= its GPU instance id
 *                             (default: its position under the parent, from 1). name= takes the rest of the line;
 *                             " (simulated)" is appended unless it says simulated. GPUs are numbered in file order.
 *   at SECONDS KEY FIELD=VALUE...
 *                             from scenario time SECONDS on, device KEY reports these values. A field not named
 *                             keeps its value from the device's previous `at` line (initially: not supported);
 *                             `at` lines of one device come in ascending time. VALUE is an integer (0x.. allowed)
 *                             or `na` (NVML_ERROR_NOT_SUPPORTED). Fields:
 *       gpu_util mem_util (%), mem_used (bytes), sm_clock mem_clock (MHz), power power_limit (mW), temp (C),
 *       pcie_tx pcie_rx (KB/s), clock_events (bit mask of nvmlClocksEventReason*),
 *       procs=none | PID:SM:MEM:USED[,PID:SM:MEM:USED...]   running compute processes: SM and memory utilization
 *                             (%) and used memory (bytes), each may be `na`; a process with both utilizations
 *                             has one utilization sample per proc_sample_ms tick
 *       xid=CODE[,CODE...]    XID errors raised once at SECONDS (not kept); on a MIG device, they are reported
 *                             by its GPU with the MIG device's GPU instance id, as the driver does
 *       lost=1|0              from SECONDS on every call on the device fails with NVML_ERROR_GPU_IS_LOST
 *       hang=1|0              calls on the device block until its next `at` line takes effect (an hour at most)
 *
 * Process utilization samples carry CLOCK_REALTIME microseconds, as the driver's do. Event sets deliver XIDs
 * (nvmlEventTypeXidCriticalError) only; MIG devices do not support process utilization or events, like real ones.
 */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nvml_sim.h"

#define API __attribute__((visibility("default")))

static int loaded, init_count;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* --- devices -------------------------------------------------------------------------------------------------- */

static int valid(nvmlDevice_t d) {
    return d >= devices && d < devices + n_devices && ((char *)d - (char *)devices) % sizeof *d == 0;
}

static int initialized(void) {
    pthread_mutex_lock(&lock);
    int yes = init_count > 0;
    pthread_mutex_unlock(&lock);
    return yes;
}

/* The device's state now: blocks first while the scenario says the device hangs. */
static nvmlReturn_t state(nvmlDevice_t d, const struct segment **out) {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    if (!valid(d)) return NVML_ERROR_INVALID_ARGUMENT;
    double now = sim_now();
    int i = segment_at(d, now);
    while (d->segs[i].hang) {
        sleep_until(i + 1 < d->n_segs ? d->segs[i + 1].t : now + 3600.0);
        now = sim_now();
        int next = segment_at(d, now);
        if (next == i) break; /* the hour is up */
        i = next;
    }
    *out = &d->segs[i];
    return d->segs[i].lost ? NVML_ERROR_GPU_IS_LOST : NVML_SUCCESS;
}

static nvmlReturn_t field_u32(nvmlDevice_t d, enum field f, unsigned int *out) {
    const struct segment *s;
    nvmlReturn_t rc = state(d, &s);
    if (rc) return rc;
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (s->v[f] == VALUE_NA) return NVML_ERROR_NOT_SUPPORTED;
    *out = (unsigned int)s->v[f];
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&lock);
    nvmlReturn_t rc = NVML_SUCCESS;
    if (!loaded) {
        if (load_scenario() < 0) {
            rc = NVML_ERROR_UNKNOWN;
        } else {
            loaded = 1;
            start_clock();
        }
    }
    if (rc == NVML_SUCCESS && init_error) rc = init_error;
    if (rc == NVML_SUCCESS) init_count++;
    pthread_mutex_unlock(&lock);
    return rc;
}

API nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
API nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

API nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t rc = init_count > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (init_count > 0) init_count--;
    pthread_mutex_unlock(&lock);
    return rc;
}

API const char *nvmlErrorString(nvmlReturn_t rc) {
    switch (rc) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    if (length <= strlen(driver_version)) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(version, driver_version);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned int)n_gpus;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= (unsigned int)n_gpus) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[gpu_order[index]];
    return NVML_SUCCESS;
}

static nvmlReturn_t copy_text(nvmlDevice_t d, const char *text, char *out, unsigned int length) {
    const struct segment *s;
    nvmlReturn_t rc = state(d, &s);
    if (rc) return rc;
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (length <= strlen(text)) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(out, text);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int length) {
    return valid(d) ? copy_text(d, d->name, name, length) : NVML_ERROR_INVALID_ARGUMENT;
}

API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int length) {
    return valid(d) ? copy_text(d, d->uuid, uuid, length) : NVML_ERROR_INVALID_ARGUMENT;
}

API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *index) {
    const struct segment *s;
    nvmlReturn_t rc = state(d, &s);
    if (rc) return rc;
    if (!index) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->parent >= 0) return NVML_ERROR_NOT_SUPPORTED;
    *index = (unsigned int)d->index;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *util) {
    const struct segment *s;
    nvmlReturn_t rc = state(d, &s);
    if (rc) return rc;
    if (!util) return NVML_ERROR_INVALID_ARGUMENT;
    if (s->v[F_GPU_UTIL] == VALUE_NA || s->v[F_MEM_UTIL] == VALUE_NA) return NVML_ERROR_NOT_SUPPORTED;
    util->gpu = (unsigned int)s->v[F_GPU_UTIL];
    util->memory = (unsigned int)s->v[F_MEM_UTIL];
    return NVML_SUCCESS;
}

static nvmlReturn_t memory(nvmlDevice_t d, unsigned long long *total, unsigned long long *used) {
    const struct segment *s;
    nvmlReturn_t rc = state(d, &s);
    if (rc) return rc;
    if (s->v[F_MEM_USED] == VALUE_NA || !d->memory_total) return NVML_ERROR_NOT_SUPPORTED;
    *total = d->memory_total;
    *used = (unsigned long long)s->v[F_MEM_USED];
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *mem) {
    if (!mem) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long total, used;
    nvmlReturn_t rc = memory(d, &total, &used);
    if (rc) return rc;
    mem->total = total;
    mem->used = used;
    mem->free = total > used ? total - used : 0;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *mem) {
    if (!mem) return NVML_ERROR_INVALID_ARGUMENT;
    if (mem->version != MEMORY_V2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned long long total, used;
    nvmlReturn_t rc = memory(d, &total, &used);
    if (rc) return rc;
    mem->total = total;
    mem->reserved = 0;
    mem->used = used;
    mem->free = total > used ? total - used : 0;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, int type, unsigned int *clock) {
    if (type == NVML_CLOCK_SM || type == NVML_CLOCK_GRAPHICS) return field_u32(d, F_SM_CLOCK, clock);
    if (type == NVML_CLOCK_MEM) return field_u32(d, F_MEM_CLOCK, clock);
    return valid(d) ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
}

API nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *power) {
    return field_u32(d, F_POWER, power);
}

API nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned int *limit) {
    return field_u32(d, F_POWER_LIMIT, limit);
}

API nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *temp) {
    if (sensor != NVML_TEMPERATURE_GPU) return valid(d) ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
    return field_u32(d, F_TEMP, temp);
}

API nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t d, nvmlTemperature_v1_t *temp) {
    if (!temp) return NVML_ERROR_INVALID_ARGUMENT;
    if (temp->version != TEMPERATURE_V1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned int value;
    nvmlReturn_t rc = nvmlDeviceGetTemperature(d, temp->sensorType, &value);
    if (rc == NVML_SUCCESS) temp->temperature = (int)value;
    return rc;
}

API nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t d, int counter, unsigned int *value) {
    if (counter == NVML_PCIE_UTIL_TX_BYTES) return field_u32(d, F_PCIE_TX, value);
    if (counter == NVML_PCIE_UTIL_RX_BYTES) return field_u32(d, F_PCIE_RX, value);
    return NVML_ERROR_INVALID_ARGUMENT;
}

API nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t d, unsigned long long *reasons) {
    const struct segment *s;
    nvmlReturn_t rc = state(d, &s);
    if (rc) return rc;
    if (!reasons) return NVML_ERROR_INVALID_ARGUMENT;
    if (s->v[F_CLOCK_EVENTS] == VALUE_NA) return NVML_ERROR_NOT_SUPPORTED;
    *reasons = (unsigned long long)s->v[F_CLOCK_EVENTS];
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t d, unsigned long long *reasons) {
    return nvmlDeviceGetCurrentClocksEventReasons(d, reasons);
}

/* --- processes ------------------------------------------------------------------------------------------------ */

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count,
                                                         nvmlProcessInfo_t *infos) {
    const struct segment *s;
    nvmlReturn_t rc = state(d, &s);
    if (rc) return rc;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int capacity = *count;
    *count = (unsigned int)s->n_procs;
    if (s->n_procs == 0) return NVML_SUCCESS;
    if (!infos || capacity < (unsigned int)s->n_procs) return NVML_ERROR_INSUFFICIENT_SIZE;
    for (int i = 0; i < s->n_procs; i++) {
        const struct proc *p = &s->procs[i];
        infos[i].pid = p->pid;
        infos[i].usedGpuMemory = p->used == VALUE_NA ? ~0ULL : (unsigned long long)p->used;
        infos[i].gpuInstanceId = d->parent >= 0 ? d->gpu_instance : NO_INSTANCE;
        infos[i].computeInstanceId = d->parent >= 0 ? 0 : NO_INSTANCE;
    }
    return NVML_SUCCESS;
}

/* One sample per process with both utilizations, per proc_sample_ms tick of scenario time, for the last few ticks
 * after lastSeen (microseconds, CLOCK_REALTIME): each tick's values are the device's state at that tick. */
API nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, nvmlProcessUtilizationSample_t *samples,
                                                 unsigned int *count, unsigned long long last_seen) {
    const struct segment *now_seg;
    nvmlReturn_t rc = state(d, &now_seg);
    if (rc) return rc;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->parent >= 0) return NVML_ERROR_NOT_SUPPORTED;
    double now = sim_now();
    long long newest = (long long)floor(now * 1000.0 / proc_sample_ms);
    unsigned int found = 0, capacity = *count;
    for (long long tick = newest - BUFFERED_TICKS + 1; tick <= newest; tick++) {
        if (tick < 0) continue;
        double t = tick * proc_sample_ms / 1000.0;
        unsigned long long stamp = (unsigned long long)((base_realtime_ns + tick * proc_sample_ms * 1000000LL) / 1000);
        if (stamp <= last_seen) continue;
        const struct segment *s = &d->segs[segment_at(d, t)];
        for (int i = 0; i < s->n_procs; i++) {
            const struct proc *p = &s->procs[i];
            if (p->sm == VALUE_NA || p->mem == VALUE_NA) continue;
            if (samples && found < capacity)
                samples[found] = (nvmlProcessUtilizationSample_t){p->pid, stamp, (unsigned int)p->sm,
                                                                  (unsigned int)p->mem, 0, 0};
            found++;
        }
    }
    if (found == 0) {
        *count = 0;
        return NVML_ERROR_NOT_FOUND;
    }
    if (!samples || capacity < found) {
        *count = found;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = found;
    return NVML_SUCCESS;
}

/* --- MIG ------------------------------------------------------------------------------------------------------ */

API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending) {
    const struct segment *s;
    nvmlReturn_t rc = state(d, &s);
    if (rc) return rc;
    if (!current || !pending) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->parent >= 0) return NVML_ERROR_NOT_SUPPORTED;
    *current = *pending = d->n_children > 0;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned int *is_mig) {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    if (!valid(d) || !is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    *is_mig = d->parent >= 0;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *count) {
    const struct segment *s;
    nvmlReturn_t rc = state(d, &s);
    if (rc) return rc;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->parent >= 0 || d->n_children == 0) return NVML_ERROR_NOT_SUPPORTED;
    *count = MAX_MIG_SLOTS; /* like the driver: the most this GPU could hold; unused slots are NOT_FOUND */
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int index, nvmlDevice_t *mig) {
    const struct segment *s;
    nvmlReturn_t rc = state(d, &s);
    if (rc) return rc;
    if (!mig || d->parent >= 0) return NVML_ERROR_INVALID_ARGUMENT;
    if (index >= (unsigned int)d->n_children) return NVML_ERROR_NOT_FOUND;
    *mig = &devices[d->children[index]];
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t mig, nvmlDevice_t *device) {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    if (!valid(mig) || !device || mig->parent < 0) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[mig->parent];
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t d, unsigned int *id) {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    if (!valid(d) || !id) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->parent < 0) return NVML_ERROR_NOT_SUPPORTED;
    *id = d->gpu_instance;
    return NVML_SUCCESS;
}

/* --- events (XIDs) -------------------------------------------------------------------------------------------- */

API nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    struct event_set *s = calloc(1, sizeof *s);
    if (!s || (n_xids && !(s->delivered = calloc(n_xids, 1)))) {
        free(s);
        return NVML_ERROR_MEMORY;
    }
    *set = s;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *types) {
    const struct segment *s;
    nvmlReturn_t rc = state(d, &s);
    if (rc) return rc;
    if (!types) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->parent >= 0) return NVML_ERROR_NOT_SUPPORTED;
    *types = EVENT_XID;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t set) {
    const struct segment *s;
    nvmlReturn_t rc = state(d, &s);
    if (rc) return rc;
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->parent >= 0 || (types & ~EVENT_XID)) return NVML_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&lock);
    set->registered[d - devices] = (types & EVENT_XID) != 0;
    pthread_mutex_unlock(&lock);
    return NVML_SUCCESS;
}

static int next_event(nvmlEventSet_t set, nvmlEventData_t *data) {
    double now = sim_now();
    int found = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < n_xids && !found; i++) {
        const struct device *d = &devices[xids[i].device];
        int gpu = d->parent >= 0 ? d->parent : xids[i].device;
        if (set->delivered[i] || !set->registered[gpu] || xids[i].t > now) continue;
        set->delivered[i] = 1;
        data->device = &devices[gpu];
        data->eventType = EVENT_XID;
        data->eventData = xids[i].code;
        data->gpuInstanceId = d->parent >= 0 ? d->gpu_instance : NO_INSTANCE;
        data->computeInstanceId = d->parent >= 0 ? 0 : NO_INSTANCE;
        found = 1;
    }
    pthread_mutex_unlock(&lock);
    return found;
}

API nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    if (!set || !data) return NVML_ERROR_INVALID_ARGUMENT;
    if (next_event(set, data)) return NVML_SUCCESS;
    if (timeout_ms) {
        struct timespec ts = {timeout_ms / 1000, (timeout_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        if (next_event(set, data)) return NVML_SUCCESS;
    }
    return NVML_ERROR_TIMEOUT;
}

API nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    return nvmlEventSetWait_v2(set, data, timeout_ms);
}

API nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    free(set->delivered);
    free(set);
    return NVML_SUCCESS;
}
