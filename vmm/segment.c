/*
 * Expandable segments: VA reservations laid end to end, chunks of physical memory (one
 * cuMemCreate handle each, any granule multiple) mapped on demand.
 *
 * Reservation policy (see vmm/README.md for the reasoning): a segment starts with
 * max(min_size, SEG_INITIAL_PAGES pages) of VA and grows by reserving the next piece directly
 * after its current end, each piece at least as large as everything reserved so far (capped at
 * SEG_GROW_STEP_MAX bytes), so a segment of extent E holds at most about 2E of VA in
 * O(log E) pieces. PyTorch instead reserves 1 1/8 x device memory per segment up front, which
 * runs a process with many streams or pools out of the 128 TiB address space.
 *
 * Every entry point that calls the driver first makes the device's primary context current on
 * the calling thread (drv_ctx_ensure): the real driver resolves cuMemMap, cuMemSetAccess and the
 * stream synchronize against the current context, and the allocator may run on any thread with
 * any device current (pytorch #196258 synchronized the wrong device's stream that way). The
 * segment retains the primary context for its lifetime.
 */
#include "vmm/segment.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/fork.h"
#include "base/hostmem.h"
#include "base/vec.h"
#include "base/witness.h"
#include "vmm/driver.h"
#include "vmm/host.h"
#include "vmm/stream.h"

/* One cuMemAddressReserve range. Pieces are page multiples and sorted by address, each starting
 * where the previous one ends, so a chunk never straddles two pieces. */
struct seg_piece {
    CUdeviceptr base;
    size_t size;
    size_t first_gran; /* index of the piece's first granule within the segment */
};

struct seg {
    size_t unit; /* every piece is a multiple of this: lcm(page_size, SEG_VA_ALIGN) */
    int device;
    CUdevice cudev;
    CUcontext ctx; /* retained primary context of cudev, released in seg_destroy */
    CUstream stream;
    size_t page_size;
    size_t gran;              /* the device's VMM granularity: chunks are multiples of it */
    CUmemAllocationProp prop; /* cuMemCreate properties, fixed at creation */

    CUdeviceptr base;
    size_t va_size; /* sum of the pieces' sizes */
    size_t ngran;   /* va_size / gran */

    /* Per granule, [ngran] valid of [cap_gran] allocated. handles[g] == 0: granule g unmapped;
     * else the handle of the chunk mapped over it, whose first granule is cstart[g] and whose
     * granule count is clen[cstart[g]]. gflags[g] is the same on every granule of a chunk:
     * GRAN_FRESH is scratch for seg_map's rollback (set while the running call mapped the chunk);
     * GRAN_STRANDED marks a chunk whose rollback unmap failed: the driver still maps it, perhaps
     * without access, so it counts as unmapped to callers (not in mapped_bytes,
     * seg_gran_is_mapped is 0) until seg_reclaim unmaps it or seg_map uses it again. */
    CUmemGenericAllocationHandle *handles;
    size_t *cstart;
    size_t *clen;
    unsigned char *gflags;
    size_t cap_gran;
    size_t mapped_bytes;
    size_t stranded_bytes;
    size_t asleep_bytes; /* chunks given back by a sleep (GRAN_ASLEEP), mapped again by a wake */
    size_t host_bytes;   /* chunks backed by host memory (GRAN_HOST): mapped, not in mapped_bytes */
    size_t canary_bytes; /* granules of canary spans (GRAN_CANARY): live, not in mapped_bytes */

    struct seg_piece *pieces;
    size_t npieces, cap_pieces;

    /* The observer of map/unmap (seg_params.observe), or NULL. */
    void (*observe)(void *user, struct seg *seg, size_t first, size_t last, int mapped);
    void *observe_user;

    /* access[0] is the owning device, access[1..naccess) the peers; all READWRITE. */
    CUmemAccessDesc *access;
    size_t naccess, cap_access;
};

#define GRAN_FRESH 1
#define GRAN_STRANDED 2
/* Services (sleep/wake): GRAN_ASLEEP marks the granules of a chunk that was mapped when its
 * segment went to sleep and is unmapped now; cstart/clen still describe the chunk, and its handle
 * is still held (handles[] != 0) between seg_sleep_unmap and seg_sleep_commit, or after a sleep
 * whose rollback could not map it back, else released (handles[] == 0). A wake maps every asleep
 * chunk again, same place, same size. GRAN_WAS_HELD is a wake's scratch: the chunk was mapped
 * with its held handle (a rollback keeps that handle). */
#define GRAN_ASLEEP 4
#define GRAN_WAS_HELD 8
/* debug_stale_access (seg_canary_swap): a granule of a canary span. The chunk that lay there was
 * unmapped and its handle given back; handles[g] is the span's canary page (mapped here unless
 * GRAN_BARE), cstart[g] == g and clen[g] == 1. Live (gran_live: the quarantined block above still
 * covers it) but counted in canary_bytes, not mapped_bytes; every other path leaves it alone
 * (gran_real) until seg_canary_release unmaps it. */
#define GRAN_CANARY 16
/* Spill (seg_move_chunk): the chunk's handle is host-located memory mapped at its place with the
 * device's access. It is live (gran_live) but counts in host_bytes, not mapped_bytes; the generic
 * unmap paths leave it alone (only seg_drop_host and seg_move_chunk take it away). */
#define GRAN_HOST 32
/* A canary span's granule that maps nothing (the canary could not be mapped there, or it was
 * unmapped already by a seg_canary_release that failed further on). */
#define GRAN_BARE 64
/* A stranded host chunk set aside by seg_drop_host's strand (a spilled block freed during a
 * capture): the work its block's streams queued before was not waited for (nothing may be then),
 * so unlike other stranded chunks it may still be read. Its first unmap waits (chunk_unmap). */
#define GRAN_UNWAITED 128

/* ---- small helpers ---- */

/* Granule @p g is mapped as far as callers know: a chunk, neither stranded nor asleep. */
static inline int gran_live(const struct seg *seg, size_t g)
{
    return seg->handles[g] != 0 && !(seg->gflags[g] & (GRAN_STRANDED | GRAN_ASLEEP));
}

/* Granule @p g is a chunk of the segment's own memory: live and not a canary span's. */
static inline int gran_real(const struct seg *seg, size_t g)
{
    return gran_live(seg, g) && !(seg->gflags[g] & GRAN_CANARY);
}

/* First granule after the chunk holding granule @p g (mapped or stranded); g + 1 when unmapped. */
static inline size_t chunk_end(const struct seg *seg, size_t g)
{
    return seg->handles[g] ? seg->cstart[g] + seg->clen[seg->cstart[g]] : g + 1;
}

/* First granule of the chunk holding @p g; g itself when unmapped. */
static inline size_t chunk_first(const struct seg *seg, size_t g)
{
    return seg->handles[g] ? seg->cstart[g] : g;
}

static inline CUdeviceptr gran_addr(const struct seg *seg, size_t g) { return seg->base + g * seg->gran; }

/* Set @p flags on every granule of the chunk starting at @p first (or clear them with @p on 0). */
static void chunk_flags(struct seg *seg, size_t first, unsigned char flags, int on)
{
    size_t end = first + seg->clen[first];
    for (size_t g = first; g < end; g++)
        seg->gflags[g] = on ? (unsigned char)(seg->gflags[g] | flags) : (unsigned char)(seg->gflags[g] & ~flags);
}

/* Call @p fn for every run of mapped chunks, one piece at a time. */
static void seg_runs(const struct seg *seg, void (*fn)(void *, struct seg *, size_t, size_t, int), void *user,
                     int mapped);

static CUmemAccessDesc seg_access_desc(int device)
{
    CUmemAccessDesc d;
    memset(&d, 0, sizeof(d));
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = device;
    d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return d;
}

/* Round @p n up to a multiple of @p unit (not necessarily a power of two: 20 MiB pages).
 * @return 0 on overflow. */
static int seg_round_up(size_t n, size_t unit, size_t *out)
{
    size_t q = n / unit + (n % unit != 0);
    if (q > SIZE_MAX / unit)
        return 0;
    *out = q * unit;
    return 1;
}

