/* vmm/kernel: the allocator's range fill and compare kernels through vkern_*: fills and checks at
 * any alignment, a changed byte found at its offset, the refusal of the module remembered, every
 * injected driver failure rolled back with nothing leaked, the fork child forgetting the module.
 * Runs on cudaemu and on a real GPU (emulator-only checks skip themselves).
 *   test_kernel [no-kernels]: no-kernels runs only the refusal case (CUDAEMU_KERNELS=0). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/error.h"
#include "tests/common/testutil.h"
#include "vmm/driver.h"
#include "vmm/kernel.h"

#define MIB ((size_t)1 << 20)
#define AREA (8 * MIB)

static CUdeviceptr area;   /* AREA bytes of cuMemAlloc memory every test uses */

static void zero_area(void) { tu_assert_cu(drv->cuMemsetD8(area, 0, AREA)); }

static void poke(CUdeviceptr p, unsigned char v) { tu_assert_cu(drv->cuMemsetD8(p, v, 1)); }

static unsigned char peek(CUdeviceptr p)
{
    unsigned char v = 0;
    tu_assert_cu(drv->cuMemcpyDtoH(&v, p, 1));
    return v;
}

static void ok(xseg_status st, const char *what)
{
    if (st != XSEG_SUCCESS)
        fail_msg("%s failed: %s", what, err_message());
}

/* Ranges at odd alignments, of lengths 0, 1, 7, 4 KiB + 3 and several MiB, apart from each other. */
static const struct {
    size_t off, len;
} shapes[] = {
    {1, 0}, {3, 1}, {17, 7}, {4096 + 5, 4096 + 3}, {3 * 4096 + 6, 64}, {MIB + 3, 3 * MIB + 5}, {5 * MIB, 8}, {6 * MIB + 7, 1},
};
#define NSHAPES (sizeof shapes / sizeof shapes[0])

static void shape_ranges(struct vkern_range *r)
{
    for (size_t i = 0; i < NSHAPES; i++)
        r[i] = (struct vkern_range){area + shapes[i].off, shapes[i].len};
}

static void check_expect(const struct vkern_range *r, size_t n, unsigned char v, const size_t *want)
{
    size_t *first = calloc(n, sizeof *first);
    assert_non_null(first);
    ok(vkern_check(r, n, v, NULL, first), "vkern_check");
    for (size_t i = 0; i < n; i++)
        if (first[i] != (want ? want[i] : r[i].len))
            fail_msg("range %zu (%#llx, %zu bytes): first differing byte %zu, expected %zu", i,
                     (unsigned long long)r[i].addr, r[i].len, first[i], want ? want[i] : r[i].len);
    free(first);
}

static void test_fill_check_shapes(void **state)
{
    (void)state;
    ok(vkern_ready(), "vkern_ready");
    zero_area();
    struct vkern_range r[NSHAPES];
    shape_ranges(r);
    ok(vkern_fill(r, NSHAPES, 0xa5, NULL), "vkern_fill");
    tu_assert_cu(drv->cuStreamSynchronize(NULL));
    check_expect(r, NSHAPES, 0xa5, NULL);
    /* Every byte filled, the bytes around each range untouched. */
    for (size_t i = 0; i < NSHAPES; i++) {
        if (!r[i].len)
            continue;
        assert_int_equal(peek(r[i].addr), 0xa5);
        assert_int_equal(peek(r[i].addr + r[i].len - 1), 0xa5);
        assert_int_equal(peek(r[i].addr - 1), 0);
        assert_int_equal(peek(r[i].addr + r[i].len), 0);
    }
    /* Against another value, every non-empty range differs at 0. */
    size_t want[NSHAPES];
    for (size_t i = 0; i < NSHAPES; i++)
        want[i] = 0;
    check_expect(r, NSHAPES, 0x5a, want);
    /* One changed byte each in three ranges: head, middle word, tail. */
    for (size_t i = 0; i < NSHAPES; i++)
        want[i] = r[i].len;
    want[3] = 2; /* inside the unaligned head */
    want[5] = 2 * MIB + 1;
    want[6] = 7; /* the last byte */
    poke(r[3].addr + want[3], 0);
    poke(r[5].addr + want[5], 0xff);
    poke(r[5].addr + want[5] + 4096, 0xff); /* a later change: the first one is reported */
    poke(r[6].addr + want[6], 1);
    check_expect(r, NSHAPES, 0xa5, want);
    /* Filled again: the earlier answers do not come back (each check is a generation of its own). */
    ok(vkern_fill(r, NSHAPES, 0xa5, NULL), "vkern_fill");
    check_expect(r, NSHAPES, 0xa5, NULL);
    /* A later byte alone: found, though an earlier check saw a smaller offset there. */
    want[5] = 3 * MIB;
    poke(r[5].addr + want[5], 0);
    for (size_t i = 0; i < NSHAPES; i++)
        if (i != 5)
            want[i] = r[i].len;
    check_expect(r, NSHAPES, 0xa5, want);
}

