/* xseg-replay --report. See webreport.h. */
#include "tools/replay/webreport.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "tools/replay/report.h"

static const double GiB = 1073741824.0;

static const char *const style =
    "body{font-family:sans-serif;max-width:1000px;margin:1em auto;color:#222;line-height:1.4}"
    "h1{font-size:1.5em}h2{font-size:1.25em;border-bottom:1px solid #ccc;margin-top:2em}"
    ".verdict p{font-size:1.1em;background:#eef2f6;border-left:4px solid #789;padding:.4em .7em;margin:.3em 0}"
    ".verdict.good p{background:#eef6ee;border-color:#3a3}.verdict.worse p{background:#fdf3e1;border-color:#d80}"
    ".verdict.fail p{background:#fbe9e9;border-color:#c33}"
    "table{border-collapse:collapse;margin:.6em 0}td,th{border:1px solid #ccc;padding:.2em .6em;text-align:right}"
    "td:first-child,th:first-child{text-align:left}code{background:#f3f3f3;padding:0 .2em}"
    ".frames{text-align:left;font-family:monospace;font-size:.85em}.note{color:#666;font-size:.9em}"
    "svg{max-width:100%;height:auto}tr.hl td{background:#fff6d0}"
    "pre.explain{white-space:pre-wrap;overflow-wrap:anywhere;max-width:100%;background:#f7f7f7;padding:.5em;"
    "font-size:.85em}";

/* Marks the page as drawn once the plot has points and a size: what a headless browser test reads
 * back (data-polylines, data-points, data-plot-width on <body>; data-explain-overflow: how many
 * --explain-oom sections are wider than the page). Hovering a mark's row highlights
 * it. */
static const char *const script =
    "window.addEventListener('load',function(){"
    "var ls=document.querySelectorAll('svg polyline'),pts=0,w=0;"
    "ls.forEach(function(l){pts+=l.points.numberOfItems;var b=l.getBBox();if(b.width>w)w=b.width;});"
    "document.body.dataset.polylines=ls.length;document.body.dataset.points=pts;"
    "document.body.dataset.plotWidth=Math.round(w);"
    "var ov=0;document.querySelectorAll('pre.explain').forEach(function(p){if(p.scrollWidth>p.clientWidth+1)ov++;});"
    "document.body.dataset.explainOverflow=ov;"
    "document.querySelectorAll('tr[data-mark]').forEach(function(r){"
    "r.addEventListener('mouseenter',function(){r.classList.add('hl');});"
    "r.addEventListener('mouseleave',function(){r.classList.remove('hl');});});"
    "document.body.dataset.ready='1';});";

#define H(s) plot_xml_text(f, (s))

static void mode_table(FILE *f, const struct webreport_trace *w)
{
    const struct trace_recorded *rec = &w->t->recorded;
    int rec_on = rec->peak_reserved >= 0;
    /* The first header cell names the device the columns were replayed on (an OOM's answer above
     * speaks of the device the run failed on). */
    char dev[48];
    if (w->sums[0].device_bytes >= GiB)
        snprintf(dev, sizeof dev, "on the %.1f GiB device", (double)w->sums[0].device_bytes / GiB);
    else if (w->sums[0].device_bytes)
        snprintf(dev, sizeof dev, "on the %.0f MiB device", (double)w->sums[0].device_bytes / (1 << 20));
    else
        snprintf(dev, sizeof dev, "on the %s", w->sums[0].have_calls ? "emulated device" : "GPU");
    fputs("<table class=\"modes\"><tr><th>", f);
    H(dev);
    fputs("</th>", f);
    for (size_t m = 0; m < w->n; m++) {
        fputs("<th>", f);
        H(w->sums[m].mode);
        fputs("</th>", f);
    }
    fprintf(f, "%s%s</tr>\n", rec_on ? "<th>PyTorch (recorded" : "",
            !rec_on ? "" : rec->expandable == 1 ? ", expandable)</th>" : rec->expandable == 0 ? ", classic)</th>" : ")</th>");
    static const char *const rows[] = {"peak allocated (GiB)", "peak reserved (GiB)", "utilization",
                                       "reserved at the end (GiB)", "reserved after empty_cache (GiB)",
                                       "failed allocations"};
    for (int r = 0; r < 6; r++) {
        fprintf(f, "<tr><td>%s</td>", rows[r]);
        for (size_t m = 0; m < w->n; m++) {
            const struct run_summary *s = &w->sums[m];
            int64_t v[] = {s->peak_allocated, s->peak_reserved, 0, s->reserved_end, s->reserved_after_empty_cache};
            if (r == 2)
                fprintf(f, "<td>%.4f</td>", s->utilization);
            else if (r == 5)
                fprintf(f, "<td>%" PRIu64 "</td>", s->failed_allocs);
            else
                fprintf(f, "<td>%.3f</td>", (double)v[r] / GiB);
        }
        if (rec_on && r == 0 && rec->peak_allocated >= 0)
            fprintf(f, "<td>%.3f</td>", (double)rec->peak_allocated / GiB);
        else if (rec_on && r == 1)
            fprintf(f, "<td>%.3f</td>", (double)rec->peak_reserved / GiB);
        else if (rec_on && r == 2 && rec->peak_allocated >= 0 && rec->peak_reserved > 0)
            fprintf(f, "<td>%.4f</td>", (double)rec->peak_allocated / (double)rec->peak_reserved);
        else if (rec_on)
            fputs("<td>-</td>", f);
        fputs("</tr>\n", f);
    }
    fputs("</table>\n", f);
    char note[REPORT_PEAK_NOTE_MAX];
    if (report_peak_note(w->sums, w->n, rec_on ? rec : NULL, note, sizeof note)) {
        fputs("<p class=\"note peak-note\">", f);
        H(note);
        fputs("</p>\n", f);
    }
}