static size_t seg_gcd(size_t a, size_t b)
{
    while (b) {
        size_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static xseg_status seg_failf(CUresult res, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* drv_fail with a formatted description of the call. */
static xseg_status seg_failf(CUresult res, const char *fmt, ...)
{
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    return drv_fail(res, what);
}

static int seg_has_access(const struct seg *seg, int device)
{
    for (size_t i = 0; i < seg->naccess; i++)
        if (seg->access[i].location.id == device)
            return 1;
    return 0;
}

static xseg_status seg_push_access(struct seg *seg, int device)
{
    if (!VEC_RESERVE(seg->access, seg->cap_access, seg->naccess + 1))
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "segment: out of host memory for the peer list");
    seg->access[seg->naccess++] = seg_access_desc(device);
    return XSEG_SUCCESS;
}

/* Make room for @p ngran granule entries and one more piece, before any driver work, so that a
 * host allocation failure never has to undo a reservation. New entries are zero (unmapped). */
static xseg_status seg_reserve_meta(struct seg *seg, size_t ngran)
{
    if (ngran > seg->cap_gran) {
        size_t cap = seg->cap_gran, old = seg->cap_gran;
        /* Four arrays share one capacity: reserve each, then commit the capacity once. */
        size_t c1 = cap, c2 = cap, c3 = cap, c4 = cap;
        if (!VEC_RESERVE(seg->handles, c1, ngran) || !VEC_RESERVE(seg->cstart, c2, ngran) ||
            !VEC_RESERVE(seg->clen, c3, ngran) || !VEC_RESERVE(seg->gflags, c4, ngran))
            return err_set(XSEG_ERROR_OUT_OF_MEMORY, "segment: out of host memory for %zu granules", ngran);
        cap = XSEG_MIN(XSEG_MIN(c1, c2), XSEG_MIN(c3, c4));
        memset(seg->handles + old, 0, (cap - old) * sizeof *seg->handles);
        memset(seg->cstart + old, 0, (cap - old) * sizeof *seg->cstart);
        memset(seg->clen + old, 0, (cap - old) * sizeof *seg->clen);
        memset(seg->gflags + old, 0, cap - old);
        seg->cap_gran = cap;
    }
    if (!VEC_RESERVE(seg->pieces, seg->cap_pieces, seg->npieces + 1))
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "segment: out of host memory for the piece list");
    return XSEG_SUCCESS;
}

static void seg_add_piece(struct seg *seg, CUdeviceptr base, size_t size)
{
    struct seg_piece *p = &seg->pieces[seg->npieces++];
    p->base = base;
    p->size = size;
    p->first_gran = seg->ngran;
    seg->va_size += size;
    seg->ngran = seg->va_size / seg->gran;
}

/* Index of the piece holding granule @p g (< ngran). Pieces are few (logarithmic). */
static size_t seg_piece_of(const struct seg *seg, size_t g)
{
    size_t i = seg->npieces - 1;
    while (seg->pieces[i].first_gran > g)
        i--;
    return i;
}

/* First granule after the piece holding granule @p g. */
static size_t seg_piece_end_of(const struct seg *seg, size_t g)
{
    const struct seg_piece *p = &seg->pieces[seg_piece_of(seg, g)];
    return p->first_gran + p->size / seg->gran;
}

/* The next run [*run, *g) of mapped granules inside one piece, from *g on (with @p real, only the
 * segment's own chunks: no canary span; else a canary span's granules that map it too); false
 * when none is left. */
static bool next_live_run_of(const struct seg *seg, size_t *g, size_t *run, bool real)
{
#define RUN_GRAN(g) (real ? gran_real(seg, g) : gran_live(seg, g) && !(seg->gflags[g] & GRAN_BARE))
    while (*g < seg->ngran && !RUN_GRAN(*g))
        (*g)++;
    if (*g >= seg->ngran)
        return false;
    size_t end = seg_piece_end_of(seg, *g);
    *run = *g;
    while (*g < end && RUN_GRAN(*g))
        (*g)++;
#undef RUN_GRAN
    return true;
}
static bool next_live_run(const struct seg *seg, size_t *g, size_t *run)
{
    return next_live_run_of(seg, g, run, false);
}

/* Check that [offset, offset + size) is a granule-multiple range inside the VA; on success writes
 * the granule range [*first, *last). */
static xseg_status seg_check_range(const struct seg *seg, const char *fn, size_t offset, size_t size,
                                   size_t *first, size_t *last)
{
    *first = *last = 0; /* an empty range on an error: written on every path */
    if (offset % seg->gran || size % seg->gran)
        return err_set(XSEG_ERROR_INVALID_VALUE,
                       "%s: offset %zu and size %zu must be multiples of the granularity %zu", fn, offset, size,
                       seg->gran);
    if (offset > seg->va_size || size > seg->va_size - offset)
        return err_set(XSEG_ERROR_INVALID_VALUE,
                       "%s: range [%zu, +%zu) lies outside the segment's %zu bytes of VA", fn, offset, size,
                       seg->va_size);
    *first = offset / seg->gran;
    *last = *first + size / seg->gran;
    return XSEG_SUCCESS;
}

/* ---- leftovers: driver resources a failed call could not give back ----
 *
 * A handle whose cuMemRelease failed, a page of a destroyed segment whose cuMemUnmap failed, a
 * reservation whose cuMemAddressFree failed: forgetting them would leak device memory (or address
 * space) for good, so they are kept here, process-wide (segments of every device share one
 * address space), and retried by seg_leftovers_retry, which the allocator runs on every reclaim
 * (empty_cache and the OOM path). Order of a retry: unmaps, then releases, then address frees (a
 * range cannot be freed while mapped). */
enum leftover_kind { LEFT_UNMAP, LEFT_RELEASE, LEFT_ADDRESS_FREE };
struct leftover {
    enum leftover_kind kind;
    CUdevice dev;                        /* its primary context is made current for the retry */
    CUdeviceptr addr;                    /* LEFT_UNMAP, LEFT_ADDRESS_FREE */
    size_t size;                         /* LEFT_UNMAP (then released), LEFT_ADDRESS_FREE */
    CUmemGenericAllocationHandle handle; /* LEFT_UNMAP, LEFT_RELEASE */
};
/* This file's process state: the leftovers kept for a retry, and the placement cursor below. */
static struct seg_proc {
    pthread_mutex_t left_lock;
    struct leftover *left;
    size_t nleft, capleft;
    pthread_mutex_t cursor_lock;
    CUdeviceptr cursor;
    int cursor_off; /* set once the driver placed a hinted range elsewhere */
} seg_proc = {.left_lock = PTHREAD_MUTEX_INITIALIZER, .cursor_lock = PTHREAD_MUTEX_INITIALIZER};
FORK_MUTEX_AT(FORK_RANK_VMM_LEFT, left_lock, seg_proc.left_lock)
FORK_MUTEX_AT(FORK_RANK_VMM_CURSOR, seg_cursor_lock, seg_proc.cursor_lock)

/* Keep @p l for a retry. Only a host allocation failure loses it (the leak it was before). */
static void left_push(struct leftover l)
{
    mutex_lock(&seg_proc.left_lock);
    if (!VEC_RESERVE(seg_proc.left, seg_proc.capleft, seg_proc.nleft + 1)) {
        mutex_unlock(&seg_proc.left_lock);
        return;
    }
    seg_proc.left[seg_proc.nleft++] = l;
    mutex_unlock(&seg_proc.left_lock);
}

size_t seg_leftovers_pending(void)
{
    mutex_lock(&seg_proc.left_lock);
    size_t n = seg_proc.nleft;
    mutex_unlock(&seg_proc.left_lock);
    return n + vhost_pending();
}

/* One driver call for @p l, with its device's primary context current (retained around the call:
 * the segment that held it may be gone; the allocator keeps it retained, so this is cheap).
 * A LEFT_UNMAP that succeeds becomes a LEFT_RELEASE. @return the call's result. */
static CUresult left_try(struct leftover *l, const char **what)
{
    CUcontext ctx = NULL;
    CUresult res = drv->cuDevicePrimaryCtxRetain(&ctx, l->dev);
    if (res != CUDA_SUCCESS) {
        *what = "cuDevicePrimaryCtxRetain";
        return res;
    }
    if (drv_ctx_ensure(ctx) != XSEG_SUCCESS) {
        *what = "making the primary context current";
        res = CUDA_ERROR_INVALID_CONTEXT;
    } else if (l->kind == LEFT_UNMAP) {
        *what = "cuMemUnmap";
        res = drv->cuMemUnmap(l->addr, l->size);
        if (res == CUDA_SUCCESS && l->handle) /* handle 0: a scratch range of seg_refine */
            l->kind = LEFT_RELEASE;
    } else if (l->kind == LEFT_RELEASE) {
        *what = "cuMemRelease";
        res = drv->cuMemRelease(l->handle);
    } else {
        *what = "cuMemAddressFree";
        res = drv->cuMemAddressFree(l->addr, l->size);
    }
    (void)drv->cuDevicePrimaryCtxRelease(l->dev);
    return res;
}

xseg_status seg_leftovers_retry(void)
{
    /* Pinned host buffers of sleep and wake whose free failed (vmm/host.c) go with the rest. */
    xseg_status host_st = drv && vhost_pending() ? vhost_retry() : XSEG_SUCCESS;
    mutex_lock(&seg_proc.left_lock);
    if (seg_proc.nleft == 0 || !drv) {
        mutex_unlock(&seg_proc.left_lock);
        return host_st;
    }
    xseg_status first = host_st;
    /* Unmaps first (their handles then get released in the next pass), address frees last. */
    for (int pass = LEFT_UNMAP; pass <= LEFT_ADDRESS_FREE; pass++) {
        size_t keep = 0;
        for (size_t i = 0; i < seg_proc.nleft; i++) {
            struct leftover l = seg_proc.left[i];
            if ((int)l.kind == pass) {
                const char *what = "";
                CUresult res = left_try(&l, &what);
                if (res == CUDA_SUCCESS && l.kind == (enum leftover_kind)pass)
                    continue; /* released or freed: done */
                if (res != CUDA_SUCCESS && first == XSEG_SUCCESS)
                    first = seg_failf(res, "%s of 0x%llx (%zu bytes), kept from an earlier failure", what,
                                      (unsigned long long)l.addr, l.size);
            }
            seg_proc.left[keep++] = l;
        }
        seg_proc.nleft = keep;
    }
    if (!seg_proc.nleft) { /* all retried: the list goes too (xseg_shutdown leaves nothing) */
        xs_free(seg_proc.left);
        seg_proc.left = NULL;
        seg_proc.capleft = 0;
    }
    mutex_unlock(&seg_proc.left_lock);
    return first;
}

/* Release handle @p h of a page already unmapped; on failure it is kept for a retry. */

/* Release handle @p h of a chunk already unmapped; on failure it is kept for a retry. */
static void seg_release_handle(struct seg *seg, CUmemGenericAllocationHandle h)
{
    if (drv->cuMemRelease(h) != CUDA_SUCCESS)
        left_push((struct leftover){.kind = LEFT_RELEASE, .dev = seg->cudev, .handle = h});
}

/* Forget the chunk starting at granule @p first after the driver unmapped it, and release its
 * handle (a failed release is kept for a retry: the chunk is unmapped all the same). */
static void chunk_forget_keep(struct seg *seg, size_t first, struct seg_spares *keep);
static void chunk_forget(struct seg *seg, size_t first) { chunk_forget_keep(seg, first, NULL); }

/* chunk_forget; with @p keep, the handle is listed there instead of released (released when the
 * list has no room). */
static void chunk_forget_keep(struct seg *seg, size_t first, struct seg_spares *keep)
{
    size_t n = seg->clen[first];
    size_t bytes = n * seg->gran;
    CUmemGenericAllocationHandle h = seg->handles[first];
    if (seg->gflags[first] & GRAN_STRANDED)
        seg->stranded_bytes -= bytes;
    else if (seg->gflags[first] & GRAN_HOST)
        seg->host_bytes -= bytes;
    else
        seg->mapped_bytes -= bytes;
    if (seg->gflags[first] & GRAN_HOST)
        keep = NULL; /* host memory is never a device chunk's spare */
    for (size_t g = first; g < first + n; g++) {
        seg->handles[g] = 0;
        seg->gflags[g] = 0;
        seg->cstart[g] = 0;
    }
    seg->clen[first] = 0;
    if (keep && VEC_RESERVE(keep->v, keep->cap, keep->n + 1)) {
        keep->v[keep->n++] = (struct seg_spare){h, bytes, seg->cudev, (unsigned)seg->prop.requestedHandleTypes,
                                                seg->prop.allocFlags.gpuDirectRDMACapable};
        return;
    }
    seg_release_handle(seg, h);
}

void seg_spares_drain(struct seg_spares *sp)
{
    if (!sp)
        return;
    for (size_t i = 0; i < sp->n; i++)
        if (drv->cuMemRelease(sp->v[i].handle) != CUDA_SUCCESS)
            left_push((struct leftover){.kind = LEFT_RELEASE, .dev = sp->v[i].dev, .handle = sp->v[i].handle});
    xs_free(sp->v);
    sp->v = NULL;
    sp->n = sp->cap = 0;
}

/* Take a kept handle of @p bytes that @p seg would create itself; 0 when there is none. */
static CUmemGenericAllocationHandle spare_take(struct seg *seg, struct seg_spares *sp, size_t bytes)
{
    if (!sp)
        return 0;
    for (size_t i = sp->n; i-- > 0;) {
        struct seg_spare *k = &sp->v[i];
        if (k->bytes == bytes && k->dev == seg->cudev &&
            k->handle_types == (unsigned)seg->prop.requestedHandleTypes &&
            k->rdma == seg->prop.allocFlags.gpuDirectRDMACapable) {
            CUmemGenericAllocationHandle h = k->handle;
            *k = sp->v[--sp->n];
            return h;
        }
    }
    return 0;
}

/* Unmap and release the chunk starting at granule @p first (mapped, or stranded). On a failed
 * unmap the chunk stays as it was (mapped and counted, or stranded). */
static xseg_status chunk_unmap(struct seg *seg, size_t first)
{
    size_t bytes = seg->clen[first] * seg->gran;
    CUdeviceptr addr = gran_addr(seg, first);
    CUresult res;
    if (seg->gflags[first] & GRAN_UNWAITED) {
        /* Its streams are not known here: the context, once for every such chunk of the segment
         * (the callers unmap none during a capture, where this would be refused). */
        if ((res = drv->cuCtxSynchronize()) != CUDA_SUCCESS)
            return seg_failf(res, "cuCtxSynchronize before unmapping host memory a spilled block freed during a "
                                  "capture left (at 0x%llx)", (unsigned long long)addr);
        for (size_t g = 0; g < seg->ngran; g++)
            seg->gflags[g] &= (unsigned char)~GRAN_UNWAITED;
    }
    res = drv->cuMemUnmap(addr, bytes);
    if (res != CUDA_SUCCESS)
        return seg_failf(res, "cuMemUnmap(0x%llx, %zu) of a chunk", (unsigned long long)addr, bytes);
    chunk_forget(seg, first);
    return XSEG_SUCCESS;
}

/* Unmap granules [first, last), whole chunks of one piece, in one call (the driver unmaps
 * adjacent whole mappings together: a conformance row), told to the observer before, so that a
 * registration can be dropped while the memory is still there, and again as mapped when the unmap
 * fails (nothing of it was unmapped). */
static CUresult seg_unmap_run(struct seg *seg, size_t first, size_t last)
{
    if (seg->observe)
        seg->observe(seg->observe_user, seg, first, last, 0);
    CUresult res = drv->cuMemUnmap(gran_addr(seg, first), (last - first) * seg->gran);
    if (res != CUDA_SUCCESS && seg->observe)
        seg->observe(seg->observe_user, seg, first, last, 1);
    return res;
}

/* Wait for the work queued on the segment's stream before its pages are unmapped. A destroyed
 * stream falls back to a context synchronize (vstream_wait): otherwise memory cached for a
 * destroyed stream could never be released. */
static xseg_status seg_sync(struct seg *seg, const char *why)
{
    char what[128];
    snprintf(what, sizeof what, "%s of the segment at 0x%llx", why, (unsigned long long)seg->base);
    return vstream_wait(seg->stream, what);
}

/* ---- create / destroy ---- */

/* Where the next segment should start, so that every segment has SEG_GROW_ROOM of unreserved
 * address space after it to grow into in place. Process-wide (segments of all devices share one
 * address space); 0 until the first segment is placed.
 *
 * Why a cursor and not only a probe: drivers place reservations differently. The H100's driver
 * (13.0) hands out rising addresses, so the hole right after a segment is exactly where the next
 * segment would land, and a probe for a large hole finds that same hole; cudaemu (the kernel's
 * mmap) hands out falling addresses. A hint past the previous segment's room works for both: the
 * driver honours a free, aligned hint and otherwise places the range where it likes. */
/* (seg_proc.cursor, under seg_proc.cursor_lock.) */

/* Find a hole of @p size + SEG_GROW_ROOM bytes, give it back, and return its start (0 if none):
 * reserving at its start leaves the rest free to grow into, on a driver that fills the highest
 * hole first (cudaemu). A failure here only means no room is sought. The probe asks for
 * SEG_VA_ALIGN alignment so that the room a segment gets (up to the cursor, which is aligned)
 * does not depend on where the driver happened to place it: otherwise it varies by up to 32 MiB
 * from run to run (address-space randomization), and so does the moment a segment runs out of
 * room and a new one starts, which changed replay figures between identical runs. */
static CUdeviceptr seg_probe_room(CUdevice dev, size_t size)
{
    CUdeviceptr probe = 0;
    if (size > SIZE_MAX - SEG_GROW_ROOM ||
        drv->cuMemAddressReserve(&probe, size + SEG_GROW_ROOM, SEG_VA_ALIGN, 0, 0) != CUDA_SUCCESS)
        return 0;
    if (drv->cuMemAddressFree(probe, size + SEG_GROW_ROOM) != CUDA_SUCCESS) {
        /* Keep the probe's slot out of the hint; the probe is freed by a later retry. */
        left_push((struct leftover){.kind = LEFT_ADDRESS_FREE, .dev = dev, .addr = probe,
                                    .size = size + SEG_GROW_ROOM});
        return 0;
    }
    return probe;
}

/* Reserve @p size bytes where a segment can later grow in place, and move the cursor past the
 * room. Any placement is acceptable: without room the segment just grows into a further one. */
static CUresult seg_reserve_with_room(CUdevice dev, size_t size, CUdeviceptr *out)
{
    mutex_lock(&seg_proc.cursor_lock);
    CUdeviceptr hint = seg_proc.cursor_off ? 0 : seg_proc.cursor;
    mutex_unlock(&seg_proc.cursor_lock);
    CUdeviceptr base = 0;
    CUresult res;
    if (hint) {
        res = drv->cuMemAddressReserve(&base, size, 0, hint, 0);
        if (res != CUDA_SUCCESS)
            return res; /* a hint never makes the call fail: this is a real failure */
        if (base != hint) {
            /* This driver does not place ranges where the cursor points (falling addresses, or
             * the space above is taken): stop using the cursor and probe for room instead. */
            if (drv->cuMemAddressFree(base, size) != CUDA_SUCCESS) {
                *out = base; /* cannot give it back: use it, room or not */
                return CUDA_SUCCESS;
            }
            base = 0;
        }
        if (base == 0) {
            mutex_lock(&seg_proc.cursor_lock);
            seg_proc.cursor_off = 1;
            mutex_unlock(&seg_proc.cursor_lock);
        }
    }
    if (base == 0) {
        res = drv->cuMemAddressReserve(&base, size, 0, seg_probe_room(dev, size), 0);
        if (res != CUDA_SUCCESS)
            return res;
    }
    if (base <= UINT64_MAX - size - SEG_GROW_ROOM - SEG_VA_ALIGN) {
        CUdeviceptr next = (CUdeviceptr)xseg_align_up((size_t)(base + size + SEG_GROW_ROOM), SEG_VA_ALIGN);
        mutex_lock(&seg_proc.cursor_lock);
        if (next > seg_proc.cursor)
            seg_proc.cursor = next;
        mutex_unlock(&seg_proc.cursor_lock);
    }
    *out = base;
    return CUDA_SUCCESS;
}


static void seg_free_meta(struct seg *seg)
{
    xs_free(seg->access);
    xs_free(seg->handles);
    xs_free(seg->cstart);
    xs_free(seg->clen);
    xs_free(seg->gflags);
    xs_free(seg->pieces);
    xs_free(seg);
}

/* Check seg_create's parameters and size its first reservation: @p unit, what every piece is a
 * multiple of (lcm(page_size, SEG_VA_ALIGN)), and @p initial, min_size but at least
 * SEG_INITIAL_PAGES pages, in units. */
static xseg_status seg_create_sizes(const struct seg_params *params, size_t min_size, size_t *unit,
                                    size_t *initial)
{
    if (!drv)
        return err_set(XSEG_ERROR_ILLEGAL_STATE, "seg_create: the driver is not loaded (drv_load)");
    if (params->page_size == 0)
        return err_set(XSEG_ERROR_INVALID_VALUE, "seg_create: page_size must not be 0");
    if (params->npeers < 0 || (params->npeers > 0 && !params->peers))
        return err_set(XSEG_ERROR_INVALID_VALUE, "seg_create: npeers %d with peers %p", params->npeers,
                       (const void *)params->peers);
    if (params->device < 0)
        return err_set(XSEG_ERROR_INVALID_DEVICE, "seg_create: device %d", params->device);
    size_t P = params->page_size;
    size_t u = P / seg_gcd(P, SEG_VA_ALIGN);
    if (u > SIZE_MAX / SEG_VA_ALIGN)
        return err_set(XSEG_ERROR_INVALID_VALUE, "seg_create: page_size %zu is too large", P);
    u *= SEG_VA_ALIGN;
    if (!seg_round_up(XSEG_MAX(min_size, (size_t)1), u, initial))
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "seg_create: min_size %zu overflows when rounded to pages",
                       min_size);
    if (*initial / P < SEG_INITIAL_PAGES && P <= SIZE_MAX / SEG_INITIAL_PAGES &&
        !seg_round_up((size_t)SEG_INITIAL_PAGES * P, u, initial))
        return err_set(XSEG_ERROR_INVALID_VALUE, "seg_create: page_size %zu is too large", P);
    *unit = u;
    return XSEG_SUCCESS;
}

