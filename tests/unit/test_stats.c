/* core/index/stats: the key table (complete, distinct, each key reading its own field), lookup
 * errors, peak reset, stat_add semantics, and the memory_summary table for a hand-filled struct. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/error.h"
#include "core/index/stats.h"

static const char *const pooled_names[] = {
    "allocation",      "segment",      "active",
    "inactive_split",  "allocated_bytes", "reserved_bytes",
    "active_bytes",    "inactive_split_bytes", "requested_bytes",
};
static const char *const pools[] = {"all", "small_pool", "large_pool"};
static const char *const fields[] = {"current", "peak", "allocated", "freed"};
static const char *const scalars[] = {"num_alloc_retries", "num_ooms", "num_sync_all_streams",
                                      "num_device_alloc", "num_device_free", "max_split_size",
                                      /* xseg's spill (spill_to_host) */
                                      "spilled_bytes.all.current", "spilled_bytes.all.peak",
                                      "spilled_bytes.all.allocated", "spilled_bytes.all.freed",
                                      "num_spills", "num_promotions", "spill_copied_bytes",
                                      "spill_numa_node", "spill_numa_fallback"};

/* Every int64 of the struct gets a distinct value: its index. */
static void fill_distinct(xseg_device_stats *s)
{
    int64_t *v = (int64_t *)(void *)s;
    for (size_t i = 0; i < sizeof *s / sizeof(int64_t); i++)
        v[i] = (int64_t)i * 1000 + 7;
}

static void test_key_set(void **state)
{
    (void)state;
    size_t n = stats_key_count();
    /* 9 pooled stats x 3 pools x 4 fields, 2 oversize x 4, 6 scalars: PyTorch's key set; then
     * spill's counter (4 fields) and 5 scalars. */
    assert_int_equal(n, 9 * 3 * 4 + 2 * 4 + 6 + 4 + 5);
    assert_int_equal(n, sizeof(xseg_device_stats) / sizeof(int64_t));
    assert_null(stats_key_name(n));

    /* Every expected key is present. */
    char key[128];
    size_t expected = 0;
    for (size_t a = 0; a < 9; a++)
        for (size_t p = 0; p < 3; p++)
            for (size_t f = 0; f < 4; f++) {
                snprintf(key, sizeof key, "%s.%s.%s", pooled_names[a], pools[p], fields[f]);
                int found = 0;
                for (size_t i = 0; i < n; i++)
                    found += !strcmp(stats_key_name(i), key);
                if (found != 1)
                    fail_msg("key %s found %d times", key, found);
                expected++;
            }
    for (size_t o = 0; o < 2; o++)
        for (size_t f = 0; f < 4; f++) {
            snprintf(key, sizeof key, "%s.%s", o ? "oversize_segments" : "oversize_allocations",
                     fields[f]);
            int found = 0;
            for (size_t i = 0; i < n; i++)
                found += !strcmp(stats_key_name(i), key);
            if (found != 1)
                fail_msg("key %s found %d times", key, found);
            expected++;
        }
    for (size_t k = 0; k < sizeof scalars / sizeof scalars[0]; k++) {
        int found = 0;
        for (size_t i = 0; i < n; i++)
            found += !strcmp(stats_key_name(i), scalars[k]);
        assert_int_equal(found, 1);
        expected++;
    }
    assert_int_equal(expected, n);
}

