/*
 * A member process for the memory-group tests and benchmark: `group_helper CONFIG`, then one
 * command a line on stdin, one answer a line on stdout:
 *   alloc MIB TAG  xseg_malloc MIB MiB on device 0 and fill it with TAG's pattern (tu_fill):
 *                  "ok", or "oom MESSAGE"
 *   free N         free the Nth allocation made (0-based): "ok"
 *   check          every live allocation still holds its pattern: "ok", or "bad N"
 *   stats          "reserved R allocated A" (bytes, this process, device 0)
 *   group          "asked A gave G gave_bytes B foreign F budget U group_budget V timeouts T
 *                  cached C" (this process's row of xseg_group_stats)
 *   cualloc MIB    cuMemAlloc MIB MiB outside xseg (memory a library holds): "ok", or "error CODE"
 *   trim           xseg_trim(0, 0): "ok"
 *   take MIB       one xseg_malloc of MIB MiB (no pattern): "ok", or "oom MESSAGE"
 *   grab MIB       xseg_malloc MIB MiB at a time (no pattern) until refused: "got N" (N taken)
 *   freeall        free every live allocation: "ok"
 *   quit           xseg_shutdown, then exit 0
 * Started by fork+exec (a fresh process: a forked copy of a CUDA process is refused by design).
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/common/testutil.h"
#include "xseg.h"

#define MAX_LIVE 1024

struct live {
    void *p;
    size_t size;
    unsigned tag;
};

static struct live live[MAX_LIVE];
static size_t nlive;

static void cmd_alloc(size_t mib, unsigned tag)
{
    void *p = NULL;
    if (nlive == MAX_LIVE) {
        printf("oom too many allocations\n");
        return;
    }
    if (xseg_malloc(&p, mib << 20, 0, NULL) != XSEG_SUCCESS) {
        const char *m = xseg_last_error();
        printf("oom %.*s\n", (int)strcspn(m, "\n"), m);
        return;
    }
    live[nlive++] = (struct live){p, mib << 20, tag};
    printf(tu_fill((CUdeviceptr)(uintptr_t)p, mib << 20, tag) == CUDA_SUCCESS ? "ok\n" : "fill failed\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: group_helper CONFIG\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (xseg_init(argv[1]) != XSEG_SUCCESS || !tu_gpu_available()) {
        printf("error %s\n", xseg_last_error());
        return 1;
    }
    char line[256];
    while (fgets(line, sizeof line, stdin)) {
        size_t a = 0;
        unsigned b = 0;
        if (sscanf(line, "alloc %zu %u", &a, &b) == 2) {
            cmd_alloc(a, b);
        } else if (sscanf(line, "free %zu", &a) == 1 && a < nlive && live[a].p) {
            xseg_free(live[a].p);
            live[a].p = NULL;
            printf("ok\n");
        } else if (!strncmp(line, "check", 5)) {
            size_t bad = SIZE_MAX;
            for (size_t i = 0; i < nlive && bad == SIZE_MAX; i++)
                if (live[i].p && live[i].tag != UINT_MAX && !tu_check((CUdeviceptr)(uintptr_t)live[i].p, live[i].size, live[i].tag))
                    bad = i;
            if (bad == SIZE_MAX)
                printf("ok\n");
            else
                printf("bad %zu\n", bad);
        } else if (!strncmp(line, "stats", 5)) {
            int64_t r = 0, al = 0;
            xseg_stat(0, "reserved_bytes.all.current", &r);
            xseg_stat(0, "allocated_bytes.all.current", &al);
            printf("reserved %lld allocated %lld\n", (long long)r, (long long)al);
        } else if (sscanf(line, "cualloc %zu", &a) == 1) {
            CUdeviceptr dp = 0;
            CUresult r = drv->cuMemAlloc(&dp, a << 20);
            if (r == CUDA_SUCCESS)
                printf("ok\n");
            else
                printf("error %d\n", (int)r);
        } else if (sscanf(line, "take %zu", &a) == 1) {
            void *p = NULL;
            if (nlive == MAX_LIVE) {
                printf("oom too many allocations\n");
            } else if (xseg_malloc(&p, a << 20, 0, NULL) != XSEG_SUCCESS) {
                const char *msg = xseg_last_error();
                printf("oom %.*s\n", (int)strcspn(msg, "\n"), msg);
            } else {
                live[nlive++] = (struct live){p, a << 20, UINT_MAX};
                printf("ok\n");
            }
        } else if (sscanf(line, "grab %zu", &a) == 1) {
            size_t got = 0;
            void *p = NULL;
            while (nlive < MAX_LIVE && xseg_malloc(&p, a << 20, 0, NULL) == XSEG_SUCCESS) {
                live[nlive++] = (struct live){p, a << 20, UINT_MAX}; /* no pattern: check skips it */
                got++;
            }
            printf("got %zu\n", got);
        } else if (!strncmp(line, "freeall", 7)) {
            for (size_t i = 0; i < nlive; i++)
                if (live[i].p)
                    xseg_free(live[i].p);
            nlive = 0;
            printf("ok\n");
        } else if (!strncmp(line, "trim", 4)) {
            printf(xseg_trim(0, 0) == XSEG_SUCCESS ? "ok\n" : "error trim\n");
        } else if (!strncmp(line, "group", 5)) {
            xseg_group_member m[64];
            size_t n = 0;
            if (xseg_group_stats(0, m, 64, &n) != XSEG_SUCCESS) {
                printf("error %s\n", xseg_last_error());
                continue;
            }
            size_t i = 0;
            while (i < n && i < 64 && m[i].pid != getpid())
                i++;
            if (i < n && i < 64)
                printf("asked %llu gave %llu gave_bytes %llu foreign %llu budget %llu group_budget %llu "
                       "timeouts %u cached %llu\n",
                       (unsigned long long)m[i].asked_count, (unsigned long long)m[i].gave_way_count,
                       (unsigned long long)m[i].gave_way_bytes, (unsigned long long)m[i].foreign_bytes,
                       (unsigned long long)m[i].budget_bytes, (unsigned long long)m[i].group_budget_bytes,
                       m[i].ask_timeouts, (unsigned long long)m[i].reclaimable_bytes);
            else
                printf("error not a member\n");
        } else if (!strncmp(line, "quit", 4)) {
            for (size_t i = 0; i < nlive; i++)
                if (live[i].p)
                    xseg_free(live[i].p);
            xseg_shutdown();
            return 0;
        } else {
            printf("error unknown command\n");
        }
    }
    return 0;
}
