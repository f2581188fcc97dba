/*
 * IPC of expandable blocks (see include/xseg.h for the contract, docs/ipc.md for the design). A
 * block is exported as the chunks under it; the wire format and the import table live here, the
 * driver calls in vmm/ipc.c.
 */
#define _GNU_SOURCE
#include "core/policy/ipc.h"
#include "core/device/check.h"
#include "core/policy/registry.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/error.h"
#include "base/fork.h"
#include "base/hostmem.h"
#include "base/witness.h"
#include "vmm/ipc.h"
#include "vmm/segment.h"

/* ---- handles ---- */

static xseg_ipc_handle *ipc_handle_new(xseg_ipc_handle_type type, size_t nchunks)
{
    xseg_ipc_handle *h = xs_calloc(1, sizeof *h);
    if (!h)
        return NULL;
    h->type = type;
    h->nchunks = nchunks;
    size_t n = XSEG_MAX(nchunks, (size_t)1);
    h->sizes = xs_calloc(n, sizeof *h->sizes);
    if (type == XSEG_IPC_POSIX_FD) {
        h->fds = xs_malloc(n * sizeof *h->fds);
        if (h->fds)
            for (size_t i = 0; i < nchunks; i++)
                h->fds[i] = -1;
    } else {
        h->fabric = xs_calloc(n, IPC_FABRIC_BYTES);
    }
    if (!h->sizes || (!h->fds && !h->fabric)) {
        xs_free(h->sizes);
        xs_free(h->fds);
        xs_free(h->fabric);
        xs_free(h);
        return NULL;
    }
    return h;
}

void ipc_handle_free(xseg_ipc_handle *h)
{
    if (!h)
        return;
    if (h->fds)
        for (size_t i = 0; i < h->nchunks; i++)
            if (h->fds[i] >= 0)
                close(h->fds[i]);
    xs_free(h->fds);
    xs_free(h->fabric);
    xs_free(h->sizes);
    xs_free(h);
}

/* The chunks under expandable block @p b (mapped): the first granule of each into @p firsts (NULL:
 * only counted), their number into *n, the block's offset in the first into *offset. */
static void ipc_block_chunks(const struct block *b, size_t *firsts, size_t *n, size_t *offset)
{
    const struct seg *vs = b->seg->vseg;
    size_t gran = seg_gran(vs);
    size_t off = b->addr - (uintptr_t)seg_base(vs);
    size_t g = off / gran, end = (off + b->size + gran - 1) / gran, k = 0;
    size_t c = g, len = 1;
    (void)seg_chunk(vs, g, NULL, &c, &len); /* mapped: a live block's granules all are */
    *offset = off - c * gran;
    for (g = c; g < end; k++) {
        if (!seg_chunk(vs, g, NULL, &c, &len))
            len = 1;
        if (firsts)
            firsts[k] = g;
        g += len;
    }
    *n = k;
}

/* Are some of @p b's pages on host memory (spill, core/services/spill.h)? Spilled pages are never
 * handed out: an importer or a registration would map memory that promotion replaces. */
static bool block_spilled(const struct block *b)
{
    if (!b->spill)
        return false;
    const struct seg *vs = b->seg->vseg;
    size_t gran = seg_gran(vs), off = b->addr - (uintptr_t)seg_base(vs);
    for (size_t g = off / gran; g * gran < off + b->size; g++)
        if (seg_gran_is_host(vs, g))
            return true;
    return false;
}

static xseg_status refuse_spilled(const char *fn, const void *ptr, int device)
{
    return err_set(XSEG_ERROR_ILLEGAL_STATE,
                   "%s: block %p on device %d has pages spilled to host memory (spill_to_host); "
                   "xseg_promote(%d) it back first", fn, ptr, device, device);
}

