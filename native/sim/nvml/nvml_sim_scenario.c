/* The simulated libnvidia-ml.so.1's scenario file (format: the top of nvml_sim.c) and its clock. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nvml_sim.h"

static const char *const FIELD_NAMES[N_FIELDS] = {
    "gpu_util", "mem_util", "mem_used", "sm_clock", "mem_clock", "power", "power_limit", "temp", "pcie_tx",
    "pcie_rx", "clock_events",
};

struct device devices[MAX_DEVICES];
int n_devices, n_gpus;
int gpu_order[MAX_DEVICES];
struct xid_event *xids;
int n_xids;
char driver_version[80] = "fleetprof (simulated)";
long long start_ns = -1;
long long base_realtime_ns;
long long proc_sample_ms = 1000;
int init_error;
static long long base_monotonic_ns;

/* --- the scenario file --------------------------------------------------------------------------------------- */

static int fail_line(const char *path, int line, const char *what, const char *detail) {
    fprintf(stderr, "fleetprof simulated NVML: %s:%d: %s%s%s\n", path, line, what, detail ? ": " : "",
            detail ? detail : "");
    return -1;
}

static int parse_value(const char *text, long long *out) {
    if (strcmp(text, "na") == 0) {
        *out = VALUE_NA;
        return 0;
    }
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 0);
    if (errno || end == text || *end || v < 0) return -1;
    *out = v;
    return 0;
}

static int find_device(const char *key) {
    for (int i = 0; i < n_devices; i++)
        if (strcmp(devices[i].key, key) == 0) return i;
    return -1;
}

static void label_simulated(char *text, size_t size) {
    if (!strstr(text, "simulated")) strncat(text, " (simulated)", size - strlen(text) - 1);
}

static int parse_device(char *rest, const char *path, int line) {
    if (n_devices == MAX_DEVICES) return fail_line(path, line, "too many devices", NULL);
    struct device *d = &devices[n_devices];
    memset(d, 0, sizeof *d);
    d->parent = -1;
    d->power_limit = VALUE_NA;
    long long gi = -1;
    char *name = strstr(rest, "name=");
    if (!name) return fail_line(path, line, "device needs name=", NULL);
    *name = 0;
    snprintf(d->name, sizeof d->name, "%s", name + 5);
    d->name[strcspn(d->name, "\r\n")] = 0;
    label_simulated(d->name, sizeof d->name);
    char *save, *tok = strtok_r(rest, " \t\r\n", &save);
    if (!tok) return fail_line(path, line, "device needs a key", NULL);
    if (find_device(tok) >= 0) return fail_line(path, line, "device defined twice", tok);
    snprintf(d->key, sizeof d->key, "%s", tok);
    while ((tok = strtok_r(NULL, " \t\r\n", &save))) {
        char *eq = strchr(tok, '=');
        if (!eq) return fail_line(path, line, "expected name=value", tok);
        *eq = 0;
        const char *val = eq + 1;
        long long n;
        if (strcmp(tok, "uuid") == 0) {
            snprintf(d->uuid, sizeof d->uuid, "%s", val);
        } else if (strcmp(tok, "parent") == 0) {
            d->parent = find_device(val);
            if (d->parent < 0 || devices[d->parent].parent >= 0)
                return fail_line(path, line, "parent must be a GPU defined earlier", val);
        } else if (parse_value(val, &n) < 0) {
            return fail_line(path, line, "not a number", val);
        } else if (strcmp(tok, "memory_total") == 0) {
            d->memory_total = n == VALUE_NA ? 0 : (unsigned long long)n;
        } else if (strcmp(tok, "power_limit") == 0) {
            d->power_limit = n;
        } else if (strcmp(tok, "gi") == 0) {
            gi = n;
        } else {
            return fail_line(path, line, "unknown device setting", tok);
        }
    }
    if (!d->uuid[0]) return fail_line(path, line, "device needs uuid=", NULL);
    if (d->parent >= 0) {
        struct device *p = &devices[d->parent];
        if (p->n_children == MAX_MIG_SLOTS) return fail_line(path, line, "too many MIG devices", NULL);
        d->index = p->n_children;
        d->gpu_instance = gi >= 0 ? (unsigned int)gi : (unsigned int)p->n_children + 1;
        p->children[p->n_children++] = n_devices;
    } else {
        d->index = n_gpus;
        gpu_order[n_gpus++] = n_devices;
    }
    d->segs = calloc(1, sizeof *d->segs);
    if (!d->segs) return fail_line(path, line, "out of memory", NULL);
    d->segs[0].t = -INFINITY;
    for (int f = 0; f < N_FIELDS; f++) d->segs[0].v[f] = VALUE_NA;
    d->segs[0].v[F_POWER_LIMIT] = d->power_limit;
    d->n_segs = 1;
    n_devices++;
    return 0;
}

