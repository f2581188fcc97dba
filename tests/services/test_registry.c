/*
 * Registrations that stay valid (xseg_register_range, docs/registrations.md), through the public
 * API on cudaemu. A fake registrant stands for NCCL / an RDMA NIC: it "registers" a range by
 * taking the physical handle behind each of its granules (cuMemRetainAllocationHandle), its
 * before callback drops them, its after callback takes them again. A segment observer counts
 * every unmap that touches a range the registrant holds: a stale registration. Its checks: every
 * granule it holds is still mapped to the very handle it took, and the live bytes it wrote read
 * back.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>
#include "base/hostmem.h"
#include "tests/common/testutil.h"
#include "tests/services/fixture.h"
#include "xseg.h"

#define GRAN (2 * MiB) /* cudaemu's VMM granularity */
#define NREG 8

/* One registration of the fake registrant. */
struct fake {
    void *ptr;
    size_t size;
    bool in_use;     /* registered with xseg */
    bool held;       /* the registrant holds its pages (registered with the "NIC") */
    uint64_t handles[64]; /* per granule, while held */
    int fail_before; /* before returns this (0: releases) */
    unsigned befores, afters;
};

static struct fake regs[NREG];
static atomic_ulong stale;      /* unmaps of pages a registrant held */
static atomic_ulong unmaps_seen;

static size_t ngran(const struct fake *f) { return (f->size + GRAN - 1) / GRAN; }

/* The handle behind the granule at @p addr, 0 when unmapped. */
static uint64_t handle_at(uintptr_t addr)
{
    CUmemGenericAllocationHandle h = 0;
    if (drv->cuMemRetainAllocationHandle(&h, (void *)addr) != CUDA_SUCCESS)
        return 0;
    tu_assert_cu(drv->cuMemRelease(h));
    return (uint64_t)h;
}

static void take(struct fake *f)
{
    tu_ctx_set();
    for (size_t g = 0; g < ngran(f); g++) {
        f->handles[g] = handle_at((uintptr_t)f->ptr + g * GRAN);
        assert_true(f->handles[g] != 0);
    }
    f->held = true;
}

static int fake_before(const xseg_range_event *ev, void *ctx)
{
    struct fake *f = ctx;
    assert_ptr_equal(ev->ptr, f->ptr);
    assert_int_equal(ev->size, f->size);
    f->befores++;
    if (f->fail_before)
        return f->fail_before;
    f->held = false;
    return 0;
}

static int fake_after(const xseg_range_event *ev, void *ctx)
{
    struct fake *f = ctx;
    assert_ptr_equal(ev->ptr, f->ptr);
    f->afters++;
    take(f);
    return 0;
}

static const xseg_range_callbacks fake_cb = {fake_before, fake_after, 0};

/* The observer: an unmap of a page some registrant holds is a stale registration. */
static void watch(const xseg_segment_event *ev, void *user)
{
    (void)user;
    if (ev->kind != XSEG_SEGMENT_UNMAP)
        return;
    atomic_fetch_add(&unmaps_seen, 1);
    for (int i = 0; i < NREG; i++) {
        const struct fake *f = &regs[i];
        if (f->in_use && f->held && (uintptr_t)f->ptr < ev->address + ev->size &&
            ev->address < (uintptr_t)f->ptr + f->size)
            atomic_fetch_add(&stale, 1);
    }
}

static void reg(int i, void *p, size_t size)
{
    struct fake *f = &regs[i];
    *f = (struct fake){.ptr = p, .size = size, .in_use = true};
    assert_true(ngran(f) <= 64);
    take(f);
    if (xseg_register_range(p, size, &fake_cb, f) != XSEG_SUCCESS)
        fail_msg("xseg_register_range(%p, %zu): %s", p, size, xseg_last_error());
}

static void unreg(int i)
{
    struct fake *f = &regs[i];
    if (xseg_unregister_range(f->ptr, f->size, f) != XSEG_SUCCESS)
        fail_msg("xseg_unregister_range: %s", xseg_last_error());
    f->in_use = f->held = false;
}

/* Every held registration still sits on the handles it took. */
static void check_held(void)
{
    tu_ctx_set();
    for (int i = 0; i < NREG; i++) {
        const struct fake *f = &regs[i];
        if (!f->in_use || !f->held)
            continue;
        for (size_t g = 0; g < ngran(f); g++)
            if (handle_at((uintptr_t)f->ptr + g * GRAN) != f->handles[g])
                fail_msg("registration %d [%p, +%zu): granule %zu is no longer the memory it registered", i, f->ptr,
                         f->size, g);
    }
    assert_int_equal(atomic_load(&stale), 0);
}

