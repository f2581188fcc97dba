/*
 * graph_capture_record_stream_reuse (seed 003, "Deferred Memory Recycling", Solution 2): reuse
 * of record_stream'ed blocks freed during a capture once the capture graph orders every later
 * use after their last one, instead of deferring them to the end of the capture.
 *
 * When such a block is freed during a capture (option on, block in a private pool, every stream
 * that used it taking part in the same capture as its own stream), its *markers* are recorded:
 * the current dependency set of each stream in its uses (where that stream's use ends), plus an
 * empty node put into its own stream's capture (where its use ends there). Before an allocation
 * on a capturing stream, the nodes that precede the stream's current dependency set are found by
 * a reverse walk of the graph; a block of that stream whose markers all precede them is returned
 * to its pool at once: whatever is captured on the stream next depends on every one of those
 * nodes, hence comes after the block's last use on every stream.
 *
 * Bounded: per (capture, stream) the walk remembers every node it has reached and never enters
 * one twice, so all the walks of one stream over a capture cost at most one pass over the graph
 * (each node's dependencies are read at most once), not one per allocation. And lazy: a walk goes
 * breadth first from the stream's dependencies and stops as soon as it has reached the previous
 * walk's starting points and no block waits for a marker; what it reached without reading stays
 * in a frontier, read only by a walk that still looks for a marker. A stream whose blocks become
 * reusable as soon as their streams join back reads a few nodes per walk, not every node added
 * since the last one (work on side streams is never read). Remembering is right while a
 * stream's later dependencies descend from its earlier ones (the stream order: captured work,
 * event waits and xseg's own markers keep it). Each walk checks it: it must reach every node of
 * the previous walk's dependency set again; when it does not (a program replaced the stream's
 * dependencies with cuStreamUpdateCaptureDependencies(SET) by nodes that do not descend from
 * them), the walk forgets what it remembered and starts over from the current dependencies, so
 * such programs cost a full walk, never a wrong reuse. (PyTorch's implementation assumes the
 * stream order without checking it.)
 *
 * Everything runs under the device lock; nothing here runs outside a capture or with the option
 * off. Blocks with markers stay in the device's deferred list too, so when the capture ends first
 * they take the ordinary path (events recorded, polled after the capture). That list is events.c's,
 * which sits above this module: it files blocks here (capreuse_mark) and takes the reusable ones
 * back (capreuse_collect, capreuse_take); nothing here calls events.c.
 */
#ifndef XSEG_CORE_CAPREUSE_H
#define XSEG_CORE_CAPREUSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

struct dev_alloc;
struct block;
/* The module's state (struct capreuse, dev_alloc.cr) is declared in core/device/state.h. */

/* @p b (allocated, with recorded streams) is freed during a capture and was put in the deferred
 * list at @p slot (events.c): record its markers when the option is on and it qualifies (see
 * above). Failures (driver, host memory) only leave the block deferred to the end of the capture. */
void capreuse_mark(struct dev_alloc *d, struct block *b, size_t slot);

/* Before an allocation on @p stream during a capture: find the blocks of @p stream whose markers
 * precede its dependencies, for capreuse_take. Cheap when nothing is marked. */
void capreuse_collect(struct dev_alloc *d, CUstream stream);

/* One block capreuse_collect found, its recorded streams cleared (the graph orders whatever is
 * captured next on the stream after every marker: it needs no event), and its deferred-list slot
 * in @p slot; NULL when none is left. The caller empties the slot and returns it to its pool. */
struct block *capreuse_take(struct dev_alloc *d, size_t *slot);

/* The captures are over: forget every marker and walk (the blocks stay in the deferred list). */
void capreuse_reset(struct dev_alloc *d);

#endif
