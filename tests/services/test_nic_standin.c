/*
 * A stand-in NIC over a KV tensor (issue 76 item 5), through the public API on cudaemu.
 *
 * The NIC registers the tensor's range as NIXL does: one dma-buf of the range (xseg_range_dmabuf,
 * which enters the range in xseg's ledger by itself; no xseg_register_range, no callback), and
 * it pins what it registered: the physical handle behind every granule (cuMemRetainAllocationHandle,
 * kept retained as a NIC's pin holds the pages) and its own mapping of those physical chunks at
 * other addresses (what its DMA engine reaches). Meanwhile a workload runs every action xseg has
 * (churn of other blocks, empty_cache, trim, idle release, the release threshold, defragmentation
 * and spill out of memory with the tensor itself declared cold, sleep and wake of another pool, a
 * sleep of the tensor's pool, which must be refused) for 10^4 steps (XSEG_TEST_SCALE /
 * XSEG_TEST_STEPS scale it). The program writes the tensor at its addresses; the NIC reads its own
 * mapping: every read sees the tensor's current bytes, and the handle behind every granule never
 * changes. On 531c8c7 the sleep of the tensor's pool is not refused and spill moves the declared-
 * cold tensor: the test fails at once.
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
#include "tests/common/testutil.h"
#include "tests/services/fixture.h"
#include "xseg.h"

#define GRAN (2 * MiB) /* cudaemu's VMM granularity */
#define KV_SIZE (40 * MiB)
#define NGRAN (KV_SIZE / GRAN)
#define MAXCHUNK 16
#define NCHURN 8

static const xseg_pool_id POOL0 = {0, 0};

/* The NIC's registration: the handle per granule, its own mapping of each chunk. */
struct nic {
    CUmemGenericAllocationHandle gran[NGRAN]; /* retained */
    struct {
        uintptr_t va;    /* the chunk in xseg's address space */
        size_t size;
        CUmemGenericAllocationHandle h;
        CUdeviceptr mine; /* the NIC's own mapping of it */
    } chunk[MAXCHUNK];
    int nchunks;
    int fd;
};

static CUmemGenericAllocationHandle handle_at(uintptr_t addr)
{
    CUmemGenericAllocationHandle h = 0;
    if (drv->cuMemRetainAllocationHandle(&h, (void *)addr) != CUDA_SUCCESS)
        return 0;
    tu_assert_cu(drv->cuMemRelease(h));
    return h;
}

static void nic_register(struct nic *n, uintptr_t kv)
{
    memset(n, 0, sizeof *n);
    size_t off = 0;
    xseg_status st = xseg_range_dmabuf((void *)kv, KV_SIZE, &n->fd, &off);
    if (st == XSEG_ERROR_NOT_SUPPORTED)
        skip(); /* run with CUDAEMU_DMA_BUF=1 (meson does), or on a driver that exports dma-bufs */
    if (st != XSEG_SUCCESS)
        fail_msg("xseg_range_dmabuf: %s", xseg_last_error());
    for (size_t i = 0; i < NGRAN; i++)
        tu_assert_cu(drv->cuMemRetainAllocationHandle(&n->gran[i], (void *)(kv + i * GRAN)));
    /* The chunks under the range: the handle's granules, found on either side. */
    for (size_t i = 0; i < NGRAN; i++) {
        bool known = false;
        for (int c = 0; c < n->nchunks; c++)
            known |= n->chunk[c].h == n->gran[i];
        if (known)
            continue;
        assert_true(n->nchunks < MAXCHUNK);
        uintptr_t lo = kv + i * GRAN, hi = lo + GRAN;
        while (handle_at(lo - GRAN) == n->gran[i])
            lo -= GRAN;
        while (handle_at(hi) == n->gran[i])
            hi += GRAN;
        int c = n->nchunks++;
        n->chunk[c].va = lo;
        n->chunk[c].size = hi - lo;
        n->chunk[c].h = n->gran[i];
        tu_assert_cu(drv->cuMemAddressReserve(&n->chunk[c].mine, hi - lo, 0, 0, 0));
        tu_assert_cu(drv->cuMemMap(n->chunk[c].mine, hi - lo, 0, n->gran[i], 0));
        CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        tu_assert_cu(drv->cuMemSetAccess(n->chunk[c].mine, hi - lo, &acc, 1));
    }
}

