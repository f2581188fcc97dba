/*
 * bench_capture_reuse: what graph_capture_record_stream_reuse costs during a capture, and what
 * it saves, on captures of thousands of nodes.
 *
 * One "layer" of the captured program, repeated until the graph has about N nodes: the side
 * stream forks from the capture stream, a 1 MiB buffer allocated on the capture stream is used
 * on the side stream (record_stream + WORK kernels there), the side stream joins back, the buffer
 * is freed, and a small allocation follows on the capture stream (where the option looks for
 * reusable blocks), then one kernel on the capture stream. Kernels are cudaemu_stream_work on
 * the emulator (kernel nodes) and empty nodes on a real driver (same ordering).
 *
 * For each N it prints (median of --reps captures each): the capture's CPU time per allocation
 * (everything the program does while capturing: xseg, the driver's capture calls) with the
 * option off, on, and on with the side stream joining back only at the end of the capture (the
 * option's worst case: it marks and walks but can reuse nothing, so memory grows as with it off),
 * the ratios to off, the graph's nodes, how many node dependency lists the reuse walks read
 * (cuGraphNodeGetDependencies calls: at most one per node, as the walks are memoized, and fewer
 * as they stop once nothing is left to find; a walk from scratch at every allocation would read
 * about nodes x allocations / 4), and peak reserved memory.
 *
 * The configurations take turns within each repetition. --config runs one of them only (the
 * others print 0), for benchmarks/callgrind_capture_reuse.sh.
 *
 *   bench_capture_reuse [--reps R] [--nodes N[,N...]] [--work W] [--config off|on|unjoined]
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "vmm/driver.h"
#include "xseg.h"

#ifndef BENCH_CUDAEMU
#define BENCH_CUDAEMU ""
#endif

static int (*emu_work)(CUstream);
static unsigned long (*emu_count)(const char *);

/* Thread CPU time: the capture runs on this thread only (cudaemu makes no threads), and CPU time
 * does not count the time the shared machine gives to others. */
static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static void die(const char *what, const char *why)
{
    fprintf(stderr, "bench_capture_reuse: %s: %s\n", what, why);
    exit(1);
}

static void cu(CUresult r, const char *what)
{
    if (r != CUDA_SUCCESS)
        die(what, drv_error_name(r));
}

static void xs(xseg_status st, const char *what)
{
    if (st != XSEG_SUCCESS)
        die(what, xseg_last_error());
}

static void work(CUstream s)
{
    if (emu_work) {
        if (emu_work(s))
            die("cudaemu_stream_work", "refused");
        return;
    }
    CUstreamCaptureStatus st;
    CUgraph g = NULL;
    const CUgraphNode *deps = NULL;
    size_t n = 0;
    cu(drv->cuStreamGetCaptureInfo(s, &st, NULL, &g, &deps, NULL, &n), "cuStreamGetCaptureInfo");
    CUgraphNode node;
    cu(drv->cuGraphAddEmptyNode(&node, g, deps, n), "cuGraphAddEmptyNode");
    cu(drv->cuStreamUpdateCaptureDependencies(s, &node, NULL, 1, CU_STREAM_SET_CAPTURE_DEPENDENCIES),
       "cuStreamUpdateCaptureDependencies");
}

static void wait_stream(CUstream b, CUstream a, CUevent e)
{
    cu(drv->cuEventRecord(e, a), "cuEventRecord");
    cu(drv->cuStreamWaitEvent(b, e, 0), "cuStreamWaitEvent");
}

/* The measured part: @p layers layers of the captured program (callgrind_capture_reuse.sh
 * counts this function's instructions). Not inlined, so that callgrind can name it. */
