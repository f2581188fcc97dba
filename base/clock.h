/*
 * The clocks, in one place: monotonic time for intervals and timed waits, the wall clock for
 * timestamps a user reads (history's events) and for pthread_mutex_timedlock, whose deadline is
 * CLOCK_REALTIME. Header-only; clock_gettime on these clocks does not fail on Linux.
 */
#ifndef XSEG_BASE_CLOCK_H
#define XSEG_BASE_CLOCK_H

#include <stdint.h>
#include <time.h>

/* @p clk's time in nanoseconds. */
static inline int64_t clock_ns(clockid_t clk)
{
    struct timespec ts;
    clock_gettime(clk, &ts);
    return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

/* Monotonic time, for intervals and deadlines. */
static inline int64_t clock_mono_ns(void) { return clock_ns(CLOCK_MONOTONIC); }
static inline int64_t clock_mono_us(void) { return clock_mono_ns() / 1000; }
/* Wall-clock time in microseconds since the epoch (timestamps). */
static inline int64_t clock_real_us(void) { return clock_ns(CLOCK_REALTIME) / 1000; }

/* The absolute time @p ns nanoseconds from now on @p clk, as the timed waits take it
 * (pthread_cond_timedwait on a CLOCK_MONOTONIC condition, pthread_mutex_timedlock on
 * CLOCK_REALTIME). */
static inline struct timespec clock_deadline(clockid_t clk, int64_t ns)
{
    int64_t at = clock_ns(clk) + ns;
    struct timespec ts = {.tv_sec = (time_t)(at / 1000000000ll), .tv_nsec = (long)(at % 1000000000ll)};
    return ts;
}

#endif