/* Peak reserved per mode (and as recorded) as bars, peak allocated inside each: the verdict at a
 * glance. */
static void peak_bars(FILE *f, const struct webreport_trace *w)
{
    const struct trace_recorded *rec = &w->t->recorded;
    size_t nb = w->n + (rec->peak_reserved > 0);
    double max = 1;
    for (size_t m = 0; m < w->n; m++)
        max = (double)w->sums[m].peak_reserved > max ? (double)w->sums[m].peak_reserved : max;
    if (rec->peak_reserved > max)
        max = (double)rec->peak_reserved;
    const double x0 = 170, wmax = 560;
    fprintf(f, "<svg class=\"bars\" xmlns=\"http://www.w3.org/2000/svg\" width=\"820\" height=\"%zu\" "
               "font-family=\"sans-serif\" font-size=\"12\">\n", nb * 30 + 24);
    for (size_t i = 0; i < nb; i++) {
        int recorded = i == w->n;
        const char *label = !recorded               ? w->sums[i].mode
                            : rec->expandable == 1 ? "PyTorch (expandable)"
                            : rec->expandable == 0 ? "PyTorch (classic)"
                                                   : "PyTorch (recorded)";
        double res = recorded ? (double)rec->peak_reserved : (double)w->sums[i].peak_reserved;
        double al = recorded ? (double)rec->peak_allocated : (double)w->sums[i].peak_allocated;
        double y = 6 + 30.0 * (double)i;
        fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"end\">", x0 - 8, y + 16);
        H(label);
        fprintf(f, "</text><rect class=\"bar\" x=\"%.0f\" y=\"%.0f\" width=\"%.1f\" height=\"22\" fill=\"%s\"/>",
                x0, y, res / max * wmax, recorded ? "#bbb" : !strncmp(label, "classic", 7) ? "#f2a0a0" : "#a0c4e8");
        if (al > 0)
            fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.1f\" height=\"8\" fill=\"#444\" opacity=\"0.5\"/>", x0,
                    y + 14, al / max * wmax);
        fprintf(f, "<text x=\"%.1f\" y=\"%.0f\">%.2f GiB</text>\n", x0 + res / max * wmax + 6, y + 16, res / GiB);
    }
    fprintf(f, "<text x=\"%.0f\" y=\"%zu\" fill=\"#666\">bar: peak reserved; dark strip: peak allocated</text>"
               "</svg>\n", x0, nb * 30 + 18);
}

static void marks_table(FILE *f, const struct plot_panel *p)
{
    if (!p->nmarks)
        return;
    fputs("<details class=\"marks\"><summary>marks on the plot</summary><table><tr><th>#</th><th>mark</th>"
          "<th>action</th></tr>\n", f);
    for (size_t i = 0; i < p->nmarks; i++) {
        fprintf(f, "<tr data-mark=\"%zu\"%s><td>%zu</td><td>", i + 1, p->marks[i].recorded_oom ? " class=\"oom\"" : "",
                i + 1);
        H(p->marks[i].label);
        fprintf(f, "</td><td>%" PRIu64 "</td></tr>\n", p->marks[i].x);
    }
    fputs("</table></details>\n", f);
}

