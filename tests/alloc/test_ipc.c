/*
 * IPC of expandable blocks between real processes, segment observers, block handles
 * and peer access, through the public API.
 *
 * Two-process tests: the parent initializes xseg and allocates; the child is this binary
 * re-executed (fork + exec, so it starts with a fresh driver, as CUDA requires) with one end of
 * a socketpair, initializes xseg itself and imports what the parent sends. The two synchronize
 * with single bytes on the same socket. A child reports a failed check on stderr and exits with
 * its line number (1..255 range folded), so the parent's assertion names the failing child.
 *
 * argv[1] selects the group: "main" (one device), "fabric" (CUDAEMU_FABRIC=1), "peer" (two
 * devices); "--child ROLE FD" is the child.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/common/testutil.h"
#include "xseg.h"

#define MiB ((size_t)1 << 20)
#define CONFIG "expandable_segments:True"

static char self_path[4096];

static CUdeviceptr dp(const void *p) { return (CUdeviceptr)(uintptr_t)p; }

static bool live_eq(const struct cudaemu_live *a, const struct cudaemu_live *b)
{
    return a->handles == b->handles && a->mapped_bytes == b->mapped_bytes && a->reservations == b->reservations;
}

/* ---- processes ---- */

struct child {
    pid_t pid;
    int sock;
};

static struct child spawn(const char *role)
{
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(sv[0]);
        char fd[16];
        snprintf(fd, sizeof fd, "%d", sv[1]);
        execl(self_path, self_path, "--child", role, fd, (char *)NULL);
        _exit(127);
    }
    close(sv[1]);
    return (struct child){pid, sv[0]};
}

