/*
 * Sleep and wake by tag through the public API (xseg_pool_set_tag, xseg_sleep_tags,
 * xseg_wake_tags): vLLM's two sleep levels over tagged pools (weights, KV cache, a CUDA graph's
 * pool) beside an untagged pool that is never touched, a graph replayed bit-exact after a tagged
 * wake, the wake's order, and the all-or-nothing sleep and the retried wake under driver faults.
 * Device data is read and written only through driver copies. One process per test.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/common/testutil.h"
#include "tests/services/fixture.h"
#include "xseg.h"

static const xseg_pool_id DEFAULT_POOL = {0, 0};

static xseg_sleep_stats stats_of(xseg_pool_id pool)
{
    xseg_sleep_stats st;
    assert_int_equal(xseg_get_sleep_stats(0, &pool, &st), XSEG_SUCCESS);
    return st;
}

/* A private pool holding one block of @p size bytes filled with tu_fill's pattern @p fill. */
static xseg_pool_id pool_with(size_t size, uint32_t fill, void **block)
{
    xseg_pool_id pool;
    assert_int_equal(xseg_pool_create(&pool), XSEG_SUCCESS);
    assert_int_equal(xseg_begin_allocate_to_pool(0, pool, NULL, NULL), XSEG_SUCCESS);
    *block = tu_malloc(size, NULL);
    assert_int_equal(xseg_end_allocate_to_pool(0, pool), XSEG_SUCCESS);
    tu_assert_cu(tu_fill((CUdeviceptr)*block, size, fill));
    return pool;
}

static void tag(xseg_pool_id pool, const char *t) { assert_int_equal(xseg_pool_set_tag(0, pool, t), XSEG_SUCCESS); }

/* Does every byte of [p, p + n) read @p v (a driver copy)? */
static bool reads(void *p, size_t n, unsigned char v)
{
    unsigned char *buf = malloc(n);
    assert_non_null(buf);
    tu_assert_cu(drv->cuMemcpyDtoH(buf, (CUdeviceptr)p, n));
    size_t i = 0;
    while (i < n && buf[i] == v)
        i++;
    free(buf);
    return i == n;
}

/* Does a malloc routed to @p pool fail because it sleeps? */
static bool refuses(xseg_pool_id pool)
{
    assert_int_equal(xseg_begin_allocate_to_pool(0, pool, NULL, NULL), XSEG_SUCCESS);
    void *p = NULL;
    xseg_status st = xseg_malloc(&p, MiB, 0, NULL);
    assert_int_equal(xseg_end_allocate_to_pool(0, pool), XSEG_SUCCESS);
    assert_int_equal(xseg_release_pool(0, pool), XSEG_SUCCESS); /* the begin's use */
    if (st == XSEG_SUCCESS)
        tu_free(p);
    return st == XSEG_ERROR_ILLEGAL_STATE && strstr(xseg_last_error(), "asleep");
}

