/*
 * Many small blocks (issue 74 item 7): sleep + wake of N live blocks of one size, each its own run
 * (a freed block between two live ones), with the runs below sleep_copy_batch_kb in
 * cuMemcpyBatchAsync batches or one cuMemcpy*Async call each (sleep_copy_chunk_mb chunks).
 *   bench_sleep_batch BATCH_KB [REPS]      (benchmarks/sleep_batch_table.sh runs it both ways)
 * Sizes 4 KiB to 64 MiB, doubling. Prints one line per size: "size BYTES blocks N model_us M wall_us W calls C", where the model is
 * cudaemu's timeline (cudaemu_model_ns: CUDAEMU_LATENCY's costs), wall the host's clock, and calls
 * the driver calls that moved bytes (cuMemcpyDtoHAsync + cuMemcpyHtoDAsync + cuMemcpyBatchAsync),
 * all for one sleep and one wake, the median of REPS (default 5). On a GPU (no cudaemu): wall
 * alone (model_us 0, calls -1), as benchmarks/gpu/check_services.sh runs it. A first line says
 * whether the driver has cuMemcpyBatchAsync (without it both runs copy run by run).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "xseg.h"

static const xseg_pool_id DEFAULT_POOL = {0, 0};

static struct {
    unsigned long (*count)(const char *);
    uint64_t (*model)(void);
} emu;

static void die(const char *what)
{
    fprintf(stderr, "bench_sleep_batch: %s failed: %s\n", what, xseg_last_error());
    exit(1);
}

static unsigned long copy_calls(void)
{
    if (!emu.count)
        return 0;
    return emu.count("cuMemcpyDtoHAsync") + emu.count("cuMemcpyHtoDAsync") + emu.count("cuMemcpyBatchAsync");
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return fprintf(stderr, "usage: bench_sleep_batch BATCH_KB [REPS]\n"), 2;
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    if (reps < 1 || reps > 99)
        reps = 5;
    bench_find_driver("bench_sleep_batch");
    char config[128];
    snprintf(config, sizeof config, "sleep_copy_batch_kb:%s", argv[1]);
    if (xseg_init(config) != XSEG_SUCCESS)
        die("xseg_init");
    const char *path = getenv("XSEG_LIBCUDA");
    void *lib = dlopen(path && *path ? path : "libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (lib) {
        *(void **)&emu.count = dlsym(lib, "cudaemu_call_count");
        *(void **)&emu.model = dlsym(lib, "cudaemu_model_ns");
    }
    /* On a GPU: wall time alone (model_us 0, calls -1). */
    bool on_emu = emu.count && emu.model;
    void *sym = lib ? dlsym(lib, "cuMemcpyBatchAsync_v2") : NULL;
    printf("driver: %s\n", sym ? "cuMemcpyBatchAsync_v2 present (batch path)" : "no cuMemcpyBatchAsync_v2 (one call per run)");
    /* 4 KiB .. 64 MiB; N blocks of each, at most 256 MiB live (the host backup is real memory). */
    for (size_t size = 4096; size <= ((size_t)64 << 20); size *= 2) {
        size_t n = ((size_t)256 << 20) / size;
        if (n > 2000)
            n = 2000;
        void **v = calloc(2 * n, sizeof *v);
        if (!v)
            die("calloc");
        for (size_t i = 0; i < 2 * n; i++)
            if (xseg_malloc(&v[i], size, 0, NULL) != XSEG_SUCCESS)
                die("xseg_malloc");
        for (size_t i = 1; i < 2 * n; i += 2) /* every other block freed: n runs of one block */
            if (xseg_free(v[i]) != XSEG_SUCCESS)
                die("xseg_free");
        double model[99], wall[99], calls[99];
        for (int r = 0; r < reps; r++) {
            unsigned long c0 = copy_calls();
            uint64_t m0 = on_emu ? emu.model() : 0, w0 = now_ns();
            if (xseg_sleep(0, DEFAULT_POOL, XSEG_SLEEP_OFFLOAD) != XSEG_SUCCESS)
                die("xseg_sleep");
            if (xseg_wake(0, DEFAULT_POOL) != XSEG_SUCCESS)
                die("xseg_wake");
            wall[r] = (double)(now_ns() - w0) / 1e3;
            model[r] = on_emu ? (double)(emu.model() - m0) / 1e3 : 0;
            calls[r] = on_emu ? (double)(copy_calls() - c0) : -1;
        }
        printf("size %zu blocks %zu model_us %.0f wall_us %.0f calls %.0f\n", size, n, bench_median(model, reps),
               bench_median(wall, reps), bench_median(calls, reps));
        fflush(stdout);
        for (size_t i = 0; i < 2 * n; i += 2)
            if (xseg_free(v[i]) != XSEG_SUCCESS)
                die("xseg_free");
        free(v);
        if (xseg_empty_cache(0) != XSEG_SUCCESS)
            die("xseg_empty_cache");
    }
    return xseg_shutdown() == XSEG_SUCCESS ? 0 : 1;
}
