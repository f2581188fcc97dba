/*
 * bench_scale: how the host path scales with threads and with live blocks.
 *
 *   bench_scale [--threads 1,2,4,8] [--live 1000,10000,100000,1000000] [--pairs N] [--reps R]
 *               [--only threads|live|floor|after-shared] [--split] [--mixed] [--same-stream] [--pin]
 *               [--room KIB]
 *
 * Threads: T threads, each on a stream of its own on device 0, make cached 512 B malloc+free
 * pairs (N per thread); the table prints total pairs per second (median of R), its ratio to one
 * thread of the same allocator, and glibc malloc and mimalloc (libmimalloc.so.2, loaded when
 * installed: Debian's libmimalloc2.0) with the same threads in the same run. The ratio is taken
 * in the same process: each repetition runs one thread, on a stream of its own that the T threads
 * never use, just before the T threads, and the ratio is the median of the repetitions' ratios
 * (this VM's speed moves one thread's rate by up to 2x between runs minutes apart). --mixed: each thread
 * cycles through 512, 1024, 1536 and 2048 B instead (one size a pair, the next size the next pair).
 * --same-stream: every thread on one stream (the default stream's cache is shared as PyTorch's
 * is: one pool per stream), so that the threads share the stream's slot (core/device/fast.h).
 * --room KIB: before the threads start, each cell allocates KIB KiB in 64 KiB blocks of the small
 * pool on each thread's stream and frees them, so that the peaks stand that far above the pairs'
 * blocks, as a program's earlier steps leave them (a front's lanes need that room, Note [front
 * lane]); without it the peaks are what the pairs alone reach.
 * Live blocks: with L blocks alive (random sizes of 512 B to 64 KiB, the small pool, one stream), N churn pairs each free a random live block and allocate a new random size in its
 * place: ns per churn pair (median of R), and the host memory the allocator holds per live block
 * (the heap in use, mallinfo2's uordblks + hblkhd, after the blocks were allocated minus before,
 * divided by L: block structs, indexes and the pointer map). --split adds R more runs of the churn
 * that read the clock around each call: ns per free and per malloc (median of R; each includes
 * one clock reading, whose cost the table's caption gives), so the pair's time can be placed.
 * --only floor (not in the default run): what two threads on one stream could reach at best if a
 * hit kept eager placement: the shortest mean round trip of a cache line between two threads, one
 * thread's cached pair (t1), and the ceilings of two threads over one when each pair waits for
 * the line one way (both threads, or one of them).
 * --only after-shared (not in the default run): does a stream stay slow once threads stopped
 * sharing it? In one child a stream A that one thread alone ever used, then a stream B that two
 * threads shared (overlapping mixed-size pairs, as the forward pass on the main thread and the
 * backward pass on autograd's share a stream), then one thread alone on B: that thread's pairs
 * per second on A and on B, alternating A and B within each repetition (median of R), and their
 * ratio. --pin: each thread bound to a CPU of its own (thread i to the i-th allowed CPU, glibc's
 * and mimalloc's too), so that the threads overlap rather than take turns on a loaded machine.
 * Each cell runs in a child process of its own (a fresh allocator), classic and expandable mode.
 * Without a GPU (no libcuda.so.1, $XSEG_LIBCUDA unset) it runs on the cudaemu built here.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "xseg.h"

#include "bench_util.h"

/* Without cuda.h: the driver's stream type and cuStreamCreate's flag, as xseg.h spells them. */
typedef struct CUstream_st *CUstream;
#define STREAM_NON_BLOCKING 1u

/* ---- the driver: device 0's primary context current on the calling thread, new streams ---- */

static int (*stream_create)(CUstream *, unsigned);
static int (*set_current)(void *);
static void *primary;

static int driver_open(void)
{
    void *lib = dlopen(getenv("XSEG_LIBCUDA") ? getenv("XSEG_LIBCUDA") : "libcuda.so.1", RTLD_LAZY);
    if (!lib) {
        fprintf(stderr, "bench_scale: %s\n", dlerror());
        return -1;
    }
    int (*retain)(void **, int) = NULL;
    *(void **)&retain = dlsym(lib, "cuDevicePrimaryCtxRetain");
    *(void **)&set_current = dlsym(lib, "cuCtxSetCurrent");
    *(void **)&stream_create = dlsym(lib, "cuStreamCreate");
    if (!retain || !set_current || !stream_create || retain(&primary, 0) != 0 || set_current(primary) != 0) {
        fprintf(stderr, "bench_scale: no context on device 0\n");
        return -1;
    }
    return 0;
}

