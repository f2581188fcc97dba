/*
 * How snapshots and the live-process log reach the disk (issue 31, finding 3), through the public
 * writers: xseg_dump_snapshot (pickle), xseg_dump_snapshot_json, xseg_dump_trace and the OOM
 * snapshot (xseg_set_oom_snapshot). A symlink planted at the temporary names xseg used to use
 * (PATH.tmp.PID.SEQ) or at the destination is never written through: the victim it points to
 * stays as it was, and the destination becomes a regular file. A failed write leaves no
 * temporary file behind and names the path; the next dump works.
 *
 *   test_snapshot_files               the cmocka tests
 *   test_snapshot_files utf8 DIR      write snapshots whose frames hold invalid UTF-8 into DIR
 *                                     (tests/history/test_snapshot_utf8.py loads them)
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/common/testutil.h"
#include "xseg.h"

#define MiB ((size_t)1 << 20)
#define VICTIM_TEXT "precious data that no snapshot may overwrite\n"

static char tmpdir[256];

static const char *tmp_path(const char *name)
{
    static char buf[8][512];
    static int i;
    char *p = buf[i++ % 8];
    snprintf(p, 512, "%s/%s", tmpdir, name);
    return p;
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f)
        fail_msg("cannot create %s", path);
    fputs(text, f);
    fclose(f);
}

static void assert_victim_intact(const char *victim)
{
    char buf[256] = {0};
    FILE *f = fopen(victim, "r");
    if (!f)
        fail_msg("the victim %s is gone", victim);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    if (strcmp(buf, VICTIM_TEXT) != 0)
        fail_msg("the victim %s was overwritten (%zu bytes now)", victim, n);
}

/* The file at @p path is a regular file (not a link) that starts with @p magic. */
static void assert_regular_with(const char *path, const char *magic, size_t magic_len)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        fail_msg("%s was not written", path);
    if (!S_ISREG(st.st_mode))
        fail_msg("%s is not a regular file (mode 0%o)", path, (unsigned)st.st_mode);
    char buf[64] = {0};
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    assert_true(n >= magic_len);
    assert_memory_equal(buf, magic, magic_len);
}

/* Symlinks at every temporary name the old writer could pick in this process, to @p victim. */
#define OLD_SEQS 64
static void plant_tmp_links(const char *path, const char *victim)
{
    for (unsigned i = 0; i < OLD_SEQS; i++) {
        char link[600];
        snprintf(link, sizeof link, "%s.tmp.%ld.%u", path, (long)getpid(), i);
        unlink(link);
        if (symlink(victim, link) != 0)
            fail_msg("cannot plant %s", link);
    }
}

/* Files in tmpdir whose names start with @p prefix and hold ".tmp." but are no planted link. */
static int leftover_tmp_files(const char *prefix)
{
    DIR *d = opendir(tmpdir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) || !strstr(e->d_name, ".tmp."))
            continue;
        struct stat st;
        if (lstat(tmp_path(e->d_name), &st) == 0 && !S_ISLNK(st.st_mode))
            n++;
    }
    closedir(d);
    return n;
}

typedef xseg_status (*writer_fn)(const char *path);
static xseg_status w_pickle(const char *path) { return xseg_dump_snapshot(-1, path); }
static xseg_status w_json(const char *path) { return xseg_dump_snapshot_json(-1, path); }
static xseg_status w_trace(const char *path) { return xseg_dump_trace(-1, path); }

/* An OOM that surfaces writes the OOM snapshot (set again: that restarts its rate limit). */
static xseg_status w_oom(const char *path)
{
    assert_int_equal(xseg_set_oom_snapshot(path), XSEG_SUCCESS);
    size_t fr = 0, total = 0;
    tu_assert_cu(drv->cuMemGetInfo(&fr, &total));
    void *x = NULL;
    assert_int_equal(xseg_malloc(&x, total * 2, 0, NULL), XSEG_ERROR_OUT_OF_MEMORY);
    xseg_status st = strstr(xseg_last_error(), "A memory snapshot was written to ") ? XSEG_SUCCESS
                                                                                      : XSEG_ERROR_INVALID_VALUE;
    if (st != XSEG_SUCCESS)
        print_message("OOM message: %s\n", xseg_last_error());
    assert_int_equal(xseg_set_oom_snapshot(NULL), XSEG_SUCCESS);
    return st;
}