__attribute__((noinline)) static void capture_layers(size_t layers, bool join, int nwork, CUstream s, CUstream side,
                                                     CUevent e)
{
    for (size_t i = 0; i < layers; i++) {
        wait_stream(side, s, e);
        void *x = NULL, *t = NULL;
        xs(xseg_malloc(&x, 1 << 20, 0, s), "xseg_malloc");
        xs(xseg_record_stream(x, side), "xseg_record_stream");
        for (int w = 0; w < nwork; w++)
            work(side);
        if (join)
            wait_stream(s, side, e);
        xs(xseg_free(x), "xseg_free");
        xs(xseg_malloc(&t, 512, 0, s), "xseg_malloc");
        xs(xseg_free(t), "xseg_free");
        work(s);
    }
}

struct result {
    double ns_per_alloc;
    size_t nodes;
    unsigned long dep_reads;
    int64_t peak_reserved;
};

/* @p join: the side stream joins back before each free (reusable); else only at the end (the
 * option's worst case: markers and walks, no reuse). */
static struct result one_capture(bool reuse, bool join, size_t target_nodes, int nwork, CUstream s, CUstream side,
                                 CUevent e)
{
    xs(xseg_set_config(reuse ? "graph_capture_record_stream_reuse:True" : "graph_capture_record_stream_reuse:False"),
       "xseg_set_config");
    xs(xseg_reset_peak_stats(0), "xseg_reset_peak_stats");
    unsigned long reads0 = emu_count ? emu_count("cuGraphNodeGetDependencies") : 0;
    xseg_pool_id pool = {0, 0};
    xs(xseg_capture_begin(0, s, &pool, CU_STREAM_CAPTURE_MODE_GLOBAL), "xseg_capture_begin");
    size_t layers = target_nodes / (size_t)(nwork + 2) + 1, allocs = 2 * layers;
    double t0 = now_ns();
    capture_layers(layers, join, nwork, s, side, e);
    double t1 = now_ns();
    if (!join)
        wait_stream(s, side, e); /* a capture cannot end with a stream unjoined */
    struct result r = {.ns_per_alloc = (t1 - t0) / (double)allocs};
    CUgraph g = NULL;
    xs(xseg_capture_end(0, s, &g), "xseg_capture_end");
    cu(drv->cuGraphGetNodes(g, NULL, &r.nodes), "cuGraphGetNodes");
    r.dep_reads = emu_count ? emu_count("cuGraphNodeGetDependencies") - reads0 : 0;
    xseg_device_stats ds;
    xs(xseg_get_stats(0, &ds), "xseg_get_stats");
    r.peak_reserved = ds.reserved_bytes[XSEG_STAT_ALL].peak;
    cu(drv->cuGraphDestroy(g), "cuGraphDestroy");
    void *flush = NULL; /* lets the deferred frees of the capture complete */
    xs(xseg_malloc(&flush, 512, 0, s), "xseg_malloc");
    xs(xseg_free(flush), "xseg_free");
    xs(xseg_release_pool(0, pool), "xseg_release_pool");
    xs(xseg_empty_cache(0), "xseg_empty_cache");
    return r;
}

