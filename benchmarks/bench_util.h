/*
 * What every benchmark program here needs: a monotonic clock, medians, and the driver choice
 * (the real libcuda.so.1 when it loads, else the cudaemu built beside the benchmarks).
 */
#ifndef XSEG_BENCH_UTIL_H
#define XSEG_BENCH_UTIL_H

#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#ifndef BENCH_CUDAEMU
#define BENCH_CUDAEMU "" /* meson passes the built cudaemu's path */
#endif

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median of @p n values (sorts them in place). */
static inline double bench_median(double *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_double);
    return v[n / 2];
}

/* Unless $XSEG_LIBCUDA names a driver or libcuda.so.1 loads, point XSEG_LIBCUDA at the emulator
 * built here, saying so on stderr under @p prog's name. */
static inline void bench_find_driver(const char *prog)
{
    if (getenv("XSEG_LIBCUDA"))
        return;
    void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (h) {
        dlclose(h);
        return;
    }
    if (BENCH_CUDAEMU[0] && access(BENCH_CUDAEMU, R_OK) == 0) {
        setenv("XSEG_LIBCUDA", BENCH_CUDAEMU, 1);
        fprintf(stderr, "%s: no GPU driver found, using the emulator (cudaemu)\n", prog);
    }
}

/* A comma-separated list of whole numbers into @p v (at most @p max): how many were read. */
static inline size_t bench_parse_list(const char *s, size_t *v, size_t max)
{
    size_t n = 0;
    while (*s && n < max) {
        char *end;
        v[n++] = strtoull(s, &end, 10);
        s = *end == ',' ? end + 1 : end;
        if (end == s && *s != ',')
            break;
    }
    return n;
}

/* Every thread count from 1 to 64; else @p prog's message on stderr and false. */
static inline bool bench_threads_ok(const char *prog, const size_t *threads, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (threads[i] < 1 || threads[i] > 64) {
            fprintf(stderr, "%s: --threads takes 1 to 64\n", prog);
            return false;
        }
    return true;
}

#endif