/* Every pool freed and released, the caches emptied: nothing left with the driver. */
static void release_all(xseg_pool_id *pools, size_t n)
{
    for (size_t i = 0; i < n; i++)
        assert_int_equal(xseg_release_pool(0, pools[i]), XSEG_SUCCESS);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(xseg_host_empty_cache(), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    struct cudaemu_live lv;
    if (tu_live(&lv)) {
        assert_int_equal(lv.handles, 0);
        assert_int_equal(tu_host_live(NULL), 0);
    }
}

/* Tags: set, read, replaced, cleared; bad tags and lists refused with what was wrong. */
static void test_tags_errors(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:True");
    int ndev = 0;
    assert_int_equal(xseg_device_count(&ndev), XSEG_SUCCESS);
    void *w;
    xseg_pool_id pw = pool_with(4 * MiB, 1, &w);
    char buf[XSEG_TAG_MAX];
    assert_int_equal(xseg_pool_get_tag(0, pw, buf, sizeof buf), XSEG_SUCCESS);
    assert_string_equal(buf, "");
    tag(pw, "weights");
    assert_int_equal(xseg_pool_get_tag(0, pw, buf, sizeof buf), XSEG_SUCCESS);
    assert_string_equal(buf, "weights");
    assert_int_equal(xseg_pool_get_tag(0, pw, buf, 7), XSEG_ERROR_INVALID_VALUE); /* no room for the NUL */
    assert_non_null(strstr(xseg_last_error(), "needs 8 bytes"));
    assert_int_equal(xseg_pool_get_tag(0, pw, NULL, 8), XSEG_ERROR_INVALID_VALUE);
    tag(pw, "model.v2-a_B"); /* replaced */
    assert_int_equal(xseg_pool_get_tag(0, pw, buf, sizeof buf), XSEG_SUCCESS);
    assert_string_equal(buf, "model.v2-a_B");
    assert_int_equal(xseg_pool_set_tag(0, pw, "kv cache"), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "other than letters"));
    assert_int_equal(xseg_pool_set_tag(0, pw, "0123456789012345678901234567890123"), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "1 to 31 characters"));
    assert_int_equal(xseg_pool_set_tag(ndev, pw, "weights"), XSEG_ERROR_INVALID_DEVICE);
    assert_int_equal(xseg_pool_get_tag(0, pw, buf, sizeof buf), XSEG_SUCCESS);
    assert_string_equal(buf, "model.v2-a_B"); /* a refused tag changed nothing */
    tag(pw, "weights");

    xseg_tag_sleep one[] = {{"weights", XSEG_SLEEP_OFFLOAD}};
    xseg_tag_sleep bad_flags[] = {{"weights", XSEG_SLEEP_OFFLOAD_FILE}};
    assert_int_equal(xseg_sleep_tags(0, bad_flags, 1), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "xseg_sleep_ex"));
    xseg_tag_sleep twice[] = {{"weights", XSEG_SLEEP_OFFLOAD}, {"weights", XSEG_SLEEP_DISCARD}};
    assert_int_equal(xseg_sleep_tags(0, twice, 2), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "given twice"));
    xseg_tag_sleep typo[] = {{"weights", XSEG_SLEEP_OFFLOAD}, {"kv-cache", XSEG_SLEEP_DISCARD}};
    assert_int_equal(xseg_sleep_tags(0, typo, 2), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "no pool of device 0 carries tag 'kv-cache' (its tags: 'weights')"));
    assert_int_equal(xseg_sleep_tags(0, one, 0), XSEG_ERROR_INVALID_VALUE);
    assert_int_equal(xseg_sleep_tags(0, NULL, 1), XSEG_ERROR_INVALID_VALUE);
    assert_int_equal(xseg_sleep_tags(ndev, one, 1), XSEG_ERROR_INVALID_DEVICE);
    assert_int_equal(stats_of(pw).asleep, 0); /* nothing slept */
    const char *wk[] = {"weights"}, *bad[] = {"weights!"};
    assert_int_equal(xseg_wake_tags(0, wk, 1), XSEG_ERROR_ILLEGAL_STATE);
    assert_non_null(strstr(xseg_last_error(), "is asleep"));
    assert_int_equal(xseg_wake_tags(0, bad, 1), XSEG_ERROR_INVALID_VALUE);
    assert_int_equal(xseg_wake_tags(0, NULL, 1), XSEG_ERROR_INVALID_VALUE);

    /* Cleared: the tag is unknown again. */
    assert_int_equal(xseg_pool_set_tag(0, pw, NULL), XSEG_SUCCESS);
    assert_int_equal(xseg_pool_get_tag(0, pw, buf, sizeof buf), XSEG_SUCCESS);
    assert_string_equal(buf, "");
    assert_int_equal(xseg_sleep_tags(0, one, 1), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "no pool of it is tagged"));
    /* A tagged pool that never allocated on the device is left alone: nothing to sleep. */
    xseg_pool_id empty;
    assert_int_equal(xseg_pool_create(&empty), XSEG_SUCCESS);
    tag(empty, "weights");
    assert_int_equal(xseg_sleep_tags(0, one, 1), XSEG_SUCCESS);
    assert_int_equal(stats_of(pw).asleep, 0);
    assert_int_equal(xseg_wake_tags(0, wk, 1), XSEG_ERROR_ILLEGAL_STATE);
    /* A tag goes with its pool: once released and its memory given back, the tag is dropped. */
    void *s;
    xseg_pool_id px = pool_with(2 * MiB, 4, &s);
    tag(px, "scratch");
    xseg_tag_sleep scratch[] = {{"scratch", XSEG_SLEEP_DISCARD}};
    const char *wk_s[] = {"scratch"};
    assert_int_equal(xseg_sleep_tags(0, scratch, 1), XSEG_SUCCESS);
    assert_int_equal(xseg_wake_tags(0, wk_s, 1), XSEG_SUCCESS);
    tu_free(s);
    assert_int_equal(xseg_release_pool(0, px), XSEG_SUCCESS);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(xseg_sleep_tags(0, scratch, 1), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "no pool of device 0 carries tag 'scratch'"));
    assert_int_equal(xseg_pool_get_tag(0, px, buf, sizeof buf), XSEG_SUCCESS);
    assert_string_equal(buf, "");
    tu_free(w);
    release_all(&pw, 1);
}

