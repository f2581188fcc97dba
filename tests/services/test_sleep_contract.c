/*
 * The sleep/wake contract of issue 74 (items 3 to 6) and issue 75, through the public API on
 * cudaemu: no page goes under running work, even work on a stream xseg was never told about
 * (sleep_wait_device), and a sleep refuses rather than ends another thread's capture; a wake is a
 * transaction whatever driver call fails (a fault sweep); misuse shows at once
 * (sleep_discard_fill, sleep_backup_checksum); nothing is left behind on the device (its free
 * memory across a sleep and across 1,000 cycles). One process per test (meson passes the name).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* Does every byte of [p, p + n) read @p v (a driver copy)? */
static bool reads(const void *p, size_t n, unsigned char v)
{
    unsigned char *buf = malloc(n);
    assert_non_null(buf);
    tu_assert_cu(drv->cuMemcpyDtoH(buf, (CUdeviceptr)p, n));
    size_t i = 0;
    while (i < n && buf[i] == v)
        i++;
    if (i < n)
        print_message("byte %zu of %zu reads 0x%02x, not 0x%02x\n", i, n, buf[i], v);
    free(buf);
    return i == n;
}

static size_t dev_free(void)
{
    size_t fr = 0, total = 0;
    tu_assert_cu(drv->cuMemGetInfo(&fr, &total));
    return fr;
}

/* ---- item 3: work xseg cannot see ---------------------------------------------------------- */

/* A memset queued on a stream the program created and never named to xseg (cudaemu defers its
 * bytes until the stream's work completes, as a GPU may run it late) writes a live block of the
 * default pool. @p wait_device: the config's sleep_wait_device. */
static void unknown_stream(bool wait_device)
{
    tu_xseg_init_or_skip(wait_device ? "expandable_page_size_mb:2"
                                     : "expandable_page_size_mb:2,sleep_wait_device:False");
    tu_require_emulator_or_skip();
    const size_t n = 4 * MiB;
    void *p = tu_malloc(n, NULL); /* on the legacy stream: the only stream xseg knows of */
    tu_assert_cu(drv->cuMemsetD8((CUdeviceptr)p, 0x11, n));
    assert_true(tu_stream_defer_new(true));
    CUstream s;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    assert_true(tu_stream_defer_new(false)); /* xseg's own copy streams do not defer */
    tu_assert_cu(drv->cuMemsetD8Async((CUdeviceptr)p, 0x77, n, s));
    assert_int_equal(drv->cuStreamQuery(s), CUDA_ERROR_NOT_READY); /* still queued */

    xseg_status st = xseg_sleep(0, DEFAULT_POOL, XSEG_SLEEP_OFFLOAD);
    if (!wait_device) {
        /* Today's behaviour without the key: only xseg's streams are waited for, so the unmap
         * meets the queued memset (cudaemu refuses it, CUDA_ERROR_ILLEGAL_STATE; a GPU would
         * fault) and the sleep is undone with the pool's own pages. */
        print_message("sleep_wait_device:False: %s\n", st == XSEG_SUCCESS ? "slept" : xseg_last_error());
        assert_int_equal(st, XSEG_ERROR_DRIVER);
        assert_non_null(strstr(xseg_last_error(), "mapped back"));
        assert_int_equal(drv->cuStreamQuery(s), CUDA_ERROR_NOT_READY); /* never waited for */
        assert_int_equal(stats_of(DEFAULT_POOL).asleep, 0);
        tu_assert_cu(drv->cuStreamSynchronize(s)); /* the program's own wait */
        assert_true(reads(p, n, 0x77));
        st = xseg_sleep(0, DEFAULT_POOL, XSEG_SLEEP_OFFLOAD);
    }
    if (st != XSEG_SUCCESS)
        fail_msg("xseg_sleep beside work on an unknown stream: %s", xseg_last_error());
    assert_int_equal(drv->cuStreamQuery(s), CUDA_SUCCESS); /* waited for before the copy */
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    assert_int_equal(xseg_wake(0, DEFAULT_POOL), XSEG_SUCCESS);
    assert_true(reads(p, n, 0x77));
    tu_assert_cu(drv->cuStreamSynchronize(s));
    tu_assert_cu(drv->cuStreamDestroy(s));
    tu_free(p);
}

