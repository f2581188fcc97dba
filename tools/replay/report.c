/* What xseg-replay prints. See report.h. */
#include "tools/replay/report.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const pool_keys[] = {"all", "small_pool", "large_pool"};
static const double GiB = 1073741824.0;

void report_mark_header(FILE *out, size_t label_width, int pool)
{
    char tag[64];
    snprintf(tag, sizeof tag, "Tag (GiB%s)", pool == XSEG_STAT_LARGE_POOL ? ", large pool"
                                             : pool == XSEG_STAT_SMALL_POOL ? ", small pool" : "");
    int w = fprintf(out, "%-*s %10s %10s %14s %10s\n", (int)label_width, tag, "Allocated", "Active",
                    "InactiveSplit", "Reserved");
    for (int i = 1; i < w; i++)
        fputc('-', out);
    fputc('\n', out);
}

void report_mark_row(FILE *out, size_t label_width, const char *label, const xseg_device_stats *ds, int pool)
{
    fprintf(out, "%-*s %10.3f %10.3f %14.3f %10.3f\n", (int)label_width, label,
            (double)ds->allocated_bytes[pool].current / GiB, (double)ds->active_bytes[pool].current / GiB,
            (double)ds->inactive_split_bytes[pool].current / GiB,
            (double)ds->reserved_bytes[pool].current / GiB);
}

void report_json_string(FILE *out, const char *s)
{
    fputc('"', out);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(out, "\\%c", c);
        else if (c < 0x20)
            fprintf(out, "\\u%04x", c);
        else
            fputc(c, out);
    }
    fputc('"', out);
}

void report_mark_jsonl(FILE *out, const char *label, const char *mode, int device)
{
    fputs("{\"mark\": ", out);
    report_json_string(out, label);
    fputs(", \"mode\": ", out);
    report_json_string(out, mode);
    const char *key;
    for (size_t i = 0; xseg_stat_key(i, &key) == XSEG_SUCCESS && key; i++) {
        int64_t v;
        if (xseg_stat(device, key, &v) != XSEG_SUCCESS)
            continue;
        fputs(", ", out);
        report_json_string(out, key);
        fprintf(out, ": %" PRId64, v);
    }
    fputs("}\n", out);
}

/* "51.2 GiB", "812 MiB": one decimal from 10 GiB, two from 1 GiB, MiB below. */
static void human(char *buf, size_t len, int64_t b)
{
    double g = (double)b / GiB;
    if (g >= 10)
        snprintf(buf, len, "%.1f GiB", g);
    else if (g >= 1)
        snprintf(buf, len, "%.2f GiB", g);
    else
        snprintf(buf, len, "%.0f MiB", (double)b / (1 << 20));
}

static int is_classic(const struct run_summary *s) { return !strncmp(s->mode, "classic", 7); }

static const char *const classic_name = "PyTorch's allocator (classic mode, as modelled)";

/* "On your D device (...), xseg would have avoided this OOM: ...; PyTorch's allocator ... fails
 * there too." from the summaries' oom_device and oom_fits (either mode may be missing). */
static void oom_sentence(char *buf, size_t len, const struct run_summary *xs, const struct run_summary *cl)
{
    const struct run_summary *o = xs && xs->oom_device ? xs : cl;
    char d[32], x[160] = "", k[128] = "";
    human(d, sizeof d, (int64_t)o->oom_device);
    if (xs && xs->oom_device)
        snprintf(x, sizeof x, "%s", xs->oom_fits ? "xseg would have avoided this OOM: the whole run, the failing request "
                                                   "included, fits there"
                                                 : "xseg would not have avoided this OOM: an allocation fails there too");
    if (cl && cl->oom_device)
        snprintf(k, sizeof k, "%s%s %s there%s", x[0] ? "; " : "", classic_name, cl->oom_fits ? "fits" : "fails",
                 !cl->oom_fits && xs && xs->oom_device && !xs->oom_fits ? " too" : "");
    snprintf(buf, len, "On your %s device (%s), %s%s.", d,
             o->oom_device == o->device_bytes ? "--device-mem" : "the memory PyTorch held plus what was free when it failed",
             x, k);
}

