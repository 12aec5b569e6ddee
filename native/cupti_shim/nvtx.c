/* NVTX ranges: libfleetprof_cupti.so is also an NVTX injection library. With NVTX_INJECTION64_PATH naming it, the
 * NVTX3 header-only library in the workload (PyTorch's emit_nvtx, Megatron, vLLM, nvtx3.hpp) calls
 * InitializeInjectionNvtx2 at its first NVTX call and the shim fills its core and domain function tables; the
 * innermost range path of the launching thread then goes with each sampled launch (launch_range, before
 * kernel_launch: launches.c). The NVTX ABI (export table, callback ids, nvtxEventAttributes_v2) is declared here, not
 * taken from the NVTX headers, so the shim builds from the CUDA wheels alone; tests/test_cupti_shim_nvtx.py checks
 * it against a program built with the real NVTX3 headers.
 *
 * Cost. With no agent attached (launch_range's semaphore 0) a push or pop is a load of the semaphore, a branch and
 * a change of the thread's depth counter, after one thread-local lookup (a call to __tls_get_addr in a dlopened
 * library); a start returns 0 and an end of 0 returns at once. Attached, a push also
 * copies its message (at most RANGE_TEXT_MAX - 1 bytes, a longer one cut to end in "..." and counted), so the path
 * survives the caller freeing its string, into the thread's stack of RANGE_DEPTH_MAX ranges (deeper ones are
 * counted, not named, and the path then ends in "...").
 *
 * The path (FLEETPROF_RANGE_PATH_MAX bytes with the NUL; cut: ends in "...", counted), root first, " > " between:
 * 1. the thread's push/pop ranges, outermost first; one stack per thread across domains (NVTX keeps one per domain:
 *    well-nested code pops the same ranges; interleaved domains that do not nest pop the innermost one here). A range
 *    pushed while no agent was attached is unknown: "[range before attach]".
 * 2. then the start/end ranges this thread started and nobody has ended yet, in the order they were started. A
 *    start/end range may end on any thread, but it belongs to the thread that started it: it is in the path of that
 *    thread's launches only. Started while no agent was attached: not known and not shown (unlike a push, nothing
 *    counts it). At most RANGE_STARTS_MAX per thread are kept; more, or a full process-wide table of open ones
 *    (OPEN_MAX), are counted as refused.
 * A range of a non-default domain is "domain:message"; a range without a message "[unnamed range]".
 */
#include "fleetprof_probes.h"
#include "shim.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <wchar.h>

#define SHIM_EXPORT __attribute__((visibility("default")))
#define RANGE_DEPTH_MAX 32
#define RANGE_TEXT_MAX 96
#define RANGE_STARTS_MAX 16
#define OPEN_BITS 10
#define OPEN_MAX (1u << OPEN_BITS)
#define DOMAINS_MAX 64
#define STRINGS_MAX 4096
#define BEFORE_ATTACH FLEETPROF_RANGE_BEFORE_ATTACH
#define UNNAMED "[unnamed range]"

/* ---- the NVTX ABI (nvtx3/nvtxDetail/nvtxTypes.h, nvToolsExt.h) ---- */
typedef void (*nvtx_function)(void);
typedef nvtx_function **nvtx_function_table;
struct nvtx_callbacks {
    size_t struct_size;
    int (*get_module_function_table)(int module, nvtx_function_table *out_table, unsigned int *out_size);
};
typedef const void *(*nvtx_get_export_table)(uint32_t table_id);
struct nvtx_attributes { /* nvtxEventAttributes_v2 */
    uint16_t version;
    uint16_t size;
    uint32_t category;
    int32_t color_type;
    uint32_t color;
    int32_t payload_type;
    int32_t reserved0;
    uint64_t payload;
    int32_t message_type; /* 1 ASCII, 2 UNICODE, 3 REGISTERED */
    const void *message;
};
_Static_assert(offsetof(struct nvtx_attributes, message) == 40, "nvtxEventAttributes_v2 layout");
#define NVTX_ETID_CALLBACKS 1
#define NVTX_MODULE_CORE 1
#define NVTX_MODULE_CORE2 5
enum { CORE_RANGE_START_EX = 4, CORE_RANGE_START_A, CORE_RANGE_START_W, CORE_RANGE_END, CORE_RANGE_PUSH_EX,
       CORE_RANGE_PUSH_A, CORE_RANGE_PUSH_W, CORE_RANGE_POP };