static void test_unknown_stream(void **state)
{
    (void)state;
    unknown_stream(true);
}

static void test_unknown_stream_off(void **state)
{
    (void)state;
    unknown_stream(false);
}

/* Another thread's capture: the sleep is refused, naming the capture, and the capture survives
 * (cuStreamEndCapture still gives a graph). */
struct capturer {
    pthread_t t;
    CUstream s;
    int mode;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int step; /* 1: capturing; 2: may end */
    xseg_status end;
    CUgraph g;
    xseg_pool_id pool;
};

static void *capturer_run(void *arg)
{
    struct capturer *c = arg;
    tu_ctx_set();
    xseg_status st = xseg_capture_begin(0, c->s, &c->pool, c->mode);
    if (st == XSEG_SUCCESS) {
        void *q = NULL;
        st = xseg_malloc(&q, MiB, 0, c->s); /* a block of the capture's pool */
        if (st == XSEG_SUCCESS)
            (void)tu_stream_work(c->s);
        if (q)
            (void)xseg_free(q);
    }
    pthread_mutex_lock(&c->mu);
    c->step = 1;
    pthread_cond_broadcast(&c->cv);
    while (c->step < 2)
        pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
    c->end = st == XSEG_SUCCESS ? xseg_capture_end(0, c->s, &c->g) : st;
    return NULL;
}

