/* PyTorch snapshots in: detection and the data-only conversion step. See snapshot.h. */
#define _GNU_SOURCE
#include "tools/replay/snapshot.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef XSEG_REPLAY_SNAPSHOT2TRACE
#define XSEG_REPLAY_SNAPSHOT2TRACE ""
#endif

volatile pid_t snapshot_converter_pid;

int snapshot_is_pickle(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    int c = fgetc(f);
    fclose(f);
    return c == 0x80; /* PROTO: every pickle of protocol 2 and later; PyTorch writes 2 to 5 */
}

int snapshot_named_but_not(const char *path, char *why, size_t len)
{
    size_t n = strlen(path);
    if (n < 7 || strcasecmp(path + n - 7, ".pickle") != 0)
        return 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0; /* the trace loader says why it cannot be read */
    int c = fgetc(f);
    fclose(f);
    if (c != EOF)
        return 0; /* text is a trace whatever its name (the first byte decides) */
    snprintf(why, len, "the file is empty (a snapshot cut off, or never written: "
             "torch.cuda.memory._dump_snapshot writes it whole)");
    return 1;
}

/* The converter: $XSEG_SNAPSHOT2TRACE, else xseg-snapshot2trace beside this executable (an
 * installed tree), else the source tree's tools/snapshot2trace.py (a build tree). */
static int find_converter(char *out, size_t len)
{
    const char *env = getenv("XSEG_SNAPSHOT2TRACE");
    if (env && *env) {
        snprintf(out, len, "%s", env);
        return access(out, R_OK) == 0;
    }
    char self[PATH_MAX - 32]; /* room for the name after it in @p out (PATH_MAX) */
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = '\0';
        char *slash = strrchr(self, '/');
        if (slash) {
            *slash = '\0';
            snprintf(out, len, "%s/xseg-snapshot2trace", self);
            if (access(out, R_OK) == 0)
                return 1;
        }
    }
    snprintf(out, len, "%s", XSEG_REPLAY_SNAPSHOT2TRACE);
    return out[0] && access(out, R_OK) == 0;
}

void snapshot_devices_free(struct snapshot_device *devs, size_t n)
{
    for (size_t i = 0; devs && i < n; i++) {
        free(devs[i].trace_path);
        free(devs[i].name);
    }
    free(devs);
}

/* One "N<tab>PATH<tab>EVENTS" line of the converter's listing into @p d. */
static int parse_listing(const char *line, const char *path, struct snapshot_device *d)
{
    char *end;
    errno = 0;
    long dev = strtol(line, &end, 10);
    if (errno || end == line || *end != '\t' || dev < 0 || dev > INT_MAX)
        return -1;
    const char *p = end + 1, *tab = strchr(p, '\t');
    if (!tab)
        return -1;
    d->device = (int)dev;
    d->trace_path = strndup(p, (size_t)(tab - p));
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    if (asprintf(&d->name, "%s (device %d)", base, d->device) < 0)
        d->name = NULL;
    return d->trace_path && d->name ? 0 : -1;
}

/* The converter's listing from @p in into *@p devs; 1 when a line is unreadable or host memory
 * ran out (the rest is still read: the converter must not block on a full pipe). */
static int read_listing(FILE *in, const char *path, struct snapshot_device **devs, size_t *n)
{
    char *line = NULL;
    size_t cap = 0;
    int bad = 0;
    while (getline(&line, &cap, in) > 0) {
        if (bad)
            continue;
        struct snapshot_device *nd = realloc(*devs, (*n + 1) * sizeof *nd);
        if (!nd) {
            bad = 1;
            continue;
        }
        *devs = nd;
        memset(&nd[*n], 0, sizeof nd[*n]);
        if (parse_listing(line, path, &nd[*n]))
            bad = 1;
        ++*n; /* counted even when half-filled: snapshot_devices_free frees what it holds */
    }
    free(line);
    return bad;
}

xseg_status snapshot_convert(const char *path, int device, int frames, const char *dir,
                             struct snapshot_device **devs, size_t *n, char *err, size_t errlen)
{
    *devs = NULL;
    *n = 0;
    err[0] = '\0';
    char conv[PATH_MAX];
    if (!find_converter(conv, sizeof conv)) {
        snprintf(err, errlen, "%s is a PyTorch snapshot, and the converter that reads it (tools/snapshot2trace.py, "
                 "installed as xseg-snapshot2trace) is not found: set XSEG_SNAPSHOT2TRACE to its path", path);
        return XSEG_ERROR_INVALID_VALUE;
    }
    char devarg[32];
    snprintf(devarg, sizeof devarg, "%d", device);
    const char *argv[16];
    int k = 0;
    argv[k++] = "python3";
    argv[k++] = conv;
    argv[k++] = "--prog";
    argv[k++] = "xseg-replay";
    argv[k++] = "--out-dir";
    argv[k++] = dir;
    if (device >= 0) {
        argv[k++] = "--device";
        argv[k++] = devarg;
    }
    if (!frames)
        argv[k++] = "--no-frames";
    argv[k++] = "--";
    argv[k++] = path;
    argv[k] = NULL;
    int fds[2];
    if (pipe(fds)) {
        snprintf(err, errlen, "%s: cannot convert: pipe: %s", path, strerror(errno));
        return XSEG_ERROR_INVALID_VALUE;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(err, errlen, "%s: cannot convert: fork: %s", path, strerror(errno));
        close(fds[0]);
        close(fds[1]);
        return XSEG_ERROR_INVALID_VALUE;
    }
    if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        execvp("python3", (char *const *)argv);
        if (errno == ENOENT)
            fprintf(stderr, "xseg-replay: %s is a PyTorch snapshot; reading it needs python3 (not found in PATH) "
                    "to run the data-only converter %s\n", path, conv);
        else
            fprintf(stderr, "xseg-replay: %s: cannot run python3: %s\n", path, strerror(errno));
        _exit(127);
    }
    snapshot_converter_pid = pid;
    close(fds[1]);
    FILE *in = fdopen(fds[0], "r");
    int bad = in ? read_listing(in, path, devs, n) : 1;
    if (in)
        fclose(in);
    else
        close(fds[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    snapshot_converter_pid = 0;
    int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (rc == 0 && !bad && *n > 0)
        return XSEG_SUCCESS;
    if (rc == 0)
        snprintf(err, errlen, "%s: the converter %s listed %s", path, conv,
                 bad ? "something unreadable (or host memory ran out)" : "no device");
    else if (!WIFEXITED(status))
        snprintf(err, errlen, "%s: the converter %s was killed by signal %d", path, conv, WTERMSIG(status));
    /* else: the converter (or the exec failure above) printed its one line already */
    snapshot_devices_free(*devs, *n);
    *devs = NULL;
    *n = 0;
    return XSEG_ERROR_INVALID_VALUE;
}
