/*
 * The choice of what to spill as the declared blocks grow (core/services/spill.c): D live blocks of
 * 512 B declared cold (none holds a whole page of its own, so none can move), one 24 MiB block M
 * declared cold, and the rest of the emulated device filled with blocks not declared; then N steps,
 * each a malloc of 20 MiB that only spill can serve (it moves M's pages to host memory), its free,
 * and xseg_empty_cache (its memory goes back to the driver, M's pages come back). Meant for callgrind's two-count
 * difference (benchmarks/spill_walk_table.sh): the instructions of a step, whose growth with D is
 * what choosing M among the declared blocks costs under the device lock.
 *   bench_spill_walk [--declared D] [--steps N]
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "xseg.h"

#define MiB ((size_t)1 << 20)
#define SMALL_BYTES 512
#define BALLAST_MAX 4096

static void fail(const char *what)
{
    fprintf(stderr, "bench_spill_walk: %s: %s\n", what, xseg_last_error());
    exit(1);
}

int main(int argc, char **argv)
{
    size_t ndecl = 1000, steps = 100;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--declared") && i + 1 < argc) {
            ndecl = strtoull(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--steps") && i + 1 < argc) {
            steps = strtoull(argv[++i], NULL, 10);
        } else {
            fprintf(stderr, "usage: bench_spill_walk [--declared D] [--steps N]\n");
            return 2;
        }
    }
    /* Room for the declared blocks' small segments and 48 MiB more (cudaemu reads it at the first
     * driver call). */
    char mem[32];
    snprintf(mem, sizeof mem, "%zuM", (ndecl * SMALL_BYTES + 2 * MiB - 1) / (2 * MiB) * 2 + 48);
    setenv("CUDAEMU_TOTAL_MEM", mem, 1);
    bench_find_driver("bench_spill_walk");
    if (xseg_init("expandable_segments:True,spill_to_host:True") != XSEG_SUCCESS)
        fail("xseg_init");
    void **small = malloc((ndecl + 1) * sizeof *small), *ballast[BALLAST_MAX], *m, *x;
    if (!small)
        return 1;
    for (size_t i = 0; i < ndecl; i++) {
        if (xseg_malloc(&small[i], SMALL_BYTES, 0, NULL) != XSEG_SUCCESS)
            fail("malloc of a small block");
        if (xseg_spill_hint(small[i], XSEG_SPILL_COLD) != XSEG_SUCCESS)
            fail("xseg_spill_hint");
    }
    if (xseg_malloc(&m, 24 * MiB, 0, NULL) != XSEG_SUCCESS)
        fail("malloc of M");
    /* The device full of blocks that may not move (M is not declared yet). */
    size_t nb = 0;
    while (nb < BALLAST_MAX && xseg_malloc(&ballast[nb], 2 * MiB, 0, NULL) == XSEG_SUCCESS)
        nb++;
    if (xseg_spill_hint(m, XSEG_SPILL_COLD) != XSEG_SUCCESS)
        fail("xseg_spill_hint(M)");
    uint64_t t0 = now_ns();
    for (size_t s = 0; s < steps; s++) {
        if (xseg_malloc(&x, 20 * MiB, 0, NULL) != XSEG_SUCCESS)
            fail("the spilling malloc");
        if (xseg_free(x) != XSEG_SUCCESS)
            fail("free");
        if (xseg_empty_cache(0) != XSEG_SUCCESS)
            fail("xseg_empty_cache");
    }
    uint64_t t1 = now_ns();
    xseg_device_stats st;
    if (xseg_get_stats(0, &st) != XSEG_SUCCESS)
        fail("xseg_get_stats");
    printf("%zu declared blocks, %zu more: %.1f ns per step, %lld spills\n", ndecl, nb,
           steps ? (double)(t1 - t0) / (double)steps : 0.0, (long long)st.num_spills);
    if (steps && st.num_spills < (int64_t)steps) {
        fprintf(stderr, "bench_spill_walk: %lld spills in %zu steps: a step did not spill\n",
                (long long)st.num_spills, steps);
        return 1;
    }
    for (size_t i = 0; i < nb; i++)
        xseg_free(ballast[i]);
    xseg_free(m);
    for (size_t i = 0; i < ndecl; i++)
        xseg_free(small[i]);
    free(small);
    return 0;
}
