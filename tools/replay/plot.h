/* The --plot SVG: allocated and reserved over the trace, one line per mode, one panel per trace. */
#ifndef XSEG_TOOLS_REPLAY_PLOT_H
#define XSEG_TOOLS_REPLAY_PLOT_H

#include <stdio.h>

#include "tools/replay/runner.h"

struct plot_series {
    const char *mode;                /* legend label: "classic", "expandable" */
    const struct run_timeline *tl;
};

struct plot_panel {
    const char *title;               /* the trace's name */
    uint64_t xmax;                   /* actions in the trace */
    const struct plot_series *series;
    size_t n;
};

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
