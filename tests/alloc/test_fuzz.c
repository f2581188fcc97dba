/*
 * Data-integrity fuzzer (after PyTorch's test_allocator_fuzz): seeded random allocate / free /
 * empty_cache with each allocation filled with its own tag through the driver (tu_fill =
 * cuMemsetD8 plus probes); a block's content is verified (tu_check) before it is freed, and a
 * random other live block is spot-checked after every step. Whatever the allocator does with
 * its cache (split, merge, unmap pages, reuse), no live byte may change.
 *
 * Two regimes, both in expandable and classic mode:
 *  - roomy: sizes 2-20 MiB and small ones, under ~100 MiB live;
 *  - pressure (`test_fuzz test_fuzz_pressure_*`, own process): main() sets CUDAEMU_TOTAL_MEM=256M
 *    (unless already set) so far more is asked for than the device holds: allocations may fail
 *    with OUT_OF_MEMORY (that is fine), data may not be lost, the allocator must keep working.
 * XSEG_TEST_SEED=<n> replays a seed; seed and step are printed on failure.
 */
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/common/testutil.h"
#include "vmm/driver.h"
#include "xseg.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define MAX_LIVE 1024

struct blk {
    void *ptr;
    size_t size;
    uint32_t tag;
    int stream;
};

struct fuzz {
    uint64_t seed, rng;
    unsigned step;
    const char *mode;
    CUstream streams[2];
    struct blk live[MAX_LIVE];
    size_t nlive, live_bytes;
    uint32_t next_tag;
    unsigned ooms, frees, allocs, empties;
};

static uint64_t rnd(struct fuzz *f)
{
    f->rng ^= f->rng >> 12;
    f->rng ^= f->rng << 25;
    f->rng ^= f->rng >> 27;
    return f->rng * 2685821657736338717ull;
}

static uint64_t rnd_below(struct fuzz *f, uint64_t n) { return n ? rnd(f) % n : 0; }

#define fcheck(f, cond, ...)                                                                    \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            print_message("fuzz failure: %s seed %" PRIu64 " step %u\n", (f)->mode, (f)->seed,   \
                          (f)->step);                                                           \
            fail_msg(__VA_ARGS__);                                                              \
        }                                                                                       \
    } while (0)

static void verify(struct fuzz *f, const struct blk *b, const char *when)
{
    fcheck(f, tu_check((CUdeviceptr)(uintptr_t)b->ptr, b->size, b->tag),
           "%s: block %p (%zu bytes, tag %" PRIu32 ") lost its content", when, b->ptr, b->size, b->tag);
}

static size_t pick_size(struct fuzz *f, size_t max_large)
{
    /* PyTorch's fuzzer uses 2-20 MiB tensors; small sizes exercise the small pool too. */
    if (rnd_below(f, 4) == 0)
        return 1 + (size_t)rnd_below(f, MiB);
    return 2 * MiB + (size_t)rnd_below(f, max_large - 2 * MiB + 1);
}

static void do_alloc(struct fuzz *f, size_t live_cap, size_t max_large)
{
    if (f->nlive == MAX_LIVE)
        return;
    size_t size = pick_size(f, max_large);
    if (f->live_bytes + size > live_cap)
        return;
    int s = (int)rnd_below(f, 2);
    void *p = NULL;
    xseg_status st = xseg_malloc(&p, size, 0, (struct CUstream_st *)f->streams[s]);
    if (st == XSEG_ERROR_OUT_OF_MEMORY) {
        f->ooms++;
        return;
    }
    fcheck(f, st == XSEG_SUCCESS && p, "xseg_malloc(%zu): %s", size, xseg_last_error());
    struct blk b = {p, size, ++f->next_tag, s};
    /* The new block must not alias a live one. */
    for (size_t i = 0; i < f->nlive; i++) {
        uintptr_t a = (uintptr_t)f->live[i].ptr, e = a + f->live[i].size;
        fcheck(f, (uintptr_t)p + size <= a || (uintptr_t)p >= e,
               "new block %p+%zu overlaps live %p+%zu", p, size, f->live[i].ptr, f->live[i].size);
    }
    CUresult r = tu_fill((CUdeviceptr)(uintptr_t)p, size, b.tag);
    fcheck(f, r == CUDA_SUCCESS, "tu_fill(%p, %zu): %s", p, size, drv_error_name(r));
    f->live[f->nlive++] = b;
    f->live_bytes += size;
    f->allocs++;
}

static void do_free(struct fuzz *f)
{
    if (!f->nlive)
        return;
    size_t i = (size_t)rnd_below(f, f->nlive);
    struct blk b = f->live[i];
    verify(f, &b, "before free");
    fcheck(f, xseg_free(b.ptr) == XSEG_SUCCESS, "xseg_free(%p): %s", b.ptr, xseg_last_error());
    f->live[i] = f->live[--f->nlive];
    f->live_bytes -= b.size;
    f->frees++;
}

