/*
 * The pinned host caching allocator (xseg_host_malloc & co., and the backups of sleeping pools):
 * pinned segments from the driver (cuMemHostAlloc, or host pages pinned with cuMemHostRegister
 * under pinned_use_cuda_host_register), carved into blocks that are split and merged like device
 * blocks, sizes rounded to 512 B rather than to powers of two. A freed block that streams used
 * (hostalloc_record_stream) returns to the cache only once an event recorded on each of them at
 * the free has completed (queried, never waited for).
 *
 * State: process-wide, owned here, under its own mutex (fork rank FORK_RANK_HOSTALLOC: callers
 * may hold a device lock). Driver calls run with the context the caller names current (pinned
 * memory is PORTABLE: any context may free it), events with their stream's context.
 */
#ifndef XSEG_CORE_HOSTALLOC_H
#define XSEG_CORE_HOSTALLOC_H

#include <cuda.h>
#include <stdbool.h>

#include "base/common.h"

/* A block of at least @p size bytes (> 0) into *out; a cached block when one fits, else a new
 * pinned segment with @p ctx current. OUT_OF_MEMORY (host or pinned) naming the size. */
xseg_status hostalloc_malloc(CUcontext ctx, size_t size, void **out);
/* The program's malloc (xseg_host_malloc): with debug_stale_access and history on, the block
 * keeps its allocation's stack for a report (taken with no lock held). */
xseg_status hostalloc_malloc_user(CUcontext ctx, size_t size, void **out);

/* Free @p p (a block of hostalloc_malloc; NULL: nothing). INVALID_VALUE naming it when it is not
 * one. With @p release, a segment left wholly free goes back to the driver at once (a backup the
 * configuration does not keep), else it stays cached. */
xseg_status hostalloc_free(void *p, bool release);

/* The program's free (xseg_host_free): hostalloc_free(p, false), but with debug_stale_access on
 * the block is quarantined (core/services/hostquar.h) once its recorded streams are done, with
 * the free's stack (history). Findings are delivered before it returns, with no lock held. */
xseg_status hostalloc_free_user(void *p);

/* debug_stale_access: check every quarantined host block (occasion @p when: "snapshot",
 * "xseg_check_stale", "xseg_shutdown") after the frees whose streams are done entered, the
 * findings delivered (no lock held); with @p drain or the mode off they all go back to the cache.
 * Host reads only: no driver call, also during a capture. *@p found (optional): findings made. */
xseg_status hostalloc_check_stale(const char *when, bool drain, size_t *found);

/* @p stream (of context @p ctx) uses block @p p: its free waits for the stream's work. */
xseg_status hostalloc_record_stream(void *p, CUcontext ctx, CUstream stream);

/* Give every wholly free cached segment back to the driver (after returning the blocks whose
 * events completed, and checking the host quarantine: drained when debug_stale_access is off);
 * the first driver failure is reported, the rest is still released. */
xseg_status hostalloc_empty_cache(void);

/* Statistics under PyTorch's host keys (torch.cuda.host_memory_stats()). */
xseg_status hostalloc_stat(const char *key, int64_t *value);
const char *hostalloc_stat_key(size_t index);
/* Reset every peak to its current value, and the durations' max and min to 0 (as PyTorch). */
void hostalloc_reset_peaks(void);
/* Zero the accumulated figures: each counter's allocated and freed, the durations' total and
 * count, and the driver call counts (PyTorch's reset_accumulated_host_memory_stats). */
void hostalloc_reset_accumulated(void);

/* Start or stop the event thread as pinned_use_background_threads says (called by the public
 * entry points, holding no lock). */
void hostalloc_sync_thread(void);

/* xseg_shutdown's part: the event thread stopped, the pending frees' events waited for, every
 * wholly free segment and spare event given back (hostalloc_empty_cache's errors). With no block
 * left, the cache's arrays are freed and its statistics start again; live blocks keep it as it
 * is (they stay the program's: xseg_host_free them, then xseg_host_empty_cache). */
xseg_status hostalloc_shutdown(void);

#endif