/* ---- threads ---- */

enum who { WHO_XSEG, WHO_GLIBC, WHO_MIMALLOC };

static void *(*mi_malloc_p)(size_t);
/* --mixed: the sizes a thread cycles through (else 512 B every pair). */
static bool mixed;
static const size_t mixed_sizes[4] = {512, 1024, 1536, 2048};
static inline size_t pair_size(size_t i) { return mixed ? mixed_sizes[i & 3] : 512; }
static bool same_stream; /* --same-stream: every thread on streams[0] */
static size_t room_kib;  /* --room */
static bool pin;         /* --pin: thread i on the i-th CPU the process may use */

/* Bind the calling thread to the @p i-th CPU of the process's mask (--pin; no-op otherwise). */
static void pin_thread(int i)
{
    cpu_set_t all, one;
    if (!pin || sched_getaffinity(0, sizeof all, &all))
        return;
    int n = CPU_COUNT(&all), k = i % (n ? n : 1);
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &all) && k-- == 0) {
            CPU_ZERO(&one);
            CPU_SET(c, &one);
            (void)pthread_setaffinity_np(pthread_self(), sizeof one, &one);
            return;
        }
}
static void (*mi_free_p)(void *);

/* One cache line or more each: a worker's fields are written by its thread alone. */
struct worker {
    pthread_t tid;
    CUstream stream;
    size_t pairs;
    enum who who;
    pthread_barrier_t *start;
    int index;       /* the thread's place among its round's (--pin's CPU) */
    bool no_warm;    /* after-shared: the stream's cache is warm already */
    uint64_t t0, t1; /* this thread's own clock: the main thread may run late after the barrier */
    int rc;
} __attribute__((aligned(64)));

/* Keeps a pointer alive without a store: a shared `volatile` sink written by every thread would
 * put one contended cache line in each pair, which stalls every allocator whose path has an
 * atomic (it drains the store buffer) and measures the benchmark, not the allocator. */
#define KEEP(p) __asm__ volatile("" : : "r"(p) : "memory")

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    bool use_xseg = w->who == WHO_XSEG;
    pin_thread(w->index);
    if (use_xseg)
        (void)set_current(primary);
    /* Warm this stream's cache (the first malloc creates its segment) before the clock starts. */
    for (int i = 0; i < 1000 && use_xseg && !w->no_warm; i++) {
        void *p;
        if (xseg_malloc(&p, pair_size((size_t)i), 0, w->stream) != XSEG_SUCCESS) {
            w->rc = -1;
            break;
        }
        xseg_free(p);
    }
    pthread_barrier_wait(w->start);
    w->t0 = now_ns();
    for (size_t i = 0; i < w->pairs && !w->rc; i++) {
        if (w->who == WHO_GLIBC) {
            void *p = malloc(pair_size(i));
            KEEP(p);
            free(p);
            continue;
        }
        if (w->who == WHO_MIMALLOC) {
            void *p = mi_malloc_p(pair_size(i));
            KEEP(p);
            mi_free_p(p);
            continue;
        }
        void *p;
        if (xseg_malloc(&p, pair_size(i), 0, w->stream) != XSEG_SUCCESS) {
            fprintf(stderr, "bench_scale: xseg_malloc: %s\n", xseg_last_error());
            w->rc = -1;
            break;
        }
        KEEP(p);
        xseg_free(p);
    }
    w->t1 = now_ns();
    return NULL;
}

/* Pairs per second of @p nthreads threads, @p pairs each; < 0 on error. */
static double threads_once(CUstream *streams, int nthreads, size_t pairs, enum who who)
{
    struct worker w[64];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)nthreads + 1);
    for (int i = 0; i < nthreads; i++) {
        w[i] = (struct worker){.stream = streams[same_stream ? 0 : i], .pairs = pairs, .who = who, .start = &start,
                               .index = i};
        pthread_create(&w[i].tid, NULL, worker_main, &w[i]);
    }
    pthread_barrier_wait(&start);
    int rc = 0;
    uint64_t t0 = UINT64_MAX, t1 = 0; /* first start to last end */
    for (int i = 0; i < nthreads; i++) {
        pthread_join(w[i].tid, NULL);
        rc |= w[i].rc;
        t0 = w[i].t0 < t0 ? w[i].t0 : t0;
        t1 = w[i].t1 > t1 ? w[i].t1 : t1;
    }
    pthread_barrier_destroy(&start);
    return rc ? -1.0 : (double)pairs * nthreads / ((double)(t1 - t0) / 1e9);
}