xseg_status ipc_export_block(struct dev_alloc *d, void *ptr, xseg_ipc_handle **out, bool *owned)
{
    dev_lock(d, DEV_NEED_SLOTS);
    struct block *b = ptrmap_get(&d->live, (uintptr_t)ptr);
    *owned = b != NULL;
    if (!b) {
        dev_unlock(d);
        return XSEG_SUCCESS;
    }
    xseg_status st;
    if (!b->expandable || !b->seg->vseg) {
        st = err_set(XSEG_ERROR_NOT_SUPPORTED,
                     "xseg_ipc_export: block %p on device %d is a classic (cuMemAlloc) block; only blocks of "
                     "expandable segments can be exported",
                     ptr, d->device);
        goto out;
    }
    if (b->seg->asleep) {
        st = err_set(XSEG_ERROR_ILLEGAL_STATE,
                     "xseg_ipc_export: block %p on device %d belongs to a sleeping pool (xseg_sleep): its pages "
                     "are given back; wake the pool first", ptr, d->device);
        goto out;
    }
    if (block_spilled(b)) {
        st = refuse_spilled("xseg_ipc_export", ptr, d->device);
        goto out;
    }
    unsigned types = seg_handle_types(b->seg->vseg);
    unsigned type = (types & CU_MEM_HANDLE_TYPE_FABRIC) ? CU_MEM_HANDLE_TYPE_FABRIC
                    : (types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
                                                                         : 0;
    if (!type) {
        st = err_set(XSEG_ERROR_NOT_SUPPORTED,
                     "xseg_ipc_export: the segment of block %p on device %d was created without a shareable "
                     "handle type (expandable_segments_ipc:False, or the driver reports neither POSIX file "
                     "descriptors nor fabric handles)",
                     ptr, d->device);
        goto out;
    }
    size_t n, offset;
    ipc_block_chunks(b, NULL, &n, &offset);
    xseg_ipc_handle *h = ipc_handle_new(type == CU_MEM_HANDLE_TYPE_FABRIC ? XSEG_IPC_FABRIC : XSEG_IPC_POSIX_FD, n);
    size_t *firsts = xs_malloc(XSEG_MAX(n, (size_t)1) * sizeof *firsts);
    if (!h || !firsts) {
        ipc_handle_free(h);
        xs_free(firsts);
        st = err_set(XSEG_ERROR_OUT_OF_MEMORY, "xseg_ipc_export: out of host memory for %zu chunks", n);
        goto out;
    }
    ipc_block_chunks(b, firsts, &n, &offset);
    size_t gran = seg_gran(b->seg->vseg);
    for (size_t i = 0; i < n; i++) {
        size_t c = 0, len = 1;
        (void)seg_chunk(b->seg->vseg, firsts[i], NULL, &c, &len);
        h->sizes[i] = (uint64_t)(len * gran);
    }
    h->device = d->device;
    h->size = b->size;
    h->offset = offset;
    /* Under the device lock: the chunks cannot be unmapped while they are exported. */
    st = ipc_export_chunks(b->seg->vseg, firsts, n, type, h->fds, h->fabric);
    xs_free(firsts);
    if (st != XSEG_SUCCESS) {
        if (h->fds)
            for (size_t i = 0; i < n; i++)
                h->fds[i] = -1; /* ipc_export_chunks closed what it had opened */
        ipc_handle_free(h);
        err_prefix(st, "xseg_ipc_export(%p)", ptr);
        goto out;
    }
    /* Handed to another party: the block enters the registration ledger as xseg's own until
     * its free (core/policy/registry.h); no entry, no export. */
    if ((st = reg_own_locked(d, b->addr, b->size, REG_OWNER_EXPORT, -1)) != XSEG_SUCCESS) {
        ipc_handle_free(h);
        err_prefix(st, "xseg_ipc_export(%p)", ptr);
        goto out;
    }
    *out = h;
    b->seg->handles_out = true; /* another process maps these handles: never re-backed */
    b->exported = true;         /* nor given back by a sleep while the block lives (core/services/sleep.c) */
out:
    dev_unlock(d);
    return st;
}

/* One more hold on allocated block @p b (device lock held): false, with the message set, on host
 * OOM for its side struct (nothing changed). */
static bool handles_hold(struct block *b, const void *ptr, int device)
{
    struct block_side *sd = block_side_get(b);
    if (!sd) {
        err_set(XSEG_ERROR_OUT_OF_MEMORY, "xseg_block_handles: out of host memory recording the hand-out of block %p "
                "on device %d", ptr, device);
        return false;
    }
    sd->handle_holds++;
    return true;
}

xseg_status ipc_block_handles_release(struct dev_alloc *d, void *ptr, bool *owned)
{
    dev_lock(d, DEV_NEED_SLOTS);
    struct block *b = ptrmap_get(&d->live, (uintptr_t)ptr);
    *owned = b != NULL;
    xseg_status st = XSEG_SUCCESS;
    if (b && !(b->sided && b->u.side->handle_holds))
        st = err_set(XSEG_ERROR_ILLEGAL_STATE,
                     "xseg_block_handles_release: block %p on device %d has no handles handed out to release "
                     "(xseg_block_handles with cap > 0 was never called on it, or each hand-out was released "
                     "already)", ptr, d->device);
    else if (b && --b->u.side->handle_holds == 0)
        block_side_drop(b); /* given back if nothing else needs it */
    dev_unlock(d);
    return st;
}

xseg_status ipc_block_handles(struct dev_alloc *d, void *ptr, xseg_phys_range *ranges, size_t cap, size_t *n,
                              bool *owned)
{
    dev_lock(d, DEV_NEED_SLOTS);
    struct block *b = ptrmap_get(&d->live, (uintptr_t)ptr);
    *owned = b != NULL;
    if (!b) {
        dev_unlock(d);
        return XSEG_SUCCESS;
    }
    if (!b->expandable || !b->seg->vseg) {
        /* Classic memory never sleeps, but the hold keeps the release contract the same. */
        if (cap && !handles_hold(b, ptr, d->device)) {
            dev_unlock(d);
            return XSEG_ERROR_OUT_OF_MEMORY;
        }
        if (cap)
            ranges[0] = (xseg_phys_range){.address = b->addr, .length = b->size, .handle = 0,
                                          .offset = b->addr - b->seg->first->addr};
        *n = 1;
        dev_unlock(d);
        return XSEG_SUCCESS;
    }
    if (b->seg->asleep) {
        dev_unlock(d);
        return err_set(XSEG_ERROR_ILLEGAL_STATE,
                       "xseg_block_handles: block %p on device %d belongs to a sleeping pool (xseg_sleep): its pages "
                       "have no physical memory now; wake the pool first", ptr, d->device);
    }
    if (cap && block_spilled(b)) {
        dev_unlock(d);
        return refuse_spilled("xseg_block_handles", ptr, d->device);
    }
    /* Handles handed out hold the block's pool awake until released or freed (core/services/sleep.c). */
    if (cap && !handles_hold(b, ptr, d->device)) {
        dev_unlock(d);
        return XSEG_ERROR_OUT_OF_MEMORY;
    }
    const struct seg *vs = b->seg->vseg;
    size_t gran = seg_gran(vs);
    uintptr_t base = (uintptr_t)seg_base(vs), end = b->addr + b->size;
    size_t g = (b->addr - base) / gran, last = (end - base + gran - 1) / gran, np = 0;
    while (g < last) {
        CUmemGenericAllocationHandle hd = 0;
        size_t c = g, len = 1;
        if (!seg_chunk(vs, g, &hd, &c, &len))
            c = g, len = 1;
        uintptr_t cstart = base + c * gran;
        uintptr_t lo = XSEG_MAX(cstart, b->addr), hi = XSEG_MIN(cstart + len * gran, end);
        if (np < cap)
            ranges[np] = (xseg_phys_range){.address = lo, .length = hi - lo, .handle = (uint64_t)hd,
                                           .offset = lo - cstart};
        np++;
        g = c + len;
    }
    *n = np;
    if (cap)
        b->seg->handles_out = true; /* the caller may register or retain them: never re-backed */
    dev_unlock(d);
    return XSEG_SUCCESS;
}

/* ---- imports ---- */

struct ipc_import_rec {
    uintptr_t ptr; /* what xseg_ipc_import returned */
    CUdeviceptr base;
    size_t size;
    CUcontext ctx;
    bool unmapped; /* a close unmapped it but failed to free the address range: retried by a close */
    struct ipc_import_rec *next;
};

/* The table of imports is xseg_rt.ipc (core/process/procstate.h). */
FORK_MUTEX_AT(FORK_RANK_IPC_IMPORTS, ipc_imports_lock, xseg_rt.ipc.imports_lock)

/* Bytes of all chunks of @p h (checked not to overflow by ipc_check_layout). */
static size_t ipc_span(const xseg_ipc_handle *h)
{
    size_t span = 0;
    for (size_t i = 0; i < h->nchunks; i++)
        span += (size_t)h->sizes[i];
    return span;
}

/* Is (nchunks, sizes, offset, size) a layout an export could have made? Every chunk a positive
 * size, the total without overflow, the block starting in the first chunk and ending inside the
 * total. */
static xseg_status ipc_check_layout(size_t nchunks, const uint64_t *sizes, size_t offset, size_t size,
                                    const char *fn)
{
    if (nchunks == 0 || nchunks > IPC_MAX_CHUNKS)
        return err_set(XSEG_ERROR_INVALID_VALUE, "%s: the handle is inconsistent (%zu chunks)", fn, nchunks);
    uint64_t span = 0;
    for (size_t i = 0; i < nchunks; i++) {
        if (sizes[i] == 0 || sizes[i] > ((uint64_t)1 << 50) - span)
            return err_set(XSEG_ERROR_INVALID_VALUE, "%s: the handle is inconsistent (chunk %zu of %llu bytes)", fn,
                           i, (unsigned long long)sizes[i]);
        span += sizes[i];
    }
    if (offset >= sizes[0] || size == 0 || size > span - offset)
        return err_set(XSEG_ERROR_INVALID_VALUE,
                       "%s: the handle is inconsistent (%zu chunks, %llu bytes, offset %zu, size %zu)", fn, nchunks,
                       (unsigned long long)span, offset, size);
    return XSEG_SUCCESS;
}

xseg_status ipc_import(struct dev_alloc *d, const xseg_ipc_handle *h, void **ptr)
{
    xseg_status st = ipc_check_layout(h->nchunks, h->sizes, h->offset, h->size, "xseg_ipc_import");
    if (st != XSEG_SUCCESS)
        return st;
    if (h->type == XSEG_IPC_POSIX_FD)
        for (size_t i = 0; i < h->nchunks; i++)
            if (h->fds[i] < 0)
                return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_ipc_import: chunk %zu's descriptor is closed", i);
    /* Host memory first, so nothing can fail after the driver work succeeded. */
    struct ipc_import_rec *rec = xs_calloc(1, sizeof *rec);
    CUmemAccessDesc *access = xs_calloc(ALLOC_MAX_DEVICES + 1, sizeof *access);
    if (!rec || !access) {
        xs_free(rec);
        xs_free(access);
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "xseg_ipc_import: out of host memory");
    }
    int naccess = 0;
    dev_lock(d, DEV_NEED_SLOTS);
    access[naccess].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access[naccess].location.id = d->device;
    access[naccess++].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    for (int i = 0; i < d->npeers; i++) {
        access[naccess].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        access[naccess].location.id = d->peers[i];
        access[naccess++].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    }
    dev_unlock(d);
    CUdeviceptr base = 0;
    unsigned type = h->type == XSEG_IPC_FABRIC ? CU_MEM_HANDLE_TYPE_FABRIC : CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    st = ipc_import_map(d->info.primary_ctx, type, h->fds, h->fabric, h->nchunks, h->sizes, access, naccess, &base);
    xs_free(access);
    if (st != XSEG_SUCCESS) {
        xs_free(rec);
        return err_prefix(st, "xseg_ipc_import on device %d", d->device);
    }
    rec->base = base;
    rec->size = ipc_span(h);
    rec->ptr = (uintptr_t)base + h->offset;
    rec->ctx = d->info.primary_ctx;
    mutex_lock(&xseg_rt.ipc.imports_lock);
    rec->next = xseg_rt.ipc.imports;
    xseg_rt.ipc.imports = rec;
    mutex_unlock(&xseg_rt.ipc.imports_lock);
    *ptr = (void *)rec->ptr;
    return XSEG_SUCCESS;
}