static void reap(struct child *c)
{
    close(c->sock);
    int st = 0;
    while (waitpid(c->pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("child failed: %s %d (see its message above)", WIFEXITED(st) ? "exit status" : "signal",
                 WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
}

static bool put(int s, char c) { return write(s, &c, 1) == 1; }
static char get(int s)
{
    char c = 0;
    return read(s, &c, 1) == 1 ? c : 0;
}

/* ---- the child's side ---- */

static const char *child_role = "";
#define CHECK(cond)                                                                               \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            fprintf(stderr, "child %s: line %d: %s failed (last error: %s)\n", child_role,        \
                    __LINE__, #cond, xseg_last_error());                                          \
            return 1 + __LINE__ % 250;                                                            \
        }                                                                                         \
    } while (0)
#define OK(call) CHECK((call) == XSEG_SUCCESS)

/* Import what the parent sent, check the reservation is the pages, check tag 11, write tag 12;
 * import a second time (another address, the same memory); close both; nothing left behind. The
 * baseline of descriptors is taken after a first import and close: the first import makes the
 * device's context, and the driver opens descriptors of its own for it, which it keeps (a GPU
 * does; cudaemu holds one). */
static int child_roundtrip(int s)
{
    xseg_ipc_handle *h = NULL;
    OK(xseg_ipc_recv(s, &h));
    xseg_ipc_info info;
    OK(xseg_ipc_handle_info(h, &info));
    CHECK(info.type == XSEG_IPC_POSIX_FD && info.nchunks >= 2);
    void *q = NULL, *q2 = NULL;
    OK(xseg_ipc_import(h, 0, &q));
    OK(xseg_ipc_close(q));
    int fds0 = tu_count_fds(); /* with the handle's descriptors, closed by xseg_ipc_handle_free */
    struct cudaemu_live l0, l1, l2;
    bool emu = tu_live(&l0);
    OK(xseg_ipc_import(h, 0, &q));
    if (emu) {
        /* The receiver's address space is the block's chunks, not a multiple of device memory. */
        tu_live(&l1);
        CHECK(l1.reservations == l0.reservations + 1);
        CHECK(l1.reserved_bytes == l0.reserved_bytes + info.span);
        CHECK(l1.mapped_bytes == l0.mapped_bytes + info.span);
    }
    CHECK(tu_check(dp(q), info.size, 11));
    CHECK(tu_fill(dp(q), info.size, 12) == CUDA_SUCCESS);
    OK(xseg_ipc_import(h, 0, &q2)); /* importing twice: two mappings of the same pages */
    CHECK(q2 != q);
    CHECK(tu_check(dp(q2), info.size, 12));
    OK(xseg_ipc_close(q2));
    CHECK(tu_check(dp(q), info.size, 12));
    CHECK(xseg_free(q) == XSEG_ERROR_INVALID_VALUE); /* not an allocation of this process */
    CHECK(put(s, 'A'));
    CHECK(get(s) == 'B');
    OK(xseg_ipc_close(q));
    CHECK(xseg_ipc_close(q) == XSEG_ERROR_INVALID_VALUE);
    xseg_ipc_handle_free(h);
    if (emu) {
        tu_live(&l2);
        CHECK(live_eq(&l0, &l2));
    }
    CHECK(tu_count_fds() == fds0 - (int)info.nchunks);
    return 0;
}

/* Import, then hold the mapping while the exporter frees the block, unmaps its pages and
 * closes its descriptors: the memory lives on here until the close. */
static int child_hold(int s)
{
    xseg_ipc_handle *h = NULL;
    OK(xseg_ipc_recv(s, &h));
    xseg_ipc_info info;
    OK(xseg_ipc_handle_info(h, &info));
    void *q = NULL;
    OK(xseg_ipc_import(h, 0, &q));
    xseg_ipc_handle_free(h); /* the mapping alone holds the pages from here */
    CHECK(tu_check(dp(q), info.size, 21));
    CHECK(put(s, 'A'));
    CHECK(get(s) == 'B'); /* the exporter freed, emptied its cache, closed its handle */
    CHECK(tu_check(dp(q), info.size, 21));
    CHECK(tu_fill(dp(q), info.size, 22) == CUDA_SUCCESS);
    CHECK(tu_check(dp(q), info.size, 22));
    OK(xseg_ipc_close(q));
    CHECK(put(s, 'C'));
    return 0;
}

/* Two blocks: one at an offset inside its first page (the bytes before it belong to another
 * block and are visible too: pages are shared whole), one of the small pool. */
static int child_layout(int s)
{
    xseg_ipc_handle *hb = NULL, *hs = NULL;
    OK(xseg_ipc_recv(s, &hb));
    OK(xseg_ipc_recv(s, &hs));
    xseg_ipc_info ib, is;
    OK(xseg_ipc_handle_info(hb, &ib));
    OK(xseg_ipc_handle_info(hs, &is));
    void *b = NULL, *sm = NULL;
    OK(xseg_ipc_import(hb, 0, &b));
    OK(xseg_ipc_import(hs, 0, &sm));
    CHECK(tu_check(dp(b), ib.size, 32));
    CHECK(tu_check(dp(sm), 4096, 33));
    CHECK(ib.offset == 12 * MiB);
    CHECK(tu_check(dp(b) - ib.offset, ib.offset, 31)); /* the neighbour sharing the first page */
    OK(xseg_ipc_close(b));
    OK(xseg_ipc_close(sm));
    xseg_ipc_handle_free(hb);
    xseg_ipc_handle_free(hs);
    CHECK(put(s, 'A'));
    return 0;
}

static bool msg_has(const char *needle) { return strstr(xseg_last_error(), needle) != NULL; }

/* Every driver call of import fails once, at every position: a clear error naming the call,
 * nothing reserved, mapped, imported or opened afterwards; then close's calls. The context calls
 * (drv_ctx_ensure: cuCtxGetCurrent, and cuCtxSetCurrent when another context is current) are
 * injected too: the thread's context is cleared before each import so both are made. */
static int child_import_faults(int s)
{
    xseg_ipc_handle *h = NULL;
    OK(xseg_ipc_recv(s, &h));
    xseg_ipc_info info;
    OK(xseg_ipc_handle_info(h, &info));
    struct cudaemu_live l0, l1;
    if (!tu_live(&l0)) {
        xseg_ipc_handle_free(h);
        CHECK(put(s, 'A'));
        return 0; /* emulator only */
    }
    void *q = NULL;
    OK(xseg_ipc_import(h, 0, &q)); /* the device's allocator and context exist from here */
    OK(xseg_ipc_close(q));
    CUcontext ctx = NULL; /* the device's context, which import made current */
    CHECK(drv->cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx);
    tu_live(&l0);
    int fds0 = tu_count_fds();
    static const char *const entries[] = {"cuCtxGetCurrent", "cuCtxSetCurrent", "cuMemAddressReserve",
                                          "cuMemImportFromShareableHandle", "cuMemMap", "cuMemRelease",
                                          "cuMemSetAccess"};
    /* One context check and switch, one reserve and one set-access per import; one import, map
     * and release per page. */
    const unsigned long want[] = {1, 1, 1, info.nchunks, info.nchunks, info.nchunks, 1};
    for (size_t e = 0; e < sizeof entries / sizeof entries[0]; e++) {
        /* A clean import makes exactly the calls counted above. */
        CHECK(drv->cuCtxSetCurrent(NULL) == CUDA_SUCCESS);
        tu_counts_reset();
        OK(xseg_ipc_import(h, 0, &q));
        CHECK(tu_call_count(entries[e]) == want[e]);
        tu_live(&l1);
        /* The importer's address space is the block's pages: one reservation of exactly them. */
        CHECK(l1.reservations == l0.reservations + 1);
        CHECK(l1.reserved_bytes == l0.reserved_bytes + info.span);
        CHECK(l1.mapped_bytes == l0.mapped_bytes + info.span);
        OK(xseg_ipc_close(q));
        unsigned long failures = 0;
        for (unsigned long n = 1;; n++) {
            CHECK(drv->cuCtxSetCurrent(NULL) == CUDA_SUCCESS);
            unsigned long fired = tu_fail_fired();
            CHECK(tu_fail(entries[e], n, CUDA_ERROR_OUT_OF_MEMORY));
            q = (void *)1;
            xseg_status st = xseg_ipc_import(h, 0, &q);
            tu_fail_clear();
            CHECK(tu_fail_fired() - fired == (st == XSEG_SUCCESS ? 0u : 1u)); /* it failed because of the fault */
            if (st == XSEG_SUCCESS) {
                CHECK(tu_check(dp(q), info.size, 41));
                OK(xseg_ipc_close(q));
                break;
            }
            failures++;
            if (st != XSEG_ERROR_OUT_OF_MEMORY || !msg_has(entries[e]) || q != NULL)
                fprintf(stderr, "child: %s #%lu: %s, ptr %p: %s\n", entries[e], n, xseg_status_name(st), q,
                        xseg_last_error());
            CHECK(st == XSEG_ERROR_OUT_OF_MEMORY && msg_has(entries[e]) && q == NULL);
            tu_live(&l1);
            CHECK(live_eq(&l0, &l1) && l1.reserved_bytes == l0.reserved_bytes);
            CHECK(tu_count_fds() == fds0);
            CHECK(n < 100);
        }
        CHECK(failures == want[e]);
        tu_live(&l1);
        CHECK(live_eq(&l0, &l1));
    }
    /* Close's context calls: a failure leaves the import open (still readable), closed later. */
    static const char *const ctx_entries[] = {"cuCtxGetCurrent", "cuCtxSetCurrent"};
    for (size_t e = 0; e < 2; e++) {
        OK(xseg_ipc_import(h, 0, &q));
        CHECK(drv->cuCtxSetCurrent(NULL) == CUDA_SUCCESS);
        unsigned long fired = tu_fail_fired();
        CHECK(tu_fail(ctx_entries[e], 1, CUDA_ERROR_INVALID_CONTEXT));
        CHECK(xseg_ipc_close(q) == XSEG_ERROR_DRIVER && msg_has(ctx_entries[e]));
        tu_fail_clear();
        CHECK(tu_fail_fired() - fired == 1);
        CHECK(drv->cuCtxSetCurrent(ctx) == CUDA_SUCCESS); /* the failed close left none current */
        CHECK(tu_check(dp(q), info.size, 41));
        OK(xseg_ipc_close(q));
        tu_live(&l1);
        CHECK(live_eq(&l0, &l1) && l1.reserved_bytes == l0.reserved_bytes);
    }
    /* Close: a failed unmap keeps the import (close again later); a failed address free keeps
     * the reservation, which closing again frees without unmapping again. */
    OK(xseg_ipc_import(h, 0, &q));
    unsigned long fired = tu_fail_fired();
    CHECK(tu_fail("cuMemUnmap", 1, CUDA_ERROR_INVALID_VALUE));
    CHECK(xseg_ipc_close(q) == XSEG_ERROR_DRIVER && msg_has("cuMemUnmap"));
    tu_fail_clear();
    CHECK(tu_fail_fired() - fired == 1);
    CHECK(tu_check(dp(q), info.size, 41));
    OK(xseg_ipc_close(q));
    tu_live(&l1);
    CHECK(live_eq(&l0, &l1));
    OK(xseg_ipc_import(h, 0, &q));
    fired = tu_fail_fired();
    CHECK(tu_fail("cuMemAddressFree", 1, CUDA_ERROR_INVALID_VALUE));
    CHECK(xseg_ipc_close(q) == XSEG_ERROR_DRIVER && msg_has("cuMemAddressFree") && msg_has("close again"));
    tu_fail_clear();
    CHECK(tu_fail_fired() - fired == 1);
    tu_live(&l1);
    CHECK(l1.reservations == l0.reservations + 1 && l1.mapped_bytes == l0.mapped_bytes);
    tu_counts_reset();
    OK(xseg_ipc_close(q)); /* the reservation goes; the pages are not unmapped twice */
    CHECK(tu_call_count("cuMemUnmap") == 0 && tu_call_count("cuMemAddressFree") == 1);
    tu_live(&l1);
    CHECK(live_eq(&l0, &l1) && l1.reserved_bytes == l0.reserved_bytes);
    CHECK(xseg_ipc_close(q) == XSEG_ERROR_INVALID_VALUE);
    xseg_ipc_handle_free(h);
    CHECK(put(s, 'A'));
    return 0;
}

/* Fabric handles: the flat form over plain bytes, and xseg_ipc_recv. */
static int child_fabric(int s)
{
    size_t len = 0;
    CHECK(read(s, &len, sizeof len) == (ssize_t)sizeof len && len > 0 && len < 65536);
    unsigned char *buf = malloc(len);
    CHECK(buf != NULL);
    size_t got = 0;
    while (got < len) {
        ssize_t r = read(s, buf + got, len - got);
        CHECK(r > 0);
        got += (size_t)r;
    }
    xseg_ipc_handle *h = NULL;
    CHECK(xseg_ipc_deserialize(buf, len - 1, &h) == XSEG_ERROR_INVALID_VALUE);
    OK(xseg_ipc_deserialize(buf, len, &h));
    free(buf);
    xseg_ipc_info info;
    OK(xseg_ipc_handle_info(h, &info));
    CHECK(info.type == XSEG_IPC_FABRIC);
    void *q = NULL;
    OK(xseg_ipc_import(h, 0, &q));
    CHECK(tu_check(dp(q), info.size, 51));
    CHECK(tu_fill(dp(q), info.size, 52) == CUDA_SUCCESS);
    OK(xseg_ipc_close(q));
    xseg_ipc_handle_free(h);
    OK(xseg_ipc_recv(s, &h));
    OK(xseg_ipc_import(h, 0, &q));
    CHECK(tu_check(dp(q), info.size, 52));
    OK(xseg_ipc_close(q));
    xseg_ipc_handle_free(h);
    CHECK(put(s, 'A'));
    return 0;
}

static int child_main(const char *role, int s)
{
    child_role = role;
    if (xseg_init(CONFIG) != XSEG_SUCCESS) {
        fprintf(stderr, "child %s: xseg_init: %s\n", role, xseg_last_error());
        return 250;
    }
    if (!strcmp(role, "roundtrip"))
        return child_roundtrip(s);
    if (!strcmp(role, "hold"))
        return child_hold(s);
    if (!strcmp(role, "layout"))
        return child_layout(s);
    if (!strcmp(role, "import_faults"))
        return child_import_faults(s);
    if (!strcmp(role, "fabric"))
        return child_fabric(s);
    fprintf(stderr, "child: unknown role %s\n", role);
    return 251;
}

/* ---- the parent's side ---- */

static void must(xseg_status st, const char *what)
{
    if (st != XSEG_SUCCESS)
        fail_msg("%s: %s: %s", what, xseg_status_name(st), xseg_last_error());
}

static void test_roundtrip(void **state)
{
    (void)state;
    tu_xseg_init_or_skip(CONFIG);
    size_t size = 50 * MiB; /* three 20 MiB pages */
    void *p = tu_malloc(size, NULL);
    tu_assert_cu(tu_fill(dp(p), size, 11));
    xseg_ipc_handle *h = NULL;
    must(xseg_ipc_export(p, &h), "xseg_ipc_export");
    xseg_ipc_info info;
    must(xseg_ipc_handle_info(h, &info), "xseg_ipc_handle_info");
    assert_int_equal(info.type, XSEG_IPC_POSIX_FD);
    assert_int_equal(info.device, 0);
    assert_int_equal(info.size, size);
    /* 50 MiB in 20 MiB pages, one chunk each. */
    assert_int_equal(info.nchunks, (info.offset + size + 20 * MiB - 1) / (20 * MiB));
    assert_true(info.nchunks >= 3);
    assert_true(info.span >= info.offset + size);
    size_t n = 0;
    xseg_phys_range r[64];
    must(xseg_block_handles(p, r, 64, &n), "xseg_block_handles");
    assert_int_equal(n, info.nchunks);
    size_t covered = 0;
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(r[i].address, dp(p) + covered); /* the ranges tile the block */
        assert_true(r[i].length <= 20 * MiB && r[i].handle);
        covered += r[i].length;
    }
    assert_int_equal(covered, size);
    struct child c = spawn("roundtrip");
    must(xseg_ipc_send(c.sock, h), "xseg_ipc_send");
    assert_int_equal(get(c.sock), 'A');
    assert_true(tu_check(dp(p), size, 12)); /* the child's writes */
    assert_true(put(c.sock, 'B'));
    reap(&c);
    xseg_ipc_handle_free(h);
    tu_free(p);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
}