/* The access list of a new segment: its owner first, then each peer of @p params once. */
static xseg_status seg_create_access(struct seg *seg, const struct seg_params *params)
{
    xseg_status st = seg_push_access(seg, params->device);
    for (int i = 0; st == XSEG_SUCCESS && i < params->npeers; i++) {
        int peer = params->peers[i];
        if (peer < 0)
            st = err_set(XSEG_ERROR_INVALID_DEVICE, "seg_create: peer %d (index %d) is not a device", peer, i);
        else if (!seg_has_access(seg, peer))
            st = seg_push_access(seg, peer);
    }
    return st;
}

/* The cuMemCreate properties of a new segment's chunks and the granularity they come in, which
 * the page size must be a multiple of. */
static xseg_status seg_create_props(struct seg *seg, unsigned handle_types, bool require_rdma, bool rdma_off)
{
    seg->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    seg->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    seg->prop.location.id = seg->device;
    seg->prop.requestedHandleTypes = (CUmemAllocationHandleType)handle_types;
    size_t gran = 0;
    xseg_status st = drv_granularity((CUdevice)seg->device, handle_types, &gran);
    if (st != XSEG_SUCCESS)
        return st;
    if (gran == 0 || seg->page_size % gran != 0 || SEG_VA_ALIGN % gran != 0)
        return err_set(XSEG_ERROR_INVALID_VALUE,
                       "seg_create: page_size %zu is not a multiple of device %d's VMM granularity %zu",
                       seg->page_size, seg->device, gran);
    /* Optional: RDMA-capable pages where the device supports it (as PyTorch does), so NICs can
     * register them. A failed query just leaves the flag off; rdma_off leaves it off unasked
     * (every later cuMemCreate of the segment copies seg->prop, so all its chunks agree). */
    int rdma = 0;
    if (!rdma_off &&
        drv->cuDeviceGetAttribute(&rdma, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
                                  seg->cudev) == CUDA_SUCCESS &&
        rdma)
        seg->prop.allocFlags.gpuDirectRDMACapable = 1;
    else if (require_rdma)
        return err_set(XSEG_ERROR_NOT_SUPPORTED,
                       "gpu_direct_rdma:True, but device %d does not support GPUDirect RDMA on CUDA VMM memory "
                       "(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED is 0 or unreadable); set "
                       "gpu_direct_rdma:False, or register memory through a bounce buffer", seg->device);
    seg->gran = gran;
    return XSEG_SUCCESS;
}

xseg_status seg_create(const struct seg_params *params, size_t min_size, struct seg **out)
{
    if (!params || !out)
        return err_set(XSEG_ERROR_INVALID_VALUE, "seg_create: params and out must not be NULL");
    *out = NULL;
    size_t unit = 0, initial = 0;
    xseg_status st = seg_create_sizes(params, min_size, &unit, &initial);
    if (st != XSEG_SUCCESS)
        return st;
    struct seg *seg = xs_calloc(1, sizeof(*seg));
    if (!seg)
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "seg_create: out of host memory");
    seg->device = params->device;
    seg->cudev = params->cudev;
    seg->stream = params->stream;
    seg->page_size = params->page_size;
    seg->unit = unit;
    seg->observe = params->observe;
    seg->observe_user = params->observe_user;
    if ((st = seg_create_access(seg, params)) != XSEG_SUCCESS)
        goto fail_meta;

    CUresult res = drv->cuDevicePrimaryCtxRetain(&seg->ctx, seg->cudev);
    if (res != CUDA_SUCCESS) {
        st = seg_failf(res, "cuDevicePrimaryCtxRetain(device %d)", seg->device);
        goto fail_meta;
    }
    if ((st = drv_ctx_ensure(seg->ctx)) != XSEG_SUCCESS ||
        (st = seg_create_props(seg, params->handle_types, params->require_rdma, params->rdma_off)) != XSEG_SUCCESS ||
        (st = seg_reserve_meta(seg, initial / seg->gran)) != XSEG_SUCCESS)
        goto fail_ctx;
    CUdeviceptr base = 0;
    res = seg_reserve_with_room(seg->cudev, initial, &base);
    if (res != CUDA_SUCCESS) {
        st = seg_failf(res, "cuMemAddressReserve(%zu bytes) for a segment on device %d", initial, seg->device);
        drv_note_va_oom(res); /* the OOM message names the address space, not device memory */
        goto fail_ctx;
    }
    seg->base = base;
    seg_add_piece(seg, base, initial);
    *out = seg;
    return XSEG_SUCCESS;

fail_ctx:
    drv->cuDevicePrimaryCtxRelease(seg->cudev);
fail_meta:
    seg_free_meta(seg);
    return st;
}

xseg_status seg_destroy(struct seg *seg)
{
    if (!seg)
        return XSEG_SUCCESS;
    xseg_status first = drv_ctx_ensure(seg->ctx);
    if (seg->mapped_bytes || seg->canary_bytes) {
        xseg_status st = seg_sync(seg, "before destroying the chunks");
        if (st != XSEG_SUCCESS && first == XSEG_SUCCESS)
            first = st;
    }
    /* Keep going past failures: the segment is gone either way, and every chunk and reservation
     * that can still be given back should be. */
    if (seg->observe)
        seg_runs(seg, seg->observe, seg->observe_user, 0); /* every chunk goes below */
    for (size_t g = 0; g < seg->ngran;) {
        if (!seg->handles[g]) {
            g++;
            continue;
        }
        size_t end = chunk_end(seg, g);
        if (seg->gflags[g] & GRAN_CANARY) { /* a canary's mapping: the canary is its caller's */
            if (!(seg->gflags[g] & GRAN_BARE) && drv->cuMemUnmap(gran_addr(seg, g), seg->gran) != CUDA_SUCCESS)
                left_push((struct leftover){.kind = LEFT_UNMAP, .dev = seg->cudev, .addr = gran_addr(seg, g),
                                            .size = seg->gran});
            seg->handles[g] = 0;
            g = end;
            continue;
        }
        if (seg->gflags[g] & GRAN_ASLEEP) { /* held, not mapped: only the handle goes */
            seg_release_handle(seg, seg->handles[g]);
            for (size_t k = g; k < end; k++)
                seg->handles[k] = 0;
            g = end;
            continue;
        }
        CUdeviceptr addr = gran_addr(seg, g);
        size_t bytes = (end - g) * seg->gran;
        CUmemGenericAllocationHandle h = seg->handles[g];
        xseg_status st = chunk_unmap(seg, g);
        if (st != XSEG_SUCCESS) {
            if (first == XSEG_SUCCESS)
                first = st;
            left_push((struct leftover){.kind = LEFT_UNMAP, .dev = seg->cudev, .addr = addr, .size = bytes,
                                        .handle = h});
        }
        g = end;
    }
    for (size_t i = 0; i < seg->npieces; i++) {
        CUresult res = drv->cuMemAddressFree(seg->pieces[i].base, seg->pieces[i].size);
        if (res == CUDA_SUCCESS)
            continue;
        if (first == XSEG_SUCCESS)
            first = seg_failf(res, "cuMemAddressFree(0x%llx, %zu)", (unsigned long long)seg->pieces[i].base,
                              seg->pieces[i].size);
        left_push((struct leftover){.kind = LEFT_ADDRESS_FREE, .dev = seg->cudev, .addr = seg->pieces[i].base,
                                    .size = seg->pieces[i].size});
    }
    drv->cuDevicePrimaryCtxRelease(seg->cudev);
    seg_free_meta(seg);
    return first;
}

/* ---- grow ---- */

/* Reserve @p size bytes exactly at @p hint. @return XSEG_SUCCESS, or OUT_OF_MEMORY (the driver
 * refused, or placed the range elsewhere: then it is freed again). */
