/* core/process/config: the grammar, every key's validation, the reset rule, round trip through
 * cfg_format, and roundup_power2_divisions bucket semantics. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/process/config.h"
#include "base/error.h"

#define MiB ((size_t)1 << 20)

static struct cfg parse_ok(const char *s)
{
    struct cfg base, out;
    cfg_default(&base);
    xseg_status st = cfg_parse(s, &base, &out);
    if (st != XSEG_SUCCESS)
        fail_msg("cfg_parse(\"%s\") failed: %s", s, xseg_last_error());
    return out;
}

/* Parse must fail, leave out untouched, and produce a message containing every needle. */
static void parse_bad(const char *s, const char *needle1, const char *needle2)
{
    struct cfg base, out;
    cfg_default(&base);
    memset(&out, 0xA5, sizeof out);
    struct cfg before = out;
    err_clear();
    xseg_status st = cfg_parse(s, &base, &out);
    if (st != XSEG_ERROR_INVALID_VALUE)
        fail_msg("cfg_parse(\"%s\") returned %d, expected INVALID_VALUE", s, (int)st);
    assert_memory_equal(&out, &before, sizeof out);
    const char *msg = xseg_last_error();
    if (needle1 && !strstr(msg, needle1))
        fail_msg("message for \"%s\" lacks '%s': %s", s, needle1, msg);
    if (needle2 && !strstr(msg, needle2))
        fail_msg("message for \"%s\" lacks '%s': %s", s, needle2, msg);
}

static void test_defaults(void **state)
{
    (void)state;
    struct cfg c;
    cfg_default(&c);
    assert_true(c.max_split_size == SIZE_MAX);
    assert_int_equal(c.max_non_split_rounding, 20 * MiB);
    assert_int_equal(c.large_segment_size, 20 * MiB);
    assert_int_equal(c.expandable_page_size, 20 * MiB);
    assert_true(c.garbage_collection_threshold == 0.0);
    for (int b = 0; b < CFG_ROUNDUP_BUCKETS; b++)
        assert_int_equal(c.roundup_power2_divisions[b], 0);
    assert_true(c.expandable_segments);
    assert_true(c.expandable_segments_recycle);
    assert_false(c.release_lock_on_cudamalloc);
    assert_true(c.per_process_memory_fraction == 1.0);
    assert_false(c.graph_capture_record_stream_reuse);
    /* The empty string (and only whitespace) changes nothing. */
    struct cfg e = parse_ok("");
    assert_memory_equal(&e, &c, sizeof c);
    e = parse_ok("   ");
    assert_memory_equal(&e, &c, sizeof c);
}

static void test_accepted(void **state)
{
    (void)state;
    struct cfg c = parse_ok("expandable_segments:False,max_split_size_mb:128");
    assert_false(c.expandable_segments);
    assert_int_equal(c.max_split_size, 128 * MiB);

    c = parse_ok("max_split_size_mb:20");
    assert_int_equal(c.max_split_size, 20 * MiB);
    c = parse_ok("max_non_split_rounding_mb:64");
    assert_int_equal(c.max_non_split_rounding, 64 * MiB);
    c = parse_ok("garbage_collection_threshold:0.8");
    assert_true(c.garbage_collection_threshold == 0.8);
    c = parse_ok("expandable_segments_recycle:False");
    assert_false(c.expandable_segments_recycle);
    assert_true(c.expandable_segments);
    c = parse_ok("release_lock_on_cudamalloc:True");
    assert_true(c.release_lock_on_cudamalloc);
    c = parse_ok("release_lock_on_hipmalloc:True");
    assert_true(c.release_lock_on_cudamalloc);
    c = parse_ok("per_process_memory_fraction:0");
    assert_true(c.per_process_memory_fraction == 0.0);
    c = parse_ok("per_process_memory_fraction:1.0");
    assert_true(c.per_process_memory_fraction == 1.0);
    c = parse_ok("per_process_memory_fraction:0.5");
    assert_true(c.per_process_memory_fraction == 0.5);
    c = parse_ok("graph_capture_record_stream_reuse:True");
    assert_true(c.graph_capture_record_stream_reuse);
    c = parse_ok("backend:native");
    c = parse_ok("expandable_segments:True,");  /* trailing comma, as PyTorch accepts */
    assert_true(c.expandable_segments);
    /* The largest value (its bytes just fit a size_t) means unlimited; past it: test_overflow. */
    char most[64];
    snprintf(most, sizeof most, "max_split_size_mb:%zu", SIZE_MAX / MiB);
    c = parse_ok(most);
    assert_true(c.max_split_size == SIZE_MAX);
}

