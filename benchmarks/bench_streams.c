/*
 * bench_streams: what many streams cost the allocator. S streams (1 ... 1000) churn malloc/free
 * pairs round robin, each keeping a few blocks of large-pool sizes alive, in classic and expandable
 * mode. After a warm-up in which every stream fills its cache, the measured pairs should be
 * cache hits: the table prints the warm-up's driver memory calls, then for the measured phase ns
 * per pair (median of repetitions), driver memory calls, host-blocking synchronizations and
 * capture queries, counted by cudaemu.
 *
 *   bench_streams [--streams 1,10,100,1000] [--pairs N] [--reps R]
 *
 * Each (mode, streams) cell runs in a child process of its own (a fresh allocator). Runs on the
 * cudaemu built here (counts need the emulator); with a real driver the counts print as n/a.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
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

#define LIVE_PER_STREAM 3

/* Without cuda.h: the driver's stream type and cuStreamCreate's flag, as xseg.h spells them. */
typedef struct CUstream_st *CUstream;
#define STREAM_NON_BLOCKING 1u

static unsigned long (*emu_count)(const char *);
static void (*emu_reset)(void);

static unsigned long count(const char *const *names)
{
    unsigned long n = 0;
    for (; *names; names++)
        n += emu_count(*names);
    return n;
}

static const char *const memory_calls[] = {"cuMemAlloc", "cuMemFree", "cuMemAddressReserve", "cuMemAddressFree",
                                           "cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemUnmap",
                                           "cuMemSetAccess", NULL};
static const char *const sync_calls[] = {"cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize", NULL};
static const char *const capture_calls[] = {"cuStreamIsCapturing", "cuStreamGetCaptureInfo", NULL};

/* The sizes one stream cycles through: large-pool requests of 2-8 MiB (1,000 streams then fit
 * an 80 GiB device with room to spare). */
static size_t size_of(size_t stream, size_t k)
{
    static const size_t mib[] = {2, 5, 3, 8, 6, 4};
    return mib[(stream + k) % (sizeof mib / sizeof mib[0])] << 20;
}

/* One round: every stream frees its oldest block and allocates the next size. */
static int round_robin(CUstream *s, void **live, size_t nstreams, size_t *k)
{
    for (size_t i = 0; i < nstreams; i++) {
        void **slot = &live[i * LIVE_PER_STREAM + k[i] % LIVE_PER_STREAM];
        if (*slot)
            xseg_free(*slot);
        if (xseg_malloc(slot, size_of(i, k[i]), 0, s[i]) != XSEG_SUCCESS) {
            fprintf(stderr, "bench_streams: xseg_malloc: %s\n", xseg_last_error());
            return -1;
        }
        k[i]++;
    }
    return 0;
}

