/*
 * Allocation history (xseg_record_memory_history): a bounded ring of trace events with PyTorch's
 * action names, and stacks shared between events and blocks.
 *
 * Stacks: a stack is an array of frames, innermost first; a frame is either a C return address
 * (captured with backtrace(), symbolized only when a snapshot is written) or, tagged with
 * HIST_FRAME_TAG, a pointer to an interned (filename, name, line) frame handed in by the user's
 * callback (e.g. Python frames). Identical stacks are stored once (hash table) and reference
 * counted: each event in the ring and each live block holds one reference, so the memory used is
 * bounded by the ring's capacity plus the live blocks. A stack's frames never change once made,
 * so a holder of a reference may read them without the lock.
 *
 * Cost when off: nothing on the fast path. Turning recording on sets every device's fast-path
 * permit to 0 (malloc then takes its general path, which captures the stack with the device lock
 * released) and marks every live block `recorded`; a free checks `recorded` in the same test as
 * `oversize` (block_free_slow), so the free path has no extra branch either.
 *
 * Locking: one mutex (xseg_rt.hist.lock) guards the ring, the stack table, the interned frames and the
 * options. It is a leaf: taken with or without a device lock, never the other way round.
 */
#ifndef XSEG_CORE_HISTORY_H
#define XSEG_CORE_HISTORY_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/common.h"
#include "core/process/procstate.h"
#include "xseg.h"

/* Trace actions, in the order of PyTorch's TraceEntry::Action; hist_action_name gives the
 * strings the snapshot carries. */
enum hist_action {
    HIST_ALLOC,
    HIST_FREE_REQUESTED,
    HIST_FREE_COMPLETED,
    HIST_SEGMENT_ALLOC,
    HIST_SEGMENT_FREE,
    HIST_SEGMENT_MAP,
    HIST_SEGMENT_UNMAP,
    HIST_SNAPSHOT,
    HIST_OOM,
    HIST_NACTIONS
};
const char *hist_action_name(int action);

/* The frame tag: user-space addresses never have bit 63 set. */
#define HIST_FRAME_TAG ((uintptr_t)1 << (sizeof(uintptr_t) * 8 - 1))

/* An interned frame from the stack callback (strings owned, never freed while the table lives). */
struct hframe {
    const char *filename;
    const char *name;
    int line;
    uint64_t hash;
    struct hframe *chain;
};

struct hstack {
    uint64_t hash;
    uint32_t refs;   /* guarded by xseg_rt.hist.lock */
    uint32_t n;
    struct hstack *chain;
    uintptr_t f[];   /* C return addresses, or HIST_FRAME_TAG | (struct hframe *) */
};

/* One trace event. For HIST_OOM, addr holds the driver's free bytes (PyTorch does the same). */
struct hist_event {
    uint64_t addr;
    uint64_t size;
    uint64_t stream;
    int64_t time_us;   /* CLOCK_REALTIME, microseconds (PyTorch's time_us) */
    struct hstack *stack;
    int32_t device;
    int32_t action;
};

/* What is recorded: the bits of the mode word (0 = off). */
#define HIST_STATE 1u   /* blocks remember their allocation's stack */
#define HIST_TRACE 2u   /* events go to the ring */

/* The mode word: read without a lock on the slow paths (relaxed); 0 when recording is off. */
static inline unsigned hist_mode(void) { return atomic_load_explicit(&xseg_rt.hist.mode_word, memory_order_relaxed); }

/* Apply options (NULL or enabled == 0: stop). Validates them first; nothing changes on error.
 * Does not touch devices: api/history.c marks live blocks and resets the permits. */
xseg_status hist_configure(const xseg_history_options *opts);

/* Capture the calling thread's stack per the options in force (no device lock held: the user
 * callback may run; a capture from inside the callback, on its thread, calls it no more). Returns
 * a stack holding one reference for the caller, or NULL (no stacks recorded, or out of host
 * memory). */
struct hstack *hist_capture(void);

void hist_stack_ref(struct hstack *s);   /* NULL is a no-op */
void hist_stack_unref(struct hstack *s); /* NULL is a no-op */

/* Append an event (when HIST_TRACE is on); takes its own reference on @p stack. */
void hist_record(int action, int device, uint64_t addr, uint64_t size, uint64_t stream, struct hstack *stack);

/* A recorded allocation (@p mode: hist_mode() read once): its alloc event; with HIST_STATE the
 * caller's reference to *s moves to the block (*s becomes NULL) and the stack is returned for
 * the block to keep, else NULL. One lock round. */
struct hstack *hist_on_malloc(int device, uint64_t addr, uint64_t size, uint64_t stream, struct hstack **s,
                              unsigned mode);
/* A recorded free: free_requested (@p requested) and/or free_completed (@p completed), in one lock
 * round; with @p completed the block's reference to @p s is dropped. */
void hist_on_free(int device, uint64_t addr, uint64_t size, uint64_t stream, struct hstack *s, bool requested,
                  bool completed);

/* A copy of the ring, oldest first, each event's stack referenced (release with hist_events_free).
 * *n receives the count; *dropped the events lost to the ring's bound since recording began. */
xseg_status hist_events_copy(struct hist_event **out, size_t *n, uint64_t *dropped);
void hist_events_free(struct hist_event *ev, size_t n);

/* Drop every event and every interned frame no stack still needs (xseg_record_memory_history with
 * clear); the table of stacks held by blocks stays. */
void hist_clear_events(void);
/* Stop recording, drop every event and free the ring, and the stack and frame tables once no
 * stack is referenced (xseg_shutdown, after every device is empty), and the calling thread's stack
 * cache (another thread's goes at its exit); options back to defaults. */
void hist_shutdown(void);

/* How many distinct stacks and interned callback frames are stored now (tests, diagnostics). */
void hist_table_counts(size_t *stacks, size_t *frames);

/* Microseconds since the epoch (CLOCK_REALTIME). */
int64_t hist_now_us(void);

/* The name/filename/line of frame @p f (symbolizing C addresses with dladdr; "??" when unknown).
 * @p buf backs the strings of a C frame (symbol+offset); the result points into it or into the
 * interned frame. */
void hist_frame_info(uintptr_t f, char *buf, size_t size, const char **filename, const char **name, int *line);

#endif
