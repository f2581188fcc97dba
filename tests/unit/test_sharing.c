/* core/device/sharing.h: every transition of the sharing table, and the state it leaves each
 * stream in, including the cases fast.c relies on (two streams at one entry, a countdown that
 * outlives a reset, a countdown taken over by a new prober). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "core/device/sharing.h"

#define S(n) ((CUstream)(uintptr_t)(0x1000 * (n)))
static const int me_, other_;
#define ME ((const void *)&me_)
#define OTHER ((const void *)&other_)

static void fresh(struct sharing *t) { memset(t, 0, sizeof *t); }

/* ALONE until probed; the prober's own free ends the probe (QUIET); the countdown runs out to ALONE. */
static void test_probe_quiet(void **state)
{
    (void)state;
    struct sharing t;
    fresh(&t);
    assert_int_equal(sharing_state(&t, 3, S(1)), SHARING_ALONE);
    assert_int_equal(sharing_any(&t), 0);
    assert_false(sharing_quiet_tick(&t, 3, S(1), ME)); /* no countdown: a probe this time */
    sharing_probe(&t, 3, S(1), ME);
    assert_int_equal(sharing_state(&t, 3, S(1)), SHARING_PROBED);
    assert_true(sharing_is_probed(&t, 3));
    assert_int_not_equal(sharing_any(&t), 0);
    assert_int_equal(sharing_state(&t, 3, S(2)), SHARING_ALONE); /* another stream at the entry */
    sharing_probe_end(&t, 3);
    assert_false(sharing_is_probed(&t, 3));
    assert_int_equal(sharing_any(&t), 0);
    assert_int_equal(sharing_state(&t, 3, S(1)), SHARING_QUIET);
    /* Only the prober's frees of its stream tick. */
    assert_false(sharing_quiet_tick(&t, 3, S(1), OTHER));
    assert_false(sharing_quiet_tick(&t, 3, S(2), ME));
    for (int k = 0; k < SHARING_QUIET_FREES; k++) {
        assert_int_equal(sharing_state(&t, 3, S(1)), SHARING_QUIET);
        assert_true(sharing_quiet_tick(&t, 3, S(1), ME));
    }
    assert_int_equal(sharing_state(&t, 3, S(1)), SHARING_ALONE);
    assert_false(sharing_quiet_tick(&t, 3, S(1), ME));
}

/* A mark ends the stream's probe; a second mark at the entry displaces the first; a reset clears
 * marks and probes but leaves the countdown. */
static void test_mark_reset(void **state)
{
    (void)state;
    struct sharing t;
    fresh(&t);
    assert_null(sharing_displaced(&t, 7));
    sharing_probe(&t, 7, S(1), ME);
    sharing_mark(&t, 7, S(1));
    assert_int_equal(sharing_state(&t, 7, S(1)), SHARING_SHARED);
    assert_true(sharing_is_shared(&t, 7, S(1)));
    assert_false(sharing_is_probed(&t, 7));
    assert_false(sharing_is_shared(&t, 7, S(2)));
    assert_ptr_equal(sharing_displaced(&t, 7), S(1));
    sharing_mark(&t, 7, S(2));
    assert_int_equal(sharing_state(&t, 7, S(2)), SHARING_SHARED);
    assert_false(sharing_is_shared(&t, 7, S(1)));
    /* One marked and one probed stream at one entry. */
    sharing_probe(&t, 7, S(3), OTHER);
    assert_int_equal(sharing_state(&t, 7, S(2)), SHARING_SHARED);
    assert_int_equal(sharing_state(&t, 7, S(3)), SHARING_PROBED);
    assert_true(t.any.shared == 1u << 7 && t.any.probed == 1u << 7);
    /* The other entries stay alone. */
    for (unsigned i = 0; i < DEV_STREAM_SLOTS; i++)
        if (i != 7)
            assert_int_equal(sharing_state(&t, i, S(2)), SHARING_ALONE);
    sharing_probe_end(&t, 7);
    sharing_reset_all(&t);
    assert_int_equal(sharing_any(&t), 0);
    assert_null(sharing_displaced(&t, 7));
    assert_int_equal(sharing_state(&t, 7, S(2)), SHARING_ALONE);
    assert_int_equal(sharing_state(&t, 7, S(3)), SHARING_QUIET); /* the countdown outlives it */
    assert_true(sharing_quiet_tick(&t, 7, S(3), OTHER));
}

/* A probe of another stream or by another thread takes a running countdown over (one prober an
 * entry), and reopens the probe over it. */
static void test_countdown_taken_over(void **state)
{
    (void)state;
    struct sharing t;
    fresh(&t);
    sharing_probe(&t, 0, S(1), ME);
    sharing_probe_end(&t, 0);
    sharing_probe(&t, 0, S(2), OTHER);
    assert_int_equal(sharing_state(&t, 0, S(2)), SHARING_PROBED);
    assert_int_equal(sharing_state(&t, 0, S(1)), SHARING_ALONE);
    assert_false(sharing_quiet_tick(&t, 0, S(1), ME));
    assert_true(sharing_quiet_tick(&t, 0, S(2), OTHER));
    assert_int_equal(t.entry[0].quiet, SHARING_QUIET_FREES - 1);
    /* The highest entry's bits stay in their half. */
    sharing_mark(&t, DEV_STREAM_SLOTS - 1, S(4));
    sharing_probe(&t, DEV_STREAM_SLOTS - 1, S(5), ME);
    assert_true(sharing_is_shared(&t, DEV_STREAM_SLOTS - 1, S(4)));
    assert_true(sharing_is_probed(&t, DEV_STREAM_SLOTS - 1));
    assert_true(sharing_is_probed(&t, 0) && t.entry[0].stream == S(2));
}

/* A mark fades to ALONE at its entry alone; a probe open there stays, as do other entries' marks. */
static void test_fade(void **state)
{
    (void)state;
    struct sharing t;
    fresh(&t);
    sharing_mark(&t, 3, S(1));
    sharing_mark(&t, 4, S(2));
    sharing_probe(&t, 3, S(6), OTHER);
    sharing_fade(&t, 3);
    assert_int_equal(sharing_state(&t, 3, S(1)), SHARING_ALONE);
    assert_null(sharing_displaced(&t, 3));
    assert_int_equal(sharing_state(&t, 3, S(6)), SHARING_PROBED);
    assert_int_equal(sharing_state(&t, 4, S(2)), SHARING_SHARED);
    sharing_fade(&t, 4);
    sharing_probe_end(&t, 3);
    assert_int_equal(t.any.shared, 0);
    assert_int_equal(sharing_state(&t, 3, S(6)), SHARING_QUIET);
    sharing_mark(&t, 3, S(1)); /* marked again by the next meeting */
    assert_int_equal(sharing_state(&t, 3, S(1)), SHARING_SHARED);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_probe_quiet),
        cmocka_unit_test(test_mark_reset),
        cmocka_unit_test(test_countdown_taken_over),
        cmocka_unit_test(test_fade),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
