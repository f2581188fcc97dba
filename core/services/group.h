/*
 * The memory group (memory_group:NAME, issue 37): processes on one device that name the same
 * group share a table in shared memory (/dev/shm/xseg-group-<device uuid>-<name>, 0600, this
 * user's only), each publishing its reserved, allocated and reclaimable bytes in a slot. A malloc
 * the device cannot serve asks the members with the most reclaimable cache to give it back
 * (group_give_way); each member answers from its responder thread by trimming its own cache
 * (trim_device: never live bytes). Nothing read from the table is trusted: a bad header or field
 * is an error naming it, and the process goes on alone.
 *
 * State: one struct group per device, owned here (xseg_rt.group), created by group_attach when the
 * device is created and destroyed by group_detach_all at shutdown.
 */
#ifndef XSEG_CORE_GROUP_H
#define XSEG_CORE_GROUP_H

#include <stdbool.h>
#include <stddef.h>

#include "core/device/device.h"
#include "xseg.h"

/* Join the group the configuration names for @p d, if any, and start its responder thread.
 * A failure leaves the device alone (the reason kept for xseg_group_stats); never fails d. When
 * only the table's lock was busy (over 1 s: a member's long ask), the next growth tries again. */
void group_attach(struct dev_alloc *d);

/* Leave every group (responders joined, slots freed); at shutdown. */
void group_detach_all(void);

/* Whether @p d is in a working group (a relaxed read: cheap on the OOM path). */
bool group_on(const struct dev_alloc *d);

struct budget_view;

/* The OOM ladder's give-way rung (core/reclaim.h): a growth of @p need bytes failed. Ask members to
 * give way, largest reclaimable cache first, for at most memory_group_wait_ms: what the device
 * lacks, or what the group budget lacks (@p bv: the budgets in force, NULL: none) where more;
 * nothing when our own budget refused (no member's memory counts in it). The device lock is held
 * on entry and on return, dropped while asking (nothing read before is trusted after). @return
 * whether any bytes were given, or a member asked died (its memory is back): worth allocating
 * again. */
bool group_give_way(struct dev_alloc *d, size_t need, const struct budget_view *bv);

/*
 * Budgets (memory_budget_mb per process, memory_group_budget_mb for a group's sum) count what a
 * process really holds on the device: xseg's reserved bytes plus its foreign bytes, estimated as
 * the driver's used memory (cuMemGetInfo) less what the other members publish (reserved +
 * foreign) less our reserved. Measured at join, at growth and at OOM, never on a cached malloc.
 */
struct budget_view {
    size_t reserved;        /* ours (xseg's), total_allocated_memory */
    size_t foreign;         /* ours, estimated */
    size_t others_reserved, others_foreign; /* the other live members', as published */
    size_t others_growing;                  /* their growths underway (group budget only) */
    size_t budget, group_budget;            /* bytes; 0: none */
    size_t own_limit, group_limit, limit;   /* the most our reserved may reach; SIZE_MAX: none */
};

/* The smaller budget in force on @p d (no measure, no driver call); SIZE_MAX when none. */
size_t group_budget_cap(const struct dev_alloc *d);

/* Whether growth on @p d measures (a budget, or a group whose figures it keeps exact), or has a
 * join to retry. */
bool group_measure_on(const struct dev_alloc *d);

/* Measure (one cuMemGetInfo) and publish our reserved and foreign bytes. Device lock held. A join
 * group_attach could not finish is tried first, with a try of the table's lock (no wait; no
 * measure while still alone without a budget). Under a group budget, @p grow (the bytes the
 * growth may add; SIZE_MAX: unknown, up to the limit) is published before the others' figures are
 * read and stays until group_note_reserved, so members growing at once never both pass the
 * budget; v->limit is then at most our reserved + @p grow. A growth refused only for others'
 * growths underway measures again after a short back-off (bounded: ~20 ms). */
void group_budget_measure(struct dev_alloc *d, struct budget_view *v, size_t grow);

/* Publish our reserved bytes now and withdraw the growth group_budget_measure published: after
 * every measured growth, failed or not (@p wake: a wake's, measured with SIZE_MAX). Lock held. */
void group_note_reserved(struct dev_alloc *d, bool wake);

/* The OOM message's budget sentences ("" without a budget): measured now. Lock held. */
void group_budget_oom_info(struct dev_alloc *d, size_t alloc_size, char *buf, size_t size);

/* The OOM message's tail: the group's cached and live bytes per member ("" when none). */
void group_oom_info(const struct dev_alloc *d, char *buf, size_t size);

/* xseg_group_stats / xseg_group_read (include/xseg.h). */
xseg_status group_stats(int device, xseg_group_member *members, size_t capacity, size_t *count);
xseg_status group_read(const char *table, xseg_group_member *members, size_t capacity, size_t *count);

#endif