static size_t free_now(void)
{
    size_t fr = 0, total = 0;
    tu_ctx_set();
    tu_assert_cu(drv->cuMemGetInfo(&fr, &total));
    return fr;
}

static xseg_registration_stats rstats(void)
{
    xseg_registration_stats st;
    assert_int_equal(xseg_registration_stats_get(0, &st), XSEG_SUCCESS);
    return st;
}

static void setup(const char *config)
{
    tu_xseg_init_or_skip(config);
    memset(regs, 0, sizeof regs);
    atomic_store(&stale, 0);
    assert_int_equal(xseg_attach_segment_observer(watch, NULL), XSEG_SUCCESS);
}

static void teardown(void)
{
    assert_int_equal(xseg_detach_segment_observer(watch, NULL), XSEG_SUCCESS);
}

/* Cycles of growth, trim, empty_cache and sleep/wake with live registrations: none goes stale,
 * the live bytes survive, and once unregistered and freed everything goes back to the driver
 * (cuMemGetInfo's free within one page of the start). XSEG_REGISTRY_CYCLES sets the count (the
 * goal's 1,000; a few dozen by default to keep the test cheap). */
static void test_registry_cycles(void **state)
{
    (void)state;
    setup("expandable_segments:True,expandable_segments_recycle:False");
    size_t start_free = free_now();
    const char *env = getenv("XSEG_REGISTRY_CYCLES");
    size_t cycles = env ? strtoul(env, NULL, 10) : tu_steps(40, 8);
    const xseg_pool_id pool = {0, 0};
    for (size_t c = 0; c < cycles; c++) {
        /* Growth: a live block registered whole (an NCCL user buffer), a registered block that is
         * freed but stays registered (NCCL's registration cache), a registered part of a block. */
        void *live = tu_malloc(6 * MiB + (c % 3) * MiB, NULL);
        void *gone = tu_malloc(40 * MiB, NULL);
        void *big = tu_malloc(24 * MiB, NULL);
        tu_assert_cu(tu_fill((CUdeviceptr)live, 6 * MiB, (uint32_t)c + 1));
        reg(0, live, 6 * MiB);
        reg(1, gone, 40 * MiB);
        reg(2, (char *)big + 4 * MiB, 8 * MiB);
        tu_free(gone);
        check_held();

        switch (c % 4) {
        case 0:
            assert_int_equal(xseg_trim(0, 0), XSEG_SUCCESS);
            break;
        case 1:
            assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
            break;
        case 2:
            if (xseg_sleep(0, pool, XSEG_SLEEP_OFFLOAD) != XSEG_SUCCESS)
                fail_msg("xseg_sleep: %s", xseg_last_error());
            assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
            for (int i = 0; i < 3; i++)
                assert_false(regs[i].held); /* each was asked, and released */
            if (xseg_wake(0, pool) != XSEG_SUCCESS)
                fail_msg("xseg_wake: %s", xseg_last_error());
            /* Every range is mapped again: each registrant registered the new pages. */
            for (int i = 0; i < 3; i++)
                assert_true(regs[i].held);
            break;
        default: /* a released range that growth maps again is registered again by the malloc */
            assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
            assert_false(regs[1].held);
            void *again = tu_malloc(40 * MiB, NULL);
            assert_true(regs[1].held || (uintptr_t)again != (uintptr_t)regs[1].ptr);
            tu_free(again);
            break;
        }
        check_held();
        assert_true(tu_check((CUdeviceptr)live, 6 * MiB, (uint32_t)c + 1));
        assert_true(regs[0].held); /* live bytes never move: never asked but by sleep */
        for (int i = 0; i < 3; i++)
            unreg(i);
        tu_free(live);
        tu_free(big);
    }
    xseg_registration_stats st = rstats();
    assert_int_equal(st.active + st.released, 0);
    assert_int_equal(st.failures, 0);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    struct cudaemu_live lv;
    if (tu_live(&lv))
        assert_int_equal(lv.handles, 0);
    size_t end_free = free_now();
    assert_true(end_free + GRAN >= start_free && end_free <= start_free + GRAN);
    teardown();
}

