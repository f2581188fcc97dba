/* The --plot SVG: allocated and reserved over the trace, one line per mode, one panel per trace. */
#ifndef XSEG_TOOLS_REPLAY_PLOT_H
#define XSEG_TOOLS_REPLAY_PLOT_H

#include <stdio.h>

#include "tools/replay/runner.h"

struct plot_series {
    const char *mode;                /* legend label: "classic", "expandable" */
    const struct run_timeline *tl;
    const uint64_t *failed_at;       /* action indices of failed allocations (drawn as points) */
    size_t nfailed;
};

/* A vertical line at an action: a trace's `mark`, or an OOM the recording shows. */
struct plot_mark {
    uint64_t x;
    const char *label;               /* points into the trace */
    int recorded_oom;                /* 1: PyTorch hit an OOM here in the original run */
};

struct plot_panel {
    const char *title;               /* the trace's name */
    uint64_t xmax;                   /* actions in the trace */
    const struct plot_series *series;
    size_t n;
    const struct plot_mark *marks;   /* numbered 1.. on the plot, in order */
    size_t nmarks;
};

/* The marks of @p t (its `mark` actions and recorded OOMs: `# the original run hit an OOM`
 * comments, marks whose label starts "PyTorch OOM"; in action order) into a new array
 * @p marks (free() it; labels point into @p t). */
xseg_status plot_marks_of_trace(const struct trace *t, struct plot_mark **marks, size_t *n);

/* The SVG of @p panels to @p f: with @p xml_header, a standalone file; without, an element to
 * inline in HTML. @return XSEG_ERROR_INVALID_VALUE on a write error. */
xseg_status plot_svg(FILE *f, const struct plot_panel *panels, size_t npanels, int xml_header);

/* Text escaped for XML and HTML (< > & " '). */
void plot_xml_text(FILE *f, const char *s);

/* Write the SVG to @p path. @return XSEG_ERROR_INVALID_VALUE (path in @p err) when it cannot be
 * written. */
xseg_status plot_write_svg(const char *path, const struct plot_panel *panels, size_t npanels,
                           char *err, size_t errlen);

/* A timeline reduced to at most about 2 * @p buckets points that keep every bucket's minimum and
 * maximum (so peaks survive), as text lines "x allocated reserved" — how a child replay hands its
 * timeline to the parent. */
xseg_status plot_timeline_write(FILE *f, const struct run_timeline *tl, size_t buckets);
xseg_status plot_timeline_read(const char *path, struct run_timeline *tl, char *err, size_t errlen);

#endif
