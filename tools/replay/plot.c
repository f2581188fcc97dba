/* The --plot SVG. See plot.h. Plain SVG 1.1 with inline attributes: any browser renders it. */
#include "tools/replay/plot.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { PANEL_W = 960, PANEL_H = 380, MARGIN_L = 80, MARGIN_R = 190, MARGIN_T = 40, MARGIN_B = 56 };

static const char *mode_color(const char *mode, size_t i)
{
    if (!strcmp(mode, "classic"))
        return "#d62728";
    if (!strcmp(mode, "expandable"))
        return "#1f77b4";
    static const char *const others[] = {"#2ca02c", "#9467bd", "#8c564b", "#e377c2"};
    return others[i % 4];
}

/* A "nice" tick step (1, 2, 5 x 10^k) giving about @p want ticks over @p range. */
static double nice_step(double range, int want)
{
    if (range <= 0)
        return 1;
    double raw = range / want, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * mag;
}

void plot_xml_text(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else if (*s == '&') fputs("&amp;", f);
        else if (*s == '"') fputs("&quot;", f);
        else if (*s == '\'') fputs("&#39;", f);
        else if ((unsigned char)*s < 0x20 && *s != '\t' && *s != '\n' && *s != '\r')
            fputc('?', f); /* not allowed in XML 1.0 (tab and line breaks are) */
        else fputc(*s, f);
    }
}

/* How a series' two lines look, so that none hides another: reserved wide and translucent,
 * drawn first; allocated thin and dashed on top. The modes' allocated curves often coincide (the
 * same trace), so their dashes take turns (dash D, gap D x (n-1), offset D x s): where they
 * overlap each colour still shows. */
enum { PLOT_DASH = 6 };
static void line_style(FILE *f, int allocated, size_t s, size_t n)
{
    if (!allocated) {
        fputs(" stroke-width=\"3.2\" stroke-opacity=\"0.45\"", f);
        return;
    }
    size_t gap = n > 1 ? PLOT_DASH * (n - 1) : PLOT_DASH / 2;
    fprintf(f, " stroke-width=\"1.6\" stroke-dasharray=\"%d,%zu\" stroke-dashoffset=\"%zu\"", PLOT_DASH, gap,
            n > 1 ? (size_t)PLOT_DASH * s : 0);
}

/* One polyline of @p v over the plot area, reduced to the min and max per horizontal pixel;
 * @p allocated: the allocated curve of series @p s of @p n (else the reserved one). */
static void polyline(FILE *f, const struct run_timeline *tl, const int64_t *v, double x0, double y0,
                     double w, double h, double xmax, double ymax, const char *color, int allocated, size_t s,
                     size_t n)
{
    if (!tl->n)
        return;
    fprintf(f, "<polyline class=\"%s\" fill=\"none\" stroke=\"%s\"", allocated ? "allocated" : "reserved", color);
    line_style(f, allocated, s, n);
    fputs(" points=\"", f);
    size_t i = 0;
    int64_t prev = 0; /* the value holds until the next sample: draw steps */
    double prev_px = x0;
    fprintf(f, "%.1f,%.1f ", x0, y0 + h);
    while (i < tl->n) {
        int px = (int)((double)tl->x[i] / xmax * w);
        int64_t lo = v[i], hi = v[i], last = v[i];
        size_t j = i;
        while (j < tl->n && (int)((double)tl->x[j] / xmax * w) == px) {
            lo = v[j] < lo ? v[j] : lo;
            hi = v[j] > hi ? v[j] : hi;
            last = v[j];
            j++;
        }
        double X = x0 + px;
        fprintf(f, "%.1f,%.1f ", X, y0 + h - (double)prev / ymax * h);
        fprintf(f, "%.1f,%.1f %.1f,%.1f %.1f,%.1f ", X, y0 + h - (double)lo / ymax * h, X,
                y0 + h - (double)hi / ymax * h, X, y0 + h - (double)last / ymax * h);
        prev = last;
        prev_px = X;
        i = j;
    }
    (void)prev_px;
    fprintf(f, "%.1f,%.1f\"/>\n", x0 + w, y0 + h - (double)prev / ymax * h);
}

xseg_status plot_marks_of_trace(const struct trace *t, struct plot_mark **marks, size_t *n)
{
    size_t k = 0, noom = t->recorded.noom < TRACE_RECORDED_OOM_MAX ? t->recorded.noom : TRACE_RECORDED_OOM_MAX;
    for (size_t i = 0; i < t->count; i++)
        k += t->actions[i].op == TRACE_MARK;
    *marks = calloc(k + noom + 1, sizeof **marks);
    *n = 0;
    if (!*marks)
        return XSEG_ERROR_OUT_OF_MEMORY;
    size_t o = 0;
    for (size_t i = 0; i <= t->count; i++) {
        for (; o < noom && t->recorded.oom_at[o] == i; o++)
            (*marks)[(*n)++] = (struct plot_mark){i, "PyTorch hit an OOM here (recorded)", 1};
        if (i < t->count && t->actions[i].op == TRACE_MARK) {
            const char *label = trace_text(t, t->actions[i].text);
            /* the converter writes PyTorch's OOM events as marks named so */
            (*marks)[(*n)++] = (struct plot_mark){i, label, !strncmp(label, "PyTorch OOM", 11)};
        }
    }
    return XSEG_SUCCESS;
}

