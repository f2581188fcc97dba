/* xseg-replay --explain-oom. See explain.h. */
#define _GNU_SOURCE
#include "tools/replay/explain.h"

#include "tools/replay/report.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xseg.h>

static const double MiB = 1048576.0;

/* One page (or classic segment) that holds free bytes after the OOM path. */
struct page {
    uint64_t addr, size;
    uint64_t free_bytes, live_bytes;
    size_t seg;
    const char *pool;
};

struct live_ptr {
    uintptr_t p;
    int32_t buf;
};

static int cmp_ptr(const void *a, const void *b)
{
    uintptr_t x = ((const struct live_ptr *)a)->p, y = ((const struct live_ptr *)b)->p;
    return x < y ? -1 : x > y;
}

static int cmp_page(const void *a, const void *b)
{
    const struct page *x = a, *y = b;
    if (x->free_bytes != y->free_bytes)
        return x->free_bytes > y->free_bytes ? -1 : 1;
    return x->addr < y->addr ? -1 : x->addr > y->addr;
}

/* The large pool's expandable page, from the config in force (20 MiB unless set). */
static uint64_t large_page(void)
{
    char cfg[4096];
    size_t len = 0;
    uint64_t mib = 20;
    if (xseg_get_config(cfg, sizeof cfg, &len) == XSEG_SUCCESS && len < sizeof cfg) {
        const char *k = strstr(cfg, "expandable_page_size_mb:");
        if (k)
            mib = strtoull(k + strlen("expandable_page_size_mb:"), NULL, 10);
    }
    return (mib ? mib : 20) << 20;
}

/* The line that allocated buffer @p buf live at action @p ai, and the line that frees it next (0:
 * never). */
/* The alloc before @p ai and the free after it of buffer @p buf: their action indices (-1: none;
 * the plot's x axis counts the same indices). */
static void actions_of(const struct trace *t, size_t ai, int32_t buf, long *alloc, long *freed)
{
    *alloc = *freed = -1;
    for (size_t i = ai; i-- > 0;)
        if (t->actions[i].buf == buf && t->actions[i].op == TRACE_ALLOC) {
            *alloc = (long)i;
            break;
        }
    for (size_t i = ai + 1; i < t->count; i++)
        if (t->actions[i].buf == buf && t->actions[i].op == TRACE_FREE) {
            *freed = (long)i;
            break;
        }
}

/* Is @p file the program's own code rather than PyTorch's, a library's or C++ (a snapshot's
 * frames run innermost first through torch/, site-packages and the C++ allocator)? */
static int user_file(const char *file)
{
    size_t n = strlen(file);
    static const char *const cxx[] = {".cpp", ".cc", ".cu", ".h", ".hpp"};
    if (!n || file[0] == '?' || file[0] == '<' || strstr(file, "/torch/") || strstr(file, "site-packages/") ||
        strstr(file, "dist-packages/") || strstr(file, "/lib/python"))
        return 0;
    for (size_t i = 0; i < sizeof cxx / sizeof cxx[0]; i++) {
        size_t k = strlen(cxx[i]);
        if (n > k && !strcmp(file + n - k, cxx[i]))
            return 0;
    }
    return 1;
}

/* " by train.py:57 in forward": the innermost frame of the program's own code in the stack of
 * alloc action @p i (user_file), or "" when the trace carries no frames there. A path keeps its
 * last two parts. */
static void user_frame(const struct trace *t, size_t i, char *buf, size_t len)
{
    buf[0] = '\0';
    uint32_t st = t->actions[i].stack;
    if (!st || st > t->stack_names.count)
        return;
    const struct trace_stack *s = &t->stacks[st - 1];
    for (size_t k = 0; k < s->n; k++) {
        const char *file = trace_text(t, s->f[k].file);
        if (!user_file(file))
            continue;
        const char *p = file + strlen(file), *tail = file;
        for (int slashes = 0; p > file; p--)
            if (p[-1] == '/' && ++slashes == 2) {
                tail = p;
                break;
            }
        snprintf(buf, len, " by %s:%d in %s", tail, s->f[k].line, trace_text(t, s->f[k].name));
        return;
    }
}

/* Where the program made action @p i, as its user reads it: the action index (the plot's x axis),
 * the trace's own line when the user wrote the trace (a converted snapshot's lines are nobody's),
 * and the program's frame when the trace has one. */
static void where_of(const struct trace *t, long i, char *buf, size_t len)
{
    char fr[200];
    user_frame(t, (size_t)i, fr, sizeof fr);
    if (t->recorded.peak_reserved >= 0 || t->recorded.expandable >= 0) /* from a PyTorch recording */
        snprintf(buf, len, "action %ld%s", i, fr);
    else
        snprintf(buf, len, "action %ld (line %u)%s", i, t->actions[i].line, fr);
}

