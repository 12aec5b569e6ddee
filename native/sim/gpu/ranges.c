/* The simulator's NVTX push/pop ranges, kept per thread as the CUPTI shim keeps them (native/cupti_shim/nvtx.c), so
 * a sampled launch's launch_range path follows the same format rules (native/include/fleetprof_probes.h): root
 * first, FLEETPROF_RANGE_SEP between ranges, a non-default domain's range as "domain:name", at most
 * FLEETPROF_RANGE_PATH_MAX bytes with the NUL (a longer path is cut to end in "..."), and a range pushed while no
 * agent was attached as FLEETPROF_RANGE_BEFORE_ATTACH (the shim receives NVTX calls only once attached). Ranges
 * deeper than GPUSIM_RANGE_DEPTH_MAX are counted, not named: the path then ends in "...". Everything is simulated.
 */
#include "fleetprof_probes.h"
#include "gpusim.h"
#include "gpusim_internal.h"

#include <string.h>

#define ELEMENT_MAX 256 /* bytes of one range's text kept, with the NUL */
#define CUT_MARK "..."

struct gpusim_range_counters gpusim_range_counters;

static __thread char stack[GPUSIM_RANGE_DEPTH_MAX][ELEMENT_MAX];
static __thread uint32_t depth;    /* ranges kept */
static __thread uint32_t too_deep; /* pushed beyond the kept ones, popped first */

static void push(const char *domain, const char *name)
{
    if (depth == GPUSIM_RANGE_DEPTH_MAX) {
        too_deep++;
        atomic_fetch_add(&gpusim_range_counters.too_deep, 1);
        return;
    }
    char *out = stack[depth++];
    if (!gpusim_agent_attached())
        domain = NULL, name = FLEETPROF_RANGE_BEFORE_ATTACH;
    else if (name == NULL)
        name = "[unnamed range]";
    size_t n = 0;
    if (domain != NULL && *domain != '\0') {
        size_t d = strnlen(domain, ELEMENT_MAX - 2);
        memcpy(out, domain, d);
        out[d] = ':';
        n = d + 1;
    }
    size_t m = strnlen(name, ELEMENT_MAX - 1 - n);
    memcpy(out + n, name, m);
    out[n + m] = '\0';
}

GPUSIM_API void gpusim_range_push(const char *name)
{
    push(NULL, name);
}

GPUSIM_API void gpusim_range_push_domain(const char *domain, const char *name)
{
    push(domain, name);
}

GPUSIM_API int gpusim_range_pop(void)
{
    if (too_deep) {
        too_deep--;
    } else if (depth) {
        depth--;
    } else {
        atomic_fetch_add(&gpusim_range_counters.pops_unmatched, 1);
        return -1;
    }
    return (int)(depth + too_deep);
}

int gpusim_range_path(char *out, int *cut)
{
    *cut = 0;
    out[0] = '\0';
    if (depth == 0 && too_deep == 0)
        return 0;
    size_t n = 0;
    const size_t room = GPUSIM_RANGE_MAX - 1; /* bytes of text, the NUL after */
    for (uint32_t i = 0; i < depth && !*cut; i++) {
        const char *parts[2] = {i ? FLEETPROF_RANGE_SEP : "", stack[i]};
        for (int p = 0; p < 2 && !*cut; p++) {
            size_t len = strlen(parts[p]);
            if (n + len > room) {
                len = room - n;
                *cut = 1;
            }
            memcpy(out + n, parts[p], len);
            n += len;
        }
    }
    if (too_deep && !*cut) {
        /* deeper ranges are not named: the path is known to go on */
        *cut = 1;
        const char *more = FLEETPROF_RANGE_SEP CUT_MARK;
        size_t len = strlen(more);
        if (n + len <= room) {
            memcpy(out + n, more, len);
            n += len;
            out[n] = '\0';
            return 1;
        }
    }
    if (*cut) {
        if (n > room - (sizeof(CUT_MARK) - 1))
            n = room - (sizeof(CUT_MARK) - 1);
        memcpy(out + n, CUT_MARK, sizeof(CUT_MARK) - 1);
        n += sizeof(CUT_MARK) - 1;
    }
    out[n] = '\0';
    return 1;
}
