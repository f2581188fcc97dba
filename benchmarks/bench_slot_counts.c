/*
 * bench_slot_counts: what the stream slots do when threads on streams of their own make cached
 * pairs (bench_scale's threads cell), counted rather than timed, so that the mechanism shows on
 * a loaded machine too.
 *
 *   bench_slot_counts [--threads 1,2] [--pairs N] [--reps R] [--mixed] [--overlap] [--same-stream]
 *
 * T threads, each on a stream of its own on device 0, make N malloc+free pairs each (--mixed:
 * cycling 512, 1024, 1536 and 2048 B, else 512 B), classic and expandable mode, each cell in a
 * child process of its own. Per 10^6 pairs (all threads together, first pair included): mallocs
 * and frees through the device lock, slots settled, of them settled by an operation on another
 * slot's stream (cross), and slot hits. Median of R runs, with the smallest and largest. The
 * counters exist in debug builds only (-Ddebug_level=1 or 2; struct dev_fast); a release build
 * says so and exits 77. --overlap: the threads meet at a barrier after each malloc and after each
 * free, so that every pair overlaps the other threads' pairs, as free-running threads' pairs do
 * when each has a core; on a loaded machine free-running threads mostly take turns, which hides
 * what one thread's device-lock operations do to another's slot. --same-stream: every thread on
 * one stream (they share its slot). Without a GPU it runs on the cudaemu built here.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/runtime.h"
#include "xseg.h"

#include "bench_util.h"

#define NCOUNTS 5
static const char *const count_names[NCOUNTS] = {"lock mallocs", "lock frees", "settles", "cross settles", "hits"};

static int (*stream_create)(CUstream *, unsigned);
static bool same_stream; /* --same-stream: every thread on the first thread's stream */
static int (*set_current)(void *);
static void *primary;
static bool mixed, overlap;
static const size_t mixed_sizes[4] = {512, 1024, 1536, 2048};

static int driver_open(void)
{
    void *lib = dlopen(getenv("XSEG_LIBCUDA") ? getenv("XSEG_LIBCUDA") : "libcuda.so.1", RTLD_LAZY);
    int (*retain)(void **, int) = NULL;
    if (lib) {
        *(void **)&retain = dlsym(lib, "cuDevicePrimaryCtxRetain");
        *(void **)&set_current = dlsym(lib, "cuCtxSetCurrent");
        *(void **)&stream_create = dlsym(lib, "cuStreamCreate");
    }
    if (!retain || !set_current || !stream_create || retain(&primary, 0) != 0 || set_current(primary) != 0) {
        fprintf(stderr, "bench_slot_counts: no context on device 0\n");
        return -1;
    }
    return 0;
}

struct worker {
    pthread_t tid;
    CUstream stream;
    size_t pairs;
    pthread_barrier_t *start, *step;
} __attribute__((aligned(64)));

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    (void)set_current(primary);
    pthread_barrier_wait(w->start);
    for (size_t i = 0; i < w->pairs; i++) {
        void *p;
        if (xseg_malloc(&p, mixed ? mixed_sizes[i & 3] : 512, 0, w->stream) != XSEG_SUCCESS) {
            fprintf(stderr, "bench_slot_counts: xseg_malloc: %s\n", xseg_last_error());
            exit(1); /* the other threads may wait at the barrier: the cell's process ends */
        }
        if (overlap)
            pthread_barrier_wait(w->step);
        xseg_free(p);
        if (overlap)
            pthread_barrier_wait(w->step);
    }
    return NULL;
}