static int cmp_res(const void *a, const void *b)
{
    double x = ((const struct result *)a)->ns_per_alloc, y = ((const struct result *)b)->ns_per_alloc;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int reps = 5, nwork = 4, only = -1;
    size_t nodes[8] = {1000, 4000, 16000};
    int nn = 3;
    static const char *const config_names[3] = {"off", "on", "unjoined"};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--work") && i + 1 < argc) {
            nwork = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--nodes") && i + 1 < argc) {
            nn = 0;
            for (char *tok = strtok(argv[++i], ","); tok && nn < 8; tok = strtok(NULL, ","))
                nodes[nn++] = (size_t)strtoull(tok, NULL, 10);
        } else if (!strcmp(argv[i], "--config") && i + 1 < argc) {
            i++;
            for (int c = 0; c < 3; c++)
                if (!strcmp(argv[i], config_names[c]))
                    only = c;
            if (only < 0)
                die("--config", "off, on or unjoined");
        } else {
            fprintf(stderr, "usage: bench_capture_reuse [--reps R] [--nodes N[,N...]] [--work W] "
                            "[--config off|on|unjoined]\n");
            return 2;
        }
    }
    if (reps < 1 || nwork < 0 || nn < 1)
        die("arguments", "--reps >= 1, --work >= 0, --nodes N[,N...]");
    if (!getenv("XSEG_LIBCUDA")) {
        void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
        if (h)
            dlclose(h);
        else if (BENCH_CUDAEMU[0] && access(BENCH_CUDAEMU, R_OK) == 0)
            setenv("XSEG_LIBCUDA", BENCH_CUDAEMU, 1);
    }
    xs(xseg_init("expandable_segments:False"), "xseg_init");
    const char *lib = getenv("XSEG_LIBCUDA");
    void *h = dlopen(lib && *lib ? lib : "libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (h) {
        *(void **)&emu_work = dlsym(h, "cudaemu_stream_work");
        *(void **)&emu_count = dlsym(h, "cudaemu_call_count");
        dlclose(h);
    }
    struct drv_device_info info;
    xs(drv_device_query(0, &info), "drv_device_query");
    xs(drv_ctx_ensure(info.primary_ctx), "drv_ctx_ensure");
    CUstream s, side;
    CUevent e;
    cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    cu(drv->cuStreamCreate(&side, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    cu(drv->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate");

    printf("# bench_capture_reuse on %s (%s), %d kernel(s) on the side stream per layer, median of %d\n",
           info.name, emu_work ? "cudaemu" : "real driver", nwork, reps);
    printf("%7s %6s %9s %9s %11s %7s %7s %9s %10s %11s %9s %9s\n", "nodes", "allocs", "off ns", "on ns",
           "unjoined ns", "on/off", "unj/off", "dep reads", "reads/node", "scratch est", "off MiB", "on MiB");
    struct result *v = calloc(3 * (size_t)reps, sizeof *v);
    if (!v)
        die("calloc", "out of memory");
    for (int k = 0; k < nn; k++) {
        /* The configurations take turns within each repetition, so that a change in the machine's
         * load during the run weighs on all of them alike. */
        struct result med[3] = {{0}};
        for (int r = 0; r < reps; r++)
            for (int c = 0; c < 3; c++)
                if (only < 0 || only == c)
                    v[c * reps + r] = one_capture(c >= 1, c != 2, nodes[k], nwork, s, side, e);
        for (int c = 0; c < 3; c++) {
            if (only >= 0 && only != c)
                continue;
            qsort(v + c * reps, (size_t)reps, sizeof *v, cmp_res);
            med[c] = v[c * reps + reps / 2];
        }
        const struct result *m = &med[only < 0 ? 1 : only];
        size_t allocs = 2 * (nodes[k] / (size_t)(nwork + 2) + 1);
        printf("%7zu %6zu %9.0f %9.0f %11.0f %7.2f %7.2f %9lu %10.2f %11.0f %9.0f %9.0f\n", m->nodes, allocs,
               med[0].ns_per_alloc, med[1].ns_per_alloc, med[2].ns_per_alloc,
               med[0].ns_per_alloc > 0 ? med[1].ns_per_alloc / med[0].ns_per_alloc : 0.0,
               med[0].ns_per_alloc > 0 ? med[2].ns_per_alloc / med[0].ns_per_alloc : 0.0, med[1].dep_reads,
               med[1].nodes ? (double)med[1].dep_reads / (double)med[1].nodes : 0.0,
               (double)m->nodes * (double)allocs / 4, (double)med[0].peak_reserved / (1 << 20),
               (double)med[1].peak_reserved / (1 << 20));
    }
    free(v);
    cu(drv->cuEventDestroy(e), "cuEventDestroy");
    cu(drv->cuStreamDestroy(side), "cuStreamDestroy");
    cu(drv->cuStreamDestroy(s), "cuStreamDestroy");
    return 0;
}