/* The device-size sentence, from each mode's smallest device (--min-device's bisection). */
static void device_sentence(char *buf, size_t len, const struct run_summary *xs, const struct run_summary *cl)
{
    char a[32], b[32];
    if (xs && xs->min_device)
        human(a, sizeof a, (int64_t)xs->min_device);
    if (cl && cl->min_device)
        human(b, sizeof b, (int64_t)cl->min_device);
    if (xs && xs->min_device && cl && cl->min_device) {
        if (!strcmp(a, b))
            snprintf(buf, len, "Smallest device: xseg and %s both fit this run on %s (as --min-device finds it).",
                     classic_name, a);
        else
            snprintf(buf, len, "Smallest device: xseg fits this run on %s where %s needs %s (as --min-device finds "
                     "them).", a, classic_name, b);
    } else if (xs && xs->min_device) {
        snprintf(buf, len, "Smallest device: xseg fits this run on %s (as --min-device finds it).", a);
    } else {
        snprintf(buf, len, "Smallest device: %s fits this run on %s (as --min-device finds it).", classic_name, b);
    }
}

size_t report_verdict(const struct run_summary *s, size_t n, const struct trace_recorded *rec,
                      char lines[][REPORT_VERDICT_MAX], size_t maxlines)
{
    const struct run_summary *cl = NULL, *xs = NULL;
    for (size_t m = 0; m < n; m++) {
        if (is_classic(&s[m]) && !cl)
            cl = &s[m];
        else if (!is_classic(&s[m]) && !xs)
            xs = &s[m];
    }
    int have_rec = rec && rec->peak_reserved > 0;
    size_t k = 0;
    char a[32], b[32], dev[32] = "";
    if (s[0].device_bytes)
        human(dev, sizeof dev, (int64_t)s[0].device_bytes);
    /* A recording that ended in an OOM: its question first. */
    if (rec && (rec->noom || rec->oom_device >= 0) && k < maxlines) {
        if ((xs && xs->oom_device) || (cl && cl->oom_device))
            oom_sentence(lines[k++], REPORT_VERDICT_MAX, xs, cl);
        else
            snprintf(lines[k++], REPORT_VERDICT_MAX, "This run ended in an OOM on a device of unknown size: "
                     "--device-mem SIZE (your device's memory) answers whether xseg would have avoided it.");
    }
    /* Device size: from the smallest devices only, never from peak reserved. */
    if (((xs && xs->min_device) || (cl && cl->min_device)) && k < maxlines)
        device_sentence(lines[k++], REPORT_VERDICT_MAX, xs, cl);
    /* Reserved memory: on the device the replay ran on, and said so. */
    if (xs && (have_rec || cl) && k < maxlines) {
        human(a, sizeof a, xs->peak_reserved);
        human(b, sizeof b, have_rec ? rec->peak_reserved : cl->peak_reserved);
        snprintf(lines[k++], REPORT_VERDICT_MAX, "On the %s%s device, xseg reserves %s at its peak where %s %s %s%s.",
                 dev, dev[0] ? "" : "emulated", a, have_rec ? "PyTorch's allocator" : classic_name,
                 have_rec ? "reserved" : "reserves", b, have_rec ? " (recorded)" : "");
    }
    if (cl && have_rec && k < maxlines) {
        human(a, sizeof a, cl->peak_reserved);
        human(b, sizeof b, rec->peak_reserved);
        snprintf(lines[k++], REPORT_VERDICT_MAX,
                 "Classic mode, PyTorch's allocator as modelled, reserves %s where the recording shows %s "
                 "(%+.1f %%).", a, b, 100.0 * (double)(cl->peak_reserved - rec->peak_reserved) / (double)rec->peak_reserved);
    }
    if (n == 1 && !(xs && have_rec) && !(cl && have_rec) && k < maxlines) {
        human(a, sizeof a, s[0].peak_reserved);
        human(b, sizeof b, s[0].peak_allocated);
        snprintf(lines[k++], REPORT_VERDICT_MAX, "On the %s%s device, %s reserves %s at its peak for %s allocated "
                 "(--min-device: the smallest device it fits on).", dev, dev[0] ? "" : "emulated",
                 xs ? "xseg" : classic_name, a, b);
    }
    for (size_t m = 0; m < n && k < maxlines; m++)
        if (s[m].failed_allocs)
            snprintf(lines[k++], REPORT_VERDICT_MAX,
                     "In %s mode %llu allocation%s failed on the %s%semulated device (--device-mem): the run does "
                     "not fit there.", s[m].mode, (unsigned long long)s[m].failed_allocs,
                     s[m].failed_allocs > 1 ? "s" : "", dev, dev[0] ? " " : "");
    return k;
}