/* VKERN_MAX_RANGES + 5 ranges: two launches per call, one wait per check. */
static void test_many_ranges(void **state)
{
    (void)state;
    enum { N = VKERN_MAX_RANGES + 5 };
    struct vkern_range r[N];
    for (size_t i = 0; i < N; i++)
        r[i] = (struct vkern_range){area + i * 4099 + (i % 8), 1000 + i};
    zero_area();
    tu_counts_reset();
    ok(vkern_fill(r, N, 0x3c, NULL), "vkern_fill");
    check_expect(r, N, 0x3c, NULL);
    if (tu_emulated()) {
        assert_int_equal(tu_call_count("cuLaunchKernel"), 4);
        assert_int_equal(tu_call_count("cuStreamSynchronize"), 1);
    }
    size_t want[N];
    for (size_t i = 0; i < N; i++)
        want[i] = r[i].len;
    want[N - 1] = 999; /* in the second launch */
    poke(r[N - 1].addr + 999, 0);
    want[0] = 0;
    poke(r[0].addr, 1);
    check_expect(r, N, 0x3c, want);
    ok(vkern_check(r, 0, 0, NULL, NULL), "vkern_check of no range");
}

/* A range over unmapped memory: cudaemu refuses the launch with the driver's illegal address and
 * writes nothing (a GPU faults at the next wait and loses the context: emulator-only). */
