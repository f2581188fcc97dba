/*
 * debug_stale_access's memory bound (issue 50; docs/configuration.md debug_quarantine_mb): a
 * workload that grows reserved memory while it frees temporaries, played with the mode off and
 * on, in classic segments: the peak reserved bytes with the mode on stay within the peak off plus
 * the quarantine's bound. Without the quarantine emptying before growth (quarantine.c
 * quar_before_growth) the held temporaries force growth the off run does not make, and what grew
 * stays reserved as cache the later requests cannot use (one stream's small-pool segments are no
 * use to the next stream's temporaries): about the bound a stream, 24 MiB over at an 8 MiB bound.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cmocka.h>

#include "tests/common/testutil.h"
#include "xseg.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define BOUND_MB 8
#define LIVE 16
#define NSTREAMS 3

/* Small temporaries freed on one stream after another (each stream's small pool grows its own
 * 2 MiB segments, which the others cannot use), then large tensors kept with a large temporary
 * freed after each: the peak reserved bytes. */
static int64_t peak_reserved(const char *config)
{
    tu_xseg_init_or_skip(config);
    CUstream s[NSTREAMS];
    for (int k = 0; k < NSTREAMS; k++) {
        tu_assert_cu(drv->cuStreamCreate(&s[k], CU_STREAM_NON_BLOCKING));
        for (int i = 0; i < 64; i++)
            tu_free(tu_malloc(512 * KiB, s[k]));
    }
    void *live[LIVE];
    for (int i = 0; i < LIVE; i++) {
        live[i] = tu_malloc(6 * MiB, s[0]);
        tu_free(tu_malloc(6 * MiB, s[0]));
    }
    int64_t peak = tu_stat("reserved_bytes.all.peak");
    for (int i = 0; i < LIVE; i++)
        tu_free(live[i]);
    for (int k = 0; k < NSTREAMS; k++) {
        tu_assert_cu(drv->cuStreamSynchronize(s[k]));
        tu_assert_cu(drv->cuStreamDestroy(s[k]));
    }
    assert_int_equal(xseg_shutdown(), XSEG_SUCCESS);
    return peak;
}

static void test_within_bound(void **st)
{
    (void)st;
    int64_t off = peak_reserved("expandable_segments:False");
    int64_t on = peak_reserved("expandable_segments:False,debug_stale_access:True,debug_quarantine_mb:8");
    printf("peak reserved: off %lld MiB, on %lld MiB, bound %d MiB\n", (long long)(off / (int64_t)MiB),
           (long long)(on / (int64_t)MiB), BOUND_MB);
    assert_true(on >= off); /* the mode held something: the workload exercised it */
    assert_true(on - off <= (int64_t)BOUND_MB * (int64_t)MiB);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_within_bound)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
