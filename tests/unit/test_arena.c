/* base/arena: zeroed, aligned, lasting takes from reserved address space, moved onto huge pages in
 * place at the threshold, and a clean NULL where the kernel refuses the memory. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/arena.h"
#include "base/hugemem.h"
#include "tests/unit/smaps.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define ARENA_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define ARENA_TEST_SANITIZED 1
#endif
#endif

/* Does this kernel collapse a written 2 MiB range onto a huge page on request (MADV_COLLAPSE,
 * Linux 6.1, transparent huge pages not "never")? */
static bool collapse_works(void)
{
    char *p = hugemem_alloc(HUGEMEM_PAGE);
    if (!p)
        return false;
    (void)madvise(p, HUGEMEM_PAGE, MADV_NOHUGEPAGE);
    memset(p, 1, HUGEMEM_PAGE);
    (void)madvise(p, HUGEMEM_PAGE, MADV_HUGEPAGE);
    bool ok = madvise(p, HUGEMEM_PAGE, 25 /* MADV_COLLAPSE */) == 0;
    hugemem_free(p, HUGEMEM_PAGE);
    return ok;
}

/* Fill [p, p + n) with a pattern of its position and @p seed; check it. */
static void fill(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(i * 31 + seed);
}
static bool intact(const unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != (unsigned char)(i * 31 + seed))
            return false;
    return true;
}

static void test_takes_zeroed_aligned_in_order(void **state)
{
    (void)state;
    struct arena a = ARENA_INIT;
    a.reserve = 8 * HUGEMEM_PAGE;
    a.huge_div = 1000; /* no huge pages in this test */
    unsigned char *prev = NULL, *first = NULL;
    size_t n = 0;
    for (size_t total = 0; total + 80 <= 3 * HUGEMEM_PAGE; total += 80, n++) {
        unsigned char *p = arena_take(&a, 80);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % 16, 0);
        if (prev)
            assert_ptr_equal(p, prev + 80); /* in order: neighbours in time, in memory */
        else
            first = p;
        for (int i = 0; i < 80; i++)
            assert_int_equal(p[i], 0);
        fill(p, 80, (unsigned)n);
        prev = p;
    }
    for (size_t i = 0; i < n; i++)
        assert_true(intact(first + i * 80, 80, (unsigned)i));
    assert_int_equal((uintptr_t)first % HUGEMEM_PAGE, 0);
    assert_int_equal(a.used, n * 80);
    assert_true(a.next <= a.writable && a.writable <= a.end);
    assert_false(a.huge);
    char flags[512];
    unsigned long huge_kb;
    smaps_of(first, flags, sizeof flags, &huge_kb);
    if (flags[0] && strstr(flags, " nh")) /* advised away from huge pages (kernels with THP) */
        assert_int_equal(huge_kb, 0);
}

/* A full reservation is followed by another; what was handed out stays where it was. */
static void test_new_reservation(void **state)
{
    (void)state;
    struct arena a = ARENA_INIT;
    a.reserve = HUGEMEM_PAGE;
    a.huge_div = 1000;
    size_t half = HUGEMEM_PAGE / 2;
    unsigned char *p1 = arena_take(&a, half), *p2 = arena_take(&a, half);
    assert_non_null(p1);
    assert_ptr_equal(p2, p1 + half);
    fill(p1, half, 1);
    fill(p2, half, 2);
    char *base1 = a.base;
    unsigned char *p3 = arena_take(&a, 4096);
    assert_non_null(p3);
    assert_true(a.base != base1);
    assert_ptr_equal(p3, (unsigned char *)a.base);
    assert_int_equal(p3[0] | p3[4095], 0);
    assert_true(intact(p1, half, 1));
    assert_true(intact(p2, half, 2));
    assert_int_equal(a.used, 2 * half + 4096);
}

/* The range [p, p + n) is mapped (msync answers ENOMEM for an unmapped page). */
static bool mapped(const void *p, size_t n)
{
    return msync((void *)((uintptr_t)p & ~(uintptr_t)4095), n, MS_ASYNC) == 0;
}

/* arena_release unmaps every reservation, the full ones too, and the arena starts again. */
static void test_release(void **state)
{
    (void)state;
    struct arena a = ARENA_INIT;
    a.reserve = HUGEMEM_PAGE;
    a.huge_div = 1000;
    size_t half = HUGEMEM_PAGE / 2;
    unsigned char *p1 = arena_take(&a, half), *p2 = arena_take(&a, half), *p3 = arena_take(&a, 4096);
    assert_non_null(p1);
    assert_non_null(p2);
    assert_non_null(p3);
    assert_int_equal(a.nold, 1);
    assert_true(mapped(p1, HUGEMEM_PAGE) && mapped(p3, 4096));
    arena_release(&a);
    assert_false(mapped(p1, HUGEMEM_PAGE));
    assert_false(mapped(p3, 4096));
    assert_null(a.base);
    assert_int_equal(a.used, 0);
    assert_int_equal(a.nold, 0);
    assert_int_equal(a.reserve, HUGEMEM_PAGE);
    unsigned char *q = arena_take(&a, 4096);
    assert_non_null(q);
    assert_int_equal(q[0] | q[4095], 0);
    arena_release(&a);
    arena_release(&a); /* nothing left: a no-op */
}

/* At the threshold the arena is advised to huge pages and the ranges already written move onto
 * them, two per new range, their contents kept. */
