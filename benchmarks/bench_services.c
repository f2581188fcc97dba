/*
 * bench_services: what the services cost (docs/services.md).
 *
 *   CUDAEMU_LATENCY=h200 bench_services [--gib G] [--reps R] [--sleep-only]
 *   bench_services --pairs CONFIG N       (N cached pairs only: benchmarks/callgrind_services.sh)
 *   CUDAEMU_LATENCY=h200 bench_services --copy-rate [--streams S] [--chunk-mb C] [--file[-only] DIR] [--gib G]
 *                                       [--reps R]   (section 5)
 *   bench_services --concurrent DIR [--gib G] [--reps R]   (section 6)
 *   bench_services --lock-wait [--reps R]                   (section 7)
 *
 * 0. The link in this run, on up to 1 GiB of the live blocks (median of R): pinned copies each
 *    way (a new cuMemHostAlloc buffer), pageable ones (malloc'd, touched), and pinning per GiB:
 *    cuMemHostAlloc, cuMemFreeHost, cuMemHostRegister of those touched pages, cuMemHostUnregister.
 *    Wall, and on cudaemu the timeline model (cudaemu_model_ns).
 * 1. Sleep: the share of the pool's reserved memory a sleep gives back (live blocks of G GiB in
 *    weight-like sizes plus G/2 GiB of cached KV-like blocks, in the default pool).
 * 2. Sleep and wake of those live blocks, R cycles each: OFFLOAD with the configuration as it is
 *    (the first cycle pins the backup; sleep_keep_host_backup keeps it), DISCARD, then OFFLOAD with
 *    sleep_keep_host_backup:False (a backup pinned and given back every cycle, from an emptied host
 *    cache); median wall ms, GiB/s and its ratio to the pinned copy of section 0, the same on the
 *    timeline model, and the driver calls of the last cycle. Then the first work on woken memory
 *    (a 4 KiB memset and a wait). The wall time on cudaemu is the host's memcpy and page faults;
 *    on a GPU the real one.
 * 3. Trim: xseg_trim of a cache of G GiB in 8 runs, to 0 and to half.
 * 4. release_threshold_mb: the malloc miss that gives a cache of G GiB back to the threshold,
 *    against the same miss without a threshold (recycling off, else the miss itself would unmap
 *    the cache); and what a cached malloc+free pair costs with the threshold, with
 *    idle_release_ms (malloc ticks: the general path) and with its thread (the fast path).
 * 5. (--copy-rate) Sleep and wake rate against the plain copy of the same bytes in the same run:
 *    1 GiB and G GiB of live blocks; the plain copy moves the same blocks with
 *    cuMemcpyDtoHAsync / cuMemcpyHtoDAsync into / from one pinned buffer (xseg_host_malloc,
 *    touched once before) and waits; sleep and wake run with sleep_keep_host_backup:True after a
 *    warm-up cycle (the retained backup), and once more without it (a backup allocated and given
 *    back every cycle). GiB/s from the median of R repetitions, wall and on the timeline model. --chunk-mb C
 *    sets sleep_copy_chunk_mb; --file DIR adds XSEG_SLEEP_OFFLOAD_FILE rows (a file in DIR, through
 *    the bounce buffers; the timeline model has no cost for the file I/O: see the wall row);
 *    --file-only DIR gives only those and the plain copy, through a 256 MiB pinned ring, so host
 *    memory holds no second copy of the bytes (the 10 GiB row on a small machine).
 * 6. (--concurrent DIR) Another pool's work during a file sleep: a private pool of G GiB of
 *    weight-like live blocks sleeps to a file in DIR (XSEG_SLEEP_OFFLOAD_FILE) and wakes while a
 *    second thread runs cached 512 B malloc+free pairs on the default pool; the pairs it completed
 *    during the sleep and during the wake, and its rate then against its rate alone while the
 *    pool sleeps (the main thread idle for as long as the sleep took, at most 2 s) in the same
 *    run; and the sleep's and wake's wall time alone (before the worker starts) and beside it.
 *    Medians of R repetitions.
 * 7. (--lock-wait) How long a thread waits for the device lock against another thread's loop of
 *    cached 512 B pairs through it (a pool sleeps, so the pairs take the device lock's path, as
 *    during a sleep or wake): 5,000 xseg_get_sleep_stats calls (one device-lock take each, as a
 *    sleep's or wake's retake), 20 us apart, timed one by one with the loop stopped and running, in the same run;
 *    median, 99th percentile and longest per repetition, and the loop's pairs per second.
 * Links the shared libxseg, as a program would. Without a GPU it runs on the cudaemu built here.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include "xseg.h"

#include "bench_util.h"

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

static const xseg_pool_id DEFAULT_POOL = {0, 0};

/* The emulator's counters and latencies (NULL on a real driver). */
static struct {
    unsigned long (*count)(const char *);
    void (*reset)(void);
    int (*latency)(const char *, uint64_t *, uint64_t *);
    uint64_t (*model)(void);
} emu;

static const char *const entries[] = {"cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemRelease",
                                      "cuMemHostAlloc", "cuMemFreeHost", "cuMemcpyDtoHAsync", "cuMemcpyHtoDAsync",
                                      "cuMemsetD8Async", "cuStreamSynchronize", "cuStreamQuery"};
#define NENTRIES (sizeof entries / sizeof entries[0])

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void die(const char *what)
{
    fprintf(stderr, "bench_services: %s: %s\n", what, xseg_last_error());
    exit(1);
}

static int64_t stat(const char *key)
{
    int64_t v = 0;
    if (xseg_stat(0, key, &v) != XSEG_SUCCESS)
        die(key);
    return v;
}

/* Driver calls since the last reset, and the time the preset gives them (ms). @p copied: bytes
 * moved by the copies (charged at their entry's rate). */
static double model_ms(unsigned long calls[NENTRIES], size_t copied, const char *copy_entry)
{
    double ms = 0;
    for (size_t i = 0; i < NENTRIES; i++) {
        calls[i] = emu.count ? emu.count(entries[i]) : 0;
        uint64_t ns = 0;
        if (emu.latency)
            emu.latency(entries[i], &ns, NULL);
        ms += (double)calls[i] * (double)ns / 1e6;
    }
    uint64_t ps = 0;
    if (emu.latency && copy_entry)
        emu.latency(copy_entry, NULL, &ps);
    return ms + (double)copied * (double)ps / 1e9;
}