/* A block across two reservation pieces of its segment (it grows by reserving the next piece
 * right after its end: vmm/segment.c): pages of both are exported and imported in order. */
static void test_span_pieces(void **state)
{
    (void)state;
    tu_xseg_init_or_skip(CONFIG);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    struct cudaemu_live l0, l1;
    bool emu = tu_live(&l0);
    void *a = tu_malloc(300 * MiB, NULL); /* the first piece holds 16 pages of 20 MiB: 320 MiB */
    size_t size = 100 * MiB;
    void *p = tu_malloc(size, NULL);
    assert_true((char *)p == (char *)a + 300 * MiB); /* the same segment, across 320 MiB */
    if (emu) {
        tu_live(&l1);
        assert_int_equal(l1.reservations, l0.reservations + 2); /* two pieces */
    }
    tu_assert_cu(tu_fill(dp(p), size, 11));
    xseg_ipc_handle *h = NULL;
    must(xseg_ipc_export(p, &h), "xseg_ipc_export");
    xseg_ipc_info info;
    must(xseg_ipc_handle_info(h, &info), "xseg_ipc_handle_info");
    assert_int_equal(info.offset, 0);
    assert_int_equal(info.nchunks, 5); /* 20 MiB chunks (pages), in both pieces */
    assert_int_equal(info.span, 100 * MiB);
    struct child c = spawn("roundtrip");
    must(xseg_ipc_send(c.sock, h), "xseg_ipc_send");
    assert_int_equal(get(c.sock), 'A');
    assert_true(tu_check(dp(p), size, 12)); /* the child's writes, on pages of both pieces */
    assert_true(put(c.sock, 'B'));
    reap(&c);
    xseg_ipc_handle_free(h);
    tu_free(p);
    tu_free(a);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
}