static const struct writer {
    const char *name;
    writer_fn fn;
    const char *magic;
    size_t magic_len;
} writers[] = {
    {"pickle", w_pickle, "\x80\x02", 2},
    {"json", w_json, "{", 1},
    {"trace", w_trace, "# xseg-replay trace", 19},
    {"oom", w_oom, "\x80\x02", 2},
};

static void record_all(void)
{
    xseg_history_options o = {0};
    o.enabled = 1;
    o.record = XSEG_HISTORY_ALL;
    o.clear = 1;
    if (xseg_record_memory_history(&o) != XSEG_SUCCESS)
        fail_msg("xseg_record_memory_history: %s", xseg_last_error());
}

static int setup(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:False");
    record_all();
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    xseg_set_oom_snapshot(NULL);
    assert_int_equal(xseg_record_memory_history(NULL), XSEG_SUCCESS);
    xseg_empty_cache(0);
    return 0;
}

/* A link planted at the old predictable temporary name: the victim stays, the dump lands. */
static void test_link_at_tmp_name(void **state)
{
    (void)state;
    void *keep = tu_malloc(3 * MiB, NULL);
    for (size_t w = 0; w < sizeof writers / sizeof writers[0]; w++) {
        char name[64], vname[64];
        snprintf(name, sizeof name, "tmplink-%s.out", writers[w].name);
        snprintf(vname, sizeof vname, "victim-tmp-%s", writers[w].name);
        const char *path = tmp_path(name), *victim = tmp_path(vname);
        write_text(victim, VICTIM_TEXT);
        plant_tmp_links(path, victim);
        if (writers[w].fn(path) != XSEG_SUCCESS)
            fail_msg("%s: %s", writers[w].name, xseg_last_error());
        assert_victim_intact(victim);
        assert_regular_with(path, writers[w].magic, writers[w].magic_len);
        assert_int_equal(leftover_tmp_files(name), 0);
    }
    tu_free(keep);
}

/* A link at the destination is replaced by the new file, never written through. */
static void test_link_at_destination(void **state)
{
    (void)state;
    void *keep = tu_malloc(3 * MiB, NULL);
    for (size_t w = 0; w < sizeof writers / sizeof writers[0]; w++) {
        char name[64], vname[64];
        snprintf(name, sizeof name, "destlink-%s.out", writers[w].name);
        snprintf(vname, sizeof vname, "victim-dest-%s", writers[w].name);
        const char *path = tmp_path(name), *victim = tmp_path(vname);
        write_text(victim, VICTIM_TEXT);
        unlink(path);
        assert_int_equal(symlink(victim, path), 0);
        if (writers[w].fn(path) != XSEG_SUCCESS)
            fail_msg("%s: %s", writers[w].name, xseg_last_error());
        assert_victim_intact(victim);
        assert_regular_with(path, writers[w].magic, writers[w].magic_len);
        assert_int_equal(leftover_tmp_files(name), 0);
    }
    tu_free(keep);
}

/* A write that fails (the file-size limit) removes the temporary file and names the path; the
 * destination keeps its old content; the next dump works. */
static void test_write_failure(void **state)
{
    (void)state;
    void *keep = tu_malloc(3 * MiB, NULL);
    const char *path = tmp_path("limited.pickle");
    write_text(path, VICTIM_TEXT);
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = old;
    lim.rlim_cur = 64; /* every snapshot is longer */
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    xseg_status st = xseg_dump_snapshot(-1, path);
    xseg_status st_trace = xseg_dump_trace(-1, path);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, prev);
    assert_int_equal(st, XSEG_ERROR_INVALID_VALUE);
    (void)st_trace; /* a short trace may fit in 64 bytes: either way nothing is left behind */
    assert_int_equal(xseg_dump_snapshot(-1, path), XSEG_SUCCESS); /* usable after */
    assert_int_equal(leftover_tmp_files("limited.pickle"), 0);
    /* The message of the failure (taken again under the limit) names the path. */
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    signal(SIGXFSZ, SIG_IGN);
    st = xseg_dump_snapshot_json(-1, path);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", xseg_last_error());
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, prev);
    assert_int_equal(st, XSEG_ERROR_INVALID_VALUE);
    if (!strstr(msg, path) || !strstr(msg, "xseg_dump_snapshot_json"))
        fail_msg("the message does not name the path: %s", msg);
    assert_int_equal(leftover_tmp_files("limited.pickle"), 0);
    assert_regular_with(path, "\x80\x02", 2); /* the last good dump stays */
    tu_free(keep);
}

