/*
 * xseg-top: the memory groups of this user on this machine (issue 37). Reads every table in
 * /dev/shm named xseg-group-<device uuid>-<group> through xseg_group_read (no driver, no
 * joining) and prints each group's members: pid, reserved, allocated, cached, budget, foreign
 * bytes (device memory held outside xseg, estimated) and give-way counts, and the group budget. Refreshes every second on a terminal; once with --once, or when stdout is not
 * a terminal; --json prints one JSON document (once).
 */
#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "xseg.h"

#define MAX_MEMBERS 64
#define MAX_TABLES 256

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The table names in /dev/shm, sorted; @return their count (at most MAX_TABLES). */
static size_t list_tables(char *names[MAX_TABLES])
{
    size_t n = 0;
    DIR *dir = opendir("/dev/shm");
    if (!dir)
        return 0;
    struct dirent *e;
    while ((e = readdir(dir)) && n < MAX_TABLES)
        if (!strncmp(e->d_name, "xseg-group-", 11) && (names[n] = strdup(e->d_name)))
            n++;
    closedir(dir);
    qsort(names, n, sizeof *names, by_name);
    return n;
}

/* "xseg-group-<32 hex>-<group>": the uuid and the group, or false. */
static bool split_name(const char *t, char uuid[33], const char **group)
{
    if (strlen(t) < 11 + 33 + 1 || t[11 + 32] != '-')
        return false;
    memcpy(uuid, t + 11, 32);
    uuid[32] = '\0';
    *group = t + 11 + 33;
    return true;
}

static void json_str(const char *s)
{
    putchar('"');
    for (; *s; s++)
        if (*s == '"' || *s == '\\')
            printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            printf("\\u%04x", *s);
        else
            putchar(*s);
    putchar('"');
}

static void mib(char *buf, size_t n, uint64_t b) { snprintf(buf, n, "%.1f", (double)b / (1 << 20)); }

static void show(bool json)
{
    char *names[MAX_TABLES];
    size_t n = list_tables(names);
    if (json)
        printf("{\"groups\": [");
    else
        printf("%-20s %-34s %8s %10s %10s %10s %10s %10s %6s %10s %6s %10s\n", "GROUP", "DEVICE UUID", "PID",
               "RESERVED", "ALLOCATED", "CACHED", "BUDGET", "FOREIGN", "GAVE", "GAVE MiB", "ASKED",
               "GRP BUDGET");
    for (size_t i = 0; i < n; i++) {
        char uuid[33] = "?";
        const char *group = names[i];
        if (!split_name(names[i], uuid, &group))
            group = names[i];
        xseg_group_member m[MAX_MEMBERS];
        size_t count = 0;
        xseg_status st = xseg_group_read(names[i], m, MAX_MEMBERS, &count);
        if (count > MAX_MEMBERS)
            count = MAX_MEMBERS;
        if (json) {
            printf("%s\n  {\"table\": ", i ? "," : "");
            json_str(names[i]);
            printf(", \"device_uuid\": \"%s\", \"group\": ", uuid);
            json_str(group);
            if (st != XSEG_SUCCESS) {
                printf(", \"error\": ");
                json_str(xseg_last_error());
                printf(", \"members\": []}");
                continue;
            }
            printf(", \"members\": [");
            for (size_t k = 0; k < count; k++)
                printf("%s{\"pid\": %d, \"reserved_bytes\": %llu, \"allocated_bytes\": %llu, "
                       "\"cached_bytes\": %llu, \"budget_bytes\": %llu, \"gave_way_count\": %llu, "
                       "\"gave_way_bytes\": %llu, \"asked_count\": %llu, \"foreign_bytes\": %llu, "
                       "\"group_budget_bytes\": %llu}",
                       k ? ", " : "", m[k].pid, (unsigned long long)m[k].reserved_bytes,
                       (unsigned long long)m[k].allocated_bytes, (unsigned long long)m[k].reclaimable_bytes,
                       (unsigned long long)m[k].budget_bytes, (unsigned long long)m[k].gave_way_count,
                       (unsigned long long)m[k].gave_way_bytes, (unsigned long long)m[k].asked_count,
                       (unsigned long long)m[k].foreign_bytes, (unsigned long long)m[k].group_budget_bytes);
            printf("]}");
            continue;
        }
        if (st != XSEG_SUCCESS) {
            printf("%-20.20s %-34s %s\n", group, uuid, xseg_last_error());
            continue;
        }
        for (size_t k = 0; k < count; k++) {
            char r[32], a[32], c[32], b[32], g[32], f[32], gb[32] = "";
            mib(r, sizeof r, m[k].reserved_bytes);
            mib(a, sizeof a, m[k].allocated_bytes);
            mib(c, sizeof c, m[k].reclaimable_bytes);
            mib(g, sizeof g, m[k].gave_way_bytes);
            mib(f, sizeof f, m[k].foreign_bytes);
            if (!k)
                m[k].group_budget_bytes ? mib(gb, sizeof gb, m[k].group_budget_bytes) : (void)snprintf(gb, sizeof gb, "-");
            if (m[k].budget_bytes)
                mib(b, sizeof b, m[k].budget_bytes);
            else
                snprintf(b, sizeof b, "-");
            printf("%-20.20s %-34s %8d %10s %10s %10s %10s %10s %6llu %10s %6llu %10s\n", k ? "" : group,
                   k ? "" : uuid, m[k].pid, r, a, c, b, f, (unsigned long long)m[k].gave_way_count, g,
                   (unsigned long long)m[k].asked_count, gb);
        }
    }
    if (json)
        printf("%s]}\n", n ? "\n" : "");
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    bool once = false, json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--once"))
            once = true;
        else if (!strcmp(argv[i], "--json"))
            json = true;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: xseg-top [--once] [--json]\n"
                   "  the memory groups (memory_group) of this user on this machine, with each member's\n"
                   "  pid, reserved, allocated, cached, budget and foreign MiB (device memory held outside\n"
                   "  xseg, estimated), give-way counts and the group budget; refreshes every\n"
                   "  second on a terminal, once with --once, --json or when stdout is not a terminal\n");
            return 0;
        } else {
            fprintf(stderr, "xseg-top: unknown option '%s' (try --help)\n", argv[i]);
            return 2;
        }
    }
    if (json || once || !isatty(STDOUT_FILENO)) {
        show(json);
        return 0;
    }
    for (;;) {
        printf("\033[H\033[2J");
        show(false);
        sleep(1);
    }
}
