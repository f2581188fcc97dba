/*
 * Deferred frees for record_stream (PyTorch's insert_events / process_events /
 * synchronize_and_free_events). A block freed after record_stream gets one event per recorded
 * stream; it returns to its pool when all have completed. Events are pooled per device and
 * created without timing. Every function runs under the device lock.
 */
#include <stdio.h>
#include <stdlib.h>

#include "src/alloc.h"
#include "src/error.h"

static xseg_status event_get(struct dev_alloc *d, CUevent *ev)
{
    if (d->nevent_pool) {
        *ev = d->event_pool[--d->nevent_pool];
        return XSEG_SUCCESS;
    }
    CUresult r = drv->cuEventCreate(ev, CU_EVENT_DISABLE_TIMING);
    return r == CUDA_SUCCESS ? XSEG_SUCCESS : drv_fail(r, "cuEventCreate(CU_EVENT_DISABLE_TIMING)");
}

static void event_put(struct dev_alloc *d, CUevent ev)
{
    if (d->nevent_pool == d->capevent_pool) {
        size_t ncap = d->capevent_pool ? d->capevent_pool * 2 : 16;
        CUevent *p = realloc(d->event_pool, ncap * sizeof *p);
        if (!p) {
            (void)drv->cuEventDestroy(ev);
            return;
        }
        d->event_pool = p;
        d->capevent_pool = ncap;
    }
    d->event_pool[d->nevent_pool++] = ev;
}

static struct ev_queue *queue_for(struct dev_alloc *d, CUstream stream)
{
    for (size_t i = 0; i < d->nevq; i++)
        if (d->evq[i].stream == stream)
            return &d->evq[i];
    if (d->nevq == d->capevq) {
        size_t ncap = d->capevq ? d->capevq * 2 : 4;
        struct ev_queue *p = realloc(d->evq, ncap * sizeof *p);
        if (!p)
            return NULL;
        d->evq = p;
        d->capevq = ncap;
    }
    struct ev_queue *q = &d->evq[d->nevq++];
    *q = (struct ev_queue){.stream = stream};
    return q;
}

static bool queue_push(struct ev_queue *q, CUevent ev, struct block *b)
{
    if (q->count == q->cap) {
        size_t ncap = q->cap ? q->cap * 2 : 8;
        struct ev_item *p = malloc(ncap * sizeof *p);
        if (!p)
            return false;
        for (size_t i = 0; i < q->count; i++)
            p[i] = q->items[(q->head + i) % q->cap];
        free(q->items);
        q->items = p;
        q->head = 0;
        q->cap = ncap;
    }
    q->items[(q->head + q->count) % q->cap] = (struct ev_item){ev, b};
    q->count++;
    return true;
}

/* One event of @p b is done: when it was the last, the block goes back to its pool. */
static void event_done(struct dev_alloc *d, struct block *b)
{
    if (--b->event_count == 0)
        alloc_free_block(d, b);
}

static bool defer(struct dev_alloc *d, struct block *b)
{
    if (d->ndeferred == d->capdeferred) {
        size_t ncap = d->capdeferred ? d->capdeferred * 2 : 8;
        struct block **p = realloc(d->deferred, ncap * sizeof *p);
        if (!p)
            return false;
        d->deferred = p;
        d->capdeferred = ncap;
    }
    d->deferred[d->ndeferred++] = b;
    alloc_fast_off(d);
    return true;
}

/* Record an event on every stream in b->uses. On a driver failure for one stream, that stream
 * is synchronized instead, so the block is never handed out while work may still use it. */
static xseg_status record_events(struct dev_alloc *d, struct block *b)
{
    xseg_status first = XSEG_SUCCESS;
    struct stream_set uses = b->uses;
    b->uses = (struct stream_set){0};
    /* Keep the block "pending" while its events are recorded. */
    b->event_count++;
    for (unsigned i = 0; i < uses.n; i++) {
        CUstream s = stream_set_get(&uses, i);
        CUevent ev;
        xseg_status st = event_get(d, &ev);
        if (st == XSEG_SUCCESS) {
            CUresult r = drv->cuEventRecord(ev, s);
            if (r != CUDA_SUCCESS) {
                st = drv_fail(r, "cuEventRecord");
                event_put(d, ev);
            } else {
                struct ev_queue *q = queue_for(d, s);
                if (q && queue_push(q, ev, b)) {
                    b->event_count++;
                    d->pending_events++;
                    alloc_fast_off(d);
                    continue;
                }
                event_put(d, ev);
                st = err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory recording a free");
            }
        }
        if (first == XSEG_SUCCESS)
            first = st;
        (void)drv->cuStreamSynchronize(s);
    }
    stream_set_clear(&uses);
    event_done(d, b);
    return first;
}

xseg_status ev_insert(struct dev_alloc *d, struct block *b)
{
    if (drv_ctx_ensure(d->info.primary_ctx) != XSEG_SUCCESS)
        return XSEG_ERROR_DRIVER;
    /* During a capture, event queries are illegal: defer recording until it ends. */
    if ((d->ncapturing || d->nroutes) && alloc_capture_underway(d, false) && defer(d, b))
        return XSEG_SUCCESS;
    return record_events(d, b);
}

static void insert_deferred(struct dev_alloc *d)
{
    size_t n = d->ndeferred;
    d->ndeferred = 0;
    for (size_t i = 0; i < n; i++)
        (void)record_events(d, d->deferred[i]);
}

void ev_process(struct dev_alloc *d)
{
    if (drv_ctx_ensure(d->info.primary_ctx) != XSEG_SUCCESS)
        return;
    if (d->ndeferred)
        insert_deferred(d);
    for (size_t i = 0; i < d->nevq;) {
        struct ev_queue *q = &d->evq[i];
        while (q->count) {
            struct ev_item it = q->items[q->head];
            CUresult r = drv->cuEventQuery(it.event);
            if (r == CUDA_ERROR_NOT_READY)
                break;
            /* Any other error: treat the event as done (the stream failed; nothing will run). */
            q->head = (q->head + 1) % q->cap;
            q->count--;
            d->pending_events--;
            event_put(d, it.event);
            event_done(d, it.block);
        }
        if (q->count == 0) {
            free(q->items);
            d->evq[i] = d->evq[--d->nevq];
        } else {
            i++;
        }
    }
}

void ev_synchronize_all(struct dev_alloc *d)
{
    d->stats.num_sync_all_streams++;
    if (drv_ctx_ensure(d->info.primary_ctx) != XSEG_SUCCESS)
        return;
    if (d->ndeferred)
        insert_deferred(d);
    for (size_t i = 0; i < d->nevq; i++) {
        struct ev_queue *q = &d->evq[i];
        while (q->count) {
            struct ev_item it = q->items[q->head];
            (void)drv->cuEventSynchronize(it.event);
            q->head = (q->head + 1) % q->cap;
            q->count--;
            d->pending_events--;
            event_put(d, it.event);
            event_done(d, it.block);
        }
        free(q->items);
    }
    d->nevq = 0;
}

void ev_destroy(struct dev_alloc *d)
{
    for (size_t i = 0; i < d->nevent_pool; i++)
        (void)drv->cuEventDestroy(d->event_pool[i]);
    free(d->event_pool);
    d->event_pool = NULL;
    d->nevent_pool = d->capevent_pool = 0;
}
