/*
 * Memory groups (issue 37) through the public API, with real member processes: group_helper
 * started by fork+exec, all on one cudaemu device shared among the processes (CUDAEMU_SHARED,
 * 1 GiB). One process per test (the argument names it); each test uses its own share name, so
 * its device and its group table are its own, and both files are removed at exit.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/common/testutil.h"
#include "xseg.h"

#define MiB ((size_t)1 << 20)
#define GROUP "memory_group:tg,memory_group_wait_ms:5000"
/* The table's layout (core/services/group.c, version 3): 64 slots of SLOT bytes at its end. */
#define SLOT 128

struct member {
    pid_t pid;
    FILE *in, *out;
};

static char shm_names[3][128];
static pid_t kids[2]; /* test_pid_reuse's idle processes, killed at exit whatever happens */
/* Members started and not yet reaped: killed at exit, so a failed assertion never leaves one
 * behind (a stopped one holds the test's output pipes, and meson waits on them until timeout). */
static pid_t spawned[16];

static void reap_spawned(void)
{
    for (size_t i = 0; i < sizeof spawned / sizeof spawned[0]; i++)
        if (spawned[i] > 0) {
            kill(spawned[i], SIGKILL);
            waitpid(spawned[i], NULL, 0);
            spawned[i] = 0;
        }
}

static void forget(pid_t pid)
{
    for (size_t i = 0; i < sizeof spawned / sizeof spawned[0]; i++)
        if (spawned[i] == pid)
            spawned[i] = 0;
}

/* Start group_helper CONFIG (fork+exec) with pipes for its stdin and stdout; its stderr to
 * @p err when not NULL; as user @p pw when not NULL (dropping root's groups and ids first). */
static struct member spawn_as(const char *config, const char *err, const struct passwd *pw)
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
        if (err) {
            int fd = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0600);
            if (fd < 0 || dup2(fd, 2) < 0)
                _exit(126);
            close(fd);
        }
        if (pw && (setgroups(0, NULL) || setgid(pw->pw_gid) || setuid(pw->pw_uid)))
            _exit(125);
        execl(getenv("GROUP_HELPER"), "group_helper", config, (char *)NULL);
        _exit(127);
    }
    close(to[0]);
    close(from[1]);
    for (size_t i = 0; i < sizeof spawned / sizeof spawned[0]; i++)
        if (!spawned[i]) {
            spawned[i] = pid;
            break;
        }
    struct member m = {pid, fdopen(to[1], "w"), fdopen(from[0], "r")};
    setvbuf(m.in, NULL, _IOLBF, 0);
    return m;
}

static struct member spawn(const char *config) { return spawn_as(config, NULL, NULL); }

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
    forget(m->pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    fclose(m->in);
    fclose(m->out);
}

static void kill9(struct member *m)
{
    kill(m->pid, SIGKILL);
    int status = 0;
    assert_int_equal(waitpid(m->pid, &status, 0), m->pid); /* reaped: its pid is gone */
    forget(m->pid);
    fclose(m->in);
    fclose(m->out);
}