static void test_free_while_imported(void **state)
{
    (void)state;
    tu_xseg_init_or_skip(CONFIG);
    size_t size = 30 * MiB;
    void *p = tu_malloc(size, NULL);
    tu_assert_cu(tu_fill(dp(p), size, 21));
    xseg_ipc_handle *h = NULL;
    must(xseg_ipc_export(p, &h), "xseg_ipc_export");
    struct child c = spawn("hold");
    must(xseg_ipc_send(c.sock, h), "xseg_ipc_send");
    assert_int_equal(get(c.sock), 'A');
    xseg_ipc_handle_free(h);
    tu_free(p);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    assert_true(put(c.sock, 'B'));
    assert_int_equal(get(c.sock), 'C');
    reap(&c);
    /* The exporter's allocator is unaffected. */
    void *q = tu_malloc(size, NULL);
    tu_assert_cu(tu_fill(dp(q), size, 23));
    assert_true(tu_check(dp(q), size, 23));
    tu_free(q);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
}

static void test_layout(void **state)
{
    (void)state;
    tu_xseg_init_or_skip(CONFIG);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    void *a = tu_malloc(12 * MiB, NULL);
    void *b = tu_malloc(30 * MiB, NULL);
    void *sm = tu_malloc(4096, NULL);
    assert_true((char *)b == (char *)a + 12 * MiB);
    tu_assert_cu(tu_fill(dp(a), 12 * MiB, 31));
    tu_assert_cu(tu_fill(dp(b), 30 * MiB, 32));
    tu_assert_cu(tu_fill(dp(sm), 4096, 33));
    xseg_ipc_handle *hb = NULL, *hs = NULL;
    must(xseg_ipc_export(b, &hb), "export b");
    must(xseg_ipc_export(sm, &hs), "export small");
    xseg_ipc_info ib, is;
    must(xseg_ipc_handle_info(hb, &ib), "info");
    must(xseg_ipc_handle_info(hs, &is), "info");
    /* One chunk per 20 MiB page (the default layout): b = [12, 42) MiB lies in three. */
    assert_int_equal(ib.offset, 12 * MiB);
    assert_int_equal(ib.nchunks, 3);
    assert_int_equal(ib.span, 60 * MiB);
    assert_int_equal(is.nchunks, 1);
    assert_int_equal(is.span, 2 * MiB);
    /* The ranges under b: clipped to the block, one per chunk, handles distinct. */
    xseg_phys_range r[4];
    size_t n = 0;
    must(xseg_block_handles(b, r, 4, &n), "xseg_block_handles");
    assert_int_equal(n, 3);
    assert_int_equal(r[0].address, dp(b));
    assert_int_equal(r[0].offset, 12 * MiB);
    assert_int_equal(r[0].length, 8 * MiB);
    assert_int_equal(r[1].offset, 0);
    assert_int_equal(r[1].length, 20 * MiB);
    assert_int_equal(r[2].length, 2 * MiB);
    assert_true(r[0].handle && r[1].handle && r[2].handle && r[0].handle != r[1].handle);
    must(xseg_block_handles(b, NULL, 0, &n), "count only");
    assert_int_equal(n, 3);
    /* A process may import its own export: another address, the same memory. */
    void *self = NULL;
    must(xseg_ipc_import(hb, 0, &self), "self import");
    assert_true(self != b);
    assert_true(tu_check(dp(self), 30 * MiB, 32));
    must(xseg_ipc_close(self), "close");
    struct child c = spawn("layout");
    must(xseg_ipc_send(c.sock, hb), "send b");
    must(xseg_ipc_send(c.sock, hs), "send small");
    assert_int_equal(get(c.sock), 'A');
    reap(&c);
    xseg_ipc_handle_free(hb);
    xseg_ipc_handle_free(hs);
    tu_free(a);
    tu_free(b);
    tu_free(sm);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
}

static void test_export_faults(void **state)
{
    (void)state;
    tu_xseg_init_or_skip(CONFIG);
    tu_require_emulator_or_skip();
    void *p = tu_malloc(50 * MiB, NULL);
    /* A first export gives each page a descriptor of its own in cudaemu (held by the emulator,
     * not a leak): take the baseline after it. */
    xseg_ipc_handle *first = NULL;
    must(xseg_ipc_export(p, &first), "first export");
    xseg_ipc_handle_free(first);
    int fds0 = tu_count_fds();
    CUresult codes[2] = {CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_INVALID_VALUE};
    xseg_status want[2] = {XSEG_ERROR_OUT_OF_MEMORY, XSEG_ERROR_DRIVER};
    for (int k = 0; k < 2; k++) {
        unsigned long failures = 0;
        for (unsigned long n = 1;; n++) {
            unsigned long fired = tu_fail_fired();
            assert_true(tu_fail("cuMemExportToShareableHandle", n, codes[k]));
            xseg_ipc_handle *h = (xseg_ipc_handle *)1;
            xseg_status st = xseg_ipc_export(p, &h);
            tu_fail_clear();
            tu_assert_fired_n(fired, st == XSEG_SUCCESS ? 0 : 1, "export: cuMemExportToShareableHandle #%lu", n);
            if (st == XSEG_SUCCESS) {
                xseg_ipc_handle_free(h);
                break;
            }
            failures++;
            assert_int_equal(st, want[k]);
            assert_non_null(strstr(xseg_last_error(), "cuMemExportToShareableHandle"));
            assert_null(h);
            assert_int_equal(tu_count_fds(), fds0);
        }
        assert_int_equal(failures, 3);
    }
    assert_int_equal(tu_count_fds(), fds0);
    tu_free(p);
}

static void test_import_faults(void **state)
{
    (void)state;
    tu_xseg_init_or_skip(CONFIG);
    size_t size = 50 * MiB;
    void *p = tu_malloc(size, NULL);
    tu_assert_cu(tu_fill(dp(p), size, 41));
    xseg_ipc_handle *h = NULL;
    must(xseg_ipc_export(p, &h), "xseg_ipc_export");
    /* The exporter is untouched by the importer's faults: same descriptors, same driver state,
     * the data intact. */
    int fds0 = tu_count_fds();
    struct cudaemu_live l0, l1;
    bool emu = tu_live(&l0);
    struct child c = spawn("import_faults");
    must(xseg_ipc_send(c.sock, h), "xseg_ipc_send");
    assert_int_equal(get(c.sock), 'A');
    reap(&c);
    assert_int_equal(tu_count_fds(), fds0);
    if (emu) {
        tu_live(&l1);
        assert_true(live_eq(&l0, &l1));
        assert_int_equal(l1.reserved_bytes, l0.reserved_bytes);
        assert_int_equal(l1.used_bytes[0], l0.used_bytes[0]);
    }
    assert_true(tu_check(dp(p), size, 41));
    xseg_ipc_info info;
    must(xseg_ipc_handle_info(h, &info), "xseg_ipc_handle_info");
    xseg_ipc_handle_free(h); /* its descriptors, one per chunk, are closed */
    assert_int_equal(tu_count_fds(), fds0 - (int)info.nchunks);
    tu_free(p);
}