/* Weight-like live blocks (the sizes of one transformer layer of a 7B model, in turn) up to
 * @p live bytes, and KV-like 128 MiB blocks of @p cached bytes freed again (cache). */
/* --streams S (copy-rate only): live blocks round-robin over S streams, so the pool has S
 * segments (a wake's copies of one overlap the mapping of the next). */
static struct CUstream_st *fill_streams[16];
static int fill_nstreams;

static void **fill(size_t live, size_t cached, size_t *n, struct CUstream_st *kv_stream)
{
    static const size_t sizes[] = {96 * MiB, 32 * MiB, 172 * MiB, 86 * MiB, 16 * 1024};
    size_t cap = 64, k = 0, got = 0;
    void **v = malloc(cap * sizeof *v);
    void **kv = malloc((cached / (128 * MiB) + 1) * sizeof *kv);
    if (!v || !kv)
        exit(1);
    size_t nkv = 0;
    for (size_t i = 0; got < live; i++) {
        size_t sz = sizes[i % (sizeof sizes / sizeof sizes[0])];
        if (k == cap && !(v = realloc(v, (cap *= 2) * sizeof *v)))
            exit(1);
        if (xseg_malloc(&v[k], sz, 0, fill_nstreams ? fill_streams[k % (size_t)fill_nstreams] : NULL) !=
            XSEG_SUCCESS)
            die("xseg_malloc");
        got += sz;
        k++;
        /* KV blocks interleaved with the weights: cached holes once freed. */
        if (nkv * 128 * MiB < cached && k % 4 == 0 &&
            xseg_malloc(&kv[nkv++], 128 * MiB, 0, kv_stream) != XSEG_SUCCESS)
            die("xseg_malloc");
    }
    while (nkv * 128 * MiB < cached)
        if (xseg_malloc(&kv[nkv++], 128 * MiB, 0, kv_stream) != XSEG_SUCCESS)
            die("xseg_malloc");
    for (size_t i = 0; i < nkv; i++)
        xseg_free(kv[i]);
    free(kv);
    *n = k;
    return v;
}

static void release(void **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        xseg_free(v[i]);
    free(v);
    if (xseg_empty_cache(0) != XSEG_SUCCESS)
        die("xseg_empty_cache");
}

static void load_emu(void)
{
    const char *lib = getenv("XSEG_LIBCUDA");
    void *h = dlopen(lib && *lib ? lib : "libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (!h)
        return;
    *(void **)&emu.count = dlsym(h, "cudaemu_call_count");
    *(void **)&emu.reset = dlsym(h, "cudaemu_counts_reset");
    *(void **)&emu.latency = dlsym(h, "cudaemu_get_latency");
    *(void **)&emu.model = dlsym(h, "cudaemu_model_ns"); /* the timeline model (optional) */
    if (!emu.count || !emu.reset || !emu.latency)
        memset(&emu, 0, sizeof emu);
}

static void reset_counts(void)
{
    if (emu.reset)
        emu.reset();
}

static void print_calls(const unsigned long calls[NENTRIES])
{
    int any = 0;
    for (size_t i = 0; i < NENTRIES; i++)
        if (calls[i])
            printf("%s%s %lu", any++ ? ", " : "", entries[i] + 2, calls[i]);
    printf("%s |\n", any ? "" : "n/a");
}

static long parse_long(const char *flag, const char *s, long min)
{
    char *end;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || errno || *end || v < min) {
        fprintf(stderr, "bench_services: %s needs an integer >= %ld (got '%s')\n", flag, min, s ? s : "");
        exit(2);
    }
    return v;
}

/* Cached malloc+free pairs of 512 B on the default stream: median ns per pair over @p reps. */
static double pair_ns(int reps)
{
    double v[15];
    for (int r = 0; r < reps && r < 15; r++) {
        double t0 = now_ms();
        for (int i = 0; i < 200000; i++) {
            void *p;
            if (xseg_malloc(&p, 512, 0, NULL) != XSEG_SUCCESS)
                die("xseg_malloc");
            xseg_free(p);
        }
        v[r] = (now_ms() - t0) * 1e6 / 200000;
    }
    return median(v, reps < 15 ? reps : 15);
}

/* --pairs CONFIG N: only N cached 512 B pairs under CONFIG (after a warm-up), for callgrind
 * (benchmarks/callgrind_services.sh divides the instructions of two pair counts). */
static int pairs_only(const char *config, long n)
{
    bench_find_driver("bench_services");
    if (xseg_init(config) != XSEG_SUCCESS)
        die("xseg_init");
    for (long i = -1000; i < n; i++) {
        void *p;
        if (xseg_malloc(&p, 512, 0, NULL) != XSEG_SUCCESS)
            die("xseg_malloc");
        xseg_free(p);
    }
    return 0;
}

/* ---- 5: sleep and wake against the plain copy ---- */

/* The driver's copy and host-memory entry points (ABI names; no cuda.h here: 0 is CUDA_SUCCESS). */
static struct {
    int (*dtoh)(void *, unsigned long long, size_t, struct CUstream_st *);
    int (*htod)(unsigned long long, const void *, size_t, struct CUstream_st *);
    int (*sync)(struct CUstream_st *);
    int (*host_alloc)(void **, size_t, unsigned);
    int (*free_host)(void *);
    int (*host_register)(void *, size_t, unsigned);
    int (*host_unregister)(void *);
    int (*memset_async)(unsigned long long, unsigned char, size_t, struct CUstream_st *);
} cu;