static void tune_row(FILE *f, const char *label, const struct tune_family_result *fr, const struct tune_candidate *c)
{
    char line[400];
    tune_env_line(fr, c, line, sizeof line);
    fprintf(f, "<tr><td>%s</td><td class=\"frames\"><code>", label);
    H(line);
    fprintf(f, "</code></td><td>%.3f</td><td>", (double)c->peak_reserved / GiB);
    if (c->stopped)
        fputs("a replay stopped", f);
    else if (c->failed_allocs)
        fprintf(f, "%" PRIu64 " failed allocations", c->failed_allocs);
    else if (c->min_device)
        fprintf(f, "%s%.3f", c->device_exact ? "" : "&le; ", (double)c->min_device / GiB);
    else
        fputs("-", f);
    fputs("</td></tr>\n", f);
}

static void tune_section(FILE *f, const struct tune_result *r)
{
    fputs("<h3>Best config (--tune)</h3>\n", f);
    if (!r) {
        fputs("<p class=\"tune none\">Not run.</p>\n", f);
        return;
    }
    char budget[96];
    tune_budget_text(r, budget, sizeof budget);
    fprintf(f, "<p class=\"note\">%u replays in %.1f s (%s %s%s). Predicted figures of each config replayed on "
               "the emulator; smallest device by 2 MiB bisection.</p>\n",
            r->runs, r->seconds, r->cut_short ? "cut short by" : "the search completed within", budget,
            r->cut_short ? ": --tune-budget for more" : "");
    if (r->stopped_replay)
        fprintf(f, "<p class=\"note\">The budget's %g s ran out during a replay: it was stopped there; the figures "
                   "are of the replays that finished.</p>\n", r->budget_seconds);
    fputs("<table class=\"tune\"><tr><th></th><th>config</th><th>peak reserved (GiB)</th>"
          "<th>smallest device (GiB)</th></tr>\n", f);
    for (size_t i = 0; i < TUNE_FAMILIES; i++) {
        const struct tune_family_result *fr = &r->fam[i];
        if (fr->over_budget)
            fprintf(f, "<tr><th colspan=\"4\">%s</th></tr>\n<tr><td colspan=\"4\">no replay finished within %s: "
                       "--tune-budget for more</td></tr>\n", fr->name, budget);
        if (!fr->have_best)
            continue;
        fprintf(f, "<tr><th colspan=\"4\">%s</th></tr>\n", fr->name);
        tune_row(f, "best", fr, &fr->best);
        if (fr->have_runner_up)
            tune_row(f, "runner-up", fr, &fr->runner_up);
        if (fr->have_def)
            tune_row(f, "default", fr, &fr->def);
    }
    fputs("</table>\n", f);
}

/* The trace's own peak of live bytes (requested sizes; no allocator involved): its action index,
 * or SIZE_MAX when the trace allocates nothing. */
static size_t trace_peak(const struct trace *t, uint64_t *live, uint64_t *peak_bytes)
{
    uint64_t total = 0;
    size_t at = SIZE_MAX;
    *peak_bytes = 0;
    for (size_t i = 0; i < t->count; i++) {
        const struct trace_action *a = &t->actions[i];
        if (a->op == TRACE_ALLOC) {
            live[a->buf] = a->size;
            total += a->size;
        } else if (a->op == TRACE_FREE) {
            total -= live[a->buf];
            live[a->buf] = 0;
        }
        if (total > *peak_bytes || at == SIZE_MAX) {
            *peak_bytes = total;
            at = i;
        }
    }
    return at;
}

static int python_frame(const struct trace *t, const struct trace_frame *fr)
{
    const char *file = trace_text(t, fr->file);
    size_t n = strlen(file);
    return n > 3 && !strcmp(file + n - 3, ".py");
}

static void frame_line(FILE *f, const struct trace *t, const struct trace_frame *fr)
{
    H(trace_text(t, fr->file));
    fprintf(f, ":%d ", (int)fr->line);
    H(trace_text(t, fr->name));
    fputs("<br>", f);
}

/* A PyTorch stack holds dozens of C++ frames: its Python frames first (the program's own), at
 * most WEBREPORT_FRAMES of them (or of the first frames when none is Python), then every frame
 * folded away. */
