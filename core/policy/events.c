/*
 * Deferred frees for record_stream (PyTorch's insert_events / process_events /
 * synchronize_and_free_events). A block freed after record_stream gets one event per recorded
 * stream; it returns to its pool when all have completed. Events are pooled per device and
 * created without timing. Every function runs under the device lock.
 */
#include <stdio.h>
#include <stdlib.h>

#include "core/policy/events.h"
#include "base/error.h"
#include "base/hostmem.h"
#include "base/vec.h"
#include "core/policy/capreuse.h"
#include "core/device/check.h"
#include "core/device/fast.h"
#include "core/device/quarantine.h"
#include "vmm/event.h"
#include "vmm/stream.h"

static xseg_status event_get(struct dev_alloc *d, CUevent *ev)
{
    lock_assert_held(&d->lock);
    if (d->ev.nevent_pool) {
        *ev = d->ev.event_pool[--d->ev.nevent_pool];
        return XSEG_SUCCESS;
    }
    return vevent_create(ev);
}

static void event_put(struct dev_alloc *d, CUevent ev)
{
    lock_assert_held(&d->lock);
    if (!VEC_RESERVE(d->ev.event_pool, d->ev.capevent_pool, d->ev.nevent_pool + 1)) {
        vevent_destroy(ev);
        return;
    }
    d->ev.event_pool[d->ev.nevent_pool++] = ev;
}

static struct ev_queue *queue_for(struct dev_alloc *d, CUstream stream)
{
    lock_assert_held(&d->lock);
    for (size_t i = 0; i < d->ev.nevq; i++)
        if (d->ev.evq[i].stream == stream)
            return &d->ev.evq[i];
    if (!VEC_RESERVE(d->ev.evq, d->ev.capevq, d->ev.nevq + 1))
        return NULL;
    struct ev_queue *q = &d->ev.evq[d->ev.nevq++];
    *q = (struct ev_queue){.stream = stream};
    return q;
}

static bool queue_push(struct ev_queue *q, CUevent ev, struct block *b)
{
    if (q->count == q->cap) {
        size_t ncap = q->cap ? q->cap * 2 : 8;
        struct ev_item *p = xs_malloc(ncap * sizeof *p);
        if (!p)
            return false;
        for (size_t i = 0; i < q->count; i++)
            p[i] = q->items[(q->head + i) % q->cap];
        xs_free(q->items);
        q->items = p;
        q->head = 0;
        q->cap = ncap;
    }
    q->items[(q->head + q->count) % q->cap] = (struct ev_item){ev, b};
    q->count++;
    return true;
}

/* One event of @p b is done: when it was the last, and no recorded stream still waits to be
 * recorded (a retry after a driver failure), the block goes back to its pool. */
static void event_done(struct dev_alloc *d, struct block *b)
{
    lock_assert_held(&d->lock);
    struct block_side *sd = block_side(b);
    xseg_assert(sd); /* a block with events has a side struct */
    if (--sd->event_count == 0 && sd->uses.n == 0 && !quar_enter(d, b, true)) {
        dev_pending_add(d, b, -1);
        dev_free_block(d, b);
    }
}

/* Append @p b to the deferred list (its slot is d->ev.ndeferred - 1 after). */
static bool defer(struct dev_alloc *d, struct block *b)
{
    lock_assert_held(&d->lock);
    if (!VEC_RESERVE(d->ev.deferred, d->ev.capdeferred, d->ev.ndeferred + 1))
        return false;
    d->ev.deferred[d->ev.ndeferred++] = b;
    dev_fast_off(d);
    return true;
}

/*
 * Record an event on every stream in the uses of @p b's side struct. A stream whose event cannot
 * be recorded is waited for instead (vstream_wait: the stream, else the whole context), so the
 * block is never handed out while work may still use it. A stream neither works for stays in
 * the uses and the block goes on the deferred list: it is retried at the next malloc
 * (ev_process) or empty_cache, pending meanwhile (never lost, never reused early). The caller's
 * free has happened either way.
 */