/* A malloc predicted long-lived (core/device/placement.h L1: frees lead the device's last mallocs
 * and frees, and the last blocks of its size are live) goes through the allocator's top path: it
 * takes the top end of what its growth maps. When that growth maps the pages of a released
 * registration again, the registrant is asked to register them again (REMAPPED) all the same. */
static void test_registry_top_malloc(void **state)
{
    (void)state;
    setup("expandable_segments:True,expandable_segments_recycle:True");
    enum { NSMALL = 40 };
    void *small[NSMALL];
    for (int i = 0; i < NSMALL; i++)
        small[i] = tu_malloc(512, NULL);
    /* G at the segment's start (a size of its own, so its free leaves K's key live), K1 and K2
     * after it: 40 MiB, two whole 20 MiB pages. */
    void *g = tu_malloc(24 * MiB, NULL), *k1 = tu_malloc(8 * MiB, NULL), *k2 = tu_malloc(8 * MiB, NULL);
    assert_true((uintptr_t)k1 > (uintptr_t)g);
    reg(0, g, 8 * MiB); /* freed but still registered (NCCL's registration cache) */
    tu_free(g);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS); /* G's whole page goes: released first */
    assert_int_equal(regs[0].befores, 1);
    assert_false(regs[0].held);
    check_held();
    /* the frees now lead the window (after the empty_cache, which starts it over) */
    for (int i = 0; i < NSMALL; i++)
        tu_free(small[i]);
    /* K3: no cached block holds 8 MiB; the growth maps G's first page again, K3 on its top end. */
    void *k3 = tu_malloc(8 * MiB, NULL);
    if ((uintptr_t)k3 == (uintptr_t)g)
        fail_msg("K3 was placed best fit at G's start: not the top path this test is about");
    assert_true((uintptr_t)k3 > (uintptr_t)g && (uintptr_t)k3 < (uintptr_t)k1);
    assert_int_equal(regs[0].afters, 1);
    assert_true(regs[0].held); /* registered again, on the pages mapped there now */
    check_held();
    xseg_registration_stats st = rstats();
    assert_int_equal(st.active, 1);
    assert_int_equal(st.released, 0);
    unreg(0);
    tu_free(k3);
    tu_free(k2);
    tu_free(k1);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    teardown();
}

/* A before callback that fails: the call reports it by range, the pages stay mapped (no unmap
 * reached the observer for them), nothing else is held back; sleep and shutdown are refused with
 * nothing changed; once the registrant releases, everything goes. */
static void test_registry_before_fails(void **state)
{
    (void)state;
    setup("expandable_segments:True,expandable_segments_recycle:False");
    void *a = tu_malloc(40 * MiB, NULL), *b = tu_malloc(40 * MiB, NULL);
    reg(0, a, 40 * MiB);
    regs[0].fail_before = -7;
    tu_free(a);
    tu_free(b);
    assert_int_equal(xseg_empty_cache(0), XSEG_ERROR_ILLEGAL_STATE);
    assert_non_null(strstr(xseg_last_error(), "returned -7"));
    assert_non_null(strstr(xseg_last_error(), "stay mapped"));
    check_held();
    /* b's pages went, a's stayed. */
    assert_int_equal(tu_stat("reserved_bytes.all.current"), (int64_t)(40 * MiB));
    xseg_registration_stats st = rstats();
    assert_int_equal(st.active, 1);
    assert_int_equal(st.failures, 1);
    assert_int_equal(st.kept_bytes, 40 * MiB);
    /* Nor do the reclaim paths that cannot call back take them (trim's pressure path, defrag). */
    assert_int_equal(xseg_trim(0, 0), XSEG_ERROR_ILLEGAL_STATE);
    check_held();

    const xseg_pool_id pool = {0, 0};
    assert_int_equal(xseg_sleep(0, pool, XSEG_SLEEP_OFFLOAD), XSEG_ERROR_ILLEGAL_STATE);
    assert_non_null(strstr(xseg_last_error(), "registration"));
    xseg_sleep_stats ss;
    assert_int_equal(xseg_get_sleep_stats(0, &pool, &ss), XSEG_SUCCESS);
    assert_int_equal(ss.asleep, 0);
    check_held();

    assert_int_equal(xseg_shutdown(), XSEG_ERROR_ILLEGAL_STATE);
    assert_non_null(strstr(xseg_last_error(), "xseg_shutdown"));
    check_held();

    regs[0].fail_before = 0;
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_false(regs[0].held);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    unreg(0);
    teardown();
}