/* A peer that sends a whole handle as one message on a SOCK_SEQPACKET socket: the receiver reads
 * the header's bytes and the kernel drops the rest (MSG_TRUNC). xseg_ipc_recv must say so, not
 * wait for ever for bytes that were dropped (a receive timeout turns a regression into a failure
 * instead of a hung test), and close the descriptors that came with it. A handle sent with
 * xseg_ipc_send over the same kind of socket is received. */
static void test_recv_truncated(void **state)
{
    (void)state;
    tu_xseg_init_or_skip(CONFIG);
    void *p = tu_malloc(4 * MiB, NULL);
    xseg_ipc_handle *h = NULL;
    must(xseg_ipc_export(p, &h), "export");
    int fds0 = tu_count_fds();
    /* What xseg_ipc_send writes, captured from a stream socket with its descriptors. */
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    must(xseg_ipc_send(sv[0], h), "send");
    unsigned char bytes[4096];
    size_t nbytes = 0;
    int fds[8];
    size_t nfds = 0;
    for (;;) {
        union {
            char buf[CMSG_SPACE(8 * sizeof(int))];
            struct cmsghdr align;
        } ctl;
        struct iovec iov = {bytes + nbytes, sizeof bytes - nbytes};
        struct msghdr msg = {0};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = ctl.buf;
        msg.msg_controllen = sizeof ctl.buf;
        ssize_t r = recvmsg(sv[1], &msg, MSG_DONTWAIT);
        if (r <= 0)
            break;
        nbytes += (size_t)r;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
            for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int) && nfds < 8; i++)
                memcpy(&fds[nfds++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
    }
    close(sv[0]);
    close(sv[1]);
    xseg_ipc_info info;
    must(xseg_ipc_handle_info(h, &info), "info");
    /* A header, then at least one chunk size: more than one message's worth. */
    assert_true(nbytes >= 48 + 8 * info.nchunks && info.nchunks >= 1 && nfds == info.nchunks);
    /* All of it in one seqpacket message. */
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
    struct timeval tv = {2, 0};
    assert_int_equal(setsockopt(sv[1], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv), 0);
    union {
        char buf[CMSG_SPACE(8 * sizeof(int))];
        struct cmsghdr align;
    } ctl;
    memset(&ctl, 0, sizeof ctl);
    struct iovec iov = {bytes, nbytes};
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctl.buf;
    msg.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
    memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
    assert_int_equal(sendmsg(sv[0], &msg, 0), (ssize_t)nbytes);
    for (size_t i = 0; i < nfds; i++)
        close(fds[i]);
    xseg_ipc_handle *r = (xseg_ipc_handle *)1;
    xseg_status st = xseg_ipc_recv(sv[1], &r);
    print_message("one-message handle on a seqpacket socket: %s: %s\n", xseg_status_name(st), xseg_last_error());
    assert_int_equal(st, XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "MSG_TRUNC"));
    assert_null(r);
    assert_int_equal(tu_count_fds(), fds0 + 2); /* the socket pair only: the received fds are closed */
    assert_int_equal(xseg_ipc_recv(sv[1], &r), XSEG_ERROR_INVALID_VALUE); /* nothing left: times out */
    assert_int_equal(tu_count_fds(), fds0 + 2);
    /* Still usable: xseg_ipc_send's messages over the same kind of socket arrive whole. */
    must(xseg_ipc_send(sv[0], h), "send over seqpacket");
    must(xseg_ipc_recv(sv[1], &r), "recv over seqpacket");
    void *q = NULL;
    must(xseg_ipc_import(r, 0, &q), "import");
    must(xseg_ipc_close(q), "close");
    xseg_ipc_handle_free(r);
    close(sv[0]);
    close(sv[1]);
    xseg_ipc_handle_free(h);
    tu_free(p);
    assert_int_equal(tu_count_fds(), fds0 - (int)info.nchunks); /* and the handle's own descriptors */
}