static void test_capture_refused(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_page_size_mb:2");
    tu_require_emulator_or_skip();
    void *p = tu_malloc(4 * MiB, NULL);
    tu_assert_cu(tu_fill((CUdeviceptr)p, 4 * MiB, 9));
    const int modes[] = {CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                         CU_STREAM_CAPTURE_MODE_RELAXED};
    for (size_t m = 0; m < 3; m++) {
        struct capturer c = {.mode = modes[m], .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
        tu_assert_cu(drv->cuStreamCreate(&c.s, CU_STREAM_NON_BLOCKING));
        assert_int_equal(pthread_create(&c.t, NULL, capturer_run, &c), 0);
        pthread_mutex_lock(&c.mu);
        while (c.step < 1)
            pthread_cond_wait(&c.cv, &c.mu);
        pthread_mutex_unlock(&c.mu);

        assert_int_equal(xseg_sleep(0, DEFAULT_POOL, XSEG_SLEEP_OFFLOAD), XSEG_ERROR_ILLEGAL_STATE);
        const char *msg = xseg_last_error();
        print_message("mode %d: %s\n", modes[m], msg);
        char want[64];
        snprintf(want, sizeof want, "stream %p", (void *)c.s);
        assert_non_null(strstr(msg, want)); /* names the capture */
        assert_non_null(strstr(msg, "after the capture ends")); /* says what to do */
        assert_int_equal(stats_of(DEFAULT_POOL).asleep, 0);
        assert_int_equal(xseg_sleep(0, DEFAULT_POOL, XSEG_SLEEP_DISCARD), XSEG_ERROR_ILLEGAL_STATE);

        pthread_mutex_lock(&c.mu);
        c.step = 2;
        pthread_cond_broadcast(&c.cv);
        pthread_mutex_unlock(&c.mu);
        assert_int_equal(pthread_join(c.t, NULL), 0);
        if (c.end != XSEG_SUCCESS)
            fail_msg("mode %d: the capture did not survive the refused sleep: %s", modes[m], xseg_last_error());
        assert_non_null(c.g);
        tu_assert_cu(drv->cuGraphDestroy(c.g));
        assert_int_equal(xseg_release_pool(0, c.pool), XSEG_SUCCESS);
        tu_assert_cu(drv->cuStreamDestroy(c.s));
        /* The capture over, the pool sleeps and wakes with its bytes. */
        assert_int_equal(xseg_sleep(0, DEFAULT_POOL, XSEG_SLEEP_OFFLOAD), XSEG_SUCCESS);
        assert_int_equal(xseg_wake(0, DEFAULT_POOL), XSEG_SUCCESS);
        assert_true(tu_check((CUdeviceptr)p, 4 * MiB, 9));
    }
    tu_free(p);
}

/* ---- item 4: a wake is a transaction, whatever driver call fails --------------------------- */

/* Every driver entry a sleep or a wake might make. */
static const char *const entries[] = {
    "cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemRelease", "cuMemcpyHtoDAsync",
    "cuMemcpyDtoHAsync", "cuMemsetD8Async", "cuStreamSynchronize", "cuCtxSynchronize", "cuEventCreate",
    "cuEventRecord", "cuEventSynchronize", "cuEventDestroy", "cuEventQuery", "cuStreamCreate",
    "cuStreamDestroy", "cuStreamWaitEvent", "cuStreamQuery", "cuMemHostAlloc", "cuMemFreeHost",
    "cuMemHostRegister", "cuMemHostUnregister", "cuCtxGetCurrent", "cuCtxSetCurrent",
    "cuThreadExchangeStreamCaptureMode", "cuStreamIsCapturing", "cuMemGetInfo",
    "cuMemGetAllocationGranularity", "cuMemAddressReserve", "cuMemAddressFree", "cuCtxPushCurrent",
    "cuCtxPopCurrent", "cuPointerGetAttribute", "cuMemGetAllocationPropertiesFromHandle",
    "cuMemRetainAllocationHandle", "cuDevicePrimaryCtxRetain", "cuCtxGetDevice",
    "cuMemcpyBatchAsync", /* the small block's run (below sleep_copy_batch_kb) goes in a batch */
};
#define NENTRIES (sizeof entries / sizeof entries[0])

/* Three blocks of the default pool (two segments' worth with 2 MiB pages and 1 MiB chunks) and a
 * small one, each with its own pattern. */
struct fx {
    void *a, *b, *sm;
    int64_t reserved;
};

static void fx_make(struct fx *f)
{
    f->a = tu_malloc(5 * MiB, NULL);
    f->b = tu_malloc(3 * MiB, NULL);
    f->sm = tu_malloc(4096, NULL);
    tu_assert_cu(tu_fill((CUdeviceptr)f->a, 5 * MiB, 21));
    tu_assert_cu(tu_fill((CUdeviceptr)f->b, 3 * MiB, 22));
    tu_assert_cu(tu_fill((CUdeviceptr)f->sm, 4096, 23));
    f->reserved = tu_stat("reserved_bytes.all.current");
}

static void fx_check(const struct fx *f)
{
    assert_true(tu_check((CUdeviceptr)f->a, 5 * MiB, 21));
    assert_true(tu_check((CUdeviceptr)f->b, 3 * MiB, 22));
    assert_true(tu_check((CUdeviceptr)f->sm, 4096, 23));
}

static void fx_free(struct fx *f)
{
    tu_free(f->a);
    tu_free(f->b);
    tu_free(f->sm);
}

enum how { HOW_OFFLOAD, HOW_DISCARD, HOW_FILE, HOW_TAGS };
static const char *const how_name[] = {"offload", "discard", "file", "tags"};
static char file_path[256];

static xseg_status do_sleep(enum how h)
{
    switch (h) {
    case HOW_DISCARD:
        return xseg_sleep(0, DEFAULT_POOL, XSEG_SLEEP_DISCARD);
    case HOW_FILE:
        return xseg_sleep_ex(0, DEFAULT_POOL, XSEG_SLEEP_OFFLOAD_FILE, file_path);
    case HOW_TAGS: {
        xseg_tag_sleep t = {"weights", XSEG_SLEEP_OFFLOAD};
        return xseg_sleep_tags(0, &t, 1);
    }
    default:
        return xseg_sleep(0, DEFAULT_POOL, XSEG_SLEEP_OFFLOAD);
    }
}

static xseg_status do_wake(enum how h)
{
    if (h == HOW_TAGS) {
        const char *t = "weights";
        return xseg_wake_tags(0, &t, 1);
    }
    return xseg_wake(0, DEFAULT_POOL);
}

/* How many calls of each entry one clean wake (@p wake) or sleep makes. */
static void count_calls(enum how h, bool wake, unsigned long counts[NENTRIES])
{
    struct fx f;
    fx_make(&f);
    if (wake)
        assert_int_equal(do_sleep(h), XSEG_SUCCESS);
    tu_counts_reset();
    assert_int_equal(wake ? do_wake(h) : do_sleep(h), XSEG_SUCCESS);
    for (size_t e = 0; e < NENTRIES; e++)
        counts[e] = tu_call_count(entries[e]);
    if (!wake)
        assert_int_equal(do_wake(h), XSEG_SUCCESS);
    fx_free(&f);
}

/* The file's reads fail (the host side of a file wake): the file cut short at each of a few points
 * while asleep. The wake fails and says the pool is still asleep, nothing mapped; with the bytes
 * written back the retry restores every one. */
static void file_reads_fail(void)
{
    struct fx f;
    fx_make(&f);
    assert_int_equal(do_sleep(HOW_FILE), XSEG_SUCCESS);
    FILE *fp = fopen(file_path, "rb");
    assert_non_null(fp);
    assert_int_equal(fseek(fp, 0, SEEK_END), 0);
    long size = ftell(fp);
    assert_true(size > 0);
    rewind(fp);
    char *copy = malloc((size_t)size);
    assert_non_null(copy);
    assert_int_equal(fread(copy, 1, (size_t)size, fp), (size_t)size);
    fclose(fp);
    const long cuts[] = {0, 1, size / 2, size - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        assert_int_equal(truncate(file_path, cuts[i]), 0);
        assert_int_not_equal(do_wake(HOW_FILE), XSEG_SUCCESS);
        print_message("file cut to %ld of %ld bytes: %s\n", cuts[i], size, xseg_last_error());
        assert_non_null(strstr(xseg_last_error(), "still asleep"));
        assert_int_equal(stats_of(DEFAULT_POOL).asleep, 1);
        struct cudaemu_live lv;
        assert_true(tu_live(&lv));
        assert_int_equal(lv.mapped_bytes, 0);
        fp = fopen(file_path, "r+b");
        assert_non_null(fp);
        assert_int_equal(fwrite(copy, 1, (size_t)size, fp), (size_t)size);
        fclose(fp);
    }
    free(copy);
    assert_int_equal(do_wake(HOW_FILE), XSEG_SUCCESS);
    fx_check(&f);
    fx_free(&f);
}

/* The sweep: for each entry a clean wake makes, each of its calls fails in turn (UNKNOWN, and
 * OUT_OF_MEMORY where it allocates); a failed wake leaves the pool asleep with nothing mapped, its
 * backup whole (the host memory as before), an error that says so; a retry wakes it with every
 * byte. Then the same over the sleep: a failed sleep leaves the pool awake with its bytes (or, where
 * the pages could not be put back, asleep and wakeable), and the next sleep and wake work. */
static void sweep(enum how h)
{
    tu_xseg_init_or_skip("expandable_segments_recycle:False,expandable_page_size_mb:2,sleep_copy_chunk_mb:1,"
                         "sleep_keep_host_backup:False");
    tu_require_emulator_or_skip();
    snprintf(file_path, sizeof file_path, "/tmp/xseg-sweep-%d.bin", (int)getpid());
    if (h == HOW_TAGS)
        assert_int_equal(xseg_pool_set_tag(0, DEFAULT_POOL, "weights"), XSEG_SUCCESS);
    for (int pass = 0; pass < 2; pass++) {
        bool wake = pass == 0;
        unsigned long counts[NENTRIES];
        count_calls(h, wake, counts);
        /* The small block's copy is a cuMemcpyBatchAsync (item 7), so the sweep strikes it too. */
        if (h == HOW_OFFLOAD || h == HOW_TAGS)
            assert_true(counts[NENTRIES - 1] > 0);
        unsigned long struck = 0, tries = 0;
        for (size_t e = 0; e < NENTRIES; e++) {
            for (unsigned long nth = 1; nth <= counts[e]; nth++) {
                for (int r = 0; r < 2; r++) {
                    CUresult res = r ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_UNKNOWN;
                    if (r && strcmp(entries[e], "cuMemCreate") && strcmp(entries[e], "cuMemHostAlloc"))
                        continue;
                    struct fx f;
                    fx_make(&f);
                    if (wake)
                        assert_int_equal(do_sleep(h), XSEG_SUCCESS);
                    size_t host = tu_host_live(NULL);
                    unsigned long fired = tu_fail_fired();
                    assert_true(tu_fail(entries[e], nth, res));
                    xseg_status st = wake ? do_wake(h) : do_sleep(h);
                    tu_fail_clear();
                    tries++;
                    bool hit = tu_fail_fired() != fired;
                    struck += hit;
                    if (st != XSEG_SUCCESS) {
                        const char *msg = xseg_last_error();
                        if (!hit)
                            fail_msg("%s %s: %s #%lu not struck, yet: %s", how_name[h], wake ? "wake" : "sleep",
                                     entries[e], nth, msg);
                        if (wake) {
                            if (stats_of(DEFAULT_POOL).asleep != 1 || !strstr(msg, "still asleep"))
                                fail_msg("%s wake, %s #%lu: not a transaction: %s", how_name[h], entries[e], nth,
                                         msg);
                            assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
                            struct cudaemu_live lv;
                            assert_true(tu_live(&lv));
                            if (lv.mapped_bytes != 0)
                                fail_msg("%s wake, %s #%lu: %zu bytes left mapped: %s", how_name[h], entries[e],
                                         nth, (size_t)lv.mapped_bytes, msg);
                            assert_int_equal(tu_host_live(NULL), host); /* the backup kept */
                        } else if (stats_of(DEFAULT_POOL).asleep == 0) {
                            assert_int_equal(tu_stat("reserved_bytes.all.current"), f.reserved);
                            fx_check(&f);
                            assert_int_equal(do_sleep(h), XSEG_SUCCESS);
                        }
                        if (stats_of(DEFAULT_POOL).asleep == 1 || !wake) {
                            xseg_status w = do_wake(h);
                            if (w != XSEG_SUCCESS)
                                fail_msg("%s %s, %s #%lu: the retry's wake failed: %s", how_name[h],
                                         wake ? "wake" : "sleep", entries[e], nth, xseg_last_error());
                        }
                    } else if (!wake) {
                        assert_int_equal(do_wake(h), XSEG_SUCCESS);
                    }
                    assert_int_equal(stats_of(DEFAULT_POOL).asleep, 0);
                    assert_int_equal(tu_stat("reserved_bytes.all.current"), f.reserved);
                    if (h != HOW_DISCARD)
                        fx_check(&f);
                    fx_free(&f);
                }
            }
        }
        print_message("%s %s: %lu injected failures, %lu struck\n", how_name[h], wake ? "wake" : "sleep", tries,
                      struck);
        assert_true(struck > 0);
    }
    if (h == HOW_FILE)
        file_reads_fail();
    unlink(file_path);
}

static void test_sweep_offload(void **state)
{
    (void)state;
    sweep(HOW_OFFLOAD);
}

static void test_sweep_discard(void **state)
{
    (void)state;
    sweep(HOW_DISCARD);
}

static void test_sweep_file(void **state)
{
    (void)state;
    sweep(HOW_FILE);
}

static void test_sweep_tags(void **state)
{
    (void)state;
    sweep(HOW_TAGS);
}

/* ---- issue 74 item 7: many small blocks -------------------------------------------------- */

/* 2,000 live 4 KiB blocks, each its own run (a freed block between two), slept and woken three
 * ways: batched (the driver has cuMemcpyBatchAsync, runs below sleep_copy_batch_kb), the symbol
 * hidden (drv_batch_hide: a driver without it), and batched again. Every byte comes back each time;
 * the batched rounds make a few calls where the fallback makes one per run each way. */
static void test_many_small(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("sleep_keep_host_backup:False");
    tu_require_emulator_or_skip();
    enum { N = 2000 };
    void **v = calloc(2 * N, sizeof *v);
    assert_non_null(v);
    for (size_t i = 0; i < 2 * N; i++)
        v[i] = tu_malloc(4096, NULL);
    for (size_t i = 1; i < 2 * N; i += 2)
        tu_free(v[i]);
    for (size_t i = 0; i < 2 * N; i += 2)
        tu_assert_cu(tu_fill((CUdeviceptr)v[i], 4096, (uint32_t)(100 + i)));
    unsigned long single[3], batch[3];
    for (int round = 0; round < 3; round++) {
        drv_batch_hide(round == 1);
        tu_counts_reset();
        assert_int_equal(xseg_sleep(0, DEFAULT_POOL, XSEG_SLEEP_OFFLOAD), XSEG_SUCCESS);
        assert_int_equal(xseg_wake(0, DEFAULT_POOL), XSEG_SUCCESS);
        single[round] = tu_call_count("cuMemcpyDtoHAsync") + tu_call_count("cuMemcpyHtoDAsync");
        batch[round] = tu_call_count("cuMemcpyBatchAsync");
        drv_batch_hide(false);
        for (size_t i = 0; i < 2 * N; i += 2)
            if (!tu_check((CUdeviceptr)v[i], 4096, (uint32_t)(100 + i)))
                fail_msg("round %d: block %zu lost its bytes", round, i / 2);
        print_message("many small blocks, round %d (%s): %lu single copies, %lu batches\n", round,
                      round == 1 ? "no cuMemcpyBatchAsync" : "batched", single[round], batch[round]);
    }
    /* The fallback: a call per run each way (N at least: the runs may be fewer where neighbours
     * stayed live, never more), no batch. */
    assert_int_equal(batch[1], 0);
    assert_true(single[1] >= N);
    /* Batched: no single copy, and at most one batch per 512 runs and segment each way. */
    for (int round = 0; round < 3; round += 2) {
        assert_int_equal(single[round], 0);
        assert_true(batch[round] > 0 && batch[round] * 20 < single[1]);
    }
    for (size_t i = 0; i < 2 * N; i += 2)
        tu_free(v[i]);
    free(v);
}

/* ---- item 5: misuse shows at once ------------------------------------------------------------ */

/* sleep_discard_fill:165: a DISCARD wake fills every page with 0xA5 (the live block and the cache
 * alike); the default still reads zero. */
static void test_discard_fill(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_page_size_mb:2,sleep_discard_fill:165");
    const size_t n = 6 * MiB;
    void *p = tu_malloc(n, NULL);
    tu_assert_cu(tu_fill((CUdeviceptr)p, n, 3));
    assert_int_equal(xseg_sleep(0, DEFAULT_POOL, XSEG_SLEEP_DISCARD), XSEG_SUCCESS);
    assert_int_equal(xseg_wake(0, DEFAULT_POOL), XSEG_SUCCESS);
    assert_true(reads(p, n, 0xA5));
    char cfg[512];
    assert_int_equal(xseg_get_config(cfg, sizeof cfg, NULL), XSEG_SUCCESS);
    assert_non_null(strstr(cfg, "sleep_discard_fill:165"));
    /* Back to the default: zeros. */
    assert_int_equal(xseg_set_config("sleep_discard_fill:0"), XSEG_SUCCESS);
    assert_int_equal(xseg_sleep(0, DEFAULT_POOL, XSEG_SLEEP_DISCARD), XSEG_SUCCESS);
    assert_int_equal(xseg_wake(0, DEFAULT_POOL), XSEG_SUCCESS);
    assert_true(reads(p, n, 0));
    /* Out of range: refused by name. */
    assert_int_equal(xseg_set_config("sleep_discard_fill:256"), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "sleep_discard_fill"));
    tu_free(p);
}