/* A before callback that blocks past its timeout: the call returns with a clear error and the
 * pages stay mapped; once it does return 0 the next empty_cache takes them. Unregistering while
 * it still runs is fine. */
static pthread_mutex_t gate_m = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static bool gate_open;
static atomic_int blocked_returned;

static int blocking_before(const xseg_range_event *ev, void *ctx)
{
    (void)ev;
    struct fake *f = ctx;
    pthread_mutex_lock(&gate_m);
    while (!gate_open)
        pthread_cond_wait(&gate_cv, &gate_m);
    pthread_mutex_unlock(&gate_m);
    f->held = false;
    atomic_store(&blocked_returned, 1);
    return 0;
}

static void open_gate(void)
{
    pthread_mutex_lock(&gate_m);
    gate_open = true;
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_m);
}

static void wait_returned(void)
{
    for (int i = 0; i < 6000 && !atomic_load(&blocked_returned); i++) /* bounds a hang: 60 s */
        usleep(10000);
    assert_true(atomic_load(&blocked_returned));
}

static void test_registry_timeout(void **state)
{
    (void)state;
    setup("expandable_segments:True,expandable_segments_recycle:False");
    const xseg_range_callbacks cb = {blocking_before, NULL, 50};
    void *a = tu_malloc(40 * MiB, NULL);
    regs[0] = (struct fake){.ptr = a, .size = 40 * MiB, .in_use = true};
    take(&regs[0]);
    assert_int_equal(xseg_register_range(a, 40 * MiB, &cb, &regs[0]), XSEG_SUCCESS);
    tu_free(a);
    gate_open = false;
    atomic_store(&blocked_returned, 0);
    assert_int_equal(xseg_empty_cache(0), XSEG_ERROR_ILLEGAL_STATE);
    assert_non_null(strstr(xseg_last_error(), "did not return within 50 ms"));
    check_held();
    assert_int_equal(tu_stat("reserved_bytes.all.current"), (int64_t)(40 * MiB));
    /* Still running: a second call neither waits for it nor takes the pages. */
    assert_int_equal(xseg_empty_cache(0), XSEG_ERROR_ILLEGAL_STATE);
    assert_non_null(strstr(xseg_last_error(), "still run"));
    check_held();
    open_gate();
    wait_returned();
    for (int i = 0; i < 6000 && rstats().released != 1; i++)
        usleep(10000);
    assert_int_equal(rstats().released, 1);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    regs[0].in_use = false;
    assert_int_equal(xseg_unregister_range(a, 40 * MiB, &regs[0]), XSEG_SUCCESS);

    /* Unregistered while its callback still blocks: the record goes when it returns. */
    void *b = tu_malloc(40 * MiB, NULL);
    regs[1] = (struct fake){.ptr = b, .size = 40 * MiB, .in_use = true};
    take(&regs[1]);
    assert_int_equal(xseg_register_range(b, 40 * MiB, &cb, &regs[1]), XSEG_SUCCESS);
    tu_free(b);
    pthread_mutex_lock(&gate_m);
    gate_open = false;
    pthread_mutex_unlock(&gate_m);
    atomic_store(&blocked_returned, 0);
    assert_int_equal(xseg_trim(0, 0), XSEG_ERROR_ILLEGAL_STATE);
    regs[1].in_use = false;
    assert_int_equal(xseg_unregister_range(b, 40 * MiB, &regs[1]), XSEG_SUCCESS);
    assert_int_equal(rstats().active, 0);
    open_gate();
    wait_returned();
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    teardown();
}

/* A before callback that calls xseg: it allocates, frees, and unregisters its own range. */
static int reentrant_before(const xseg_range_event *ev, void *ctx)
{
    struct fake *f = ctx;
    void *p = NULL;
    if (xseg_malloc(&p, MiB, ev->device, NULL) != XSEG_SUCCESS || xseg_free(p) != XSEG_SUCCESS)
        return 1;
    /* Its own range is busy: not asked twice, reported as staying mapped, no deadlock. */
    if (xseg_empty_cache(ev->device) != XSEG_ERROR_ILLEGAL_STATE || !strstr(xseg_last_error(), "still run"))
        return 2;
    if (xseg_unregister_range(ev->ptr, ev->size, ctx) != XSEG_SUCCESS)
        return 3;
    f->held = false;
    f->in_use = false;
    f->befores++;
    return 0;
}

