/*
 * bench_history: what recording allocation history costs per allocation (docs/benchmarks-host.md#history).
 *
 *   bench_history [--pairs N] [--reps R] [--depth D] [--size BYTES] [--setting K]
 *
 * --setting K times only the Kth setting of the table (0: off): for callgrind, which counts the
 * instructions of a recorded allocation independently of the machine's load (run it at two pair
 * counts and divide the difference, as benchmarks/callgrind_pairs.sh does).
 * Times N cached malloc+free pairs (512 B, default stream) made D calls deep, with history off
 * and in several recording settings; the settings take turns within each repetition so drift
 * hits all alike, and each figure is the median of R repetitions. Every pair is one allocation,
 * so "per allocation" is the pair's time minus the pair's time with history off. Links the
 * shared libxseg, as a program would (its own frames are left out of C stacks).
 * Without a GPU it runs on the cudaemu built here.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "xseg.h"

#include "bench_util.h"

static void *volatile sink;
static size_t g_size = 512;

static int pairs(size_t n)
{
    for (size_t i = 0; i < n; i++) {
        void *p;
        if (xseg_malloc(&p, g_size, 0, NULL) != XSEG_SUCCESS) {
            fprintf(stderr, "bench_history: xseg_malloc: %s\n", xseg_last_error());
            return -1;
        }
        sink = p;
        xseg_free(p);
    }
    return 0;
}

/* The pairs, @p depth calls deep (each frame a real one: no tail call). */
__attribute__((noinline)) static int deep(int depth, size_t n)
{
    if (depth <= 0)
        return pairs(n);
    int r = deep(depth - 1, n);
    __asm__ volatile("" ::: "memory");
    return r;
}

/* A Python-like frame supplier: five fixed frames. */
static int frames_cb(xseg_frame *f, int max, void *user)
{
    (void)user;
    static const xseg_frame fr[5] = {
        {"model/attention.py", "forward", 88}, {"torch/nn/modules/module.py", "_call_impl", 1750},
        {"model/block.py", "forward", 41},     {"train.py", "step", 120},
        {"train.py", "<module>", 200},
    };
    int n = max < 5 ? max : 5;
    memcpy(f, fr, (size_t)n * sizeof *f);
    return n;
}

struct setting {
    const char *name;
    int enabled, stacks, max_frames;
    xseg_history_record record;
};

static const struct setting settings[] = {
    {"off", 0, 0, 0, XSEG_HISTORY_ALL},
    {"state only, no stacks", 1, XSEG_STACKS_NONE, 0, XSEG_HISTORY_STATE},
    {"all, no stacks", 1, XSEG_STACKS_NONE, 0, XSEG_HISTORY_ALL},
    {"all, callback (5 frames)", 1, XSEG_STACKS_CALLBACK, 0, XSEG_HISTORY_ALL},
    {"all, C frames (8)", 1, XSEG_STACKS_C, 8, XSEG_HISTORY_ALL},
    {"all, C frames (16, default)", 1, XSEG_STACKS_C, 16, XSEG_HISTORY_ALL},
    {"all, C frames (32)", 1, XSEG_STACKS_C, 32, XSEG_HISTORY_ALL},
    {"all, C (16) + callback", 1, XSEG_STACKS_C | XSEG_STACKS_CALLBACK, 16, XSEG_HISTORY_ALL},
};
#define NSET (sizeof settings / sizeof *settings)

static int apply(const struct setting *s)
{
    xseg_history_options o = {0};
    o.enabled = s->enabled;
    o.record = s->record;
    o.stacks = s->stacks;
    o.max_frames = s->max_frames;
    o.callback = frames_cb;
    o.clear = 1;
    if (xseg_record_memory_history(&o) != XSEG_SUCCESS) {
        fprintf(stderr, "bench_history: %s\n", xseg_last_error());
        return -1;
    }
    return 0;
}

static int usage(const char *why)
{
    fprintf(stderr, "bench_history: %s\nusage: bench_history [--pairs N] [--reps R] [--depth D] [--size BYTES]\n",
            why);
    return 2;
}

int main(int argc, char **argv)
{
    size_t n = 200000;
    int reps = 7, depth = 24, only = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("bench_history [--pairs N] [--reps R] [--depth D] [--size BYTES]\n"
                   "ns per cached malloc+free pair with allocation history off and recording, median of R.\n");
            return 0;
        }
        if (!v)
            return usage("an option lacks its value");
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (*end || errno || x < 0 || (x == 0 && strcmp(a, "--setting")))
            return usage("option values are positive numbers");
        if (!strcmp(a, "--pairs"))
            n = (size_t)x;
        else if (!strcmp(a, "--reps"))
            reps = (int)x;
        else if (!strcmp(a, "--depth"))
            depth = (int)x;
        else if (!strcmp(a, "--size"))
            g_size = (size_t)x;
        else if (!strcmp(a, "--setting") && x < (long long)NSET)
            only = (int)x;
        else
            return usage("unknown option");
        i++;
    }
    bench_find_driver("bench_history");
    if (xseg_init("expandable_segments:True") != XSEG_SUCCESS) {
        fprintf(stderr, "bench_history: %s\n", xseg_last_error());
        return 1;
    }
    double *v = calloc(NSET * (size_t)reps, sizeof *v);
    if (!v)
        return 1;
    for (size_t s = 0; s < NSET; s++) /* warm-up: segment, caches, libgcc's unwinder */
        if (apply(&settings[s]) || deep(depth, 2000))
            return 1;
    if (only >= 0) { /* one setting, no table */
        if (apply(&settings[only]) || deep(depth, n))
            return 1;
        printf("%s: %zu pairs\n", settings[only].name, n);
        return 0;
    }
    for (int r = 0; r < reps; r++) {
        for (size_t s = 0; s < NSET; s++) {
            if (apply(&settings[s]) || deep(depth, 1000))
                return 1;
            uint64_t t0 = now_ns();
            if (deep(depth, n))
                return 1;
            v[s * (size_t)reps + (size_t)r] = (double)(now_ns() - t0) / (double)n;
        }
    }
    apply(&settings[0]);
    /* What the machine charges for the two things every recorded allocation does besides the
     * stack: read the wall clock (one per alloc, one per free) and take an uncontended mutex. */
    struct timespec ts;
    uint64_t t0 = now_ns();
    for (int i = 0; i < 200000; i++)
        clock_gettime(CLOCK_REALTIME, &ts);
    double clk = (double)(now_ns() - t0) / 200000.0;
    pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
    t0 = now_ns();
    for (int i = 0; i < 200000; i++) {
        pthread_mutex_lock(&m);
        pthread_mutex_unlock(&m);
    }
    double mtx = (double)(now_ns() - t0) / 200000.0;
    printf("# bench_history: %zu-byte malloc+free pairs, %d calls deep, %zu pairs x %d reps (median)\n", g_size,
           depth, n, reps);
    printf("%-30s %12s %16s %8s\n", "history", "ns per pair", "ns per alloc +", "ratio");
    double off = 0;
    for (size_t s = 0; s < NSET; s++) {
        double *x = &v[s * (size_t)reps];
        qsort(x, (size_t)reps, sizeof *x, cmp_double);
        double med = x[reps / 2];
        if (s == 0)
            off = med;
        printf("%-30s %12.1f %16.1f %8.2f\n", settings[s].name, med, med - off, med / off);
    }
    printf("# this machine: clock_gettime(CLOCK_REALTIME) %.1f ns, mutex lock+unlock %.1f ns\n", clk, mtx);
    free(v);
    return 0;
}