/* ---- `utf8 DIR`: frames with invalid UTF-8 (test_snapshot_utf8.py) ------------------------- */

/* Each string is invalid UTF-8 that the old check accepted, or a valid edge case. */
static const char *const bad_strings[] = {
    "surrogate-\xed\xa0\x80-high",          /* U+D800 */
    "surrogate-\xed\xbf\xbf-low",           /* U+DFFF */
    "overlong-\xe0\x80\xaf-slash",          /* '/' in three bytes */
    "overlong-\xf0\x80\x80\xaf-slash",      /* '/' in four bytes */
    "beyond-\xf4\x90\x80\x80-10ffff",       /* U+110000 */
    "truncated-\xe2\x82",                   /* a sequence cut short at the end */
    "lone-\x80\xbf-continuations",
    "valid-\xe2\x82\xac-\xf0\x9f\x98\x80-\xf4\x8f\xbf\xbf-\xed\x9f\xbf-\xee\x80\x80", /* kept as they are */
};
#define NBAD (sizeof bad_strings / sizeof bad_strings[0])
static int utf8_cb_index;

static int utf8_cb(xseg_frame *frames, int max, void *user)
{
    (void)user;
    int i = utf8_cb_index;
    if (max < 1)
        return 0;
    frames[0] = (xseg_frame){bad_strings[i % NBAD], bad_strings[(i + 1) % NBAD], 10 + i};
    return 1;
}

static int write_utf8(const char *dir)
{
    if (xseg_init("expandable_segments:False") != XSEG_SUCCESS || !tu_gpu_available()) {
        fprintf(stderr, "no device: %s\n", xseg_last_error());
        return 77;
    }
    xseg_history_options o = {0};
    o.enabled = 1;
    o.record = XSEG_HISTORY_ALL;
    o.stacks = XSEG_STACKS_CALLBACK;
    o.callback = utf8_cb;
    o.clear = 1;
    if (xseg_record_memory_history(&o) != XSEG_SUCCESS)
        return 1;
    void *p[NBAD];
    for (size_t i = 0; i < NBAD; i++) {
        utf8_cb_index = (int)i;
        if (xseg_malloc(&p[i], 4096 * (i + 1), 0, NULL) != XSEG_SUCCESS)
            return 1;
    }
    char path[512];
    snprintf(path, sizeof path, "%s/utf8.pickle", dir);
    if (xseg_dump_snapshot(-1, path) != XSEG_SUCCESS)
        return 1;
    snprintf(path, sizeof path, "%s/utf8.json", dir);
    if (xseg_dump_snapshot_json(-1, path) != XSEG_SUCCESS)
        return 1;
    for (size_t i = 0; i < NBAD; i++)
        xseg_free(p[i]);
    return 0;
}

int main(int argc, char **argv)
{
    if (!getenv("CUDAEMU_TOTAL_MEM"))
        setenv("CUDAEMU_TOTAL_MEM", "1G", 1);
    if (argc == 3 && !strcmp(argv[1], "utf8"))
        return write_utf8(argv[2]);
    snprintf(tmpdir, sizeof tmpdir, "/tmp/xseg-snapfiles-XXXXXX");
    if (!mkdtemp(tmpdir))
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_link_at_tmp_name, setup, teardown),
        cmocka_unit_test_setup_teardown(test_link_at_destination, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_failure, setup, teardown),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    return rc;
}
