/*
 * xseg-top: the memory groups of this user on this machine (issue 37). Reads every table in
 * /dev/shm named xseg-group-<device uuid>-<group> that this user owns (--all-users: other users'
 * too, listed after) through xseg_group_read (no driver, no joining) and prints each group's
 * members: pid, reserved, allocated, cached, budget, foreign bytes (device memory held outside
 * xseg, estimated) and give-way counts, and the group budget. Refreshes every second on a
 * terminal; once with --once, or when stdout is not a terminal; --json prints one JSON document
 * (once). Any local user can name a file in /dev/shm: every name and message is escaped.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "xseg.h"

#define MAX_MEMBERS 64
/* Tables shown at most, this user's first: another user's names never push them out. */
#define MAX_TABLES 1024

struct table {
    char *name; /* as found in /dev/shm: any bytes but '/' and NUL, from any local user */
    uid_t uid;  /* its owner */
    bool mine;  /* owned by this user (the effective uid, as xseg_group_read checks) */
};

struct listing {
    struct table *v;
    size_t n, not_shown; /* not_shown: tables past MAX_TABLES */
};

/* This user's tables first, then by name. */
static int by_owner_name(const void *a, const void *b)
{
    const struct table *x = a, *y = b;
    return x->mine != y->mine ? (y->mine ? 1 : -1) : strcmp(x->name, y->name);
}

static void listing_free(struct listing *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i].name);
    free(l->v);
    *l = (struct listing){0};
}

/* The tables in /dev/shm: this user's (by owner, not by name), and with @p all_users everyone
 * else's after them, each part sorted by name, at most MAX_TABLES in all (the rest counted).
 * @return false with a message on stderr when /dev/shm cannot be read or memory runs out. */
static bool list_tables(bool all_users, struct listing *out)
{
    *out = (struct listing){0};
    DIR *dir = opendir("/dev/shm");
    if (!dir) {
        fprintf(stderr, "xseg-top: cannot read /dev/shm: %s\n", strerror(errno));
        return false;
    }
    uid_t me = geteuid();
    size_t cap = 0, kept[2] = {0, 0}; /* kept: [0] this user's, [1] other users' (each capped) */
    bool ok = true;
    struct dirent *e;
    while ((e = readdir(dir))) {
        struct stat st;
        if (strncmp(e->d_name, "xseg-group-", 11) ||
            fstatat(dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) || (st.st_uid != me && !all_users))
            continue; /* filtered first, then limited */
        bool mine = st.st_uid == me;
        if (kept[!mine] == MAX_TABLES) {
            out->not_shown++;
            continue;
        }
        if (out->n == cap) {
            size_t want = cap ? 2 * cap : 16;
            struct table *v = realloc(out->v, want * sizeof *v);
            if (!v) {
                ok = false;
                break;
            }
            out->v = v;
            cap = want;
        }
        if (!(out->v[out->n].name = strdup(e->d_name))) {
            ok = false;
            break;
        }
        out->v[out->n].uid = st.st_uid;
        out->v[out->n++].mine = mine;
        kept[!mine]++;
    }
    closedir(dir);
    if (!ok) {
        fprintf(stderr, "xseg-top: out of memory listing /dev/shm\n");
        listing_free(out);
        return false;
    }
    if (out->n)
        qsort(out->v, out->n, sizeof *out->v, by_owner_name);
    for (; out->n > MAX_TABLES; out->n--) { /* other users' past the room this user's left */
        free(out->v[out->n - 1].name);
        out->not_shown++;
    }
    return true;
}

/* "xseg-group-<32 bytes>-<group>": the uuid part and the group, or false. Neither is trusted. */
static bool split_name(const char *t, char uuid[33], const char **group)
{
    if (strlen(t) < 11 + 33 + 1 || t[11 + 32] != '-')
        return false;
    memcpy(uuid, t + 11, 32);
    uuid[32] = '\0';
    *group = t + 11 + 33;
    return true;
}