static void frames_cell(FILE *f, const struct trace *t, uint32_t stack)
{
    fputs("<td class=\"frames\">", f);
    if (!stack) {
        fputs("(the trace has no frames for it)</td>", f);
        return;
    }
    const struct trace_stack *st = &t->stacks[stack - 1];
    size_t npy = 0, shown = 0;
    for (size_t i = 0; i < st->n; i++)
        npy += python_frame(t, &st->f[i]);
    for (size_t i = 0; i < st->n && shown < WEBREPORT_FRAMES; i++)
        if (!npy || python_frame(t, &st->f[i])) {
            frame_line(f, t, &st->f[i]);
            shown++;
        }
    if (shown < st->n) {
        fprintf(f, "<details><summary>all %zu frames</summary>", st->n);
        for (size_t i = 0; i < st->n; i++)
            frame_line(f, t, &st->f[i]);
        fputs("</details>", f);
    }
    fputs("</td>", f);
}

static int by_size_desc(const void *x, const void *y)
{
    const struct trace_action *a = *(const struct trace_action *const *)x, *b = *(const struct trace_action *const *)y;
    return a->size < b->size ? 1 : a->size > b->size ? -1 : 0;
}

/* The largest allocations live at the trace's peak, with their frames. */
static xseg_status live_at_peak(FILE *f, const struct trace *t)
{
    uint64_t *live = calloc(t->bufs.count + 1, sizeof *live), peak;
    const struct trace_action **at = calloc(t->bufs.count + 1, sizeof *at);
    if (!live || !at) {
        free(live);
        free(at);
        return XSEG_ERROR_OUT_OF_MEMORY;
    }
    size_t pk = trace_peak(t, live, &peak), n = 0;
    memset(live, 0, (t->bufs.count + 1) * sizeof *live);
    for (size_t i = 0; pk != SIZE_MAX && i <= pk; i++) {
        const struct trace_action *a = &t->actions[i];
        if (a->op == TRACE_ALLOC)
            at[a->buf] = a;
        else if (a->op == TRACE_FREE)
            at[a->buf] = NULL;
    }
    for (size_t b = 0; b < t->bufs.count; b++)
        if (at[b])
            at[n++] = at[b];
    qsort(at, n, sizeof *at, by_size_desc);
    fprintf(f, "<h3>Largest allocations live at the peak</h3>\n<p class=\"note\">At action %zu the trace holds "
               "%.3f GiB in %zu allocations (requested sizes); the %zu largest:</p>\n",
            pk == SIZE_MAX ? 0 : pk, (double)peak / GiB, n, n < WEBREPORT_TOP ? n : WEBREPORT_TOP);
    fputs("<table class=\"live\"><tr><th>buffer</th><th>size (MiB)</th><th>stream</th><th>line</th>"
          "<th>frames (innermost first)</th></tr>\n", f);
    for (size_t i = 0; i < n && i < WEBREPORT_TOP; i++) {
        const struct trace_action *a = at[i];
        fputs("<tr><td>", f);
        H(t->bufs.names[a->buf]);
        fprintf(f, "</td><td>%.1f</td><td>", (double)a->size / (1 << 20));
        H(a->stream >= 0 ? t->streams.names[a->stream] : "default");
        fprintf(f, "</td><td>%u</td>", a->line);
        frames_cell(f, t, a->stack);
        fputs("</tr>\n", f);
    }
    fputs("</table>\n", f);
    free(live);
    free(at);
    return XSEG_SUCCESS;
}

static int is_classic_mode(const struct run_summary *s) { return !strncmp(s->mode, "classic", 7); }

/* The replay the recording is compared with: the mode PyTorch ran in when the trace says
 * (expandable_segments), else xseg's (the first non-classic replay); NULL when there is none. */
static const struct run_summary *matching_mode(const struct webreport_trace *w)
{
    int want_classic = w->t->recorded.expandable == 0;
    for (size_t m = 0; m < w->n; m++)
        if (is_classic_mode(&w->sums[m]) == want_classic)
            return &w->sums[m];
    return NULL;
}