enum { CORE2_RANGE_START_EX = 2, CORE2_RANGE_END, CORE2_RANGE_PUSH_EX, CORE2_RANGE_POP,
       CORE2_REGISTER_STRING_A = 10, CORE2_REGISTER_STRING_W, CORE2_CREATE_A, CORE2_CREATE_W };

/* ---- domains and registered strings: created whether or not an agent is attached, kept for the process ---- */
struct domain {
    char name[RANGE_TEXT_MAX];
};
struct string {
    char text[RANGE_TEXT_MAX];
};
static struct domain domains[DOMAINS_MAX];
static _Atomic uint32_t domain_count;
static struct domain domain_overflow = {"[domain]"};
static struct string strings[STRINGS_MAX]; /* untouched pages cost no memory */
static _Atomic uint32_t string_count;
static struct string string_overflow = {"[registered string]"};

/* ---- per thread ---- */
struct range {
    uint32_t epoch; /* nvtx_epoch when copied: another one means pushed while no agent was attached */
    const struct domain *domain;
    char text[RANGE_TEXT_MAX];
};
struct thread_ranges {
    struct range stack[RANGE_DEPTH_MAX];
    uint64_t starts[RANGE_STARTS_MAX]; /* ids of the start/end ranges this thread started, in order */
    uint32_t start_count;
};
struct nvtx_thread {
    uint32_t depth;                /* push/pop depth, counted whether attached or not */
    struct thread_ranges *ranges;  /* from the first range kept on this thread */
};
static __thread struct nvtx_thread me; /* one TLS lookup per call: in a dlopened library each is a call */
static _Atomic uint32_t nvtx_epoch = 1;
static pthread_key_t ranges_key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;

/* ---- open start/end ranges, process-wide: id = sequence << OPEN_BITS | slot; 0 = none ---- */
struct open_range {
    _Atomic uint64_t id;
    struct range range;
};
static struct open_range open_ranges[OPEN_MAX];
static _Atomic uint64_t start_sequence = 1;

void shim_nvtx_on(int on)
{
    /* at a detach, not an attach: ranges copied while attached are stale once nothing is kept (pushes and pops go
     * on uncopied), while those copied between the kernel raising the semaphore and the watcher's next poll are
     * right. A detach and attach within one poll interval go unnoticed: then a range pushed in between is shown
     * with the name its level had before. */
    if (!on)
        atomic_fetch_add(&nvtx_epoch, 1);
}

static void make_key(void)
{
    pthread_key_create(&ranges_key, free);
}

static struct thread_ranges *thread_ranges(struct nvtx_thread *t)
{
    if (__builtin_expect(t->ranges == NULL, 0)) {
        pthread_once(&key_once, make_key);
        t->ranges = calloc(1, sizeof(*t->ranges));
        if (t->ranges != NULL)
            pthread_setspecific(ranges_key, t->ranges);
    }
    return t->ranges;
}

static void copy_ascii(char *out, const char *text)
{
    if (text == NULL || *text == '\0') {
        memcpy(out, UNNAMED, sizeof(UNNAMED));
        return;
    }
    /* a byte loop, not strnlen and memcpy: messages are short, and a memcpy of a variable length starts slowly */
    for (size_t i = 0; i < RANGE_TEXT_MAX; i++)
        if ((out[i] = text[i]) == '\0')
            return;
    memcpy(out, text, RANGE_TEXT_MAX - 4);
    memcpy(out + RANGE_TEXT_MAX - 4, "...", 4);
    atomic_fetch_add_explicit(&shim_counters.nvtx_messages_cut, 1, memory_order_relaxed);
}

static void copy_wide(char *out, const wchar_t *text)
{
    char narrow[RANGE_TEXT_MAX + 1];
    size_t n = 0;
    for (; text != NULL && text[n] != 0 && n < RANGE_TEXT_MAX; n++)
        narrow[n] = text[n] > 0 && text[n] < 0x80 ? (char)text[n] : '?';
    narrow[n] = '\0';
    copy_ascii(out, narrow);
}