static void test_errors(void **state)
{
    (void)state;
    tu_xseg_init_or_skip(CONFIG);
    xseg_ipc_handle *h = (xseg_ipc_handle *)1;
    assert_int_equal(xseg_ipc_export(NULL, &h), XSEG_ERROR_INVALID_VALUE);
    assert_null(h);
    int local = 0;
    assert_int_equal(xseg_ipc_export(&local, &h), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "not a live allocation"));
    assert_int_equal(xseg_ipc_export(&local, NULL), XSEG_ERROR_INVALID_VALUE);
    void *q = (void *)1;
    assert_int_equal(xseg_ipc_import(NULL, 0, &q), XSEG_ERROR_INVALID_VALUE);
    assert_null(q);
    assert_int_equal(xseg_ipc_close(&local), XSEG_ERROR_INVALID_VALUE);
    assert_int_equal(xseg_ipc_close(NULL), XSEG_ERROR_INVALID_VALUE);
    size_t n = 9;
    assert_int_equal(xseg_block_handles(&local, NULL, 0, &n), XSEG_ERROR_INVALID_VALUE);
    assert_int_equal(n, 0);
    unsigned char junk[100];
    memset(junk, 0x5a, sizeof junk);
    assert_int_equal(xseg_ipc_deserialize(junk, sizeof junk, &h), XSEG_ERROR_INVALID_VALUE);
    assert_int_equal(xseg_ipc_deserialize(junk, 3, &h), XSEG_ERROR_INVALID_VALUE);
    assert_int_equal(xseg_ipc_send(-1, (xseg_ipc_handle *)junk), XSEG_ERROR_INVALID_VALUE);
    assert_int_equal(xseg_ipc_handle_info(NULL, NULL), XSEG_ERROR_INVALID_VALUE);
    xseg_ipc_handle_free(NULL);

    /* Receiving garbage, or from a closed peer: an error, no descriptor left open. */
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    int fds0 = tu_count_fds();
    assert_int_equal(write(sv[0], junk, sizeof junk), (ssize_t)sizeof junk);
    assert_int_equal(xseg_ipc_recv(sv[1], &h), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "not an xseg IPC handle"));
    close(sv[0]);
    assert_int_equal(xseg_ipc_recv(sv[1], &h), XSEG_ERROR_INVALID_VALUE);
    assert_null(h);
    assert_int_equal(tu_count_fds(), fds0 - 1);
    close(sv[1]);

    /* A real handle: POSIX fds have no flat form; a truncated stream is refused. */
    void *p = tu_malloc(4 * MiB, NULL);
    must(xseg_ipc_export(p, &h), "export");
    size_t len = 7;
    assert_int_equal(xseg_ipc_serialize(h, junk, sizeof junk, &len), XSEG_ERROR_NOT_SUPPORTED);
    assert_int_equal(xseg_ipc_import(h, 99, &q), XSEG_ERROR_INVALID_DEVICE);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    must(xseg_ipc_send(sv[0], h), "send");
    xseg_ipc_handle *r = NULL;
    must(xseg_ipc_recv(sv[1], &r), "recv in-process");
    must(xseg_ipc_import(r, 0, &q), "import of a received handle");
    assert_true(tu_check(dp(q), 4096, 0) || true); /* mapped and readable */
    must(xseg_ipc_close(q), "close");
    xseg_ipc_handle_free(r);
    close(sv[0]);
    close(sv[1]);
    xseg_ipc_handle_free(h);
    tu_free(p);

    /* Segments created without a shareable type, and classic blocks, are not exportable. */
    must(xseg_set_config("expandable_segments_ipc:False"), "config");
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    p = tu_malloc(4 * MiB, NULL);
    assert_int_equal(xseg_ipc_export(p, &h), XSEG_ERROR_NOT_SUPPORTED);
    assert_non_null(strstr(xseg_last_error(), "expandable_segments_ipc"));
    tu_free(p);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    must(xseg_set_config("expandable_segments:False"), "config");
    p = tu_malloc(4 * MiB, NULL);
    assert_int_equal(xseg_ipc_export(p, &h), XSEG_ERROR_NOT_SUPPORTED);
    assert_non_null(strstr(xseg_last_error(), "classic"));
    xseg_phys_range one;
    must(xseg_block_handles(p, &one, 1, &n), "block handles of a classic block");
    assert_int_equal(n, 1);
    assert_int_equal(one.handle, 0);
    assert_int_equal(one.address, dp(p));
    tu_free(p);
    /* Keys not named keep their value: name both. */
    must(xseg_set_config(CONFIG ",expandable_segments_ipc:True"), "config");
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
}

/* ---- observers ---- */

struct page_rec {
    uint64_t addr;
    size_t len;
    uint64_t handle;
};

struct model {
    struct page_rec *pages;
    size_t n, cap;
    size_t events, bad;
    char why[256];
};

static void model_bad(struct model *m, const char *fmt, ...)
{
    if (m->bad++)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->why, sizeof m->why, fmt, ap);
    va_end(ap);
}

static long model_find(const struct model *m, uint64_t addr)
{
    for (size_t i = 0; i < m->n; i++)
        if (m->pages[i].addr == addr)
            return (long)i;
    return -1;
}

static void observe(const xseg_segment_event *ev, void *user)
{
    struct model *m = user;
    m->events++;
    if (ev->device != 0 || ev->nranges == 0 || !ev->ranges)
        return model_bad(m, "event with device %d, %zu ranges", ev->device, ev->nranges);
    uint64_t at = ev->address;
    for (size_t i = 0; i < ev->nranges; i++) {
        const xseg_phys_range *r = &ev->ranges[i];
        if (r->address != at || r->length == 0)
            return model_bad(m, "ranges do not tile the event at 0x%llx", (unsigned long long)at);
        at += r->length;
        if (ev->is_expandable && (!r->handle || r->offset))
            return model_bad(m, "expandable range without a handle");
        long k = model_find(m, r->address);
        if (ev->kind == XSEG_SEGMENT_MAP) {
            for (size_t j = 0; j < m->n; j++)
                if (r->address < m->pages[j].addr + m->pages[j].len && m->pages[j].addr < r->address + r->length)
                    return model_bad(m, "map of 0x%llx overlaps a mapped range", (unsigned long long)r->address);
            if (m->n == m->cap) {
                m->cap = m->cap ? 2 * m->cap : 64;
                m->pages = realloc(m->pages, m->cap * sizeof *m->pages);
            }
            m->pages[m->n++] = (struct page_rec){r->address, r->length, r->handle};
        } else if (ev->kind == XSEG_SEGMENT_UNMAP) {
            if (k < 0 || m->pages[k].len != r->length || m->pages[k].handle != r->handle)
                return model_bad(m, "unmap of 0x%llx that is not mapped as such", (unsigned long long)r->address);
            m->pages[k] = m->pages[--m->n];
        } else {
            return model_bad(m, "unknown kind %d", (int)ev->kind);
        }
    }
    if (at != ev->address + ev->size)
        model_bad(m, "ranges sum to %llu of %zu bytes", (unsigned long long)(at - ev->address), ev->size);
}

/* The model equals what the allocator holds: reserved bytes, and the handle of every page under
 * every live block. */
static void model_check(struct model *m, void **live, size_t nlive, const size_t *sizes)
{
    if (m->bad)
        fail_msg("observer: %s", m->why);
    size_t total = 0;
    for (size_t i = 0; i < m->n; i++)
        total += m->pages[i].len;
    assert_int_equal((int64_t)total, tu_stat("reserved_bytes.all.current"));
    for (size_t i = 0; i < nlive; i++) {
        if (!live[i])
            continue;
        xseg_phys_range r[64];
        size_t n = 0;
        must(xseg_block_handles(live[i], r, 64, &n), "xseg_block_handles");
        assert_true(n <= 64);
        uint64_t at = dp(live[i]);
        for (size_t k = 0; k < n; k++) {
            assert_int_equal(r[k].address, at);
            at += r[k].length;
            long p = model_find(m, r[k].address - r[k].offset);
            if (p < 0)
                fail_msg("block %p: page at 0x%llx is not mapped per the observer", live[i],
                         (unsigned long long)(r[k].address - r[k].offset));
            assert_int_equal(m->pages[p].handle, r[k].handle);
        }
        assert_true(at >= dp(live[i]) + sizes[i]);
    }
}