static void test_registry_reentrant(void **state)
{
    (void)state;
    setup("expandable_segments:True,expandable_segments_recycle:False");
    const xseg_range_callbacks cb = {reentrant_before, NULL, 0};
    void *a = tu_malloc(40 * MiB, NULL);
    regs[0] = (struct fake){.ptr = a, .size = 40 * MiB, .in_use = true};
    take(&regs[0]);
    assert_int_equal(xseg_register_range(a, 40 * MiB, &cb, &regs[0]), XSEG_SUCCESS);
    tu_free(a);
    if (xseg_empty_cache(0) != XSEG_SUCCESS)
        fail_msg("xseg_empty_cache: %s", xseg_last_error());
    assert_int_equal(regs[0].befores, 1);
    xseg_registration_stats st = rstats();
    assert_int_equal(st.active + st.released, 0);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    assert_int_equal(xseg_unregister_range(a, 40 * MiB, &regs[0]), XSEG_ERROR_INVALID_VALUE);
    teardown();
}

/* Misuse: each refused with the argument named, nothing registered. */
static void test_registry_errors(void **state)
{
    (void)state;
    setup("expandable_segments:True");
    void *a = tu_malloc(8 * MiB, NULL);
    assert_int_equal(xseg_register_range(NULL, 1, &fake_cb, NULL), XSEG_ERROR_INVALID_VALUE);
    assert_int_equal(xseg_register_range(a, 0, &fake_cb, NULL), XSEG_ERROR_INVALID_VALUE);
    assert_int_equal(xseg_register_range(a, MiB, NULL, NULL), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "callbacks"));
    int here;
    assert_int_equal(xseg_register_range(&here, 4, &fake_cb, NULL), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "xseg_register_range: ["));
    assert_non_null(strstr(xseg_last_error(), ", +4) is not inside one segment of xseg"));
    /* Past the mapped pages of its segment (VA reserved, nothing mapped there). */
    assert_int_equal(xseg_register_range((char *)a + 20 * MiB, MiB, &fake_cb, NULL), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "not all mapped"));
    assert_int_equal(xseg_register_range(a, MiB, &fake_cb, &here), XSEG_SUCCESS);
    assert_int_equal(xseg_register_range(a, MiB, &fake_cb, &here), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "already"));
    assert_int_equal(xseg_unregister_range(a, MiB, NULL), XSEG_ERROR_INVALID_VALUE);
    assert_int_equal(xseg_unregister_range(a, MiB, &here), XSEG_SUCCESS);
    assert_int_equal(xseg_registration_stats_get(0, NULL), XSEG_ERROR_INVALID_VALUE);
    tu_free(a);
    teardown();
    /* Classic segments: a range inside one holds the segment off release (its pages never move:
     * nothing to ask) until unregistered; one running past the segment's end is refused. */
    assert_int_equal(xseg_shutdown(), XSEG_SUCCESS);
    assert_int_equal(xseg_set_config("expandable_segments:False"), XSEG_SUCCESS);
    void *c = tu_malloc(MiB, NULL); /* a 2 MiB segment of the small pool */
    struct fake cf = {.ptr = c, .size = MiB};
    assert_int_equal(xseg_register_range((char *)c + MiB, 2 * MiB, &fake_cb, &cf), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "past the end of its classic"));
    assert_int_equal(xseg_register_range(c, MiB, &fake_cb, &cf), XSEG_SUCCESS);
    tu_free(c);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(xseg_trim(0, 0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), (int64_t)(2 * MiB));
    assert_int_equal(cf.befores, 0);
    assert_int_equal(xseg_unregister_range(c, MiB, &cf), XSEG_SUCCESS);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
}

/* Release paths that cannot call back leave a registration in force alone: here a malloc's
 * out-of-memory retry gives the other cached pages back, not the registered ones. */