static void load_copies(void)
{
    const char *lib = getenv("XSEG_LIBCUDA");
    void *h = dlopen(lib && *lib ? lib : "libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (!h)
        die("the driver is not loaded");
    *(void **)&cu.dtoh = dlsym(h, "cuMemcpyDtoHAsync_v2");
    *(void **)&cu.htod = dlsym(h, "cuMemcpyHtoDAsync_v2");
    *(void **)&cu.sync = dlsym(h, "cuStreamSynchronize");
    *(void **)&cu.host_alloc = dlsym(h, "cuMemHostAlloc");
    *(void **)&cu.free_host = dlsym(h, "cuMemFreeHost");
    *(void **)&cu.host_register = dlsym(h, "cuMemHostRegister_v2");
    *(void **)&cu.host_unregister = dlsym(h, "cuMemHostUnregister");
    *(void **)&cu.memset_async = dlsym(h, "cuMemsetD8Async");
    if (!cu.dtoh || !cu.htod || !cu.sync || !cu.host_alloc || !cu.free_host || !cu.host_register ||
        !cu.host_unregister || !cu.memset_async)
        die("the driver lacks cuMemcpyDtoHAsync_v2 / cuMemcpyHtoDAsync_v2 / cuStreamSynchronize / cuMemHostAlloc / "
            "cuMemFreeHost / cuMemHostRegister_v2 / cuMemHostUnregister / cuMemsetD8Async");
}

/* One plain copy of every block of @p v (sizes @p sz) to (or from) @p host, then a wait; wall ms. */
static size_t ring_bytes; /* --file-only: the plain copies go through a buffer this large (0: all) */

static double plain_copy(void **v, const size_t *sz, size_t n, char *host, int to_host)
{
    double t0 = now_ms();
    size_t off = 0;
    for (size_t i = 0; i < n; off += sz[i], i++) {
        for (size_t done = 0; done < sz[i];) { /* one call a block, or a ring-sized piece */
            size_t len = ring_bytes && sz[i] - done > ring_bytes ? ring_bytes : sz[i] - done;
            char *h = ring_bytes ? host : host + off + done;
            unsigned long long d = (unsigned long long)(uintptr_t)v[i] + done;
            int r = to_host ? cu.dtoh(h, d, len, NULL) : cu.htod(d, h, len, NULL);
            if (r != 0)
                die("plain copy");
            done += len;
        }
    }
    if (cu.sync(NULL) != 0)
        die("cuStreamSynchronize");
    return now_ms() - t0;
}

/* GiB/s of @p bytes in @p ms. */
static double rate(size_t bytes, double ms) { return ms > 0 ? (double)bytes / (double)GiB / (ms / 1e3) : 0; }

/* The timeline model's clock (cudaemu_model_ns) in ms, 0 without it. */
static double tl_ms(void) { return emu.model ? (double)emu.model() / 1e6 : 0; }

static const char *file_dir; /* --file DIR */
static bool file_only;        /* --file-only: no host-backup rows, plain copies through a ring */

/* --file: sleep to a file and wake, @p nr times: wall and timeline GiB/s against the plain copy's
 * (@p pw, @p hw: wall DtoH, HtoD GiB/s; @p pt, @p ht: timeline). */
static void file_rows(size_t bytes, int nr, double pw, double hw, double pt, double ht)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/bench_services-%ld.bin", file_dir, (long)getpid());
    double fs[32], fw[32], tfs = 0, tfw = 0;
    for (int r = 0; r < nr; r++) {
        double t0 = now_ms(), l0 = tl_ms();
        if (xseg_sleep_ex(0, DEFAULT_POOL, XSEG_SLEEP_OFFLOAD_FILE, path) != XSEG_SUCCESS)
            die("xseg_sleep_ex");
        fs[r] = now_ms() - t0;
        tfs = tl_ms() - l0;
        t0 = now_ms();
        l0 = tl_ms();
        if (xseg_wake(0, DEFAULT_POOL) != XSEG_SUCCESS)
            die("xseg_wake");
        fw[r] = now_ms() - t0;
        tfw = tl_ms() - l0;
    }
    double g = (double)bytes / (double)GiB, s = rate(bytes, median(fs, nr)), w = rate(bytes, median(fw, nr));
    printf("| %.2f | file, wall | %.2f | %.2f (%.2fx) | | %.2f | %.2f (%.2fx) | |\n", g, pw, s, s / pw, hw, w, w / hw);
    if (emu.model)
        printf("| %.2f | file, timeline | %.2f | %.2f (%.2fx) | | %.2f | %.2f (%.2fx) | |\n", g, pt, rate(bytes, tfs),
               rate(bytes, tfs) / pt, ht, rate(bytes, tfw), rate(bytes, tfw) / ht);
}