/* vLLM's level 1 (offload the weights, discard the KV cache and the rest) and level 2 (discard
 * everything) over tagged pools; the untagged default pool keeps its pages and data throughout.
 * The wake goes tag by tag: the weights first (an RL step updates them), the KV cache later. */
static void test_tags_levels(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:True,expandable_segments_recycle:False");
    void *w, *kv, *act;
    xseg_pool_id pw = pool_with(24 * MiB, 1, &w), pk = pool_with(40 * MiB, 2, &kv);
    xseg_pool_id pools[] = {pw, pk};
    act = tu_malloc(6 * MiB, NULL); /* the default pool, untagged */
    tu_assert_cu(tu_fill((CUdeviceptr)act, 6 * MiB, 3));
    tag(pw, "weights");
    tag(pk, "kv_cache");
    int64_t reserved = tu_stat("reserved_bytes.all.current");

    for (int level = 1; level <= 2; level++) {
        xseg_tag_sleep lv[] = {{"weights", level == 1 ? XSEG_SLEEP_OFFLOAD : XSEG_SLEEP_DISCARD},
                               {"kv_cache", XSEG_SLEEP_DISCARD}};
        assert_int_equal(xseg_sleep_tags(0, lv, 2), XSEG_SUCCESS);
        xseg_sleep_stats sw = stats_of(pw), sk = stats_of(pk), all;
        assert_int_equal(sw.asleep, 1);
        assert_int_equal(sk.asleep, 1);
        assert_int_equal(stats_of(DEFAULT_POOL).asleep, 0);
        assert_int_equal(sw.flags, level == 1 ? XSEG_SLEEP_OFFLOAD : XSEG_SLEEP_DISCARD);
        assert_int_equal(level == 1 ? sw.offloaded_bytes : sw.discarded_bytes, 24 * MiB);
        assert_int_equal(sk.discarded_bytes, 40 * MiB);
        assert_int_equal(xseg_get_sleep_stats(0, NULL, &all), XSEG_SUCCESS);
        assert_int_equal(all.asleep, 2);
        /* Every page of both pools went back; the default pool's stayed, with its data. */
        assert_int_equal(tu_stat("reserved_bytes.all.current"), reserved - (int64_t)(sw.released_bytes + sk.released_bytes));
        assert_true(tu_check((CUdeviceptr)act, 6 * MiB, 3));
        assert_true(refuses(pw));
        assert_true(refuses(pk));
        /* Asleep already: refused, nothing changed. */
        assert_int_equal(xseg_sleep_tags(0, lv, 2), XSEG_ERROR_ILLEGAL_STATE);
        assert_non_null(strstr(xseg_last_error(), "(tag 'weights')"));

        /* The weights first: the KV cache still sleeps. */
        const char *first[] = {"weights"}, *rest[] = {"kv_cache", "weights"};
        assert_int_equal(xseg_wake_tags(0, first, 1), XSEG_SUCCESS);
        assert_int_equal(stats_of(pw).asleep, 0);
        assert_int_equal(stats_of(pk).asleep, 1);
        assert_true(refuses(pk));
        if (level == 1)
            assert_true(tu_check((CUdeviceptr)w, 24 * MiB, 1));
        else
            assert_true(reads(w, 24 * MiB, 0)); /* discarded: zeros */
        tu_assert_cu(tu_fill((CUdeviceptr)w, 24 * MiB, 1)); /* the trainer's new weights */
        /* Awake pools of the tags are left alone: the same call finishes the wake. */
        assert_int_equal(xseg_wake_tags(0, rest, 2), XSEG_SUCCESS);
        assert_int_equal(stats_of(pk).asleep, 0);
        assert_true(reads(kv, 40 * MiB, 0));
        assert_true(tu_check((CUdeviceptr)w, 24 * MiB, 1));
        assert_true(tu_check((CUdeviceptr)act, 6 * MiB, 3));
        assert_int_equal(tu_stat("reserved_bytes.all.current"), reserved);
        assert_int_equal(xseg_wake_tags(0, rest, 2), XSEG_ERROR_ILLEGAL_STATE); /* nothing asleep */
        tu_assert_cu(tu_fill((CUdeviceptr)kv, 40 * MiB, 2));
    }
    tu_free(w);
    tu_free(kv);
    tu_free(act);
    release_all(pools, 2);
}