static xseg_status seg_reserve_at(struct seg *seg, CUdeviceptr hint, size_t size)
{
    CUdeviceptr got = 0;
    CUresult res = drv->cuMemAddressReserve(&got, size, 0, hint, 0);
    if (res != CUDA_SUCCESS)
        return seg_failf(res, "cuMemAddressReserve(%zu bytes at 0x%llx) to grow a segment", size,
                         (unsigned long long)hint);
    if (got != hint) {
        res = drv->cuMemAddressFree(got, size);
        if (res != CUDA_SUCCESS) {
            left_push((struct leftover){.kind = LEFT_ADDRESS_FREE, .dev = seg->cudev, .addr = got, .size = size});
            return seg_failf(res, "cuMemAddressFree(0x%llx, %zu) of a misplaced growth reservation",
                             (unsigned long long)got, size);
        }
        return err_set(XSEG_ERROR_OUT_OF_MEMORY,
                       "seg_grow: the address space after the segment at 0x%llx (0x%llx, %zu bytes) is not "
                       "free; the driver placed the reservation at 0x%llx",
                       (unsigned long long)seg->base, (unsigned long long)hint, size, (unsigned long long)got);
    }
    return XSEG_SUCCESS;
}

xseg_status seg_grow(struct seg *seg, size_t size)
{
    if (!seg)
        return err_set(XSEG_ERROR_INVALID_VALUE, "seg_grow: segment is NULL");
    if (size <= seg->va_size)
        return XSEG_SUCCESS;
    size_t U = seg->unit;
    size_t target;
    if (!seg_round_up(size, U, &target) || target > SIZE_MAX - seg->base)
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "seg_grow: %zu bytes do not fit in the address space", size);
    size_t need = target - seg->va_size; /* a multiple of U: va_size is one too */

    /* Geometric step: at least the VA held so far (capped), so pieces stay logarithmic. */
    size_t step = XSEG_MIN(seg->va_size, (size_t)SEG_GROW_STEP_MAX);
    step = step / U * U;
    size_t want = XSEG_MAX(need, step);
    if (want > SIZE_MAX - seg->base - seg->va_size)
        want = need;

    xseg_status st = seg_reserve_meta(seg, (seg->va_size + want) / seg->gran);
    if (st != XSEG_SUCCESS)
        return st;
    st = drv_ctx_ensure(seg->ctx);
    if (st != XSEG_SUCCESS)
        return st;
    CUdeviceptr hint = seg->base + seg->va_size;
    st = seg_reserve_at(seg, hint, want);
    if (st != XSEG_SUCCESS && want > need) {
        /* The hole after the segment may hold what is needed but not the geometric step. */
        st = seg_reserve_at(seg, hint, need);
        want = need;
    }
    if (st != XSEG_SUCCESS)
        return st;
    seg_add_piece(seg, hint, want);
    return XSEG_SUCCESS;
}


/* ---- map ---- */

/* Grant access[from_access..] to granules [first, last), which lie in one piece. */
static xseg_status seg_set_access(struct seg *seg, size_t first, size_t last, size_t from_access)
{
    CUdeviceptr addr = gran_addr(seg, first);
    size_t len = (last - first) * seg->gran;
    /* One call for the owner and every peer (the descriptor array), not one per device: each
     * cuMemSetAccess costs ~22 us on an H100 (benchmarks/bench_vmm_costs.c,
     * docs/gpu-h100/vmm_costs.txt). */
    if (from_access >= seg->naccess)
        return XSEG_SUCCESS;
    size_t n = seg->naccess - from_access;
    CUresult res = drv->cuMemSetAccess(addr, len, &seg->access[from_access], n);
    if (res != CUDA_SUCCESS)
        return seg_failf(res, "cuMemSetAccess(0x%llx, %zu, %zu device(s) from device %d, READWRITE)",
                         (unsigned long long)addr, len, n, seg->access[from_access].location.id);
    return XSEG_SUCCESS;
}

/* A run of chunks that the running seg_map or wake mapped, granted access in one call when it
 * ends: before a chunk not mapped here, at the walk's end, and at a piece's end (no
 * cuMemSetAccess spans two reservations). */
struct fresh_run {
    size_t start;     /* first granule of the run, SIZE_MAX: none */
    size_t piece_end; /* end of the piece the walk is in */
};

/* End the run at granule @p g: grant access to [start, g). */
static xseg_status fresh_run_end(struct seg *seg, struct fresh_run *r, size_t g)
{
    size_t start = r->start;
    r->start = SIZE_MAX;
    return start == SIZE_MAX ? XSEG_SUCCESS : seg_set_access(seg, start, g, 0);
}

/* The walk is at granule @p g: at a piece's end, end the run and enter the next piece. */
static xseg_status fresh_run_at(struct seg *seg, struct fresh_run *r, size_t g)
{
    if (g != r->piece_end)
        return XSEG_SUCCESS;
    r->piece_end = seg_piece_end_of(seg, g);
    return fresh_run_end(seg, r, g);
}

/* Report the runs of chunks of [first, last) this seg_map mapped (fresh), split at pieces. */
static void seg_observe_fresh(struct seg *seg, size_t first, size_t last)
{
    size_t g = first;
    while (g < last) {
        while (g < last && !(seg->gflags[g] & GRAN_FRESH))
            g++;
        if (g == last)
            break;
        size_t end = XSEG_MIN(last, seg_piece_end_of(seg, g));
        size_t run = g;
        while (g < end && (seg->gflags[g] & GRAN_FRESH))
            g++;
        seg->observe(seg->observe_user, seg, run, g, 1);
    }
}

/* Undo the chunks of [first, last) that the running seg_map mapped. A chunk whose unmap fails is
 * stranded (GRAN_STRANDED): the driver still maps it, perhaps without access rights, so it must
 * never be handed out as mapped; it leaves mapped_bytes (the caller never counted it) and waits
 * for seg_reclaim, or for a later seg_map over it to grant access and use it. */
static void seg_map_rollback(struct seg *seg, size_t first, size_t last)
{
    for (size_t g = first; g < last;) {
        if (!(seg->gflags[g] & GRAN_FRESH)) {
            g++;
            continue;
        }
        size_t c = chunk_first(seg, g), end = chunk_end(seg, g);
        chunk_flags(seg, c, GRAN_FRESH, 0);
        if (chunk_unmap(seg, c) != XSEG_SUCCESS) {
            size_t bytes = (end - c) * seg->gran;
            chunk_flags(seg, c, GRAN_STRANDED, 1);
            seg->mapped_bytes -= bytes;
            seg->stranded_bytes += bytes;
        }
        g = end;
    }
}

/* Create and map one chunk over granules [g, g + n) (all unmapped, inside one piece), with a
 * handle kept in @p spares when one fits (seg_map_from). */
static xseg_status chunk_create(struct seg *seg, size_t g, size_t n, struct seg_spares *spares)
{
    size_t bytes = n * seg->gran;
    CUmemGenericAllocationHandle h = spare_take(seg, spares, bytes);
    if (h) {
        CUdeviceptr addr = gran_addr(seg, g);
        CUresult res = drv->cuMemMap(addr, bytes, 0, h, 0);
        if (res != CUDA_SUCCESS) {
            /* Still the list's (it had room for it a moment ago). */
            spares->v[spares->n++] = (struct seg_spare){h, bytes, seg->cudev,
                                                        (unsigned)seg->prop.requestedHandleTypes,
                                                        seg->prop.allocFlags.gpuDirectRDMACapable};
            return seg_failf(res, "cuMemMap(0x%llx, %zu) of a kept chunk", (unsigned long long)addr, bytes);
        }
        spares->reused++;
        goto mapped;
    }
    CUresult res = drv->cuMemCreate(&h, bytes, &seg->prop, 0);
    if (res == CUDA_ERROR_OUT_OF_MEMORY && spares && spares->n) {
        /* The kept handles hold the memory this size needs: give them back and try again. */
        seg_spares_drain(spares);
        res = drv->cuMemCreate(&h, bytes, &seg->prop, 0);
    }
    if (res != CUDA_SUCCESS)
        return seg_failf(res, "cuMemCreate(%zu bytes) for the segment at 0x%llx on device %d", bytes,
                         (unsigned long long)seg->base, seg->device);
    if (h == 0) {
        /* 0 marks an unmapped granule here; no driver is known to return it. */
        seg_release_handle(seg, h);
        return err_set(XSEG_ERROR_DRIVER, "cuMemCreate returned a null handle");
    }
    CUdeviceptr addr = gran_addr(seg, g);
    res = drv->cuMemMap(addr, bytes, 0, h, 0);
    if (res != CUDA_SUCCESS) {
        seg_release_handle(seg, h);
        return seg_failf(res, "cuMemMap(0x%llx, %zu) of a new chunk", (unsigned long long)addr, bytes);
    }
mapped:
    for (size_t k = g; k < g + n; k++) {
        seg->handles[k] = h;
        seg->cstart[k] = g;
        seg->gflags[k] = GRAN_FRESH;
    }
    seg->clen[g] = n;
    seg->mapped_bytes += bytes;
    return XSEG_SUCCESS;
}

xseg_status seg_map(struct seg *seg, size_t offset, size_t size, size_t max_chunk, size_t cut, size_t *mapped,
                    size_t *chunks)
{
    return seg_map_from(seg, offset, size, max_chunk, cut, NULL, mapped, chunks);
}

/* Release the stranded chunks that cross an edge of granules [first, last): seg_map cannot use
 * them whole (never handed out, so no work uses them: no synchronize). */
static xseg_status seg_unstrand_edges(struct seg *seg, size_t first, size_t last)
{
    size_t edges[2] = {first, last - 1};
    for (int e = 0; e < 2; e++) {
        size_t g = edges[e];
        xseg_status st;
        if (seg->handles[g] && (seg->gflags[g] & GRAN_STRANDED) &&
            (chunk_first(seg, g) < first || chunk_end(seg, g) > last) &&
            (st = chunk_unmap(seg, chunk_first(seg, g))) != XSEG_SUCCESS)
            return st;
    }
    return XSEG_SUCCESS;
}

/* Use again the stranded chunk holding granule @p g, left mapped by an earlier failed rollback:
 * counted mapped and fresh, so that the running seg_map grants it access with its run. */
static void chunk_unstrand(struct seg *seg, size_t g)
{
    size_t c = chunk_first(seg, g), bytes = seg->clen[c] * seg->gran;
    chunk_flags(seg, c, GRAN_STRANDED, 0);
    chunk_flags(seg, c, GRAN_FRESH, 1);
    seg->stranded_bytes -= bytes;
    seg->mapped_bytes += bytes;
}

/* Where seg_map cuts an unmapped run into chunks, in granules: at most max_n a chunk, never
 * across cut_g (SIZE_MAX: none) or a multiple of page_g. */
struct map_cuts {
    size_t max_n, cut_g, page_g;
};

/* seg_map's walk over granules [first, last): a chunk for each unmapped run (to the range's end,
 * the piece's end, the next chunk, a cut, or the next page boundary: a page is a union of chunks,
 * so it can be given back whole), stranded chunks taken back, access granted per run of new
 * chunks and piece. @p nnew counts the new chunks; on failure @p at is the first granule not
 * touched (everything before may hold fresh chunks, the current run included). */
static xseg_status seg_map_walk(struct seg *seg, size_t first, size_t last, const struct map_cuts *cuts,
                                struct seg_spares *spares, size_t *at, size_t *nnew)
{
    xseg_status st = XSEG_SUCCESS;
    struct fresh_run fr = {SIZE_MAX, seg_piece_end_of(seg, first)};
    size_t g = first;
    while (g < last) {
        if ((st = fresh_run_at(seg, &fr, g)) != XSEG_SUCCESS)
            break;
        if (seg->gflags[g] & GRAN_ASLEEP) {
            /* The allocator never maps into a sleeping segment: only a wake does. */
            st = err_set(XSEG_ERROR_ILLEGAL_STATE, "seg_map: granule %zu of the segment at 0x%llx is asleep", g,
                         (unsigned long long)seg->base);
            break;
        }
        size_t n = 0;
        if (seg->handles[g] && !(seg->gflags[g] & GRAN_STRANDED)) {
            /* Mapped already: the run of new chunks before it ends here. */
            if ((st = fresh_run_end(seg, &fr, g)) != XSEG_SUCCESS)
                break;
            g = chunk_end(seg, g);
            continue;
        }
        /* A stranded host chunk (seg_drop_host) is never used again: it goes first. */
        if (seg->handles[g] && (seg->gflags[g] & GRAN_HOST) &&
            (st = chunk_unmap(seg, chunk_first(seg, g))) != XSEG_SUCCESS)
            break;
        if (seg->handles[g]) {
            chunk_unstrand(seg, g);
            n = chunk_end(seg, g) - g;
        } else {
            size_t end = XSEG_MIN(last, fr.piece_end);
            n = 1;
            while (g + n < end && !seg->handles[g + n] && n < cuts->max_n && g + n != cuts->cut_g &&
                   (g + n) % cuts->page_g)
                n++;
            if ((st = chunk_create(seg, g, n, spares)) != XSEG_SUCCESS)
                break;
        }
        (*nnew)++;
        if (fr.start == SIZE_MAX)
            fr.start = g;
        g += n;
    }
    if (st == XSEG_SUCCESS)
        st = fresh_run_end(seg, &fr, last);
    *at = XSEG_MIN(g, last);
    return st;
}