/* This test's file names in /dev/shm (the device UUID from the driver), removed at exit. */
static void shm_cleanup(void)
{
    for (int i = 0; i < 2; i++)
        if (kids[i] > 0)
            kill(kids[i], SIGKILL);
    for (int i = 0; i < 3; i++)
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
    snprintf(shm_names[2], sizeof shm_names[2], "/xseg-group-%s-tu", hex);
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

/* A request that is not a whole number of pages (30 MiB against expandable 20 MiB pages) on a
 * device nearly all cached by a member: the member gives what the device lacks, and the growth
 * after the give-way maps only that (before, it mapped whole pages, 40 MiB, and failed: the
 * staggered bursts of docs/benchmarks.md#memory-groups counted 22 OOMs so). */
static void test_give_way_steps(void **state)
{
    (void)state;
    start(GROUP);
    struct member m = spawn(GROUP);
    assert_string_equal(cmd(&m, "alloc 1000 1"), "ok");
    assert_string_equal(cmd(&m, "free 0"), "ok"); /* 1000 MiB cached of the device's 1 GiB */
    void *p[3];
    for (int i = 0; i < 3; i++) {
        if (xseg_malloc(&p[i], 30 * MiB, 0, NULL) != XSEG_SUCCESS)
            fail_msg("30 MiB malloc %d beside 1000 MiB cached in a member: %s", i, xseg_last_error());
        assert_int_equal(tu_fill((CUdeviceptr)(uintptr_t)p[i], 30 * MiB, 20 + (uint32_t)i), CUDA_SUCCESS);
    }
    for (int i = 0; i < 3; i++) {
        assert_true(tu_check((CUdeviceptr)(uintptr_t)p[i], 30 * MiB, 20 + (uint32_t)i));
        xseg_free(p[i]);
    }
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

/* The member's gave_way_count in this process's view of the group. */
static uint64_t gave_count(pid_t pid)
{
    xseg_group_member mem[4];
    size_t n = 0;
    assert_int_equal(xseg_group_stats(0, mem, 4, &n), XSEG_SUCCESS);
    for (size_t i = 0; i < n && i < 4; i++)
        if (mem[i].pid == pid)
            return mem[i].gave_way_count;
    fail_msg("pid %d is not in the group", (int)pid);
    return 0;
}

/* A member that never answers (stopped): the asker waits memory_group_wait_ms, then reports
 * the OOM; the member, continued, answers the request it missed and later ones. */
static void test_stopped_member(void **state)
{
    (void)state;
    start("memory_group:tg,memory_group_wait_ms:200");
    struct member m = spawn("memory_group:tg,memory_group_wait_ms:200");
    assert_string_equal(cmd(&m, "alloc 600 1"), "ok");
    assert_string_equal(cmd(&m, "free 0"), "ok");
    /* kill() only queues SIGSTOP: until the member's threads have all stopped, its responder
     * may still run and answer. WUNTRACED returns once the whole process has stopped. */
    kill(m.pid, SIGSTOP);
    int status = 0;
    assert_int_equal(waitpid(m.pid, &status, WUNTRACED), m.pid);
    assert_true(WIFSTOPPED(status));
    void *p = NULL;
    xseg_status st = xseg_malloc(&p, 700 * MiB, 0, NULL);
    kill(m.pid, SIGCONT); /* before any assertion: a failure must not leave it stopped */
    assert_int_equal(st, XSEG_ERROR_OUT_OF_MEMORY);
    /* Continued, it answers the missed request (wait up to 10 s, however loaded the machine). */
    for (int tries = 0; tries < 1000 && gave_count(m.pid) == 0; tries++)
        usleep(10000);
    p = must_malloc(700 * MiB);
    assert_true(gave_count(m.pid) >= 1);
    xseg_free(p);
    quit(&m);
}

/* Two askers at once: one holds the table for its whole wait (its member is stopped), so the
 * other's ask cannot take the lock in its shorter wait. That ask fails, and its process stays
 * in the group: it is served by the next give-way. */
static void test_concurrent_askers(void **state)
{
    (void)state;
    start("memory_group:tg,memory_group_wait_ms:200");
    xseg_free(must_malloc(MiB)); /* joined before the table gets busy */
    struct member m = spawn(GROUP);
    struct member a = spawn("memory_group:tg,memory_group_wait_ms:3000");
    assert_string_equal(cmd(&m, "alloc 600 1"), "ok");
    assert_string_equal(cmd(&m, "free 0"), "ok");
    kill(m.pid, SIGSTOP);
    int status = 0;
    assert_int_equal(waitpid(m.pid, &status, WUNTRACED), m.pid);
    fprintf(a.in, "alloc 700 2\n"); /* asks the stopped member, holding the table up to 3 s */
    fflush(a.in);
    usleep(300000);
    void *p = NULL;
    xseg_status st = xseg_malloc(&p, 700 * MiB, 0, NULL);
    char err[512];
    snprintf(err, sizeof err, "%s", xseg_last_error());
    kill(m.pid, SIGCONT);
    assert_int_equal(st, XSEG_ERROR_OUT_OF_MEMORY);
    if (strstr(err, "alone"))
        fail_msg("the ask that found the table busy left the group: %s", err);
    char line[256];
    assert_non_null(fgets(line, sizeof line, a.out)); /* the member, continued, served it */
    xseg_group_member mem[4];
    size_t n = 0;
    if (xseg_group_stats(0, mem, 4, &n) != XSEG_SUCCESS)
        fail_msg("not in the group any more: %s", xseg_last_error());
    assert_int_equal(n, 3);
    assert_string_equal(cmd(&a, "free 0"), "ok"); /* 700 MiB cached in a: given way on asking */
    p = must_malloc(700 * MiB);
    xseg_free(p);
    quit(&a);
    quit(&m);
}

/* The group's members as the table lists them (this process need not be one). */
static size_t table_members(xseg_group_member *mem, size_t cap)
{
    size_t n = 0;
    if (xseg_group_read(shm_names[1] + 1, mem, cap, &n) != XSEG_SUCCESS)
        fail_msg("%s", xseg_last_error());
    return n;
}

/* The asked_count @p pid publishes (0 while it is no member yet). */
static uint64_t asked_count(pid_t pid)
{
    xseg_group_member mem[8];
    size_t n = table_members(mem, 8);
    for (size_t i = 0; i < n && i < 8; i++)
        if (mem[i].pid == pid)
            return mem[i].asked_count;
    return 0;
}

/* The late joiners' set-up: member *m holds 600 MiB cached and is stopped; *a asks it
 * (memory_group_wait_ms 30 s), holding the table's lock until *m answers; *late starts meanwhile:
 * its join waits 1 s for the lock and goes on alone for now, and a growth while the lock is still
 * held leaves it so (a try, no wait). *m continued and *a's answer read: the lock is free again. */
static void late_pending(struct member *m, struct member *a, struct member *late)
{
    *m = spawn(GROUP);
    *a = spawn("memory_group:tg,memory_group_wait_ms:30000");
    assert_string_equal(cmd(m, "alloc 600 1"), "ok");
    assert_string_equal(cmd(m, "free 0"), "ok");
    kill(m->pid, SIGSTOP);
    int status = 0;
    assert_int_equal(waitpid(m->pid, &status, WUNTRACED), m->pid);
    fprintf(a->in, "alloc 700 2\n");
    fflush(a->in);
    for (int tries = 0; tries < 1000 && asked_count(a->pid) == 0; tries++)
        usleep(10000); /* a counts its ask once it holds the lock */
    *late = spawn(GROUP);
    const char *r1 = cmd(late, "alloc 2 3");
    const char *g1 = r1[0] == 'o' && r1[1] == 'k' ? cmd(late, "group") : r1;
    char first[512], second[512];
    snprintf(first, sizeof first, "%s", g1);
    size_t k = (size_t)snprintf(second, sizeof second, "%s / ", cmd(late, "alloc 64 4"));
    snprintf(second + k, sizeof second - k, "%s", cmd(late, "group"));
    kill(m->pid, SIGCONT); /* before any assertion: a failure must not leave it stopped */
    if (strncmp(first, "error ", 6) || !strstr(first, "goes on alone for now and tries to join again at its "
                                                       "next growth"))
        fail_msg("a join that found the lock busy should say it retries: %s", first);
    if (strncmp(second, "ok / error ", 11) || !strstr(second, "tries to join again"))
        fail_msg("a growth while the lock is busy should leave it alone, to retry: %s", second);
    /* The ask is over (served, or not where late's growths took the room it asked for). */
    char line[4096];
    assert_non_null(fgets(line, sizeof line, a->out));
}

/* A process that started while a member's long ask held the table's lock joins at its first
 * growth after the ask, and is then a member like any: its cache gives way to an ask. */
static void test_late_joiner(void **state)
{
    (void)state;
    start("memory_group:tg,memory_group_wait_ms:200");
    xseg_free(must_malloc(MiB)); /* joined before the table gets busy */
    struct member m, a, late;
    late_pending(&m, &a, &late);
    quit(&a);
    assert_string_equal(cmd(&late, "alloc 64 5"), "ok"); /* a growth: joins */
    const char *g3 = cmd(&late, "group");
    if (strncmp(g3, "asked 0 ", 8))
        fail_msg("the late process should be a member after its next growth: %s", g3);
    xseg_group_member mem[8];
    size_t n = 0;
    assert_int_equal(xseg_group_stats(0, mem, 8, &n), XSEG_SUCCESS);
    assert_int_equal(n, 3);
    /* Its cache (148 MiB) gives way to our ask. */
    assert_string_equal(cmd(&m, "trim"), "ok");
    assert_string_equal(cmd(&late, "free 1"), "ok");
    assert_string_equal(cmd(&late, "free 2"), "ok");
    void *p = must_malloc(900 * MiB);
    assert_true(gave_count(late.pid) >= 1);
    xseg_free(p);
    assert_string_equal(cmd(&late, "check"), "ok");
    quit(&late);
    quit(&m);
}

/* The members leave while the late process waits to join (it holds no slot, so the last one out
 * removes the table) and a new process creates the group again: the late process's next growth
 * joins the new table, not the removed one it had mapped. */
static void test_late_joiner_new_table(void **state)
{
    (void)state;
    start(""); /* this process is no member: the table goes with the last one */
    struct member m, a, late;
    late_pending(&m, &a, &late);
    quit(&a);
    quit(&m);
    int fd = shm_open(shm_names[1], O_RDONLY, 0);
    if (fd >= 0)
        close(fd);
    assert_true(fd < 0); /* removed */
    struct member n2 = spawn(GROUP);
    assert_string_equal(cmd(&n2, "alloc 2 1"), "ok"); /* creates the table again */
    assert_string_equal(cmd(&late, "alloc 64 5"), "ok"); /* a growth: joins */
    xseg_group_member mem[8];
    size_t n = table_members(mem, 8);
    if (n != 2 || !((mem[0].pid == late.pid && mem[1].pid == n2.pid) || (mem[0].pid == n2.pid && mem[1].pid == late.pid)))
        fail_msg("the new table should list the new process and the late one: %zu member(s), the first pid %d",
                 n, n ? (int)mem[0].pid : 0);
    quit(&late);
    quit(&n2);
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
        /* The last slot's reserved bytes (at byte 32 of a slot) set to 2^62. */
        size_t slot = (size_t)st.st_size - SLOT;
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

/* A table file truncated by another process of this user (issue 53: every member and xseg-top
 * died of SIGBUS): xseg_group_read, racing a process that shrinks and restores a copy of the
 * table, answers or names what is wrong; then the real table shrunk under two members: both live
 * on alone, naming the truncation, and allocate. */
static void test_truncated(void **state)
{
    (void)state;
    start(GROUP);
    void *q = must_malloc(2 * MiB); /* joins */
    struct member m = spawn(GROUP);
    assert_string_equal(cmd(&m, "alloc 20 1"), "ok");
    int fd = shm_open(shm_names[1], O_RDWR, 0);
    assert_true(fd >= 0);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    unsigned char *copy = malloc((size_t)st.st_size);
    assert_non_null(copy);
    assert_int_equal(pread(fd, copy, (size_t)st.st_size, 0), st.st_size);
    /* The copy as "tu", shrunk and restored (its bytes rewritten) by a child while we read it. */
    int cf = shm_open(shm_names[2], O_RDWR | O_CREAT | O_EXCL, 0600);
    assert_true(cf >= 0);
    assert_int_equal(pwrite(cf, copy, (size_t)st.st_size, 0), st.st_size);
    pid_t shrinker = fork();
    assert_true(shrinker >= 0);
    if (!shrinker) {
        for (;;) {
            if (ftruncate(cf, 100) || pwrite(cf, copy, (size_t)st.st_size, 0) != st.st_size)
                _exit(1);
        }
    }
    kids[0] = shrinker;
    size_t answered = 0, refused = 0;
    for (int i = 0; i < 3000; i++) {
        xseg_group_member mem[4];
        size_t n = 0;
        xseg_status r = xseg_group_read(shm_names[2] + 1, mem, 4, &n);
        if (r == XSEG_SUCCESS)
            answered++;
        else if (r == XSEG_ERROR_INVALID_VALUE && strstr(xseg_last_error(), shm_names[2]))
            refused++;
        else
            fail_msg("xseg_group_read: %d %s", (int)r, xseg_last_error());
    }
    kill(shrinker, SIGKILL);
    waitpid(shrinker, NULL, 0);
    kids[0] = 0;
    close(cf);
    free(copy);
    assert_int_equal(answered + refused, 3000);
    /* The real table shrunk under both members. */
    assert_int_equal(ftruncate(fd, 0), 0);
    close(fd);
    nanosleep(&(struct timespec){0, 300000000}, NULL); /* a few of the responders' rounds */
    assert_string_equal(cmd(&m, "alloc 20 2"), "ok"); /* alive */
    const char *g = cmd(&m, "group");
    if (strncmp(g, "error ", 6) || !strstr(g, "truncated"))
        fail_msg("the member does not name the truncation: %s", g);
    assert_string_equal(cmd(&m, "check"), "ok");
    xseg_group_member mem[4];
    size_t n = 0;
    assert_int_equal(xseg_group_stats(0, mem, 4, &n), XSEG_ERROR_ILLEGAL_STATE);
    if (!strstr(xseg_last_error(), "truncated") || !strstr(xseg_last_error(), "goes on alone"))
        fail_msg("%s", xseg_last_error());
    assert_int_equal(xseg_group_read(shm_names[1] + 1, mem, 4, &n), XSEG_ERROR_INVALID_VALUE);
    void *p = must_malloc(100 * MiB);
    xseg_free(p);
    xseg_free(q);
    quit(&m);
    /* The responder ended when the table went bad; xseg_shutdown joins it (TSan: no thread left
     * unjoined at exit). */
    assert_int_equal(xseg_shutdown(), XSEG_SUCCESS);
}

/* ---- test_bus_signal: the SIGBUS guard forwards what is not a table's fault ----
 * Each case runs in a child forked before this process touches the driver, as its own member of
 * its own group ("tb0".."tb3"), and writes one letter a step done to a pipe, so the parent tells
 * where it ended. */
static volatile sig_atomic_t bus_calls, bus_code;
static sigjmp_buf bus_jump;
static volatile sig_atomic_t bus_jump_armed;

static void bus_user(int sig, siginfo_t *si, void *uc)
{
    (void)sig, (void)uc;
    bus_calls++;
    bus_code = si->si_code;
    if (bus_jump_armed) {
        bus_jump_armed = 0;
        siglongjmp(bus_jump, 1);
    }
}

static void bus_install_user(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = bus_user;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, NULL);
}

/* The first address of this process's mapping of @p name (a /dev/shm file), 0 if none. */
static uintptr_t mapping_of(const char *name)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    uintptr_t at = 0;
    while (f && !at && fgets(line, sizeof line, f)) {
        size_t n = strcspn(line, "\n");
        line[n] = '\0';
        size_t k = strlen(name);
        if (n >= k && !strcmp(line + n - k, name))
            at = (uintptr_t)strtoull(line, NULL, 16);
    }
    if (f)
        fclose(f);
    return at;
}

static void step(int fd, char c) { (void)!write(fd, &c, 1); }

/* Child: join group tb<mode>, then what the mode tests. Exit 0 when every step held (or it is
 * ended by the SIGBUS the mode expects); 77 without a device; other codes name the failed step. */
static int bus_child(int mode, int out)
{
    if (mode == 1)
        signal(SIGBUS, SIG_IGN);
    if (mode == 2)
        bus_install_user(); /* before xseg */
    char cfg[96];
    snprintf(cfg, sizeof cfg, "memory_group:tb%d,memory_group_wait_ms:5000", mode);
    if (xseg_init(cfg) != XSEG_SUCCESS)
        return 10;
    if (!tu_gpu_available() || !tu_emulated())
        return 77;
    void *p = NULL;
    if (xseg_malloc(&p, 2 * MiB, 0, NULL) != XSEG_SUCCESS) /* joins: the guard is installed */
        return 11;
    CUuuid u;
    if (drv->cuDeviceGetUuid(&u, 0) != CUDA_SUCCESS)
        return 12;
    char name[128];
    int k = snprintf(name, sizeof name, "/dev/shm/xseg-group-");
    for (int i = 0; i < 16; i++)
        k += snprintf(name + k, sizeof name - (size_t)k, "%02x", (unsigned char)u.bytes[i]);
    snprintf(name + k, sizeof name - (size_t)k, "-tb%d", mode);
    if (mode == 3)
        bus_install_user(); /* after xseg: over the guard */
    step(out, 'j');
    /* A SIGBUS a process sends: the disposition in force without xseg. */
    kill(getpid(), SIGBUS);
    if (mode == 0)
        return 20; /* the default action ends the process at the kill */
    if ((mode >= 2) != (bus_calls == 1) || (mode >= 2 && bus_code != SI_USER))
        return 21;
    union sigval v = {.sival_int = 7};
    sigqueue(getpid(), SIGBUS, v);
    if ((mode >= 2) != (bus_calls == 2) || (mode >= 2 && bus_code != SI_QUEUE))
        return 22;
    step(out, 'k');
    if (mode == 3)
        return 0; /* the user's handler is in force: the guard's part ends here */
    /* The guard still covers the table: shrink its file and read the mapping, as a member reading
     * in the instant after its size check. */
    uintptr_t t = mapping_of(name);
    int fd = open(name, O_RDWR);
    if (!t || fd < 0 || ftruncate(fd, 0))
        return 30;
    close(fd);
    volatile unsigned char got = *(volatile unsigned char *)t; /* zero pages now, not a fault */
    (void)got;
    if (mode == 2 && bus_calls != 2)
        return 31;
    step(out, 't');
    /* The member goes on alone, naming the truncation, and allocates. */
    xseg_group_member mem[4];
    size_t n = 0;
    xseg_status st = XSEG_SUCCESS;
    for (int i = 0; i < 100 && (st = xseg_group_stats(0, mem, 4, &n)) == XSEG_SUCCESS; i++)
        nanosleep(&(struct timespec){0, 30000000}, NULL);
    if (st != XSEG_ERROR_ILLEGAL_STATE || !strstr(xseg_last_error(), "truncated"))
        return 32;
    void *q = NULL;
    if (xseg_malloc(&q, 4 * MiB, 0, NULL) != XSEG_SUCCESS)
        return 33;
    xseg_free(q);
    xseg_free(p);
    step(out, 'a');
    /* A fault of the program's own outside the tables: its handler, or the default action (an
     * ignored fault ends the process, as the kernel does). */
    char path[] = "/tmp/xseg-bus-XXXXXX";
    int ff = mkstemp(path);
    if (ff < 0 || ftruncate(ff, 4096))
        return 40;
    volatile unsigned char *m = mmap(NULL, 4096, PROT_READ, MAP_SHARED, ff, 0);
    unlink(path);
    if (m == MAP_FAILED || ftruncate(ff, 0))
        return 41;
    step(out, 'f');
    if (mode == 2) {
        bus_jump_armed = 1;
        if (!sigsetjmp(bus_jump, 1))
            got = m[0];
        if (bus_calls != 3 || bus_code != BUS_ADRERR)
            return 42;
        return xseg_shutdown() == XSEG_SUCCESS ? 0 : 43;
    }
    got = m[0]; /* mode 1: ends the process by SIGBUS */
    return 44;
}

/* A SIGBUS sent to a member (kill, sigqueue) gets the process's own disposition: with none, the
 * process dies of SIGBUS (before, the guard swallowed it and gave up guarding the tables); ignored,
 * it is ignored and a later truncation of the table is still caught; a handler installed before
 * xseg runs for it (and for the program's own faults) and a truncation is still caught; a handler
 * installed after xseg runs for it. */
static void test_bus_signal(void **state)
{
    (void)state;
    /* mode: what ends it (exit code or signal) and the steps it must have written. */
    static const struct {
        int exit_code, sig;
        const char *steps;
    } want[4] = {{0, SIGBUS, "j"}, {0, SIGBUS, "jktaf"}, {0, 0, "jktaf"}, {0, 0, "jk"}};
    for (int mode = 0; mode < 4; mode++) {
        int pfd[2];
        assert_int_equal(pipe(pfd), 0);
        fflush(NULL);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (!pid) {
            close(pfd[0]);
            struct rlimit nocore = {0, 0};
            setrlimit(RLIMIT_CORE, &nocore);
            signal(SIGBUS, SIG_DFL); /* a sanitizer's handler would turn the death into an exit */
            _exit(bus_child(mode, pfd[1]));
        }
        close(pfd[1]);
        char steps[16] = {0};
        size_t ns = 0;
        for (ssize_t r; ns < sizeof steps - 1 && (r = read(pfd[0], steps + ns, sizeof steps - 1 - ns)) != 0;) {
            if (r < 0 && errno != EINTR)
                break;
            ns += r > 0 ? (size_t)r : 0;
        }
        close(pfd[0]);
        int status = 0;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        if (WIFEXITED(status) && WEXITSTATUS(status) == 77)
            skip();
        print_message("mode %d: steps '%s', %s %d\n", mode, steps, WIFSIGNALED(status) ? "signal" : "exit",
                      WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
        if (want[mode].sig) {
            if (!WIFSIGNALED(status) || WTERMSIG(status) != want[mode].sig)
                fail_msg("mode %d: not ended by signal %d after steps '%s' (%s %d)", mode, want[mode].sig, steps,
                         WIFSIGNALED(status) ? "signal" : "exit",
                         WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
        } else if (!WIFEXITED(status) || WEXITSTATUS(status) != want[mode].exit_code) {
            fail_msg("mode %d: after steps '%s': %s %d", mode, steps, WIFSIGNALED(status) ? "signal" : "exit",
                     WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
        }
        assert_string_equal(steps, want[mode].steps);
    }
    /* The tables the children left (one died in each of two cases). */
    start(GROUP);
    for (int mode = 0; mode < 4; mode++) {
        char name[160];
        snprintf(name, sizeof name, "%.*stb%d", (int)(strlen(shm_names[1]) - 2), shm_names[1], mode);
        shm_unlink(name);
    }
    assert_int_equal(xseg_shutdown(), XSEG_SUCCESS);
}

/* A member whose answer takes longer than memory_group_wait_ms (its cuMemUnmap busy-waits 600 ms:
 * a responder a busy host is slow to run) is waited for while it answers: the asker's malloc gets
 * its cache (issue 53: it gave up at 500 ms with the cache still there). A stopped member is not
 * waited for past 500 ms: that ask counts in ask_timeouts. */
static void test_slow_responder(void **state)
{
    (void)state;
    const char *cfg = "memory_group:tg,memory_group_wait_ms:500";
    start(cfg);
    void *q = must_malloc(2 * MiB); /* joins */
    setenv("CUDAEMU_LATENCY", "cuMemUnmap:600ms", 1);
    struct member m = spawn(cfg);
    unsetenv("CUDAEMU_LATENCY");
    assert_string_equal(cmd(&m, "alloc 600 1"), "ok");
    assert_string_equal(cmd(&m, "free 0"), "ok"); /* 600 MiB cached there */
    void *p = NULL;
    if (xseg_malloc(&p, 600 * MiB, 0, NULL) != XSEG_SUCCESS)
        fail_msg("the member answering slowly was not waited for: %s", xseg_last_error());
    xseg_group_member mem[4];
    size_t n = 0;
    assert_int_equal(xseg_group_stats(0, mem, 4, &n), XSEG_SUCCESS);
    for (size_t i = 0; i < n; i++)
        if (mem[i].pid == getpid())
            assert_int_equal(mem[i].ask_timeouts, 0);
    /* Stopped with its cache (about 400 MiB): the next ask times out, counted. */
    assert_string_equal(cmd(&m, "alloc 300 2"), "ok");
    assert_string_equal(cmd(&m, "free 1"), "ok");
    kill(m.pid, SIGSTOP);
    void *r = NULL;
    assert_int_equal(xseg_malloc(&r, 300 * MiB, 0, NULL), XSEG_ERROR_OUT_OF_MEMORY);
    kill(m.pid, SIGCONT);
    assert_int_equal(xseg_group_stats(0, mem, 4, &n), XSEG_SUCCESS);
    bool seen = false;
    for (size_t i = 0; i < n; i++)
        if (mem[i].pid == getpid()) {
            assert_int_equal(mem[i].ask_timeouts, 1);
            seen = true;
        }
    assert_true(seen);
    assert_string_equal(cmd(&m, "check"), "ok");
    xseg_free(p);
    xseg_free(q);
    kill9(&m); /* no shutdown: its unmaps would busy-wait 600 ms each */
}

/* ---- budgets (memory_budget_mb, memory_group_budget_mb) ------------------------------------ */

static void expect_oom(size_t bytes, const char *want1, const char *want2)
{
    void *p = NULL;
    assert_int_equal(xseg_malloc(&p, bytes, 0, NULL), XSEG_ERROR_OUT_OF_MEMORY);
    const char *msg = xseg_last_error();
    if (!strstr(msg, want1) || (want2 && !strstr(msg, want2)))
        fail_msg("the OOM message lacks '%s' / '%s': %s", want1, want2 ? want2 : "", msg);
}

/* A growth past memory_budget_mb fails naming the budget, xseg's bytes and the foreign bytes,
 * on a device with room; what fits within it is served. */
static void test_budget_refuses(void **state)
{
    (void)state;
    start("memory_budget_mb:512");
    void *a = must_malloc(300 * MiB);
    expect_oom(300 * MiB, "memory_budget_mb is 512.00 MiB: xseg holds 300.00 MiB reserved and an "
               "estimated 0 bytes of device memory", "so the request would pass it");
    /* A request above the budget fails at once, naming it too. */
    expect_oom(600 * MiB, "memory_budget_mb is 512.00 MiB", NULL);
    void *b = must_malloc(200 * MiB);
    assert_true(tu_stat("reserved_bytes.all.current") <= (int64_t)(512 * MiB));
    xseg_free(a);
    xseg_free(b);
}

/* Over the budget, xseg gives back its own cache first, then grows (classic segments: the cached
 * one cannot serve the larger request). */
static void test_budget_trims_own(void **state)
{
    (void)state;
    start("expandable_segments:False,memory_budget_mb:512");
    void *a = must_malloc(300 * MiB);
    xseg_free(a); /* 300 MiB cached */
    void *b = must_malloc(400 * MiB);
    assert_true(tu_stat("reserved_bytes.all.current") <= (int64_t)(512 * MiB));
    assert_int_equal(tu_stat("allocated_bytes.all.current"), (int64_t)(400 * MiB));
    xseg_free(b);
}

/* Device memory the process holds outside xseg (a library's cuMemAlloc) counts in the budget. */
static void test_budget_foreign_self(void **state)
{
    (void)state;
    start("memory_budget_mb:512");
    CUdeviceptr lib = 0;
    assert_int_equal(drv->cuMemAlloc(&lib, 300 * MiB), CUDA_SUCCESS);
    expect_oom(300 * MiB, "xseg holds 0 bytes reserved and an estimated 300.00 MiB of device memory",
               "would pass it");
    void *a = must_malloc(200 * MiB);
    assert_int_equal(drv->cuMemFree(lib), CUDA_SUCCESS);
    void *b = must_malloc(300 * MiB);
    xseg_free(a);
    xseg_free(b);
}

/* Another process's memory: outside a group it counts as foreign (the driver cannot tell whose);
 * a member's reserved bytes do not, and a member's own foreign bytes are published as its. */
static void test_budget_foreign_other(void **state)
{
    (void)state;
    start("memory_group:tg,memory_budget_mb:512");
    struct member out = spawn(""); /* in no group */
    assert_string_equal(cmd(&out, "alloc 300 1"), "ok");
    expect_oom(300 * MiB, "an estimated 300.00 MiB of device memory", "would pass it");
    quit(&out);
    void *q = must_malloc(2 * MiB); /* joined already: the device was created above */
    struct member m = spawn("memory_group:tg");
    assert_string_equal(cmd(&m, "cualloc 100"), "ok");
    assert_string_equal(cmd(&m, "alloc 300 1"), "ok"); /* a growth: it measures its 100 MiB */
    void *p = must_malloc(400 * MiB);
    xseg_group_member mem[4];
    size_t n = 0;
    assert_int_equal(xseg_group_stats(0, mem, 4, &n), XSEG_SUCCESS);
    assert_int_equal(n, 2);
    const xseg_group_member *other = mem[0].pid == m.pid ? &mem[0] : &mem[1];
    const xseg_group_member *self = mem[0].pid == m.pid ? &mem[1] : &mem[0];
    assert_int_equal(other->foreign_bytes, 100 * MiB);
    assert_int_equal(self->foreign_bytes, 0);
    assert_int_equal(self->budget_bytes, 512 * MiB);
    assert_int_equal(self->reserved_bytes, tu_stat("reserved_bytes.all.current")); /* published at growth */
    xseg_free(p);
    xseg_free(q);
    quit(&m);
}

#define GB800 "memory_group:tg,memory_group_wait_ms:5000,memory_group_budget_mb:800"

/* The group budget across two processes: a growth past it gets a member's cache (give-way);
 * one that live bytes leave no room for fails naming the group budget, on a device with room. A
 * later member's other value is named in one warning and yields to the group's. */
static void test_group_budget(void **state)
{
    (void)state;
    start(GB800);
    void *q = must_malloc(2 * MiB); /* creates the table: its budget is 800 MiB */
    struct member m = spawn(GB800);
    assert_string_equal(cmd(&m, "alloc 500 1"), "ok");
    assert_string_equal(cmd(&m, "free 0"), "ok"); /* 500 MiB cached there */
    void *p = must_malloc(500 * MiB);
    xseg_group_member mem[4];
    size_t n = 0;
    assert_int_equal(xseg_group_stats(0, mem, 4, &n), XSEG_SUCCESS);
    assert_int_equal(n, 2);
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++) {
        sum += mem[i].reserved_bytes + mem[i].foreign_bytes;
        assert_int_equal(mem[i].group_budget_bytes, 800 * MiB);
        if (mem[i].pid == m.pid)
            assert_true(mem[i].gave_way_bytes >= 200 * MiB);
    }
    if (sum > 800 * MiB)
        fail_msg("the group holds %llu MiB, above its 800 MiB budget", (unsigned long long)(sum / MiB));
    /* 502 MiB live here: 400 more there would pass 800 MiB (the device has 1 GiB). */
    const char *a = cmd(&m, "alloc 400 2");
    if (strncmp(a, "oom ", 4) || !strstr(a, "memory_group_budget_mb of group 'tg' is 800.00 MiB") ||
        !strstr(a, "would pass it"))
        fail_msg("expected an OOM naming the group budget: %s", a);
    assert_string_equal(cmd(&m, "check"), "ok");
    /* A later member with another value: one warning naming both; it uses the group's. */
    char err[64];
    snprintf(err, sizeof err, "/tmp/xseg-test-group-%d.err", (int)getpid());
    struct member w = spawn_as("memory_group:tg,memory_group_budget_mb:700", err, NULL);
    assert_string_equal(cmd(&w, "alloc 2 3"), "ok");
    const char *g = cmd(&w, "group");
    if (!strstr(g, " group_budget 838860800"))
        fail_msg("the later member does not use the group's budget: %s", g);
    quit(&w);
    FILE *f = fopen(err, "r");
    assert_non_null(f);
    char text[4096];
    size_t len = fread(text, 1, sizeof text - 1, f);
    text[len] = '\0';
    fclose(f);
    unlink(err);
    const char *warn = "xseg: warning: memory_group_budget_mb:700 differs from group 'tg''s 800 MiB";
    const char *at = strstr(text, warn);
    if (!at || strstr(at + 1, warn))
        fail_msg("expected one warning '%s': %s", warn, text);
    xseg_free(p);
    xseg_free(q);
    quit(&m);
}

/* A group budget reached in steps smaller than a page (10 MiB against expandable 20 MiB pages),
 * a member holding 300 MiB cached: each step past the budget gets what it lacks from the member,
 * and the growth after the give-way maps only that, not a whole page more (refused before while
 * its own OOM said the request stays within the budget: 400 MiB reached, 10 MiB given). Only
 * the member's cache running out ends it, naming the budget the request would pass. */
static void test_group_budget_steps(void **state)
{
    (void)state;
    const char *cfg = "memory_group:tg,memory_group_wait_ms:5000,memory_group_budget_mb:700";
    start(cfg);
    void *q = must_malloc(2 * MiB); /* creates the table */
    xseg_free(q);
    struct member m = spawn(cfg);
    assert_string_equal(cmd(&m, "alloc 300 1"), "ok");
    assert_string_equal(cmd(&m, "free 0"), "ok"); /* 300 MiB cached there */
    void *p[80];
    size_t n = 0;
    while (n < 80 && xseg_malloc(&p[n], 10 * MiB, 0, NULL) == XSEG_SUCCESS)
        n++;
    const char *msg = xseg_last_error();
    if (n * 10 * MiB < 690 * MiB || !strstr(msg, "memory_group_budget_mb of group 'tg' is 700.00 MiB") ||
        !strstr(msg, "would pass it"))
        fail_msg("took %zu MiB in 10 MiB steps under a 700 MiB group budget beside 300 MiB cached: %s", n * 10,
                 msg);
    xseg_group_member mem[4];
    size_t nm = 0;
    assert_int_equal(xseg_group_stats(0, mem, 4, &nm), XSEG_SUCCESS);
    uint64_t sum = 0;
    for (size_t i = 0; i < nm; i++)
        sum += mem[i].reserved_bytes + mem[i].foreign_bytes;
    if (sum > 700 * MiB)
        fail_msg("the group holds %llu MiB, above its 700 MiB budget", (unsigned long long)(sum / MiB));
    for (size_t i = 0; i < n; i++)
        xseg_free(p[i]);
    quit(&m);
}

/* Six members under a 300 MiB group budget grow at once (each 50 MiB at a time until refused),
 * five rounds: the device memory they hold, measured by this process (in no group), never passes
 * the budget (issue 53: measure, grow and publish raced, and the group reached 600 MiB). */
static void test_budget_race(void **state)
{
    (void)state;
    start("");
    size_t free0 = 0, free1 = 0, total = 0;
    assert_int_equal(drv->cuMemGetInfo(&free0, &total), CUDA_SUCCESS);
    struct member m[6];
    for (int i = 0; i < 6; i++) {
        m[i] = spawn("memory_group:tg,memory_group_budget_mb:300,memory_group_wait_ms:200");
        assert_string_equal(cmd(&m[i], "alloc 2 %d", i + 1), "ok"); /* joined */
        assert_string_equal(cmd(&m[i], "freeall"), "ok");
        assert_string_equal(cmd(&m[i], "trim"), "ok");
    }
    for (int round = 0; round < 50; round++) {
        for (int i = 0; i < 6; i++) { /* all six start before any answer is read */
            fputs("grab 100\n", m[i].in);
            fflush(m[i].in);
        }
        size_t got = 0;
        for (int i = 0; i < 6; i++) {
            char line[256];
            unsigned long n = 0;
            assert_non_null(fgets(line, sizeof line, m[i].out));
            if (sscanf(line, "got %lu", &n) != 1)
                fail_msg("member %d: %s", i, line);
            got += n;
        }
        assert_int_equal(drv->cuMemGetInfo(&free1, &total), CUDA_SUCCESS);
        size_t used = free0 - free1;
        if (used > 300 * MiB)
            fail_msg("round %d: the group holds %zu MiB of the device (%zu allocations of 100 MiB), above its "
                     "300 MiB budget", round, used / MiB, got);
        assert_true(got >= 2); /* the budget is used, not refused for nothing */
        for (int i = 0; i < 6; i++) {
            assert_string_equal(cmd(&m[i], "freeall"), "ok");
            assert_string_equal(cmd(&m[i], "trim"), "ok");
        }
    }
    for (int i = 0; i < 6; i++)
        quit(&m[i]);
}

/* ---- pid reuse and other users ------------------------------------------------------------- */

/* /proc/PID/stat field 22 (the process's start), as a member records it. */
static uint64_t start_time_of(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    for (int field = 2; p && field < 22; field++)
        p = strchr(p + 1, ' ');
    assert_non_null(p);
    return strtoull(p + 1, NULL, 10);
}

/* A slot (SLOT bytes at the table's end, 64 of them): pid at byte 0, start time at byte 96. */
static void forge_slot(unsigned char *t, size_t size, int i, int32_t pid, uint64_t start)
{
    unsigned char *s = t + size - 64 * SLOT + (size_t)i * SLOT;
    memcpy(s + 96, &start, 8);
    __atomic_store_n((int32_t *)(void *)s, pid, __ATOMIC_SEQ_CST);
}

static int32_t slot_pid(const unsigned char *t, size_t size, int i)
{
    return __atomic_load_n((const int32_t *)(const void *)(t + size - 64 * SLOT + (size_t)i * SLOT), __ATOMIC_SEQ_CST);
}

/* A slot whose pid is alive but belongs to a process started later (pid reuse) is a dead
 * member's: not listed, and reclaimed at the next join; one with the right start time stays. */
static void test_pid_reuse(void **state)
{
    (void)state;
    start(GROUP);
    void *q = must_malloc(2 * MiB); /* joins: slot 0 */
    for (int i = 0; i < 2; i++) {
        kids[i] = fork();
        assert_true(kids[i] >= 0);
        if (!kids[i]) {
            pause();
            _exit(0);
        }
    }
    int fd = shm_open(shm_names[1], O_RDWR, 0);
    assert_true(fd >= 0);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    size_t size = (size_t)st.st_size;
    unsigned char *t = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    assert_true(t != MAP_FAILED);
    forge_slot(t, size, 62, kids[0], start_time_of(kids[0]) + 1000); /* the pid reused since */
    forge_slot(t, size, 63, kids[1], start_time_of(kids[1]));        /* the member itself */
    xseg_group_member mem[8];
    size_t n = 0;
    assert_int_equal(xseg_group_stats(0, mem, 8, &n), XSEG_SUCCESS);
    assert_int_equal(n, 2);
    for (size_t i = 0; i < n; i++)
        assert_true(mem[i].pid == getpid() || mem[i].pid == kids[1]);
    struct member m = spawn(GROUP); /* its join reaps dead slots */
    assert_string_equal(cmd(&m, "alloc 2 1"), "ok");
    assert_int_equal(slot_pid(t, size, 62), 0);
    assert_int_equal(slot_pid(t, size, 63), kids[1]);
    assert_int_equal(xseg_group_stats(0, mem, 8, &n), XSEG_SUCCESS);
    assert_int_equal(n, 3);
    quit(&m);
    forge_slot(t, size, 63, 0, 0);
    munmap(t, size);
    for (int i = 0; i < 2; i++) {
        kill(kids[i], SIGKILL);
        waitpid(kids[i], NULL, 0);
        kids[i] = 0;
    }
    xseg_free(q);
}

/* Another user (root dropping to nobody; skipped without root): it cannot join our 0600 table
 * and goes on alone with the reason; our table keeps its members. A table another user created
 * is refused by owner (root could open it), and its member is left alone. */
static void test_two_users(void **state)
{
    (void)state;
    if (geteuid() != 0) {
        print_message("[  SKIPPED ] needs root to run a member as another user\n");
        skip();
    }
    struct passwd *pw = getpwnam("nobody");
    if (!pw || !pw->pw_uid) {
        print_message("[  SKIPPED ] no user 'nobody' to run a member as\n");
        skip();
    }
    /* The build may sit under a folder that user cannot enter (CI's checkout in /root). */
    pid_t probe = fork();
    assert_true(probe >= 0);
    if (!probe)
        _exit(setgroups(0, NULL) || setgid(pw->pw_gid) || setuid(pw->pw_uid) ? 2
              : access(getenv("GROUP_HELPER"), X_OK) || access(getenv("XSEG_LIBCUDA"), R_OK) ? 1 : 0);
    int status = 0;
    assert_int_equal(waitpid(probe, &status, 0), probe);
    if (!WIFEXITED(status) || WEXITSTATUS(status)) {
        print_message("[  SKIPPED ] user 'nobody' cannot %s\n", WIFEXITED(status) && WEXITSTATUS(status) == 1
                      ? "run the helper or read the emulator (a folder above is closed to it)"
                      : "be switched to");
        skip();
    }
    start(GROUP);
    void *q = must_malloc(2 * MiB); /* our table, 0600 */
    struct member other = spawn_as(GROUP, "/dev/null", pw);
    assert_string_equal(cmd(&other, "alloc 20 1"), "ok"); /* it works, alone */
    const char *g = cmd(&other, "group");
    if (strncmp(g, "error ", 6) || !strstr(g, "cannot open /dev/shm/xseg-group-") ||
        !strstr(g, "Permission denied"))
        fail_msg("the other user's member should go on alone with the reason: %s", g);
    xseg_group_member mem[4];
    size_t n = 0;
    assert_int_equal(xseg_group_stats(0, mem, 4, &n), XSEG_SUCCESS);
    assert_int_equal(n, 1);
    assert_int_equal(mem[0].pid, getpid());
    quit(&other);

    /* A table of another user's: it creates group 'tu' first; a member of ours refuses it. */
    struct member theirs = spawn_as("memory_group:tu", "/dev/null", pw);
    assert_string_equal(cmd(&theirs, "alloc 20 1"), "ok");
    assert_true(!strncmp(cmd(&theirs, "group"), "asked 0 ", 8));
    struct stat st;
    int fd = shm_open(shm_names[2], O_RDONLY, 0);
    assert_true(fd >= 0);
    assert_int_equal(fstat(fd, &st), 0);
    close(fd);
    assert_int_equal(st.st_uid, pw->pw_uid);
    struct member ours = spawn("memory_group:tu");
    assert_string_equal(cmd(&ours, "alloc 20 1"), "ok");
    g = cmd(&ours, "group");
    if (strncmp(g, "error ", 6) || !strstr(g, "is not usable (owned by another user)"))
        fail_msg("a table of another user's should be refused by owner: %s", g);
    assert_true(!strncmp(cmd(&theirs, "group"), "asked 0 ", 8)); /* still its only member */
    quit(&ours);
    quit(&theirs);
    xseg_free(q);
}

/* ---- cudaemu's shared accounting under a race ------------------------------------------------ */

#define RACERS 6
#define RACE_ROUNDS 200

/* One racer (a forked child that loads the driver itself): each round, at the parent's word,
 * cuMemAlloc 1 MiB until refused, report the count, wait, free everything, report again. */
static int racer(int go, int report)
{
    if (!tu_gpu_available() || !tu_emulated())
        return 77;
    static CUdeviceptr held[1024];
    for (int round = 0; round < RACE_ROUNDS; round++) {
        char c;
        if (read(go, &c, 1) != 1)
            return 1;
        int n = 0;
        while (n < 1024 && drv->cuMemAlloc(&held[n], MiB) == CUDA_SUCCESS)
            n++;
        if (write(report, &n, sizeof n) != sizeof n || read(go, &c, 1) != 1)
            return 1;
        for (int i = 0; i < n; i++)
            drv->cuMemFree(held[i]);
        if (write(report, &n, sizeof n) != sizeof n)
            return 1;
    }
    return 0;
}

/* Processes allocating at the same instant never overcommit the shared device: the sum of what
 * they hold when every one was refused stays within its capacity (64 MiB here), round after
 * round. */
static void test_emu_race(void **state)
{
    (void)state;
    setenv("CUDAEMU_TOTAL_MEM", "64M", 1);
    int go[RACERS][2], report[2]; /* a word pipe each: a racer reads only its own words */
    assert_int_equal(pipe(report), 0);
    pid_t pids[RACERS];
    for (int i = 0; i < RACERS; i++) {
        assert_int_equal(pipe(go[i]), 0);
        fflush(NULL);
        pids[i] = fork();
        assert_true(pids[i] >= 0);
        if (!pids[i]) {
            close(go[i][1]);
            close(report[0]);
            _exit(racer(go[i][0], report[1]));
        }
        close(go[i][0]);
    }
    close(report[1]);
    int worst = 0, skipped = 0;
    for (int round = 0; round < RACE_ROUNDS && !skipped; round++) {
        for (int i = 0; i < RACERS; i++) /* all start at once */
            assert_int_equal(write(go[i][1], "", 1), 1);
        int sum = 0, n;
        for (int i = 0; i < RACERS; i++) {
            if (read(report[0], &n, sizeof n) != sizeof n) {
                skipped = 1;
                break;
            }
            sum += n;
        }
        if (skipped)
            break;
        worst = sum > worst ? sum : worst;
        for (int i = 0; i < RACERS; i++)
            assert_int_equal(write(go[i][1], "", 1), 1);
        for (int i = 0; i < RACERS; i++)
            assert_int_equal(read(report[0], &n, sizeof n), sizeof n);
    }
    for (int i = 0; i < RACERS; i++)
        close(go[i][1]);
    close(report[0]);
    int status = 0;
    for (int i = 0; i < RACERS; i++) {
        assert_int_equal(waitpid(pids[i], &status, 0), pids[i]);
        if (WIFEXITED(status) && WEXITSTATUS(status) == 77) {
            print_message("[  SKIPPED ] needs cudaemu (its shared accounting)\n");
            skip();
        }
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    print_message("most held at once over %d rounds: %d MiB of 64\n", RACE_ROUNDS, worst);
    if (worst > 64)
        fail_msg("%d processes held %d MiB of a 64 MiB device", RACERS, worst);
}

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
        if (!strstr(out, json ? "\"ask_timeouts\": 0, \"foreign_bytes\": 0, \"group_budget_bytes\": 0}" : " FOREIGN "))
            fail_msg("xseg-top lacks the ask time-outs, foreign bytes and group budget: %s", out);
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

/* ---- xseg-top against another local user (root dropping to uid 65534) ------------------------ */

#define JUNK 300
/* Tables made as uid 65534 by this test: removed at exit whatever happens (root may unlink). */
static char evil_name[2][160], junk_prefix[96];

static void foreign_cleanup(void)
{
    for (int i = 0; i < 2; i++)
        if (evil_name[i][0])
            shm_unlink(evil_name[i]);
    for (int i = 0; junk_prefix[0] && i < JUNK; i++) {
        char name[128];
        snprintf(name, sizeof name, "%s%d", junk_prefix, i);
        shm_unlink(name);
    }
}

/* Create the tables @p names (count @p n, or JUNK of junk_prefix when @p names is NULL) as uid and
 * gid 65534, as any other local user could; cmocka skip when not root or when the switch fails. */
static void skip_unless_root(void)
{
    if (geteuid() != 0) {
        print_message("[  SKIPPED ] needs root to create tables as another user (uid 65534)\n");
        skip();
    }
}

static void make_foreign_tables(const char *const *names, int n)
{
    skip_unless_root();
    static bool registered;
    if (!registered)
        atexit(foreign_cleanup);
    registered = true;
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (!pid) {
        gid_t gid = 65534;
        if (setgroups(0, NULL) || setgid(gid) || setuid(65534))
            _exit(2);
        for (int i = 0; i < n; i++) {
            char junk[128];
            if (!names)
                snprintf(junk, sizeof junk, "%s%d", junk_prefix, i);
            int fd = shm_open(names ? names[i] : junk, O_RDWR | O_CREAT | O_EXCL, 0600);
            if (fd < 0 || ftruncate(fd, 4096))
                _exit(1);
            close(fd);
        }
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 2) {
        print_message("[  SKIPPED ] cannot switch to uid 65534\n");
        skip();
    }
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* xseg-top ARGS' standard output (malloc'd, NUL-terminated; @p len its length); exits 0. */
static char *top_output(const char *args, size_t *len)
{
    char command[1024];
    snprintf(command, sizeof command, "%s %s", getenv("XSEG_TOP"), args);
    FILE *f = popen(command, "r");
    assert_non_null(f);
    size_t cap = 1 << 16, n = 0, got;
    char *out = malloc(cap);
    assert_non_null(out);
    while ((got = fread(out + n, 1, cap - 1 - n, f)) > 0)
        if ((n += got) == cap - 1) {
            out = realloc(out, cap *= 2);
            assert_non_null(out);
        }
    out[n] = '\0';
    assert_int_equal(pclose(f), 0);
    *len = n;
    return out;
}

/* @p json parsed by Python's json module and written back as ASCII (the group names, sorted) into
 * @p names; false when Python is missing. Fails the test when the document does not parse. */
static bool parse_json_groups(const char *json, size_t len, char *names, size_t cap)
{
    const char *py = getenv("PYTHON3");
    if (!py || !*py)
        return false;
    char path[] = "/tmp/xseg-top-json-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, json, len), (ssize_t)len);
    close(fd);
    char command[1200];
    snprintf(command, sizeof command, "%s -c 'import json, sys; d = json.loads(sys.stdin.buffer.read()); "
             "print(json.dumps(sorted(g[\"group\"] for g in d[\"groups\"])))' < %s 2>&1", py, path);
    FILE *f = popen(command, "r");
    assert_non_null(f);
    size_t n = fread(names, 1, cap - 1, f);
    names[n] = '\0';
    int status = pclose(f);
    unlink(path);
    if (status)
        fail_msg("xseg-top --json is not valid JSON: %s\n%s", names, json);
    return true;
}

/* Table names another user made with a quote, ESC, a backslash and an invalid UTF-8 byte, in the
 * group part and in the device uuid part: not shown by default; with --all-users shown escaped
 * (terminal: \x1b; JSON: strict UTF-8 that parses, \u001b, U+FFFD); no ESC byte reaches the
 * output in any mode. */
static void test_top_hostile(void **state)
{
    (void)state;
    skip_unless_root();
    start(GROUP);
    void *p = must_malloc(2 * MiB); /* our table, with this process in it */
    snprintf(evil_name[0], sizeof evil_name[0], "%.45sev\"il\033[2J\\\377", shm_names[1]);
    snprintf(evil_name[1], sizeof evil_name[1], "/xseg-group-\"\033[31m%-26d-ev2", (int)getpid());
    const char *names[] = {evil_name[0], evil_name[1]};
    make_foreign_tables(names, 2);
    char mine[32], names_json[65536];
    for (int all = 0; all < 2; all++) {
        size_t len;
        char *out = top_output(all ? "--once --all-users" : "--once", &len);
        snprintf(mine, sizeof mine, "%8d ", (int)getpid());
        if (memchr(out, '\033', len) || !strstr(out, mine))
            fail_msg("xseg-top%s: a raw ESC, or this process missing:\n%s", all ? " --all-users" : "", out);
        if (all ? !strstr(out, "ev\"il\\x1b[2J\\\\\\xff") : strstr(out, "ev\"il") != NULL)
            fail_msg("xseg-top%s should %s the other user's table:\n%s", all ? " --all-users" : "",
                     all ? "show (escaped)" : "not show", out);
        free(out);

        out = top_output(all ? "--json --all-users" : "--json", &len);
        snprintf(mine, sizeof mine, "{\"pid\": %d,", (int)getpid());
        if (memchr(out, '\033', len) || !strstr(out, mine))
            fail_msg("xseg-top --json%s: a raw ESC, or this process missing:\n%s", all ? " --all-users" : "",
                     out);
        if (!parse_json_groups(out, len, names_json, sizeof names_json)) {
            free(out);
            xseg_free(p);
            print_message("[  SKIPPED ] no python3 to parse the JSON (PYTHON3)\n");
            skip();
        }
        bool evil = strstr(names_json, "\"ev\\\"il\\u001b[2J\\\\\\ufffd\"") != NULL;
        bool evil2 = strstr(names_json, "\"ev2\"") != NULL; /* its device uuid part is hostile */
        if (!strstr(names_json, "\"tg\"") || evil != (all == 1) || evil2 != (all == 1))
            fail_msg("xseg-top --json%s groups: %s\n%s", all ? " --all-users" : "", names_json, out);
        free(out);
    }
    xseg_free(p);
}

/* 300 junk tables of another user, named to sort first, do not push this user's group out. */
static void test_top_junk(void **state)
{
    (void)state;
    skip_unless_root();
    start(GROUP);
    void *p = must_malloc(2 * MiB);
    snprintf(junk_prefix, sizeof junk_prefix, "/xseg-group-00000000000000000000000000000000-j%d.",
             (int)getpid());
    make_foreign_tables(NULL, JUNK);
    const char *modes[] = {"--once", "--json", "--once --all-users", "--json --all-users"};
    for (int i = 0; i < 4; i++) {
        char mine[32];
        snprintf(mine, sizeof mine, i % 2 ? "{\"pid\": %d," : "%8d ", (int)getpid());
        size_t len;
        char *out = top_output(modes[i], &len);
        if (!strstr(out, mine))
            fail_msg("xseg-top %s lost this process's group among %d junk tables:\n%.4000s", modes[i],
                     JUNK, out);
        if (i < 2 && strstr(out, junk_prefix + 1))
            fail_msg("xseg-top %s shows another user's tables:\n%.4000s", modes[i], out);
        free(out);
    }
    xseg_free(p);
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
    /* A name is another user's text: its bytes reach the message escaped, never raw. */
    assert_int_equal(xseg_group_read("xseg-group-\x1b[2J\"q\xff", NULL, 0, &n), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "xseg-group-\\x1b[2J\\x22q\\xff"));
    assert_null(strchr(xseg_last_error(), 0x1b));
    assert_int_equal(xseg_group_read("\x1b]0;x\x07", NULL, 0, &n), XSEG_ERROR_INVALID_VALUE);
    assert_null(strchr(xseg_last_error(), 0x1b));
    assert_null(strchr(xseg_last_error(), 0x07));
    assert_int_equal(xseg_group_stats(0, NULL, 1, &n), XSEG_ERROR_INVALID_VALUE);
    assert_int_equal(xseg_group_stats(0, NULL, 0, &n), XSEG_ERROR_ILLEGAL_STATE);
    assert_int_equal(xseg_init("memory_group:a/b"), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "memory_group"));
    assert_int_equal(xseg_init("memory_group_wait_ms:60001"), XSEG_ERROR_INVALID_VALUE);
}

int main(int argc, char **argv)
{
    /* The pid and the boot clock: a name no earlier process used, so a table or accounting file
     * left behind by a killed run (of any build, any layout) is never met again. */
    char share[64];
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    snprintf(share, sizeof share, "xg%d.%llx", (int)getpid(),
             (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec);
    setenv("CUDAEMU_SHARED", share, 1);
    setenv("CUDAEMU_TOTAL_MEM", "1G", 1);
    atexit(reap_spawned);
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_emu_shared),   cmocka_unit_test(test_give_way),
        cmocka_unit_test(test_oom_message),  cmocka_unit_test(test_dead_member),
        cmocka_unit_test(test_stopped_member), cmocka_unit_test(test_concurrent_askers), cmocka_unit_test(test_late_joiner), cmocka_unit_test(test_late_joiner_new_table),
        cmocka_unit_test(test_hostile_garbage),
        cmocka_unit_test(test_hostile_slot), cmocka_unit_test(test_read_errors),
        cmocka_unit_test(test_top),          cmocka_unit_test(test_top_hostile),
        cmocka_unit_test(test_top_junk),     cmocka_unit_test(test_budget_refuses),
        cmocka_unit_test(test_budget_trims_own), cmocka_unit_test(test_budget_foreign_self),
        cmocka_unit_test(test_budget_foreign_other), cmocka_unit_test(test_group_budget),
        cmocka_unit_test(test_group_budget_steps), cmocka_unit_test(test_give_way_steps),
        cmocka_unit_test(test_budget_race), cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_slow_responder), cmocka_unit_test(test_bus_signal),
        cmocka_unit_test(test_pid_reuse),    cmocka_unit_test(test_two_users),
        cmocka_unit_test(test_emu_race),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
