/*
 * Issue 75, item 1: a stream destroyed after its blocks were freed never crashes a later pass.
 * The program: 4 blocks on stream S, S synchronized, every block freed, S destroyed, and the
 * program goes on. The passes that never wait (the idle thread, idle reclaim in malloc,
 * release_threshold_mb at a cache-missing malloc) must not hand S to the driver again (cudaemu
 * faults on any call naming a destroyed stream, as the driver crashes); the runs cached under S
 * stay until a call that waits for the context (empty_cache), which gives them back. One process
 * per test (tests/services/meson.build). Bounded by tries, never by time: under load a pass may
 * come late, and the test still checks that the process lives and its books are whole.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <cmocka.h>

#include "tests/common/testutil.h"
#include "tests/services/fixture.h"
#include "xseg.h"

enum policy { IDLE_THREAD, IDLE_MALLOC, THRESHOLD };

static void dead_stream(enum policy pol, bool expandable, size_t size)
{
    char config[160];
    snprintf(config, sizeof config, "expandable_segments:%s,%s", expandable ? "True" : "False",
             pol == IDLE_THREAD   ? "idle_release_ms:20,idle_release_thread:True"
             : pol == IDLE_MALLOC ? "idle_release_ms:20"
                                  : "release_threshold_mb:1");
    tu_xseg_init_or_skip(config);
    CUstream s;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    void *p[4];
    for (int i = 0; i < 4; i++)
        p[i] = tu_malloc(size, s);
    tu_assert_cu(drv->cuStreamSynchronize(s));
    for (int i = 0; i < 4; i++)
        tu_free(p[i]);
    tu_assert_cu(drv->cuStreamDestroy(s));
    /* The program goes on: mallocs on the default stream that miss the cache (each a new size,
     * above what it cached), so that malloc's passes run, and naps for the idle thread's. */
    struct timespec nap = {0, 5 * 1000 * 1000};
    for (int i = 0; i < 40; i++) {
        void *q = tu_malloc((size_t)(i + 1) * 3 * MiB, NULL);
        tu_free(q);
        nanosleep(&nap, NULL);
    }
    assert_int_equal(tu_dead_stream_calls(), 0);
    assert_int_equal(tu_stat("allocated_bytes.all.current"), 0);
    /* empty_cache waits for the context: S's runs go back with the rest. */
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    assert_int_equal(tu_dead_stream_calls(), 0);
}

#define DEAD(name, pol, exp, size)                                                                \
    static void test_dead_##name(void **state)                                                    \
    {                                                                                             \
        (void)state;                                                                              \
        dead_stream(pol, exp, size);                                                              \
    }
DEAD(idle_thread_classic_small, IDLE_THREAD, false, 256 * 1024)
DEAD(idle_thread_classic_large, IDLE_THREAD, false, 8 * MiB)
DEAD(idle_thread_expandable_small, IDLE_THREAD, true, 256 * 1024)
DEAD(idle_thread_expandable_large, IDLE_THREAD, true, 8 * MiB)
DEAD(idle_classic_small, IDLE_MALLOC, false, 256 * 1024)
DEAD(idle_classic_large, IDLE_MALLOC, false, 8 * MiB)
DEAD(idle_expandable_small, IDLE_MALLOC, true, 256 * 1024)
DEAD(idle_expandable_large, IDLE_MALLOC, true, 8 * MiB)
DEAD(threshold_classic_small, THRESHOLD, false, 256 * 1024)
DEAD(threshold_classic_large, THRESHOLD, false, 8 * MiB)
DEAD(threshold_expandable_small, THRESHOLD, true, 256 * 1024)
DEAD(threshold_expandable_large, THRESHOLD, true, 8 * MiB)

int main(int argc, char **argv)
{
    setenv("CUDAEMU_TOTAL_MEM", "8G", 0);
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dead_idle_thread_classic_small),
        cmocka_unit_test(test_dead_idle_thread_classic_large),
        cmocka_unit_test(test_dead_idle_thread_expandable_small),
        cmocka_unit_test(test_dead_idle_thread_expandable_large),
        cmocka_unit_test(test_dead_idle_classic_small),
        cmocka_unit_test(test_dead_idle_classic_large),
        cmocka_unit_test(test_dead_idle_expandable_small),
        cmocka_unit_test(test_dead_idle_expandable_large),
        cmocka_unit_test(test_dead_threshold_classic_small),
        cmocka_unit_test(test_dead_threshold_classic_large),
        cmocka_unit_test(test_dead_threshold_expandable_small),
        cmocka_unit_test(test_dead_threshold_expandable_large),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