static void copy_attributes(char *out, const struct nvtx_attributes *a)
{
    if (a == NULL || a->size < sizeof(*a) || a->message == NULL)
        copy_ascii(out, NULL);
    else if (a->message_type == 1)
        copy_ascii(out, a->message);
    else if (a->message_type == 2)
        copy_wide(out, a->message);
    else if (a->message_type == 3)
        copy_ascii(out, ((const struct string *)a->message)->text);
    else
        copy_ascii(out, NULL);
}

/* Attached only: the message of the range at `level`, or NULL where it is too deep or there is no memory. */
static struct range *kept(struct nvtx_thread *me_, uint32_t level, const struct domain *domain)
{
    struct thread_ranges *t = thread_ranges(me_);
    if (level >= RANGE_DEPTH_MAX || t == NULL) {
        atomic_fetch_add_explicit(&shim_counters.nvtx_too_deep, 1, memory_order_relaxed);
        return NULL;
    }
    struct range *r = &t->stack[level];
    r->epoch = atomic_load_explicit(&nvtx_epoch, memory_order_relaxed);
    r->domain = domain;
    return r;
}

static int push_ascii(const char *message)
{
    struct nvtx_thread *t = &me;
    uint32_t level = t->depth++;
    if (FLEETPROF_ENABLED(launch_range)) {
        struct range *r = kept(t, level, NULL);
        if (r != NULL)
            copy_ascii(r->text, message);
    }
    return (int)level;
}

static int push_wide(const wchar_t *message)
{
    struct nvtx_thread *t = &me;
    uint32_t level = t->depth++;
    if (FLEETPROF_ENABLED(launch_range)) {
        struct range *r = kept(t, level, NULL);
        if (r != NULL)
            copy_wide(r->text, message);
    }
    return (int)level;
}

static int domain_push(const struct domain *domain, const struct nvtx_attributes *attributes)
{
    struct nvtx_thread *t = &me;
    uint32_t level = t->depth++;
    if (FLEETPROF_ENABLED(launch_range)) {
        struct range *r = kept(t, level, domain);
        if (r != NULL)
            copy_attributes(r->text, attributes);
    }
    return (int)level;
}

static int push_ex(const struct nvtx_attributes *attributes)
{
    return domain_push(NULL, attributes);
}

static int pop(void)
{
    struct nvtx_thread *t = &me;
    if (__builtin_expect(t->depth == 0, 0)) {
        atomic_fetch_add_explicit(&shim_counters.nvtx_pops_unmatched, 1, memory_order_relaxed);
        return -1;
    }
    return (int)--t->depth;
}

static int domain_pop(const struct domain *domain)
{
    (void)domain;
    return pop();
}

/* ---- start/end ---- */

/* Forgets the start/end ranges of this thread that have ended. */
static void prune(struct thread_ranges *t)
{
    uint32_t still = 0;
    for (uint32_t i = 0; i < t->start_count; i++)
        if (atomic_load_explicit(&open_ranges[t->starts[i] & (OPEN_MAX - 1)].id, memory_order_acquire) == t->starts[i])
            t->starts[still++] = t->starts[i];
    t->start_count = still;
}