static void test_registry_pinned(void **state)
{
    (void)state;
    setup("expandable_segments:True,expandable_segments_recycle:False");
    void *a = tu_malloc(40 * MiB, NULL), *b = tu_malloc(40 * MiB, NULL);
    reg(0, a, 40 * MiB);
    tu_free(a);
    tu_free(b);
    atomic_store(&unmaps_seen, 0);
    /* On another stream (a segment of its own), more than the device has free and less than
     * that plus b's 40 MiB: it fits once b's pages go back. */
    CUstream s2;
    tu_ctx_set();
    tu_assert_cu(drv->cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    size_t page = 20 * MiB, want = free_now() / page * page + page;
    void *big = tu_malloc(want, s2);
    check_held();
    assert_true(atomic_load(&unmaps_seen) > 0);
    tu_free(big);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    tu_assert_cu(drv->cuStreamDestroy(s2));
    assert_int_equal(xseg_trim(0, 0), XSEG_SUCCESS); /* a released by its registrant now */
    assert_false(regs[0].held);
    unreg(0);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    teardown();
}

/* One dma-buf for a block over three chunks (xseg_range_dmabuf), where the device exports them
 * (CUDAEMU_DMA_BUF=1: services_registry_dmabuf_on); else NOT_SUPPORTED naming the alternative. */
static void test_registry_dmabuf(void **state)
{
    (void)state;
    setup("expandable_segments:True,expandable_segments_recycle:False");
    void *a = tu_malloc(60 * MiB, NULL);
    int attr = 0, fd = -1;
    size_t off = 7;
    tu_ctx_set();
    tu_assert_cu(drv->cuDeviceGetAttribute(&attr, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, 0));
    xseg_status st = xseg_range_dmabuf(a, 60 * MiB, &fd, &off);
    if (!attr) {
        assert_int_equal(st, XSEG_ERROR_NOT_SUPPORTED);
        assert_non_null(strstr(xseg_last_error(), "xseg_block_handles"));
        assert_int_equal(fd, -1);
    } else {
        if (st != XSEG_SUCCESS)
            fail_msg("xseg_range_dmabuf: %s", xseg_last_error());
        struct stat sb;
        assert_int_equal(fstat(fd, &sb), 0);
        assert_int_equal((size_t)sb.st_size, 60 * MiB); /* one fd for all three chunks */
        assert_int_equal(off, 0);
        close(fd);
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        assert_int_equal(xseg_range_dmabuf((char *)a + 21 * MiB + 100, 4096, &fd, &off), XSEG_SUCCESS);
        assert_int_equal(off, 100);
        assert_int_equal(fstat(fd, &sb), 0);
        assert_int_equal((size_t)sb.st_size, ((100 + 4096 + page - 1) / page) * page);
        close(fd);
    }
    /* Misuse, either way. */
    assert_int_equal(xseg_range_dmabuf(a, 0, &fd, &off), XSEG_ERROR_INVALID_VALUE);
    assert_int_equal(xseg_range_dmabuf(a, MiB, NULL, &off), XSEG_ERROR_INVALID_VALUE);
    assert_int_equal(xseg_range_dmabuf((char *)a + 60 * MiB, MiB, &fd, &off), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "not"));
    int here;
    assert_int_equal(xseg_range_dmabuf(&here, 4, &fd, &off), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "xseg_range_dmabuf: ["));
    assert_non_null(strstr(xseg_last_error(), ", +4) is not inside one segment of xseg"));
    tu_free(a);
    teardown();
}

/* gpu_direct_rdma:True: where the device says VMM memory supports GPUDirect RDMA
 * (CUDAEMU_RDMA=1) allocations work; elsewhere they fail with the attribute named. */
static void test_registry_rdma(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:True,gpu_direct_rdma:True");
    int attr = 0;
    tu_ctx_set();
    tu_assert_cu(drv->cuDeviceGetAttribute(&attr, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, 0));
    void *p = NULL;
    xseg_status st = xseg_malloc(&p, 4 * MiB, 0, NULL);
    if (attr) {
        if (st != XSEG_SUCCESS)
            fail_msg("xseg_malloc: %s", xseg_last_error());
        tu_free(p);
    } else {
        assert_int_equal(st, XSEG_ERROR_NOT_SUPPORTED);
        assert_non_null(strstr(xseg_last_error(), "GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED"));
        assert_null(p);
        /* The default asks nothing of the device. */
        assert_int_equal(xseg_set_config("gpu_direct_rdma:False"), XSEG_SUCCESS);
        p = tu_malloc(4 * MiB, NULL);
        tu_free(p);
    }
}