static void record_events(struct dev_alloc *d, struct block *b)
{
    lock_assert_held(&d->lock);
    struct block_side *sd = block_side(b);
    xseg_assert(sd); /* its streams live there */
    struct stream_set uses = sd->uses;
    sd->uses = (struct stream_set){0};
    /* Keep the block "pending" while its events are recorded. */
    sd->event_count++;
    unsigned keep = 0; /* streams to retry, compacted to the front of uses */
    for (unsigned i = 0; i < uses.n; i++) {
        CUstream s = stream_set_get(&uses, i);
        CUevent ev;
        if (event_get(d, &ev) == XSEG_SUCCESS) {
            if (vevent_record(ev, s)) {
                struct ev_queue *q = queue_for(d, s);
                if (q && queue_push(q, ev, b)) {
                    sd->event_count++;
                    d->ev.pending_events++;
                    dev_fast_off(d);
                    continue;
                }
            }
            event_put(d, ev);
        }
        if (vstream_wait(s, "for a freed block used on it (xseg_record_stream)") == XSEG_SUCCESS)
            continue;
        if (uses.cap > 2)
            uses.heap[keep++] = s;
        else
            uses.inl[keep++] = s;
    }
    uses.n = keep;
    if (keep && defer(d, b))
        sd->uses = uses; /* retried later; still pending */
    else
        stream_set_clear(&uses); /* all recorded or waited for (or no host memory to retry) */
    event_done(d, b);
}

xseg_status ev_insert(struct dev_alloc *d, struct block *b)
{
    lock_assert_held(&d->lock);
    /* Freed with streams to wait for: pending (still active) until event_done or a capture's
     * reuse returns it to its pool. */
    xseg_assert(!b->allocated && block_uses_n(b) && !block_event_count(b));
    dev_pending_add(d, b, 1);
    /* Without the device's context nothing can be recorded now: retry later (a driver failure
     * must not lose the block). */
    if (drv_ctx_ensure(d->info.primary_ctx) != XSEG_SUCCESS && defer(d, b))
        return XSEG_SUCCESS;
    /* During a capture, event queries are illegal: defer recording until it ends. */
    if (cap_underway(d) && dev_capture_underway(d) && defer(d, b)) {
        /* graph_capture_record_stream_reuse: the graph may free it before the capture ends. */
        if (d->cfg.graph_capture_record_stream_reuse)
            capreuse_mark(d, b, d->ev.ndeferred - 1);
        return XSEG_SUCCESS;
    }
    record_events(d, b);
    return XSEG_SUCCESS;
}

/* Record the deferred blocks' events. A block that fails again is deferred anew, so the list is
 * swapped out first. */
static void insert_deferred(struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    capreuse_reset(d); /* the captures are over: their graph markers mean nothing now */
    struct block **list = d->ev.deferred;
    size_t n = d->ev.ndeferred;
    d->ev.deferred = NULL;
    d->ev.ndeferred = d->ev.capdeferred = 0;
    for (size_t i = 0; i < n; i++)
        if (list[i]) /* NULL: reused during the capture (capreuse.c) */
            record_events(d, list[i]);
    xs_free(list);
}

void ev_capture_reuse(struct dev_alloc *d, CUstream stream)
{
    lock_assert_held(&d->lock);
    capreuse_collect(d, stream);
    size_t slot;
    for (struct block *b; (b = capreuse_take(d, &slot)) != NULL;) {
        xseg_assert(slot < d->ev.ndeferred && d->ev.deferred[slot] == b);
        /* An empty slot is skipped by insert_deferred, which drops the whole list at the capture's
         * end: no compaction here, so the other entries' slots stay valid. */
        d->ev.deferred[slot] = NULL;
        dev_pending_add(d, b, -1);
        dev_free_block(d, b);
    }
}

