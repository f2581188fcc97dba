/*
 * The refused-growth ladder (PyTorch's chain in DeviceCachingAllocator::malloc, RMM's retry loop):
 * when the driver, the memory fraction or a budget refuses a growth, each rung that applies gives
 * memory back, then the growth is tried again; the first success ends the ladder. The rungs, in
 * order: trim under pressure (core/services/trim.h), release oversize blocks, release every cached
 * block (core/policy/release.h), defragment (core/policy/expandable.h), the memory group's
 * give-way (core/services/group.h), spill to host memory (core/services/spill.h).
 *
 * A rung's work is its module's function; core/reclaim.c holds one row a rung (its name, when it
 * applies, the call that gives, how the growth is tried again: core/grow.h's GROW_RETRY_* bits,
 * the OOM message's sentence) and the loop, which calls the growth's retry (grow_again) directly:
 * the ladder sits above growth (core/alloc.c's malloc_policy calls grow_try, then this ladder).
 * A new rung is a function in its module and a row there.
 *
 * Locking: the device lock is held on entry and on return; a rung may give it back meanwhile (the
 * give-way does: the retry then checks the pool again and measures the budgets again).
 */
#ifndef XSEG_CORE_RECLAIM_H
#define XSEG_CORE_RECLAIM_H

#include <stdbool.h>
#include <stddef.h>

#include "core/grow.h"

/* Climb the ladder for @p p, whose first growth (grow_try) was refused with OUT_OF_MEMORY: each rung
 * that applies gives, then grow_again (core/grow.h, below this module) tries the growth again.
 * XSEG_SUCCESS once a retry succeeded (p->block), XSEG_ERROR_OUT_OF_MEMORY when no rung gave enough
 * (the report is the caller's, core/oom.h), or a retry's other error. Sets p->capture; without a
 * capture, p->cls becomes any segment (S1: under pressure, either kind). The budgets
 * (p->budgeted) have ended on return. */
xseg_status reclaim_run(struct dev_alloc *d, struct alloc_params *p);

/* The OOM message's rung sentences, in ladder order ("" when no rung has one to say): what each
 * rung reports of its state (the group's members, the spilled bytes or why spill failed). */
void reclaim_oom_info(const struct dev_alloc *d, char *buf, size_t n);

#endif
