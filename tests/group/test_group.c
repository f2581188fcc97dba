/*
 * Memory groups (issue 37) through the public API, with real member processes: group_helper
 * started by fork+exec, all on one cudaemu device shared among the processes (CUDAEMU_SHARED,
 * 1 GiB). One process per test (the argument names it); each test uses its own share name, so
 * its device and its group table are its own, and both files are removed at exit.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/common/testutil.h"
#include "xseg.h"

#define MiB ((size_t)1 << 20)
#define GROUP "memory_group:tg,memory_group_wait_ms:5000"

struct member {
    pid_t pid;
    FILE *in, *out;
};

static char shm_names[2][128];

/* Start group_helper CONFIG (fork+exec) with pipes for its stdin and stdout. */
static struct member spawn(const char *config)
{
    int to[2], from[2];
    assert_int_equal(pipe(to), 0);
    assert_int_equal(pipe(from), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(to[0], 0);
        dup2(from[1], 1);
        close(to[1]);
        close(from[0]);
        execl(getenv("GROUP_HELPER"), "group_helper", config, (char *)NULL);
        _exit(127);
    }
    close(to[0]);
    close(from[1]);
    struct member m = {pid, fdopen(to[1], "w"), fdopen(from[0], "r")};
    setvbuf(m.in, NULL, _IOLBF, 0);
    return m;
}

/* Send one command; @return its answer line (static, newline removed). */
static const char *cmd(struct member *m, const char *fmt, ...)
{
    static char line[4096];
    va_list ap;
    va_start(ap, fmt);
    vfprintf(m->in, fmt, ap);
    va_end(ap);
    fputc('\n', m->in);
    fflush(m->in);
    if (!fgets(line, sizeof line, m->out))
        return "eof";
    line[strcspn(line, "\n")] = '\0';
    return line;
}