/* One cell, in a child: prints "ns mem syncs captures" on stdout. */
static int cell(bool expandable, size_t nstreams, size_t pairs, int reps)
{
    if (xseg_init(expandable ? "expandable_segments:True" : "expandable_segments:False") != XSEG_SUCCESS) {
        fprintf(stderr, "bench_streams: xseg_init: %s\n", xseg_last_error());
        return 1;
    }
    CUstream *s = calloc(nstreams, sizeof *s);
    void **live = calloc(nstreams * LIVE_PER_STREAM, sizeof *live);
    size_t *k = calloc(nstreams, sizeof *k);
    if (!s || !live || !k)
        return 1;
    int (*stream_create)(CUstream *, unsigned) = NULL;
    void *lib = dlopen(getenv("XSEG_LIBCUDA") ? getenv("XSEG_LIBCUDA") : "libcuda.so.1", RTLD_LAZY);
    if (!lib) {
        fprintf(stderr, "bench_streams: %s\n", dlerror());
        return 1;
    }
    *(void **)&stream_create = dlsym(lib, "cuStreamCreate");
    /* Streams belong to a context: the device's primary one, as the allocator uses. */
    int (*retain)(void **, int) = NULL, (*set_current)(void *) = NULL;
    *(void **)&retain = dlsym(lib, "cuDevicePrimaryCtxRetain");
    *(void **)&set_current = dlsym(lib, "cuCtxSetCurrent");
    void *ctx = NULL;
    if (!retain || !set_current || retain(&ctx, 0) != 0 || set_current(ctx) != 0) {
        fprintf(stderr, "bench_streams: no context on device 0\n");
        return 1;
    }
    *(void **)&emu_count = dlsym(lib, "cudaemu_call_count");
    *(void **)&emu_reset = dlsym(lib, "cudaemu_counts_reset");
    for (size_t i = 0; i < nstreams; i++)
        if (!stream_create || stream_create(&s[i], STREAM_NON_BLOCKING) != 0) {
            fprintf(stderr, "bench_streams: cuStreamCreate failed\n");
            return 1;
        }
    /* Warm-up: every stream cycles through its sizes until its cache holds them all (48 rounds:
     * fewer leave expandable mode a few misses at 1,000 streams). */
    if (emu_reset)
        emu_reset();
    for (int w = 0; w < 48; w++)
        if (round_robin(s, live, nstreams, k))
            return 1;
    unsigned long warm_calls = emu_count ? count(memory_calls) : 0;
    if (emu_reset)
        emu_reset();
    size_t rounds = pairs / nstreams ? pairs / nstreams : 1;
    double *v = calloc((size_t)reps, sizeof *v);
    for (int r = 0; r < reps; r++) {
        uint64_t t0 = now_ns();
        for (size_t i = 0; i < rounds; i++)
            if (round_robin(s, live, nstreams, k))
                return 1;
        v[r] = (double)(now_ns() - t0) / (double)(rounds * nstreams);
    }
    qsort(v, (size_t)reps, sizeof *v, cmp_double);
    if (emu_count)
        printf("%.1f %lu %lu %lu %lu\n", v[reps / 2], warm_calls, count(memory_calls), count(sync_calls),
               count(capture_calls));
    else
        printf("%.1f -1 -1 -1 -1\n", v[reps / 2]);
    fflush(stdout); /* the child ends with _exit */
    return 0;
}

int main(int argc, char **argv)
{
    const char *streams = "1,10,100,1000";
    size_t pairs = 100000;
    int reps = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--streams") && i + 1 < argc)
            streams = argv[++i];
        else if (!strcmp(argv[i], "--pairs") && i + 1 < argc)
            pairs = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_streams [--streams 1,10,100,1000] [--pairs N] [--reps R]\n");
            return 2;
        }
    }
    if (reps < 1 || pairs < 1) {
        fprintf(stderr, "bench_streams: --pairs and --reps must be positive\n");
        return 2;
    }
    bench_find_driver("bench_streams");
    printf("%zu pairs per repetition, median of %d; counts are of the measured pairs (all repetitions)\n\n",
           pairs, reps);
    printf("| streams | classic ns/pair | expandable ns/pair | ratio | warm-up calls classic / expandable "
           "| measured calls classic / expandable | syncs classic / expandable | capture queries classic / "
           "expandable |\n|---|---|---|---|---|---|---|---|\n");
    char list[256];
    snprintf(list, sizeof list, "%s", streams);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        size_t n = strtoull(tok, NULL, 10);
        if (!n)
            continue;
        double ns[2];
        long warm[2], mem[2], syncs[2], caps[2];
        for (int m = 0; m < 2; m++) {
            int fd[2];
            if (pipe(fd))
                return 1;
            fflush(stdout);
            pid_t pid = fork();
            if (pid == 0) {
                close(fd[0]);
                dup2(fd[1], 1);
                _exit(cell(m == 1, n, pairs, reps));
            }
            close(fd[1]);
            char buf[128] = {0};
            ssize_t got = read(fd[0], buf, sizeof buf - 1);
            close(fd[0]);
            int status = 0;
            waitpid(pid, &status, 0);
            if (WIFSIGNALED(status))
                fprintf(stderr, "bench_streams: signal %d\n", WTERMSIG(status));
            if (got <= 0 || !WIFEXITED(status) || WEXITSTATUS(status) ||
                sscanf(buf, "%lf %ld %ld %ld %ld", &ns[m], &warm[m], &mem[m], &syncs[m], &caps[m]) != 5) {
                fprintf(stderr, "bench_streams: the %s cell with %zu streams failed\n", m ? "expandable" : "classic", n);
                return 1;
            }
        }
        printf("| %zu | %.1f | %.1f | %.2f | %ld / %ld | %ld / %ld | %ld / %ld | %ld / %ld |\n", n, ns[0], ns[1],
               ns[1] / ns[0], warm[0], warm[1], mem[0], mem[1], syncs[0], syncs[1], caps[0], caps[1]);
    }
    return 0;
}