static void test_observers(void **state)
{
    (void)state;
    tu_xseg_init_or_skip(CONFIG);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    CUstream s2 = NULL;
    tu_assert_cu(drv->cuStreamCreate(&s2, 0));
    enum { SLOTS = 24 };
    void *live[SLOTS] = {0};
    size_t sizes[SLOTS] = {0};
    /* Mappings that exist before the observer is attached are replayed to it. */
    live[0] = tu_malloc(30 * MiB, NULL);
    sizes[0] = 30 * MiB;
    live[1] = tu_malloc(100 * 1024, s2);
    sizes[1] = 100 * 1024;
    struct model m = {0};
    must(xseg_attach_segment_observer(observe, &m), "attach");
    assert_int_equal(xseg_attach_segment_observer(observe, &m), XSEG_ERROR_INVALID_VALUE);
    model_check(&m, live, SLOTS, sizes);

    uint64_t x = 88172645463325252ull;
    size_t steps = tu_scaled(600, 60);
    for (size_t step = 0; step < steps; step++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        size_t i = x % SLOTS;
        if (live[i]) {
            tu_free(live[i]);
            live[i] = NULL;
        } else {
            static const size_t sz[] = {512, 4096, 700 * 1024, 3 * MiB, 9 * MiB, 25 * MiB, 70 * MiB};
            sizes[i] = sz[(x >> 20) % (sizeof sz / sizeof sz[0])];
            live[i] = tu_malloc(sizes[i], (x >> 40) & 1 ? s2 : NULL);
        }
        if (step % 50 == 49) {
            assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
            model_check(&m, live, SLOTS, sizes);
        }
    }
    model_check(&m, live, SLOTS, sizes);
    for (size_t i = 0; i < SLOTS; i++)
        if (live[i])
            tu_free(live[i]);
    memset(live, 0, sizeof live);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    model_check(&m, live, SLOTS, sizes);
    assert_int_equal(m.n, 0);

    /* Classic segments: one range without a handle, mapped and unmapped. */
    must(xseg_set_config("expandable_segments:False"), "config");
    size_t before = m.events;
    void *c = tu_malloc(5 * MiB, NULL);
    assert_int_equal(m.events, before + 1);
    assert_int_equal(m.n, 1);
    assert_int_equal(m.pages[0].handle, 0);
    tu_free(c);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(m.n, 0);
    must(xseg_set_config(CONFIG), "config");

    /* Detached: no more calls. */
    must(xseg_detach_segment_observer(observe, &m), "detach");
    assert_int_equal(xseg_detach_segment_observer(observe, &m), XSEG_ERROR_INVALID_VALUE);
    before = m.events;
    void *p = tu_malloc(30 * MiB, NULL);
    tu_free(p);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(m.events, before);
    if (m.bad)
        fail_msg("observer: %s", m.why);
    free(m.pages);
    tu_assert_cu(drv->cuStreamDestroy(s2));
}

/* Attach while other threads map and unmap, and import/close concurrently: the observer must
 * still see every page exactly once (replayed or live), which the model checks when everything
 * is released. Also the TSan check of observe.c's and the import table's locking. */
struct worker {
    CUstream stream;
    uint64_t seed;
    size_t steps;
    int err;
};

/* Record the first failure of a worker thread with its message. */
static void worker_fail(struct worker *w, xseg_status st, const char *what)
{
    if (st == XSEG_SUCCESS || w->err)
        return;
    w->err = 1;
    fprintf(stderr, "worker: %s: %s: %s\n", what, xseg_status_name(st), xseg_last_error());
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    void *live[8] = {0};
    uint64_t x = w->seed;
    for (size_t i = 0; i < w->steps && !w->err; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        size_t k = x % 8;
        if (live[k]) {
            worker_fail(w, xseg_free(live[k]), "xseg_free");
            live[k] = NULL;
        } else {
            static const size_t sz[] = {4096, 3 * MiB, 25 * MiB, 45 * MiB};
            worker_fail(w, xseg_malloc(&live[k], sz[(x >> 24) % 4], 0, w->stream), "xseg_malloc");
        }
        if (i % 16 == 15)
            worker_fail(w, xseg_empty_cache(0), "xseg_empty_cache");
    }
    for (size_t k = 0; k < 8; k++)
        if (live[k])
            worker_fail(w, xseg_free(live[k]), "xseg_free");
    return NULL;
}

static void *importer_main(void *arg)
{
    struct worker *w = arg;
    void *p = NULL;
    xseg_status st = xseg_malloc(&p, 30 * MiB, 0, w->stream);
    worker_fail(w, st, "xseg_malloc");
    if (st != XSEG_SUCCESS)
        return NULL;
    for (size_t i = 0; i < w->steps && !w->err; i++) {
        xseg_ipc_handle *h = NULL;
        void *q = NULL;
        worker_fail(w, xseg_ipc_export(p, &h), "xseg_ipc_export");
        if (h)
            worker_fail(w, xseg_ipc_import(h, 0, &q), "xseg_ipc_import");
        if (q)
            worker_fail(w, xseg_ipc_close(q), "xseg_ipc_close");
        xseg_ipc_handle_free(h);
    }
    worker_fail(w, xseg_free(p), "xseg_free");
    return NULL;
}

static void test_observers_threads(void **state)
{
    (void)state;
    tu_xseg_init_or_skip(CONFIG);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    struct worker w[3];
    pthread_t th[3];
    size_t steps = tu_scaled(300, 40);
    for (int i = 0; i < 3; i++) {
        w[i] = (struct worker){NULL, 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1), i == 2 ? steps / 10 : steps, 0};
        tu_assert_cu(drv->cuStreamCreate(&w[i].stream, CU_STREAM_NON_BLOCKING));
    }
    for (int i = 0; i < 3; i++)
        assert_int_equal(pthread_create(&th[i], NULL, i == 2 ? importer_main : worker_main, &w[i]), 0);
    usleep(2000);
    struct model m = {0};
    must(xseg_attach_segment_observer(observe, &m), "attach while threads run");
    for (int i = 0; i < 3; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(w[i].err, 0);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    must(xseg_detach_segment_observer(observe, &m), "detach");
    if (m.bad)
        fail_msg("observer: %s", m.why);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    assert_int_equal(m.n, 0); /* every page it heard mapped, it heard unmapped */
    free(m.pages);
    for (int i = 0; i < 3; i++)
        tu_assert_cu(drv->cuStreamDestroy(w[i].stream));
}

/* ---- fabric (CUDAEMU_FABRIC=1) ---- */

