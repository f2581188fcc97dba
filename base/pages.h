/*
 * Whole anonymous pages for a struct whose address must stay readable after its contents are
 * given back: a device's allocator state (core/device/device.h), to which another thread's cached
 * pointer (core/device/fast.h, fast_tls.slot) may still point after xseg_shutdown. pages_discard
 * returns the pages to the kernel (they read as zeros again, resident only once touched) and
 * keeps the address range for the struct's next use.
 */
#ifndef XSEG_BASE_PAGES_H
#define XSEG_BASE_PAGES_H

#include <stddef.h>

/* @p bytes of zeroed memory, page-aligned, readable and writable; NULL when the kernel gives no
 * mapping (the caller reports the host out of memory). Never unmapped. */
void *pages_map(size_t bytes);
/* Give the pages of [@p p, @p p + @p bytes) (a pages_map) back to the kernel: zeros from here. */
void pages_discard(void *p, size_t bytes);

#endif