/* Take the finished head item off queue @p q and return its event to the pool. */
static void queue_pop_done(struct dev_alloc *d, struct ev_queue *q)
{
    lock_assert_held(&d->lock);
    struct ev_item it = q->items[q->head];
    q->head = (q->head + 1) % q->cap;
    q->count--;
    d->ev.pending_events--;
    event_put(d, it.event);
    event_done(d, it.block);
}

/* Drop empty queue @p i (swap with the last). */
static void queue_drop(struct dev_alloc *d, size_t i)
{
    lock_assert_held(&d->lock);
    xs_free(d->ev.evq[i].items);
    d->ev.evq[i] = d->ev.evq[--d->ev.nevq];
}

/* Each queue's blocks, oldest first, while their event is done (@p wait: waited for); emptied
 * queues dropped. */
static void drain_queues(struct dev_alloc *d, bool wait)
{
    if (drv_ctx_ensure(d->info.primary_ctx) != XSEG_SUCCESS)
        return;
    if (d->ev.ndeferred)
        insert_deferred(d);
    for (size_t i = 0; i < d->ev.nevq;) {
        struct ev_queue *q = &d->ev.evq[i];
        while (q->count) {
            CUevent ev = q->items[q->head].event;
            /* Not ready, or the query failed: the work may still run; ask again next time
             * (ev_synchronize_all waits for it). An event that cannot be waited for: wait for the
             * context (never its stream: the block is freed, the program may have destroyed it);
             * when nothing works the block stays pending and a later call tries again. */
            if (!wait ? !vevent_done(ev) : !vevent_wait(ev) && vctx_wait("for a freed block's event") != XSEG_SUCCESS)
                break;
            queue_pop_done(d, q);
        }
        if (q->count == 0)
            queue_drop(d, i);
        else
            i++;
    }
}

void ev_process(struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    drain_queues(d, false);
}

void ev_synchronize_all(struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    dev_count_sync_all(d);
    drain_queues(d, true);
}

void ev_destroy(struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    for (size_t i = 0; i < d->ev.nevent_pool; i++)
        vevent_destroy(d->ev.event_pool[i]);
    xs_free(d->ev.event_pool);
    d->ev.event_pool = NULL;
    d->ev.nevent_pool = d->ev.capevent_pool = 0;
    if (d->ev.pending_events || d->ev.ndeferred)
        return; /* the queues still hold work: only the pooled events were given back */
    for (size_t i = 0; i < d->ev.nevq; i++)
        xs_free(d->ev.evq[i].items);
    xs_free(d->ev.evq);
    xs_free(d->ev.deferred);
    d->ev = (struct ev_state){0};
}

xseg_status ev_record_stream(struct dev_alloc *d, void *ptr, CUstream stream, bool *owned)
{
    dev_lock(d, DEV_NEED_SLOTS);
    struct block *b = ptrmap_get(&d->live, (uintptr_t)ptr);
    if (!b) {
        dev_unlock(d);
        *owned = false;
        return XSEG_SUCCESS;
    }
    *owned = true;
    xseg_status st = XSEG_SUCCESS;
    struct block_side *sd = block_side(b);
    if (stream != b->stream && !(sd && stream_set_has(&sd->uses, stream))) {
        /* A destroyed or bogus stream is refused now, with nothing recorded: at the free it could
         * only be waited for through a context synchronize. */
        st = drv_ctx_ensure(d->info.primary_ctx);
        if (st == XSEG_SUCCESS)
            st = vstream_check(stream, "xseg_record_stream");
        if (st == XSEG_SUCCESS) {
            /* The side struct holds the set; on host OOM a side made here goes again. */
            if (!(sd = block_side_get(b)) || !stream_set_add(&sd->uses, stream)) {
                block_side_drop(b);
                st = err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory recording stream %p", (void *)stream);
            }
        }
    }
    dev_unlock(d);
    return st;
}