/* One cell, in a child: prints "xseg glibc mimalloc" pairs per second (medians; mimalloc's 0
 * without libmimalloc.so.2), then the same three as ratios to one thread. With @p nthreads > 1,
 * each repetition runs one thread of each allocator just before its @p nthreads, on a stream of
 * its own that the cell's threads never use (streams[nthreads]), and a ratio is the median of the
 * repetitions' ratios: both sides of each are taken in the same process within a second, where
 * this VM's speed holds, not minutes apart in two children (it moved one thread's rate by up to
 * 2x between runs). */
static int threads_cell(bool expandable, int nthreads, size_t pairs, int reps)
{
    if (xseg_init(expandable ? "expandable_segments:True" : "expandable_segments:False") != XSEG_SUCCESS) {
        fprintf(stderr, "bench_scale: xseg_init: %s\n", xseg_last_error());
        return 1;
    }
    if (driver_open())
        return 1;
    CUstream streams[65];
    for (int i = 0; i <= nthreads; i++)
        if (stream_create(&streams[i], STREAM_NON_BLOCKING) != 0) {
            fprintf(stderr, "bench_scale: cuStreamCreate failed\n");
            return 1;
        }
    void *mi = dlopen("libmimalloc.so.2", RTLD_NOW | RTLD_LOCAL);
    if (mi) {
        *(void **)&mi_malloc_p = dlsym(mi, "mi_malloc");
        *(void **)&mi_free_p = dlsym(mi, "mi_free");
    }
    bool have_mi = mi_malloc_p && mi_free_p;
    bool paired = nthreads > 1;
    /* --room: peaks above the pairs', made on each stream a thread uses, the lone thread's too */
    CUstream roomed[65];
    int nroomed = 0;
    for (int i = 0; i < (same_stream ? 1 : nthreads); i++)
        roomed[nroomed++] = streams[i];
    if (paired)
        roomed[nroomed++] = streams[nthreads];
    for (int i = 0; i < nroomed && room_kib; i++) {
        void *room[4096];
        size_t n = room_kib / 64 < 4096 ? room_kib / 64 : 4096;
        for (size_t k = 0; k < n; k++)
            if (xseg_malloc(&room[k], 64 << 10, 0, roomed[i]) != XSEG_SUCCESS) {
                fprintf(stderr, "bench_scale: --room: xseg_malloc: %s\n", xseg_last_error());
                return 1;
            }
        for (size_t k = 0; k < n; k++)
            xseg_free(room[k]);
    }
    enum who whos[3] = {WHO_XSEG, WHO_GLIBC, WHO_MIMALLOC};
    double rate[3][64], ratio[3][64], lone[3][64];
    for (int r = 0; r < reps; r++) /* the allocators take turns within each repetition */
        for (int w = 0; w < 3; w++) {
            rate[w][r] = ratio[w][r] = lone[w][r] = 0;
            if (whos[w] == WHO_MIMALLOC && !have_mi)
                continue;
            double one = paired ? threads_once(&streams[nthreads], 1, pairs, whos[w]) : 0;
            if ((rate[w][r] = threads_once(streams, nthreads, pairs, whos[w])) < 0 || one < 0)
                return 1;
            ratio[w][r] = paired ? rate[w][r] / one : 1.0;
            lone[w][r] = paired ? one : rate[w][r];
        }
    for (int w = 0; w < 3; w++)
        printf("%.0f ", bench_median(rate[w], (size_t)reps));
    for (int w = 0; w < 3; w++)
        printf("%.4f ", bench_median(ratio[w], (size_t)reps));
    for (int w = 0; w < 3; w++)
        printf("%.0f%s", bench_median(lone[w], (size_t)reps), w < 2 ? " " : "\n");
    return 0;
}