static int parse_procs(struct segment *s, const char *val, const char *path, int line) {
    free(s->procs);
    s->procs = NULL;
    s->n_procs = 0;
    if (strcmp(val, "none") == 0) return 0;
    char *copy = strdup(val), *save, *item;
    if (!copy) return fail_line(path, line, "out of memory", NULL);
    for (item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char parts[4][32];
        long long nums[4];
        int ok = sscanf(item, "%31[^:]:%31[^:]:%31[^:]:%31s", parts[0], parts[1], parts[2], parts[3]) == 4;
        for (int i = 0; ok && i < 4; i++)
            ok = parse_value(parts[i], &nums[i]) == 0 && (i > 0 || nums[0] > 0);
        if (!ok) {
            int rc = fail_line(path, line, "procs wants PID:SM:MEM:USED", item);
            free(copy);
            return rc;
        }
        struct proc *grown = realloc(s->procs, (s->n_procs + 1) * sizeof *grown);
        if (!grown) {
            free(copy);
            return fail_line(path, line, "out of memory", NULL);
        }
        s->procs = grown;
        s->procs[s->n_procs++] = (struct proc){(unsigned int)nums[0], nums[1], nums[2], nums[3]};
    }
    free(copy);
    return 0;
}

static int add_xids(int dev, double t, const char *val, const char *path, int line) {
    char *copy = strdup(val), *save, *item;
    if (!copy) return fail_line(path, line, "out of memory", NULL);
    for (item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        long long code;
        if (parse_value(item, &code) < 0 || code == VALUE_NA) {
            int rc = fail_line(path, line, "xid wants CODE[,CODE...]", item);
            free(copy);
            return rc;
        }
        struct xid_event *grown = realloc(xids, (n_xids + 1) * sizeof *grown);
        if (!grown) {
            free(copy);
            return fail_line(path, line, "out of memory", NULL);
        }
        xids = grown;
        xids[n_xids++] = (struct xid_event){dev, t, (unsigned long long)code};
    }
    free(copy);
    return 0;
}

static int parse_at(char *rest, const char *path, int line) {
    char *save, *tok = strtok_r(rest, " \t\r\n", &save);
    char *end;
    double t = tok ? strtod(tok, &end) : 0;
    if (!tok || *end || !isfinite(t)) return fail_line(path, line, "at wants SECONDS KEY FIELD=VALUE...", NULL);
    tok = strtok_r(NULL, " \t\r\n", &save);
    int dev = tok ? find_device(tok) : -1;
    if (dev < 0) return fail_line(path, line, "unknown device", tok);
    struct device *d = &devices[dev];
    struct segment *prev = &d->segs[d->n_segs - 1];
    if (t < prev->t) return fail_line(path, line, "at lines of a device must come in ascending time", NULL);
    struct segment *grown = realloc(d->segs, (d->n_segs + 1) * sizeof *grown);
    if (!grown) return fail_line(path, line, "out of memory", NULL);
    d->segs = grown;
    prev = &d->segs[d->n_segs - 1];
    struct segment *s = &d->segs[d->n_segs];
    *s = *prev;
    s->t = t;
    s->procs = NULL;
    if (prev->n_procs) {
        s->procs = malloc(prev->n_procs * sizeof *s->procs);
        if (!s->procs) return fail_line(path, line, "out of memory", NULL);
        memcpy(s->procs, prev->procs, prev->n_procs * sizeof *s->procs);
    }
    d->n_segs++;
    while ((tok = strtok_r(NULL, " \t\r\n", &save))) {
        char *eq = strchr(tok, '=');
        if (!eq) return fail_line(path, line, "expected FIELD=VALUE", tok);
        *eq = 0;
        const char *val = eq + 1;
        long long n;
        int f;
        for (f = 0; f < N_FIELDS && strcmp(tok, FIELD_NAMES[f]) != 0; f++) {
        }
        if (f < N_FIELDS) {
            if (parse_value(val, &n) < 0) return fail_line(path, line, "not a number", val);
            s->v[f] = n;
        } else if (strcmp(tok, "procs") == 0) {
            if (parse_procs(s, val, path, line) < 0) return -1;
        } else if (strcmp(tok, "xid") == 0) {
            if (add_xids(dev, t, val, path, line) < 0) return -1;
        } else if (strcmp(tok, "lost") == 0 || strcmp(tok, "hang") == 0) {
            if (strcmp(val, "0") != 0 && strcmp(val, "1") != 0) return fail_line(path, line, "wants 0 or 1", tok);
            *(tok[0] == 'l' ? &s->lost : &s->hang) = val[0] == '1';
        } else {
            return fail_line(path, line, "unknown field", tok);
        }
    }
    return 0;
}