/* The bytes of a block, read back with a driver copy. */
static unsigned char *read_back(CUdeviceptr p, size_t n)
{
    unsigned char *buf = malloc(n);
    assert_non_null(buf);
    tu_assert_cu(drv->cuMemcpyDtoH(buf, p, n));
    return buf;
}

/* A CUDA graph whose private pool (tagged "graphs") and whose input's pool (tagged "weights")
 * slept replays bit-exact after the tagged wake. The capture copies the input into an
 * intermediate (freed in the capture: its pages stay in the graph's pool) and that into the
 * output; the nodes hold raw addresses, so the wake must map every page where it was. The
 * weights are offloaded and come back byte for byte; the graph's pool is discarded (its output
 * reads zero until the replay writes it again). */
static void test_tags_graph_replay(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:True,expandable_segments_recycle:False");
    const struct tu_graph_api *gx = tu_graph();
    const size_t n = 6 * MiB + 4096;
    unsigned char *want = malloc(n);
    assert_non_null(want);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < n; i++) { /* not a pattern a zero page or a stale page could match */
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        want[i] = (unsigned char)(x >> 56);
    }
    void *in;
    xseg_pool_id pw = pool_with(n, 0, &in);
    tu_assert_cu(drv->cuMemcpyHtoD((CUdeviceptr)in, want, n));
    CUstream s;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    xseg_pool_id pg = {0, 0};
    assert_int_equal(xseg_capture_begin(0, s, &pg, CU_STREAM_CAPTURE_MODE_GLOBAL), XSEG_SUCCESS);
    void *out = tu_malloc(n, s), *tmp = tu_malloc(n, s);
    tu_assert_cu(gx->memcpy_dtod_async((CUdeviceptr)tmp, (CUdeviceptr)in, n, s));
    tu_assert_cu(gx->memcpy_dtod_async((CUdeviceptr)out, (CUdeviceptr)tmp, n, s));
    tu_free(tmp);
    CUgraph g = NULL;
    assert_int_equal(xseg_capture_end(0, s, &g), XSEG_SUCCESS);
    CUgraphExec ex = NULL;
    tu_assert_cu(gx->instantiate(&ex, g, 0));
    tu_assert_cu(gx->launch(ex, s));
    tu_assert_cu(drv->cuStreamSynchronize(s));
    unsigned char *got = read_back((CUdeviceptr)out, n);
    assert_memory_equal(got, want, n);
    free(got);
    tag(pw, "weights");
    tag(pg, "graphs");

    xseg_tag_sleep lv1[] = {{"graphs", XSEG_SLEEP_DISCARD}, {"weights", XSEG_SLEEP_OFFLOAD}};
    assert_int_equal(xseg_sleep_tags(0, lv1, 2), XSEG_SUCCESS);
    assert_int_equal(stats_of(pg).asleep, 1);
    assert_int_equal(stats_of(pw).asleep, 1);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    if (tu_emulated()) /* launching it now is the program's bug: a GPU faults */
        tu_assert_cu_eq(gx->launch(ex, s), CUDA_ERROR_ILLEGAL_ADDRESS);
    const char *order[] = {"weights", "graphs"};
    assert_int_equal(xseg_wake_tags(0, order, 2), XSEG_SUCCESS);
    got = read_back((CUdeviceptr)in, n);
    assert_memory_equal(got, want, n); /* offloaded and restored byte for byte */
    free(got);
    assert_true(reads(out, n, 0)); /* discarded */
    tu_assert_cu(gx->launch(ex, s));
    tu_assert_cu(drv->cuStreamSynchronize(s));
    got = read_back((CUdeviceptr)out, n);
    assert_memory_equal(got, want, n); /* the replay, bit-exact */
    free(got);

    tu_assert_cu(gx->exec_destroy(ex));
    tu_assert_cu(drv->cuGraphDestroy(g));
    tu_free(out);
    tu_free(in);
    tu_assert_cu(drv->cuStreamDestroy(s));
    xseg_pool_id pools[] = {pw, pg};
    release_all(pools, 2);
    free(want);
}