static void test_large_segment_order(void **state)
{
    (void)state;
    /* large_segment_size_mb governs the minimum of the others wherever it appears. */
    struct cfg c = parse_ok("max_split_size_mb:40,large_segment_size_mb:40");
    assert_int_equal(c.large_segment_size, 40 * MiB);
    assert_int_equal(c.max_split_size, 40 * MiB);
    /* max_non_split_rounding follows large_segment_size while it is at its default. */
    assert_int_equal(c.max_non_split_rounding, 40 * MiB);
    parse_bad("max_split_size_mb:30,large_segment_size_mb:40", "max_split_size_mb", "from 40 (large_segment_size_mb)");
    parse_bad("max_non_split_rounding_mb:30,large_segment_size_mb:40", "max_non_split_rounding_mb",
              "from 40 (large_segment_size_mb)");
    c = parse_ok("large_segment_size_mb:12,max_split_size_mb:12");
    assert_int_equal(c.max_split_size, 12 * MiB);
    parse_bad("large_segment_size_mb:10", "large_segment_size_mb", "> 10");
    parse_bad("large_segment_size_mb:21", "large_segment_size_mb", "multiple of 2");
    parse_bad("large_segment_size_mb:x", "large_segment_size_mb", "whole number");
}

/* expandable_page_size_mb: an even number of MiB >= 2, at most large_segment_size_mb; follows
 * large_segment_size_mb while equal to it; changes nothing else. */
static void test_expandable_page_size(void **state)
{
    (void)state;
    struct cfg def;
    cfg_default(&def);
    struct cfg c = parse_ok("expandable_page_size_mb:4");
    assert_int_equal(c.expandable_page_size, 4 * MiB);
    /* Nothing else moves: classic segment size and the non-split rounding stay PyTorch's. */
    c.expandable_page_size = def.expandable_page_size;
    assert_memory_equal(&c, &def, sizeof c);
    c = parse_ok("expandable_page_size_mb:2");
    assert_int_equal(c.expandable_page_size, 2 * MiB);
    c = parse_ok("expandable_page_size_mb:20");
    assert_int_equal(c.expandable_page_size, 20 * MiB);
    /* The bound follows large_segment_size_mb wherever that key appears. */
    c = parse_ok("expandable_page_size_mb:40,large_segment_size_mb:40");
    assert_int_equal(c.expandable_page_size, 40 * MiB);
    assert_int_equal(c.max_non_split_rounding, 40 * MiB);
    c = parse_ok("large_segment_size_mb:64,expandable_page_size_mb:10");
    assert_int_equal(c.expandable_page_size, 10 * MiB);
    assert_int_equal(c.large_segment_size, 64 * MiB);
    assert_int_equal(c.max_non_split_rounding, 64 * MiB);
    /* While equal to large_segment_size (the default), the page follows it. */
    c = parse_ok("large_segment_size_mb:40");
    assert_int_equal(c.expandable_page_size, 40 * MiB);

    parse_bad("expandable_page_size_mb:0", "expandable_page_size_mb", "even whole number of MiB >= 2");
    parse_bad("expandable_page_size_mb:3", "expandable_page_size_mb", "2 MiB page granularity");
    parse_bad("expandable_page_size_mb:1", "expandable_page_size_mb", "got '1' at index 24");
    parse_bad("expandable_page_size_mb:22", "expandable_page_size_mb: expected", "up to 20 (large_segment_size_mb)");
    parse_bad("expandable_page_size_mb:48,large_segment_size_mb:40", "up to 40 (large_segment_size_mb)",
              "got '48' at index 24");
    parse_bad("expandable_page_size_mb:4MB", "expandable_page_size_mb", "whole number");
    parse_bad("expandable_page_size_mb:-4", "expandable_page_size_mb", "whole number");
    parse_bad("expandable_page_size_mb:", "expandable_page_size_mb", "end of string");
    parse_bad("expandable_page_size_mb:99999999999999999999999", "expandable_page_size_mb", NULL);

    /* Not reset by a later parse, and it stops following once set apart from the segment size. */
    struct cfg base = parse_ok("expandable_page_size_mb:8"), out;
    assert_int_equal(cfg_parse("expandable_segments:False", &base, &out), XSEG_SUCCESS);
    assert_int_equal(out.expandable_page_size, 8 * MiB);
    assert_int_equal(cfg_parse("large_segment_size_mb:40", &base, &out), XSEG_SUCCESS);
    assert_int_equal(out.expandable_page_size, 8 * MiB);
    assert_int_equal(out.large_segment_size, 40 * MiB);
    /* A segment size below the page in force is refused and names both keys. */
    base = parse_ok("large_segment_size_mb:40,expandable_page_size_mb:32");
    struct cfg before = base;
    err_clear();
    assert_int_equal(cfg_parse("large_segment_size_mb:20", &base, &out), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "expandable_page_size_mb 32"));
    assert_non_null(strstr(xseg_last_error(), "large_segment_size_mb 20"));
    assert_memory_equal(&base, &before, sizeof base);
    assert_int_equal(cfg_parse("large_segment_size_mb:20,expandable_page_size_mb:4", &base, &out),
                     XSEG_SUCCESS);
    assert_int_equal(out.expandable_page_size, 4 * MiB);
}