xseg_status ipc_close(void *ptr)
{
    mutex_lock(&xseg_rt.ipc.imports_lock);
    struct ipc_import_rec **pp = &xseg_rt.ipc.imports;
    while (*pp && (*pp)->ptr != (uintptr_t)ptr)
        pp = &(*pp)->next;
    struct ipc_import_rec *rec = *pp;
    if (rec)
        *pp = rec->next; /* taken out while the driver works: a concurrent close of it fails */
    mutex_unlock(&xseg_rt.ipc.imports_lock);
    if (!rec)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_ipc_close: %p is not an open import", ptr);
    xseg_status st = ipc_unmap(rec->ctx, rec->base, rec->size, &rec->unmapped);
    if (st != XSEG_SUCCESS) {
        /* Kept, so that closing it again finishes the work: a failed unmap leaves it mapped and
         * usable; a failed address free leaves only the reservation, which the next close frees
         * (without unmapping again). */
        bool unmapped = rec->unmapped;
        mutex_lock(&xseg_rt.ipc.imports_lock);
        rec->next = xseg_rt.ipc.imports;
        xseg_rt.ipc.imports = rec;
        mutex_unlock(&xseg_rt.ipc.imports_lock);
        return unmapped ? err_prefix(st, "xseg_ipc_close(%p): the import is unmapped but its address range is "
                                         "still reserved; call xseg_ipc_close again to free it", ptr)
                        : err_prefix(st, "xseg_ipc_close(%p): the import stays mapped; call xseg_ipc_close "
                                         "again", ptr);
    }
    xs_free(rec);
    return XSEG_SUCCESS;
}

