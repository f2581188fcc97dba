/*
 * The maintenance calls against the size of the cache (issue 77 item 3; benchmarks/maintenance_table.sh,
 * docs/benchmarks-host.md#maintenance): a heap of F small holes (2F blocks of 512 B, every other one
 * freed, so no two holes merge and none holds a whole page), then C calls of one operation. Meant for
 * callgrind with --toggle-collect on the operation, at two call counts: the difference of the totals
 * over the difference of the counts is one call's instructions (the heap's building is not collected).
 *   bench_maintenance empty|info MODE F C     xseg_empty_cache or xseg_cache_info, C calls
 *   bench_maintenance pair MODE 0 C           C classic LIFO malloc+free pairs of 512 B beside live blocks
 * MODE: classic or expandable.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "xseg.h"

static void *must(size_t size)
{
    void *p;
    if (xseg_malloc(&p, size, 0, NULL) != XSEG_SUCCESS) {
        fprintf(stderr, "bench_maintenance: xseg_malloc(%zu): %s\n", size, xseg_last_error());
        exit(1);
    }
    return p;
}

int main(int argc, char **argv)
{
    if (argc != 5 || (strcmp(argv[1], "empty") && strcmp(argv[1], "info") && strcmp(argv[1], "pair")) ||
        (strcmp(argv[2], "classic") && strcmp(argv[2], "expandable"))) {
        fprintf(stderr, "usage: bench_maintenance empty|info|pair classic|expandable F C\n");
        return 2;
    }
    size_t nfree = strtoull(argv[3], NULL, 10), calls = strtoull(argv[4], NULL, 10);
    bench_find_driver("bench_maintenance");
    bool exp = !strcmp(argv[2], "expandable");
    if (xseg_init(exp ? "expandable_segments:True" : "expandable_segments:False") != XSEG_SUCCESS) {
        fprintf(stderr, "bench_maintenance: xseg_init: %s\n", xseg_last_error());
        return 1;
    }
    void **blk = malloc((2 * nfree + 4) * sizeof *blk);
    if (!blk)
        return 1;
    for (size_t i = 0; i < 2 * nfree; i++)
        blk[i] = must(512);
    for (size_t i = 0; i < 2 * nfree; i += 2)
        (void)xseg_free(blk[i]);
    if (xseg_empty_cache(0) != XSEG_SUCCESS) { /* what can go back goes now: the calls measured find none */
        fprintf(stderr, "bench_maintenance: xseg_empty_cache: %s\n", xseg_last_error());
        return 1;
    }
    size_t largest = 0;
    if (!strcmp(argv[1], "empty")) {
        for (size_t i = 0; i < calls; i++)
            (void)xseg_empty_cache(0);
    } else if (!strcmp(argv[1], "info")) {
        for (size_t i = 0; i < calls; i++) {
            largest = 1; /* not 0: the driver's free memory is not asked */
            (void)xseg_cache_info(0, &largest);
        }
    } else {
        void *live[3] = {must(512), must(512), must(512)};
        for (size_t i = 0; i < calls; i++)
            (void)xseg_free(must(512));
        for (int i = 0; i < 3; i++)
            (void)xseg_free(live[i]);
    }
    printf("%s %s free=%zu calls=%zu largest=%zu\n", argv[1], argv[2], nfree, calls, largest);
    for (size_t i = 1; i < 2 * nfree; i += 2)
        (void)xseg_free(blk[i]);
    free(blk);
    return 0;
}