/* One thread's xseg pairs per second on @p stream (its cache warm), or < 0. */
static double alone_on(CUstream stream, size_t pairs)
{
    struct worker w = {.stream = stream, .pairs = pairs, .who = WHO_XSEG, .no_warm = true};
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, 2);
    w.start = &start;
    pthread_create(&w.tid, NULL, worker_main, &w);
    pthread_barrier_wait(&start);
    pthread_join(w.tid, NULL);
    pthread_barrier_destroy(&start);
    return w.rc ? -1.0 : (double)pairs / ((double)(w.t1 - w.t0) / 1e9);
}

/* --only after-shared's cell, in a child: prints "pairs_per_s_on_A pairs_per_s_on_B" (the medians). */
static int after_shared_cell(bool expandable, size_t unused, size_t pairs, int reps)
{
    (void)unused;
    if (xseg_init(expandable ? "expandable_segments:True" : "expandable_segments:False") != XSEG_SUCCESS ||
        driver_open())
        return 1;
    CUstream s[2];
    for (int i = 0; i < 2; i++)
        if (stream_create(&s[i], STREAM_NON_BLOCKING) != 0)
            return 1;
    /* A: one thread, ever. B: two threads at once (the shared phase), with their warm-up. */
    CUstream pair[2] = {s[1], s[1]};
    if (alone_on(s[0], pairs) < 0 || threads_once(pair, 2, pairs, WHO_XSEG) < 0)
        return 1;
    double a[64], b[64];
    for (int r = 0; r < reps; r++)
        if ((a[r] = alone_on(s[0], pairs)) < 0 || (b[r] = alone_on(s[1], pairs)) < 0)
            return 1;
    printf("%.0f %.0f\n", bench_median(a, (size_t)reps), bench_median(b, (size_t)reps));
    return 0;
}

/* ---- live blocks ---- */

/* One xorshift step of the generator @p s. */
static uint64_t xorshift(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static uint64_t rng = 88172645463325252ull;
static uint64_t next_rand(void) { return xorshift(&rng); }

/* 512 B to 64 KiB in 512 B steps: small-pool blocks, so that a million of them fit any device
 * (the block count, not the bytes, is what this measures). */
static size_t rand_size(void) { return (size_t)(1 + next_rand() % 128) * 512; }

/* Resident bytes of the mappings advised to or away from huge pages (VmFlags "hg" or "nh" in
 * /proc/self/smaps): the allocator's own host tables (the live map on 2 MiB pages, base/hugemem.h;
 * the block structs' arena, base/arena.h), which it maps itself, so mallinfo2 does not see them.
 * Nothing else in this process gives such advice (run without glibc's glibc.malloc.hugetlb
 * tunable, or the heap would count twice). 0 without /proc. */
static size_t tables_resident(void)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return 0;
    char line[512];
    size_t total = 0, rss = 0;
    unsigned long kb;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "Rss: %lu kB", &kb) == 1) {
            rss = (size_t)kb << 10;
        } else if (!strncmp(line, "VmFlags:", 8)) { /* a mapping's last line */
            if (strstr(line, " hg ") || strstr(line, " hg\n") || strstr(line, " nh ") || strstr(line, " nh\n"))
                total += rss;
            rss = 0;
        }
    }
    fclose(f);
    return total;
}

/* Host memory the process holds: glibc's heap and mappings in use, and the allocator's own. */
static size_t heap_in_use(void)
{
    size_t own = tables_resident(); /* first: its stdio buffer is given back before mallinfo2 */
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd + own;
}

static bool split_calls; /* --split */