static void verdict_text(FILE *out, const struct run_summary *s, size_t n, const struct trace_recorded *rec)
{
    char lines[REPORT_VERDICT_LINES][REPORT_VERDICT_MAX];
    size_t k = report_verdict(s, n, rec, lines, REPORT_VERDICT_LINES);
    for (size_t i = 0; i < k; i++)
        fprintf(out, "%s\n", lines[i]);
}

static const char *const emulator_note =
    "(emulator figures: cudaemu's host time includes the driver time it models, not a GPU's)";

void report_summary_text(FILE *out, const struct run_summary *s, const struct trace_recorded *rec,
                         int driver_stats)
{
    verdict_text(out, s, 1, rec);
    fprintf(out, "%s [%s]\n", s->trace, s->mode);
    fprintf(out, "  %-28s %" PRIu64 " (allocs %" PRIu64 ", frees %" PRIu64 ", failed allocs %" PRIu64 ")\n",
            "actions", s->actions, s->allocs, s->frees, s->failed_allocs);
    fprintf(out, "  %-28s %.3f GiB", "peak allocated", (double)s->peak_allocated / GiB);
    if (rec && rec->peak_allocated >= 0)
        fprintf(out, " (PyTorch recorded %.3f GiB)", (double)rec->peak_allocated / GiB);
    fprintf(out, "\n  %-28s %.3f GiB", "peak reserved", (double)s->peak_reserved / GiB);
    if (rec && rec->peak_reserved >= 0)
        fprintf(out, " (PyTorch recorded %.3f GiB)", (double)rec->peak_reserved / GiB);
    fprintf(out, "\n  %-28s %.4f\n", "utilization", s->utilization);
    fprintf(out, "  %-28s %.3f GiB\n", "reserved at the end", (double)s->reserved_end / GiB);
    fprintf(out, "  %-28s %.3f GiB\n", "reserved after empty_cache", (double)s->reserved_after_empty_cache / GiB);
    if (s->spills)
        fprintf(out, "  %-28s %.3f GiB at the peak, %" PRIu64 " pages spilled, %" PRIu64 " promoted, %.3f GiB "
                     "copied: %.1f ms of link time at %.0f GB/s (modelled); %" PRIu64 " waits for the device\n",
                "spilled to host", (double)s->spilled_peak / GiB, s->spills, s->promotions,
                (double)s->spill_copied / GiB, 1e3 * (double)s->spill_copied / (REPORT_LINK_GBPS * 1e9),
                REPORT_LINK_GBPS, s->spill_syncs);
    if (!driver_stats)
        return;
    if (s->have_calls)
        fprintf(out, "  %s\n", emulator_note);
    fprintf(out, "  %-28s %.0f ns per alloc, %.0f ns per free\n", "host time", s->host_ns_per_alloc,
            s->host_ns_per_free);
    if (!s->have_calls) {
        fprintf(out, "  %-28s n/a (the real driver has no call counters)\n", "driver calls");
        return;
    }
    fprintf(out, "  %-28s", "driver calls");
    int any = 0;
    for (int e = 0; e < RUN_NENTRIES; e++)
        if (s->calls[e]) {
            fprintf(out, "%s %s %" PRIu64, any ? "," : "", run_entry_names[e], s->calls[e]);
            any = 1;
        }
    fprintf(out, "%s\n", any ? "" : " none");
    if (s->peak_reserved)
        fprintf(out, "  %-28s %.1f\n", "memory calls per GiB reserved",
                (double)s->memory_calls / ((double)s->peak_reserved / GiB));
}