static void quit(struct member *m)
{
    assert_string_equal(cmd(m, "quit"), "eof");
    int status = 0;
    assert_int_equal(waitpid(m->pid, &status, 0), m->pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    fclose(m->in);
    fclose(m->out);
}

static void kill9(struct member *m)
{
    kill(m->pid, SIGKILL);
    int status = 0;
    assert_int_equal(waitpid(m->pid, &status, 0), m->pid); /* reaped: its pid is gone */
    fclose(m->in);
    fclose(m->out);
}

/* This test's file names in /dev/shm (the device UUID from the driver), removed at exit. */
static void shm_cleanup(void)
{
    for (int i = 0; i < 2; i++)
        if (shm_names[i][0])
            shm_unlink(shm_names[i]);
}

static void names_from_uuid(void)
{
    CUuuid u;
    assert_int_equal(drv->cuDeviceGetUuid(&u, 0), CUDA_SUCCESS);
    char hex[33];
    for (int i = 0; i < 16; i++)
        snprintf(hex + 2 * i, 3, "%02x", (unsigned char)u.bytes[i]);
    snprintf(shm_names[0], sizeof shm_names[0], "/cudaemu-%s", hex);
    snprintf(shm_names[1], sizeof shm_names[1], "/xseg-group-%s-tg", hex);
    atexit(shm_cleanup);
}

static void *must_malloc(size_t bytes)
{
    void *p = NULL;
    if (xseg_malloc(&p, bytes, 0, NULL) != XSEG_SUCCESS)
        fail_msg("xseg_malloc(%zu MiB): %s", bytes / MiB, xseg_last_error());
    return p;
}

static void start(const char *config)
{
    assert_int_equal(xseg_init(config), XSEG_SUCCESS);
    tu_require_gpu_or_skip();
    tu_require_emulator_or_skip();
    names_from_uuid();
}

/* cudaemu: another process's memory shows in cuMemGetInfo and refuses what does not fit; a
 * process killed with SIGKILL gives its memory back. */
static void test_emu_shared(void **state)
{
    (void)state;
    start("");
    size_t free0 = 0, total = 0;
    assert_int_equal(drv->cuMemGetInfo(&free0, &total), CUDA_SUCCESS);
    struct member m = spawn("");
    assert_string_equal(cmd(&m, "alloc 600 1"), "ok");
    size_t free1 = 0;
    assert_int_equal(drv->cuMemGetInfo(&free1, &total), CUDA_SUCCESS);
    assert_true(free1 + 600 * MiB <= free0);
    void *p = NULL;
    assert_int_equal(xseg_malloc(&p, 600 * MiB, 0, NULL), XSEG_ERROR_OUT_OF_MEMORY);
    kill9(&m);
    assert_int_equal(drv->cuMemGetInfo(&free1, &total), CUDA_SUCCESS);
    assert_int_equal(free1, free0);
    p = must_malloc(600 * MiB);
    xseg_free(p);
}

/* A malloc the device cannot serve gets the memory another member holds cached; the member's
 * live bytes stay intact; the figures show who gave and who asked. */
static void test_give_way(void **state)
{
    (void)state;
    start(GROUP);
    struct member m = spawn(GROUP);
    assert_string_equal(cmd(&m, "alloc 200 1"), "ok");
    assert_string_equal(cmd(&m, "alloc 400 2"), "ok");
    assert_string_equal(cmd(&m, "free 1"), "ok"); /* 400 MiB cached in the member */
    void *p = must_malloc(700 * MiB);
    assert_int_equal(tu_fill((CUdeviceptr)(uintptr_t)p, 700 * MiB, 9), CUDA_SUCCESS);
    assert_true(tu_check((CUdeviceptr)(uintptr_t)p, 700 * MiB, 9));
    assert_string_equal(cmd(&m, "check"), "ok");
    xseg_group_member mem[4];
    size_t n = 0;
    assert_int_equal(xseg_group_stats(0, mem, 4, &n), XSEG_SUCCESS);
    assert_int_equal(n, 2);
    const xseg_group_member *other = mem[0].pid == m.pid ? &mem[0] : &mem[1];
    const xseg_group_member *self = mem[0].pid == m.pid ? &mem[1] : &mem[0];
    assert_int_equal(other->pid, m.pid);
    assert_int_equal(self->pid, getpid());
    assert_true(other->gave_way_count >= 1);
    assert_true(other->gave_way_bytes >= 276 * MiB);
    assert_true(self->asked_count >= 1);
    xseg_free(p);
    quit(&m);
}

/* Live bytes are never given: the OOM names the group's cached and live bytes per member. */
static void test_oom_message(void **state)
{
    (void)state;
    start(GROUP);
    struct member m = spawn(GROUP);
    assert_string_equal(cmd(&m, "alloc 600 1"), "ok");
    void *p = NULL;
    assert_int_equal(xseg_malloc(&p, 700 * MiB, 0, NULL), XSEG_ERROR_OUT_OF_MEMORY);
    char pidstr[64];
    snprintf(pidstr, sizeof pidstr, "pid %d 0 bytes / 600.00 MiB", (int)m.pid);
    const char *msg = xseg_last_error();
    if (!strstr(msg, "Memory group 'tg'") || !strstr(msg, pidstr))
        fail_msg("message lacks the group's figures ('%s'): %s", pidstr, msg);
    assert_string_equal(cmd(&m, "check"), "ok");
    quit(&m);
}

/* A member killed with SIGKILL: its slot is reaped, nobody waits for it, its memory is back. */
static void test_dead_member(void **state)
{
    (void)state;
    start(GROUP);
    struct member m = spawn(GROUP);
    assert_string_equal(cmd(&m, "alloc 600 1"), "ok");
    xseg_group_member mem[4];
    size_t n = 0;
    void *q = must_malloc(2 * MiB); /* joins (the device is created) */
    assert_int_equal(xseg_group_stats(0, mem, 4, &n), XSEG_SUCCESS);
    assert_int_equal(n, 2);
    kill9(&m);
    assert_int_equal(xseg_group_stats(0, mem, 4, &n), XSEG_SUCCESS);
    assert_int_equal(n, 1);
    assert_int_equal(mem[0].pid, getpid());
    void *p = must_malloc(900 * MiB);
    /* A new member takes a slot again. */
    struct member m2 = spawn(GROUP);
    assert_string_equal(cmd(&m2, "alloc 20 3"), "ok");
    assert_int_equal(xseg_group_stats(0, mem, 4, &n), XSEG_SUCCESS);
    assert_int_equal(n, 2);
    quit(&m2);
    xseg_free(p);
    xseg_free(q);
}

/* A member that never answers (stopped): the asker waits memory_group_wait_ms, then reports
 * the OOM; the member, continued, still answers later requests. */
static void test_stopped_member(void **state)
{
    (void)state;
    start("memory_group:tg,memory_group_wait_ms:200");
    struct member m = spawn("memory_group:tg,memory_group_wait_ms:200");
    assert_string_equal(cmd(&m, "alloc 600 1"), "ok");
    assert_string_equal(cmd(&m, "free 0"), "ok");
    kill(m.pid, SIGSTOP);
    /* Stopped before we ask: a kill returns before the signal has stopped a running member,
     * whose responder could still answer (seen on a loaded machine). */
    int status = 0;
    assert_int_equal(waitpid(m.pid, &status, WUNTRACED), m.pid);
    assert_true(WIFSTOPPED(status));
    void *p = NULL;
    assert_int_equal(xseg_malloc(&p, 700 * MiB, 0, NULL), XSEG_ERROR_OUT_OF_MEMORY);
    kill(m.pid, SIGCONT);
    p = must_malloc(700 * MiB);
    xseg_free(p);
    quit(&m);
}

/* A hostile table (garbage of the right size and mode, or a bad slot): a clear error, and the
 * process goes on alone with a working allocator. */
static void hostile(int kind)
{
    start(GROUP);
    /* A real table first (a member creates it): its size is what a joiner checks. */
    struct member m = spawn(GROUP);
    assert_string_equal(cmd(&m, "alloc 20 1"), "ok");
    struct stat st;
    int fd = shm_open(shm_names[1], O_RDWR, 0);
    assert_true(fd >= 0);
    assert_int_equal(fstat(fd, &st), 0);
    close(fd);
    if (kind == 0) {
        /* Garbage of the right size and mode in its place. */
        kill9(&m);
        shm_unlink(shm_names[1]);
        fd = shm_open(shm_names[1], O_RDWR | O_CREAT | O_EXCL, 0600);
        assert_true(fd >= 0);
        for (off_t i = 0; i < st.st_size; i++) {
            unsigned char c = (unsigned char)(i * 131 + 7);
            assert_int_equal(write(fd, &c, 1), 1);
        }
        close(fd);
    } else {
        /* One slot's field made impossible. */
        fd = shm_open(shm_names[1], O_RDWR, 0);
        unsigned char *t = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        /* The last slot's reserved bytes (at byte 32 of an 88-byte slot) set to 2^62. */
        size_t slot = (size_t)st.st_size - 88;
        uint64_t big = (uint64_t)1 << 62;
        memcpy(t + slot + 32, &big, 8);
        munmap(t, (size_t)st.st_size);
        xseg_group_member mem[4];
        size_t n = 0;
        const char *name = shm_names[1] + 1;
        assert_int_equal(xseg_group_read(name, mem, 4, &n), XSEG_ERROR_INVALID_VALUE);
        if (!strstr(xseg_last_error(), "slot 63: its reserved bytes are out of range"))
            fail_msg("%s", xseg_last_error());
        kill9(&m);
    }
    void *p = must_malloc(100 * MiB);
    xseg_group_member mem[4];
    size_t n = 5;
    assert_int_equal(xseg_group_stats(0, mem, 4, &n), XSEG_ERROR_ILLEGAL_STATE);
    if (!strstr(xseg_last_error(), "is corrupted") || !strstr(xseg_last_error(), "goes on alone"))
        fail_msg("%s", xseg_last_error());
    assert_int_equal(n, 0);
    xseg_free(p);
    p = must_malloc(900 * MiB);
    xseg_free(p);
}

static void test_hostile_garbage(void **state) { (void)state; hostile(0); }
static void test_hostile_slot(void **state) { (void)state; hostile(1); }

/* xseg-top lists the group and its members (--once, --json); a bad option is one line. */
static void test_top(void **state)
{
    (void)state;
    start(GROUP);
    struct member m = spawn(GROUP);
    assert_string_equal(cmd(&m, "alloc 100 1"), "ok");
    void *p = must_malloc(40 * MiB);
    /* Members republish every 100 ms: wait (up to 10 s) until the member's 100 MiB shows. */
    for (int tries = 0; tries < 1000; tries++) {
        xseg_group_member mem[4];
        size_t n = 0;
        assert_int_equal(xseg_group_stats(0, mem, 4, &n), XSEG_SUCCESS);
        bool seen = false;
        for (size_t i = 0; i < n && i < 4; i++)
            seen = seen || (mem[i].pid == m.pid && mem[i].allocated_bytes == 100 * MiB);
        if (seen)
            break;
        usleep(10000);
    }
    char command[1024], out[65536];
    for (int json = 0; json < 2; json++) {
        snprintf(command, sizeof command, "%s --once%s", getenv("XSEG_TOP"), json ? " --json" : "");
        FILE *f = popen(command, "r");
        assert_non_null(f);
        size_t n = fread(out, 1, sizeof out - 1, f);
        out[n] = '\0';
        assert_int_equal(pclose(f), 0);
        char want[96];
        if (json)
            snprintf(want, sizeof want, "{\"pid\": %d, \"reserved_bytes\": %zu, \"allocated_bytes\": %zu",
                     (int)m.pid, 100 * MiB, 100 * MiB);
        else
            snprintf(want, sizeof want, "%8d      100.0      100.0", (int)m.pid);
        if (!strstr(out, want) || !strstr(out, shm_names[1] + 1 + 44))
            fail_msg("xseg-top%s lacks '%s':\n%s", json ? " --json" : "", want, out);
        snprintf(want, sizeof want, json ? "{\"pid\": %d," : "%8d ", (int)getpid());
        if (!strstr(out, want))
            fail_msg("xseg-top lacks this process: %s", out);
    }
    snprintf(command, sizeof command, "%s --bogus 2>&1", getenv("XSEG_TOP"));
    FILE *f = popen(command, "r");
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = '\0';
    assert_int_equal(WEXITSTATUS(pclose(f)), 2);
    assert_string_equal(out, "xseg-top: unknown option '--bogus' (try --help)\n");
    xseg_free(p);
    quit(&m);
}

/* Arguments checked; a name that is no table refused by name. */
static void test_read_errors(void **state)
{
    (void)state;
    size_t n = 0;
    assert_int_equal(xseg_group_read(NULL, NULL, 0, &n), XSEG_ERROR_INVALID_VALUE);
    assert_int_equal(xseg_group_read("../etc/passwd", NULL, 0, &n), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "is not a memory group table name"));
    assert_int_equal(xseg_group_read("xseg-group-none", NULL, 0, &n), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "cannot open"));
    assert_int_equal(xseg_group_stats(0, NULL, 1, &n), XSEG_ERROR_INVALID_VALUE);
    assert_int_equal(xseg_group_stats(0, NULL, 0, &n), XSEG_ERROR_ILLEGAL_STATE);
    assert_int_equal(xseg_init("memory_group:a/b"), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "memory_group"));
    assert_int_equal(xseg_init("memory_group_wait_ms:60001"), XSEG_ERROR_INVALID_VALUE);
}

int main(int argc, char **argv)
{
    char share[64];
    snprintf(share, sizeof share, "xg%d", (int)getpid());
    setenv("CUDAEMU_SHARED", share, 1);
    setenv("CUDAEMU_TOTAL_MEM", "1G", 1);
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_emu_shared),   cmocka_unit_test(test_give_way),
        cmocka_unit_test(test_oom_message),  cmocka_unit_test(test_dead_member),
        cmocka_unit_test(test_stopped_member), cmocka_unit_test(test_hostile_garbage),
        cmocka_unit_test(test_hostile_slot), cmocka_unit_test(test_read_errors),
        cmocka_unit_test(test_top),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