/* Each key reads a different field, and the field its name says. */
static void test_lookup(void **state)
{
    (void)state;
    xseg_device_stats s;
    fill_distinct(&s);
    size_t n = stats_key_count();
    int64_t *seen = calloc(n, sizeof *seen);
    assert_non_null(seen);
    for (size_t i = 0; i < n; i++) {
        int64_t v = -1;
        assert_int_equal(stats_lookup(&s, stats_key_name(i), &v), XSEG_SUCCESS);
        for (size_t j = 0; j < i; j++)
            if (seen[j] == v)
                fail_msg("%s and %s read the same field", stats_key_name(i), stats_key_name(j));
        seen[i] = v;
    }
    free(seen);

    int64_t v;
    assert_int_equal(stats_lookup(&s, "reserved_bytes.large_pool.peak", &v), XSEG_SUCCESS);
    assert_int_equal(v, s.reserved_bytes[XSEG_STAT_LARGE_POOL].peak);
    assert_int_equal(stats_lookup(&s, "allocation.small_pool.freed", &v), XSEG_SUCCESS);
    assert_int_equal(v, s.allocation[XSEG_STAT_SMALL_POOL].freed);
    assert_int_equal(stats_lookup(&s, "inactive_split_bytes.all.allocated", &v), XSEG_SUCCESS);
    assert_int_equal(v, s.inactive_split_bytes[XSEG_STAT_ALL].allocated);
    assert_int_equal(stats_lookup(&s, "oversize_segments.current", &v), XSEG_SUCCESS);
    assert_int_equal(v, s.oversize_segments.current);
    assert_int_equal(stats_lookup(&s, "num_sync_all_streams", &v), XSEG_SUCCESS);
    assert_int_equal(v, s.num_sync_all_streams);
    assert_int_equal(stats_lookup(&s, "max_split_size", &v), XSEG_SUCCESS);
    assert_int_equal(v, s.max_split_size);
}

static void test_unknown_key(void **state)
{
    (void)state;
    xseg_device_stats s;
    memset(&s, 0, sizeof s);
    int64_t v = 42;
    /* The docstring's "allocated.*" is not a key; "allocation.*" is. */
    const char *bad[] = {"allocated.all.current", "reserved_bytes.all", "reserved_bytes.all.current.",
                         "", "num_oom", "Reserved_bytes.all.current"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err_clear();
        assert_int_equal(stats_lookup(&s, bad[i], &v), XSEG_ERROR_INVALID_VALUE);
        char quoted[80];
        snprintf(quoted, sizeof quoted, "'%s'", bad[i]);
        if (!strstr(xseg_last_error(), quoted))
            fail_msg("message does not name %s: %s", quoted, xseg_last_error());
        assert_int_equal(v, 42);
    }
    assert_int_equal(stats_lookup(&s, NULL, &v), XSEG_ERROR_INVALID_VALUE);
    assert_int_equal(stats_lookup(&s, "num_ooms", NULL), XSEG_ERROR_INVALID_VALUE);
}

static void test_stat_add_and_reset(void **state)
{
    (void)state;
    xseg_device_stats s;
    memset(&s, 0, sizeof s);
    stat_add_pool(s.allocated_bytes, XSEG_STAT_LARGE_POOL, 100);
    stat_add_pool(s.allocated_bytes, XSEG_STAT_SMALL_POOL, 30);
    stat_add_pool(s.allocated_bytes, XSEG_STAT_LARGE_POOL, -60);
    /* The allocator's counters keep "all" lazily: its peak at once, the rest when filled in. */
    assert_int_equal(s.allocated_bytes[XSEG_STAT_ALL].peak, 130);
    assert_int_equal(stats_all_current(s.allocated_bytes), 70);
    stats_fill_all(&s);
    xseg_stat_counter *all = &s.allocated_bytes[XSEG_STAT_ALL];
    assert_int_equal(all->current, 70);
    assert_int_equal(all->peak, 130);
    assert_int_equal(all->allocated, 130);
    assert_int_equal(all->freed, 60);
    assert_int_equal(s.allocated_bytes[XSEG_STAT_LARGE_POOL].peak, 100);
    assert_int_equal(s.allocated_bytes[XSEG_STAT_SMALL_POOL].current, 30);

    /* Reset sets every peak to current and touches nothing else. */
    xseg_device_stats before;
    fill_distinct(&s);
    before = s;
    stats_reset_peaks(&s);
    size_t n = stats_key_count();
    for (size_t i = 0; i < n; i++) {
        const char *k = stats_key_name(i);
        int64_t v0, v1;
        assert_int_equal(stats_lookup(&before, k, &v0), XSEG_SUCCESS);
        assert_int_equal(stats_lookup(&s, k, &v1), XSEG_SUCCESS);
        size_t len = strlen(k);
        if (len > 5 && !strcmp(k + len - 5, ".peak")) {
            char cur[128];
            snprintf(cur, sizeof cur, "%.*scurrent", (int)(len - 4), k);
            int64_t c;
            assert_int_equal(stats_lookup(&before, cur, &c), XSEG_SUCCESS);
            assert_int_equal(v1, c);
        } else {
            assert_int_equal(v1, v0);
        }
    }
}