/* One cell, in a child: prints the NCOUNTS counts per 10^6 pairs. */
static int cell(bool expandable, int nthreads, size_t pairs)
{
    if (xseg_init(expandable ? "expandable_segments:True" : "expandable_segments:False") != XSEG_SUCCESS) {
        fprintf(stderr, "bench_slot_counts: xseg_init: %s\n", xseg_last_error());
        return 1;
    }
    if (driver_open())
        return 1;
    struct worker w[64];
    pthread_barrier_t start, step;
    pthread_barrier_init(&start, NULL, (unsigned)nthreads);
    pthread_barrier_init(&step, NULL, (unsigned)nthreads);
    for (int i = 0; i < nthreads; i++) {
        w[i] = (struct worker){.pairs = pairs, .start = &start, .step = &step};
        if (same_stream && i > 0)
            w[i].stream = w[0].stream;
        else if (stream_create(&w[i].stream, 1 /* non-blocking */) != 0) {
            fprintf(stderr, "bench_slot_counts: cuStreamCreate failed\n");
            return 1;
        }
    }
    for (int i = 0; i < nthreads; i++)
        pthread_create(&w[i].tid, NULL, worker_main, &w[i]);
    for (int i = 0; i < nthreads; i++)
        pthread_join(w[i].tid, NULL);
#if XSEG_DEBUG_LEVEL >= 1
    xseg_empty_cache(0); /* settles every slot: their hits are counted then */
    const struct dev_fast *f = &rt_device_peek(0)->fast;
    double total = (double)pairs * nthreads / 1e6;
    printf("%.0f %.0f %.0f %.0f %.0f\n", (double)f->lock_mallocs / total, (double)f->lock_frees / total,
           (double)f->settles / total, (double)f->settles_cross / total, (double)f->slot_hits / total);
    return 0;
#else
    return 77;
#endif
}

static int run_cell(bool expandable, int nthreads, size_t pairs, double out[NCOUNTS])
{
    int fd[2];
    if (pipe(fd))
        return -1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        dup2(fd[1], 1);
        int rc = cell(expandable, nthreads, pairs);
        fflush(stdout);
        _exit(rc);
    }
    close(fd[1]);
    char line[256] = {0};
    ssize_t n = read(fd[0], line, sizeof line - 1);
    close(fd[0]);
    int status;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (n <= 0 || sscanf(line, "%lf %lf %lf %lf %lf", &out[0], &out[1], &out[2], &out[3], &out[4]) != NCOUNTS)
        return -1;
    return 0;
}

int main(int argc, char **argv)
{
    size_t threads[8] = {1, 2}, nthreads = 2, pairs = 1000000;
    int reps = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            nthreads = bench_parse_list(argv[++i], threads, 8);
        } else if (!strcmp(argv[i], "--pairs") && i + 1 < argc) {
            pairs = strtoull(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--mixed")) {
            mixed = true;
        } else if (!strcmp(argv[i], "--overlap")) {
            overlap = true;
        } else if (!strcmp(argv[i], "--same-stream")) {
            same_stream = true;
        } else {
            fprintf(stderr, "usage: bench_slot_counts [--threads 1,2] [--pairs N] [--reps R] [--mixed] [--overlap] [--same-stream]\n");
            return 2;
        }
    }
    if (reps < 1 || reps > 64 || !pairs || !nthreads) {
        fprintf(stderr, "bench_slot_counts: --reps is 1 to 64, --pairs and --threads at least 1\n");
        return 2;
    }
    if (!bench_threads_ok("bench_slot_counts", threads, nthreads))
        return 2;
    bench_find_driver("bench_slot_counts");
    printf("Cached %s pairs, threads on %s (%zu pairs per thread%s): counts per 10^6 pairs, "
           "median of %d (smallest - largest)\n\n| mode | threads |", mixed ? "512 B - 2 KiB (4 sizes in turn)" : "512 B",
           same_stream ? "one stream" : "streams of their own", pairs, overlap ? ", overlapping at a barrier" : "", reps);
    for (int k = 0; k < NCOUNTS; k++)
        printf(" %s |", count_names[k]);
    printf("\n|---|---|---|---|---|---|---|\n");
    for (int e = 0; e < 2; e++)
        for (size_t t = 0; t < nthreads; t++) {
            double v[NCOUNTS][64];
            for (int r = 0; r < reps; r++) {
                double one[NCOUNTS];
                int rc = run_cell(e, (int)threads[t], pairs, one);
                if (rc == 77) {
                    printf("\nbench_slot_counts: the counters need a debug build (-Ddebug_level=1 or 2)\n");
                    return 77;
                }
                if (rc) {
                    fprintf(stderr, "bench_slot_counts: a cell failed\n");
                    return 1;
                }
                for (int k = 0; k < NCOUNTS; k++)
                    v[k][r] = one[k];
            }
            printf("| %s | %zu |", e ? "expandable" : "classic", threads[t]);
            for (int k = 0; k < NCOUNTS; k++) {
                double med = bench_median(v[k], (size_t)reps); /* sorted: v[k][0] and v[k][reps - 1] */
                printf(" %.0f (%.0f - %.0f) |", med, v[k][0], v[k][reps - 1]);
            }
            printf("\n");
            fflush(stdout);
        }
    return 0;
}