/* cudaemu's test hook: a stray host write into every pinned allocation of at least @p min bytes. */
static size_t host_flip(size_t min, size_t off)
{
    void *lib = dlopen(getenv("XSEG_LIBCUDA"), RTLD_NOLOAD | RTLD_NOW);
    assert_non_null(lib);
    size_t (*flip)(size_t, size_t) = (size_t(*)(size_t, size_t))dlsym(lib, "cudaemu_host_flip");
    assert_non_null(flip);
    size_t n = flip(min, off);
    dlclose(lib);
    return n;
}

/* sleep_backup_checksum:True: a byte of the pinned backup changed while asleep fails the wake,
 * naming the pool; the pool stays asleep with nothing mapped and its backup; the byte put back,
 * the wake restores every byte; with the key turned off the backup is restored as it is. */
static void test_backup_checksum(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_page_size_mb:2,sleep_backup_checksum:True,sleep_keep_host_backup:False");
    tu_require_emulator_or_skip();
    const size_t n = 4 * MiB;
    xseg_pool_id pool;
    assert_int_equal(xseg_pool_create(&pool), XSEG_SUCCESS);
    assert_int_equal(xseg_begin_allocate_to_pool(0, pool, NULL, NULL), XSEG_SUCCESS);
    void *p = tu_malloc(n, NULL);
    assert_int_equal(xseg_end_allocate_to_pool(0, pool), XSEG_SUCCESS);
    tu_assert_cu(drv->cuMemsetD8((CUdeviceptr)p, 0x3C, n));
    assert_int_equal(tu_host_live(NULL), 0);
    assert_int_equal(xseg_sleep(0, pool, XSEG_SLEEP_OFFLOAD), XSEG_SUCCESS);
    assert_int_equal(host_flip(n, 12345), 1); /* the backup: the one pinned allocation */
    for (int i = 0; i < 2; i++) { /* the same each time: nothing sticky */
        assert_int_equal(xseg_wake(0, pool), XSEG_ERROR_INVALID_VALUE);
        const char *msg = xseg_last_error();
        print_message("%s\n", msg);
        char want[80];
        snprintf(want, sizeof want, "pool {%llu, %llu}", (unsigned long long)pool.first,
                 (unsigned long long)pool.second);
        assert_non_null(strstr(msg, want));
        assert_non_null(strstr(msg, "changed while it slept"));
        assert_non_null(strstr(msg, "stays asleep"));
        assert_int_equal(stats_of(pool).asleep, 1);
        struct cudaemu_live lv;
        assert_true(tu_live(&lv));
        assert_int_equal(lv.mapped_bytes, 0);
        assert_int_equal(tu_host_live(NULL), 1);
    }
    assert_int_equal(host_flip(n, 12345), 1); /* put back */
    assert_int_equal(xseg_wake(0, pool), XSEG_SUCCESS);
    assert_true(reads(p, n, 0x3C));
    /* The key turned off: the changed backup is restored as it is. */
    assert_int_equal(xseg_sleep(0, pool, XSEG_SLEEP_OFFLOAD), XSEG_SUCCESS);
    assert_int_equal(host_flip(n, 0), 1);
    assert_int_equal(xseg_set_config("sleep_backup_checksum:False"), XSEG_SUCCESS);
    assert_int_equal(xseg_wake(0, pool), XSEG_SUCCESS);
    unsigned char b0 = 0;
    tu_assert_cu(drv->cuMemcpyDtoH(&b0, (CUdeviceptr)p, 1));
    assert_int_equal(b0, 0x3C ^ 0xFF);
    assert_true(reads((char *)p + 1, n - 1, 0x3C));
    tu_free(p);
    assert_int_equal(xseg_release_pool(0, pool), XSEG_SUCCESS);
}