/* One cell, in a child: prints "ns_per_churn_pair bytes_per_live_block [ns_per_free ns_per_malloc]". */
static int live_cell(bool expandable, size_t live, size_t pairs, int reps)
{
    if (xseg_init(expandable ? "expandable_segments:True" : "expandable_segments:False") != XSEG_SUCCESS) {
        fprintf(stderr, "bench_scale: xseg_init: %s\n", xseg_last_error());
        return 1;
    }
    void **v = calloc(live, sizeof *v);
    if (!v)
        return 1;
    void *first;
    if (xseg_malloc(&first, 512, 0, NULL) != XSEG_SUCCESS) { /* loads the driver, creates the device */
        fprintf(stderr, "bench_scale: xseg_malloc: %s\n", xseg_last_error());
        return 1;
    }
    size_t before = heap_in_use();
    for (size_t i = 0; i < live; i++)
        if (xseg_malloc(&v[i], rand_size(), 0, NULL) != XSEG_SUCCESS) {
            fprintf(stderr, "bench_scale: xseg_malloc: %s\n", xseg_last_error());
            return 1;
        }
    /* The heap the allocator took for them (cudaemu's own bookkeeping of the pages counts too: a
     * few bytes per 2 MiB page, negligible per block). */
    double per_block = (double)(heap_in_use() - before) / (double)live;
    /* Warm the churn (the caches of every size fill), then measure. */
    for (size_t i = 0; i < pairs; i++) {
        size_t k = next_rand() % live;
        xseg_free(v[k]);
        if (xseg_malloc(&v[k], rand_size(), 0, NULL) != XSEG_SUCCESS)
            return 1;
    }
    double ns[64];
    for (int r = 0; r < reps; r++) {
        uint64_t t0 = now_ns();
        for (size_t i = 0; i < pairs; i++) {
            size_t k = next_rand() % live;
            xseg_free(v[k]);
            if (xseg_malloc(&v[k], rand_size(), 0, NULL) != XSEG_SUCCESS) {
                fprintf(stderr, "bench_scale: xseg_malloc: %s\n", xseg_last_error());
                return 1;
            }
        }
        ns[r] = (double)(now_ns() - t0) / (double)pairs;
    }
    printf("%.1f %.1f", bench_median(ns, (size_t)reps), per_block);
    if (split_calls) {
        /* The same churn with the clock read between the calls: the free's time starts after its
         * pointer was loaded from v[], so the benchmark's own miss falls outside both halves. */
        double nf[64], nm[64];
        for (int r = 0; r < reps; r++) {
            uint64_t tf = 0, tm = 0;
            for (size_t i = 0; i < pairs; i++) {
                size_t k = next_rand() % live;
                void *p = v[k];
                uint64_t t0 = now_ns();
                xseg_free(p);
                uint64_t t1 = now_ns();
                if (xseg_malloc(&v[k], rand_size(), 0, NULL) != XSEG_SUCCESS) {
                    fprintf(stderr, "bench_scale: xseg_malloc: %s\n", xseg_last_error());
                    return 1;
                }
                uint64_t t2 = now_ns();
                tf += t1 - t0;
                tm += t2 - t1;
            }
            nf[r] = (double)tf / (double)pairs;
            nm[r] = (double)tm / (double)pairs;
        }
        printf(" %.1f %.1f", bench_median(nf, (size_t)reps), bench_median(nm, (size_t)reps));
    }
    printf("\n");
    return 0;
}

/* What one reading of now_ns() costs (the unit the split columns each include once). */
static double clock_ns(void)
{
    size_t n = 1000000;
    uint64_t t0 = now_ns(), x = 0;
    for (size_t i = 0; i < n; i++)
        x += now_ns();
    __asm__ volatile("" : : "r"(x));
    return (double)(now_ns() - t0) / (double)n;
}

/* What one dependent load costs on this machine over @p bytes of memory: a random cyclic walk of
 * its cache lines (each load's address comes from the one before, as a lookup's chain does). ns
 * per load, median of @p reps walks; 0 on ENOMEM. Past the cache the machine keeps, it is the
 * DRAM trip that each miss on a churn pair's chain costs. */
