/*
 * bench_host_path: the allocator's host fast path — a cached malloc+free pair — in nanoseconds,
 * with glibc malloc and mimalloc measured in the same run as the floor.
 *
 *   bench_host_path [--pairs N] [--reps R] [--only xseg|glibc|mimalloc] [--mode classic|expandable]
 *                   [--size BYTES | --mixed] [--api xseg|torch]
 *
 * Each measurement warms up (the first malloc creates the segment; 1000 pairs fill caches), then
 * times N malloc+free pairs of one size on the default stream; the figure is the median of R
 * repetitions (ns per pair). Sizes: 512 B (small pool) and 4 MiB (large pool), both modes.
 * --api torch times xseg_torch_malloc/xseg_torch_free (PyTorch's pluggable-allocator entry points)
 * instead of xseg_malloc/xseg_free. --mixed: each pair takes the next of 512, 1024, 1536 and 2048 B
 * (the size column reads 0).
 * Instruction counts: benchmarks/callgrind_pairs.sh runs this under callgrind at two values of N
 * and divides the difference, so start-up cost cancels out.
 * Without a GPU (no libcuda.so.1, $XSEG_LIBCUDA unset) it runs on the cudaemu built here.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "xseg.h"

#include "bench_util.h"

/* A malloc+free pair of one allocator; the pointer is published through a volatile so the
 * compiler cannot elide glibc's pair. */
typedef int (*pair_fn)(size_t size, size_t n);
static void *volatile sink;
/* --mixed: pair i asks for mixed_sizes[i % 4] instead of its size (loops of their own, so that the
 * one-size loops, which callgrind_pairs.sh counts, stay as they were). */
static bool mixed;
static const size_t mixed_sizes[4] = {512, 1024, 1536, 2048};
#define MIXED_SIZE(i) mixed_sizes[(i) & 3]

static int xseg_pairs(size_t size, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        void *p;
        if (xseg_malloc(&p, size, 0, NULL) != XSEG_SUCCESS) {
            fprintf(stderr, "bench_host_path: xseg_malloc(%zu): %s\n", size, xseg_last_error());
            return -1;
        }
        sink = p;
        xseg_free(p);
    }
    return 0;
}

static int torch_pairs(size_t size, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        void *p = xseg_torch_malloc(size, 0, NULL);
        if (!p) {
            fprintf(stderr, "bench_host_path: xseg_torch_malloc(%zu): %s\n", size, xseg_last_error());
            return -1;
        }
        sink = p;
        xseg_torch_free(p, size, 0, NULL);
    }
    return 0;
}

static int glibc_pairs(size_t size, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        void *p = malloc(size);
        sink = p;
        free(p);
    }
    return 0;
}

static void *(*mi_malloc_p)(size_t);
static void (*mi_free_p)(void *);

static int xseg_pairs_mixed(size_t size, size_t n)
{
    (void)size;
    for (size_t i = 0; i < n; i++) {
        void *p;
        if (xseg_malloc(&p, MIXED_SIZE(i), 0, NULL) != XSEG_SUCCESS) {
            fprintf(stderr, "bench_host_path: xseg_malloc(%zu): %s\n", MIXED_SIZE(i), xseg_last_error());
            return -1;
        }
        sink = p;
        xseg_free(p);
    }
    return 0;
}

static int torch_pairs_mixed(size_t size, size_t n)
{
    (void)size;
    for (size_t i = 0; i < n; i++) {
        void *p = xseg_torch_malloc(MIXED_SIZE(i), 0, NULL);
        if (!p) {
            fprintf(stderr, "bench_host_path: xseg_torch_malloc(%zu): %s\n", MIXED_SIZE(i), xseg_last_error());
            return -1;
        }
        sink = p;
        xseg_torch_free(p, MIXED_SIZE(i), 0, NULL);
    }
    return 0;
}

static int glibc_pairs_mixed(size_t size, size_t n)
{
    (void)size;
    for (size_t i = 0; i < n; i++) {
        void *p = malloc(MIXED_SIZE(i));
        sink = p;
        free(p);
    }
    return 0;
}

static int mimalloc_pairs_mixed(size_t size, size_t n)
{
    (void)size;
    for (size_t i = 0; i < n; i++) {
        void *p = mi_malloc_p(MIXED_SIZE(i));
        sink = p;
        mi_free_p(p);
    }
    return 0;
}

static int mimalloc_pairs(size_t size, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        void *p = mi_malloc_p(size);
        sink = p;
        mi_free_p(p);
    }
    return 0;
}

/* Median ns per pair over @p reps runs of @p n pairs, after a warm-up. -1 on failure. */
static double measure(pair_fn fn, size_t size, size_t n, int reps)
{
    if (fn(size, 1000))
        return -1;
    double *v = calloc((size_t)reps, sizeof *v);
    for (int r = 0; r < reps; r++) {
        uint64_t t0 = now_ns();
        if (fn(size, n)) {
            free(v);
            return -1;
        }
        v[r] = (double)(now_ns() - t0) / (double)n;
    }
    qsort(v, (size_t)reps, sizeof *v, cmp_double);
    double med = v[reps / 2];
    free(v);
    return med;
}