struct area {
    double x0, y0, w, h, xmax, ymax;
};

/* Axes, grid and ticks; the y range in @p a. */
static void panel_axes(FILE *f, const struct plot_panel *pn, double top, struct area *a)
{
    const double GiB = 1073741824.0;
    a->x0 = MARGIN_L;
    a->y0 = top + MARGIN_T;
    a->w = PANEL_W - MARGIN_L - MARGIN_R;
    a->h = PANEL_H - MARGIN_T - MARGIN_B;
    a->xmax = pn->xmax ? (double)pn->xmax : 1;
    int64_t vmax = 0;
    for (size_t s = 0; s < pn->n; s++)
        for (size_t i = 0; i < pn->series[s].tl->n; i++) {
            vmax = pn->series[s].tl->reserved[i] > vmax ? pn->series[s].tl->reserved[i] : vmax;
            vmax = pn->series[s].tl->allocated[i] > vmax ? pn->series[s].tl->allocated[i] : vmax;
        }
    double ystep = nice_step((double)vmax / GiB * 1.05, 5);
    double ytop = ceil(((double)vmax / GiB * 1.05) / ystep) * ystep;
    if (ytop <= 0)
        ytop = ystep;
    a->ymax = ytop * GiB;
    double x0 = a->x0, y0 = a->y0, w = a->w, h = a->h;
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"15\" font-weight=\"bold\">", x0, top + 24);
    plot_xml_text(f, pn->title);
    fputs("</text>\n", f);
    for (double yv = 0; yv <= ytop + ystep / 2; yv += ystep) {
        double Y = y0 + h - yv / ytop * h;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e0e0e0\"/>\n", x0, Y, x0 + w, Y);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", x0 - 6, Y + 4, yv);
    }
    double xstep = nice_step(a->xmax, 8);
    for (double xv = 0; xv <= a->xmax + xstep / 2; xv += xstep) {
        double X = x0 + xv / a->xmax * w;
        if (X > x0 + w + 0.5)
            break;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#999\"/>\n", X, y0 + h, X, y0 + h + 5);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.0f</text>\n", X, y0 + h + 18, xv);
    }
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#333\"/>\n",
            x0, y0, w, h);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">trace action (index)</text>\n",
            x0 + w / 2, y0 + h + 40);
    fprintf(f, "<text transform=\"translate(%.1f,%.1f) rotate(-90)\" text-anchor=\"middle\">memory (GiB)</text>\n",
            x0 - 50, y0 + h / 2);
}

/* Marks as numbered grey lines (recorded OOMs in red), failed allocations as points on the
 * mode's reserved line; each with a <title> a browser shows on hover. */
static void panel_marks(FILE *f, const struct plot_panel *pn, const struct area *a)
{
    for (size_t i = 0; i < pn->nmarks; i++) {
        const struct plot_mark *m = &pn->marks[i];
        double X = a->x0 + (double)m->x / a->xmax * a->w;
        fprintf(f, "<g class=\"mark%s\"><title>%zu: ", m->recorded_oom ? " oom" : "", i + 1);
        plot_xml_text(f, m->label);
        fprintf(f, " (action %llu)</title>", (unsigned long long)m->x);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-dasharray=\"2,3\"/>",
                X, a->y0, X, a->y0 + a->h, m->recorded_oom ? "#b00" : "#aaa");
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"9\" fill=\"%s\">%zu</text></g>\n",
                X, a->y0 - 3, m->recorded_oom ? "#b00" : "#777", i + 1);
    }
    for (size_t s = 0; s < pn->n; s++) {
        const struct plot_series *se = &pn->series[s];
        for (size_t i = 0; i < se->nfailed; i++) {
            /* the reserved level at the failure: the last sample at or before it */
            int64_t r = 0;
            for (size_t j = 0; j < se->tl->n && se->tl->x[j] <= se->failed_at[i]; j++)
                r = se->tl->reserved[j];
            double X = a->x0 + (double)se->failed_at[i] / a->xmax * a->w, Y = a->y0 + a->h - (double)r / a->ymax * a->h;
            fprintf(f, "<g class=\"failed\"><title>");
            plot_xml_text(f, se->mode);
            fprintf(f, ": allocation failed (action %llu)</title><circle cx=\"%.1f\" cy=\"%.1f\" r=\"5\" fill=\"none\" "
                       "stroke=\"%s\" stroke-width=\"2\"/></g>\n",
                    (unsigned long long)se->failed_at[i], X, Y, mode_color(se->mode, s));
        }
    }
}

