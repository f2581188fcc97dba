/*
 * Sharing blocks between processes and block handle lookup. The driver calls are in vmm/ipc.c;
 * this is the policy: which chunks a block exports, the handle's wire format, the table of
 * imports. Who hears about map/unmap is core/policy/observe.h.
 */
#ifndef XSEG_CORE_IPC_H
#define XSEG_CORE_IPC_H

#include <stdbool.h>

#include "core/device/device.h"

/* The definition of the public opaque handle. */
struct xseg_ipc_handle {
    xseg_ipc_handle_type type;
    int device;
    size_t size, offset; /* the block's size and its offset in the first chunk */
    size_t nchunks;
    uint64_t *sizes;       /* nchunks chunk sizes, in address order */
    int *fds;              /* XSEG_IPC_POSIX_FD: nchunks descriptors owned by the handle */
    unsigned char *fabric; /* XSEG_IPC_FABRIC: nchunks * IPC_FABRIC_BYTES */
};

/* More chunks than this in one handle is refused when received (a malformed or hostile header
 * must not make the receiver allocate without bound): 2^20 chunks is 2 TiB of 2 MiB chunks. */
#define IPC_MAX_CHUNKS ((size_t)1 << 20)

/* Export the live block at @p ptr if @p d owns it (*owned = false and nothing happens when not). */
xseg_status ipc_export_block(struct dev_alloc *d, void *ptr, xseg_ipc_handle **out, bool *owned);
/* The ranges under the live block at @p ptr (xseg_block_handles) if @p d owns it; with cap > 0 the
 * block takes one more hold (its side struct's handle_holds), which keeps its pool from sleeping. */
xseg_status ipc_block_handles(struct dev_alloc *d, void *ptr, xseg_phys_range *ranges, size_t cap, size_t *n,
                              bool *owned);
/* Drop one hold of the live block at @p ptr (xseg_block_handles_release) if @p d owns it. */
xseg_status ipc_block_handles_release(struct dev_alloc *d, void *ptr, bool *owned);
/* Map @p h on @p d's device and remember the import. */
xseg_status ipc_import(struct dev_alloc *d, const xseg_ipc_handle *h, void **ptr);
/* Unmap an import made by ipc_import. */
xseg_status ipc_close(void *ptr);
/* Close every open import (xseg_shutdown): the first close that fails stops it, with its error
 * (the rest stay open). */
xseg_status ipc_close_all(void);

xseg_status ipc_send(int sock, const xseg_ipc_handle *h);
xseg_status ipc_recv(int sock, xseg_ipc_handle **out);
xseg_status ipc_serialize(const xseg_ipc_handle *h, void *buf, size_t size, size_t *len);
xseg_status ipc_deserialize(const void *buf, size_t len, xseg_ipc_handle **out);
void ipc_handle_free(xseg_ipc_handle *h);

#endif