xseg_status seg_map_from(struct seg *seg, size_t offset, size_t size, size_t max_chunk, size_t cut,
                         struct seg_spares *spares, size_t *mapped, size_t *chunks)
{
    if (mapped)
        *mapped = 0;
    if (chunks)
        *chunks = 0;
    if (!seg)
        return err_set(XSEG_ERROR_INVALID_VALUE, "seg_map: segment is NULL");
    size_t first, last;
    xseg_status st = seg_check_range(seg, "seg_map", offset, size, &first, &last);
    if (st != XSEG_SUCCESS || first == last)
        return st;
    if ((st = drv_ctx_ensure(seg->ctx)) != XSEG_SUCCESS || (st = seg_unstrand_edges(seg, first, last)) != XSEG_SUCCESS)
        return st;
    size_t G = seg->gran;
    struct map_cuts cuts = {.max_n = max_chunk ? XSEG_MAX(max_chunk / G, (size_t)1) : SIZE_MAX,
                            .cut_g = cut == SIZE_MAX || cut % G ? SIZE_MAX : cut / G,
                            .page_g = seg->page_size / G};
    size_t before = seg->mapped_bytes, nnew = 0, at;
    if ((st = seg_map_walk(seg, first, last, &cuts, spares, &at, &nnew)) != XSEG_SUCCESS) {
        seg_map_rollback(seg, first, at);
        return st;
    }
    if (seg->observe)
        seg_observe_fresh(seg, first, last);
    for (size_t k = first; k < last; k++)
        seg->gflags[k] &= (unsigned char)~GRAN_FRESH;
    if (mapped)
        *mapped = seg->mapped_bytes - before;
    if (chunks)
        *chunks = nnew;
    return XSEG_SUCCESS;
}

/* ---- unmap ---- */

static xseg_status seg_unmap_impl(struct seg *seg, size_t offset, size_t size, size_t *unmapped, size_t *chunks,
                                  bool sync, struct seg_spares *keep);

xseg_status seg_unmap(struct seg *seg, size_t offset, size_t size, size_t *unmapped, size_t *chunks)
{
    return seg_unmap_impl(seg, offset, size, unmapped, chunks, true, NULL);
}

xseg_status seg_unmap_idle(struct seg *seg, size_t offset, size_t size, size_t *unmapped, size_t *chunks)
{
    return seg_unmap_impl(seg, offset, size, unmapped, chunks, false, NULL);
}

xseg_status seg_unmap_keep(struct seg *seg, size_t offset, size_t size, struct seg_spares *keep, size_t *unmapped,
                           size_t *chunks)
{
    return seg_unmap_impl(seg, offset, size, unmapped, chunks, false, keep);
}

/* The next run [*run, *run_end) of live chunks wholly inside [g, last) and one piece, from g on;
 * @return false when there is none. */
static bool next_inner_run(const struct seg *seg, size_t g, size_t last, size_t first, size_t *run, size_t *run_end)
{
    while (g < last) {
        if (!gran_real(seg, g)) { /* unmapped, or a canary span (seg_canary_release) */
            g = chunk_end(seg, g);
            continue;
        }
        if (chunk_first(seg, g) < first || chunk_end(seg, g) > last || (seg->gflags[g] & GRAN_HOST)) {
            g = chunk_end(seg, g); /* crosses an edge, or host memory (seg_drop_host): stays */
            continue;
        }
        size_t pend = seg_piece_end_of(seg, g), e = g;
        while (e < last && e < pend && gran_real(seg, e) && !(seg->gflags[e] & GRAN_HOST) && chunk_end(seg, e) <= last)
            e = chunk_end(seg, e);
        *run = g;
        *run_end = e;
        return true;
    }
    return false;
}

static xseg_status seg_unmap_impl(struct seg *seg, size_t offset, size_t size, size_t *unmapped, size_t *chunks,
                                  bool sync, struct seg_spares *keep)
{
    if (unmapped)
        *unmapped = 0;
    if (chunks)
        *chunks = 0;
    if (!seg)
        return err_set(XSEG_ERROR_INVALID_VALUE, "seg_unmap: segment is NULL");
    size_t first, last;
    xseg_status st = seg_check_range(seg, "seg_unmap", offset, size, &first, &last);
    if (st != XSEG_SUCCESS)
        return st;
    size_t run, run_end;
    if (!next_inner_run(seg, first, last, first, &run, &run_end))
        return XSEG_SUCCESS; /* nothing to unmap: no need to wait for the stream */
    st = drv_ctx_ensure(seg->ctx);
    if (st != XSEG_SUCCESS)
        return st;
    /* Work queued on the stream may still use this memory, and unmap/release are not known to
     * wait for it in every case (PyTorch synchronizes here for the same reason). */
    if (sync) {
        st = seg_sync(seg, "before unmapping memory");
        if (st != XSEG_SUCCESS)
            return st;
    }
    size_t before = seg->mapped_bytes, ngone = 0;
    do {
        CUresult res = seg_unmap_run(seg, run, run_end);
        if (res != CUDA_SUCCESS) {
            /* Nothing of the run was unmapped: it stays mapped and usable. */
            st = seg_failf(res, "cuMemUnmap(0x%llx, %zu)", (unsigned long long)gran_addr(seg, run),
                           (run_end - run) * seg->gran);
            break;
        }
        for (size_t g = run; g < run_end;) {
            size_t e = chunk_end(seg, g);
            chunk_forget_keep(seg, g, keep);
            ngone++;
            g = e;
        }
    } while (next_inner_run(seg, run_end, last, first, &run, &run_end));
    if (unmapped)
        *unmapped = before - seg->mapped_bytes;
    if (chunks)
        *chunks = ngone;
    if (st != XSEG_SUCCESS)
        return err_prefix(st, "seg_unmap: %zu bytes unmapped before the failure", before - seg->mapped_bytes);
    return XSEG_SUCCESS;
}

/* ---- reclaim ---- */

xseg_status seg_reclaim(struct seg *seg)
{
    if (!seg || !seg->stranded_bytes)
        return XSEG_SUCCESS;
    xseg_status st = drv_ctx_ensure(seg->ctx);
    if (st != XSEG_SUCCESS)
        return st;
    /* No synchronize: a stranded chunk was never handed out, so no work can use it; but one set
     * aside during a capture (GRAN_UNWAITED), which chunk_unmap waits for. */
    for (size_t g = 0; g < seg->ngran && seg->stranded_bytes;) {
        size_t e = chunk_end(seg, g);
        if (seg->handles[g] && (seg->gflags[g] & GRAN_STRANDED)) {
            xseg_status pst = chunk_unmap(seg, g);
            if (pst != XSEG_SUCCESS && st == XSEG_SUCCESS)
                st = pst;
        }
        g = e;
    }
    return st;
}

/* ---- re-backing: a chunk's granules given new memory at the same addresses ---- */

/* How a re-backing carries the chunk's live bytes across the swap. */
enum reback_copy {
    REBACK_NONE,    /* none: the bytes are dead (the canary) */
    REBACK_SCRATCH, /* the new memory staged at a scratch range and the bytes copied there first */
    REBACK_HOST,    /* through a host buffer; the old handle released before the new memory is made */
};

/*
 * One re-backing of the chunk of granules [c, c + n) at addr (reback_swap), written once for
 * refine, spill and the canary. The new memory is np pieces of `piece` granules, placed in order
 * at the granules keep marks (NULL: every one; with keep, piece is 1) and nothing elsewhere:
 * h[j], or h[0] at every piece with `same`; made here from `prop`, or the caller's (h[0..nh)
 * given, prop NULL). The rule that keeps the live bytes: until the caller's commit the old handle
 * holds them, so a failure after the old chunk was unmapped takes the new pieces out and maps the
 * old handle back with every device's access, announced (abort() when that cannot be done: the
 * bytes would be lost); with REBACK_HOST, once the old handle went, a chunk of the old size is
 * made and the bytes restored from buf. Without live bytes (REBACK_NONE) a failed place is left
 * as it is (placed says how far; the caller settles it). The commit (metadata, the old handle,
 * the announcement of the new memory) is the caller's.
 */
struct reback {
    struct seg *seg;
    size_t c, n;
    CUdeviceptr addr;
    CUmemGenericAllocationHandle old;
    enum reback_copy copy;
    CUstream stream; /* REBACK_SCRATCH: the copy's stream (waited for after it) */
    bool ctx_wait;   /* REBACK_SCRATCH: the context synchronized before and after the copy instead */
    char *buf;       /* REBACK_HOST: room for the kept granules */
    const unsigned char *keep;
    size_t piece, np;
    bool same;
    const CUmemAllocationProp *prop;
    CUmemGenericAllocationHandle *h;
    size_t nh;               /* h[0..nh) made (or given) */
    size_t staged, placed;   /* pieces mapped at the scratch range, at their place */
    CUdeviceptr scratch;     /* the staging range, or 0 */
    bool unmapped;           /* the old chunk is unmapped (on success: stays so) */
    const char *what;        /* the step that failed, for the message */
};

/* The next run [*i, *e) of kept granules of the n from *i on (keep NULL: all); false when none is left. */
static bool keep_run(const unsigned char *keep, size_t n, size_t *i, size_t *e)
{
    while (*i < n && keep && !keep[*i])
        (*i)++;
    if (*i >= n)
        return false;
    *e = *i;
    while (*e < n && (!keep || keep[*e]))
        (*e)++;
    return true;
}

/* The granule of the next piece from granule *i on; false past the chunk. */
static bool reback_next(const struct reback *rb, size_t *i)
{
    while (*i < rb->n && rb->keep && !rb->keep[*i])
        (*i)++;
    return *i < rb->n;
}

static CUmemGenericAllocationHandle reback_handle(const struct reback *rb, size_t j) { return rb->h[rb->same ? 0 : j]; }

enum reback_dir { REBACK_TO_SCRATCH, REBACK_TO_HOST, REBACK_FROM_HOST };

/* Copy the kept granules, run by run, between their places and the packed staging area (the
 * scratch range, or buf); stops at the first failure. */
static CUresult reback_copy(const struct reback *rb, enum reback_dir dir)
{
    size_t G = rb->seg->gran, i = 0, e, j = 0;
    CUresult res = CUDA_SUCCESS;
    for (; res == CUDA_SUCCESS && keep_run(rb->keep, rb->n, &i, &e); j += e - i, i = e) {
        CUdeviceptr at = rb->addr + i * G;
        size_t len = (e - i) * G;
        if (dir == REBACK_TO_SCRATCH)
            res = drv->cuMemcpyDtoDAsync(rb->scratch + j * G, at, len, rb->stream);
        else if (dir == REBACK_TO_HOST)
            res = drv->cuMemcpyDtoH(rb->buf + j * G, at, len);
        else
            res = drv->cuMemcpyHtoD(at, rb->buf + j * G, len);
    }
    return res;
}

/* Make the new pieces from prop (nothing to do for the caller's). */
static CUresult reback_make(struct reback *rb)
{
    for (size_t want = rb->same ? 1 : rb->np; rb->prop && rb->nh < want; rb->nh++) {
        CUmemGenericAllocationHandle *h = &rb->h[rb->nh];
        CUresult res = drv->cuMemCreate(h, rb->piece * rb->seg->gran, rb->prop, 0);
        if (res != CUDA_SUCCESS) {
            rb->what = "cuMemCreate";
            return res;
        }
        if (*h == 0) {
            rb->what = "cuMemCreate (a null handle)";
            return CUDA_ERROR_UNKNOWN;
        }
    }
    return CUDA_SUCCESS;
}

/* cuStreamSynchronize of xseg's own @p stream (never captured) in the thread's RELAXED capture
 * mode: in the default GLOBAL mode the driver refuses it while another thread runs a GLOBAL
 * capture and invalidates that capture (spill and promotion's copies, issue 75). */
static CUresult stream_sync_relaxed(CUstream stream)
{
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    bool relaxed = drv->cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS;
    CUresult res = drv->cuStreamSynchronize(stream);
    if (relaxed)
        (void)drv->cuThreadExchangeStreamCaptureMode(&mode);
    return res;
}

/* REBACK_SCRATCH's first step: the new pieces mapped packed at a scratch range (owner access),
 * the live bytes copied there after every queued work on them (the context's, or the stream's
 * own order) and waited for. */