static double chase_ns(size_t bytes, int reps)
{
    size_t lines = bytes / 64;
    char *buf = aligned_alloc(64, bytes);
    size_t *order = malloc(lines * sizeof *order);
    if (!buf || !order) {
        free(buf);
        free(order);
        return 0;
    }
    for (size_t i = 0; i < lines; i++)
        order[i] = i;
    uint64_t x = 0x2545F4914F6CDD1Dull; /* its own generator: the cells' sequence stays as it was */
    for (size_t i = lines - 1; i > 0; i--) { /* Fisher-Yates: one cycle through every line */
        size_t j = xorshift(&x) % (i + 1), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (size_t i = 0; i < lines; i++)
        *(void **)(buf + order[i] * 64) = buf + order[(i + 1) % lines] * 64;
    void **q = (void **)(buf + order[0] * 64);
    size_t steps = 2000000;
    for (size_t i = 0; i < steps; i++) /* warm: every line written and the walk once round */
        q = *q;
    double ns[64];
    for (int r = 0; r < reps; r++) {
        uint64_t t0 = now_ns();
        for (size_t i = 0; i < steps; i++)
            q = *q;
        ns[r] = (double)(now_ns() - t0) / (double)steps;
    }
    __asm__ volatile("" : : "r"(q)); /* the walk is kept */
    free(buf);
    free(order);
    return bench_median(ns, (size_t)reps);
}

/* ---- driver of the cells ---- */

/* Run @p fn's cell in a child; its one output line into @p out. */
static int run_child(int (*fn)(bool, size_t, size_t, int), bool expandable, size_t x, size_t pairs, int reps,
                     char *out, size_t outsz)
{
    int fd[2];
    if (pipe(fd))
        return -1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        dup2(fd[1], 1);
        int rc = fn(expandable, x, pairs, reps);
        fflush(stdout); /* _exit does not flush the pipe's buffer */
        _exit(rc);
    }
    close(fd[1]);
    ssize_t n = read(fd[0], out, outsz - 1);
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    out[n > 0 ? n : 0] = 0;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 && n > 0 ? 0 : -1;
}

static int threads_adapter(bool e, size_t t, size_t pairs, int reps) { return threads_cell(e, (int)t, pairs, reps); }

/* ---- the floor of one stream shared by threads ---- */

/* A cache line passed between two threads: the main thread writes 2i+1, the other answers 2i+2. */
static _Alignas(64) volatile uint64_t ball;
#define BALL_ROUNDS 1000

/* Spin until the line holds @p v; yield now and then, so that a loaded machine (or one core)
 * does not spend a whole time slice per trip when the other thread lost its core. */
static void ball_wait(uint64_t v)
{
    for (unsigned n = 1; __atomic_load_n(&ball, __ATOMIC_ACQUIRE) != v; n++)
        if (!(n & 0x3fff))
            sched_yield();
}

static void *ball_answer(void *arg)
{
    size_t n = *(const size_t *)arg;
    for (uint64_t i = 0; i < n; i++) {
        ball_wait(2 * i + 1);
        __atomic_store_n(&ball, 2 * i + 2, __ATOMIC_RELEASE);
    }
    return NULL;
}

/* The shortest mean round trip of the line over @p chunks runs of BALL_ROUNDS: the hardware's
 * where some run had both threads on a core throughout (not at a load far above the cores). */
static double line_round_trip_ns(size_t chunks)
{
    size_t n = chunks * BALL_ROUNDS;
    ball = 0;
    pthread_t t;
    if (pthread_create(&t, NULL, ball_answer, &n))
        return -1;
    double best = 1e18;
    for (uint64_t c = 0; c < chunks; c++) {
        uint64_t t0 = now_ns();
        for (uint64_t i = c * BALL_ROUNDS; i < (c + 1) * BALL_ROUNDS; i++) {
            __atomic_store_n(&ball, 2 * i + 1, __ATOMIC_RELEASE);
            ball_wait(2 * i + 2);
        }
        double dt = (double)(now_ns() - t0) / BALL_ROUNDS;
        best = dt < best ? dt : best;
    }
    pthread_join(t, NULL);
    return best;
}