/* @p s for a terminal into @p dst (@p cap bytes): printable ASCII as is, a backslash doubled,
 * every other byte as \xNN, so no control byte (ESC, C1, ...) reaches the terminal. At most
 * @p width characters (0: as many as fit), never half an escape. */
static const char *term_str(char *dst, size_t cap, const char *s, size_t width)
{
    size_t n = 0, limit = width && width < cap - 1 ? width : cap - 1;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char unit[5];
        if (*p == '\\')
            snprintf(unit, sizeof unit, "\\\\");
        else if (*p >= 0x20 && *p < 0x7f)
            snprintf(unit, sizeof unit, "%c", *p);
        else
            snprintf(unit, sizeof unit, "\\x%02x", *p);
        size_t u = strlen(unit);
        if (n + u > limit)
            break;
        memcpy(dst + n, unit, u);
        n += u;
    }
    dst[n] = '\0';
    return dst;
}

/* The length of the well-formed UTF-8 sequence at @p s (its code point in @p cp), or 0. */
static size_t utf8_seq(const unsigned char *s, uint32_t *cp)
{
    if (s[0] < 0x80) {
        *cp = s[0];
        return 1;
    }
    size_t len = s[0] >= 0xc2 && s[0] <= 0xdf ? 2 : s[0] >= 0xe0 && s[0] <= 0xef ? 3
               : s[0] >= 0xf0 && s[0] <= 0xf4 ? 4 : 0;
    if (!len)
        return 0;
    uint32_t c = s[0] & (0x7f >> len);
    for (size_t i = 1; i < len; i++) { /* stops at the NUL: it is no continuation byte */
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        c = c << 6 | (s[i] & 0x3f);
    }
    if ((len == 3 && (c < 0x800 || (c >= 0xd800 && c <= 0xdfff))) ||
        (len == 4 && (c < 0x10000 || c > 0x10ffff)))
        return 0; /* overlong, a surrogate, past Unicode */
    *cp = c;
    return len;
}

/* @p s as a JSON string in ASCII: quote and backslash escaped, controls, DEL and every code point
 * past ASCII as \uNNNN (a pair past U+FFFF), each byte that is not well-formed UTF-8 as U+FFFD:
 * valid JSON whatever the bytes, and nothing a terminal acts on (C1, bidi controls) when shown. */
static void json_str(const char *s)
{
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        uint32_t cp = 0;
        size_t len = utf8_seq(p, &cp);
        if (!len) {
            fputs("\\ufffd", stdout);
            p++;
            continue;
        }
        if (cp == '"' || cp == '\\')
            printf("\\%c", (int)cp);
        else if (cp > 0xffff)
            printf("\\u%04x\\u%04x", (unsigned)(0xd800 + ((cp - 0x10000) >> 10)),
                   (unsigned)(0xdc00 + ((cp - 0x10000) & 0x3ff)));
        else if (cp < 0x20 || cp >= 0x7f)
            printf("\\u%04x", (unsigned)cp);
        else
            putchar((int)cp);
        p += len;
    }
    putchar('"');
}

static void mib(char *buf, size_t n, uint64_t b) { snprintf(buf, n, "%.1f", (double)b / (1 << 20)); }