static uint64_t domain_start(const struct domain *domain, const struct nvtx_attributes *attributes,
                             const char *ascii, const wchar_t *wide)
{
    if (!FLEETPROF_ENABLED(launch_range))
        return 0;
    struct thread_ranges *t = thread_ranges(&me);
    uint64_t sequence = atomic_fetch_add_explicit(&start_sequence, 1, memory_order_relaxed);
    for (uint32_t probe = 0; t != NULL && probe < 8; probe++) {
        uint32_t slot = (uint32_t)(sequence + probe) & (OPEN_MAX - 1);
        uint64_t expected = 0, id = sequence << OPEN_BITS | slot;
        if (!atomic_compare_exchange_strong(&open_ranges[slot].id, &expected, id))
            continue;
        struct range *r = &open_ranges[slot].range;
        r->epoch = atomic_load_explicit(&nvtx_epoch, memory_order_relaxed);
        r->domain = domain;
        if (attributes != NULL)
            copy_attributes(r->text, attributes);
        else if (wide != NULL)
            copy_wide(r->text, wide);
        else
            copy_ascii(r->text, ascii);
        if (t->start_count == RANGE_STARTS_MAX)
            prune(t); /* ranges started and ended between two sampled launches */
        if (t->start_count < RANGE_STARTS_MAX)
            t->starts[t->start_count++] = id;
        else
            atomic_fetch_add_explicit(&shim_counters.nvtx_starts_refused, 1, memory_order_relaxed);
        return id;
    }
    atomic_fetch_add_explicit(&shim_counters.nvtx_starts_refused, 1, memory_order_relaxed);
    return 0;
}

static uint64_t start_ex(const struct nvtx_attributes *a) { return domain_start(NULL, a, NULL, NULL); }
static uint64_t start_ascii(const char *m) { return domain_start(NULL, NULL, m, NULL); }
static uint64_t start_wide(const wchar_t *m) { return domain_start(NULL, NULL, NULL, m); }
static uint64_t domain_start_ex(const struct domain *d, const struct nvtx_attributes *a)
{
    return domain_start(d, a, NULL, NULL);
}

static void end(uint64_t id)
{
    if (id == 0)
        return;
    uint64_t expected = id;
    atomic_compare_exchange_strong(&open_ranges[id & (OPEN_MAX - 1)].id, &expected, 0);
}

static void domain_end(const struct domain *domain, uint64_t id)
{
    (void)domain;
    end(id);
}

/* ---- domains and strings ---- */

static struct domain *domain_create_ascii(const char *name)
{
    uint32_t i = atomic_fetch_add(&domain_count, 1);
    if (i >= DOMAINS_MAX)
        return &domain_overflow;
    copy_ascii(domains[i].name, name);
    return &domains[i];
}

static struct domain *domain_create_wide(const wchar_t *name)
{
    uint32_t i = atomic_fetch_add(&domain_count, 1);
    if (i >= DOMAINS_MAX)
        return &domain_overflow;
    copy_wide(domains[i].name, name);
    return &domains[i];
}

static struct string *register_ascii(const struct domain *domain, const char *text)
{
    (void)domain;
    uint32_t i = atomic_fetch_add(&string_count, 1);
    if (i >= STRINGS_MAX)
        return &string_overflow;
    copy_ascii(strings[i].text, text);
    return &strings[i];
}

static struct string *register_wide(const struct domain *domain, const wchar_t *text)
{
    (void)domain;
    uint32_t i = atomic_fetch_add(&string_count, 1);
    if (i >= STRINGS_MAX)
        return &string_overflow;
    copy_wide(strings[i].text, text);
    return &strings[i];
}

/* ---- the path ---- */

struct path {
    char *out;
    size_t used; /* bytes written, without the NUL */
    int cut;
};

static void append(struct path *p, const char *text)
{
    /* a byte loop: the pieces are short, and strlen + memcpy of a variable length cost more than the copy */
    size_t room = FLEETPROF_RANGE_PATH_MAX - 1 - p->used, i = 0;
    char *out = p->out + p->used;
    for (; text[i] != '\0' && i < room; i++)
        out[i] = text[i];
    if (text[i] != '\0')
        p->cut = 1;
    p->used += i;
}

static void element(struct path *p, const struct range *r, uint32_t epoch)
{
    if (p->used > 0)
        append(p, FLEETPROF_RANGE_SEP);
    if (r == NULL || r->epoch != epoch) {
        append(p, BEFORE_ATTACH);
        return;
    }
    if (r->domain != NULL) {
        append(p, r->domain->name);
        append(p, ":");
    }
    append(p, r->text);
}

