/* Per-thread launch rate limit shared by the CUPTI shim and the GPU simulator, so both sample launches alike.
 *
 * Each thread keeps its own state (no locks, no shared cache lines). A launch is sampled with probability p, where p
 * is set once per window (100 ms) from the previous window's launch count so that about `rate` launches per second
 * are sampled; a hard cap of twice that per window bounds a sudden burst. A sampled launch carries the weight
 * 1 + (launches skipped since the previous sampled one), so the weights of a thread add up to its launch count
 * exactly, less the skips still pending (`skipped`).
 *
 * Why random and not every n-th launch: training loops are periodic, so a fixed stride can keep sampling the same
 * kernel of each step. With independent draws the gap before a sampled launch does not depend on which launch ends
 * it, so every launch's expected attributed weight is 1: per-stack totals are unbiased, not only the grand total.
 *
 * The caller reads the clock and holds the state; `fleetprof_ratelimit_take` is pure arithmetic, so a test can drive
 * it with a synthetic clock.
 */
#ifndef FLEETPROF_RATELIMIT_H
#define FLEETPROF_RATELIMIT_H

#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#define FLEETPROF_LAUNCH_RATE_ENV "FLEETPROF_LAUNCH_RATE" /* sampled launches per second per thread; 0: all */
#define FLEETPROF_LAUNCH_RATE_DEFAULT 1000u
#define FLEETPROF_RATELIMIT_WINDOW_NS 100000000ull
#define FLEETPROF_RATELIMIT_ALWAYS (1ull << 32) /* threshold meaning p = 1 */

typedef struct {
    uint64_t window_start_ns;
    uint64_t rng;             /* xorshift64 state; 0 until the first call seeds it */
    uint64_t threshold;       /* P(sample) * 2^32 for this window */
    uint32_t window_launches; /* launches seen in this window */
    uint32_t window_sampled;  /* launches sampled in this window (for the cap) */
    uint32_t skipped;         /* skipped since the last sampled launch: carried by the next one */
} fleetprof_ratelimit_t;

/* FLEETPROF_LAUNCH_RATE as a number, or the default when unset or not a number. */
static inline uint32_t fleetprof_launch_rate_from_env(void)
{
    const char *text = getenv(FLEETPROF_LAUNCH_RATE_ENV);
    if (text == NULL || *text == '\0')
        return FLEETPROF_LAUNCH_RATE_DEFAULT;
    char *end = NULL;
    unsigned long long value = strtoull(text, &end, 10);
    if (*end != '\0' || value > UINT32_MAX)
        return FLEETPROF_LAUNCH_RATE_DEFAULT;
    return (uint32_t)value;
}

/* A cheap monotonic clock for the windows: the coarse clock is a vDSO read, and 100 ms windows need no more. */
static inline uint64_t fleetprof_ratelimit_clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t fleetprof_ratelimit_next(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    return x;
}

/* Start a new window: p = launches the rate allows in the elapsed time / launches seen in it (at most 1). */
static inline void fleetprof_ratelimit_roll(fleetprof_ratelimit_t *rl, uint32_t rate, uint64_t now_ns)
{
    uint64_t elapsed = now_ns - rl->window_start_ns;
    if (elapsed > 10ull * 1000000000ull)
        elapsed = 10ull * 1000000000ull; /* after a long idle spell p is 1 anyway; keeps the product in range */
    uint64_t allowed = (uint64_t)rate * elapsed / 1000000000ull;
    if (allowed == 0)
        allowed = 1;
    if (rl->window_launches <= allowed)
        rl->threshold = FLEETPROF_RATELIMIT_ALWAYS;
    else
        rl->threshold = (allowed << 32) / rl->window_launches;
    rl->window_start_ns = now_ns;
    rl->window_launches = 0;
    rl->window_sampled = 0;
}

/* The weight of this launch: 0 when it is skipped, else how many launches it stands for (itself included).
 * `seed` seeds the thread's generator on its first call (any value; 0 is mapped to 1). */
static inline uint32_t fleetprof_ratelimit_take(fleetprof_ratelimit_t *rl, uint32_t rate, uint64_t now_ns,
                                                uint64_t seed)
{
    if (rate == 0) {
        uint32_t weight = rl->skipped + 1;
        rl->skipped = 0;
        return weight;
    }
    if (rl->rng == 0) {
        rl->rng = seed ? seed : 1;
        rl->threshold = FLEETPROF_RATELIMIT_ALWAYS;
        rl->window_start_ns = now_ns;
    }
    if (now_ns < rl->window_start_ns)
        rl->window_start_ns = now_ns; /* a caller's clock went back: start the window again */
    if (now_ns - rl->window_start_ns >= FLEETPROF_RATELIMIT_WINDOW_NS)
        fleetprof_ratelimit_roll(rl, rate, now_ns);
    rl->window_launches++;
    uint64_t cap = 2ull * rate * FLEETPROF_RATELIMIT_WINDOW_NS / 1000000000ull;
    if (cap < 2)
        cap = 2;
    int take = rl->window_sampled < cap && (fleetprof_ratelimit_next(&rl->rng) >> 32) < rl->threshold;
    if (take || rl->skipped == UINT32_MAX - 1) {
        uint32_t weight = rl->skipped + 1;
        rl->skipped = 0;
        rl->window_sampled++;
        return weight;
    }
    rl->skipped++;
    return 0;
}

#endif