static int usage(const char *why)
{
    fprintf(stderr, "bench_host_path: %s\nusage: bench_host_path [--pairs N] [--reps R] "
                    "[--only xseg|glibc|mimalloc] [--mode classic|expandable] [--size BYTES] [--api xseg|torch]\n", why);
    return 2;
}

int main(int argc, char **argv)
{
    size_t pairs = 1000000, only_size = 0;
    int reps = 7;
    const char *only = NULL, *mode = NULL;
    bool torch = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("bench_host_path [--pairs N] [--reps R] [--only xseg|glibc|mimalloc] "
                   "[--mode classic|expandable] [--size BYTES | --mixed] [--api xseg|torch]\n"
                   "ns per cached malloc+free pair (median of R runs of N pairs), xseg in both modes\n"
                   "at 512 B and 4 MiB, with glibc malloc and mimalloc in the same run.\n");
            return 0;
        } else if (!strcmp(a, "--pairs") && v) {
            errno = 0;
            pairs = strtoull(v, &end, 10);
            if (*end || errno || !pairs)
                return usage("--pairs needs a positive number");
            i++;
        } else if (!strcmp(a, "--reps") && v) {
            reps = atoi(v);
            if (reps < 1)
                return usage("--reps needs a positive number");
            i++;
        } else if (!strcmp(a, "--size") && v) {
            errno = 0;
            only_size = strtoull(v, &end, 10);
            if (*end || errno || !only_size)
                return usage("--size needs a positive number of bytes");
            i++;
        } else if (!strcmp(a, "--mixed")) {
            mixed = true;
        } else if (!strcmp(a, "--only") && v) {
            only = v;
            if (strcmp(v, "xseg") && strcmp(v, "glibc") && strcmp(v, "mimalloc"))
                return usage("--only takes xseg, glibc or mimalloc");
            i++;
        } else if (!strcmp(a, "--api") && v) {
            if (strcmp(v, "xseg") && strcmp(v, "torch"))
                return usage("--api takes xseg or torch");
            torch = !strcmp(v, "torch");
            i++;
        } else if (!strcmp(a, "--mode") && v) {
            mode = v;
            if (strcmp(v, "classic") && strcmp(v, "expandable"))
                return usage("--mode takes classic or expandable");
            i++;
        } else {
            char msg[128];
            snprintf(msg, sizeof msg, "unknown or incomplete option '%s'", a);
            return usage(msg);
        }
    }
    size_t sizes[2] = {512, 4u << 20};
    size_t nsizes = 2;
    if (only_size || mixed) {
        sizes[0] = mixed ? 0 : only_size;
        nsizes = 1;
    }
    void *mi = dlopen("libmimalloc.so.2", RTLD_NOW | RTLD_LOCAL);
    if (mi) {
        mi_malloc_p = (void *(*)(size_t))dlsym(mi, "mi_malloc");
        mi_free_p = (void (*)(void *))dlsym(mi, "mi_free");
    }
    printf("%-28s %10s %14s\n", "allocator", "size", "ns per pair");
    printf("------------------------------------------------------\n");
    if (!only || !strcmp(only, "xseg")) {
        bench_find_driver("bench_host_path");
        static const char *const modes[2][2] = {{"classic", "expandable_segments:False"},
                                                {"expandable", "expandable_segments:True"}};
        for (int m = 0; m < 2; m++) {
            if (mode && strcmp(mode, modes[m][0]))
                continue;
            /* Switching mode in-process is sound here: empty_cache drops every cached segment, so
             * the next malloc creates one in the new mode. */
            if (xseg_init(modes[m][1]) != XSEG_SUCCESS || xseg_empty_cache(-1) != XSEG_SUCCESS) {
                fprintf(stderr, "bench_host_path: xseg: %s\n", xseg_last_error());
                return 1;
            }
            for (size_t s = 0; s < nsizes; s++) {
                double ns = measure(torch ? (mixed ? torch_pairs_mixed : torch_pairs) : (mixed ? xseg_pairs_mixed : xseg_pairs), sizes[s],
                                    pairs, reps);
                if (ns < 0)
                    return 1;
                char name[40];
                snprintf(name, sizeof name, "%s (%s)", torch ? "xseg torch API" : "xseg", modes[m][0]);
                printf("%-28s %10zu %14.1f\n", name, sizes[s], ns);
            }
        }
    }
    if (!only || !strcmp(only, "glibc"))
        for (size_t s = 0; s < nsizes; s++)
            printf("%-28s %10zu %14.1f\n", "glibc malloc", sizes[s], measure(mixed ? glibc_pairs_mixed : glibc_pairs, sizes[s], pairs, reps));
    if (!only || !strcmp(only, "mimalloc")) {
        if (!mi_malloc_p || !mi_free_p)
            printf("%-28s %10s %14s\n", "mimalloc", "-", "n/a (libmimalloc.so.2 not found)");
        else
            for (size_t s = 0; s < nsizes; s++)
                printf("%-28s %10zu %14.1f\n", "mimalloc", sizes[s], measure(mixed ? mimalloc_pairs_mixed : mimalloc_pairs, sizes[s], pairs, reps));
    }
    return 0;
}
