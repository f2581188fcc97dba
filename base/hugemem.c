/* Huge-page-backed host tables (base/hugemem.h). */
#include "base/hugemem.h"

#include <stdint.h>
#include <sys/mman.h>

#include "base/assert.h"

void *hugemem_alloc(size_t bytes)
{
    xseg_assert(bytes && bytes % HUGEMEM_PAGE == 0);
#ifdef MADV_HUGEPAGE
    if (!bytes || bytes % HUGEMEM_PAGE || bytes > SIZE_MAX - HUGEMEM_PAGE)
        return NULL;
    /* mmap aligns to 4 KiB only: map one huge page more and cut the ends off. */
    size_t over = bytes + HUGEMEM_PAGE;
    char *raw = mmap(NULL, over, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return NULL;
    char *p = (char *)(((uintptr_t)raw + HUGEMEM_PAGE - 1) & ~(uintptr_t)(HUGEMEM_PAGE - 1));
    size_t head = (size_t)(p - raw), tail = over - head - bytes;
    /* Cutting a mapping can fail (the process's map count); the whole of it goes back then. */
    if ((head && munmap(raw, head) != 0) || (tail && munmap(p + bytes, tail) != 0) ||
        madvise(p, bytes, MADV_HUGEPAGE) != 0) {
        munmap(raw, over); /* unmapping a range with holes in it is fine */
        return NULL;
    }
    return p;
#else
    (void)bytes;
    return NULL;
#endif
}

void hugemem_free(void *p, size_t bytes)
{
    if (p)
        munmap(p, bytes);
}