xseg_status ipc_close_all(void)
{
    for (;;) {
        mutex_lock(&xseg_rt.ipc.imports_lock);
        void *ptr = xseg_rt.ipc.imports ? (void *)xseg_rt.ipc.imports->ptr : NULL;
        mutex_unlock(&xseg_rt.ipc.imports_lock);
        if (!ptr)
            return XSEG_SUCCESS;
        xseg_status st = ipc_close(ptr);
        if (st != XSEG_SUCCESS)
            return st;
    }
}

/* ---- wire format ----
 *
 * Native byte order (both ends run on one host, or one NVLink domain of one architecture): a
 * header (magic "XSEGIPC2" and the fields below), then the chunk sizes (uint64 each) in batches
 * of IPC_FDS_PER_MSG. POSIX handles: the header message carries the first IPC_FDS_PER_MSG
 * descriptors as SCM_RIGHTS, and after the sizes every further batch is one byte 'F' with the
 * next descriptors. Fabric handles: after the sizes, the 64-byte handles in batches of
 * IPC_FDS_PER_MSG. The same batching on both ends lets the receiver read exact byte counts, which
 * works on stream and seqpacket sockets alike. The flat (serialized) form is the header, then all
 * sizes, then all fabric bytes. */

#define IPC_MAGIC "XSEGIPC2"
#define IPC_FDS_PER_MSG 250 /* the kernel accepts at most 253 (SCM_MAX_FD) per message */