static CUresult reback_stage(struct reback *rb)
{
    size_t G = rb->seg->gran, len = rb->np * rb->piece * G;
    CUresult res = drv->cuMemAddressReserve(&rb->scratch, len, 0, 0, 0);
    if (res != CUDA_SUCCESS) {
        rb->scratch = 0;
        rb->what = "cuMemAddressReserve of the scratch range";
        return res;
    }
    for (; rb->staged < rb->np; rb->staged++)
        if ((res = drv->cuMemMap(rb->scratch + rb->staged * rb->piece * G, rb->piece * G, 0,
                                 reback_handle(rb, rb->staged), 0)) != CUDA_SUCCESS) {
            rb->what = "cuMemMap at the scratch range";
            return res;
        }
    if ((res = drv->cuMemSetAccess(rb->scratch, len, &rb->seg->access[0], 1)) != CUDA_SUCCESS)
        rb->what = "cuMemSetAccess of the scratch range";
    else if (rb->ctx_wait && (res = drv->cuCtxSynchronize()) != CUDA_SUCCESS)
        rb->what = "cuCtxSynchronize before the copy";
    else if ((res = reback_copy(rb, REBACK_TO_SCRATCH)) != CUDA_SUCCESS)
        rb->what = "cuMemcpyDtoDAsync of the live bytes";
    else if ((res = rb->ctx_wait ? drv->cuCtxSynchronize() : stream_sync_relaxed(rb->stream)) != CUDA_SUCCESS)
        rb->what = rb->ctx_wait ? "cuCtxSynchronize after the copy" : "cuStreamSynchronize after the copy";
    return res;
}

/* Give back the scratch range (its staged pieces mapped); failures go to the leftovers. */
static void reback_drop(struct reback *rb)
{
    struct seg *seg = rb->seg;
    size_t len = rb->np * rb->piece * seg->gran, mapped = rb->staged * rb->piece * seg->gran;
    if (!rb->scratch)
        return;
    if (mapped && drv->cuMemUnmap(rb->scratch, mapped) != CUDA_SUCCESS) {
        left_push((struct leftover){.kind = LEFT_UNMAP, .dev = seg->cudev, .addr = rb->scratch, .size = mapped});
        left_push((struct leftover){.kind = LEFT_ADDRESS_FREE, .dev = seg->cudev, .addr = rb->scratch, .size = len});
        return;
    }
    if (drv->cuMemAddressFree(rb->scratch, len) != CUDA_SUCCESS)
        left_push((struct leftover){.kind = LEFT_ADDRESS_FREE, .dev = seg->cudev, .addr = rb->scratch, .size = len});
}

/* Map the new pieces at their places and grant every device access per run; placed counts the
 * pieces mapped. */
static CUresult reback_place(struct reback *rb)
{
    size_t G = rb->seg->gran, j = 0;
    CUresult res = CUDA_SUCCESS;
    if (!rb->np)
        return res;
    for (size_t i = 0; res == CUDA_SUCCESS && reback_next(rb, &i); i += rb->piece, j++)
        if ((res = drv->cuMemMap(rb->addr + i * G, rb->piece * G, 0, reback_handle(rb, j), 0)) != CUDA_SUCCESS)
            rb->what = "cuMemMap of the new memory at its place";
        else
            rb->placed++;
    for (size_t i = 0, e; res == CUDA_SUCCESS && keep_run(rb->keep, rb->n, &i, &e); i = e)
        if ((res = drv->cuMemSetAccess(rb->addr + i * G, (e - i) * G, rb->seg->access, rb->seg->naccess)) !=
            CUDA_SUCCESS)
            rb->what = "cuMemSetAccess of the new memory";
    return res;
}

/* Undo reback_place. A failed unmap leaves no sound mapping for the live bytes: abort(). */
static void reback_unplace(struct reback *rb)
{
    size_t G = rb->seg->gran;
    for (size_t i = 0; rb->placed && reback_next(rb, &i); i += rb->piece, rb->placed--)
        if (drv->cuMemUnmap(rb->addr + i * G, rb->piece * G) != CUDA_SUCCESS)
            abort(); /* cannot restore the live bytes' mapping */
}

/* Map @p handle over the whole chunk again, every device granted access, and announce it; abort()
 * if that fails (the live bytes would be lost: nothing sound is left to do). */
static void reback_remap(struct reback *rb, CUmemGenericAllocationHandle handle)
{
    struct seg *seg = rb->seg;
    size_t bytes = rb->n * seg->gran;
    if (drv->cuMemMap(rb->addr, bytes, 0, handle, 0) != CUDA_SUCCESS ||
        drv->cuMemSetAccess(rb->addr, bytes, seg->access, seg->naccess) != CUDA_SUCCESS)
        abort();
    rb->unmapped = false;
    if (seg->observe)
        seg->observe(seg->observe_user, seg, rb->c, rb->c + rb->n, 1);
}

/* Release the pieces made here. */
static void reback_release_new(struct reback *rb)
{
    for (size_t j = 0; rb->prop && j < rb->nh; j++)
        seg_release_handle(rb->seg, rb->h[j]);
    if (rb->prop)
        rb->nh = 0;
}

/* REBACK_HOST after the old handle went: back to one chunk of the old size, a new handle, the
 * bytes from buf. abort() if the device's memory went elsewhere meanwhile. */
static void reback_restore(struct reback *rb)
{
    reback_unplace(rb);
    reback_release_new(rb);
    CUmemGenericAllocationHandle back = 0;
    if (drv->cuMemCreate(&back, rb->n * rb->seg->gran, &rb->seg->prop, 0) != CUDA_SUCCESS || back == 0)
        abort(); /* the live bytes cannot be put back */
    reback_remap(rb, back);
    if (reback_copy(rb, REBACK_FROM_HOST) != CUDA_SUCCESS)
        abort();
    for (size_t q = rb->c; q < rb->c + rb->n; q++)
        rb->seg->handles[q] = back;
}

/* The transaction: carry the bytes out (stage, or to the host), unmap the old chunk (the observer
 * told first), place the new memory; on failure roll back as struct reback says and release the
 * pieces made here. The scratch range goes either way. */
static CUresult reback_swap(struct reback *rb)
{
    struct seg *seg = rb->seg;
    CUresult res = CUDA_SUCCESS;
    if (rb->copy == REBACK_SCRATCH && rb->np) {
        if ((res = reback_make(rb)) == CUDA_SUCCESS)
            res = reback_stage(rb);
    } else if (rb->copy == REBACK_HOST) {
        if ((res = drv->cuCtxSynchronize()) != CUDA_SUCCESS) /* every stream's work on the chunk done */
            rb->what = "cuCtxSynchronize before the copy";
        else if ((res = reback_copy(rb, REBACK_TO_HOST)) != CUDA_SUCCESS)
            rb->what = "cuMemcpyDtoH of the live bytes";
    }
    if (res == CUDA_SUCCESS) {
        if ((res = seg_unmap_run(seg, rb->c, rb->c + rb->n)) != CUDA_SUCCESS)
            rb->what = "cuMemUnmap of the old chunk";
        else
            rb->unmapped = true;
    }
    if (res == CUDA_SUCCESS && rb->copy == REBACK_HOST) {
        if ((res = drv->cuMemRelease(rb->old)) != CUDA_SUCCESS) {
            rb->what = "cuMemRelease of the old chunk";
            reback_remap(rb, rb->old); /* the memory is still the old handle's */
        } else {
            rb->old = 0;
            if ((res = reback_make(rb)) == CUDA_SUCCESS && (res = reback_place(rb)) == CUDA_SUCCESS &&
                (res = reback_copy(rb, REBACK_FROM_HOST)) != CUDA_SUCCESS)
                rb->what = "cuMemcpyHtoD of the live bytes";
            if (res != CUDA_SUCCESS)
                reback_restore(rb);
        }
    } else if (res == CUDA_SUCCESS && (res = reback_place(rb)) != CUDA_SUCCESS && rb->copy != REBACK_NONE) {
        reback_unplace(rb);
        reback_remap(rb, rb->old);
    }
    reback_drop(rb);
    if (res != CUDA_SUCCESS)
        reback_release_new(rb);
    return res;
}

/* ---- refine: a partly used chunk re-backed by one-granule chunks (the OOM path) ---- */

/* The commit: granules [c, c + n) describe one-granule chunks h[0..] where keep is set and
 * nothing elsewhere, and the new chunks are announced. */
static void refine_commit(const struct reback *rb, size_t k)
{
    struct seg *seg = rb->seg;
    for (size_t i = 0, j = 0; i < rb->n; i++) {
        size_t q = rb->c + i;
        seg->clen[q] = 0;
        if (rb->keep[i]) {
            seg->handles[q] = rb->h[j++];
            seg->cstart[q] = q;
            seg->clen[q] = 1;
        } else {
            seg->handles[q] = 0;
            seg->cstart[q] = 0;
        }
        seg->gflags[q] = 0;
    }
    seg->mapped_bytes -= (rb->n - k) * seg->gran;
    if (seg->observe)
        for (size_t i = 0, e; keep_run(rb->keep, rb->n, &i, &e); i = e)
            seg->observe(seg->observe_user, seg, rb->c + i, rb->c + e, 1);
}

/*
 * Through the host (REBACK_HOST) for a device with no room for the new chunks beside the old one.
 * The window: between the release of the old handle and the creates, memory of the device is
 * free, and another process could take it. If the new chunks cannot be had, a chunk of the old
 * size is created and mapped again and the bytes restored from the buffer (the allocator holds the
 * device lock: only another process competes for that memory); if even that fails, the live
 * bytes are lost: abort().
 */
xseg_status seg_refine(struct seg *seg, size_t g, const unsigned char *keep, bool host, size_t *freed,
                       size_t *created)
{
    *freed = 0;
    *created = 0;
    if (!seg || g >= seg->ngran || !gran_real(seg, g) || !keep)
        return err_set(XSEG_ERROR_INVALID_VALUE, "seg_refine: granule %zu is not a mapped chunk", g);
    size_t c = seg->cstart[g], n = seg->clen[c], k = 0;
    for (size_t i = 0; i < n; i++)
        k += keep[i] != 0;
    if (n < 2 || k == n)
        return XSEG_SUCCESS;
    xseg_status st = drv_ctx_ensure(seg->ctx);
    if (st != XSEG_SUCCESS)
        return st;
    host = host && k;
    struct reback rb = {.seg = seg, .c = c, .n = n, .addr = gran_addr(seg, c), .old = seg->handles[c],
                        .copy = host ? REBACK_HOST : REBACK_SCRATCH, .ctx_wait = true, .keep = keep, .piece = 1, .np = k,
                        .prop = &seg->prop, .what = ""};
    if (k && !(rb.h = xs_calloc(k, sizeof *rb.h)))
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "seg_refine: out of host memory");
    if (host && !(rb.buf = xs_malloc(k * seg->gran))) {
        xs_free(rb.h);
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "seg_refine: out of host memory for %zu bytes of staging",
                       k * seg->gran);
    }
    CUresult res = reback_swap(&rb);
    if (res == CUDA_SUCCESS) {
        if (!host)
            seg_release_handle(seg, rb.old);
        refine_commit(&rb, k);
        *freed = (n - k) * seg->gran;
        *created = k;
    } else {
        st = seg_failf(res, "seg_refine%s: %s for the chunk at 0x%llx (%zu bytes, %zu granules kept)",
                       host ? " (through the host)" : "", rb.what, (unsigned long long)rb.addr, n * seg->gran, k);
    }
    xs_free(rb.buf);
    xs_free(rb.h);
    return st;
}

/* ---- spill: a chunk moved between device and host memory at the same addresses ---- */

/* The properties of a chunk created at @p host (host memory: seg_host_location's answer) or, for
 * NULL, on the segment's device. Location HOST takes no handle types (the driver refuses any: host
 * chunks are never exported); HOST_NUMA keeps the segment's; never GPUDirect RDMA. */
static CUmemAllocationProp move_prop(const struct seg *seg, const CUmemLocation *host)
{
    CUmemAllocationProp prop = seg->prop;
    if (host) {
        prop.location = *host;
        if (host->type == CU_MEM_LOCATION_TYPE_HOST)
            prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
        prop.allocFlags.gpuDirectRDMACapable = 0;
    }
    return prop;
}

static const char *move_where(const CUmemAllocationProp *prop, char *buf, size_t n)
{
    if (prop->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA)
        snprintf(buf, n, "host memory (location HOST_NUMA node %d)", prop->location.id);
    else
        snprintf(buf, n, "%s", prop->location.type == CU_MEM_LOCATION_TYPE_HOST ? "host memory (location HOST)"
                                                                                 : "device memory");
    return buf;
}