static void test_huge_at_threshold(void **state)
{
    (void)state;
    struct arena a = ARENA_INIT;
    a.reserve = 16 * HUGEMEM_PAGE;
    a.huge_div = 3; /* huge once 3 pages' worth is handed out */
    size_t piece = 64 << 10, n = 0;
    unsigned char *first = NULL;
    bool crossed_at = false;
    while (a.used + piece <= 8 * HUGEMEM_PAGE) {
        bool was = a.huge;
        unsigned char *p = arena_take(&a, piece);
        assert_non_null(p);
        if (!first)
            first = p;
        if (a.huge && !was)
            crossed_at = a.used == 3 * HUGEMEM_PAGE; /* the take that reaches the threshold */
        fill(p, piece, (unsigned)n++);
    }
    assert_true(a.huge);
    assert_true(crossed_at);
    for (size_t i = 0; i < n; i++)
        assert_true(intact(first + i * piece, piece, (unsigned)i));
    char flags[512];
    unsigned long huge_kb;
    smaps_of(first, flags, sizeof flags, &huge_kb);
    if (!collapse_works()) {
        /* No MADV_COLLAPSE here: the ranges stay where they were, and the arena stopped asking. */
        assert_int_equal(a.collapsed, 0);
        return;
    }
    /* Three ranges were written before the threshold (the third up to its end); two collapsed at
     * the threshold and the third at the next range made writable. */
    assert_int_equal(a.collapsed, 3);
    assert_ptr_equal(a.collapse, a.collapse_end);
    if (flags[0]) {
        assert_non_null(strstr(flags, " hg"));
        assert_true(huge_kb >= 3 * 2048);
    }
}

/* huge_div 0: huge pages from the first take (the device tests use this to cover the huge path
 * with few blocks). */
static void test_huge_from_start(void **state)
{
    (void)state;
    struct arena a = ARENA_INIT;
    a.reserve = 4 * HUGEMEM_PAGE;
    a.huge_div = 0;
    unsigned char *p = arena_take(&a, 1 << 20);
    assert_non_null(p);
    assert_true(a.huge);
    assert_int_equal(a.collapsed, 0); /* nothing was written before */
    char flags[512];
    unsigned long huge_kb;
    smaps_of(p, flags, sizeof flags, &huge_kb);
    void *probe = hugemem_alloc(HUGEMEM_PAGE);
    if (probe) { /* the kernel takes the advice */
        hugemem_free(probe, HUGEMEM_PAGE);
        if (flags[0])
            assert_non_null(strstr(flags, " hg"));
    }
}

/* Address space the kernel will not reserve: NULL, and the arena gives up for good (the caller
 * uses calloc from then on). */
static void test_reservation_refused(void **state)
{
    (void)state;
    struct arena a = ARENA_INIT;
    a.reserve = (size_t)1 << 62;
    assert_null(arena_take(&a, 80));
    assert_true(a.broken);
    a.reserve = HUGEMEM_PAGE;
    assert_null(arena_take(&a, 80));
    assert_int_equal(a.used, 0);
}

/* Memory the kernel will not make writable (here the data limit, which counts private writable
 * mappings): NULL, nothing handed out, and the arena usable again once memory is there. Runs in a
 * child: the limit is the process's. */
static void test_write_refused(void **state)
{
    (void)state;
#ifdef ARENA_TEST_SANITIZED
    skip(); /* the sanitizers' own mappings count against the data limit */
#else
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct arena a = ARENA_INIT;
        a.reserve = 8 * HUGEMEM_PAGE;
        a.huge_div = 1000;
        /* The first 2 MiB step made writable, and nearly all of it handed out. */
        unsigned char *p = arena_take(&a, 4096), *m = arena_take(&a, HUGEMEM_PAGE / 2);
        if (!p || m != p + 4096)
            _exit(10);
        /* What the process may still make writable: less than the next 2 MiB step. */
        FILE *f = fopen("/proc/self/status", "r");
        unsigned long kb = 0;
        char line[256];
        while (f && fgets(line, sizeof line, f))
            if (sscanf(line, "VmData: %lu kB", &kb) == 1)
                break;
        if (f)
            fclose(f);
        if (!kb)
            _exit(77); /* no /proc: nothing to set the limit against */
        struct rlimit old, lim;
        if (getrlimit(RLIMIT_DATA, &old) != 0)
            _exit(11);
        lim = old;
        lim.rlim_cur = (rlim_t)(kb + 512) << 10;
        if (setrlimit(RLIMIT_DATA, &lim) != 0)
            _exit(12);
        size_t before = a.used;
        if (arena_take(&a, HUGEMEM_PAGE / 2) != NULL) /* needs the next step: refused */
            _exit(77); /* a kernel that ignores the data limit (ignore_rlimit_data) */
        if (a.used != before || a.broken)
            _exit(13);
        if (setrlimit(RLIMIT_DATA, &old) != 0)
            _exit(14);
        unsigned char *q = arena_take(&a, HUGEMEM_PAGE / 2);
        if (!q || q != m + HUGEMEM_PAGE / 2 || q[0] != 0)
            _exit(15);
        q[HUGEMEM_PAGE / 2 - 1] = 1;
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    if (WEXITSTATUS(status) == 77)
        skip();
    assert_int_equal(WEXITSTATUS(status), 0);
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_takes_zeroed_aligned_in_order),
        cmocka_unit_test(test_new_reservation),
        cmocka_unit_test(test_release),
        cmocka_unit_test(test_huge_at_threshold),
        cmocka_unit_test(test_huge_from_start),
        cmocka_unit_test(test_reservation_refused),
        cmocka_unit_test(test_write_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