/* The pages of segment @p s with free bytes, appended to *@p pages. -1: out of host memory. */
static int pages_of(const xseg_segment_info *s, size_t si, uint64_t page, struct page **pages, size_t *n, size_t *cap)
{
    uint64_t unit = !s->is_expandable ? s->total_size : s->is_large ? page : (uint64_t)2 << 20;
    if (!unit)
        return 0;
    size_t first = *n;
    for (size_t b = 0; b < s->nblocks; b++) {
        const xseg_block_info *bl = &s->blocks[b];
        int is_free = bl->state == XSEG_BLOCK_INACTIVE;
        for (uint64_t a = bl->address, end = bl->address + bl->size; a < end;) {
            uint64_t k = (a - s->address) / unit, lo = s->address + k * unit, hi = lo + unit;
            uint64_t part = (end < hi ? end : hi) - a;
            struct page *pg = NULL;
            for (size_t i = first; i < *n; i++) /* blocks come in address order: the last ones */
                if ((*pages)[i].addr == lo)
                    pg = &(*pages)[i];
            if (!pg) {
                if (*n == *cap) {
                    size_t nc = *cap ? *cap * 2 : 64;
                    struct page *np = realloc(*pages, nc * sizeof *np);
                    if (!np)
                        return -1;
                    *pages = np;
                    *cap = nc;
                }
                pg = &(*pages)[(*n)++];
                uint64_t send = s->address + s->total_size;
                *pg = (struct page){lo, (hi < send ? hi : send) - lo, 0, 0, si, s->is_large ? "large" : "small"};
            }
            if (is_free)
                pg->free_bytes += part;
            else
                pg->live_bytes += part;
            a += part;
        }
    }
    /* only the pages that hold free bytes stay */
    size_t k = first;
    for (size_t i = first; i < *n; i++)
        if ((*pages)[i].free_bytes)
            (*pages)[k++] = (*pages)[i];
    *n = k;
    return 0;
}

/* The live blocks of page @p pg, as trace buffers, into @p f. */
static void pins_of(FILE *f, const struct trace *t, size_t ai, const xseg_segment_info *s, const struct page *pg,
                    const struct live_ptr *live, size_t nlive)
{
    size_t shown = 0, more = 0;
    for (size_t b = 0; b < s->nblocks; b++) {
        const xseg_block_info *bl = &s->blocks[b];
        if (bl->state == XSEG_BLOCK_INACTIVE || bl->address >= pg->addr + pg->size ||
            bl->address + bl->size <= pg->addr)
            continue;
        if (shown == EXPLAIN_PINS) {
            more++;
            continue;
        }
        shown++;
        struct live_ptr key = {(uintptr_t)bl->address, -1};
        const struct live_ptr *hit = nlive ? bsearch(&key, live, nlive, sizeof *live, cmp_ptr) : NULL;
        if (!hit) {
            fprintf(f, "      a %.1f MiB block%s (not a trace buffer)\n", (double)bl->size / MiB,
                    bl->state == XSEG_BLOCK_ACTIVE_PENDING_FREE ? " freed, waiting for its streams" : "");
            continue;
        }
        long al, fr;
        char w[256];
        actions_of(t, ai, hit->buf, &al, &fr);
        if (al >= 0)
            where_of(t, al, w, sizeof w);
        fprintf(f, "      %s: %.1f MiB, allocated at %s, ", t->bufs.names[hit->buf], (double)bl->size / MiB,
                al >= 0 ? w : "the trace's start");
        if (fr >= 0) {
            where_of(t, fr, w, sizeof w);
            fprintf(f, "freed at %s\n", w);
        }
        else
            fputs("never freed in the trace\n", f);
    }
    if (more)
        fprintf(f, "      and %zu more live block%s\n", more, more == 1 ? "" : "s");
}