int main(int argc, char **argv)
{
    size_t threads[8] = {1, 2, 4, 8}, nthreads = 4;
    size_t lives[8] = {1000, 10000, 100000, 1000000}, nlives = 4;
    size_t pairs = 200000;
    int reps = 5;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            nthreads = bench_parse_list(argv[++i], threads, 8);
        else if (!strcmp(argv[i], "--live") && i + 1 < argc)
            nlives = bench_parse_list(argv[++i], lives, 8);
        else if (!strcmp(argv[i], "--pairs") && i + 1 < argc)
            pairs = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc)
            only = argv[++i];
        else if (!strcmp(argv[i], "--split"))
            split_calls = true;
        else if (!strcmp(argv[i], "--mixed"))
            mixed = true;
        else if (!strcmp(argv[i], "--same-stream"))
            same_stream = true;
        else if (!strcmp(argv[i], "--pin"))
            pin = true;
        else if (!strcmp(argv[i], "--room") && i + 1 < argc)
            room_kib = strtoull(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "usage: bench_scale [--threads 1,2,4,8] [--live 1000,...] [--pairs N] [--reps R] "
                            "[--only threads|live|floor|after-shared] [--split] [--mixed] [--same-stream] [--pin] "
                            "[--room KIB]\n");
            return 2;
        }
    }
    if (reps < 1 || reps > 64 || !pairs) {
        fprintf(stderr, "bench_scale: --reps is 1 to 64, --pairs at least 1\n");
        return 2;
    }
    if (!bench_threads_ok("bench_scale", threads, nthreads))
        return 2;
    bench_find_driver("bench_scale");
    printf("driver: %s\n\n", getenv("XSEG_LIBCUDA") ? getenv("XSEG_LIBCUDA") : "libcuda.so.1");
    char line[256];
    if (!only || !strcmp(only, "threads")) {
        printf("Threads on %s, cached %s pairs (%zu per thread, median of %d%s): million pairs/s "
               "(T > 1: the ratio to one thread in the same run, of its rate there: each repetition runs one thread "
               "on a stream of its own just before the T threads; medians of the repetitions' ratios and rates)\n\n",
               same_stream ? "one stream" : "streams of their own", mixed ? "512 B - 2 KiB (4 sizes in turn)" : "512 B",
               pairs, reps, room_kib ? ", peaks with room above the pairs" : "");
        printf("| threads | xseg classic | xseg expandable | glibc malloc | mimalloc |\n|---|---|---|---|---|\n");
        for (size_t i = 0; i < nthreads; i++) {
            double x[2] = {0, 0}, rx[2] = {0, 0}, ox[2] = {0, 0}, g = 0, m = 0, rg = 0, rm = 0, og = 0, om = 0;
            for (int e = 0; e < 2; e++) {
                double gl, ml, rgl, rml, ogl, oml;
                if (run_child(threads_adapter, e, threads[i], pairs, reps, line, sizeof line) ||
                    sscanf(line, "%lf %lf %lf %lf %lf %lf %lf %lf %lf", &x[e], &gl, &ml, &rx[e], &rgl, &rml, &ox[e],
                           &ogl, &oml) != 9) {
                    fprintf(stderr, "bench_scale: threads cell failed\n");
                    return 1;
                }
                /* glibc and mimalloc ran in both children: their mean */
                g = e ? (g + gl) / 2 : gl;
                m = e ? (m + ml) / 2 : ml;
                rg = e ? (rg + rgl) / 2 : rgl;
                rm = e ? (rm + rml) / 2 : rml;
                og = e ? (og + ogl) / 2 : ogl;
                om = e ? (om + oml) / 2 : oml;
            }
            if (threads[i] == 1)
                printf("| 1 | %.1f | %.1f | %.1f | ", x[0] / 1e6, x[1] / 1e6, g / 1e6);
            else
                printf("| %zu | %.1f (%.2f× of %.1f) | %.1f (%.2f× of %.1f) | %.1f (%.2f× of %.1f) | ", threads[i],
                       x[0] / 1e6, rx[0], ox[0] / 1e6, x[1] / 1e6, rx[1], ox[1] / 1e6, g / 1e6, rg, og / 1e6);
            if (m > 0 && threads[i] == 1)
                printf("%.1f |\n", m / 1e6);
            else if (m > 0)
                printf("%.1f (%.2f× of %.1f) |\n", m / 1e6, rm, om / 1e6);
            else
                printf("n/a (no libmimalloc.so.2) |\n");
            fflush(stdout);
        }
        printf("\n");
    }
    if (only && !strcmp(only, "after-shared")) {
        /* threads_once reads same_stream: the shared phase passes one stream twice instead. */
        printf("One thread's cached %s pairs (%zu a run, median of %d) on a stream it alone ever used (A) "
               "and on one two threads shared before (B), runs of A and B in turn%s: million pairs/s\n\n",
               mixed ? "512 B - 2 KiB (4 sizes in turn)" : "512 B", pairs, reps, pin ? ", pinned" : "");
        printf("| mode | A: never shared | B: after a shared phase | B / A |\n|---|---|---|---|\n");
        for (int e = 0; e < 2; e++) {
            double a, b;
            if (run_child(after_shared_cell, e, 0, pairs, reps, line, sizeof line) ||
                sscanf(line, "%lf %lf", &a, &b) != 2 || a <= 0) {
                fprintf(stderr, "bench_scale: after-shared cell failed\n");
                return 1;
            }
            printf("| %s | %.1f | %.1f | %.2f |\n", e ? "expandable" : "classic", a / 1e6, b / 1e6, b / a);
        }
        printf("\n");
    }
    if (only && !strcmp(only, "floor")) {
        /* What a hit that hands out the eager free and malloc's address costs at best when two
         * threads share a stream: the address a malloc gets depends on whether the other thread's
         * block is free at that instant, so each pair reads a line the other thread wrote since. */
        double rt = line_round_trip_ns(200), one = rt / 2, t1[2];
        if (rt < 0) {
            fprintf(stderr, "bench_scale: no second thread for the line's round trip\n");
            return 1;
        }
        if (rt > 5000) { /* microseconds: every run lost a core, the scheduler's time, not the line's */
            fprintf(stderr, "bench_scale: the two threads never ran at once (round trip %.0f ns): "
                            "no floor on a machine this loaded\n", rt);
            return 1;
        }
        for (int e = 0; e < 2; e++) {
            double pps, gl, ml;
            if (run_child(threads_adapter, e, 1, pairs, reps, line, sizeof line) ||
                sscanf(line, "%lf %lf %lf", &pps, &gl, &ml) != 3 || pps <= 0) {
                fprintf(stderr, "bench_scale: floor cell failed\n");
                return 1;
            }
            t1[e] = 1e9 / pps;
        }
        printf("The floor of two threads on one stream with eager placement: a cache line's round trip "
               "between two threads here is %.1f ns (the shortest mean of %d runs of %d), %.1f ns one way; "
               "t1 is one thread's cached 512 B pair (%zu pairs, median of %d). Ceiling of two threads' "
               "throughput over one thread's when each pair waits for one line: both threads "
               "2·t1 / (t1 + one way), one of them 1 + t1 / (t1 + one way)\n\n",
               rt, 200, BALL_ROUNDS, one, pairs, reps);
        printf("| mode | t1 ns | ceiling, both wait | ceiling, one waits |\n|---|---|---|---|\n");
        for (int e = 0; e < 2; e++)
            printf("| %s | %.1f | %.2f× | %.2f× |\n", e ? "expandable" : "classic", t1[e], 2 * t1[e] / (t1[e] + one),
                   1 + t1[e] / (t1[e] + one));
        printf("\n");
    }
    if (!only || !strcmp(only, "live")) {
        printf("Live blocks (512 B to 64 KiB), one stream: ns per churn pair (free a random block, "
               "allocate a random size; %zu pairs, median of %d) and host bytes per live block\n\n", pairs, reps);
        /* The churn's ns are mostly DRAM trips at 10^6 blocks: what one costs here, beside them. */
        double l1 = chase_ns((size_t)1 << 20, 3), l64 = chase_ns((size_t)64 << 20, 3);
        printf("A dependent load on this machine: %.1f ns within 1 MiB, %.1f ns over 64 MiB (a random "
               "walk of the cache lines, median of 3)\n\n", l1, l64);
        if (split_calls)
            printf("Split: ns per free and per malloc of the churn, timed call by call (a clock reading costs "
                   "%.1f ns here; each figure includes one)\n\n", clock_ns());
        printf("| live blocks | classic ns/pair | classic B/block | expandable ns/pair | expandable B/block |%s\n"
               "|---|---|---|---|---|%s\n",
               split_calls ? " classic free | classic malloc | expandable free | expandable malloc |" : "",
               split_calls ? "---|---|---|---|" : "");
        for (size_t i = 0; i < nlives; i++) {
            double ns[2], bpb[2], fr[2] = {0, 0}, ma[2] = {0, 0};
            for (int e = 0; e < 2; e++) {
                if (run_child(live_cell, e, lives[i], pairs, reps, line, sizeof line)) {
                    fprintf(stderr, "bench_scale: live-blocks cell failed\n");
                    return 1;
                }
                sscanf(line, "%lf %lf %lf %lf", &ns[e], &bpb[e], &fr[e], &ma[e]);
            }
            printf("| %zu | %.1f | %.0f | %.1f | %.0f |", lives[i], ns[0], bpb[0], ns[1], bpb[1]);
            if (split_calls)
                printf(" %.1f | %.1f | %.1f | %.1f |", fr[0], ma[0], fr[1], ma[1]);
            printf("\n");
            fflush(stdout);
        }
    }
    return 0;
}