static void test_fabric(void **state)
{
    (void)state;
    tu_xseg_init_or_skip(CONFIG);
    size_t size = 24 * MiB;
    void *p = tu_malloc(size, NULL);
    tu_assert_cu(tu_fill(dp(p), size, 51));
    xseg_ipc_handle *h = NULL;
    must(xseg_ipc_export(p, &h), "export");
    xseg_ipc_info info;
    must(xseg_ipc_handle_info(h, &info), "info");
    print_message("fabric: export chose %s\n", info.type == XSEG_IPC_FABRIC ? "FABRIC" : "POSIX_FD");
    if (info.type != XSEG_IPC_FABRIC) {
        /* No fabric: the POSIX fallback was chosen automatically. */
        assert_int_equal(info.type, XSEG_IPC_POSIX_FD);
        xseg_ipc_handle_free(h);
        tu_free(p);
        skip();
    }
    size_t len = 0;
    must(xseg_ipc_serialize(h, NULL, 0, &len), "serialize (size)");
    unsigned char *buf = malloc(len);
    assert_non_null(buf);
    must(xseg_ipc_serialize(h, buf, len, &len), "serialize");
    struct child c = spawn("fabric");
    assert_int_equal(write(c.sock, &len, sizeof len), (ssize_t)sizeof len);
    assert_int_equal(write(c.sock, buf, len), (ssize_t)len);
    must(xseg_ipc_send(c.sock, h), "send fabric");
    assert_int_equal(get(c.sock), 'A');
    reap(&c);
    assert_true(tu_check(dp(p), size, 52));
    free(buf);
    xseg_ipc_handle_free(h);
    tu_free(p);
}

/* ---- peer access (two devices) ---- */

static void ctx_of(int dev)
{
    CUdevice d;
    CUcontext c;
    tu_assert_cu(drv->cuDeviceGet(&d, dev));
    tu_assert_cu(drv->cuDevicePrimaryCtxRetain(&c, d));
    tu_assert_cu(drv->cuCtxSetCurrent(c));
    tu_assert_cu(drv->cuDevicePrimaryCtxRelease(d)); /* xseg holds its own reference */
}

static void test_peer(void **state)
{
    (void)state;
    tu_xseg_init_or_skip(CONFIG);
    tu_require_emulator_or_skip(); /* a copy without access faults a real GPU's context */
    int ndev = 0;
    must(xseg_device_count(&ndev), "device count");
    if (ndev < 2)
        skip();
    void *p = tu_malloc(30 * MiB, NULL);
    tu_assert_cu(tu_fill(dp(p), 30 * MiB, 61));
    ctx_of(1);
    tu_assert_cu_eq(tu_fill(dp(p), 4096, 62), CUDA_ERROR_ILLEGAL_ADDRESS); /* no grant yet */
    tu_counts_reset();
    must(xseg_enable_peer_access(0, 1), "enable peer");
    assert_int_equal(tu_call_count("cuMemSetAccess"), 1); /* one run, one call */
    ctx_of(1);
    assert_true(tu_check(dp(p), 30 * MiB, 61));
    tu_assert_cu(tu_fill(dp(p), 30 * MiB, 62));
    /* New mappings: one cuMemSetAccess per run for the owner and the peer together. */
    tu_counts_reset();
    void *q = tu_malloc(70 * MiB, NULL);
    assert_int_equal(tu_call_count("cuMemSetAccess"), 1);
    ctx_of(1);
    tu_assert_cu(tu_fill(dp(q), 70 * MiB, 63));
    /* An import on device 1 is accessible from device 1, not from device 0 (no peer enabled on
     * device 1). */
    xseg_ipc_handle *h = NULL;
    must(xseg_ipc_export(q, &h), "export");
    void *r = NULL;
    must(xseg_ipc_import(h, 1, &r), "import on device 1");
    ctx_of(1);
    assert_true(tu_check(dp(r), 70 * MiB, 63));
    ctx_of(0);
    tu_assert_cu_eq(tu_fill(dp(r), 4096, 64), CUDA_ERROR_ILLEGAL_ADDRESS);
    must(xseg_ipc_close(r), "close");
    xseg_ipc_handle_free(h);

    /* Reclaim with device 1 current never unmaps under device 0's queued work: the segment's
     * stream (device 0) is waited for. */
    ctx_of(0);
    CUstream s0 = NULL;
    /* Non-blocking: a wait on the legacy stream (the other segments') does not cover it, so only
     * a wait on s0 itself completes its work. */
    tu_assert_cu(drv->cuStreamCreate(&s0, CU_STREAM_NON_BLOCKING));
    void *b = tu_malloc(30 * MiB, s0);
    assert_true(tu_stream_hold(s0));
    assert_true(tu_stream_work(s0));
    tu_assert_cu_eq(drv->cuStreamQuery(s0), CUDA_ERROR_NOT_READY);
    tu_free(b);
    tu_free(p);
    tu_free(q);
    ctx_of(1);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    tu_assert_cu(drv->cuStreamQuery(s0)); /* the queued work was waited for */
    assert_true(tu_stream_release(s0));
    ctx_of(0);
    tu_assert_cu(drv->cuStreamDestroy(s0));
}

int main(int argc, char **argv)
{
    ssize_t n = readlink("/proc/self/exe", self_path, sizeof self_path - 1);
    if (n > 0)
        self_path[n] = '\0';
    if (argc == 4 && !strcmp(argv[1], "--child"))
        return child_main(argv[2], atoi(argv[3]));
    const char *group = argc > 1 ? argv[1] : "main";
    if (!strcmp(group, "fabric")) {
        const struct CMUnitTest t[] = {cmocka_unit_test(test_fabric)};
        return cmocka_run_group_tests_name("ipc-fabric", t, NULL, NULL);
    }
    if (!strcmp(group, "peer")) {
        const struct CMUnitTest t[] = {cmocka_unit_test(test_peer)};
        return cmocka_run_group_tests_name("ipc-peer", t, NULL, NULL);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),     cmocka_unit_test(test_span_pieces),
        cmocka_unit_test(test_free_while_imported),
        cmocka_unit_test(test_layout),        cmocka_unit_test(test_export_faults),
        cmocka_unit_test(test_import_faults), cmocka_unit_test(test_errors),
        cmocka_unit_test(test_recv_truncated),
        cmocka_unit_test(test_observers),     cmocka_unit_test(test_observers_threads),
    };
    if (!strcmp(group, "main")) /* all in one process (the GPU run's services check) */
        return cmocka_run_group_tests_name("ipc", tests, NULL, NULL);
    /* One test in a process of its own (the suite): a failure leaves nothing behind for the next
     * (a block or an attached observer of a test that stopped half-way). */
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
        if (strcmp(tests[i].name, group) != 0)
            continue;
        const struct CMUnitTest one[] = {tests[i]};
        return _cmocka_run_group_tests(tests[i].name, one, 1, NULL, NULL);
    }
    fprintf(stderr, "test_ipc: no group or test named '%s'\n", group);
    return 1;
}