int shim_nvtx_path(char *out)
{
    uint32_t levels = me.depth;
    struct thread_ranges *t = me.ranges;
    if (levels == 0 && (t == NULL || t->start_count == 0))
        return 0;
    uint32_t epoch = atomic_load_explicit(&nvtx_epoch, memory_order_relaxed);
    struct path p = {out, 0, levels > RANGE_DEPTH_MAX};
    for (uint32_t i = 0; i < levels && i < RANGE_DEPTH_MAX; i++)
        element(&p, t != NULL ? &t->stack[i] : NULL, epoch);
    uint32_t still = 0;
    for (uint32_t i = 0; t != NULL && i < t->start_count; i++) {
        uint64_t id = t->starts[i];
        struct open_range *o = &open_ranges[id & (OPEN_MAX - 1)];
        if (atomic_load_explicit(&o->id, memory_order_acquire) != id)
            continue; /* ended: forgotten */
        struct range copy = o->range;
        if (atomic_load_explicit(&o->id, memory_order_acquire) != id)
            continue; /* ended while read */
        copy.text[RANGE_TEXT_MAX - 1] = '\0';
        element(&p, &copy, epoch);
        t->starts[still++] = id;
    }
    if (t != NULL)
        t->start_count = still;
    if (p.used == 0)
        return 0;
    if (p.cut) {
        size_t at = p.used < FLEETPROF_RANGE_PATH_MAX - 4 ? p.used : FLEETPROF_RANGE_PATH_MAX - 4;
        memcpy(out + at, "...", 3);
        p.used = at + 3;
        atomic_fetch_add_explicit(&shim_counters.nvtx_paths_cut, 1, memory_order_relaxed);
    }
    out[p.used] = '\0';
    atomic_fetch_add_explicit(&shim_counters.launch_ranges, 1, memory_order_relaxed);
    return 1;
}

/* ---- the injection entry point ---- */

static void fill(nvtx_function_table table, unsigned int size, unsigned int id, nvtx_function fn)
{
    if (id < size && table[id] != NULL)
        *table[id] = fn;
}

#define FN(f) ((nvtx_function)(void (*)(void))(f))

/* Called by the NVTX3 library in the workload at its first NVTX call (NVTX_INJECTION64_PATH). 1: success. */
SHIM_EXPORT int InitializeInjectionNvtx2(nvtx_get_export_table get_export_table)
{
    const struct nvtx_callbacks *callbacks = get_export_table != NULL ? get_export_table(NVTX_ETID_CALLBACKS) : NULL;
    if (callbacks == NULL || callbacks->struct_size < sizeof(*callbacks))
        return 0;
    nvtx_function_table core = NULL, core2 = NULL;
    unsigned int core_size = 0, core2_size = 0;
    if (!callbacks->get_module_function_table(NVTX_MODULE_CORE, &core, &core_size) || core == NULL ||
        !callbacks->get_module_function_table(NVTX_MODULE_CORE2, &core2, &core2_size) || core2 == NULL)
        return 0;
    fill(core, core_size, CORE_RANGE_START_EX, FN(start_ex));
    fill(core, core_size, CORE_RANGE_START_A, FN(start_ascii));
    fill(core, core_size, CORE_RANGE_START_W, FN(start_wide));
    fill(core, core_size, CORE_RANGE_END, FN(end));
    fill(core, core_size, CORE_RANGE_PUSH_EX, FN(push_ex));
    fill(core, core_size, CORE_RANGE_PUSH_A, FN(push_ascii));
    fill(core, core_size, CORE_RANGE_PUSH_W, FN(push_wide));
    fill(core, core_size, CORE_RANGE_POP, FN(pop));
    fill(core2, core2_size, CORE2_RANGE_START_EX, FN(domain_start_ex));
    fill(core2, core2_size, CORE2_RANGE_END, FN(domain_end));
    fill(core2, core2_size, CORE2_RANGE_PUSH_EX, FN(domain_push));
    fill(core2, core2_size, CORE2_RANGE_POP, FN(domain_pop));
    fill(core2, core2_size, CORE2_REGISTER_STRING_A, FN(register_ascii));
    fill(core2, core2_size, CORE2_REGISTER_STRING_W, FN(register_wide));
    fill(core2, core2_size, CORE2_CREATE_A, FN(domain_create_ascii));
    fill(core2, core2_size, CORE2_CREATE_W, FN(domain_create_wide));
    return 1;
}