/* One listing on stdout; @return false (message on stderr) when /dev/shm could not be listed. */
static bool show(bool json, bool all_users)
{
    struct listing l;
    if (!list_tables(all_users, &l))
        return false;
    if (json)
        printf("{\"groups\": [");
    else
        printf("%-20s %-34s %8s %10s %10s %10s %10s %10s %6s %10s %6s %10s\n", "GROUP", "DEVICE UUID", "PID",
               "RESERVED", "ALLOCATED", "CACHED", "BUDGET", "FOREIGN", "GAVE", "GAVE MiB", "ASKED",
               "GRP BUDGET");
    for (size_t i = 0; i < l.n; i++) {
        const char *name = l.v[i].name;
        char uuid[33] = "?", tg[96], tu[160], terr[4096];
        const char *group = name;
        if (!split_name(name, uuid, &group))
            group = name;
        xseg_group_member m[MAX_MEMBERS];
        size_t count = 0;
        xseg_status st = xseg_group_read(name, m, MAX_MEMBERS, &count);
        if (count > MAX_MEMBERS)
            count = MAX_MEMBERS;
        if (json) {
            printf("%s\n  {\"table\": ", i ? "," : "");
            json_str(name);
            printf(", \"device_uuid\": ");
            json_str(uuid);
            printf(", \"group\": ");
            json_str(group);
            printf(", \"owner_uid\": %lu", (unsigned long)l.v[i].uid);
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
                       "\"gave_way_bytes\": %llu, \"asked_count\": %llu, \"ask_timeouts\": %u, \"foreign_bytes\": %llu, "
                       "\"group_budget_bytes\": %llu}",
                       k ? ", " : "", m[k].pid, (unsigned long long)m[k].reserved_bytes,
                       (unsigned long long)m[k].allocated_bytes, (unsigned long long)m[k].reclaimable_bytes,
                       (unsigned long long)m[k].budget_bytes, (unsigned long long)m[k].gave_way_count,
                       (unsigned long long)m[k].gave_way_bytes, (unsigned long long)m[k].asked_count,
                       (unsigned)m[k].ask_timeouts, (unsigned long long)m[k].foreign_bytes, (unsigned long long)m[k].group_budget_bytes);
            printf("]}");
            continue;
        }
        term_str(tg, sizeof tg, group, 20);
        term_str(tu, sizeof tu, uuid, 32);
        if (st != XSEG_SUCCESS) {
            printf("%-20s %-34s %s", tg, tu, term_str(terr, sizeof terr, xseg_last_error(), 0));
            if (!l.v[i].mine)
                printf(" (owner uid %lu)", (unsigned long)l.v[i].uid);
            putchar('\n');
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
            printf("%-20s %-34s %8d %10s %10s %10s %10s %10s %6llu %10s %6llu %10s\n", k ? "" : tg,
                   k ? "" : tu, m[k].pid, r, a, c, b, f, (unsigned long long)m[k].gave_way_count, g,
                   (unsigned long long)m[k].asked_count, gb);
        }
    }
    if (json)
        printf("%s], \"tables_not_shown\": %zu}\n", l.n ? "\n" : "", l.not_shown);
    else if (l.not_shown)
        printf("(%zu more tables not shown: at most %d)\n", l.not_shown, MAX_TABLES);
    listing_free(&l);
    fflush(stdout);
    return true;
}

int main(int argc, char **argv)
{
    bool once = false, json = false, all_users = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--once"))
            once = true;
        else if (!strcmp(argv[i], "--json"))
            json = true;
        else if (!strcmp(argv[i], "--all-users"))
            all_users = true;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: xseg-top [--once] [--json] [--all-users]\n"
                   "  the memory groups (memory_group) of this user on this machine, with each member's\n"
                   "  pid, reserved, allocated, cached, budget and foreign MiB (device memory held outside\n"
                   "  xseg, estimated), give-way counts and the group budget; refreshes every\n"
                   "  second on a terminal, once with --once, --json or when stdout is not a terminal.\n"
                   "  --all-users also lists the tables of other users (after this user's, by name and\n"
                   "  owner only: their members are not readable). Names are escaped (\\xNN on a\n"
                   "  terminal, JSON string escapes), whoever made them.\n");
            return 0;
        } else {
            char arg[256];
            fprintf(stderr, "xseg-top: unknown option '%s' (try --help)\n",
                    term_str(arg, sizeof arg, argv[i], 0));
            return 2;
        }
    }
    if (json || once || !isatty(STDOUT_FILENO))
        return show(json, all_users) ? 0 : 1;
    for (;;) {
        printf("\033[H\033[2J");
        show(false, all_users);
        sleep(1);
    }
}