void report_summary_json(FILE *out, const struct run_summary *s)
{
    fputs("{\"mode\": ", out);
    report_json_string(out, s->mode);
    fputs(", \"trace\": ", out);
    report_json_string(out, s->trace);
    fprintf(out, ", \"actions\": %" PRIu64 ", \"allocs\": %" PRIu64 ", \"frees\": %" PRIu64
                 ", \"failed_allocs\": %" PRIu64, s->actions, s->allocs, s->frees, s->failed_allocs);
    fprintf(out, ", \"peak_allocated_bytes\": %" PRId64 ", \"peak_reserved_bytes\": %" PRId64
                 ", \"utilization\": %.6f, \"reserved_end_bytes\": %" PRId64
                 ", \"reserved_after_empty_cache_bytes\": %" PRId64,
            s->peak_allocated, s->peak_reserved, s->utilization, s->reserved_end,
            s->reserved_after_empty_cache);
    fprintf(out, ", \"host_ns_per_alloc\": %.1f, \"host_ns_per_free\": %.1f", s->host_ns_per_alloc,
            s->host_ns_per_free);
    fprintf(out, ", \"spilled_peak_bytes\": %" PRId64 ", \"num_spills\": %" PRIu64 ", \"num_promotions\": %" PRIu64
                 ", \"spill_copied_bytes\": %" PRId64 ", \"spill_link_seconds\": %.6f, \"spill_context_syncs\": %" PRIu64,
            s->spilled_peak, s->spills, s->promotions, s->spill_copied,
            (double)s->spill_copied / (REPORT_LINK_GBPS * 1e9), s->spill_syncs);
    if (s->have_calls) {
        fputs(", \"driver_calls\": {", out);
        for (int e = 0; e < RUN_NENTRIES; e++)
            fprintf(out, "%s\"%s\": %" PRIu64, e ? ", " : "", run_entry_names[e], s->calls[e]);
        fprintf(out, "}, \"driver_memory_calls\": %" PRIu64, s->memory_calls);
    } else {
        fputs(", \"driver_calls\": null", out);
    }
    /* The first failed allocations' action indices, keyed by rank (the reader is flat). */
    fputs(", \"failed_at\": {", out);
    for (uint64_t i = 0; i < s->failed_allocs && i < RUN_FAILED_AT_MAX; i++)
        fprintf(out, "%s\"%" PRIu64 "\": %" PRIu64, i ? ", " : "", i, s->failed_at[i]);
    fputs("}}\n", out);
}

static void gib_cell(char *buf, size_t len, int64_t v) { snprintf(buf, len, "%.3f", (double)v / GiB); }