char *explain_oom(const struct trace *t, size_t ai, void *const *ptrs, char *err, size_t errlen)
{
    xseg_snapshot *snap = NULL;
    if (xseg_take_snapshot(0, &snap) != XSEG_SUCCESS) {
        snprintf(err, errlen, "--explain-oom: no snapshot: %s", xseg_last_error());
        return NULL;
    }
    char *text = NULL;
    size_t len = 0, npages = 0, cap = 0, nlive = 0;
    struct page *pages = NULL;
    struct live_ptr *live = calloc(t->bufs.count ? t->bufs.count : 1, sizeof *live);
    FILE *f = open_memstream(&text, &len);
    int oom = !live || !f;
    for (size_t b = 0; !oom && b < t->bufs.count; b++)
        if (ptrs[b])
            live[nlive++] = (struct live_ptr){(uintptr_t)ptrs[b], (int32_t)b};
    if (!oom)
        qsort(live, nlive, sizeof *live, cmp_ptr);
    uint64_t page = large_page(), reserved = 0, allocated = 0, stranded = 0, pinned = 0;
    for (size_t s = 0; !oom && s < snap->nsegments; s++) {
        reserved += snap->segments[s].total_size;
        allocated += snap->segments[s].allocated_size;
        oom = pages_of(&snap->segments[s], s, page, &pages, &npages, &cap) != 0;
    }
    if (oom) {
        snprintf(err, errlen, "--explain-oom: out of host memory");
        if (f)
            fclose(f);
        free(text);
        text = NULL;
        goto out;
    }
    for (size_t i = 0; i < npages; i++) {
        stranded += pages[i].free_bytes;
        pinned += pages[i].live_bytes ? 1 : 0;
    }
    qsort(pages, npages, sizeof *pages, cmp_page);
    const struct trace_action *a = &t->actions[ai];
    char w[256];
    where_of(t, (long)ai, w, sizeof w);
    fprintf(f, "== --explain-oom: %s: a %.1f MiB allocation (%s) failed at %s\n", t->source, (double)a->size / MiB,
            t->bufs.names[a->buf], w);
    fprintf(f, "After xseg's OOM path: %.1f MiB reserved, %.1f MiB allocated; %.1f MiB free but still mapped in "
               "%zu page%s (%zu with live bytes: stranded, they go back only when those blocks are freed).\n",
            (double)reserved / MiB, (double)allocated / MiB, (double)stranded / MiB, npages, npages == 1 ? "" : "s",
            pinned);
    if (npages)
        fprintf(f, "Pages (large pool: %llu MiB, from each mapped run's start; small pool: 2 MiB; classic: the "
                   "segment), most free first, and the live blocks pinning them:\n",
                (unsigned long long)(page >> 20));
    for (size_t i = 0; i < npages && i < EXPLAIN_PAGES; i++) {
        const struct page *pg = &pages[i];
        const xseg_segment_info *s = &snap->segments[pg->seg];
        fprintf(f, "  %s-pool %s %#llx (%.1f MiB): %.1f MiB free, %.1f MiB live\n", pg->pool,
                s->is_expandable ? "page" : "classic segment", (unsigned long long)pg->addr, (double)pg->size / MiB,
                (double)pg->free_bytes / MiB, (double)pg->live_bytes / MiB);
        pins_of(f, t, ai, s, pg, live, nlive);
    }
    if (npages > EXPLAIN_PAGES)
        fprintf(f, "  and %zu more page%s\n", npages - EXPLAIN_PAGES, npages - EXPLAIN_PAGES == 1 ? "" : "s");
    if (fclose(f) != 0) {
        snprintf(err, errlen, "--explain-oom: out of host memory");
        free(text);
        text = NULL;
    }
out:
    free(pages);
    free(live);
    xseg_snapshot_free(snap);
    return text;
}

void explain_oom_emit(FILE *out, int json, const struct trace *t, size_t ai, void *const *ptrs)
{
    char err[160];
    char *text = explain_oom(t, ai, ptrs, err, sizeof err);
    if (!text) {
        fprintf(stderr, "xseg-replay: %s\n", err);
        return;
    }
    if (json) {
        fputs("{\"explain_oom\": ", out);
        report_json_string(out, text);
        fputs("}\n", out);
    } else {
        fputs(text, out);
    }
    free(text);
}

static int hex(char h)
{
    return h >= '0' && h <= '9'   ? h - '0'
           : h >= 'a' && h <= 'f' ? h - 'a' + 10
           : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                  : -1;
}

char *explain_oom_from_json(const char *line)
{
    static const char head[] = "{\"explain_oom\": \"";
    if (strncmp(line, head, sizeof head - 1))
        return NULL;
    const char *p = line + sizeof head - 1;
    char *out = malloc(strlen(p) + 1), *o = out;
    while (out && *p && *p != '"') {
        char c = *p++;
        if (c == '\\') {
            char e = *p ? *p++ : '\0';
            int v = 0;
            switch (e) {
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'u':
                for (int i = 0; i < 4; i++) {
                    int h = hex(*p);
                    if (h < 0)
                        break;
                    v = v * 16 + h;
                    p++;
                }
                c = v > 0 && v < 0x80 ? (char)v : '?';
                break;
            case '\0': c = '?'; break;
            default: c = e;
            }
        }
        *o++ = c;
    }
    if (out)
        *o = '\0';
    return out;
}