struct ipc_wire {
    char magic[8];
    uint32_t version;
    uint32_t type;
    int32_t device;
    uint32_t reserved;
    uint64_t size, offset, nchunks;
};

static void ipc_wire_fill(const xseg_ipc_handle *h, struct ipc_wire *w)
{
    memset(w, 0, sizeof *w);
    memcpy(w->magic, IPC_MAGIC, 8);
    w->version = 2;
    w->type = (uint32_t)h->type;
    w->device = h->device;
    w->size = h->size;
    w->offset = h->offset;
    w->nchunks = h->nchunks;
}

/* Check a received header and make the handle it describes (sizes still to be read). */
static xseg_status ipc_wire_parse(const struct ipc_wire *w, const char *fn, xseg_ipc_handle **out)
{
    if (memcmp(w->magic, IPC_MAGIC, 8) || w->version != 2)
        return err_set(XSEG_ERROR_INVALID_VALUE, "%s: not an xseg IPC handle (bad magic or version)", fn);
    if (w->type != XSEG_IPC_POSIX_FD && w->type != XSEG_IPC_FABRIC)
        return err_set(XSEG_ERROR_INVALID_VALUE, "%s: unknown handle type %u", fn, w->type);
    if (w->nchunks == 0 || w->nchunks > IPC_MAX_CHUNKS || w->size == 0 || w->size >= ((uint64_t)1 << 50) ||
        w->offset >= ((uint64_t)1 << 50))
        return err_set(XSEG_ERROR_INVALID_VALUE,
                       "%s: inconsistent handle (%llu chunks, offset %llu, size %llu)", fn,
                       (unsigned long long)w->nchunks, (unsigned long long)w->offset, (unsigned long long)w->size);
    xseg_ipc_handle *h = ipc_handle_new((xseg_ipc_handle_type)w->type, (size_t)w->nchunks);
    if (!h)
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    h->device = w->device;
    h->size = (size_t)w->size;
    h->offset = (size_t)w->offset;
    *out = h;
    return XSEG_SUCCESS;
}