/* One size: the table rows for @p live bytes of weight-like live blocks. */
static void copy_rate_row(size_t live, int reps)
{
    size_t n;
    void **v = fill(live, 0, &n, NULL);
    size_t *sz = malloc(n * sizeof *sz);
    if (!sz)
        exit(1);
    static const size_t sizes[] = {96 * MiB, 32 * MiB, 172 * MiB, 86 * MiB, 16 * 1024};
    size_t bytes = 0;
    for (size_t i = 0; i < n; i++)
        bytes += sz[i] = sizes[i % (sizeof sizes / sizeof sizes[0])];
    void *host;
    ring_bytes = file_only ? 256 * MiB : 0;
    if (xseg_host_malloc(&host, ring_bytes ? ring_bytes : bytes) != XSEG_SUCCESS)
        die("xseg_host_malloc");
    plain_copy(v, sz, n, host, 1); /* touch the pinned pages once, as the retained backup is */
    double pd[32], ph[32], sk[32], wk[32], sn[32], wn[32];
    double mpd = 0, mph = 0, msk = 0, mwk = 0, msn = 0, mwn = 0;
    double tpd = 0, tph = 0, tsk = 0, twk = 0, tsn = 0, twn = 0; /* timeline model, ms (deterministic) */
    unsigned long c[NENTRIES];
    int nr = reps < 32 ? reps : 32;
    for (int r = 0; r < nr; r++) {
        reset_counts();
        double l0 = tl_ms();
        pd[r] = plain_copy(v, sz, n, host, 1);
        mpd = model_ms(c, bytes, "cuMemcpyDtoHAsync");
        tpd = tl_ms() - l0;
        reset_counts();
        l0 = tl_ms();
        ph[r] = plain_copy(v, sz, n, host, 0);
        mph = model_ms(c, bytes, "cuMemcpyHtoDAsync");
        tph = tl_ms() - l0;
    }
    /* The plain buffer goes before the sleeps: host memory holds one copy of the bytes at a time. */
    xseg_host_free(host);
    if (xseg_host_empty_cache() != XSEG_SUCCESS)
        die("xseg_host_empty_cache");
    double g = (double)bytes / (double)GiB;
    double cd = rate(bytes, median(pd, nr)), ch = rate(bytes, median(ph, nr));
    if (file_only) {
        printf("| %.2f | wall | %.2f | | | %.2f | | |\n", g, cd, ch);
        if (emu.model)
            printf("| %.2f | timeline | %.2f | | | %.2f | | |\n", g, rate(bytes, tpd), rate(bytes, tph));
        file_rows(bytes, nr, cd, ch, rate(bytes, tpd), rate(bytes, tph));
        free(sz);
        release(v, n);
        return;
    }
    for (int keep = 1; keep >= 0; keep--) {
        if (xseg_set_config(keep ? "sleep_keep_host_backup:True" : "sleep_keep_host_backup:False") != XSEG_SUCCESS)
            die("xseg_set_config");
        if (!keep && xseg_host_empty_cache() != XSEG_SUCCESS)
            die("xseg_host_empty_cache");
        for (int r = -keep; r < nr; r++) { /* with keep: one warm-up cycle allocates the backup */
            reset_counts();
            double t0 = now_ms(), l0 = tl_ms();
            if (xseg_sleep(0, DEFAULT_POOL, XSEG_SLEEP_OFFLOAD) != XSEG_SUCCESS)
                die("xseg_sleep");
            double ts = now_ms() - t0, ms = model_ms(c, bytes, "cuMemcpyDtoHAsync"), ls = tl_ms() - l0;
            reset_counts();
            t0 = now_ms();
            l0 = tl_ms();
            if (xseg_wake(0, DEFAULT_POOL) != XSEG_SUCCESS)
                die("xseg_wake");
            double tw = now_ms() - t0, mw = model_ms(c, bytes, "cuMemcpyHtoDAsync"), lw = tl_ms() - l0;
            *(keep ? &tsk : &tsn) = ls;
            *(keep ? &twk : &twn) = lw;
            if (r < 0)
                continue;
            (keep ? sk : sn)[r] = ts;
            (keep ? wk : wn)[r] = tw;
            *(keep ? &msk : &msn) = ms;
            *(keep ? &mwk : &mwn) = mw;
        }
    }
    double s1 = rate(bytes, median(sk, nr)), w1 = rate(bytes, median(wk, nr));
    double s0 = rate(bytes, median(sn, nr)), w0 = rate(bytes, median(wn, nr));
    printf("| %.2f | wall | %.2f | %.2f (%.2fx) | %.2f (%.2fx) | %.2f | %.2f (%.2fx) | %.2f (%.2fx) |\n", g, cd, s1,
           s1 / cd, s0, s0 / cd, ch, w1, w1 / ch, w0, w0 / ch);
    /* (The calls-times-latency sum of model_ms leaves out pinning's per-byte cost and every
     * overlap: the timeline row is the model.) */
    (void)mpd, (void)mph, (void)msk, (void)mwk, (void)msn, (void)mwn;
    if (emu.model && tpd > 0)
        printf("| %.2f | timeline | %.2f | %.2f (%.2fx) | %.2f (%.2fx) | %.2f | %.2f (%.2fx) | %.2f (%.2fx) |\n", g,
               rate(bytes, tpd), rate(bytes, tsk), tpd / tsk, rate(bytes, tsn), tpd / tsn, rate(bytes, tph),
               rate(bytes, twk), tph / twk, rate(bytes, twn), tph / twn);
    if (file_dir)
        file_rows(bytes, nr, cd, ch, rate(bytes, tpd), rate(bytes, tph));
    if (xseg_host_empty_cache() != XSEG_SUCCESS)
        die("xseg_host_empty_cache");
    free(sz);
    release(v, n);
}