/* cuPointerGetAttribute(IS_GPU_DIRECT_RDMA_CAPABLE) of an xseg allocation: 1 where the device says
 * VMM memory supports GPUDirect RDMA (CUDAEMU_RDMA=1), by default; 0 on a segment made with
 * expandable_segments_rdma:False, and 0 everywhere on a device without it. The key's misuse is
 * refused naming it. */
static void test_registry_rdma_attr(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:True");
    tu_ctx_set();
    int attr = 0;
    tu_assert_cu(drv->cuDeviceGetAttribute(&attr, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, 0));
    void *p = tu_malloc(24 * MiB, NULL);
    unsigned v = 7;
    tu_assert_cu(drv->cuPointerGetAttribute(&v, CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE,
                                            (CUdeviceptr)(uintptr_t)p + 21 * MiB));
    assert_int_equal(v, attr ? 1 : 0);
    tu_free(p);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    /* Off: the next segment's pages carry no flag, whatever the device says. */
    assert_int_equal(xseg_set_config("expandable_segments_rdma:False"), XSEG_SUCCESS);
    char cfg[1024];
    size_t len = 0;
    assert_int_equal(xseg_get_config(cfg, sizeof cfg, &len), XSEG_SUCCESS);
    assert_non_null(strstr(cfg, "expandable_segments_rdma:False"));
    p = tu_malloc(24 * MiB, NULL);
    v = 7;
    tu_assert_cu(drv->cuPointerGetAttribute(&v, CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE,
                                            (CUdeviceptr)(uintptr_t)p));
    assert_int_equal(v, 0);
    tu_free(p);
    /* Misuse: a value that is not a boolean, and off while required. Nothing changes. */
    assert_int_equal(xseg_set_config("expandable_segments_rdma:off"), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "expandable_segments_rdma"));
    assert_int_equal(xseg_set_config("gpu_direct_rdma:True"), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "expandable_segments_rdma:False"));
    assert_int_equal(xseg_set_config("expandable_segments_rdma:False,gpu_direct_rdma:True"), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "gpu_direct_rdma:True"));
    assert_int_equal(xseg_get_config(cfg, sizeof cfg, &len), XSEG_SUCCESS);
    assert_non_null(strstr(cfg, "expandable_segments_rdma:False"));
    assert_null(strstr(cfg, "gpu_direct_rdma:True"));
    /* Back on: the default leaves the canonical string. */
    assert_int_equal(xseg_set_config("expandable_segments_rdma:True"), XSEG_SUCCESS);
    assert_int_equal(xseg_get_config(cfg, sizeof cfg, &len), XSEG_SUCCESS);
    assert_null(strstr(cfg, "expandable_segments_rdma"));
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
}

/* xseg_registration_safe: safe by default (reclaim never touches a live page); each key that
 * re-backs live pages unasked makes it unsafe and is named; the reason is written as
 * xseg_get_config writes (truncated, full length); misuse is refused naming the argument. */