xseg_status seg_move_chunk(struct seg *seg, size_t g, const CUmemLocation *host, CUstream stream, size_t *bytes)
{
    bool to_host = host != NULL;
    *bytes = 0;
    if (!seg || g >= seg->ngran || !gran_real(seg, g))
        return err_set(XSEG_ERROR_INVALID_VALUE, "seg_move_chunk: granule %zu is not a mapped chunk", g);
    size_t c = seg->cstart[g], n = seg->clen[c], len = n * seg->gran;
    if (((seg->gflags[c] & GRAN_HOST) != 0) == to_host)
        return XSEG_SUCCESS;
    xseg_status st = drv_ctx_ensure(seg->ctx);
    if (st != XSEG_SUCCESS)
        return st;
    CUmemAllocationProp prop = move_prop(seg, host);
    CUmemGenericAllocationHandle h = 0;
    struct reback rb = {.seg = seg, .c = c, .n = n, .addr = gran_addr(seg, c), .old = seg->handles[c],
                        .copy = REBACK_SCRATCH, .stream = stream, .piece = n, .np = 1, .prop = &prop, .h = &h,
                        .what = ""};
    CUresult res = reback_swap(&rb);
    if (res != CUDA_SUCCESS) {
        char where[64];
        return seg_failf(res, "moving the chunk at 0x%llx (%zu bytes) to %s: %s", (unsigned long long)rb.addr, len,
                         move_where(&prop, where, sizeof where), rb.what);
    }
    seg_release_handle(seg, rb.old);
    for (size_t q = c; q < c + n; q++) {
        seg->handles[q] = h;
        seg->gflags[q] = to_host ? (unsigned char)(seg->gflags[q] | GRAN_HOST) : (unsigned char)(seg->gflags[q] & ~GRAN_HOST);
    }
    if (to_host) {
        seg->mapped_bytes -= len;
        seg->host_bytes += len;
    } else {
        seg->host_bytes -= len;
        seg->mapped_bytes += len;
    }
    if (seg->observe)
        seg->observe(seg->observe_user, seg, c, c + n, 1);
    *bytes = len;
    return XSEG_SUCCESS;
}

xseg_status seg_drop_host(struct seg *seg, size_t offset, size_t size, bool strand, size_t *dropped)
{
    *dropped = 0;
    size_t first, last;
    xseg_status st = seg_check_range(seg, "seg_drop_host", offset, size, &first, &last);
    if (st != XSEG_SUCCESS || !seg->host_bytes)
        return st;
    if (!strand && (st = drv_ctx_ensure(seg->ctx)) != XSEG_SUCCESS)
        return st;
    for (size_t g = first; g < last;) {
        size_t e = chunk_end(seg, g);
        if (!gran_live(seg, g) || !(seg->gflags[g] & GRAN_HOST) || chunk_first(seg, g) < first || e > last) {
            g = e;
            continue;
        }
        size_t bytes = (e - g) * seg->gran;
        CUresult res = strand ? CUDA_ERROR_NOT_PERMITTED : seg_unmap_run(seg, g, e);
        if (strand) {
            chunk_flags(seg, g, GRAN_STRANDED | GRAN_UNWAITED, 1);
            seg->host_bytes -= bytes;
            seg->stranded_bytes += bytes;
            *dropped += bytes;
            g = e;
            continue;
        }
        if (res != CUDA_SUCCESS) {
            /* Stranded: counted unmapped from now on (no free byte on host memory is handed out),
             * unmapped by seg_reclaim, or before seg_map maps device memory there. */
            chunk_flags(seg, g, GRAN_STRANDED, 1);
            seg->host_bytes -= bytes;
            seg->stranded_bytes += bytes;
            *dropped += bytes;
            st = seg_failf(res, "cuMemUnmap(0x%llx, %zu) of a host chunk (left for the next reclaim)",
                           (unsigned long long)gran_addr(seg, g), bytes);
            g = e;
            continue;
        }
        chunk_forget(seg, g);
        *dropped += bytes;
        g = e;
    }
    return st;
}

size_t seg_host_bytes(const struct seg *seg) { return seg->host_bytes; }

/* The device's own node first: HOST_NUMA at CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID (the node closest
 * to the device; -1 where the system has no NUMA, an error before CUDA 12.2). Then HOST (the driver
 * places the pages), then HOST_NUMA node 0 (the node a system without NUMA has). */
bool seg_host_location(const struct seg *seg, CUmemLocation *loc, enum seg_host_rule *rule)
{
    int numa = 0, any = 0, node = -1;
    if (drv->cuDeviceGetAttribute(&numa, CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                  seg->cudev) != CUDA_SUCCESS)
        numa = 0;
    if (drv->cuDeviceGetAttribute(&any, CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, seg->cudev) !=
        CUDA_SUCCESS)
        any = 0;
    if (numa && drv->cuDeviceGetAttribute(&node, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, seg->cudev) != CUDA_SUCCESS)
        node = -1;
    if (numa && node >= 0) {
        *loc = (CUmemLocation){.type = CU_MEM_LOCATION_TYPE_HOST_NUMA, .id = node};
        *rule = SEG_HOST_OWN_NODE;
    } else if (any) {
        *loc = (CUmemLocation){.type = CU_MEM_LOCATION_TYPE_HOST, .id = 0};
        *rule = SEG_HOST_ANY_NODE;
    } else if (numa) {
        *loc = (CUmemLocation){.type = CU_MEM_LOCATION_TYPE_HOST_NUMA, .id = 0};
        *rule = SEG_HOST_NODE_ZERO;
    } else {
        return false;
    }
    return true;
}
int seg_gran_is_host(const struct seg *seg, size_t g) { return g < seg->ngran && gran_live(seg, g) && (seg->gflags[g] & GRAN_HOST); }

/* ---- peers ---- */

xseg_status seg_add_peer(struct seg *seg, int peer)
{
    if (!seg)
        return err_set(XSEG_ERROR_INVALID_VALUE, "seg_add_peer: segment is NULL");
    if (peer < 0)
        return err_set(XSEG_ERROR_INVALID_DEVICE, "seg_add_peer: peer %d is not a device", peer);
    if (seg_has_access(seg, peer))
        return XSEG_SUCCESS;
    xseg_status st = seg_push_access(seg, peer);
    if (st != XSEG_SUCCESS)
        return st;
    size_t k = seg->naccess - 1;
    if (seg->mapped_bytes) {
        st = drv_ctx_ensure(seg->ctx);
        for (size_t g = 0, run; st == XSEG_SUCCESS && next_live_run(seg, &g, &run);)
            st = seg_set_access(seg, run, g, k);
    }
    if (st != XSEG_SUCCESS)
        seg->naccess--; /* runs granted before the failure keep the (harmless) extra access */
    return st;
}

/* ---- accessors ---- */

CUdeviceptr seg_base(const struct seg *seg) { return seg->base; }
size_t seg_va_size(const struct seg *seg) { return seg->va_size; }
size_t seg_page_size(const struct seg *seg) { return seg->page_size; }
size_t seg_gran(const struct seg *seg) { return seg->gran; }
size_t seg_ngran(const struct seg *seg) { return seg->ngran; }
size_t seg_mapped_bytes(const struct seg *seg) { return seg->mapped_bytes; }
size_t seg_stranded_bytes(const struct seg *seg) { return seg->stranded_bytes; }

bool seg_stranded_within(const struct seg *seg, size_t offset, size_t size)
{
    if (!seg || !seg->stranded_bytes || offset >= seg->va_size || !size)
        return false;
    size_t end = offset + XSEG_MIN(size, seg->va_size - offset); /* ceil(end / gran) <= ngran */
    for (size_t g = offset / seg->gran; g < (end + seg->gran - 1) / seg->gran; g++)
        if (seg->handles[g] && (seg->gflags[g] & GRAN_STRANDED))
            return true;
    return false;
}
unsigned seg_handle_types(const struct seg *seg) { return (unsigned)seg->prop.requestedHandleTypes; }
int seg_device(const struct seg *seg) { return seg->device; }

int seg_gran_is_mapped(const struct seg *seg, size_t g) { return g < seg->ngran && gran_live(seg, g); }

int seg_chunk(const struct seg *seg, size_t g, CUmemGenericAllocationHandle *handle, size_t *first, size_t *n)
{
    if (g >= seg->ngran || !gran_real(seg, g))
        return 0;
    size_t c = seg->cstart[g];
    if (handle)
        *handle = seg->handles[g];
    if (first)
        *first = c;
    if (n)
        *n = seg->clen[c];
    return 1;
}

void seg_inner_range(const struct seg *seg, size_t offset, size_t size, size_t *lo, size_t *hi)
{
    size_t G = seg->gran;
    size_t a = offset / G, b = (offset + size) / G;
    if (a < b && seg->handles[a] && chunk_first(seg, a) < a)
        a = chunk_end(seg, a);
    if (a < b && seg->handles[b - 1] && chunk_end(seg, b - 1) > b)
        b = chunk_first(seg, b - 1);
    if (a >= b)
        a = b = offset / G;
    *lo = a * G;
    *hi = b * G;
}

static void seg_runs(const struct seg *seg, void (*fn)(void *, struct seg *, size_t, size_t, int), void *user,
                     int mapped)
{
    for (size_t g = 0, run; next_live_run_of(seg, &g, &run, true);) /* a canary span was announced unmapped */
        fn(user, (struct seg *)(uintptr_t)seg, run, g, mapped);
}

void seg_replay_mapped(const struct seg *seg, void (*fn)(void *user, struct seg *seg, size_t first, size_t last, int mapped),
                       void *user)
{
    seg_runs(seg, fn, user, 1);
}

/* ---- sleep and wake (services, core/services/sleep.c) ---- */

/* The asleep chunk holding granule @p g (GRAN_ASLEEP set): its first granule and end. */
static size_t asleep_first(const struct seg *seg, size_t g) { return seg->cstart[g]; }
static size_t asleep_end(const struct seg *seg, size_t g) { return seg->cstart[g] + seg->clen[seg->cstart[g]]; }

size_t seg_asleep_bytes(const struct seg *seg) { return seg->asleep_bytes; }

int seg_gran_is_asleep(const struct seg *seg, size_t g)
{
    return g < seg->ngran && (seg->gflags[g] & GRAN_ASLEEP) != 0;
}

size_t seg_live_chunks(const struct seg *seg)
{
    size_t n = 0;
    for (size_t g = 0; g < seg->ngran;) {
        if (gran_real(seg, g))
            n++;
        g = (seg->gflags[g] & GRAN_ASLEEP) ? asleep_end(seg, g) : chunk_end(seg, g);
    }
    return n;
}

size_t seg_asleep_chunks(const struct seg *seg)
{
    size_t n = 0;
    for (size_t g = 0; g < seg->ngran;) {
        if (seg->gflags[g] & GRAN_ASLEEP) {
            n++;
            g = asleep_end(seg, g);
        } else {
            g = chunk_end(seg, g);
        }
    }
    return n;
}

xseg_status seg_sleep_unmap(struct seg *seg, size_t *unmapped)
{
    *unmapped = 0;
    if (!seg->mapped_bytes)
        return XSEG_SUCCESS;
    xseg_status st = drv_ctx_ensure(seg->ctx);
    if (st != XSEG_SUCCESS)
        return st;
    size_t before = seg->mapped_bytes, run, run_end;
    for (size_t g = 0; next_inner_run(seg, g, seg->ngran, 0, &run, &run_end); g = run_end) {
        /* As seg_unmap, but the handles stay, so the memory and its bytes live on until
         * seg_sleep_commit. */
        CUdeviceptr addr = gran_addr(seg, run);
        size_t bytes = (run_end - run) * seg->gran;
        CUresult res = seg_unmap_run(seg, run, run_end);
        if (res != CUDA_SUCCESS) {
            *unmapped = before - seg->mapped_bytes;
            return seg_failf(res, "cuMemUnmap(0x%llx, %zu) to put it to sleep", (unsigned long long)addr, bytes);
        }
        for (size_t g2 = run; g2 < run_end; g2++)
            seg->gflags[g2] |= GRAN_ASLEEP;
        seg->mapped_bytes -= bytes;
        seg->asleep_bytes += bytes;
    }
    *unmapped = before - seg->mapped_bytes;
    return XSEG_SUCCESS;
}

xseg_status seg_sleep_undo(struct seg *seg, size_t *remapped)
{
    *remapped = 0;
    xseg_status first = drv_ctx_ensure(seg->ctx);
    if (first != XSEG_SUCCESS)
        return first;
    /* Chunk by chunk (a rollback is rare): map the held handle back, grant access, announce. */
    for (size_t g = 0; g < seg->ngran;) {
        if (!(seg->gflags[g] & GRAN_ASLEEP)) {
            g = chunk_end(seg, g);
            continue;
        }
        size_t c = asleep_first(seg, g), end = asleep_end(seg, g), bytes = (end - c) * seg->gran;
        g = end;
        if (!seg->handles[c])
            continue;
        CUdeviceptr addr = gran_addr(seg, c);
        CUresult res = drv->cuMemMap(addr, bytes, 0, seg->handles[c], 0);
        if (res != CUDA_SUCCESS) {
            if (first == XSEG_SUCCESS)
                first = seg_failf(res, "cuMemMap(0x%llx, %zu) of a chunk back after a failed sleep",
                                  (unsigned long long)addr, bytes);
            continue; /* still asleep, still held: a wake maps it */
        }
        xseg_status st = seg_set_access(seg, c, end, 0);
        if (st != XSEG_SUCCESS) {
            if (first == XSEG_SUCCESS)
                first = st;
            if (drv->cuMemUnmap(addr, bytes) == CUDA_SUCCESS)
                continue; /* asleep and held again */
            /* Mapped after all, perhaps without access (a third failure): counted mapped, so the
             * books match the driver; the message says what happened. */
        }
        chunk_flags(seg, c, GRAN_ASLEEP, 0);
        seg->asleep_bytes -= bytes;
        seg->mapped_bytes += bytes;
        *remapped += bytes;
        if (seg->observe)
            seg->observe(seg->observe_user, seg, c, end, 1);
    }
    return first;
}

