/* Pages that outlive their contents (base/pages.h). */
#include "base/pages.h"

#include <sys/mman.h>

#if defined(__SANITIZE_ADDRESS__)
#define PAGES_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PAGES_LSAN 1
#endif
#endif
#ifdef PAGES_LSAN
#include <sanitizer/lsan_interface.h>
#endif

void *pages_map(size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
#ifdef PAGES_LSAN
    /* Heap blocks referenced only from the struct kept here are not leaks. */
    __lsan_register_root_region(p, bytes);
#endif
    return p;
}

void pages_discard(void *p, size_t bytes)
{
    /* Private anonymous pages: MADV_DONTNEED frees them, and the next touch reads zeros. */
    (void)madvise(p, bytes, MADV_DONTNEED);
}
