/*
 * fork() through the public API (PyTorch's DataLoader forks its workers).
 *
 * A child starts with one thread: a lock another thread of the parent held at the fork would
 * stay held for ever. The child of a process that had initialised CUDA may not use the parent's
 * GPU state (CUDA's rule): every call that needs a device fails at once with a message saying
 * so, and the configuration, the version and xseg_last_error keep working. A child of a process
 * that never initialised CUDA initialises cleanly. The parent (and its idle thread) goes on.
 *
 * Each child arms alarm(): a regression that hangs kills the child with SIGALRM, and the test
 * fails instead of hanging CI. One process per test (the argument names it).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/common/testutil.h"
#include "xseg.h"

#define MiB ((size_t)1 << 20)
#define CHILD_ALARM_S 20 /* far above anything the child does; only a hang reaches it */

static pid_t test_pid;   /* the test process; any other pid is a child */
static int child_status; /* what a child passed to child_exit */

/* In a child: exit with @p code, the atexit handlers run (see child_end_before_teardown). */
static _Noreturn void child_exit(int code)
{
    child_status = code;
    exit(code);
}

/* In a child: report a failed check on stderr and exit with @p code (the parent asserts 0). */
#define CHILD_CHECK(cond, code)                                                                   \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            fprintf(stderr, "child: check failed: %s (last error: %s)\n", #cond, xseg_last_error()); \
            child_exit(code);                                                                     \
        }                                                                                         \
    } while (0)

/* Wait for @p pid; @return its exit status, or 128 + the signal that killed it. */
static int wait_child(pid_t pid)
{
    int ws = 0;
    while (waitpid(pid, &ws, 0) < 0)
        ;
    if (WIFSIGNALED(ws)) {
        fprintf(stderr, "child killed by signal %d%s\n", WTERMSIG(ws),
                WTERMSIG(ws) == SIGALRM ? " (alarm: it hung in xseg)" : "");
        return 128 + WTERMSIG(ws);
    }
    return WEXITSTATUS(ws);
}

/* The child of a process that had initialised CUDA: device calls refused with the fork message,
 * calls that need no device still work, and so does a later call after the error. */
static int child_refused(void *parent_ptr, const char *expect_config, bool run_atexit)
{
    alarm(CHILD_ALARM_S);
    void *p = (void *)1;
    CHILD_CHECK(xseg_malloc(&p, MiB, 0, NULL) == XSEG_ERROR_ILLEGAL_STATE, 10);
    CHILD_CHECK(p == NULL, 11);
    CHILD_CHECK(strstr(xseg_last_error(), "forked from one that had initialised CUDA") != NULL, 12);
    CHILD_CHECK(strstr(xseg_last_error(), "spawn") != NULL, 13);
    CHILD_CHECK(xseg_free(parent_ptr) == XSEG_ERROR_ILLEGAL_STATE, 14);
    CHILD_CHECK(xseg_empty_cache(0) == XSEG_ERROR_ILLEGAL_STATE, 15);
    int64_t v = 0;
    CHILD_CHECK(xseg_stat(0, "allocated_bytes.all.current", &v) == XSEG_ERROR_ILLEGAL_STATE, 16);
    CHILD_CHECK(xseg_init(NULL) == XSEG_ERROR_ILLEGAL_STATE, 17);
    /* No device needed: these keep working after the errors. */
    CHILD_CHECK(xseg_version() != NULL && *xseg_version(), 20);
    char buf[1024];
    CHILD_CHECK(xseg_get_config(buf, sizeof buf, NULL) == XSEG_SUCCESS, 21);
    CHILD_CHECK(!expect_config || strstr(buf, expect_config) != NULL, 22);
    CHILD_CHECK(xseg_set_config("max_split_size_mb:64") == XSEG_SUCCESS, 23);
    CHILD_CHECK(xseg_get_config(buf, sizeof buf, NULL) == XSEG_SUCCESS, 24);
    CHILD_CHECK(strstr(buf, "max_split_size_mb:64") != NULL, 25);
    CHILD_CHECK(xseg_malloc(&p, MiB, 0, NULL) == XSEG_ERROR_ILLEGAL_STATE, 26);
    /* exit runs the atexit handlers (the idle thread's join among them). Where the parent's other
     * threads were mid-call, _exit: what their vanished stacks held is unreachable here, and
     * LeakSanitizer would report it at exit. */
    if (run_atexit)
        child_exit(0);
    _exit(0);
}

/* ---- (a) a thread holds the device lock while the main thread forks ---------------------- */

/* The stream filter runs under the device lock during xseg_malloc: when armed it signals that
 * it is inside and waits for the main thread, so the fork happens with the lock held. */
static atomic_int filt_armed, filt_inside, filt_release;

static int blocking_filter(struct CUstream_st *stream, void *user)
{
    (void)stream;
    (void)user;
    if (atomic_exchange(&filt_armed, 0)) {
        atomic_store(&filt_inside, 1);
        struct timespec nap = {0, 1000 * 1000};
        while (!atomic_load(&filt_release))
            nanosleep(&nap, NULL);
    }
    return 1;
}

static void *malloc_thread(void *arg)
{
    void **out = arg;
    if (xseg_malloc(out, 3 * MiB, 0, NULL) != XSEG_SUCCESS)
        *out = NULL;
    return NULL;
}