static xseg_status ipc_errno(const char *fn, const char *what)
{
    return err_set(XSEG_ERROR_INVALID_VALUE, "%s: %s failed: %s", fn, what, strerror(errno));
}

/* Send @p len bytes and @p nfds descriptors (with the first byte) in full. */
static xseg_status ipc_send_msg(int sock, const void *buf, size_t len, const int *fds, size_t nfds)
{
    union {
        char buf[CMSG_SPACE(IPC_FDS_PER_MSG * sizeof(int))];
        struct cmsghdr align;
    } ctl;
    size_t sent = 0;
    while (sent < len) {
        struct iovec iov = {(char *)(uintptr_t)buf + sent, len - sent};
        struct msghdr msg = {0};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        if (sent == 0 && nfds) {
            memset(&ctl, 0, sizeof ctl);
            msg.msg_control = ctl.buf;
            msg.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
            struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
            c->cmsg_level = SOL_SOCKET;
            c->cmsg_type = SCM_RIGHTS;
            c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
            memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
        }
        ssize_t r = sendmsg(sock, &msg, MSG_NOSIGNAL);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return ipc_errno("xseg_ipc_send", "sendmsg");
        }
        sent += (size_t)r;
    }
    return XSEG_SUCCESS;
}

/* Receive exactly @p len bytes; descriptors that come with them are appended to fds[*nfds..max).
 * More descriptors than room, a truncated control message, or a message longer than the bytes
 * still expected (MSG_TRUNC) is an error (all closed by the caller through fds and nfds; extras
 * closed here). */
static xseg_status ipc_recv_msg(int sock, void *buf, size_t len, int *fds, size_t *nfds, size_t max)
{
    union {
        char buf[CMSG_SPACE(IPC_FDS_PER_MSG * sizeof(int))];
        struct cmsghdr align;
    } ctl;
    size_t got = 0;
    while (got < len) {
        struct iovec iov = {(char *)buf + got, len - got};
        struct msghdr msg = {0};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = ctl.buf;
        msg.msg_controllen = sizeof ctl.buf;
        ssize_t r = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return ipc_errno("xseg_ipc_recv", "recvmsg");
        }
        bool extra = false;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                continue;
            size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            int tmp[IPC_FDS_PER_MSG + 8];
            k = XSEG_MIN(k, sizeof tmp / sizeof tmp[0]);
            memcpy(tmp, CMSG_DATA(c), k * sizeof(int));
            for (size_t i = 0; i < k; i++) {
                if (fds && *nfds < max)
                    fds[(*nfds)++] = tmp[i];
                else {
                    close(tmp[i]);
                    extra = true;
                }
            }
        }
        if (msg.msg_flags & MSG_CTRUNC)
            return err_set(XSEG_ERROR_INVALID_VALUE,
                           "xseg_ipc_recv: descriptors were lost in transit (MSG_CTRUNC: the process is out of "
                           "file descriptors?)");
        /* A message (seqpacket, datagram) longer than what is expected next: the kernel dropped
         * its rest, so waiting for those bytes would wait for ever. */
        if (msg.msg_flags & MSG_TRUNC)
            return err_set(XSEG_ERROR_INVALID_VALUE,
                           "xseg_ipc_recv: a message was longer than the %zu bytes the handle's wire format has "
                           "next (MSG_TRUNC: its rest was dropped); the peer did not send with xseg_ipc_send, or "
                           "not an xseg IPC handle", len - got);
        if (extra)
            return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_ipc_recv: more descriptors arrived than the handle has pages");
        if (r == 0)
            return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_ipc_recv: the socket was closed after %zu of %zu bytes",
                           got, len);
        got += (size_t)r;
    }
    return XSEG_SUCCESS;
}

