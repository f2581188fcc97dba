/*
 * xseg-replay --explain-oom: why did an allocation fail with free bytes left? At the first failed
 * allocation of a replay (after xseg's OOM path gave back what it could: empty_cache, reclaim),
 * every free byte still mapped is stranded: it shares a chunk (expandable) or a segment (classic)
 * with a live block, so it cannot go back to the driver without moving live bytes. This names the
 * pages holding those bytes (pages of expandable_page_size_mb counted from each mapped run's
 * start, 2 MiB in the small pool; a whole segment in classic mode, the unit it gives back) and
 * the live blocks pinning them: the trace's buffer, its size, the line that allocated it and the
 * line that frees it (or never). The figures of benchmarks/fit_probe.py, from the public API
 * only (xseg_take_snapshot, xseg_get_config), in the replay itself.
 */
#ifndef XSEG_TOOLS_REPLAY_EXPLAIN_H
#define XSEG_TOOLS_REPLAY_EXPLAIN_H

#include <stddef.h>
#include <stdio.h>

#include "tools/replay/trace.h"

/* How many pages, and pinning blocks per page, the explanation lists (largest free first). */
#define EXPLAIN_PAGES 10
#define EXPLAIN_PINS 6

/*
 * The explanation of the failed allocation at action @p ai of @p t (device 0), as text: a
 * malloc'd string (lines, each ending in a newline), or NULL with the reason in @p err when the
 * snapshot or host memory failed. @p ptrs: per buffer, its live pointer (NULL: not live).
 */
char *explain_oom(const struct trace *t, size_t ai, void *const *ptrs, char *err, size_t errlen);

/* explain_oom's text on @p out: as it is, or as one JSON line {"explain_oom": TEXT} when @p json;
 * when there is none, its reason on stderr. */
void explain_oom_emit(FILE *out, int json, const struct trace *t, size_t ai, void *const *ptrs);

/* The text of a {"explain_oom": TEXT} line (malloc'd), NULL for any other line or out of memory. */
char *explain_oom_from_json(const char *line);

#endif
