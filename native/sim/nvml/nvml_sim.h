/* Shared by the simulated libnvidia-ml.so.1's translation units: the NVML ABI types it answers with (as nvml.h
 * lays them out; nvidia-ml-py's ctypes structures must match) and the scenario state the parser fills.
 * The scenario format is described at the top of nvml_sim.c. */
#ifndef FLEETPROF_NVML_SIM_H
#define FLEETPROF_NVML_SIM_H

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0, NVML_ERROR_UNINITIALIZED = 1, NVML_ERROR_INVALID_ARGUMENT = 2, NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4, NVML_ERROR_ALREADY_INITIALIZED = 5, NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7, NVML_ERROR_INSUFFICIENT_POWER = 8, NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10, NVML_ERROR_IRQ_ISSUE = 11, NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13, NVML_ERROR_CORRUPTED_INFOROM = 14, NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16, NVML_ERROR_OPERATING_SYSTEM = 17, NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_IN_USE = 19, NVML_ERROR_MEMORY = 20, NVML_ERROR_NO_DATA = 21,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25, NVML_ERROR_UNKNOWN = 999,
};

#define NVML_CLOCK_GRAPHICS 0
#define NVML_CLOCK_SM 1
#define NVML_CLOCK_MEM 2
#define NVML_CLOCK_VIDEO 3
#define NVML_TEMPERATURE_GPU 0
#define NVML_PCIE_UTIL_TX_BYTES 0
#define NVML_PCIE_UTIL_RX_BYTES 1
#define EVENT_XID 0x8ULL
#define MEMORY_V2 0x02000028u
#define TEMPERATURE_V1 0x0100000Cu
#define NO_INSTANCE 0xFFFFFFFFu
#define VALUE_NA (-1LL)
#define MAX_MIG_SLOTS 7
#define BUFFERED_TICKS 4

/* Sized as in nvml.h; checked by the binding's ctypes layouts. */
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned int version; int sensorType; int temperature; } nvmlTemperature_v1_t;
typedef struct {
    unsigned int pid; unsigned long long timeStamp; unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;
typedef struct {
    unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

enum field {
    F_GPU_UTIL, F_MEM_UTIL, F_MEM_USED, F_SM_CLOCK, F_MEM_CLOCK, F_POWER, F_POWER_LIMIT, F_TEMP, F_PCIE_TX,
    F_PCIE_RX, F_CLOCK_EVENTS, N_FIELDS
};

struct proc { unsigned int pid; long long sm, mem, used; };

struct segment {
    double t;
    long long v[N_FIELDS];
    struct proc *procs;
    int n_procs;
    int lost, hang;
};

struct device {
    char key[64], uuid[96], name[96];
    unsigned long long memory_total;
    long long power_limit;
    int parent;          /* index in devices[] of the GPU of a MIG device, -1 for a GPU */
    int index;           /* GPU: its NVML index; MIG device: its slot under the parent */
    unsigned int gpu_instance;
    int children[MAX_MIG_SLOTS], n_children;
    struct segment *segs; /* segs[0] is the implicit "nothing supported" state before the first `at` */
    int n_segs;
};
typedef struct device *nvmlDevice_t;

struct xid_event { int device; double t; unsigned long long code; };

struct event_set {
    unsigned char registered[64];
    unsigned char *delivered; /* per xid_event */
};
typedef struct event_set *nvmlEventSet_t;
typedef struct {
    nvmlDevice_t device; unsigned long long eventType, eventData; unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

#define MAX_DEVICES 64

/* The scenario (nvml_sim_scenario.c), read once by the first nvmlInit and constant afterwards. */
extern struct device devices[MAX_DEVICES];
extern int n_devices, n_gpus;
extern int gpu_order[MAX_DEVICES]; /* devices[] index of each GPU, by NVML index */
extern struct xid_event *xids;
extern int n_xids;
extern char driver_version[80];
extern long long start_ns;    /* -1: scenario time 0 is the first nvmlInit */
extern long long base_realtime_ns;
extern long long proc_sample_ms;
extern int init_error;

int load_scenario(void);             /* 0, or -1 after one line on stderr */
void start_clock(void);              /* scenario time 0 is now, unless the file set start_ns */
double sim_now(void);                /* scenario seconds */
void sleep_until(double t);          /* until scenario second t */
int segment_at(const struct device *d, double t); /* index in d->segs of the segment holding at t */

#endif
