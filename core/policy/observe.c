/*
 * Segment observers, for libraries that register device memory (NCCL's
 * ncclMemRegister / user buffer registration, RDMA's ibv_reg_mr, ...) and must follow every map
 * and unmap. PyTorch's allocator trace tracker (pytorch #112238) is the model.
 *
 * Ordering without missed or doubled events: an observer is attached in two steps. First it goes
 * into the list with, per device, `ready` set only for devices that have no allocator yet (they
 * have nothing mapped, so every later event is news). Then each existing device is locked in
 * turn, its current mappings are replayed to the new observer as MAP events and `ready` is set,
 * all under that device's lock. Events are emitted under the device lock too, and an observer
 * hears a device's events only once it is ready for it: an event before the replay is already
 * part of the replayed state, every event after it is delivered.
 *
 * Lock order: a device lock, then xseg_rt.obs.lock (events, replay); never the reverse.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/fork.h"
#include "base/hostmem.h"
#include "base/vec.h"
#include "base/witness.h"
#include "core/device/check.h"
#include "core/policy/observe.h"
#include "vmm/segment.h"

/* A run of pages is reported in events of at most this many ranges (a stack array: the hook
 * allocates nothing, so it cannot fail). */
#define OBS_RANGES_MAX 64

struct observer {
    xseg_segment_observer fn;
    void *user;
    bool ready[ALLOC_MAX_DEVICES];
};

/* This module's state is xseg_rt.obs (core/process/procstate.h). */
FORK_MUTEX_AT(FORK_RANK_OBSERVERS, obs_lock, xseg_rt.obs.lock)

/* Deliver @p ev to every observer ready for its device (or only to @p only). xseg_rt.obs.lock held. */
static void obs_deliver_locked(const xseg_segment_event *ev, const struct observer *only)
{
    for (size_t i = 0; i < xseg_rt.obs.n; i++) {
        const struct observer *o = &xseg_rt.obs.list[i];
        if (only ? o == only : o->ready[ev->device])
            o->fn(ev, o->user);
    }
}

/* Report granules [first, last) of @p seg (whole chunks), one range per chunk, at most
 * OBS_RANGES_MAX ranges an event. xseg_rt.obs.lock held. */
static void obs_pages_locked(struct seg *seg, int device, size_t first, size_t last, int mapped,
                             const struct observer *only)
{
    xseg_phys_range r[OBS_RANGES_MAX];
    size_t gran = seg_gran(seg);
    uintptr_t base = (uintptr_t)seg_base(seg);
    for (size_t g = first; g < last;) {
        size_t k = 0, bytes = 0;
        for (; k < OBS_RANGES_MAX && g < last; k++) {
            CUmemGenericAllocationHandle h = 0;
            size_t c = g, n = 1;
            if (!seg_chunk(seg, g, &h, &c, &n)) {
                c = g;
                n = 1;
            }
            size_t end = XSEG_MIN(c + n, last);
            r[k] = (xseg_phys_range){.address = base + g * gran, .length = (end - g) * gran,
                                     .handle = (uint64_t)h, .offset = (g - c) * gran};
            bytes += r[k].length;
            g = end;
        }
        xseg_segment_event ev = {.kind = mapped ? XSEG_SEGMENT_MAP : XSEG_SEGMENT_UNMAP, .device = device,
                                 .address = r[0].address, .size = bytes, .is_expandable = 1,
                                 .nranges = k, .ranges = r};
        obs_deliver_locked(&ev, only);
    }
}

void obs_segment_hook(void *user, struct seg *seg, size_t first, size_t last, int mapped)
{
    struct dev_alloc *d = user;
    lock_assert_held(&d->lock);
    if (!atomic_load_explicit(&xseg_rt.obs.count, memory_order_relaxed))
        return;
    mutex_lock(&xseg_rt.obs.lock);
    obs_pages_locked(seg, d->device, first, last, mapped, NULL);
    mutex_unlock(&xseg_rt.obs.lock);
}

void obs_classic(struct dev_alloc *d, uintptr_t addr, size_t size, xseg_segment_event_kind kind)
{
    lock_assert_held(&d->lock);
    if (!atomic_load_explicit(&xseg_rt.obs.count, memory_order_relaxed))
        return;
    xseg_phys_range r = {.address = addr, .length = size, .handle = 0, .offset = 0};
    xseg_segment_event ev = {.kind = kind, .device = d->device, .address = addr, .size = size,
                             .is_expandable = 0, .nranges = 1, .ranges = &r};
    mutex_lock(&xseg_rt.obs.lock);
    obs_deliver_locked(&ev, NULL);
    mutex_unlock(&xseg_rt.obs.lock);
}

