/*
 * An experiment, not a feature (issue 33): a lifetime oracle. The replay knows when each block
 * will be freed, so with XSEG_REPLAY_ORACLE set it sends the allocations that live long (never
 * freed within the trace, or freed more than N actions later) to one private pool of their own
 * (xseg_begin_allocate_to_pool around that one malloc), so long-lived blocks share pages only
 * with each other. It measures an upper bound of lifetime-aware placement; the allocator is
 * unchanged. docs/benchmarks-replay.md has the figures.
 *
 *   XSEG_REPLAY_ORACLE=never   only allocations never freed in the trace
 *   XSEG_REPLAY_ORACLE=N       also those freed more than N actions after their allocation
 *   XSEG_REPLAY_ORACLE=file:PATH  the allocations whose action indices PATH lists, one per line
 *                              (a predictor's guesses: benchmarks/lifetime_probe.py --write-mask)
 *
 * Under pressure a malloc routed to a pool cannot reclaim (xseg takes a capture to be underway
 * while a pool records), so a refused one ends the route, gives back what the request needs with
 * xseg_trim and tries again; refused again, it goes to the default pool (counted: `fallbacks`).
 */
#ifndef XSEG_TOOLS_REPLAY_ORACLE_H
#define XSEG_TOOLS_REPLAY_ORACLE_H

#include <stdint.h>
#include <stdio.h>

#include "tools/replay/trace.h"

struct oracle {
    int on;
    unsigned char *long_lived; /* per action: an alloc that goes to the pool */
    xseg_pool_id pool;         /* made on first use */
    int trace_routes;          /* the trace's own pool routes and captures in force */
    uint64_t routed, routed_bytes, retried, fallbacks;
};

/*
 * Read XSEG_REPLAY_ORACLE and mark @p t's long-lived allocations. Unset or empty: off.
 * @return XSEG_ERROR_INVALID_VALUE with a message in @p err for a value that is not "never", a
 *         number of actions or a readable mask file of @p t's allocs; XSEG_ERROR_OUT_OF_MEMORY for host memory.
 */
xseg_status oracle_init(struct oracle *o, const struct trace *t, char *err, size_t errlen);
void oracle_destroy(struct oracle *o);

/* Does action @p i's allocation go to the long-lived pool (the oracle is on, the action is
 * long-lived and no pool route or capture of the trace is in force)? */
static inline int oracle_wants(const struct oracle *o, size_t i)
{
    return o->on && o->long_lived[i] && !o->trace_routes;
}

/* xseg_malloc through the long-lived pool (see above); the status of the last try. */
xseg_status oracle_malloc(struct oracle *o, void **p, size_t size, struct CUstream_st *stream);

/* One line on @p f: what went to the pool. */
void oracle_report(const struct oracle *o, FILE *f);

#endif