/* The allocator's lazy "all" entries (stat_up_pool / stat_down_pool / stat_add_pool, then
 * stats_fill_all) against the eager reference: stat_add on "all" and on the pool at every change,
 * over a random walk of both pools, with peak resets in between. */
static void test_lazy_all_matches_eager(void **state)
{
    (void)state;
    xseg_stat_counter lazy[XSEG_STAT_POOLS], eager[XSEG_STAT_POOLS];
    memset(lazy, 0, sizeof lazy);
    memset(eager, 0, sizeof eager);
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < 20000; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int pool = (x & 1) ? XSEG_STAT_SMALL_POOL : XSEG_STAT_LARGE_POOL;
        int64_t n = (int64_t)((x >> 8) % 1000);
        bool up = ((x >> 4) & 3) != 0 || eager[pool].current < n; /* drifts upwards, never below 0 */
        int how = (int)((x >> 40) % 3);
        if (how == 0)
            stat_add_pool(lazy, pool, up ? n : -n);
        else if (up)
            stat_up_pool(lazy, pool, n);
        else
            stat_down_pool(lazy, pool, n);
        stat_add(&eager[XSEG_STAT_ALL], up ? n : -n);
        stat_add(&eager[pool], up ? n : -n);
        assert_int_equal(stats_all_current(lazy), eager[XSEG_STAT_ALL].current);
        if (i % 997 == 0) { /* devops_reset_peaks: fill, then reset */
            xseg_device_stats s;
            memset(&s, 0, sizeof s);
            memcpy(s.active, lazy, sizeof lazy);
            stats_fill_all(&s);
            stats_reset_peaks(&s);
            memcpy(lazy, s.active, sizeof lazy);
            for (int k = 0; k < XSEG_STAT_POOLS; k++)
                eager[k].peak = eager[k].current;
        }
    }
    xseg_device_stats s;
    memset(&s, 0, sizeof s);
    memcpy(s.requested_bytes, lazy, sizeof lazy);
    stats_fill_all(&s);
    assert_memory_equal(s.requested_bytes, eager, sizeof eager);
    assert_true(eager[XSEG_STAT_ALL].peak > eager[XSEG_STAT_SMALL_POOL].peak);
}

/* The line of the table whose label is @p label, after the first line containing @p after. */
static const char *find_line(const char *text, const char *after, const char *label, char *line,
                             size_t size)
{
    const char *p = after ? strstr(text, after) : text;
    if (!p)
        return NULL;
    char pat[64];
    snprintf(pat, sizeof pat, "| %s ", label);
    p = strstr(p, pat);
    if (!p)
        return NULL;
    const char *e = strchr(p, '\n');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    if (n >= size)
        n = size - 1;
    memcpy(line, p, n);
    line[n] = '\0';
    return line;
}

static void expect_line(const char *text, const char *after, const char *label, const char *cells)
{
    char line[256];
    if (!find_line(text, after, label, line, sizeof line))
    {
        print_message("%s", text);
        fail_msg("no line '%s' after '%s' in the summary above", label, after ? after : "");
    }
    if (!strstr(line, cells))
        fail_msg("line '%s' lacks '%s'", line, cells);
}