void seg_sleep_commit(struct seg *seg)
{
    for (size_t g = 0; g < seg->ngran;) {
        if (!(seg->gflags[g] & GRAN_ASLEEP)) {
            g = chunk_end(seg, g);
            continue;
        }
        size_t c = asleep_first(seg, g), end = asleep_end(seg, g);
        if (seg->handles[c]) {
            seg_release_handle(seg, seg->handles[c]);
            for (size_t k = c; k < end; k++)
                seg->handles[k] = 0;
        }
        g = end;
    }
}

/* Undo the chunks of the running (or last) wake, GRAN_FRESH: unmap them, release the handles the
 * wake created, keep the ones it found held; they are asleep again. @p announced: the observer
 * was told they are mapped. A chunk whose unmap fails stays mapped and counted (and announced). */
static xseg_status seg_wake_rollback(struct seg *seg, bool announced)
{
    xseg_status first = XSEG_SUCCESS;
    for (size_t g = 0; g < seg->ngran;) {
        if (!(seg->gflags[g] & GRAN_FRESH)) {
            g = (seg->gflags[g] & GRAN_ASLEEP) ? asleep_end(seg, g) : chunk_end(seg, g);
            continue;
        }
        size_t c = chunk_first(seg, g), end = chunk_end(seg, g), bytes = (end - c) * seg->gran;
        g = end;
        if (announced && seg->observe)
            seg->observe(seg->observe_user, seg, c, end, 0);
        CUdeviceptr addr = gran_addr(seg, c);
        CUresult res = drv->cuMemUnmap(addr, bytes);
        if (res != CUDA_SUCCESS) {
            if (first == XSEG_SUCCESS)
                first = seg_failf(res, "cuMemUnmap(0x%llx, %zu) to undo a wake", (unsigned long long)addr, bytes);
            chunk_flags(seg, c, GRAN_FRESH | GRAN_WAS_HELD, 0);
            if (seg->observe)
                seg->observe(seg->observe_user, seg, c, end, 1);
            continue;
        }
        bool held = (seg->gflags[c] & GRAN_WAS_HELD) != 0;
        if (!held)
            seg_release_handle(seg, seg->handles[c]);
        for (size_t k = c; k < end; k++) {
            if (!held)
                seg->handles[k] = 0;
            seg->gflags[k] = GRAN_ASLEEP;
        }
        seg->mapped_bytes -= bytes;
        seg->asleep_bytes += bytes;
    }
    return first;
}

xseg_status seg_wake_map(struct seg *seg, size_t *mapped)
{
    *mapped = 0;
    if (!seg->asleep_bytes)
        return XSEG_SUCCESS;
    xseg_status st = drv_ctx_ensure(seg->ctx);
    if (st != XSEG_SUCCESS)
        return st;
    size_t before = seg->mapped_bytes;
    struct fresh_run fr = {SIZE_MAX, seg_piece_end_of(seg, 0)};
    for (size_t g = 0; g < seg->ngran;) {
        if ((st = fresh_run_at(seg, &fr, g)) != XSEG_SUCCESS)
            goto fail;
        if (!(seg->gflags[g] & GRAN_ASLEEP)) {
            if ((st = fresh_run_end(seg, &fr, g)) != XSEG_SUCCESS)
                goto fail;
            g = chunk_end(seg, g);
            continue;
        }
        size_t c = asleep_first(seg, g), end = asleep_end(seg, g), bytes = (end - c) * seg->gran;
        CUmemGenericAllocationHandle h = seg->handles[c];
        bool held = h != 0;
        CUresult res;
        if (!held && (res = drv->cuMemCreate(&h, bytes, &seg->prop, 0)) != CUDA_SUCCESS) {
            st = seg_failf(res, "cuMemCreate(%zu bytes) to wake a chunk of the segment at 0x%llx on device %d", bytes,
                           (unsigned long long)seg->base, seg->device);
            goto fail;
        }
        if (!held && h == 0) {
            st = err_set(XSEG_ERROR_DRIVER, "cuMemCreate returned a null handle");
            goto fail;
        }
        CUdeviceptr addr = gran_addr(seg, c);
        if ((res = drv->cuMemMap(addr, bytes, 0, h, 0)) != CUDA_SUCCESS) {
            if (!held)
                seg_release_handle(seg, h);
            st = seg_failf(res, "cuMemMap(0x%llx, %zu) to wake a chunk", (unsigned long long)addr, bytes);
            goto fail;
        }
        for (size_t k = c; k < end; k++) {
            seg->handles[k] = h;
            seg->gflags[k] = (unsigned char)(GRAN_FRESH | (held ? GRAN_WAS_HELD : 0));
        }
        seg->asleep_bytes -= bytes;
        seg->mapped_bytes += bytes;
        if (fr.start == SIZE_MAX)
            fr.start = c;
        g = end;
    }
    if ((st = fresh_run_end(seg, &fr, seg->ngran)) != XSEG_SUCCESS)
        goto fail;
    if (seg->observe)
        seg_observe_fresh(seg, 0, seg->ngran);
    *mapped = seg->mapped_bytes - before;
    return XSEG_SUCCESS;
fail:
    (void)seg_wake_rollback(seg, false); /* keeps st's message: the rollback's own failure is rarer */
    return st;
}

xseg_status seg_wake_undo(struct seg *seg)
{
    xseg_status st = drv_ctx_ensure(seg->ctx);
    return st != XSEG_SUCCESS ? st : seg_wake_rollback(seg, true);
}

void seg_wake_commit(struct seg *seg)
{
    for (size_t g = 0; g < seg->ngran; g++)
        seg->gflags[g] &= (unsigned char)~(GRAN_FRESH | GRAN_WAS_HELD);
}

/* ---- debug_stale_access's canary (seg_canary_swap) ---- */

/* Is granule @p g a canary span's that maps the canary (not bare)? */
static bool canary_mapped(const struct seg *seg, size_t g)
{
    return (seg->gflags[g] & (GRAN_CANARY | GRAN_BARE)) == GRAN_CANARY;
}

/* The next run [*run, *e) of canary-mapped granules of [g, last) inside one piece; false if none. */
static bool next_canary_run(const struct seg *seg, size_t g, size_t last, size_t *run, size_t *e)
{
    while (g < last && !canary_mapped(seg, g))
        g++;
    if (g >= last)
        return false;
    size_t pend = seg_piece_end_of(seg, g);
    *run = g;
    for (*e = g; *e < last && *e < pend && canary_mapped(seg, *e);)
        (*e)++;
    return true;
}

/* The canary over the whole chunk at granule @p g, a re-backing without live bytes (the block is
 * dead): the chunk unmapped (the observer told first, a registration goes with the memory) and
 * its handle given back (to @p spares, or released), the canary mapped at each of its granules
 * with access (with @p bare, none: an earlier chunk's failed, the driver refuses). *given says
 * whether the chunk was given back (its unmap succeeded: then it is span, a granule the canary
 * could not be mapped on bare). @return the first failure. */
static CUresult canary_chunk(struct seg *seg, size_t g, CUmemGenericAllocationHandle canary, struct seg_spares *spares,
                             bool bare, bool *given)
{
    size_t n = seg->clen[g];
    struct reback rb = {.seg = seg, .c = g, .n = n, .addr = gran_addr(seg, g), .copy = REBACK_NONE, .piece = 1,
                        .np = bare ? 0 : n, .same = true, .h = &canary, .nh = 1, .what = ""};
    CUresult res = reback_swap(&rb);
    if (!(*given = rb.unmapped))
        return res;
    chunk_forget_keep(seg, g, spares);
    for (size_t k = g; k < g + n; k++) {
        seg->handles[k] = canary;
        seg->cstart[k] = k;
        seg->clen[k] = 1;
        seg->gflags[k] = k - g < rb.placed ? GRAN_CANARY : GRAN_CANARY | GRAN_BARE;
    }
    seg->canary_bytes += n * seg->gran;
    return res;
}

xseg_status seg_canary_swap(struct seg *seg, size_t offset, size_t size, struct seg_spares *spares,
                            struct seg_canary *out)
{
    *out = (struct seg_canary){0};
    if (size == 0 || offset % seg->gran || size % seg->gran || offset > seg->va_size || size > seg->va_size - offset)
        return XSEG_SUCCESS;
    size_t g0 = offset / seg->gran, g1 = (offset + size) / seg->gran, lo = g0;
    /* The first whole chunk inside; the span runs over the whole chunks that follow it. */
    while (lo < g1 && !(gran_real(seg, lo) && seg->cstart[lo] == lo && chunk_end(seg, lo) <= g1))
        lo = chunk_end(seg, lo);
    if (lo >= g1)
        return XSEG_SUCCESS;
    xseg_status st = drv_ctx_ensure(seg->ctx);
    if (st == XSEG_SUCCESS)
        st = seg_sync(seg, "before a quarantined block's pages are swapped for a canary");
    if (st != XSEG_SUCCESS)
        return st;
    CUmemGenericAllocationHandle canary = 0;
    CUresult res = drv->cuMemCreate(&canary, seg->gran, &seg->prop, 0), first = CUDA_SUCCESS;
    if (res != CUDA_SUCCESS || !canary)
        return seg_failf(res, "cuMemCreate(%zu bytes) of a canary page", seg->gran);
    size_t g = lo;
    while (g < g1 && gran_real(seg, g) && seg->cstart[g] == g && chunk_end(seg, g) <= g1) {
        size_t n = seg->clen[g], bytes = n * seg->gran;
        bool host = (seg->gflags[g] & GRAN_HOST) != 0, given;
        res = canary_chunk(seg, g, canary, spares, first != CUDA_SUCCESS, &given);
        if (!given) { /* this chunk stays as it was; the ones before are the span */
            st = seg_failf(res, "cuMemUnmap(0x%llx, %zu) before a canary", (unsigned long long)gran_addr(seg, g),
                           bytes);
            break;
        }
        first = first != CUDA_SUCCESS ? first : res;
        if (host) {
            out->host_bytes += bytes;
        } else {
            out->bytes += bytes;
            out->chunks++;
        }
        g += n;
    }
    if (g == lo) { /* nothing given back: nothing changed */
        seg_release_handle(seg, canary);
        return st;
    }
    /* A canary not mapped whole: the span goes bare (it faults, as an unmapped range does, rather
     * than half read the canary); a run whose unmap fails too stays mapped, perhaps without
     * access, until seg_canary_release unmaps it. */
    out->whole = first == CUDA_SUCCESS;
    size_t run, e;
    for (size_t q = lo; !out->whole && next_canary_run(seg, q, g, &run, &e); q = e)
        if (drv->cuMemUnmap(gran_addr(seg, run), (e - run) * seg->gran) == CUDA_SUCCESS)
            for (size_t k = run; k < e; k++)
                seg->gflags[k] |= GRAN_BARE;
    if (!out->whole && st == XSEG_SUCCESS)
        st = seg_failf(first, "mapping a canary page over 0x%llx (%zu bytes; its chunks were given back already)",
                       (unsigned long long)gran_addr(seg, lo), (g - lo) * seg->gran);
    out->first = lo * seg->gran;
    out->end = g * seg->gran;
    out->canary = canary;
    return st;
}

xseg_status seg_canary_release(struct seg *seg, size_t first, size_t end, CUmemGenericAllocationHandle canary)
{
    size_t g0 = first / seg->gran, g1 = end / seg->gran, run, e;
    xseg_status st = drv_ctx_ensure(seg->ctx);
    if (st != XSEG_SUCCESS)
        return st;
    for (size_t g = g0; next_canary_run(seg, g, g1, &run, &e); g = e) {
        CUresult res = drv->cuMemUnmap(gran_addr(seg, run), (e - run) * seg->gran);
        if (res != CUDA_SUCCESS) /* the runs unmapped so far stay bare: the next try skips them */
            return seg_failf(res, "cuMemUnmap(0x%llx, %zu) of a canary page's mappings",
                             (unsigned long long)gran_addr(seg, run), (e - run) * seg->gran);
        for (size_t k = run; k < e; k++)
            seg->gflags[k] |= GRAN_BARE;
    }
    for (size_t g = g0; g < g1; g++) {
        if (!(seg->gflags[g] & GRAN_CANARY))
            continue;
        seg->handles[g] = 0;
        seg->cstart[g] = 0;
        seg->clen[g] = 0;
        seg->gflags[g] = 0;
        seg->canary_bytes -= seg->gran;
    }
    if (canary)
        seg_release_handle(seg, canary);
    return XSEG_SUCCESS;
}

size_t seg_canary_bytes(const struct seg *seg) { return seg->canary_bytes; }