/* Replay context for one device. */
struct obs_replay {
    struct dev_alloc *d;
    const struct observer *only;
};

static void obs_replay_run(void *user, struct seg *seg, size_t first, size_t last, int mapped)
{
    struct obs_replay *rp = user;
    lock_assert_held(&rp->d->lock);
    obs_pages_locked(seg, rp->d->device, first, last, mapped, rp->only);
}

/* Find (fn, user) in the list. xseg_rt.obs.lock held. */
static struct observer *obs_find_locked(xseg_segment_observer fn, void *user)
{
    for (size_t i = 0; i < xseg_rt.obs.n; i++)
        if (xseg_rt.obs.list[i].fn == fn && xseg_rt.obs.list[i].user == user)
            return &xseg_rt.obs.list[i];
    return NULL;
}

xseg_status obs_attach(xseg_segment_observer fn, void *user, dev_peek_fn device_at)
{
    mutex_lock(&xseg_rt.obs.lock);
    if (obs_find_locked(fn, user)) {
        mutex_unlock(&xseg_rt.obs.lock);
        return err_set(XSEG_ERROR_INVALID_VALUE,
                       "xseg_attach_segment_observer: this (fn, user) pair is attached already");
    }
    if (!VEC_RESERVE(xseg_rt.obs.list, xseg_rt.obs.cap, xseg_rt.obs.n + 1)) {
        mutex_unlock(&xseg_rt.obs.lock);
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "xseg_attach_segment_observer: out of host memory");
    }
    struct observer *o = &xseg_rt.obs.list[xseg_rt.obs.n++];
    memset(o, 0, sizeof *o);
    o->fn = fn;
    o->user = user;
    bool pending[ALLOC_MAX_DEVICES];
    for (int i = 0; i < ALLOC_MAX_DEVICES; i++) {
        pending[i] = device_at(i) != NULL;
        o->ready[i] = !pending[i];
    }
    atomic_store_explicit(&xseg_rt.obs.count, xseg_rt.obs.n, memory_order_relaxed);
    mutex_unlock(&xseg_rt.obs.lock);

    for (int i = 0; i < ALLOC_MAX_DEVICES; i++) {
        if (!pending[i])
            continue;
        struct dev_alloc *d = device_at(i);
        dev_lock(d, DEV_NEED_SLOTS);
        mutex_lock(&xseg_rt.obs.lock);
        /* The list may have moved (realloc by another attach) or this entry been detached. */
        struct observer *me = obs_find_locked(fn, user);
        if (me && !me->ready[i]) {
            struct obs_replay rp = {d, me};
            for (struct segrec *s = d->segs; s; s = s->next_seg) {
                if (s->vseg) {
                    seg_replay_mapped(s->vseg, obs_replay_run, &rp);
                } else if (s->first) {
                    xseg_phys_range r = {.address = s->first->addr, .length = s->size};
                    xseg_segment_event ev = {.kind = XSEG_SEGMENT_MAP, .device = i, .address = r.address,
                                             .size = s->size, .is_expandable = 0, .nranges = 1, .ranges = &r};
                    obs_deliver_locked(&ev, me);
                }
            }
            me->ready[i] = true;
        }
        mutex_unlock(&xseg_rt.obs.lock);
        dev_unlock(d);
    }
    return XSEG_SUCCESS;
}

void obs_detach_all(void)
{
    mutex_lock(&xseg_rt.obs.lock);
    xs_free(xseg_rt.obs.list);
    xseg_rt.obs.list = NULL;
    xseg_rt.obs.n = xseg_rt.obs.cap = 0;
    atomic_store_explicit(&xseg_rt.obs.count, 0, memory_order_relaxed);
    mutex_unlock(&xseg_rt.obs.lock);
}

xseg_status obs_detach(xseg_segment_observer fn, void *user)
{
    mutex_lock(&xseg_rt.obs.lock);
    struct observer *o = obs_find_locked(fn, user);
    if (!o) {
        mutex_unlock(&xseg_rt.obs.lock);
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_detach_segment_observer: no such observer is attached");
    }
    size_t i = (size_t)(o - xseg_rt.obs.list);
    memmove(&xseg_rt.obs.list[i], &xseg_rt.obs.list[i + 1], (xseg_rt.obs.n - i - 1) * sizeof *xseg_rt.obs.list);
    xseg_rt.obs.n--;
    atomic_store_explicit(&xseg_rt.obs.count, xseg_rt.obs.n, memory_order_relaxed);
    mutex_unlock(&xseg_rt.obs.lock);
    return XSEG_SUCCESS;
}