static void test_summary(void **state)
{
    (void)state;
    const int64_t MiB = 1 << 20, GiB = (int64_t)1 << 30;
    xseg_device_stats s;
    memset(&s, 0, sizeof s);
    s.allocated_bytes[XSEG_STAT_ALL] = (xseg_stat_counter){3 * GiB, 5 * GiB, 40 * GiB, 37 * GiB};
    s.allocated_bytes[XSEG_STAT_LARGE_POOL] =
        (xseg_stat_counter){3 * GiB - 512 * 1024, 5 * GiB, 39 * GiB, 36 * GiB};
    s.allocated_bytes[XSEG_STAT_SMALL_POOL] = (xseg_stat_counter){512 * 1024, MiB, GiB, GiB};
    s.reserved_bytes[XSEG_STAT_ALL] = (xseg_stat_counter){4 * GiB, 6 * GiB, 8 * GiB, 4 * GiB};
    s.requested_bytes[XSEG_STAT_ALL] = (xseg_stat_counter){1000, 2000, 800 * 1024, 0};
    s.allocation[XSEG_STAT_ALL] = (xseg_stat_counter){12, 34, 2000000, 1999988};
    s.segment[XSEG_STAT_SMALL_POOL] = (xseg_stat_counter){3, 4, 5, 2};
    s.oversize_allocations = (xseg_stat_counter){1, 2, 3, 2};
    s.num_ooms = 7;
    s.num_alloc_retries = 11;

    char buf[8192];
    size_t len = 0;
    stats_format_summary(&s, 3, buf, sizeof buf, &len);
    assert_int_equal(len, strlen(buf));
    assert_non_null(strstr(buf, "device ID 3"));
    assert_non_null(strstr(buf, "CUDA OOMs: 7"));
    assert_non_null(strstr(buf, "retries: 11"));
    assert_non_null(strstr(buf, "Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed"));

    /* Units follow the "all" row: 3 GiB is shown in MiB (3072) until a value reaches 768 GiB. */
    expect_line(buf, NULL, "Allocated memory", "|   3072 MiB |   5120 MiB |  40960 MiB |  37888 MiB |");
    expect_line(buf, "Allocated memory", "      from large pool", "|   3071 MiB |   5120 MiB |");
    expect_line(buf, "Allocated memory", "      from small pool", "|      0 MiB |      1 MiB |   1024 MiB |");
    expect_line(buf, NULL, "GPU reserved memory", "|   4096 MiB |   6144 MiB |   8192 MiB |   4096 MiB |");
    expect_line(buf, NULL, "Requested memory", "|   1000 B   |   2000 B   |    800 KiB |      0 B   |");
    /* Counts switch to K from 750,000. */
    expect_line(buf, NULL, "Allocations", "|      12    |      34    |    2000 K  |    1999 K  |");
    expect_line(buf, "GPU reserved segments", "      from small pool", "|       3    |       4    |       5    |       2    |");
    expect_line(buf, NULL, "Oversize allocations", "|       1    |       2    |       3    |       2    |");
    expect_line(buf, NULL, "Non-releasable memory", "|      0 B   |");
    expect_line(buf, NULL, "Active allocs", "|       0    |");
    expect_line(buf, NULL, "Non-releasable allocs", "|       0    |");
    expect_line(buf, NULL, "Oversize GPU segments", "|       0    |");
    expect_line(buf, NULL, "Active memory", "|      0 B   |");

    /* Every line is 77 characters wide, framed by bars. */
    for (const char *p = buf; *p;) {
        const char *e = strchr(p, '\n');
        assert_non_null(e);
        if (e - p != 77)
            fail_msg("line of width %d: %.*s", (int)(e - p), (int)(e - p), p);
        assert_int_equal(p[0], '|');
        assert_int_equal(e[-1], '|');
        p = e + 1;
    }

    /* snprintf semantics. */
    char small[100];
    size_t slen;
    stats_format_summary(&s, 3, small, sizeof small, &slen);
    assert_int_equal(slen, len);
    assert_int_equal(strlen(small), sizeof small - 1);
    assert_memory_equal(small, buf, sizeof small - 1);
    stats_format_summary(&s, 3, NULL, 0, &slen);
    assert_int_equal(slen, len);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_set),
        cmocka_unit_test(test_lookup),
        cmocka_unit_test(test_unknown_key),
        cmocka_unit_test(test_stat_add_and_reset),
        cmocka_unit_test(test_lazy_all_matches_eager),
        cmocka_unit_test(test_summary),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