/* Send the chunk sizes of @p h in batches (after the header). */
static xseg_status ipc_send_sizes(int sock, const xseg_ipc_handle *h)
{
    xseg_status st = XSEG_SUCCESS;
    for (size_t i = 0; st == XSEG_SUCCESS && i < h->nchunks; i += IPC_FDS_PER_MSG)
        st = ipc_send_msg(sock, h->sizes + i, XSEG_MIN(h->nchunks - i, (size_t)IPC_FDS_PER_MSG) * sizeof *h->sizes,
                          NULL, 0);
    return st;
}

xseg_status ipc_send(int sock, const xseg_ipc_handle *h)
{
    struct ipc_wire w;
    ipc_wire_fill(h, &w);
    size_t n = h->nchunks;
    if (h->type == XSEG_IPC_FABRIC) {
        xseg_status st = ipc_send_msg(sock, &w, sizeof w, NULL, 0);
        if (st == XSEG_SUCCESS)
            st = ipc_send_sizes(sock, h);
        for (size_t i = 0; st == XSEG_SUCCESS && i < n; i += IPC_FDS_PER_MSG)
            st = ipc_send_msg(sock, h->fabric + i * IPC_FABRIC_BYTES,
                              XSEG_MIN(n - i, (size_t)IPC_FDS_PER_MSG) * IPC_FABRIC_BYTES, NULL, 0);
        return st;
    }
    for (size_t i = 0; i < n; i++)
        if (h->fds[i] < 0)
            return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_ipc_send: chunk %zu's descriptor is closed", i);
    const char more = 'F';
    xseg_status st = ipc_send_msg(sock, &w, sizeof w, h->fds, XSEG_MIN(n, (size_t)IPC_FDS_PER_MSG));
    if (st == XSEG_SUCCESS)
        st = ipc_send_sizes(sock, h);
    for (size_t i = IPC_FDS_PER_MSG; st == XSEG_SUCCESS && i < n; i += IPC_FDS_PER_MSG)
        st = ipc_send_msg(sock, &more, 1, h->fds + i, XSEG_MIN(n - i, (size_t)IPC_FDS_PER_MSG));
    return st;
}

xseg_status ipc_recv(int sock, xseg_ipc_handle **out)
{
    struct ipc_wire w;
    int first[IPC_FDS_PER_MSG];
    size_t nfirst = 0;
    xseg_status st = ipc_recv_msg(sock, &w, sizeof w, first, &nfirst, IPC_FDS_PER_MSG);
    xseg_ipc_handle *h = NULL;
    if (st == XSEG_SUCCESS)
        st = ipc_wire_parse(&w, "xseg_ipc_recv", &h);
    if (st != XSEG_SUCCESS) {
        for (size_t i = 0; i < nfirst; i++)
            close(first[i]);
        return st;
    }
    size_t n = h->nchunks;
    /* The descriptors of the header message belong to the handle from here (freed with it). */
    if (h->type == XSEG_IPC_POSIX_FD) {
        size_t have = 0;
        for (size_t i = 0; i < nfirst; i++) {
            if (have < n)
                h->fds[have++] = first[i];
            else
                close(first[i]);
        }
        if (nfirst != XSEG_MIN(n, (size_t)IPC_FDS_PER_MSG))
            st = err_set(XSEG_ERROR_INVALID_VALUE, "xseg_ipc_recv: %zu descriptors came with the header, expected %zu",
                         nfirst, XSEG_MIN(n, (size_t)IPC_FDS_PER_MSG));
    } else if (nfirst) {
        for (size_t i = 0; i < nfirst; i++)
            close(first[i]);
        st = err_set(XSEG_ERROR_INVALID_VALUE, "xseg_ipc_recv: descriptors came with a fabric handle");
    }
    for (size_t i = 0; st == XSEG_SUCCESS && i < n; i += IPC_FDS_PER_MSG)
        st = ipc_recv_msg(sock, h->sizes + i, XSEG_MIN(n - i, (size_t)IPC_FDS_PER_MSG) * sizeof *h->sizes, NULL,
                          NULL, 0);
    if (st == XSEG_SUCCESS)
        st = ipc_check_layout(n, h->sizes, h->offset, h->size, "xseg_ipc_recv");
    if (h->type == XSEG_IPC_FABRIC) {
        for (size_t i = 0; st == XSEG_SUCCESS && i < n; i += IPC_FDS_PER_MSG)
            st = ipc_recv_msg(sock, h->fabric + i * IPC_FABRIC_BYTES,
                              XSEG_MIN(n - i, (size_t)IPC_FDS_PER_MSG) * IPC_FABRIC_BYTES, NULL, NULL, 0);
    } else {
        size_t have = XSEG_MIN(n, (size_t)IPC_FDS_PER_MSG);
        for (size_t i = IPC_FDS_PER_MSG; st == XSEG_SUCCESS && i < n; i += IPC_FDS_PER_MSG) {
            char more;
            size_t before = have;
            st = ipc_recv_msg(sock, &more, 1, h->fds, &have, XSEG_MIN(n, i + IPC_FDS_PER_MSG));
            if (st == XSEG_SUCCESS && (more != 'F' || have - before != XSEG_MIN(n - i, (size_t)IPC_FDS_PER_MSG)))
                st = err_set(XSEG_ERROR_INVALID_VALUE, "xseg_ipc_recv: the batch at chunk %zu is malformed", i);
        }
    }
    if (st != XSEG_SUCCESS) {
        ipc_handle_free(h); /* closes every descriptor received */
        return st;
    }
    *out = h;
    return XSEG_SUCCESS;
}

