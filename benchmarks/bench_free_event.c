/*
 * bench_free_event: the driver calls a free makes while release_threshold_mb or idle_release_ms
 * is set (issue 75: xseg's event recorded on a program's stream, at most once per stream, pool
 * and window). One program stream, 8 live blocks of 512 KiB ... 4 MiB (both pools), N rounds of
 * free-then-malloc of one block, round robin (frees through the device lock and the slots alike);
 * prints the calls cudaemu counted during the rounds, by entry, and calls per free.
 *
 *   bench_free_event CONFIG N      e.g. bench_free_event expandable_segments:True,idle_release_ms:1000 100000
 *
 * Runs on the cudaemu built here (the counts need the emulator).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "xseg.h"

#include "bench_util.h"

typedef struct CUstream_st *CUstream;

static const char *const entries[] = {"cuEventRecord", "cuEventCreate", "cuEventQuery", "cuStreamQuery",
                                      "cuCtxGetCurrent", "cuCtxSetCurrent", "cuCtxSynchronize", NULL};

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: bench_free_event CONFIG N\n");
        return 2;
    }
    bench_find_driver("bench_free_event");
    int n = atoi(argv[2]);
    if (xseg_init(argv[1]) != XSEG_SUCCESS) {
        fprintf(stderr, "bench_free_event: xseg_init: %s\n", xseg_last_error());
        return 1;
    }
    void *w = NULL; /* the device's context, current on this thread */
    if (xseg_malloc(&w, 512, 0, NULL) != XSEG_SUCCESS) {
        fprintf(stderr, "bench_free_event: xseg_malloc: %s\n", xseg_last_error());
        return 1;
    }
    xseg_free(w);
    void *lib = dlopen(getenv("XSEG_LIBCUDA"), RTLD_LAZY);
    unsigned long (*count)(const char *) = lib ? (unsigned long (*)(const char *))dlsym(lib, "cudaemu_call_count") : NULL;
    int (*stream_create)(CUstream *, unsigned) = lib ? (int (*)(CUstream *, unsigned))dlsym(lib, "cuStreamCreate") : NULL;
    CUstream s;
    if (!count || !stream_create || stream_create(&s, 1 /* CU_STREAM_NON_BLOCKING */) != 0) {
        fprintf(stderr, "bench_free_event: needs cudaemu (cudaemu_call_count, cuStreamCreate)\n");
        return 1;
    }
    enum { K = 8 };
    void *p[K];
    for (int i = 0; i < K; i++)
        if (xseg_malloc(&p[i], (size_t)(i + 1) * 512 * 1024, 0, s) != XSEG_SUCCESS)
            return 1;
    unsigned long before[16], total = 0;
    for (int e = 0; entries[e]; e++)
        before[e] = count(entries[e]);
    uint64_t t0 = now_ns();
    for (int i = 0; i < n; i++) {
        xseg_free(p[i % K]);
        if (xseg_malloc(&p[i % K], (size_t)(i % K + 1) * 512 * 1024, 0, s) != XSEG_SUCCESS)
            return 1;
    }
    uint64_t t1 = now_ns();
    for (int e = 0; entries[e]; e++) {
        unsigned long d = count(entries[e]) - before[e];
        total += d;
        printf("%s %lu\n", entries[e], d);
    }
    printf("frees %d, driver calls %lu, per free %.4f, ns per round %.1f\n", n, total, (double)total / n,
           (double)(t1 - t0) / n);
    for (int i = 0; i < K; i++)
        xseg_free(p[i]);
    return 0;
}
