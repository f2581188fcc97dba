/*
 * Snapshots in PyTorch's format (torch.cuda.memory._dump_snapshot): the segments and blocks of
 * every device with their allocation stacks, the history's events, the allocator settings, as a
 * pickle (protocol 2; only dict, list, str, int, float, bool, tuple: no class is named, so a
 * restricted unpickler and MemoryViz.js's own unpickler read it) or as JSON. Also the live-process
 * log (the history's events as an xseg-replay trace) and the OOM snapshot; and the walk over one
 * device's segments that xseg_take_snapshot and every writer start from.
 *
 * Every writer takes device locks one at a time and the history lock briefly; it never holds a
 * lock while writing to the file.
 */
#ifndef XSEG_CORE_SNAPSHOT_H
#define XSEG_CORE_SNAPSHOT_H

#include <stdbool.h>
#include <stddef.h>

#include "base/common.h"

struct dev_alloc;
struct hstack;

/* The writers trust their callers (api/history.c checks what the user passed): the runtime is
 * initialized, @p device is -1 or a device index, @p path is a non-empty string. */

/* Write a snapshot of @p device (-1: every device) to @p path (via a temporary file renamed
 * into place). @p json: JSON instead of the pickle. */
xseg_status snapshot_write(int device, const char *path, bool json);

/* The history's events of @p device (-1: all) as an xseg-replay trace at @p path. */
xseg_status snapshot_write_trace(int device, const char *path);

/* The OOM snapshot path (NULL: off; xseg_set_oom_snapshot). Until set, $XSEG_OOM_SNAPSHOT. */
xseg_status snapshot_set_oom_path(const char *path);
/* Back to the start (xseg_shutdown): no path set, $XSEG_OOM_SNAPSHOT read again. */
void snapshot_oom_reset(void);

/* An OOM surfaces (no device lock held): write the OOM snapshot if one is asked for and the last
 * was written long enough ago; @p info receives a sentence for the OOM message (" A memory
 * snapshot was written to PATH." or why not), or "". */
void snapshot_on_oom(char *info, size_t size);

/* Segments gathered for a snapshot, across devices. With with_stacks, stacks[i] is a malloc'd
 * array of segment i's blocks' allocation stacks (NULL: none), each referenced. */
struct snap_acc {
    xseg_segment_info *segs;
    struct hstack ***stacks;
    size_t n, cap, cap_stacks; /* capacities of segs and stacks */
    bool with_stacks;
};
/* Append this device's segments to @p a (lock taken here). */
xseg_status snapshot_segments(struct dev_alloc *d, struct snap_acc *a);
/* Free what @p a holds (blocks, stack references) and zero it. */
void snap_acc_free(struct snap_acc *a);

#endif