/* The marks of @p n modes side by side: the mode name over its four columns. */
static void compare_marks(FILE *out, const struct run_summary *s, struct report_mark *const *marks,
                          const size_t *nmarks, size_t n, int pool)
{
    size_t nm = 0, lw = 24;
    for (size_t m = 0; m < n; m++) {
        nm = nm > nmarks[m] ? nm : nmarks[m];
        for (size_t i = 0; i < nmarks[m]; i++)
            lw = strlen(marks[m][i].label) > lw ? strlen(marks[m][i].label) : lw;
    }
    if (!nm)
        return;
    fprintf(out, "%-*s", (int)lw, "");
    for (size_t m = 0; m < n; m++)
        fprintf(out, " | %-41s", s[m].mode);
    fputc('\n', out);
    char tag[64];
    snprintf(tag, sizeof tag, "Tag (GiB%s)", pool == XSEG_STAT_LARGE_POOL ? ", large pool"
                                             : pool == XSEG_STAT_SMALL_POOL ? ", small pool" : "");
    int w = fprintf(out, "%-*s", (int)lw, tag);
    for (size_t m = 0; m < n; m++)
        w += fprintf(out, " | %9s %9s %9s %9s", "Allocated", "Active", "InactSplit", "Reserved");
    fputc('\n', out);
    for (int i = 1; i < w; i++)
        fputc('-', out);
    fputc('\n', out);
    for (size_t i = 0; i < nm; i++) {
        const char *label = "";
        for (size_t m = 0; m < n; m++)
            if (i < nmarks[m]) {
                label = marks[m][i].label;
                break;
            }
        fprintf(out, "%-*s", (int)lw, label);
        for (size_t m = 0; m < n; m++) {
            if (i >= nmarks[m]) {
                fprintf(out, " | %39s", "(stopped)");
                continue;
            }
            fprintf(out, " |");
            for (int k = 0; k < 4; k++)
                fprintf(out, " %9.3f", (double)marks[m][i].v[k] / GiB);
        }
        fputc('\n', out);
    }
    fputc('\n', out);
}

#define ROW(label, fmtexpr, rec_cell)                                                             \
    do {                                                                                          \
        fprintf(out, "%-32s", label);                                                             \
        for (size_t m = 0; m < n; m++) {                                                          \
            char cell[40];                                                                        \
            const struct run_summary *x = &s[m];                                                  \
            fmtexpr;                                                                              \
            fprintf(out, " %14s", cell);                                                          \
        }                                                                                         \
        if (rec_on) {                                                                             \
            char cell[40] = "-";                                                                  \
            rec_cell;                                                                             \
            fprintf(out, " %20s", cell);                                                          \
        }                                                                                         \
        fputc('\n', out);                                                                         \
    } while (0)

/* Host time and driver calls: figures of the replay machine, behind --driver-stats. */
static void compare_driver_stats(FILE *out, const struct run_summary *s, size_t n)
{
    const int rec_on = 0;
    int have = 0;
    for (size_t m = 0; m < n; m++)
        have |= s[m].have_calls;
    fprintf(out, "%s\n", have ? emulator_note : "(host time on the real driver)");
    ROW("host ns per alloc", snprintf(cell, sizeof cell, "%.0f", x->host_ns_per_alloc), (void)0);
    ROW("host ns per free", snprintf(cell, sizeof cell, "%.0f", x->host_ns_per_free), (void)0);
    if (!have) {
        fprintf(out, "%-32s n/a (the real driver has no call counters)\n", "driver calls");
        return;
    }
    for (int e = 0; e < RUN_NENTRIES; e++) {
        uint64_t any = 0;
        for (size_t m = 0; m < n; m++)
            any |= s[m].calls[e];
        if (!any)
            continue;
        char label[48];
        snprintf(label, sizeof label, "  %s", run_entry_names[e]);
        ROW(label, snprintf(cell, sizeof cell, "%" PRIu64, x->calls[e]), (void)0);
    }
    ROW("memory calls per GiB reserved",
        snprintf(cell, sizeof cell, "%.1f",
                 x->peak_reserved ? (double)x->memory_calls / ((double)x->peak_reserved / GiB) : 0.0),
        (void)0);
}