/* The NIC's DMA read of the tensor's bytes [kv + off, + len), through its own mapping. */
static void nic_read(const struct nic *n, uintptr_t kv, size_t off, void *buf, size_t len)
{
    uintptr_t a = kv + off;
    for (int c = 0; c < n->nchunks; c++)
        if (a >= n->chunk[c].va && a + len <= n->chunk[c].va + n->chunk[c].size) {
            tu_assert_cu(drv->cuMemcpyDtoH(buf, n->chunk[c].mine + (a - n->chunk[c].va), len));
            return;
        }
    fail_msg("the NIC registered no chunk holding [%#lx, +%zu)", (unsigned long)a, len);
}

static void nic_check_handles(const struct nic *n, uintptr_t kv)
{
    for (size_t i = 0; i < NGRAN; i++)
        if (handle_at(kv + i * GRAN) != n->gran[i])
            fail_msg("granule %zu of the registered tensor is backed by other physical memory now", i);
}

static void nic_deregister(struct nic *n)
{
    for (int c = 0; c < n->nchunks; c++) {
        tu_assert_cu(drv->cuMemUnmap(n->chunk[c].mine, n->chunk[c].size));
        tu_assert_cu(drv->cuMemAddressFree(n->chunk[c].mine, n->chunk[c].size));
    }
    for (size_t i = 0; i < NGRAN; i++)
        tu_assert_cu(drv->cuMemRelease(n->gran[i]));
    close(n->fd);
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void *try_malloc(size_t size)
{
    void *p = NULL;
    xseg_status st = xseg_malloc(&p, size, 0, NULL);
    if (st != XSEG_SUCCESS && st != XSEG_ERROR_OUT_OF_MEMORY)
        fail_msg("xseg_malloc(%zu): %s", size, xseg_last_error());
    return st == XSEG_SUCCESS ? p : NULL;
}

static void test_nic_standin(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:True,expandable_segments_recycle:False,spill_to_host:True,"
                         "expandable_segments_defrag:True,expandable_chunk_mb:20,idle_release_ms:1,release_threshold_mb:64");
    tu_ctx_set();
    uintptr_t kv = (uintptr_t)tu_malloc(KV_SIZE, NULL);
    tu_assert_cu(tu_fill((CUdeviceptr)kv, KV_SIZE, 11));
    struct nic n;
    nic_register(&n, kv);
    xseg_registration_stats rs;
    assert_int_equal(xseg_registration_stats_get(0, &rs), XSEG_SUCCESS);
    assert_int_equal(rs.active, 1); /* the dma-buf's own entry */
    /* The program declares the tensor cold: spill would move it out of memory, but for the NIC. */
    assert_int_equal(xseg_spill_hint((void *)kv, XSEG_SPILL_COLD), XSEG_SUCCESS);
    assert_int_equal(xseg_spill_hint((void *)kv, XSEG_SPILL_NONE), XSEG_SUCCESS);
    assert_int_equal(xseg_spill_hint((void *)kv, XSEG_SPILL_COLD), XSEG_SUCCESS);

    /* Another pool that sleeps and wakes. */
    xseg_pool_id other;
    assert_int_equal(xseg_pool_create(&other), XSEG_SUCCESS);
    assert_int_equal(xseg_begin_allocate_to_pool(0, other, NULL, NULL), XSEG_SUCCESS);
    void *op = tu_malloc(24 * MiB, NULL);
    assert_int_equal(xseg_end_allocate_to_pool(0, other), XSEG_SUCCESS);
    tu_assert_cu(tu_fill((CUdeviceptr)op, 24 * MiB, 5));

    void *churn[NCHURN] = {0};
    size_t steps = tu_steps(10000, 400);
    uint8_t word[4096], seen[4096];
    unsigned refused = 0, oom = 0, cold_declared = 0;
    int64_t spilled_max = 0; /* spill ran (other blocks moved) */
    for (size_t s = 0; s < steps; s++) {
        /* The program writes part of the tensor (the KV cache filling); the NIC reads it. */
        size_t off = (next() % (KV_SIZE / 4096)) * 4096;
        uint8_t v = (uint8_t)(s + 1); /* differs from the step before */
        tu_assert_cu(drv->cuMemsetD8((CUdeviceptr)(kv + off), v, sizeof word));
        memset(word, v, sizeof word);
        nic_read(&n, kv, off, seen, sizeof seen);
        if (memcmp(word, seen, sizeof seen) != 0)
            fail_msg("step %zu: the NIC read stale bytes at +%zu (wrote %#x, read %#x)", s, off, v, (unsigned)seen[0] & 0xff);
        /* An action. */
        switch (s % 10) {
        case 0: case 5: { /* churn: grow and shrink the cache around the tensor, now and then past the device */
            int i = (int)(next() % NCHURN);
            if (churn[i]) {
                tu_free(churn[i]);
                churn[i] = NULL;
            } else {
                size_t sz = (1 + next() % 30) * MiB + (next() % 4096);
                if (next() % 16 == 0)
                    sz = 160 * MiB; /* out of memory: defragmentation and spill get their turn */
                churn[i] = try_malloc(sz);
                oom += !churn[i];
                int64_t sp = tu_stat("spilled_bytes.all.current");
                spilled_max = sp > spilled_max ? sp : spilled_max;
                if (churn[i] && next() % 4 == 0) { /* declare some cold: spill moves those */
                    assert_int_equal(xseg_spill_hint(churn[i], XSEG_SPILL_COLD), XSEG_SUCCESS);
                    cold_declared++;
                }
            }
            break;
        }
        case 1:
            assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
            break;
        case 2:
            assert_int_equal(xseg_trim(0, (next() % 3) * 8 * MiB), XSEG_SUCCESS);
            break;
        case 3: { /* idle release: a malloc's tick after the cache sat idle */
            if (s % 100 == 3)
                usleep(1500);
            void *p = try_malloc(3 * MiB);
            if (p)
                tu_free(p);
            break;
        }
        case 4: /* the release threshold: a miss above 64 MiB of cache trims */
            for (int k = 0; k < 2; k++) {
                void *p = try_malloc((size_t)(20 + k * 30) * MiB);
                if (p)
                    tu_free(p);
            }
            break;
        case 6:
            if (s % 50 == 6) { /* sleep and wake of the other pool */
                assert_int_equal(xseg_sleep(0, other, XSEG_SLEEP_OFFLOAD), XSEG_SUCCESS);
                assert_int_equal(xseg_wake(0, other), XSEG_SUCCESS);
            }
            break;
        case 7:
            if (s % 100 == 7) { /* the tensor's own pool: the NIC cannot be asked, so no */
                xseg_status st = xseg_sleep(0, POOL0, XSEG_SLEEP_OFFLOAD);
                if (st != XSEG_ERROR_ILLEGAL_STATE)
                    fail_msg("step %zu: a sleep of the registered tensor's pool returned %d, not refused", s, st);
                refused++;
            }
            break;
        default:
            break;
        }
        if (s % 25 == 0 || s + 1 == steps)
            nic_check_handles(&n, kv);
    }
    assert_true(tu_check((CUdeviceptr)op, 24 * MiB, 5));
    print_message("%zu steps, %u sleeps refused, %u mallocs out of memory, %u blocks declared cold, at most %lld "
                  "bytes spilled\n", steps, refused, oom, cold_declared, (long long)spilled_max);
    for (int i = 0; i < NCHURN; i++)
        if (churn[i])
            tu_free(churn[i]);
    nic_deregister(&n);
    /* Closed: the pool sleeps again (the entry goes at that call) and the tensor comes back. */
    assert_int_equal(xseg_spill_hint((void *)kv, XSEG_SPILL_NONE), XSEG_SUCCESS);
    assert_int_equal(xseg_sleep(0, POOL0, XSEG_SLEEP_OFFLOAD), XSEG_SUCCESS);
    assert_int_equal(xseg_wake(0, POOL0), XSEG_SUCCESS);
    assert_int_equal(xseg_registration_stats_get(0, &rs), XSEG_SUCCESS);
    assert_int_equal(rs.active, 0);
    tu_free((void *)kv);
    tu_free(op);
    assert_int_equal(xseg_release_pool(0, other), XSEG_SUCCESS);
}

static const struct tu_named_test all_tests[] = {
    TU_NAMED(test_nic_standin),
};

int main(int argc, char **argv)
{
    setenv("CUDAEMU_TOTAL_MEM", "320M", 0);
    return tu_run_named("nic_standin", all_tests, sizeof all_tests / sizeof all_tests[0], argc, argv);
}