static void panel_legend(FILE *f, const struct plot_panel *pn, const struct area *a)
{
    double lx = a->x0 + a->w + 16, ly = a->y0 + 8;
    for (size_t s = 0; s < pn->n; s++) {
        const char *c = mode_color(pn->series[s].mode, s);
        for (int k = 0; k < 2; k++) {
            fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\"", lx, ly, lx + 26, ly, c);
            line_style(f, k, s, pn->n);
            fputs("/>\n", f);
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">%s (", lx + 32, ly + 4, k ? "allocated" : "reserved");
            plot_xml_text(f, pn->series[s].mode);
            fputs(")</text>\n", f);
            ly += 20;
        }
    }
    if (pn->nmarks)
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#777\">1..%zu: marks</text>\n", lx, ly + 4, pn->nmarks);
}

xseg_status plot_svg(FILE *f, const struct plot_panel *panels, size_t npanels, int xml_header)
{
    if (xml_header)
        fputs("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n", f);
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%zu\" viewBox=\"0 0 %d %zu\" "
               "font-family=\"sans-serif\" font-size=\"12\">\n"
               "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            PANEL_W, PANEL_H * (npanels ? npanels : 1), PANEL_W, PANEL_H * (npanels ? npanels : 1));
    for (size_t p = 0; p < npanels; p++) {
        const struct plot_panel *pn = &panels[p];
        struct area a;
        panel_axes(f, pn, (double)(p * PANEL_H), &a);
        /* Reserved first (wide, translucent), allocated on top: reserved is never below allocated,
         * so where they meet the allocated curve stays visible. */
        for (int k = 0; k < 2; k++)
            for (size_t s = 0; s < pn->n; s++)
                polyline(f, pn->series[s].tl, k ? pn->series[s].tl->allocated : pn->series[s].tl->reserved, a.x0,
                         a.y0, a.w, a.h, a.xmax, a.ymax, mode_color(pn->series[s].mode, s), k, s, pn->n);
        panel_marks(f, pn, &a);
        panel_legend(f, pn, &a);
    }
    fputs("</svg>\n", f);
    return ferror(f) ? XSEG_ERROR_INVALID_VALUE : XSEG_SUCCESS;
}

xseg_status plot_write_svg(const char *path, const struct plot_panel *panels, size_t npanels,
                           char *err, size_t errlen)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        snprintf(err, errlen, "--plot %s: cannot write: %m", path);
        return XSEG_ERROR_INVALID_VALUE;
    }
    xseg_status st = plot_svg(f, panels, npanels, 1);
    if (fclose(f) != 0 || st) {
        snprintf(err, errlen, "--plot %s: write failed", path);
        return XSEG_ERROR_INVALID_VALUE;
    }
    return XSEG_SUCCESS;
}

xseg_status plot_timeline_write(FILE *f, const struct run_timeline *tl, size_t buckets)
{
    if (!tl->n)
        return XSEG_SUCCESS;
    uint64_t span = tl->x[tl->n - 1] + 1;
    size_t i = 0;
    while (i < tl->n) {
        uint64_t b = tl->x[i] * buckets / span;
        size_t lo = i, hi = i, j = i;
        while (j < tl->n && tl->x[j] * buckets / span == b) {
            if (tl->reserved[j] < tl->reserved[lo]) lo = j;
            if (tl->reserved[j] > tl->reserved[hi]) hi = j;
            j++;
        }
        /* Keep the bucket's extremes in their order, and its last sample (the level that holds). */
        size_t keep[3] = {lo < hi ? lo : hi, lo < hi ? hi : lo, j - 1};
        for (int k = 0; k < 3; k++) {
            if (k && keep[k] == keep[k - 1])
                continue;
            fprintf(f, "%" PRIu64 " %" PRId64 " %" PRId64 "\n", tl->x[keep[k]], tl->allocated[keep[k]],
                    tl->reserved[keep[k]]);
        }
        i = j;
    }
    return ferror(f) ? XSEG_ERROR_INVALID_VALUE : XSEG_SUCCESS;
}

xseg_status plot_timeline_read(const char *path, struct run_timeline *tl, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open: %m", path);
        return XSEG_ERROR_INVALID_VALUE;
    }
    memset(tl, 0, sizeof *tl);
    uint64_t x;
    int64_t a, r;
    while (fscanf(f, "%" SCNu64 " %" SCNd64 " %" SCNd64, &x, &a, &r) == 3) {
        if (run_timeline_push(tl, x, a, r) != XSEG_SUCCESS) {
            fclose(f);
            snprintf(err, errlen, "out of host memory");
            return XSEG_ERROR_OUT_OF_MEMORY;
        }
    }
    fclose(f);
    return XSEG_SUCCESS;
}