/* Which allocator mode PyTorch ran in, when the trace records it, and what it is compared with. */
static void recorded_mode_note(FILE *f, const struct webreport_trace *w)
{
    const struct trace_recorded *rec = &w->t->recorded;
    const struct run_summary *m = matching_mode(w);
    if (rec->peak_reserved <= 0 || rec->expandable < 0)
        return;
    fprintf(f, "<p class=\"note recorded-mode\" data-recorded-mode=\"%s\">PyTorch ran with expandable_segments:%s "
               "(the snapshot says so).", rec->expandable ? "expandable" : "classic", rec->expandable ? "True" : "False");
    if (m && rec->expandable == 1)
        fprintf(f, " Its figures are compared with the %s replay: PyTorch reserved %.3f GiB at its peak, the "
                   "replay %.3f GiB (%+.2f %%). Classic mode is another allocator mode, not a model error.",
                m->mode, (double)rec->peak_reserved / GiB, (double)m->peak_reserved / GiB,
                100.0 * (double)(m->peak_reserved - rec->peak_reserved) / (double)rec->peak_reserved);
    fputs("</p>\n", f);
}

/* Why each mode's first failed allocation failed (--explain-oom), when one did. */
static void oom_section(FILE *f, const struct webreport_trace *w)
{
    int any = 0;
    for (size_t m = 0; w->explain && m < w->n; m++) {
        if (!w->explain[m])
            continue;
        if (!any++)
            fputs("<h3>Failed allocations: stranded free bytes (--explain-oom)</h3>\n<p class=\"note\">After xseg's "
                  "OOM path, the pages still holding free bytes and the live blocks pinning them.</p>\n", f);
        fputs("<pre class=\"explain\" data-mode=\"", f);
        H(w->sums[m].mode);
        fputs("\">", f);
        if (w->explain_device && *w->explain_device) {
            H(w->explain_device);
            fputc('\n', f);
        }
        H(w->explain[m]);
        fputs("</pre>\n", f);
    }
}

static xseg_status trace_section(FILE *f, const struct webreport_trace *w)
{
    char lines[REPORT_VERDICT_LINES][REPORT_VERDICT_MAX];
    size_t k = report_verdict(w->sums, w->n, &w->t->recorded, w->headline, lines, REPORT_VERDICT_LINES);
    const char *outcome = report_outcome(w->sums, w->n, &w->t->recorded, w->headline);
    fputs("<section class=\"trace\"><h2>", f);
    H(w->t->source);
    fprintf(f, "</h2>\n<div class=\"verdict %s\" data-outcome=\"%s\">", outcome, outcome);
    for (size_t i = 0; i < k; i++) {
        fputs("<p>", f);
        H(lines[i]);
        fputs("</p>", f);
    }
    fputs("</div>\n", f);
    recorded_mode_note(f, w);
    peak_bars(f, w);
    mode_table(f, w);
    fputs("<h3>Memory over the trace</h3>\n<p class=\"note\">Wide, light: reserved; thin, dashed, on top: "
          "allocated (the modes' dashes alternate where their curves coincide). Numbered lines: "
          "the trace's marks (red: an OOM PyTorch recorded); circles: allocations that failed in the replay.</p>\n"
          "<figure class=\"plot\">", f);
    xseg_status st = plot_svg(f, w->panel, 1, 0);
    fputs("</figure>\n", f);
    marks_table(f, w->panel);
    oom_section(f, w);
    tune_section(f, w->tune);
    if (st == XSEG_SUCCESS)
        st = live_at_peak(f, w->t);
    fputs("</section>\n", f);
    return st;
}

xseg_status webreport_write(FILE *f, const char *path, const struct webreport_trace *tr, size_t n, char *err,
                            size_t errlen)
{
    fprintf(f, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>xseg-replay report</title>"
               "<style>%s</style></head>\n<body>\n<h1>xseg-replay report</h1>\n"
               "<p class=\"note\">Each trace replayed through xseg in classic mode (PyTorch's caching allocator, as "
               "xseg models it) and expandable mode (xseg's default), on the emulated device unless a GPU was "
               "found.</p>\n",
            style);
    xseg_status st = XSEG_SUCCESS;
    for (size_t i = 0; i < n && st == XSEG_SUCCESS; i++)
        st = trace_section(f, &tr[i]);
    fprintf(f, "<script>%s</script>\n</body></html>\n", script);
    if (fclose(f) != 0 || st) {
        snprintf(err, errlen, st == XSEG_ERROR_OUT_OF_MEMORY ? "--report %s: out of host memory"
                                                             : "--report %s: write failed", path);
        return st ? st : XSEG_ERROR_INVALID_VALUE;
    }
    return XSEG_SUCCESS;
}
