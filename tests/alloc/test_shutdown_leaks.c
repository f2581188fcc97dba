/*
 * xseg_shutdown frees every host allocation xseg made: the process object's sub-states, each
 * device's allocator (the struct, its pointer map, free index, event queues, slabs and arena)
 * and vmm's lists. The host-allocation seam (base/hostmem.h) counts live allocations from before
 * the first call; after init -> work -> shutdown it must read 0, twice over (the second cycle
 * initializes again from nothing). Under the sanitize setup (ASan, detect_leaks=1) LeakSanitizer
 * checks the same at exit for allocations outside the seam. Emulator only (cudaemu's live
 * counts say the driver got everything back too).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/hostmem.h"
#include "tests/common/testutil.h"
#include "xseg.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

#define OK(call)                                                                                  \
    do {                                                                                          \
        xseg_status st_ = (call);                                                                 \
        if (st_ != XSEG_SUCCESS)                                                                  \
            fail_msg("%s returned %s: %s", #call, xseg_status_name(st_), xseg_last_error());    \
    } while (0)

static void observer(const xseg_segment_event *ev, void *user)
{
    (void)ev;
    (void)user;
}

static void oom_observer(int device, size_t requested, size_t total, size_t free_bytes, void *user)
{
    (void)device;
    (void)requested;
    (void)total;
    (void)free_bytes;
    (void)user;
}

static int free_cb(int device, size_t requested, void *user)
{
    (void)device;
    (void)requested;
    (void)user;
    return 0;
}

/* A bit of everything that makes host state: both pools and kinds of segment, two streams, a
 * record_stream'ed free, a private pool, an IPC import, history with C stacks, observers,
 * callbacks, the idle thread, an OOM snapshot path, many live blocks (slabs, map growth), the
 * pinned host cache and its thread, a memory group. */
static void work(CUstream s1, CUstream s2)
{
    /* Ping-pong first: lazy hits leave this thread's slot pointer (fast_tls.slot) in the
     * device's state, which it still holds at the next round's first free, after a shutdown
     * (under ASan a freed state would be a use after free there). */
    for (int i = 0; i < 16; i++) {
        void *a = NULL;
        OK(xseg_malloc(&a, 4 * KiB, 0, s1));
        OK(xseg_free(a));
    }
    OK(xseg_set_config("expandable_segments:True,idle_release_ms:50,idle_release_thread:True"));
    OK(xseg_set_oom_snapshot("/nonexistent/xseg-shutdown-leaks.pickle"));
    OK(xseg_attach_segment_observer(observer, NULL));
    OK(xseg_attach_free_memory_callback(free_cb, NULL));
    OK(xseg_attach_oom_observer(oom_observer, NULL));
    xseg_history_options h = {.enabled = 1, .stacks = XSEG_STACKS_C};
    OK(xseg_record_memory_history(&h));
    enum { N = 600 }; /* past the first slabs and map growths, light under TSan */
    static void *p[N];
    for (int i = 0; i < N; i++)
        OK(xseg_malloc(&p[i], i % 7 == 0 ? 3 * MiB : 512 + (size_t)(i % 64) * 512, 0, i % 2 ? s2 : s1));
    for (int i = 0; i < N; i += 2)
        OK(xseg_free(p[i]));
    void *r = NULL;
    OK(xseg_malloc(&r, 2 * MiB, 0, s1));
    OK(xseg_record_stream(r, s2));
    OK(xseg_free(r));
    xseg_pool_id pool;
    OK(xseg_pool_create(&pool));
    OK(xseg_begin_allocate_to_pool(0, pool, NULL, NULL));
    void *q = NULL;
    OK(xseg_malloc(&q, 1 * MiB, 0, s2));
    OK(xseg_end_allocate_to_pool(0, pool));
    xseg_ipc_handle *handle = NULL;
    void *imported = NULL;
    OK(xseg_ipc_export(p[1], &handle));
    OK(xseg_ipc_import(handle, 0, &imported));
    xseg_ipc_handle_free(handle);
    OK(xseg_set_config("expandable_segments:False"));
    void *c = NULL;
    OK(xseg_malloc(&c, 5 * MiB, 0, s1)); /* a classic segment too */
    OK(xseg_empty_cache(0));
    /* The pinned host cache with its event thread: blocks of both classes, one freed while a
     * stream's event on it is pending (the shutdown waits for it). Freed before the shutdown: a
     * live host block would keep the cache (and its arrays) for the program. */
    OK(xseg_set_config("pinned_use_background_threads:True"));
    void *hb[3] = {NULL, NULL, NULL};
    OK(xseg_host_malloc(&hb[0], 4 * KiB));
    OK(xseg_host_malloc(&hb[1], 3 * MiB));
    OK(xseg_host_malloc(&hb[2], 100 * KiB));
    OK(xseg_host_record_stream(hb[1], 0, s2));
    for (int i = 0; i < 3; i++)
        OK(xseg_host_free(hb[i]));
    xseg_group_member m[4];
    size_t nm = 0;
    OK(xseg_group_stats(0, m, 4, &nm)); /* the device joined the group at its creation */
    if (nm != 1)
        fail_msg("the memory group lists %zu members, not this process alone", nm);
}

static void test_cycles(void **state)
{
    (void)state;
    CUstream s1 = NULL, s2 = NULL;
    for (int round = 0; round < 2; round++) {
        /* xseg_init: the first loads the driver (a static table); the device joins a group of
         * its own (the table in /dev/shm goes with the last member out: this process) */
        char config[64];
        snprintf(config, sizeof config, "memory_group:leaks%d", (int)getpid());
        tu_xseg_init_or_skip(config);
        if (round == 0) {
            tu_require_emulator_or_skip();
            tu_assert_cu(drv->cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
            tu_assert_cu(drv->cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
        }
        unsigned long retains = tu_call_count("cuDevicePrimaryCtxRetain"),
                      releases = tu_call_count("cuDevicePrimaryCtxRelease");
        work(s1, s2);
        if (hostmem_live() <= 0)
            fail_msg("round %d: the seam counted no live allocation during the work", round);
        OK(xseg_shutdown());
        /* The device is created again in the second round: its primary context stays retained
         * once for the process, not once more per round. */
        long kept = (long)(tu_call_count("cuDevicePrimaryCtxRetain") - retains) -
                    (long)(tu_call_count("cuDevicePrimaryCtxRelease") - releases);
        if (kept != (round == 0 ? 1 : 0))
            fail_msg("round %d: the device's creation kept %ld retains of the primary context", round, kept);
        long left = hostmem_live();
        if (left != 0)
            fail_msg("round %d: %ld host allocations of xseg left after xseg_shutdown", round, left);
        struct cudaemu_live live = {.size = sizeof live};
        assert_true(tu_live(&live));
        assert_int_equal(live.handles + live.mapped_bytes + live.reservations + live.allocs + live.events, 0);
    }
    tu_assert_cu(drv->cuStreamDestroy(s1));
    tu_assert_cu(drv->cuStreamDestroy(s2));
}

int main(void)
{
    /* Count from before xseg's first call. */
    hostmem_fail_nth(0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cycles),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