/* All or nothing: a driver failure in the sleep of the last pool wakes the pools slept before it
 * (the offloaded one with its bytes); nothing stays asleep, and the same call then succeeds. A
 * classic segment in a tagged pool is refused before anything sleeps. */
static void test_tags_sleep_rollback(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:True,expandable_segments_recycle:False");
    tu_require_emulator_or_skip();
    void *w, *kv;
    xseg_pool_id pw = pool_with(24 * MiB, 1, &w), pk = pool_with(40 * MiB, 2, &kv);
    xseg_pool_id pools[] = {pw, pk};
    tag(pw, "weights");
    tag(pk, "kv_cache");
    int64_t reserved = tu_stat("reserved_bytes.all.current");
    /* The KV cache is given first but sleeps last (discarding), so its failure undoes the weights'. */
    xseg_tag_sleep lv[] = {{"kv_cache", XSEG_SLEEP_DISCARD}, {"weights", XSEG_SLEEP_OFFLOAD}};
    assert_int_equal(xseg_sleep_tags(0, lv, 2), XSEG_SUCCESS);
    const char *both[] = {"weights", "kv_cache"};
    assert_int_equal(xseg_wake_tags(0, both, 2), XSEG_SUCCESS);
    assert_true(tu_check((CUdeviceptr)w, 24 * MiB, 1));
    tu_assert_cu(tu_fill((CUdeviceptr)kv, 40 * MiB, 2));
    /* The KV cache's unmap fails, after the weights slept. */
    unsigned long fired = tu_fail_fired();
    assert_true(tu_fail("cuMemUnmap", 2, CUDA_ERROR_UNKNOWN)); /* the KV cache's unmap (the weights' was 1st) */
    xseg_status st = xseg_sleep_tags(0, lv, 2);
    tu_fail_clear();
    tu_assert_fired(fired, "the KV cache's unmap");
    assert_int_equal(st, XSEG_ERROR_DRIVER);
    print_message("%s\n", xseg_last_error());
    assert_non_null(strstr(xseg_last_error(), "(tag 'kv_cache')"));
    assert_non_null(strstr(xseg_last_error(), "were woken again"));
    assert_int_equal(stats_of(pw).asleep, 0);
    assert_int_equal(stats_of(pk).asleep, 0);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), reserved);
    assert_true(tu_check((CUdeviceptr)w, 24 * MiB, 1));
    assert_true(tu_check((CUdeviceptr)kv, 40 * MiB, 2)); /* its failed sleep mapped its own pages back */
    assert_int_equal(xseg_sleep_tags(0, lv, 2), XSEG_SUCCESS); /* the retry */
    assert_int_equal(xseg_wake_tags(0, both, 2), XSEG_SUCCESS);
    assert_true(tu_check((CUdeviceptr)w, 24 * MiB, 1));

    /* A classic segment in the KV cache's pool: refused before the weights sleep. */
    assert_int_equal(xseg_set_config("expandable_segments:False"), XSEG_SUCCESS);
    assert_int_equal(xseg_begin_allocate_to_pool(0, pk, NULL, NULL), XSEG_SUCCESS);
    void *classic = tu_malloc(4 * MiB, NULL);
    assert_int_equal(xseg_end_allocate_to_pool(0, pk), XSEG_SUCCESS);
    assert_int_equal(xseg_release_pool(0, pk), XSEG_SUCCESS); /* the begin's use */
    tu_counts_reset();
    assert_int_equal(xseg_sleep_tags(0, lv, 2), XSEG_ERROR_NOT_SUPPORTED);
    assert_non_null(strstr(xseg_last_error(), "nothing slept"));
    assert_int_equal(tu_call_count("cuMemcpyDtoHAsync") + tu_call_count("cuMemUnmap"), 0);
    assert_int_equal(stats_of(pw).asleep, 0);
    tu_free(classic);
    tu_free(w);
    tu_free(kv);
    release_all(pools, 2);
}