void report_compare_text(FILE *out, const char *trace, const struct run_summary *s,
                         struct report_mark *const *marks, const size_t *nmarks, size_t n, int pool,
                         const struct trace_recorded *rec, int driver_stats)
{
    fprintf(out, "== %s\n", trace);
    verdict_text(out, s, n, rec);
    fputc('\n', out);
    compare_marks(out, s, marks, nmarks, n, pool);
    const int rec_on = rec && rec->peak_reserved >= 0;
    fprintf(out, "%-32s", "");
    for (size_t m = 0; m < n; m++)
        fprintf(out, " %14s", s[m].mode);
    if (rec_on)
        fprintf(out, " %20s", "PyTorch (recorded)");
    fputc('\n', out);
    ROW("peak allocated (GiB)", gib_cell(cell, sizeof cell, x->peak_allocated),
        if (rec->peak_allocated >= 0) gib_cell(cell, sizeof cell, rec->peak_allocated));
    ROW("peak reserved (GiB)", gib_cell(cell, sizeof cell, x->peak_reserved),
        gib_cell(cell, sizeof cell, rec->peak_reserved));
    ROW("utilization", snprintf(cell, sizeof cell, "%.4f", x->utilization),
        if (rec->peak_allocated >= 0 && rec->peak_reserved > 0)
            snprintf(cell, sizeof cell, "%.4f", (double)rec->peak_allocated / (double)rec->peak_reserved));
    ROW("reserved at the end (GiB)", gib_cell(cell, sizeof cell, x->reserved_end), (void)0);
    ROW("reserved after empty_cache", gib_cell(cell, sizeof cell, x->reserved_after_empty_cache), (void)0);
    ROW("failed allocs", snprintf(cell, sizeof cell, "%" PRIu64, x->failed_allocs), (void)0);
    if (driver_stats)
        compare_driver_stats(out, s, n);
    fputc('\n', out);
}
#undef ROW

/* ---- reading the child's JSON back ---- */

struct jp {
    const char *s;
};

static void jp_ws(struct jp *p)
{
    while (*p->s == ' ' || *p->s == '\t' || *p->s == '\n' || *p->s == '\r')
        p->s++;
}

/* A string into @p buf (truncated); \uXXXX outside ASCII becomes '?'. */
static int jp_string(struct jp *p, char *buf, size_t len)
{
    if (*p->s != '"')
        return -1;
    p->s++;
    size_t n = 0;
    while (*p->s && *p->s != '"') {
        char c = *p->s++;
        if (c == '\\') {
            char e = *p->s++;
            switch (e) {
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'r': c = '\r'; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'u': {
                unsigned v = 0;
                for (int i = 0; i < 4; i++) {
                    char h = *p->s++;
                    v = v * 16 + (unsigned)(h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                                            : h >= 'A' && h <= 'F' ? h - 'A' + 10 : 0);
                    if (!h)
                        return -1;
                }
                c = v < 0x80 ? (char)v : '?';
                break;
            }
            case '\0': return -1;
            default: c = e;
            }
        }
        if (n + 1 < len)
            buf[n++] = c;
    }
    if (*p->s != '"')
        return -1;
    p->s++;
    buf[n] = '\0';
    return 0;
}

static int jp_object(struct jp *p, const char *prefix, int depth, report_json_fn fn, void *user)
{
    jp_ws(p);
    if (*p->s != '{' || depth > 1)
        return -1;
    p->s++;
    jp_ws(p);
    if (*p->s == '}') {
        p->s++;
        return 0;
    }
    for (;;) {
        char key[160], full[330], str[512];
        jp_ws(p);
        if (jp_string(p, key, sizeof key))
            return -1;
        snprintf(full, sizeof full, "%s%s%s", prefix, *prefix ? "." : "", key);
        jp_ws(p);
        if (*p->s++ != ':')
            return -1;
        jp_ws(p);
        if (*p->s == '{') {
            if (jp_object(p, full, depth + 1, fn, user))
                return -1;
        } else if (*p->s == '"') {
            if (jp_string(p, str, sizeof str))
                return -1;
            fn(full, NAN, str, user);
        } else if (!strncmp(p->s, "null", 4)) {
            p->s += 4;
            fn(full, NAN, NULL, user);
        } else if (!strncmp(p->s, "true", 4) || !strncmp(p->s, "false", 5)) {
            fn(full, *p->s == 't' ? 1 : 0, NULL, user);
            p->s += *p->s == 't' ? 4 : 5;
        } else {
            char *end;
            double v = strtod(p->s, &end);
            if (end == p->s)
                return -1;
            p->s = end;
            fn(full, v, NULL, user);
        }
        jp_ws(p);
        if (*p->s == ',') {
            p->s++;
            continue;
        }
        if (*p->s == '}') {
            p->s++;
            return 0;
        }
        return -1;
    }
}