static void test_fork_held_lock(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("");
    void *mine = tu_malloc(MiB, NULL); /* a parent allocation the child tries to free */
    xseg_pool_id pool;
    assert_int_equal(xseg_pool_create(&pool), XSEG_SUCCESS);
    assert_int_equal(xseg_begin_allocate_to_pool(0, pool, blocking_filter, NULL), XSEG_SUCCESS);
    for (int round = 0; round < 4; round++) {
        atomic_store(&filt_inside, 0);
        atomic_store(&filt_release, 0);
        atomic_store(&filt_armed, 1);
        void *got = NULL;
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, malloc_thread, &got), 0);
        struct timespec nap = {0, 1000 * 1000};
        while (!atomic_load(&filt_inside))
            nanosleep(&nap, NULL); /* the thread now holds device 0's lock */
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0)
            child_refused(mine, NULL, false);
        atomic_store(&filt_release, 1);
        int status = wait_child(pid);
        assert_int_equal(pthread_join(t, NULL), 0);
        assert_int_equal(status, 0);
        /* The parent goes on: the thread's malloc completed, and more work succeeds. */
        assert_non_null(got);
        tu_free(got);
    }
    assert_int_equal(xseg_end_allocate_to_pool(0, pool), XSEG_SUCCESS);
    tu_free(mine);
    void *again = tu_malloc(5 * MiB, NULL);
    tu_free(again);
}

/* Same, with threads looping malloc/free (and empty_cache) on two streams while the main thread
 * forks: whatever lock they hold at that instant, the child's first call returns. */
static atomic_int churn_stop;

static void *churn_thread(void *arg)
{
    (void)arg;
    while (!atomic_load(&churn_stop)) {
        void *p = NULL;
        if (xseg_malloc(&p, 4 * MiB, 0, NULL) == XSEG_SUCCESS)
            xseg_free(p);
        xseg_empty_cache(0);
    }
    return NULL;
}

static void test_fork_churn(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("");
    void *mine = tu_malloc(MiB, NULL);
    pthread_t t[2];
    atomic_store(&churn_stop, 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&t[i], NULL, churn_thread, NULL), 0);
    for (int round = 0; round < 20; round++) {
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0)
            child_refused(mine, NULL, false);
        assert_int_equal(wait_child(pid), 0);
    }
    atomic_store(&churn_stop, 1);
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);
    tu_free(mine);
}

/* ---- (b) a parent that never touched a device: the child initialises and allocates ----- */

static void test_fork_clean_child(void **state)
{
    (void)state;
    /* Nothing before the fork: no xseg call, no driver call. */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        alarm(CHILD_ALARM_S);
        void *p = NULL;
        if (xseg_init(NULL) != XSEG_SUCCESS && strstr(xseg_last_error(), "cannot load"))
            child_exit(77); /* no driver here at all */
        CHILD_CHECK(xseg_malloc(&p, 8 * MiB, 0, NULL) == XSEG_SUCCESS, 30);
        CHILD_CHECK(p != NULL, 31);
        CHILD_CHECK(xseg_free(p) == XSEG_SUCCESS, 32);
        CHILD_CHECK(xseg_empty_cache(0) == XSEG_SUCCESS, 33);
        child_exit(0);
    }
    int status = wait_child(pid);
    if (status == 77)
        skip();
    assert_int_equal(status, 0);
    /* And the parent, which forked before initialising, initialises in turn. */
    tu_xseg_init_or_skip("");
    void *q = tu_malloc(8 * MiB, NULL);
    tu_free(q);
}

/* ---- (c) the parent keeps working after a fork, its idle thread included ----------------- */

static void test_fork_parent_idle(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments_recycle:False,idle_release_ms:40,idle_release_thread:True");
    tu_require_emulator_or_skip();
    void *keep = tu_malloc(20 * MiB, NULL);
    for (int round = 0; round < 3; round++) {
        void *x = tu_malloc(200 * MiB, NULL);
        tu_free(x);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0)
            child_refused(keep, "idle_release_thread:True", true);
        assert_int_equal(wait_child(pid), 0);
        /* No allocator call from here: only the idle thread can give the idle 200 MiB back. */
        struct timespec nap = {0, 5 * 1000 * 1000};
        int tries = 0;
        while (tu_stat("reserved_bytes.all.current") > (int64_t)(20 * MiB) && tries++ < 4000)
            nanosleep(&nap, NULL);
        assert_int_equal(tu_stat("reserved_bytes.all.current"), 20 * MiB);
    }
    /* Configuration changes still stop and start the parent's thread. */
    assert_int_equal(xseg_set_config("idle_release_thread:False"), XSEG_SUCCESS);
    assert_int_equal(xseg_set_config("idle_release_thread:True"), XSEG_SUCCESS);
    tu_free(keep);
}

/* Registered first, so in a child's exit it runs after every other atexit handler (xseg's join of
 * the idle thread among them) and before the libraries' own teardown. There a sanitizer's leak
 * check locks its allocator, which another thread of the parent may have held at the fork
 * (GCC 12's libasan takes no lock around fork; the child then hangs in LeakSanitizer): a child
 * ends here instead, with the status it passed to exit. */
static void child_end_before_teardown(void)
{
    if (getpid() != test_pid)
        _exit(child_status);
}

int main(int argc, char **argv)
{
    test_pid = getpid();
    atexit(child_end_before_teardown);
    setenv("CUDAEMU_TOTAL_MEM", "8G", 0);
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fork_held_lock),
        cmocka_unit_test(test_fork_churn),
        cmocka_unit_test(test_fork_clean_child),
        cmocka_unit_test(test_fork_parent_idle),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