static int copy_rate(long gib, int reps, long nstreams, long chunk_mb)
{
    bench_find_driver("bench_services");
    char conf[96];
    snprintf(conf, sizeof conf, "expandable_segments:True,sleep_copy_chunk_mb:%ld", chunk_mb);
    if (xseg_init(conf) != XSEG_SUCCESS)
        die("xseg_init");
    load_emu();
    load_copies();
    if (nstreams > 1) {
        const char *lib = getenv("XSEG_LIBCUDA");
        void *h = dlopen(lib && *lib ? lib : "libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
        int (*create)(struct CUstream_st **, unsigned) = NULL;
        if (h)
            *(void **)&create = dlsym(h, "cuStreamCreate");
        if (!create)
            die("the driver lacks cuStreamCreate");
        void *p; /* an allocation makes the device's primary context current on this thread */
        if (xseg_malloc(&p, 512, 0, NULL) != XSEG_SUCCESS)
            die("xseg_malloc");
        xseg_free(p);
        for (long i = 0; i < nstreams; i++)
            if (create(&fill_streams[i], 0) != 0)
                die("cuStreamCreate");
        fill_nstreams = (int)nstreams;
    }
    const char *lat = getenv("CUDAEMU_LATENCY");
    printf("bench_services --copy-rate: %d repetitions, %ld stream%s, sleep_copy_chunk_mb:%ld, %s%s\n\n", reps,
           nstreams, nstreams == 1 ? "" : "s", chunk_mb, emu.count ? "cudaemu, CUDAEMU_LATENCY=" : "real driver",
           emu.count ? (lat ? lat : "(none)") : "");
    printf("| live GiB | time | plain DtoH GiB/s | sleep, kept backup | sleep, new backup | plain HtoD GiB/s | "
           "wake, kept backup | wake, new backup |\n|---|---|---|---|---|---|---|---|\n");
    copy_rate_row(GiB, reps);
    if (gib > 1)
        copy_rate_row((size_t)gib * GiB, reps);
    return 0;
}

/* ---- 6: another pool's pairs during a file sleep ---- */
static _Atomic unsigned long conc_pairs;
static atomic_bool conc_stop;

static void *conc_worker(void *arg)
{
    (void)arg;
    while (!atomic_load_explicit(&conc_stop, memory_order_relaxed)) {
        void *p;
        if (xseg_malloc(&p, 512, 0, NULL) != XSEG_SUCCESS)
            die("xseg_malloc (the other pool)");
        xseg_free(p);
        atomic_fetch_add_explicit(&conc_pairs, 1, memory_order_relaxed);
    }
    return NULL;
}

/* The worker's pairs while @p fn runs (its wall ms in *ms). */
static unsigned long conc_during(xseg_status (*fn)(void *), void *arg, double *ms)
{
    unsigned long c0 = atomic_load(&conc_pairs);
    double t0 = now_ms();
    if (fn(arg) != XSEG_SUCCESS)
        die("the sleep or wake");
    *ms = now_ms() - t0;
    return atomic_load(&conc_pairs) - c0;
}

/* The worker's pairs per second alone for @p ms (the main thread idle). */
static double conc_alone(double ms)
{
    unsigned long c0 = atomic_load(&conc_pairs);
    double t0 = now_ms();
    struct timespec nap = {(time_t)(ms / 1e3), (long)((ms - 1e3 * (double)(long)(ms / 1e3)) * 1e6)};
    nanosleep(&nap, NULL);
    return (double)(atomic_load(&conc_pairs) - c0) / (now_ms() - t0) * 1e3;
}

static xseg_pool_id conc_pool;
static char conc_path[4096];
static xseg_status conc_sleep(void *a) { (void)a; return xseg_sleep_ex(0, conc_pool, XSEG_SLEEP_OFFLOAD_FILE, conc_path); }
static xseg_status conc_wake(void *a) { (void)a; return xseg_wake(0, conc_pool); }

static int concurrent(const char *dir, long gib, int reps)
{
    bench_find_driver("bench_services");
    if (xseg_init("expandable_segments:True") != XSEG_SUCCESS)
        die("xseg_init");
    load_emu();
    snprintf(conc_path, sizeof conc_path, "%s/bench_services-%ld.bin", dir, (long)getpid());
    if (xseg_pool_create(&conc_pool) != XSEG_SUCCESS ||
        xseg_begin_allocate_to_pool(0, conc_pool, NULL, NULL) != XSEG_SUCCESS)
        die("xseg_begin_allocate_to_pool");
    size_t n;
    void **v = fill((size_t)gib * GiB, 0, &n, NULL);
    if (xseg_end_allocate_to_pool(0, conc_pool) != XSEG_SUCCESS)
        die("xseg_end_allocate_to_pool");
    double sm[32], wm[32], sr[32], wr[32], sa[32], wa[32], s0[32], w0[32];
    unsigned long sp[32], wp[32];
    reps = reps > 32 ? 32 : reps;
    for (int r = 0; r < reps; r++) { /* the sleep and wake alone first (the worker not started) */
        sp[r] = conc_during(conc_sleep, NULL, &s0[r]);
        wp[r] = conc_during(conc_wake, NULL, &w0[r]);
    }
    pthread_t t;
    if (pthread_create(&t, NULL, conc_worker, NULL) != 0)
        die("pthread_create");
    for (int r = 0; r < reps; r++) {
        /* Alone while the pool sleeps: the worker's pairs take the device lock's path then, as
         * during a sleep or wake (a sleeping pool turns the stream slots off). */
        sp[r] = conc_during(conc_sleep, NULL, &sm[r]);
        sr[r] = (double)sp[r] / sm[r] * 1e3;
        sa[r] = wa[r] = conc_alone(sm[r] < 2000 ? sm[r] : 2000);
        wp[r] = conc_during(conc_wake, NULL, &wm[r]);
        wr[r] = (double)wp[r] / wm[r] * 1e3;
    }
    atomic_store(&conc_stop, true);
    pthread_join(t, NULL);
    double spd[32], wpd[32];
    for (int r = 0; r < reps; r++)
        spd[r] = (double)sp[r], wpd[r] = (double)wp[r];
    printf("bench_services --concurrent: %ld GiB of live blocks in a private pool, a file in %s, %d repetitions, "
           "%s\n\n", gib, dir, reps, emu.count ? "cudaemu" : "real driver");
    printf("| operation | wall ms alone | wall ms beside the pairs | other pool's pairs during it | pairs/s during "
           "it | pairs/s alone, pool asleep | ratio |\n|---|---|---|---|---|---|---|\n");
    double a = median(sa, reps), b = median(wa, reps);
    printf("| file sleep | %.0f | %.0f | %.0f | %.3g | %.3g | %.2f |\n", median(s0, reps), median(sm, reps),
           median(spd, reps), median(sr, reps), a, a > 0 ? median(sr, reps) / a : 0);
    printf("| wake | %.0f | %.0f | %.0f | %.3g | %.3g | %.2f |\n", median(w0, reps), median(wm, reps),
           median(wpd, reps), median(wr, reps), b, b > 0 ? median(wr, reps) / b : 0);
    release(v, n);
    return 0;
}

/* ---- 7: the device lock against a loop of pairs ---- */
#define LW_CALLS 5000
static double lw_ns[LW_CALLS];

/* LW_CALLS device-lock takes, each timed: median, p99, longest (ns) into @p out. */
static void lw_sample(double out[3])
{
    xseg_sleep_stats st;
    for (int i = 0; i < LW_CALLS; i++) {
        struct timespec a, b, gap = {0, 20000}; /* arrive as a sleep's retake does: after a wait */
        nanosleep(&gap, NULL);
        clock_gettime(CLOCK_MONOTONIC, &a);
        if (xseg_get_sleep_stats(0, NULL, &st) != XSEG_SUCCESS)
            die("xseg_get_sleep_stats");
        clock_gettime(CLOCK_MONOTONIC, &b);
        lw_ns[i] = (double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec);
    }
    qsort(lw_ns, LW_CALLS, sizeof lw_ns[0], cmp_double);
    out[0] = lw_ns[LW_CALLS / 2];
    out[1] = lw_ns[LW_CALLS * 99 / 100];
    out[2] = lw_ns[LW_CALLS - 1];
}

static int lock_wait(int reps)
{
    bench_find_driver("bench_services");
    if (xseg_init("expandable_segments:True") != XSEG_SUCCESS)
        die("xseg_init");
    load_emu();
    xseg_pool_id pool;
    void *p;
    if (xseg_pool_create(&pool) != XSEG_SUCCESS || xseg_begin_allocate_to_pool(0, pool, NULL, NULL) != XSEG_SUCCESS ||
        xseg_malloc(&p, 1 << 20, 0, NULL) != XSEG_SUCCESS || xseg_end_allocate_to_pool(0, pool) != XSEG_SUCCESS ||
        xseg_sleep(0, pool, XSEG_SLEEP_DISCARD) != XSEG_SUCCESS)
        die("a sleeping pool");
    printf("bench_services --lock-wait: %d calls a sample, %d repetitions, %s\n\n", LW_CALLS, reps,
           emu.count ? "cudaemu" : "real driver");
    printf("| rep | alone: median ns | p99 ns | longest ns | beside the pairs: median ns | p99 ns | longest ns | "
           "pairs/s beside |\n|---|---|---|---|---|---|---|---|\n");
    for (int r = 0; r < reps; r++) {
        double alone[3], beside[3];
        lw_sample(alone);
        atomic_store(&conc_stop, false);
        unsigned long c0 = atomic_load(&conc_pairs);
        pthread_t t;
        if (pthread_create(&t, NULL, conc_worker, NULL) != 0)
            die("pthread_create");
        while (atomic_load(&conc_pairs) - c0 < 1000) /* the loop runs */
            sched_yield();
        unsigned long c1 = atomic_load(&conc_pairs);
        double t0 = now_ms();
        lw_sample(beside);
        double rate = (double)(atomic_load(&conc_pairs) - c1) / (now_ms() - t0) * 1e3;
        atomic_store(&conc_stop, true);
        pthread_join(t, NULL);
        printf("| %d | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.3g |\n", r + 1, alone[0], alone[1], alone[2],
               beside[0], beside[1], beside[2], rate);
    }
    if (xseg_wake(0, pool) != XSEG_SUCCESS || xseg_free(p) != XSEG_SUCCESS)
        die("xseg_wake");
    return 0;
}

/* ---- 0: the link: copies and pinning in the same run ---- */

/* What the link costs in this run, measured on up to 1 GiB of the live blocks: pinned and pageable
 * copies each way (GiB/s) and pinning (ms per GiB): wall and, on cudaemu, the timeline model. */
struct link_costs {
    double pin[2], page[2]; /* [0]: device to host, [1]: host to device */
    double alloc_ms, free_ms, reg_ms, unreg_ms;
};
static struct link_costs link_model; /* the same, on the timeline model (0 without it) */

/* Device to host and host to device copies of blocks @p v (sizes @p sz, @p n of them) through
 * @p host: GiB/s each way into @p wall and @p model. */
static void copy_pair(void **v, const size_t *sz, size_t n, size_t bytes, char *host, double wall[2],
                      double model[2])
{
    for (int dir = 0; dir < 2; dir++) {
        double l0 = tl_ms();
        double ms = plain_copy(v, sz, n, host, dir == 0);
        wall[dir] = rate(bytes, ms);
        model[dir] = emu.model ? rate(bytes, tl_ms() - l0) : 0;
    }
}

static double ms_per_gib(double ms, size_t bytes) { return ms / ((double)bytes / (double)GiB); }

static void link_measure(size_t live, int reps, struct link_costs *out)
{
    load_copies();
    size_t n;
    void **v = fill(live < GiB ? live : GiB, 0, &n, NULL);
    size_t *sz = malloc(n * sizeof *sz), bytes = 0;
    if (!sz)
        exit(1);
    for (size_t i = 0; i < n; i++) { /* fill's sizes in turn, as copy_rate_row reads them */
        static const size_t sizes[] = {96 * MiB, 32 * MiB, 172 * MiB, 86 * MiB, 16 * 1024};
        bytes += sz[i] = sizes[i % (sizeof sizes / sizeof sizes[0])];
    }
    int nr = reps < 32 ? reps : 32;
    double pd[32], ph[32], gd[32], gh[32], al[32], fr[32], rg[32], ur[32];
    double mpd = 0, mph = 0, mgd = 0, mgh = 0, mal = 0, mfr = 0, mrg = 0, mur = 0;
    for (int r = 0; r < nr; r++) {
        /* Pinned: a new cuMemHostAlloc buffer, both copies, cuMemFreeHost. */
        void *host = NULL;
        double t0 = now_ms(), l0 = tl_ms();
        if (cu.host_alloc(&host, bytes, 1 /* CU_MEMHOSTALLOC_PORTABLE */) != 0)
            die("cuMemHostAlloc");
        al[r] = ms_per_gib(now_ms() - t0, bytes);
        mal = ms_per_gib(tl_ms() - l0, bytes);
        double w[2], m[2];
        copy_pair(v, sz, n, bytes, host, w, m);
        pd[r] = w[0], ph[r] = w[1], mpd = m[0], mph = m[1];
        t0 = now_ms(), l0 = tl_ms();
        if (cu.free_host(host) != 0)
            die("cuMemFreeHost");
        fr[r] = ms_per_gib(now_ms() - t0, bytes);
        mfr = ms_per_gib(tl_ms() - l0, bytes);
        /* Pageable: malloc'd and touched; then those pages registered and unregistered. */
        char *page = malloc(bytes);
        if (!page)
            die("out of host memory for the pageable buffer");
        memset(page, r, bytes);
        copy_pair(v, sz, n, bytes, page, w, m);
        gd[r] = w[0], gh[r] = w[1], mgd = m[0], mgh = m[1];
        t0 = now_ms(), l0 = tl_ms();
        if (cu.host_register(page, bytes, 1 /* CU_MEMHOSTREGISTER_PORTABLE */) != 0)
            die("cuMemHostRegister");
        rg[r] = ms_per_gib(now_ms() - t0, bytes);
        mrg = ms_per_gib(tl_ms() - l0, bytes);
        t0 = now_ms(), l0 = tl_ms();
        if (cu.host_unregister(page) != 0)
            die("cuMemHostUnregister");
        ur[r] = ms_per_gib(now_ms() - t0, bytes);
        mur = ms_per_gib(tl_ms() - l0, bytes);
        free(page);
    }
    *out = (struct link_costs){{median(pd, nr), median(ph, nr)}, {median(gd, nr), median(gh, nr)},
                               median(al, nr), median(fr, nr), median(rg, nr), median(ur, nr)};
    link_model = (struct link_costs){{mpd, mph}, {mgd, mgh}, mal, mfr, mrg, mur};
    printf("| the link, this run (%.2f GiB of the live blocks, median of %d) | wall | modelled |\n|---|---|---|\n",
           (double)bytes / (double)GiB, nr);
    const char *names[] = {"pinned copy, device to host (GiB/s)", "pinned copy, host to device (GiB/s)",
                           "pageable copy, device to host (GiB/s)", "pageable copy, host to device (GiB/s)",
                           "cuMemHostAlloc (ms per GiB)", "cuMemFreeHost (ms per GiB)",
                           "cuMemHostRegister of touched pages (ms per GiB)", "cuMemHostUnregister (ms per GiB)"};
    const double *wv = &out->pin[0], *mv = &link_model.pin[0];
    for (int i = 0; i < 8; i++) {
        printf("| %s | %.2f | ", names[i], wv[i]);
        emu.model ? printf("%.2f |\n", mv[i]) : printf("n/a |\n");
    }
    printf("\n");
    free(sz);
    release(v, n);
}

/* The first work on a woken block: a memset of 4 KiB and a wait (wall and modelled us). */
static void first_work(void *p, double *wall_us, double *model_us)
{
    double t0 = now_ms(), l0 = tl_ms();
    if (cu.memset_async((unsigned long long)(uintptr_t)p, 1, 4096, NULL) != 0 || cu.sync(NULL) != 0)
        die("cuMemsetD8Async on woken memory");
    *wall_us = (now_ms() - t0) * 1e3;
    *model_us = (tl_ms() - l0) * 1e3;
}

/* Sections 1 and 2: offload with the configuration as it is, discard, then offload with
 * sleep_keep_host_backup:False (a backup allocated and given back every cycle), @p reps cycles each: wall and
 * modelled time, GiB/s against the pinned copy of the same run. The share of reserved memory each
 * sleep gave back: the lowest is returned. */
static double sleep_rows(size_t live, size_t cached, int reps, const struct link_costs *lk)
{
    printf("| operation | live GiB | wall ms (median) | GiB/s | pinned copy GiB/s | x of it | modelled ms | modelled "
           "GiB/s | modelled copy GiB/s | x of it | driver calls |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    static const struct {
        const char *name, *config;
        unsigned mode;
    } cases[] = {
        {"offload", NULL, XSEG_SLEEP_OFFLOAD},
        {"discard", NULL, XSEG_SLEEP_DISCARD},
        {"offload, sleep_keep_host_backup:False", "sleep_keep_host_backup:False", XSEG_SLEEP_OFFLOAD},
    };
    double share_min = 1.0, fw = 0, fm = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        /* A new configuration starts from an empty host cache: no backup kept by the cases before. */
        if (cases[c].config &&
            (xseg_set_config(cases[c].config) != XSEG_SUCCESS || xseg_host_empty_cache() != XSEG_SUCCESS))
            die("xseg_set_config");
        double ws[32], ww[32], ms[32], mw[32];
        unsigned long cs[NENTRIES] = {0}, cw[NENTRIES] = {0};
        size_t n;
        void **v = fill(live, cached, &n, NULL);
        size_t live_bytes = (size_t)stat("allocated_bytes.all.current");
        int nr = reps < 32 ? reps : 32;
        for (int r = 0; r < nr; r++) {
            size_t reserved_before = (size_t)stat("reserved_bytes.all.current");
            reset_counts();
            double t0 = now_ms(), l0 = tl_ms();
            if (xseg_sleep(0, DEFAULT_POOL, cases[c].mode) != XSEG_SUCCESS)
                die("xseg_sleep");
            ws[r] = now_ms() - t0;
            ms[r] = tl_ms() - l0;
            (void)model_ms(cs, 0, NULL); /* the counts */
            xseg_sleep_stats st;
            if (xseg_get_sleep_stats(0, &DEFAULT_POOL, &st) != XSEG_SUCCESS)
                die("xseg_get_sleep_stats");
            double share = (double)st.released_bytes / (double)reserved_before;
            share_min = share < share_min ? share : share_min;
            reset_counts();
            t0 = now_ms(), l0 = tl_ms();
            if (xseg_wake(0, DEFAULT_POOL) != XSEG_SUCCESS)
                die("xseg_wake");
            ww[r] = now_ms() - t0;
            mw[r] = tl_ms() - l0;
            (void)model_ms(cw, 0, NULL);
            if (c == 0 && r == nr - 1)
                first_work(v[0], &fw, &fm);
        }
        double g = (double)live_bytes / (double)GiB;
        for (int dir = 0; dir < 2; dir++) {
            double wall = median(dir ? ww : ws, nr), model = median(dir ? mw : ms, nr);
            double pin = lk->pin[dir], mpin = link_model.pin[dir];
            printf("| %s (%s) | %.2f | %.1f | %.2f | %.2f | %.2f | ", dir ? "wake" : "sleep", cases[c].name, g, wall,
                   rate(live_bytes, wall), pin, rate(live_bytes, wall) / pin);
            if (emu.model)
                printf("%.1f | %.2f | %.2f | %.2f | ", model, rate(live_bytes, model), mpin,
                       rate(live_bytes, model) / mpin);
            else
                printf("n/a | n/a | n/a | n/a | ");
            print_calls(dir ? cw : cs);
        }
        release(v, n); /* the last case's configuration stays: the sections after do not sleep */
    }
    printf("\n| after the last wake (offload) | wall us | modelled us |\n|---|---|---|\n"
           "| first work on woken memory (cuMemsetD8Async of 4 KiB, then a wait) | %.1f | ", fw);
    emu.model ? printf("%.1f |\n", fm) : printf("n/a |\n");
    return share_min;
}