/* ---- item 6: nothing left behind ------------------------------------------------------------- */

/* The device's free memory after a sleep is back within one granule per pool of what it was before
 * the pools allocated; 1,000 sleep/wake cycles leave no residue (device or pinned host memory). */
static void test_no_residue(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_page_size_mb:2,expandable_segments_recycle:False");
    const size_t gran = 2 * MiB;
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    size_t free0 = dev_free();
    /* Two pools: the default one (large and small blocks) and a private one. */
    void *a = tu_malloc(3 * MiB / 2, NULL), *s = tu_malloc(4096, NULL);
    xseg_pool_id pool;
    assert_int_equal(xseg_pool_create(&pool), XSEG_SUCCESS);
    assert_int_equal(xseg_begin_allocate_to_pool(0, pool, NULL, NULL), XSEG_SUCCESS);
    void *b = tu_malloc(3 * MiB / 2, NULL);
    assert_int_equal(xseg_end_allocate_to_pool(0, pool), XSEG_SUCCESS);
    tu_assert_cu(tu_fill((CUdeviceptr)a, 3 * MiB / 2, 31));
    tu_assert_cu(tu_fill((CUdeviceptr)s, 4096, 32));
    tu_assert_cu(tu_fill((CUdeviceptr)b, 3 * MiB / 2, 33));
    assert_true(dev_free() < free0);
    assert_int_equal(xseg_sleep(0, DEFAULT_POOL, XSEG_SLEEP_OFFLOAD), XSEG_SUCCESS);
    assert_int_equal(xseg_sleep(0, pool, XSEG_SLEEP_OFFLOAD), XSEG_SUCCESS);
    size_t asleep = dev_free();
    print_message("free before the pools: %zu, asleep: %zu (%lld bytes apart)\n", free0, asleep,
                  (long long)free0 - (long long)asleep);
    assert_true(asleep + 2 * gran >= free0);
    assert_int_equal(xseg_wake(0, DEFAULT_POOL), XSEG_SUCCESS);
    assert_int_equal(xseg_wake(0, pool), XSEG_SUCCESS);
    size_t awake1 = dev_free(), host1 = 0, hn1 = tu_host_live(&host1);
    const unsigned cycles = (unsigned)tu_steps(1000, 50);
    for (unsigned i = 0; i < cycles; i++) {
        assert_int_equal(xseg_sleep(0, DEFAULT_POOL, XSEG_SLEEP_OFFLOAD), XSEG_SUCCESS);
        assert_int_equal(xseg_sleep(0, pool, XSEG_SLEEP_OFFLOAD), XSEG_SUCCESS);
        if (dev_free() != asleep)
            fail_msg("cycle %u: %zu bytes free asleep, %zu after the first sleep", i, dev_free(), asleep);
        assert_int_equal(xseg_wake(0, pool), XSEG_SUCCESS);
        assert_int_equal(xseg_wake(0, DEFAULT_POOL), XSEG_SUCCESS);
    }
    size_t awake2 = dev_free(), host2 = 0, hn2 = tu_host_live(&host2);
    long long residue = ((long long)awake1 - (long long)awake2) / (long long)cycles;
    print_message("%u cycles: residue %lld bytes of device memory per cycle (%zu -> %zu free), pinned host "
                  "%zu -> %zu bytes in %zu -> %zu allocations\n", cycles, residue, awake1, awake2, host1, host2,
                  hn1, hn2);
    /* The figures of docs/benchmarks.md's residue table (benchmarks/sleep_residue_table.sh). */
    printf("residue: cycles %u per_cycle %lld asleep_gap %lld pools 2 host_delta %lld\n", cycles, residue,
           (long long)free0 - (long long)asleep, (long long)host2 - (long long)host1);
    fflush(stdout);
    assert_int_equal(awake2, awake1);
    assert_int_equal(host2, host1);
    assert_true(tu_check((CUdeviceptr)a, 3 * MiB / 2, 31));
    assert_true(tu_check((CUdeviceptr)s, 4096, 32));
    assert_true(tu_check((CUdeviceptr)b, 3 * MiB / 2, 33));
    tu_free(a);
    tu_free(s);
    tu_free(b);
    assert_int_equal(xseg_release_pool(0, pool), XSEG_SUCCESS);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(xseg_host_empty_cache(), XSEG_SUCCESS);
    assert_int_equal(dev_free(), free0);
}

int main(int argc, char **argv)
{
    setenv("CUDAEMU_TOTAL_MEM", "8G", 0);
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unknown_stream), cmocka_unit_test(test_unknown_stream_off),
        cmocka_unit_test(test_capture_refused), cmocka_unit_test(test_sweep_offload),
        cmocka_unit_test(test_sweep_discard), cmocka_unit_test(test_sweep_file),
        cmocka_unit_test(test_sweep_tags), cmocka_unit_test(test_discard_fill),
        cmocka_unit_test(test_backup_checksum), cmocka_unit_test(test_no_residue), cmocka_unit_test(test_many_small),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
