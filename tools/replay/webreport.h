/*
 * xseg-replay --report FILE.html: one self-contained page (inline CSS, SVG and a few lines of
 * JavaScript; nothing loaded from anywhere) per run: for each trace the verdict (its box coloured
 * by the headline's comparison: xseg against PyTorch's best one-line setting), the per-mode
 * table with PyTorch's recorded figures, the memory-over-time plot with marks, recorded OOMs and
 * failed allocations, the --tune result, and the largest allocations live at the trace's peak
 * with their stack frames. Every string that comes from a trace is escaped.
 */
#ifndef XSEG_TOOLS_REPLAY_WEBREPORT_H
#define XSEG_TOOLS_REPLAY_WEBREPORT_H

#include "tools/replay/plot.h"
#include "tools/replay/report.h"
#include "tools/replay/trace.h"
#include "tools/replay/tune.h"

struct webreport_trace {
    const struct trace *t;
    const struct run_summary *sums; /* one per mode */
    size_t n;
    const struct plot_panel *panel;
    const struct tune_result *tune; /* NULL: not tuned */
    const char *const *explain;     /* per mode, --explain-oom's text at its first failed allocation
                                     * (NULL: none, or no failure) */
    const char *explain_device;     /* the device those replays ran on, in words (NULL: the one replayed) */
    const struct report_headline *headline; /* the verdict's headline (NULL: none) */
};

/* How many allocations the "live at the peak" table lists. */
#define WEBREPORT_TOP 12
/* How many frames of each it shows before "all N frames" (Python frames first). */
#define WEBREPORT_FRAMES 8

/* Write the page to @p f (opened by the caller before the replays, so a path that cannot be
 * written fails before minutes of replaying) and close it; @p path names it in messages.
 * @return XSEG_ERROR_INVALID_VALUE (with the path in @p err) on a write error,
 * XSEG_ERROR_OUT_OF_MEMORY. */
xseg_status webreport_write(FILE *f, const char *path, const struct webreport_trace *tr, size_t n, char *err,
                            size_t errlen);

#endif