int main(int argc, char **argv)
{
    long gib = 2;
    int reps = 5;
    long nstreams = 1, chunk_mb = 64;
    if (argc == 4 && !strcmp(argv[1], "--pairs"))
        return pairs_only(argv[2], parse_long("--pairs", argv[3], 0));
    bool rate_only = false, lw_only = false, sleep_only = false;
    const char *conc_dir = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--concurrent") && i + 1 < argc)
            conc_dir = argv[++i];
        else if (!strcmp(argv[i], "--copy-rate"))
            rate_only = true;
        else if (!strcmp(argv[i], "--lock-wait"))
            lw_only = true;
        else if (!strcmp(argv[i], "--sleep-only"))
            sleep_only = true;
        else if (!strcmp(argv[i], "--gib"))
            gib = parse_long("--gib", i + 1 < argc ? argv[++i] : NULL, 1);
        else if (!strcmp(argv[i], "--reps"))
            reps = (int)parse_long("--reps", i + 1 < argc ? argv[++i] : NULL, 1);
        else if (!strcmp(argv[i], "--streams"))
            nstreams = parse_long("--streams", i + 1 < argc ? argv[++i] : NULL, 1);
        else if (!strcmp(argv[i], "--chunk-mb"))
            chunk_mb = parse_long("--chunk-mb", i + 1 < argc ? argv[++i] : NULL, 1);
        else if (!strcmp(argv[i], "--file") && i + 1 < argc)
            file_dir = argv[++i];
        else if (!strcmp(argv[i], "--file-only") && i + 1 < argc)
            file_dir = argv[++i], file_only = true;
        else {
            fprintf(stderr, "usage: bench_services [--sleep-only | --copy-rate [--streams S] [--chunk-mb C] "
                            "[--file[-only] DIR] | --concurrent DIR | --lock-wait] [--gib G] [--reps R]\n");
            return 2;
        }
    }
    if (nstreams > 16) {
        fprintf(stderr, "bench_services: --streams takes at most 16 (got %ld)\n", nstreams);
        return 2;
    }
    if (conc_dir)
        return concurrent(conc_dir, gib, reps);
    if (lw_only)
        return lock_wait(reps);
    if (rate_only)
        return copy_rate(gib, reps, nstreams, chunk_mb);
    bench_find_driver("bench_services");
    if (xseg_init("expandable_segments:True") != XSEG_SUCCESS)
        die("xseg_init");
    load_emu();
    const size_t live = (size_t)gib * GiB, cached = live / 2;
    const char *lat = getenv("CUDAEMU_LATENCY");
    printf("bench_services: %ld GiB live + %ld MiB cached in the default pool, %d repetitions, %s%s\n\n", gib,
           (long)(cached / MiB), reps, emu.count ? "cudaemu, CUDAEMU_LATENCY=" : "real driver",
           emu.count ? (lat ? lat : "(none)") : "");

    /* ---- 0, 1 and 2: the link, sleep and wake ---- */
    struct link_costs lk;
    link_measure(live, reps, &lk);
    double share_min = sleep_rows(live, cached, reps, &lk);
    printf("\nsleep gives back %.4f of the pool's reserved memory (lowest of the offload and discard sleeps)\n\n",
           share_min);
    if (sleep_only)
        return 0;

    /* ---- 3: trim ---- */
    printf("| trim | cache GiB | wall ms (median) | wall ms per GiB | modelled ms | driver calls |\n"
           "|---|---|---|---|---|---|\n");
    for (int half = 0; half < 2; half++) {
        double t[32], mm = 0;
        unsigned long c[NENTRIES] = {0};
        size_t cache_bytes = 0;
        for (int r = 0; r < reps && r < 32; r++) {
            size_t n;
            void **v = fill(GiB / 2, live, &n, NULL);
            cache_bytes = (size_t)(stat("reserved_bytes.all.current") - stat("allocated_bytes.all.current"));
            reset_counts();
            double t0 = now_ms();
            if (xseg_trim(0, half ? cache_bytes / 2 : 0) != XSEG_SUCCESS)
                die("xseg_trim");
            t[r] = now_ms() - t0;
            mm = model_ms(c, 0, NULL);
            release(v, n);
        }
        double g = (double)cache_bytes / (double)GiB, tm = median(t, reps < 32 ? reps : 32);
        printf("| xseg_trim(0, %s) | %.2f | %.1f | %.1f | ", half ? "cache / 2" : "0", g, tm, tm / g);
        emu.count ? printf("%.1f | ", mm) : printf("n/a | ");
        print_calls(c);
    }

    /* ---- 4: release_threshold_mb, idle reclaim ---- */
    /* The cache sits on a side stream, so the miss (default stream) cannot reuse it. */
    struct CUstream_st *side = NULL;
    int (*stream_create)(struct CUstream_st **, unsigned) = NULL;
    void *drvh = dlopen(getenv("XSEG_LIBCUDA") ? getenv("XSEG_LIBCUDA") : "libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (drvh)
        *(void **)&stream_create = dlsym(drvh, "cuStreamCreate");
    if (!stream_create || stream_create(&side, 1 /* CU_STREAM_NON_BLOCKING */) != 0) {
        fprintf(stderr, "bench_services: cuStreamCreate failed\n");
        return 1;
    }
    printf("\n| cost | wall | modelled | driver calls |\n|---|---|---|---|\n");
    for (int thr = 0; thr < 2; thr++) {
        /* Recycling off: with it the miss would unmap the cache itself (to map the same bytes). */
        if (xseg_set_config(thr ? "expandable_segments_recycle:False,release_threshold_mb:256"
                                : "expandable_segments_recycle:False,release_threshold_mb:1000000000") != XSEG_SUCCESS)
            die("xseg_set_config");
        double t[32], mm = 0;
        unsigned long c[NENTRIES] = {0};
        for (int r = 0; r < reps && r < 32; r++) {
            size_t n;
            void **v = fill(GiB / 2, live, &n, side); /* a cache of `live` bytes on the side stream */
            void *p;
            reset_counts();
            double t0 = now_ms();
            if (xseg_malloc(&p, live + 128 * MiB, 0, NULL) != XSEG_SUCCESS) /* a miss */
                die("xseg_malloc");
            t[r] = now_ms() - t0;
            mm = model_ms(c, 0, NULL);
            xseg_free(p);
            release(v, n);
        }
        double tm = median(t, reps < 32 ? reps : 32);
        printf("| malloc miss of %zu MiB, %zu MiB cached on another stream, %s | %.2f ms | ", (live + 128 * MiB) / MiB,
               live / MiB, thr ? "release_threshold_mb:256 (gives it back)" : "no threshold", tm);
        emu.count ? printf("%.2f ms | ", mm) : printf("n/a | ");
        print_calls(c);
    }
    static const char *const pair_cfg[][2] = {
        {"no services", "expandable_segments_recycle:True,release_threshold_mb:1000000000,idle_release_ms:0"},
        {"release_threshold_mb:256", "release_threshold_mb:256"},
        {"idle_release_ms:1000 (malloc ticks)", "release_threshold_mb:1000000000,idle_release_ms:1000"},
        {"idle_release_ms:1000, idle_release_thread:True", "idle_release_ms:1000,idle_release_thread:True"},
    };
    for (size_t i = 0; i < sizeof pair_cfg / sizeof pair_cfg[0]; i++) {
        if (xseg_set_config(pair_cfg[i][1]) != XSEG_SUCCESS)
            die("xseg_set_config");
        (void)pair_ns(1); /* warm: the permit is granted at the first general malloc */
        printf("| cached malloc+free pair, %s | %.0f ns | | |\n", pair_cfg[i][0], pair_ns(reps));
    }
    if (xseg_set_config("idle_release_thread:False,idle_release_ms:0") != XSEG_SUCCESS)
        die("xseg_set_config");
    return 0;
}