static void test_registry_safe(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:True");
    int safe = -1;
    char why[1024];
    size_t len = 0;
    assert_int_equal(xseg_registration_safe(&safe, why, sizeof why, &len), XSEG_SUCCESS);
    assert_int_equal(safe, 1);
    assert_int_equal(len, strlen(why));
    assert_non_null(strstr(why, "safe: "));
    assert_non_null(strstr(why, "xseg_sleep"));
    assert_null(strstr(why, "unsafe"));
    /* Reclaim settings leave it safe: they unmap only pages with no live byte. */
    assert_int_equal(xseg_set_config("release_threshold_mb:0,idle_release_ms:10,expandable_chunk_mb:2"),
                     XSEG_SUCCESS);
    assert_int_equal(xseg_registration_safe(&safe, why, sizeof why, NULL), XSEG_SUCCESS);
    assert_int_equal(safe, 1);
    assert_int_equal(xseg_set_config("expandable_segments_defrag:True"), XSEG_SUCCESS);
    assert_int_equal(xseg_registration_safe(&safe, why, sizeof why, &len), XSEG_SUCCESS);
    assert_int_equal(safe, 0);
    assert_non_null(strstr(why, "unsafe: expandable_segments_defrag:True"));
    assert_null(strstr(why, "spill_to_host"));
    assert_int_equal(xseg_set_config("spill_to_host:True"), XSEG_SUCCESS);
    assert_int_equal(xseg_registration_safe(&safe, why, sizeof why, &len), XSEG_SUCCESS);
    assert_int_equal(safe, 0);
    assert_non_null(strstr(why, "expandable_segments_defrag:True"));
    assert_non_null(strstr(why, "spill_to_host:True"));
    /* Truncated: what fits, NUL-terminated, and the full length; NULL with size 0 measures. */
    size_t full = len;
    char small[8];
    assert_int_equal(xseg_registration_safe(&safe, small, sizeof small, &len), XSEG_SUCCESS);
    assert_int_equal(len, full);
    assert_string_equal(small, "unsafe:");
    len = 0;
    assert_int_equal(xseg_registration_safe(&safe, NULL, 0, &len), XSEG_SUCCESS);
    assert_int_equal(len, full);
    assert_int_equal(xseg_set_config("expandable_segments_defrag:False"), XSEG_SUCCESS);
    assert_int_equal(xseg_registration_safe(&safe, why, sizeof why, NULL), XSEG_SUCCESS);
    assert_int_equal(safe, 0);
    assert_null(strstr(why, "expandable_segments_defrag"));
    assert_non_null(strstr(why, "spill_to_host:True"));
    assert_int_equal(xseg_set_config("spill_to_host:False"), XSEG_SUCCESS);
    assert_int_equal(xseg_registration_safe(&safe, why, sizeof why, NULL), XSEG_SUCCESS);
    assert_int_equal(safe, 1);
    /* Misuse. */
    assert_int_equal(xseg_registration_safe(NULL, why, sizeof why, NULL), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "safe is NULL"));
    assert_int_equal(xseg_registration_safe(&safe, NULL, 4, NULL), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "reason is NULL but size is 4"));
}

/* Every host allocation of a registration, a pass and a timed callback failing in turn: OUT_OF_MEMORY
 * with nothing registered, or the pass reported with the registrant's pages still mapped (never
 * stale); past the last, all works. */
static void test_registry_host_faults(void **state)
{
    (void)state;
    setup("expandable_segments:True,expandable_segments_recycle:False");
    const xseg_range_callbacks timed = {fake_before, fake_after, 60000};
    int ooms = 0;
    for (unsigned long n = 1;; n++) {
        void *a = tu_malloc(40 * MiB, NULL);
        struct fake *f = &regs[0];
        *f = (struct fake){.ptr = a, .size = 40 * MiB, .in_use = true};
        take(f);
        hostmem_fail_nth(n);
        xseg_status st = xseg_register_range(a, 40 * MiB, &timed, f);
        bool hit = hostmem_failed();
        if (st == XSEG_SUCCESS) {
            tu_free(a);
            st = xseg_empty_cache(0);
            hit = hostmem_failed();
        }
        hostmem_disarm();
        if (st == XSEG_ERROR_OUT_OF_MEMORY) {
            assert_true(hit);
            assert_non_null(strstr(xseg_last_error(), "out of host memory"));
            ooms++;
        } else {
            if (st != XSEG_SUCCESS)
                fail_msg("run %lu: %s", n, xseg_last_error());
        }
        check_held();
        xseg_registration_stats rs = rstats();
        if (rs.active + rs.released) {
            f->in_use = false;
            assert_int_equal(xseg_unregister_range(a, 40 * MiB, f), XSEG_SUCCESS);
        } else {
            tu_free(a); /* never registered: still live */
        }
        f->in_use = f->held = false;
        assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
        assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
        if (!hit)
            break;
    }
    assert_true(ooms >= 2); /* the entry; the pass's list */
    teardown();
}

int main(int argc, char **argv)
{
    /* The top path (L1, L2) places on devices of 10 GiB or more; a smaller one places by class (S1). */
    bool top = argc > 1 && strcmp(argv[1], "test_registry_top_malloc") == 0;
    setenv("CUDAEMU_TOTAL_MEM", top ? "16G" : "2G", 0);
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registry_cycles),   cmocka_unit_test(test_registry_before_fails),
        cmocka_unit_test(test_registry_timeout),  cmocka_unit_test(test_registry_reentrant),
        cmocka_unit_test(test_registry_errors),   cmocka_unit_test(test_registry_pinned),
        cmocka_unit_test(test_registry_dmabuf),   cmocka_unit_test(test_registry_rdma),
        cmocka_unit_test(test_registry_rdma_attr), cmocka_unit_test(test_registry_safe),
        cmocka_unit_test(test_registry_host_faults), cmocka_unit_test(test_registry_top_malloc),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