int report_json_parse(const char *line, report_json_fn fn, void *user)
{
    struct jp p = {line};
    if (jp_object(&p, "", 0, fn, user))
        return -1;
    jp_ws(&p);
    return *p.s ? -1 : 0;
}

void report_summary_from_json(const char *key, double num, const char *str, void *user)
{
    struct run_summary *s = user;
    if (!strcmp(key, "mode") && str)
        snprintf(s->mode, sizeof s->mode, "%s", str);
    else if (!strcmp(key, "trace") && str)
        snprintf(s->trace, sizeof s->trace, "%s", str);
    else if (!strcmp(key, "actions")) s->actions = (uint64_t)num;
    else if (!strcmp(key, "allocs")) s->allocs = (uint64_t)num;
    else if (!strcmp(key, "frees")) s->frees = (uint64_t)num;
    else if (!strcmp(key, "failed_allocs")) s->failed_allocs = (uint64_t)num;
    else if (!strcmp(key, "peak_allocated_bytes")) s->peak_allocated = (int64_t)num;
    else if (!strcmp(key, "peak_reserved_bytes")) s->peak_reserved = (int64_t)num;
    else if (!strcmp(key, "utilization")) s->utilization = num;
    else if (!strcmp(key, "reserved_end_bytes")) s->reserved_end = (int64_t)num;
    else if (!strcmp(key, "reserved_after_empty_cache_bytes")) s->reserved_after_empty_cache = (int64_t)num;
    else if (!strcmp(key, "host_ns_per_alloc")) s->host_ns_per_alloc = num;
    else if (!strcmp(key, "host_ns_per_free")) s->host_ns_per_free = num;
    else if (!strcmp(key, "driver_memory_calls")) s->memory_calls = (uint64_t)num;
    else if (!strncmp(key, "failed_at.", 10)) {
        unsigned long i = strtoul(key + 10, NULL, 10);
        if (i < RUN_FAILED_AT_MAX)
            s->failed_at[i] = (uint64_t)num;
    } else if (!strncmp(key, "driver_calls.", 13)) {
        for (int e = 0; e < RUN_NENTRIES; e++)
            if (!strcmp(key + 13, run_entry_names[e])) {
                s->calls[e] = (uint64_t)num;
                s->have_calls = 1;
            }
    }
}

void report_mark_from_json(const char *key, double num, const char *str, void *user)
{
    struct report_mark_reader *r = user;
    static const char *const stat[4] = {"allocated_bytes", "active_bytes", "inactive_split_bytes",
                                        "reserved_bytes"};
    if (!strcmp(key, "mark") && str) {
        snprintf(r->m->label, sizeof r->m->label, "%s", str);
        r->is_mark = 1;
        return;
    }
    if (!strcmp(key, "mode") && str) {
        snprintf(r->mode, sizeof r->mode, "%s", str);
        return;
    }
    for (int k = 0; k < 4; k++) {
        char want[96];
        snprintf(want, sizeof want, "%s.%s.current", stat[k], pool_keys[r->pool]);
        if (!strcmp(key, want))
            r->m->v[k] = (int64_t)num;
    }
}