/* Every rejected form of PyTorch's test_allocator_settings, and more. */
static void test_rejected(void **state)
{
    (void)state;
    parse_bad("foo:1", "unrecognized key 'foo' in allocator config", "index 0");
    parse_bad("expandable_segments:True,foo:1", "unrecognized key 'foo'", "index 25");
    parse_bad("garbage_collection_threshold:1.2", "garbage_collection_threshold", "(0.0, 1.0)");
    parse_bad("garbage_collection_threshold:0", "garbage_collection_threshold", "(0.0, 1.0)");
    parse_bad("garbage_collection_threshold:1", "garbage_collection_threshold", NULL);
    parse_bad("garbage_collection_threshold:abc", "garbage_collection_threshold", "'abc'");
    parse_bad("max_split_size_mb:2", "max_split_size_mb", "from 20 (large_segment_size_mb)");
    parse_bad("max_split_size_mb:-1", "max_split_size_mb", "whole number");
    parse_bad("max_split_size_mb:1.5", "max_split_size_mb", "whole number");
    parse_bad("max_non_split_rounding_mb:5", "max_non_split_rounding_mb", "from 20 (large_segment_size_mb)");
    parse_bad("release_lock_on_cudamalloc:none", "release_lock_on_cudamalloc",
              "expected True or False, got 'none'");
    parse_bad("release_lock_on_cudamalloc:1", "release_lock_on_cudamalloc", "True or False");
    parse_bad("expandable_segments:yes", "expandable_segments: expected True or False, got 'yes'",
              "index 20");
    parse_bad("expandable_segments:true", "expandable_segments", "'true'");
    parse_bad("expandable_segments_recycle:1", "expandable_segments_recycle: expected True or False, got '1'",
              NULL);
    parse_bad("per_process_memory_fraction:-0.1", "per_process_memory_fraction", "[0.0, 1.0]");
    parse_bad("per_process_memory_fraction:1.1", "per_process_memory_fraction", "[0.0, 1.0]");
    parse_bad("per_process_memory_fraction:nan", "per_process_memory_fraction", NULL);
    parse_bad("backend:foo", "backend", "native");
    /* Grammar errors name the key and the form, with a position. */
    parse_bad("expandable_segments", "expandable_segments", "':'");
    parse_bad("expandable_segments:", "expandable_segments", "end of string");
    parse_bad("expandable_segments:True:False", "expandable_segments", "','");
    parse_bad(":True", "expected a key", "index 0");
    parse_bad(",expandable_segments:True", "expected a key", NULL);
    parse_bad("expandable_segments:True,,", "expected a key", NULL);
    parse_bad("garbage_collection_threshold:[0.5]", "garbage_collection_threshold", "'['");
}

static void test_pinned_ignored(void **state)
{
    (void)state;
    struct cfg def;
    cfg_default(&def);
    struct cfg c = parse_ok("pinned_reserve_segment_size_mb:64,pinned_free_catch_all:True");
    assert_memory_equal(&c, &def, sizeof c);
    /* The keys xseg's host allocator honours (core/services/hostalloc.c). */
    c = parse_ok("pinned_use_cuda_host_register:True,pinned_num_register_threads:8,"
                 "pinned_use_background_threads:True");
    assert_true(c.pinned_use_cuda_host_register);
    assert_int_equal(c.pinned_num_register_threads, 8);
    assert_true(c.pinned_use_background_threads);
    c = parse_ok("pinned_use_hip_host_register:True,sleep_keep_host_backup:True");
    assert_true(c.pinned_use_cuda_host_register);
    assert_true(c.sleep_keep_host_backup);
    assert_int_equal(def.pinned_num_register_threads, 1);
    parse_bad("pinned_num_register_threads:3", "pinned_num_register_threads", "power of 2");
    parse_bad("pinned_num_register_threads:256", "pinned_num_register_threads", "128");
    parse_bad("pinned_use_cuda_host_register:1", "pinned_use_cuda_host_register", "True or False");
    parse_bad("pinned_reserve_segment_size_mb:0", "pinned_reserve_segment_size_mb", "from 1 to");
}