int load_scenario(void) {
    const char *path = getenv("FLEETPROF_NVML_SIM_SCENARIO");
    if (!path || !*path) {
        fprintf(stderr, "fleetprof simulated NVML: FLEETPROF_NVML_SIM_SCENARIO names no scenario file\n");
        return -1;
    }
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "fleetprof simulated NVML: cannot read %s: %s\n", path, strerror(errno));
        return -1;
    }
    char *buf = NULL;
    size_t cap = 0;
    int line = 0, rc = 0;
    while (rc == 0 && getline(&buf, &cap, f) >= 0) {
        line++;
        char *p = buf + strspn(buf, " \t");
        if (*p == '#' || *p == '\n' || *p == '\r' || !*p) continue;
        size_t word = strcspn(p, " \t\r\n");
        char *rest = p + word + strspn(p + word, " \t");
        long long n;
        char value[32] = "";
        sscanf(rest, "%31s", value);
        if (word == 6 && strncmp(p, "device", 6) == 0) {
            rc = parse_device(rest, path, line);
        } else if (word == 2 && strncmp(p, "at", 2) == 0) {
            rc = parse_at(rest, path, line);
        } else if (word == 6 && strncmp(p, "driver", 6) == 0) {
            snprintf(driver_version, sizeof driver_version - 13, "%s", rest);
            driver_version[strcspn(driver_version, "\r\n")] = 0;
            label_simulated(driver_version, sizeof driver_version);
        } else if (word == 8 && strncmp(p, "start_ns", 8) == 0) {
            if (parse_value(value, &n) < 0 || n == VALUE_NA) rc = fail_line(path, line, "not a time", value);
            start_ns = n;
        } else if (word == 14 && strncmp(p, "proc_sample_ms", 14) == 0) {
            if (parse_value(value, &n) < 0 || n <= 0) rc = fail_line(path, line, "not a period", value);
            proc_sample_ms = n;
        } else if (word == 10 && strncmp(p, "init_error", 10) == 0) {
            if (parse_value(value, &n) < 0 || n <= 0) rc = fail_line(path, line, "not an NVML code", value);
            init_error = (int)n;
        } else {
            p[word] = 0;
            rc = fail_line(path, line, "unknown directive", p);
        }
    }
    free(buf);
    fclose(f);
    return rc;
}

/* --- scenario time -------------------------------------------------------------------------------------------- */

static long long clock_ns(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void start_clock(void) {
    base_monotonic_ns = clock_ns(CLOCK_MONOTONIC);
    base_realtime_ns = start_ns >= 0 ? start_ns : clock_ns(CLOCK_REALTIME);
}

double sim_now(void) {
    if (start_ns >= 0) return (clock_ns(CLOCK_REALTIME) - start_ns) / 1e9;
    return (clock_ns(CLOCK_MONOTONIC) - base_monotonic_ns) / 1e9;
}

void sleep_until(double t) {
    long long ns = start_ns >= 0 ? start_ns + (long long)(t * 1e9) : base_monotonic_ns + (long long)(t * 1e9);
    struct timespec ts = {ns / 1000000000LL, ns % 1000000000LL};
    while (clock_nanosleep(start_ns >= 0 ? CLOCK_REALTIME : CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

int segment_at(const struct device *d, double t) {
    int i = d->n_segs - 1;
    while (i > 0 && d->segs[i].t > t) i--;
    return i;
}