xseg_status ipc_serialize(const xseg_ipc_handle *h, void *buf, size_t size, size_t *len)
{
    if (h->type != XSEG_IPC_FABRIC)
        return err_set(XSEG_ERROR_NOT_SUPPORTED,
                       "xseg_ipc_serialize: a POSIX file-descriptor handle has no flat form (descriptors only "
                       "travel over a unix socket: use xseg_ipc_send)");
    size_t nsz = h->nchunks * sizeof *h->sizes;
    size_t need = sizeof(struct ipc_wire) + nsz + h->nchunks * IPC_FABRIC_BYTES;
    if (len)
        *len = need;
    if (size < need)
        return XSEG_SUCCESS;
    struct ipc_wire w;
    ipc_wire_fill(h, &w);
    memcpy(buf, &w, sizeof w);
    memcpy((char *)buf + sizeof w, h->sizes, nsz);
    memcpy((char *)buf + sizeof w + nsz, h->fabric, h->nchunks * IPC_FABRIC_BYTES);
    return XSEG_SUCCESS;
}

xseg_status ipc_deserialize(const void *buf, size_t len, xseg_ipc_handle **out)
{
    struct ipc_wire w;
    if (len < sizeof w)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_ipc_deserialize: %zu bytes is shorter than the header (%zu)",
                       len, sizeof w);
    memcpy(&w, buf, sizeof w);
    if (w.type == XSEG_IPC_POSIX_FD)
        return err_set(XSEG_ERROR_INVALID_VALUE,
                       "xseg_ipc_deserialize: a POSIX file-descriptor handle has no flat form");
    xseg_ipc_handle *h = NULL;
    xseg_status st = ipc_wire_parse(&w, "xseg_ipc_deserialize", &h);
    if (st != XSEG_SUCCESS)
        return st;
    size_t nsz = h->nchunks * sizeof *h->sizes;
    size_t want = sizeof w + nsz + h->nchunks * IPC_FABRIC_BYTES;
    if (len != want) {
        ipc_handle_free(h);
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_ipc_deserialize: %zu bytes, expected %zu", len, want);
    }
    memcpy(h->sizes, (const char *)buf + sizeof w, nsz);
    st = ipc_check_layout(h->nchunks, h->sizes, h->offset, h->size, "xseg_ipc_deserialize");
    if (st != XSEG_SUCCESS) {
        ipc_handle_free(h);
        return st;
    }
    memcpy(h->fabric, (const char *)buf + sizeof w + nsz, h->nchunks * IPC_FABRIC_BYTES);
    *out = h;
    return XSEG_SUCCESS;
}
