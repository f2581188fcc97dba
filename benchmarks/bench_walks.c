/*
 * The worst case of the walks under the device lock that depend on the heap: a request predicted
 * long-lived (core/device/placement.h, L2) among F free blocks that all fit it. F holes of H bytes,
 * each between two live spacers (no merge), and four live twins of T bytes (T < H) in the large
 * pool of an expandable device; then N steps, each 40 frees of 512 KiB blocks (so that frees lead
 * the window, L1), one malloc of T bytes (predicted long-lived: the top placement's walk over the
 * fitting free blocks), the free of the oldest twin (so the key's last four stay live), and the 40
 * mallocs again. Meant for callgrind's two-count
 * difference (benchmarks/walk_table.sh): the instructions of a step, whose growth with F is the
 * walk's.
 *   bench_walks [--free F] [--steps N]
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "xseg.h"

#define MiB ((size_t)1 << 20)
#define SMALL 40

static void *must(size_t size)
{
    void *p;
    if (xseg_malloc(&p, size, 0, NULL) != XSEG_SUCCESS) {
        fprintf(stderr, "bench_walks: xseg_malloc(%zu): %s\n", size, xseg_last_error());
        exit(1);
    }
    return p;
}

int main(int argc, char **argv)
{
    size_t nfree = 1024, steps = 1000;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--free") && i + 1 < argc) {
            nfree = strtoull(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--steps") && i + 1 < argc) {
            steps = strtoull(argv[++i], NULL, 10);
        } else {
            fprintf(stderr, "usage: bench_walks [--free F] [--steps N]\n");
            return 2;
        }
    }
    bench_find_driver("bench_walks");
    if (xseg_init("expandable_segments:True") != XSEG_SUCCESS) {
        fprintf(stderr, "bench_walks: xseg_init: %s\n", xseg_last_error());
        return 1;
    }
    const size_t twin = MiB + 4096, hole = MiB + 8192, spacer = MiB + 512;
    void **holes = malloc((nfree + 1) * sizeof *holes), **spacers = malloc((nfree + 1) * sizeof *spacers);
    if (!holes || !spacers)
        return 1;
    for (size_t i = 0; i < nfree; i++) {
        spacers[i] = must(spacer);
        holes[i] = must(hole);
    }
    spacers[nfree] = must(spacer);
    for (size_t i = 0; i < nfree; i++)
        xseg_free(holes[i]);
    void *twins[4], *small[SMALL];
    for (int i = 0; i < 4; i++)
        twins[i] = must(twin);
    for (int i = 0; i < SMALL; i++)
        small[i] = must(512 << 10);
    uint64_t t0 = now_ns();
    for (size_t s = 0; s < steps; s++) {
        for (int i = 0; i < SMALL; i++)
            xseg_free(small[i]);
        /* The key's last four blocks stay live (L1): the new twin takes the oldest's place. */
        void *t = must(twin);
        xseg_free(twins[s % 4]);
        twins[s % 4] = t;
        for (int i = 0; i < SMALL; i++)
            small[i] = must(512 << 10);
    }
    uint64_t t1 = now_ns();
    printf("%zu free blocks: %.1f ns per step\n", nfree, steps ? (double)(t1 - t0) / (double)steps : 0.0);
    for (int i = 0; i < SMALL; i++)
        xseg_free(small[i]);
    for (int i = 0; i < 4; i++)
        xseg_free(twins[i]);
    for (size_t i = 0; i <= nfree; i++)
        xseg_free(spacers[i]);
    free(holes);
    free(spacers);
    return 0;
}
