/*
 * The pools' tags, and the plans of xseg_sleep_tags / xseg_wake_tags (include/xseg.h: "Sleep
 * and wake by tag"): which pools of a device carry the tags asked for, each pool checked before any
 * sleeps or wakes. api/services.c runs the plan pool by pool (xseg_sleep's and xseg_wake's own
 * paths, the registrants around each), so a tagged sleep is exactly the sleeps it is made of.
 *
 * State: struct tag_state of the device (core/device/state.h), written only here, under the
 * device lock. A tag belongs to a pool id, not to the pool's struct (core/policy/pools.c owns
 * that, below this wing): it may be set before the pool exists on the device, and is dropped once
 * the pool it was seen on is gone (released, no segment left), found at the next call here, so
 * that a program making a tagged MemPool per step does not grow the list; tags_teardown at
 * xseg_shutdown drops them all.
 */
#ifndef XSEG_CORE_SLEEPTAGS_H
#define XSEG_CORE_SLEEPTAGS_H

#include "core/device/device.h"

/* xseg_pool_set_tag / xseg_pool_get_tag (arguments checked here; the lock taken inside). */
xseg_status tags_set(struct dev_alloc *d, xseg_pool_id pool, const char *tag);
xseg_status tags_get(struct dev_alloc *d, xseg_pool_id pool, char *out, size_t capacity);

/* One pool of a plan: its id, how it sleeps (a sleep plan's), and the tag that chose it. */
struct tag_target {
    xseg_pool_id pool;
    unsigned flags;
    char tag[XSEG_TAG_MAX];
};

/* The pools xseg_sleep_tags puts to sleep, offloading ones first (each group in the order of
 * @p tags), into *out (xs_free it; *n of them, possibly 0 when no tagged pool exists on the
 * device yet). Every argument and every pool checked as include/xseg.h says: a refusal changes
 * nothing. Takes the device lock. */
xseg_status tags_plan_sleep(struct dev_alloc *d, const xseg_tag_sleep *tags, size_t count, struct tag_target **out,
                            size_t *n);
/* The sleeping pools xseg_wake_tags wakes, tag by tag in the order of @p tags (pools of a tag in
 * the order they were tagged); awake ones are left out. ILLEGAL_STATE when none sleeps or one is
 * busy (a sleep or wake of it underway). Takes the device lock. */
xseg_status tags_plan_wake(struct dev_alloc *d, const char *const *tags, size_t count, struct tag_target **out,
                           size_t *n);

/* xseg_shutdown: every tag of the device dropped. Lock held. */
void tags_teardown(struct dev_alloc *d);

#endif
