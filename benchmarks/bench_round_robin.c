/*
 * The device path's pair when no stream slot serves it: a three-block round robin of B, 2 B and
 * 3 B bytes (B: --size, default 512 B, the small pool; 2 MiB: the large pool), each step freeing
 * the oldest block and allocating the next size through xseg_free / xseg_malloc, N steps in one
 * mode. Meant for callgrind's two-count difference (benchmarks/callgrind_round_robin.sh); prints
 * the wall ns per step too.
 *   bench_round_robin [--mode classic|expandable] [--pairs N] [--size B]
 */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "xseg.h"

int main(int argc, char **argv)
{
    bool expandable = false;
    size_t pairs = 1000000, base = 512;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mode") && i + 1 < argc) {
            expandable = !strcmp(argv[++i], "expandable");
        } else if (!strcmp(argv[i], "--pairs") && i + 1 < argc) {
            pairs = strtoull(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--size") && i + 1 < argc) {
            base = strtoull(argv[++i], NULL, 10);
        } else {
            fprintf(stderr, "usage: bench_round_robin [--mode classic|expandable] [--pairs N] [--size B]\n");
            return 2;
        }
    }
    bench_find_driver("bench_round_robin");
    if (xseg_init(expandable ? "expandable_segments:True" : "expandable_segments:False") != XSEG_SUCCESS) {
        fprintf(stderr, "bench_round_robin: xseg_init: %s\n", xseg_last_error());
        return 1;
    }
    const size_t sizes[3] = {base, 2 * base, 3 * base};
    void *v[3];
    for (int i = 0; i < 3; i++)
        if (xseg_malloc(&v[i], sizes[i], 0, NULL) != XSEG_SUCCESS) {
            fprintf(stderr, "bench_round_robin: xseg_malloc: %s\n", xseg_last_error());
            return 1;
        }
    uint64_t t0 = now_ns();
    for (size_t i = 0; i < pairs; i++) {
        size_t k = i % 3;
        xseg_free(v[k]);
        if (xseg_malloc(&v[k], sizes[(i + 1) % 3], 0, NULL) != XSEG_SUCCESS) {
            fprintf(stderr, "bench_round_robin: xseg_malloc: %s\n", xseg_last_error());
            return 1;
        }
    }
    uint64_t t1 = now_ns();
    printf("%s: %.1f ns per free+malloc\n", expandable ? "expandable" : "classic",
           pairs ? (double)(t1 - t0) / (double)pairs : 0.0);
    for (int i = 0; i < 3; i++)
        xseg_free(v[i]);
    return 0;
}