/* The wake goes in the order given and stops at the first failure: the pools woken before it stay
 * awake, it and the rest stay asleep with their backups, and the same call wakes them. The
 * failure falls on the first page of the second pool in the order, whichever order is given. */
static void test_tags_wake_order(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:True,expandable_segments_recycle:False,expandable_page_size_mb:2");
    tu_require_emulator_or_skip();
    void *w, *kv;
    xseg_pool_id pw = pool_with(24 * MiB, 1, &w), pk = pool_with(40 * MiB, 2, &kv);
    xseg_pool_id pools[] = {pw, pk};
    tag(pw, "weights");
    tag(pk, "kv_cache");
    xseg_tag_sleep lv[] = {{"weights", XSEG_SLEEP_OFFLOAD}, {"kv_cache", XSEG_SLEEP_OFFLOAD}};
    const char *wk_w[] = {"weights"}, *wk_k[] = {"kv_cache"};
    /* Pages each pool's wake maps (one cuMemCreate a page here). */
    unsigned long pages[2];
    for (int i = 0; i < 2; i++) {
        assert_int_equal(xseg_sleep_tags(0, lv, 2), XSEG_SUCCESS);
        tu_counts_reset();
        assert_int_equal(xseg_wake_tags(0, i ? wk_k : wk_w, 1), XSEG_SUCCESS);
        pages[i] = tu_call_count("cuMemCreate");
        assert_int_equal(xseg_wake_tags(0, i ? wk_w : wk_k, 1), XSEG_SUCCESS);
    }
    assert_true(pages[0] > 0 && pages[1] > 0);
    for (int kv_first = 0; kv_first < 2; kv_first++) {
        const char *order[] = {kv_first ? "kv_cache" : "weights", kv_first ? "weights" : "kv_cache"};
        xseg_pool_id first = kv_first ? pk : pw, second = kv_first ? pw : pk;
        assert_int_equal(xseg_sleep_tags(0, lv, 2), XSEG_SUCCESS);
        size_t host = tu_host_live(NULL);
        unsigned long fired = tu_fail_fired();
        assert_true(tu_fail("cuMemCreate", pages[kv_first] + 1, CUDA_ERROR_OUT_OF_MEMORY));
        xseg_status st = xseg_wake_tags(0, order, 2);
        tu_fail_clear();
        tu_assert_fired(fired, "the second pool's first page");
        assert_int_equal(st, XSEG_ERROR_OUT_OF_MEMORY);
        print_message("%s\n", xseg_last_error());
        assert_non_null(strstr(xseg_last_error(), order[1]));
        assert_non_null(strstr(xseg_last_error(), "1 pool(s) of these tags were woken before it"));
        assert_int_equal(stats_of(first).asleep, 0);
        assert_int_equal(stats_of(second).asleep, 1);
        assert_int_equal(tu_host_live(NULL), host); /* the second's backup is kept for the retry */
        assert_true(tu_check((CUdeviceptr)(kv_first ? kv : w), kv_first ? 40 * MiB : 24 * MiB, kv_first ? 2 : 1));
        assert_int_equal(xseg_wake_tags(0, order, 2), XSEG_SUCCESS); /* the retry wakes the rest */
        assert_true(tu_check((CUdeviceptr)w, 24 * MiB, 1));
        assert_true(tu_check((CUdeviceptr)kv, 40 * MiB, 2));
    }
    tu_free(w);
    tu_free(kv);
    release_all(pools, 2);
}

int main(int argc, char **argv)
{
    setenv("CUDAEMU_TOTAL_MEM", "8G", 0);
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tags_errors),        cmocka_unit_test(test_tags_levels),
        cmocka_unit_test(test_tags_graph_replay),  cmocka_unit_test(test_tags_sleep_rollback),
        cmocka_unit_test(test_tags_wake_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