static void run(const char *mode, const char *config, uint64_t default_seed, size_t live_cap,
                size_t max_large, unsigned base_steps)
{
    if (!tu_gpu_available()) {
        print_message("[  SKIPPED ] no CUDA device: %s\n", tu_last_load_error());
        skip();
    }
    struct fuzz *f = calloc(1, sizeof *f);
    assert_non_null(f);
    const char *env = getenv("XSEG_TEST_SEED");
    f->seed = env ? strtoull(env, NULL, 0) : default_seed;
    f->rng = f->seed ? f->seed : 1;
    f->mode = mode;
    print_message("fuzz: %s seed %" PRIu64 "\n", mode, f->seed);
    assert_int_equal(xseg_init(config), XSEG_SUCCESS);
    assert_int_equal(xseg_set_config(config), XSEG_SUCCESS);
    f->streams[0] = NULL;
    tu_assert_cu(drv->cuStreamCreate(&f->streams[1], CU_STREAM_NON_BLOCKING));

    unsigned steps = (unsigned)tu_steps(base_steps, 300);
    for (f->step = 0; f->step < steps; f->step++) {
        /* PyTorch's weights: allocate 1, free 1, empty_cache 0.1. */
        uint64_t r = rnd_below(f, 21);
        if (r < 10)
            do_alloc(f, live_cap, max_large);
        else if (r < 20)
            do_free(f);
        else {
            fcheck(f, xseg_empty_cache(0) == XSEG_SUCCESS, "xseg_empty_cache: %s", xseg_last_error());
            f->empties++;
        }
        if (f->nlive)
            verify(f, &f->live[rnd_below(f, f->nlive)], "spot check");
    }
    for (size_t i = 0; i < f->nlive; i++)
        verify(f, &f->live[i], "final sweep");
    while (f->nlive)
        do_free(f);
    fcheck(f, xseg_empty_cache(0) == XSEG_SUCCESS, "xseg_empty_cache: %s", xseg_last_error());
    int64_t reserved = -1;
    fcheck(f, xseg_stat(0, "reserved_bytes.all.current", &reserved) == XSEG_SUCCESS, "xseg_stat");
    fcheck(f, reserved == 0, "%" PRId64 " bytes reserved after freeing everything and empty_cache",
           reserved);
    print_message("fuzz: %s: %u steps, %u allocs, %u frees, %u empty_cache, %u OOMs\n", mode, steps,
                  f->allocs, f->frees, f->empties, f->ooms);
    drv->cuStreamDestroy(f->streams[1]);
    free(f);
}

/* Roomy: PyTorch's regime (under 100 MiB live). */
static void test_fuzz_expandable(void **state)
{
    (void)state;
    run("expandable", "expandable_segments:True", 123, 100 * MiB, 20 * MiB, 1200);
}

static void test_fuzz_classic(void **state)
{
    (void)state;
    run("classic", "expandable_segments:False", 123, 100 * MiB, 20 * MiB, 1200);
}

static void test_fuzz_classic_max_split(void **state)
{
    (void)state;
    run("classic+max_split", "expandable_segments:False,max_split_size_mb:20", 7, 100 * MiB,
        40 * MiB, 800);
}

/* Pressure: far more asked than the device has (CUDAEMU_TOTAL_MEM=256M; on a real GPU the cap
 * keeps it roomy and the test degenerates to the regime above). */
static void test_fuzz_pressure_expandable(void **state)
{
    (void)state;
    run("pressure-expandable", "expandable_segments:True", 99, 400 * MiB, 48 * MiB, 800);
}

static void test_fuzz_pressure_classic(void **state)
{
    (void)state;
    run("pressure-classic", "expandable_segments:False", 98, 400 * MiB, 48 * MiB, 800);
}

/* `test_fuzz NAME` runs one test (each is its own meson test, so a failure in one cannot leave
 * blocks behind for the next); no argument runs them all on one device size. */
int main(int argc, char **argv)
{
    bool pressure = argc > 1 && strstr(argv[1], "pressure");
    /* Read by cudaemu at cuInit, ignored by a real driver. */
    setenv("CUDAEMU_TOTAL_MEM", pressure ? "256M" : "8G", 0);
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fuzz_expandable),
        cmocka_unit_test(test_fuzz_classic),
        cmocka_unit_test(test_fuzz_classic_max_split),
        cmocka_unit_test(test_fuzz_pressure_expandable),
        cmocka_unit_test(test_fuzz_pressure_classic),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