static void test_unmapped_range(void **state)
{
    (void)state;
    tu_require_emulator_or_skip();
    size_t G = 0;
    CUmemAllocationProp p = {0};
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    tu_assert_cu(drv->cuMemGetAllocationGranularity(&G, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle h = 0;
    tu_assert_cu(drv->cuMemAddressReserve(&va, 2 * G, 0, 0, 0));
    tu_assert_cu(drv->cuMemCreate(&h, G, &p, 0));
    tu_assert_cu(drv->cuMemMap(va, G, 0, h, 0));
    CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    tu_assert_cu(drv->cuMemSetAccess(va, G, &d, 1));
    tu_assert_cu(drv->cuMemsetD8(va, 7, G));
    struct vkern_range r[2] = {{va, 16}, {va + G - 8, 16}};
    assert_int_equal(vkern_fill(r, 2, 0, NULL), XSEG_ERROR_DRIVER);
    assert_non_null(strstr(err_message(), "CUDA_ERROR_ILLEGAL_ADDRESS"));
    assert_non_null(strstr(err_message(), "xseg_fill_ranges"));
    assert_int_equal(peek(va), 7); /* nothing ran */
    size_t first[2];
    assert_int_equal(vkern_check(r, 2, 7, NULL, first), XSEG_ERROR_DRIVER);
    assert_non_null(strstr(err_message(), "CUDA_ERROR_ILLEGAL_ADDRESS"));
    /* The mapped part alone is fine; then unmap and ask again. */
    r[1].len = 8;
    check_expect(r, 2, 7, NULL);
    tu_assert_cu(drv->cuMemUnmap(va, G));
    assert_int_equal(vkern_fill(r, 1, 0, NULL), XSEG_ERROR_DRIVER);
    tu_assert_cu(drv->cuMemRelease(h));
    tu_assert_cu(drv->cuMemAddressFree(va, 2 * G));
}

/* Stream order, as cudaemu's async memset: on a held stream the launch is pending work whose
 * ranges cannot be unmapped until it completes; in a capture it is a kernel node and runs nothing
 * now (a GPU runs it at replay). */
static void test_stream_order(void **state)
{
    (void)state;
    tu_require_emulator_or_skip();
    size_t G = 0;
    CUmemAllocationProp p = {0};
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    tu_assert_cu(drv->cuMemGetAllocationGranularity(&G, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle h = 0;
    tu_assert_cu(drv->cuMemAddressReserve(&va, G, 0, 0, 0));
    tu_assert_cu(drv->cuMemCreate(&h, G, &p, 0));
    tu_assert_cu(drv->cuMemMap(va, G, 0, h, 0));
    CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    tu_assert_cu(drv->cuMemSetAccess(va, G, &d, 1));
    tu_assert_cu(drv->cuMemsetD8(va, 0, G));
    CUstream s;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    struct vkern_range r = {va + 100, 5000};
    assert_true(tu_stream_hold(s));
    ok(vkern_fill(&r, 1, 0x77, s), "vkern_fill on a held stream");
    tu_assert_cu_eq(drv->cuStreamQuery(s), CUDA_ERROR_NOT_READY);
    tu_assert_cu_eq(drv->cuMemUnmap(va, G), CUDA_ERROR_ILLEGAL_STATE);
    assert_true(tu_stream_release(s));
    tu_assert_cu(drv->cuStreamSynchronize(s));
    assert_int_equal(peek(va + 100), 0x77);
    /* Captured: a kernel node, nothing written now. */
    tu_assert_cu(drv->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
    ok(vkern_fill(&r, 1, 0x11, s), "vkern_fill in a capture");
    CUgraph g = NULL;
    tu_assert_cu(drv->cuStreamEndCapture(s, &g));
    size_t nn = 0;
    tu_assert_cu(drv->cuGraphGetNodes(g, NULL, &nn));
    assert_int_equal(nn, 1);
    CUgraphNode node;
    CUgraphNodeType type;
    tu_assert_cu(drv->cuGraphGetNodes(g, &node, &nn));
    tu_assert_cu(drv->cuGraphNodeGetType(node, &type));
    assert_int_equal(type, CU_GRAPH_NODE_TYPE_KERNEL);
    assert_int_equal(peek(va + 100), 0x77);
    tu_assert_cu(drv->cuGraphDestroy(g));
    tu_assert_cu(drv->cuStreamDestroy(s));
    tu_assert_cu(drv->cuMemUnmap(va, G));
    tu_assert_cu(drv->cuMemRelease(h));
    tu_assert_cu(drv->cuMemAddressFree(va, G));
}

/* The driver's refusal of the module is remembered (no second load); release forgets it. */
static void test_refusal_remembered(void **state)
{
    (void)state;
    tu_require_emulator_or_skip();
    vkern_release(tu_ctx());
    unsigned long fired = tu_fail_fired();
    assert_true(tu_fail("cuModuleLoadData", 1, CUDA_ERROR_INVALID_PTX));
    tu_counts_reset();
    assert_int_equal(vkern_ready(), XSEG_ERROR_NOT_SUPPORTED);
    tu_assert_fired(fired, "cuModuleLoadData refused");
    assert_non_null(strstr(err_message(), "CUDA_ERROR_INVALID_PTX"));
    struct vkern_range r = {area, 64};
    size_t first;
    assert_int_equal(vkern_fill(&r, 1, 1, NULL), XSEG_ERROR_NOT_SUPPORTED);
    assert_int_equal(vkern_check(&r, 1, 1, NULL, &first), XSEG_ERROR_NOT_SUPPORTED);
    assert_non_null(strstr(err_message(), "CUDA_ERROR_INVALID_PTX"));
    assert_int_equal(tu_call_count("cuModuleLoadData"), 1);
    assert_int_equal(tu_call_count("cuLaunchKernel"), 0);
    /* A function the module lacks: refused as well, the module unloaded. */
    vkern_release(tu_ctx());
    struct cudaemu_live before, after;
    assert_true(tu_live(&before));
    fired = tu_fail_fired();
    assert_true(tu_fail("cuModuleGetFunction", 2, CUDA_ERROR_NOT_FOUND));
    assert_int_equal(vkern_ready(), XSEG_ERROR_NOT_SUPPORTED);
    tu_assert_fired(fired, "cuModuleGetFunction refused");
    assert_non_null(strstr(err_message(), "xseg_check_ranges"));
    assert_true(tu_live(&after));
    assert_int_equal(after.modules, before.modules);
    vkern_release(tu_ctx());
    ok(vkern_ready(), "vkern_ready after release");
}

/* CUDAEMU_KERNELS=0 (the no-kernels run): NOT_SUPPORTED with the driver's words, once. */
static void test_no_kernels(void **state)
{
    (void)state;
    tu_require_emulator_or_skip();
    tu_counts_reset();
    assert_int_equal(vkern_ready(), XSEG_ERROR_NOT_SUPPORTED);
    assert_non_null(strstr(err_message(), "CUDA_ERROR_NOT_SUPPORTED"));
    assert_non_null(strstr(err_message(), "cuModuleLoadData"));
    struct vkern_range r = {area, 64};
    assert_int_equal(vkern_fill(&r, 1, 1, NULL), XSEG_ERROR_NOT_SUPPORTED);
    assert_int_equal(tu_call_count("cuModuleLoadData"), 1);
    struct cudaemu_live l;
    assert_true(tu_live(&l));
    assert_int_equal(l.modules, 0);
}

/* ---- fault sweep: each driver call of a load, a fill and a check fails once ---- */

enum sweep_op { OP_READY, OP_FILL, OP_CHECK };
static const struct {
    enum sweep_op op;
    const char *entry;
    unsigned long nth;
    CUresult res;
    xseg_status expect;
} sweep[] = {
    {OP_READY, "cuCtxGetCurrent", 1, CUDA_ERROR_INVALID_CONTEXT, XSEG_ERROR_DRIVER},
    {OP_READY, "cuModuleLoadData", 1, CUDA_ERROR_OUT_OF_MEMORY, XSEG_ERROR_OUT_OF_MEMORY},
    {OP_READY, "cuModuleGetFunction", 1, CUDA_ERROR_OUT_OF_MEMORY, XSEG_ERROR_OUT_OF_MEMORY},
    {OP_READY, "cuModuleGetFunction", 2, CUDA_ERROR_OUT_OF_MEMORY, XSEG_ERROR_OUT_OF_MEMORY},
    {OP_READY, "cuMemAlloc", 1, CUDA_ERROR_OUT_OF_MEMORY, XSEG_ERROR_OUT_OF_MEMORY},
    {OP_READY, "cuMemHostAlloc", 1, CUDA_ERROR_OUT_OF_MEMORY, XSEG_ERROR_OUT_OF_MEMORY},
    {OP_FILL, "cuLaunchKernel", 1, CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, XSEG_ERROR_DRIVER},
    {OP_FILL, "cuLaunchKernel", 2, CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, XSEG_ERROR_DRIVER},
    {OP_CHECK, "cuMemAlloc", 1, CUDA_ERROR_OUT_OF_MEMORY, XSEG_ERROR_OUT_OF_MEMORY},     /* growth */
    {OP_CHECK, "cuMemHostAlloc", 1, CUDA_ERROR_OUT_OF_MEMORY, XSEG_ERROR_OUT_OF_MEMORY}, /* growth */
    {OP_READY, "cuMemsetD8", 1, CUDA_ERROR_INVALID_VALUE, XSEG_ERROR_DRIVER},
    {OP_CHECK, "cuMemsetD8", 1, CUDA_ERROR_INVALID_VALUE, XSEG_ERROR_DRIVER}, /* growth */
    {OP_CHECK, "cuLaunchKernel", 1, CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, XSEG_ERROR_DRIVER},
    {OP_CHECK, "cuLaunchKernel", 3, CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, XSEG_ERROR_DRIVER},
    {OP_CHECK, "cuMemcpyDtoHAsync", 1, CUDA_ERROR_INVALID_VALUE, XSEG_ERROR_DRIVER},
    {OP_CHECK, "cuStreamSynchronize", 1, CUDA_ERROR_LAUNCH_FAILED, XSEG_ERROR_DRIVER},
};

static void test_fault_sweep(void **state)
{
    (void)state;
    tu_require_emulator_or_skip();
    /* 300 ranges: three launches a call, and more result words than a first load makes. */
    enum { N = 300 };
    struct vkern_range *r = calloc(N, sizeof *r);
    size_t *first = calloc(N, sizeof *first);
    assert_non_null(r);
    assert_non_null(first);
    for (size_t i = 0; i < N; i++)
        r[i] = (struct vkern_range){area + i * 9001 + (i % 5), 4000 + i};
    zero_area();
    vkern_release(tu_ctx());
    struct cudaemu_live base, now;
    assert_true(tu_live(&base));
    size_t host_base = tu_host_live(NULL);
    for (size_t c = 0; c < sizeof sweep / sizeof sweep[0]; c++) {
        vkern_release(tu_ctx());
        if (sweep[c].op == OP_CHECK) /* loaded, so the sweep strikes the check's own calls */
            ok(vkern_ready(), "vkern_ready");
        unsigned long fired = tu_fail_fired();
        assert_true(tu_fail(sweep[c].entry, sweep[c].nth, sweep[c].res));
        xseg_status st = sweep[c].op == OP_READY ? vkern_ready()
                         : sweep[c].op == OP_FILL ? vkern_fill(r, N, 0x11, NULL)
                                                  : vkern_check(r, N, 0x11, NULL, first);
        tu_fail_clear();
        tu_assert_fired(fired, "case %zu (%s #%lu)", c, sweep[c].entry, sweep[c].nth);
        if (st != sweep[c].expect)
            fail_msg("case %zu (%s #%lu): status %d, expected %d: %s", c, sweep[c].entry, sweep[c].nth, st,
                     sweep[c].expect, err_message());
        if (!strstr(err_message(), sweep[c].entry))
            fail_msg("case %zu: the message does not name %s: %s", c, sweep[c].entry, err_message());
        /* Still usable: the same work succeeds now. */
        ok(vkern_fill(r, N, 0x11, NULL), "vkern_fill after a failure");
        check_expect(r, N, 0x11, NULL);
        /* Nothing leaked: release gives back all it made. */
        vkern_release(tu_ctx());
        assert_true(tu_live(&now));
        assert_int_equal(now.modules, base.modules);
        assert_int_equal(now.allocs, base.allocs);
        assert_int_equal(now.used_bytes[0], base.used_bytes[0]);
        assert_int_equal(tu_host_live(NULL), host_base);
        zero_area();
    }
    free(r);
    free(first);
}

/* A fork child forgets the parent's module: it never unloads what belongs to the parent. */
static int child_forgets(void *arg)
{
    (void)arg;
    unsigned long unloads = tu_call_count("cuModuleUnload");
    vkern_release(tu_ctx());
    if (tu_call_count("cuModuleUnload") != unloads)
        return 2;
    return vkern_ready() == XSEG_SUCCESS ? 3 : 0;
}

static void test_fork_child_forgets(void **state)
{
    (void)state;
    tu_require_emulator_or_skip();
    ok(vkern_ready(), "vkern_ready");
    int detail = 0;
    enum tu_child_outcome o = tu_run_child(child_forgets, NULL, &detail);
    if (o != TU_CHILD_OK)
        fail_msg("the fork child: outcome %d, detail %d", (int)o, detail);
    ok(vkern_ready(), "vkern_ready in the parent after the fork");
}

static int setup(void **state)
{
    (void)state;
    tu_ctx_set();
    return 0;
}

int main(int argc, char **argv)
{
    tu_exit_skip_without_gpu();
    tu_ctx_set();
    if (drv->cuMemAlloc(&area, AREA) != CUDA_SUCCESS) {
        fprintf(stderr, "cannot allocate %zu bytes of device memory\n", AREA);
        return 1;
    }
    if (argc > 1 && !strcmp(argv[1], "no-kernels")) {
        const struct CMUnitTest tests[] = {cmocka_unit_test_setup(test_no_kernels, setup)};
        return cmocka_run_group_tests_name("vmm-kernel-refused", tests, NULL, NULL);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_fill_check_shapes, setup),
        cmocka_unit_test_setup(test_many_ranges, setup),
        cmocka_unit_test_setup(test_unmapped_range, setup),
        cmocka_unit_test_setup(test_stream_order, setup),
        cmocka_unit_test_setup(test_refusal_remembered, setup),
        cmocka_unit_test_setup(test_fault_sweep, setup),
        cmocka_unit_test_setup(test_fork_child_forgets, setup),
    };
    return cmocka_run_group_tests_name("vmm-kernel", tests, NULL, NULL);
}
