/*
 * Which streams several threads use at once (struct sharing, core/device/state.h): a table of one
 * entry a stream slot index, written only through the transitions below (by fast.c, device lock
 * held). Its state for a stream, enum sharing_state, decides where a free through the device lock
 * of a block of that stream goes (fast_put, core/device/fast.h; see Note [slot rule] there):
 *
 *     ALONE   --sharing_probe-->       PROBED   a free of last_alloc beside another block (free_beside)
 *     PROBED  --sharing_probe_end-->   QUIET    the prober's own next free: no other thread there
 *     QUIET   --sharing_quiet_tick-->  QUIET    a free of the prober, unprobed (ALONE at 0)
 *     any     --sharing_mark-->        SHARED   another thread's free or malloc met the stream
 *     SHARED  --sharing_fade-->        ALONE    the other threads' fronts of the stream went unused
 *                                       for a check period (fast.c's check-in; its fronts settled)
 *     SHARED, PROBED --sharing_reset_all--> ALONE, or QUIET where a countdown is left: every slot
 *                                       settled (FAST_ALL)
 *
 * An entry holds one marked stream and one probed stream, which may differ (two streams at one
 * index): sharing_state reads the one asked about. The countdown outlives a reset, and a probe of
 * another stream or by another thread at its entry takes the countdown over (the entry keeps one
 * prober): as fast.c has always done, kept so that a lone thread's frees stay as cheap.
 */
#ifndef XSEG_CORE_SHARING_H
#define XSEG_CORE_SHARING_H

#include <stdbool.h>
#include <stdint.h>

#include "core/device/state.h"

/* A probe the prober's own free ended holds off its next SHARING_QUIET_FREES probes of the
 * stream: each probe sends one free through the guarded path. */
#define SHARING_QUIET_FREES 63

enum sharing_state {
    SHARING_ALONE,  /* no mark, no open probe, no countdown: a free may fill the stream's slot */
    SHARING_PROBED, /* a probe open: the next free there by another thread marks it */
    SHARING_QUIET,  /* the probe ended by its prober: its next frees there probe no more */
    SHARING_SHARED, /* several threads' pairs meet there: its frees fill own slots */
};

/* Is any stream marked or probed? One load: the fast paths' test before any other here. */
static inline uint64_t sharing_any(const struct sharing *t) { return t->any_either; }

/* Is @p stream marked shared at its entry @p i? */
static inline bool sharing_is_shared(const struct sharing *t, unsigned i, const void *stream)
{
    return (t->any.shared >> i & 1) && t->entry[i].shared == stream;
}

/* Is a probe open at entry @p i (of whatever stream: entry[i].stream)? */
static inline bool sharing_is_probed(const struct sharing *t, unsigned i) { return t->any.probed >> i & 1; }

/* The state of @p stream at its entry @p i (a mark first: marking ends the stream's probe). */
static inline enum sharing_state sharing_state(const struct sharing *t, unsigned i, const void *stream)
{
    const struct sharing_entry *e = &t->entry[i];
    if (sharing_is_shared(t, i, stream))
        return SHARING_SHARED;
    if (e->stream != stream)
        return SHARING_ALONE;
    if (sharing_is_probed(t, i))
        return SHARING_PROBED;
    return e->quiet ? SHARING_QUIET : SHARING_ALONE;
}

/* The marked stream at entry @p i that a mark there displaces (its own slots must settle first:
 * they are found by the mark), or NULL. */
static inline CUstream sharing_displaced(const struct sharing *t, unsigned i)
{
    return t->any.shared >> i & 1 ? t->entry[i].shared : NULL;
}

/* Mark @p stream shared at its entry @p i (any stream marked there before gives its mark up);
 * the stream's open probe, if any, is done. */
static inline void sharing_mark(struct sharing *t, unsigned i, CUstream stream)
{
    t->entry[i].shared = stream;
    t->any.shared |= (uint32_t)1 << i;
    t->any.probed &= ~((uint32_t)1 << i);
}

/* Open a probe of @p stream by @p owner at its entry @p i (its countdown, if any, stays). */
static inline void sharing_probe(struct sharing *t, unsigned i, CUstream stream, const void *owner)
{
    t->any.probed |= (uint32_t)1 << i;
    t->entry[i].stream = stream;
    t->entry[i].owner = owner;
}

/* The prober's own free ended the probe at entry @p i: its countdown starts. */
static inline void sharing_probe_end(struct sharing *t, unsigned i)
{
    t->any.probed &= ~((uint32_t)1 << i);
    t->entry[i].quiet = SHARING_QUIET_FREES;
}

/* A free of @p stream by @p owner at entry @p i, counted against the countdown: true when it is
 * the prober's and the countdown runs (one tick taken: no probe this time). */
static inline bool sharing_quiet_tick(struct sharing *t, unsigned i, CUstream stream, const void *owner)
{
    struct sharing_entry *e = &t->entry[i];
    if (!(e->quiet && e->stream == stream && e->owner == owner))
        return false;
    e->quiet--;
    return true;
}

/* Every slot settled: no stream is marked, no probe open (sharing is seen again). */
static inline void sharing_reset_all(struct sharing *t) { t->any_either = 0; }

/* The mark at entry @p i fades: its threads stopped meeting there (its own slots settled). */
static inline void sharing_fade(struct sharing *t, unsigned i) { t->any.shared &= ~((uint32_t)1 << i); }

#endif