/* The bounded integers (CFG_BOUNDED rows, one parser): the largest value is accepted, anything
 * else (above it, not a whole number, not a power of 2 where one is needed, empty) is refused with
 * a message naming the key and the whole range. */
static void test_bounded(void **state)
{
    (void)state;
    struct cfg c = parse_ok("memory_group_wait_ms:60000,idle_release_ms:86400000,pinned_num_register_threads:128");
    assert_int_equal(c.memory_group_wait_ms, 60000);
    assert_int_equal(c.idle_release_ms, 86400000);
    assert_int_equal(c.pinned_num_register_threads, 128);
    c = parse_ok("memory_group_wait_ms:0,idle_release_ms:0,pinned_num_register_threads:1");
    assert_int_equal(c.memory_group_wait_ms, 0);
    assert_int_equal(c.pinned_num_register_threads, 1);
    const char *const bad[][2] = {
        {"memory_group_wait_ms:60001", "memory_group_wait_ms: expected a whole number from 0 to 60000 (ms), got '60001'"},
        {"memory_group_wait_ms:-1", "memory_group_wait_ms: expected a whole number from 0 to 60000 (ms), got '-1'"},
        {"memory_group_wait_ms:1.5", "memory_group_wait_ms: expected a whole number from 0 to 60000 (ms)"},
        {"memory_group_wait_ms:", "memory_group_wait_ms: expected a whole number from 0 to 60000 (ms)"},
        {"idle_release_ms:86400001", "idle_release_ms: expected a whole number from 0 to 86400000 (ms)"},
        {"idle_release_ms:soon", "idle_release_ms: expected a whole number from 0 to 86400000 (ms), got 'soon'"},
        {"pinned_num_register_threads:0", "pinned_num_register_threads: expected a power of 2 from 1 to 128 (threads)"},
        {"pinned_num_register_threads:3", "pinned_num_register_threads: expected a power of 2 from 1 to 128 (threads)"},
        {"pinned_num_register_threads:256", "pinned_num_register_threads: expected a power of 2 from 1 to 128"},
        {"pinned_num_register_threads:99999999999999999999999", "pinned_num_register_threads: expected a power of 2"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        parse_bad(bad[i][0], bad[i][1], "at index");
}

/* The bounded byte sizes (CFG_BOUNDED_MIB rows, the same parser): both ends are accepted and
 * held in bytes; zero, garbage and one past either end are refused naming the key and the range;
 * a budget of 0 (none) is the default, which the canonical string leaves out. */
static void test_bounded_mib(void **state)
{
    (void)state;
    struct cfg def;
    cfg_default(&def);
    assert_int_equal(def.sleep_copy_chunk, 64 * MiB);
    assert_int_equal(def.memory_budget, 0);
    assert_int_equal(def.memory_group_budget, 0);
    struct cfg c = parse_ok("sleep_copy_chunk_mb:1,memory_budget_mb:1073741824,memory_group_budget_mb:1");
    assert_int_equal(c.sleep_copy_chunk, MiB);
    assert_true(c.memory_budget == ((size_t)1 << 30) * MiB);
    assert_int_equal(c.memory_group_budget, MiB);
    char buf[2048];
    cfg_format(&c, buf, sizeof buf, NULL);
    assert_non_null(strstr(buf, ",memory_budget_mb:1073741824,memory_group_budget_mb:1,"));
    assert_non_null(strstr(buf, ",sleep_copy_chunk_mb:1"));
    c = parse_ok("sleep_copy_chunk_mb:1024,memory_budget_mb:0,memory_group_budget_mb:0");
    assert_int_equal(c.sleep_copy_chunk, 1024 * MiB);
    assert_int_equal(c.memory_budget, 0);
    cfg_format(&c, buf, sizeof buf, NULL);
    assert_null(strstr(buf, "budget"));
    assert_non_null(strstr(buf, ",sleep_copy_chunk_mb:1024"));
    /* sleep_copy_batch_kb (issue 74 item 7): 128 by default (left out of the string), 0 turns the
     * batches off, 65536 at most. */
    assert_int_equal(def.sleep_copy_batch_kb, 128);
    c = parse_ok("sleep_copy_batch_kb:0");
    assert_int_equal(c.sleep_copy_batch_kb, 0);
    cfg_format(&c, buf, sizeof buf, NULL);
    assert_non_null(strstr(buf, "sleep_copy_batch_kb:0"));
    c = parse_ok("sleep_copy_batch_kb:65536");
    assert_int_equal(c.sleep_copy_batch_kb, 65536);
    cfg_format(&def, buf, sizeof buf, NULL);
    assert_null(strstr(buf, "sleep_copy_batch_kb"));
    const char *const bad[][2] = {
        {"sleep_copy_batch_kb:65537", "sleep_copy_batch_kb: expected a whole number from 0 to 65536"},
        {"sleep_copy_batch_kb:-1", "sleep_copy_batch_kb: expected a whole number from 0 to 65536"},
        {"sleep_copy_chunk_mb:0", "sleep_copy_chunk_mb: expected a whole number from 1 to 1024 (MiB), got '0'"},
        {"sleep_copy_chunk_mb:1025", "sleep_copy_chunk_mb: expected a whole number from 1 to 1024 (MiB), got '1025'"},
        {"sleep_copy_chunk_mb:64M", "sleep_copy_chunk_mb: expected a whole number from 1 to 1024 (MiB), got '64M'"},
        {"sleep_copy_chunk_mb:", "sleep_copy_chunk_mb: expected a whole number from 1 to 1024 (MiB), got 'end of string'"},
        {"memory_budget_mb:1073741825", "memory_budget_mb: expected a whole number from 0 to 1073741824 (MiB), got '1073741825'"},
        {"memory_budget_mb:-1", "memory_budget_mb: expected a whole number from 0 to 1073741824 (MiB), got '-1'"},
        {"memory_budget_mb:99999999999999999999999", "memory_budget_mb: expected a whole number from 0 to 1073741824"},
        {"memory_group_budget_mb:0.5", "memory_group_budget_mb: expected a whole number from 0 to 1073741824 (MiB), got '0.5'"},
        {"memory_group_budget_mb:1073741825", "memory_group_budget_mb: expected a whole number from 0 to 1073741824 (MiB)"},
        {"pinned_reserve_segment_size_mb:0", "pinned_reserve_segment_size_mb: expected a whole number from 1 to"},
        {"pinned_reserve_segment_size_mb:x", "pinned_reserve_segment_size_mb: expected a whole number from 1 to"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        parse_bad(bad[i][0], bad[i][1], "at index");
}

/* Every numeric key (the rows walked, so a key added later is covered) refuses a value past the
 * integer parse and, in MiB, one whose bytes overflow a size_t, with a message naming the key and
 * its range and quoting the value as typed: no silent "unlimited" for max_split_size_mb, no
 * saturated 18446744073709551615 for expandable_chunk_mb. The largest value of the keys whose
 * bound is what fits in bytes is still accepted. */
static void test_overflow(void **state)
{
    (void)state;
    char past_bytes[32], most[32], s[256], quoted[64];
    snprintf(past_bytes, sizeof past_bytes, "%zu", SIZE_MAX / MiB + 1);
    snprintf(most, sizeof most, "%zu", SIZE_MAX / MiB);
    const char *const values[] = {"99999999999999999999", "18446744073709551616", "18446744073709551615",
                                  past_bytes, "1e999"};
    size_t numeric = 0;
    for (size_t k = 0; k < cfg_nkeys; k++) {
        const struct cfg_key *row = &cfg_keys[k];
        bool whole = row->kind == CFG_KIND_MIB || row->kind == CFG_KIND_MS || row->kind == CFG_KIND_COUNT ||
                     row->unit; /* an IGNORED row parsed as a bounded number */
        if (!whole && row->kind != CFG_KIND_FRACTION && row->kind != CFG_KIND_ROUNDUP)
            continue;
        numeric++;
        /* The range, as each kind's message spells it. */
        const char *range = row->kind == CFG_KIND_FRACTION ? ".0, 1.0" : row->kind == CFG_KIND_ROUNDUP ? "up to " : " to ";
        for (size_t v = 0; v < sizeof values / sizeof *values; v++) {
            snprintf(s, sizeof s, "%s:%s", row->name, values[v]);
            snprintf(quoted, sizeof quoted, "got '%s' at index %zu", values[v], strlen(row->name) + 1);
            parse_bad(s, row->name, quoted);
            if (!strstr(xseg_last_error(), range))
                fail_msg("message for \"%s\" names no range ('%s'): %s", s, range, xseg_last_error());
        }
    }
    assert_true(numeric >= 16);
    /* A roundup_power2_divisions interval past the integer parse. */
    parse_bad("roundup_power2_divisions:[99999999999999999999:4]", "'99999999999999999999' at index 26", "2^63");
    /* Where the bound is what fits in bytes, that value is accepted: unlimited, a rounding limit, unset. */
    snprintf(s, sizeof s, "max_split_size_mb:%s,max_non_split_rounding_mb:%s,release_threshold_mb:%s", most, most,
             most);
    struct cfg c = parse_ok(s);
    assert_true(c.max_split_size == SIZE_MAX);
    assert_true(c.max_non_split_rounding == SIZE_MAX / MiB * MiB);
    assert_true(c.release_threshold == SIZE_MAX);
    /* After a valid key too, and after large_segment_size_mb (checked once the string is read). */
    parse_bad("large_segment_size_mb:40,max_split_size_mb:99999999999999999999",
              "max_split_size_mb: expected a whole number of MiB", "got '99999999999999999999' at index 43");
    parse_bad("expandable_chunk_mb:0099999999999999999999", "expandable_chunk_mb",
              "got '0099999999999999999999' at index 20");
}

/* Keys PyTorch 2.12+ accepts (issue 34): an inherited PYTORCH_ALLOC_CONF must not fail. */
static void test_pytorch_212_keys(void **state)
{
    (void)state;
    struct cfg def;
    cfg_default(&def);
    struct cfg c = parse_ok("throw_on_cudamalloc_oom:True,expandable_segments_reserve:0.5,"
                            "expandable_segments_reserve_by_class:[large:64G,small:0.25],"
                            "backend:cudaMallocAsync,expandable_segments_reserve:8G");
    assert_memory_equal(&c, &def, sizeof c);
    parse_ok("throw_on_cudamalloc_oom:False,backend:hipMallocAsync");
    parse_bad("throw_on_cudamalloc_oom:yes", "throw_on_cudamalloc_oom", "True or False");
    parse_bad("expandable_segments_reserve_by_class:[large:1", "expandable_segments_reserve_by_class", "']'");
    parse_bad("expandable_segments_reserve:", "expandable_segments_reserve", "end of string");
    parse_bad("throw_on_cudamalloc_oom_x:True", "unrecognized key 'throw_on_cudamalloc_oom_x'", NULL);
}

static void test_whitespace(void **state)
{
    (void)state;
    struct cfg c = parse_ok("  expandable_segments : False ,\tmax_split_size_mb: 256 ,"
                            " roundup_power2_divisions : [ 256 : 1 , > : 4 ] ");
    assert_false(c.expandable_segments);
    assert_int_equal(c.max_split_size, 256 * MiB);
    assert_int_equal(c.roundup_power2_divisions[8], 1);
    assert_int_equal(c.roundup_power2_divisions[9], 4);
    assert_int_equal(c.roundup_power2_divisions[0], 1);
}

static void test_reset_rule(void **state)
{
    (void)state;
    struct cfg a = parse_ok("max_split_size_mb:128,garbage_collection_threshold:0.5,"
                            "roundup_power2_divisions:4,expandable_segments:False,"
                            "release_lock_on_cudamalloc:True,per_process_memory_fraction:0.25");
    struct cfg b;
    assert_int_equal(cfg_parse("graph_capture_record_stream_reuse:True", &a, &b), XSEG_SUCCESS);
    /* The three reset keys go back to their defaults... */
    assert_true(b.max_split_size == SIZE_MAX);
    assert_true(b.garbage_collection_threshold == 0.0);
    for (int k = 0; k < CFG_ROUNDUP_BUCKETS; k++)
        assert_int_equal(b.roundup_power2_divisions[k], 0);
    /* ...the rest keep the base's value. */
    assert_false(b.expandable_segments);
    assert_true(b.release_lock_on_cudamalloc);
    assert_true(b.per_process_memory_fraction == 0.25);
    assert_true(b.graph_capture_record_stream_reuse);
    /* out may alias base. */
    assert_int_equal(cfg_parse("expandable_segments:True", &a, &a), XSEG_SUCCESS);
    assert_true(a.expandable_segments);
    assert_true(a.max_split_size == SIZE_MAX);
    /* A failed parse leaves an aliased out untouched too. */
    struct cfg keep = b;
    assert_int_equal(cfg_parse("max_split_size_mb:64,foo:1", &b, &b), XSEG_ERROR_INVALID_VALUE);
    assert_memory_equal(&b, &keep, sizeof b);
}

static void test_roundup_single(void **state)
{
    (void)state;
    struct cfg c = parse_ok("roundup_power2_divisions:4");
    /* 1200 B is in the first bucket: 4 divisions (the allocator applies them only above 512 B x 4;
     * see docs/configuration.md). */
    assert_int_equal(cfg_roundup_divisions(&c, 1200), 4);
    assert_int_equal(cfg_roundup_divisions(&c, 512 * MiB), 4);
    assert_int_equal(cfg_roundup_divisions(&c, (size_t)1 << 40), 4);
    c = parse_ok("roundup_power2_divisions:0");
    assert_int_equal(cfg_roundup_divisions(&c, 1200), 0);
    c = parse_ok("roundup_power2_divisions:1");
    assert_int_equal(cfg_roundup_divisions(&c, 1200), 1);
    parse_bad("roundup_power2_divisions:3", "roundup_power2_divisions", "power of 2 or 0");
    parse_bad("roundup_power2_divisions:-4", "roundup_power2_divisions", "power of 2 or 0");
    struct cfg d;
    cfg_default(&d);
    assert_int_equal(cfg_roundup_divisions(&d, 1200), 0);
}

static void test_roundup_list(void **state)
{
    (void)state;
    struct cfg c = parse_ok("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]");
    const unsigned *d = c.roundup_power2_divisions;
    /* The first entry (256 MB = bucket 8) also fills buckets 0..7. */
    for (int b = 0; b <= 8; b++)
        assert_int_equal(d[b], 1);
    assert_int_equal(d[9], 2);
    assert_int_equal(d[10], 4);
    for (int b = 11; b < CFG_ROUNDUP_BUCKETS; b++)
        assert_int_equal(d[b], 8);
    assert_int_equal(cfg_roundup_divisions(&c, 1200), 1);
    assert_int_equal(cfg_roundup_divisions(&c, 255 * MiB), 1);
    assert_int_equal(cfg_roundup_divisions(&c, 256 * MiB), 1);
    assert_int_equal(cfg_roundup_divisions(&c, 511 * MiB), 1);
    assert_int_equal(cfg_roundup_divisions(&c, 512 * MiB), 2);
    assert_int_equal(cfg_roundup_divisions(&c, 1024 * MiB), 4);
    assert_int_equal(cfg_roundup_divisions(&c, 2048 * MiB - 1), 4);
    assert_int_equal(cfg_roundup_divisions(&c, 2048 * MiB), 8);
    assert_int_equal(cfg_roundup_divisions(&c, SIZE_MAX), 8);

    /* PyTorch's test_allocator_settings list. */
    c = parse_ok("roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]");
    assert_int_equal(cfg_roundup_divisions(&c, 1 * MiB), 8);
    assert_int_equal(cfg_roundup_divisions(&c, 100 * MiB), 8);
    assert_int_equal(cfg_roundup_divisions(&c, 128 * MiB), 2);
    assert_int_equal(cfg_roundup_divisions(&c, 1536 * MiB), 1);
    assert_int_equal(cfg_roundup_divisions(&c, 40 * XSEG_GiB), 1);

    /* Buckets not named stay 0; intervals beyond 32 GiB clamp to the last bucket. */
    c = parse_ok("roundup_power2_divisions:[2:4,65536:16]");
    assert_int_equal(c.roundup_power2_divisions[0], 4);
    assert_int_equal(c.roundup_power2_divisions[1], 4);
    assert_int_equal(c.roundup_power2_divisions[2], 0);
    assert_int_equal(c.roundup_power2_divisions[15], 16);
    /* '>' alone fills everything. */
    c = parse_ok("roundup_power2_divisions:[>:2]");
    for (int b = 0; b < CFG_ROUNDUP_BUCKETS; b++)
        assert_int_equal(c.roundup_power2_divisions[b], 2);

    parse_bad("roundup_power2_divisions:[100:4]", "roundup_power2_divisions", "'100'");
    parse_bad("roundup_power2_divisions:[256:3]", "roundup_power2_divisions", "power of 2 or 0");
    parse_bad("roundup_power2_divisions:[256:4", "roundup_power2_divisions", "end of string");
    parse_bad("roundup_power2_divisions:[256,4]", "roundup_power2_divisions", "':'");
    parse_bad("roundup_power2_divisions:[]", "roundup_power2_divisions", "']'");
    parse_bad("roundup_power2_divisions:[256:4,]", "roundup_power2_divisions", NULL);
}

static void round_trip(const char *s)
{
    struct cfg a = parse_ok(s), b, def;
    char buf[1024];
    size_t len = 0;
    cfg_format(&a, buf, sizeof buf, &len);
    assert_int_equal(len, strlen(buf));
    /* Read back on top of a different base: the string must carry every non-reset key. */
    cfg_default(&def);
    def.expandable_segments = !a.expandable_segments;
    def.release_lock_on_cudamalloc = !a.release_lock_on_cudamalloc;
    def.per_process_memory_fraction = 0.125;
    if (cfg_parse(buf, &def, &b) != XSEG_SUCCESS)
        fail_msg("canonical '%s' does not parse: %s", buf, xseg_last_error());
    if (memcmp(&a, &b, sizeof a))
        fail_msg("round trip of '%s' through '%s' differs", s, buf);
}

static void test_format_round_trip(void **state)
{
    (void)state;
    round_trip("");
    round_trip("expandable_segments:False");
    round_trip("max_split_size_mb:128,garbage_collection_threshold:0.8");
    round_trip("roundup_power2_divisions:4");
    round_trip("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]");
    round_trip("large_segment_size_mb:64,max_non_split_rounding_mb:100,per_process_memory_fraction:"
               "0.3333333333333333");
    round_trip("expandable_page_size_mb:4");
    round_trip("large_segment_size_mb:64,expandable_page_size_mb:10");
    round_trip("release_lock_on_cudamalloc:True,graph_capture_record_stream_reuse:True,"
               "garbage_collection_threshold:0.1234567890123");

    /* snprintf semantics: truncated output is NUL-terminated and len is the full length. */
    struct cfg c = parse_ok("roundup_power2_divisions:[256:1,>:8]");
    char full[1024], small[16];
    size_t flen, slen;
    cfg_format(&c, full, sizeof full, &flen);
    cfg_format(&c, small, sizeof small, &slen);
    assert_int_equal(flen, slen);
    assert_int_equal(strlen(small), sizeof small - 1);
    assert_memory_equal(small, full, sizeof small - 1);
    cfg_format(&c, NULL, 0, &slen);
    assert_int_equal(flen, slen);
    assert_non_null(strstr(full, "expandable_segments:True"));
}

static void test_env_order(void **state)
{
    (void)state;
    const char *var = "x";
    unsetenv("XSEG_ALLOC_CONF");
    unsetenv("PYTORCH_CUDA_ALLOC_CONF");
    unsetenv("PYTORCH_ALLOC_CONF");
    assert_null(cfg_from_env(&var));
    assert_null(var);
    setenv("PYTORCH_ALLOC_CONF", "c", 1);
    assert_string_equal(cfg_from_env(&var), "c");
    assert_string_equal(var, "PYTORCH_ALLOC_CONF");
    setenv("PYTORCH_CUDA_ALLOC_CONF", "b", 1);
    assert_string_equal(cfg_from_env(&var), "b");
    assert_string_equal(var, "PYTORCH_CUDA_ALLOC_CONF");
    setenv("XSEG_ALLOC_CONF", "", 1); /* set, even if empty, wins */
    assert_string_equal(cfg_from_env(NULL), "");
    unsetenv("XSEG_ALLOC_CONF");
    unsetenv("PYTORCH_CUDA_ALLOC_CONF");
    unsetenv("PYTORCH_ALLOC_CONF");
}

static void test_null_args(void **state)
{
    (void)state;
    struct cfg c;
    cfg_default(&c);
    assert_int_equal(cfg_parse(NULL, &c, &c), XSEG_ERROR_INVALID_VALUE);
    assert_int_equal(cfg_parse("", NULL, &c), XSEG_ERROR_INVALID_VALUE);
    assert_int_equal(cfg_parse("", &c, NULL), XSEG_ERROR_INVALID_VALUE);
    /* Over-long words are an error, not an overflow. */
    char big[600];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    assert_int_equal(cfg_parse(big, &c, &c), XSEG_ERROR_INVALID_VALUE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),        cmocka_unit_test(test_accepted),
        cmocka_unit_test(test_large_segment_order), cmocka_unit_test(test_rejected),
        cmocka_unit_test(test_expandable_page_size),
        cmocka_unit_test(test_pinned_ignored),  cmocka_unit_test(test_bounded), cmocka_unit_test(test_bounded_mib),
        cmocka_unit_test(test_pytorch_212_keys), cmocka_unit_test(test_overflow),
        cmocka_unit_test(test_whitespace),
        cmocka_unit_test(test_reset_rule),      cmocka_unit_test(test_roundup_single),
        cmocka_unit_test(test_roundup_list),    cmocka_unit_test(test_format_round_trip),
        cmocka_unit_test(test_env_order),       cmocka_unit_test(test_null_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
