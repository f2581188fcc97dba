/*
 * cudaemu's live-state call is ABI-safe (cudaemu/cudaemu.h, "ABI rule"): a program built against
 * an older, shorter struct cudaemu_live never has memory written past its struct.
 *
 * The "old" callers here declare their struct themselves, as their headers did, and reach the
 * calls through dlsym on $XSEG_LIBCUDA (cudaemu; the test skips with 77 on anything else), so
 * this file does not include cudaemu.h: it is a binary caller, whatever the header says now. Guard
 * bytes follow each struct and must come back intact; the heap copies are exactly the old size,
 * so the ASan build reports any overflow as well.
 */
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GUARD 0xA5
#define NGUARD 64

static int failures;
#define CHECK(cond)                                                                               \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);              \
            failures++;                                                                           \
        }                                                                                         \
    } while (0)

/* The layout installed before the size field (cudaemu.h before this change): 16 words. */
struct live_before_size {
    size_t handles, mapped_bytes, reservations, reserved_bytes, allocs, used_bytes[8], events, graphs;
};
/* The smallest layout ever installed: 12 words. */
struct live_oldest {
    size_t handles, mapped_bytes, reservations, allocs, used_bytes[8];
};
/* A caller of the size-field call built against a header that had only two counts. */
struct live_sized_short {
    size_t size, handles, mapped_bytes;
};
/* A caller built against a much later header than this cudaemu's. */
struct live_sized_long {
    size_t size, counts[64];
};

static int guard_intact(const unsigned char *g, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (g[i] != GUARD)
            return 0;
    return 1;
}

int main(void)
{
    const char *path = getenv("XSEG_LIBCUDA");
    void *lib = path && *path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
    int (*query)(void *) = lib ? (int (*)(void *))dlsym(lib, "cudaemu_live_query") : NULL;
    void (*legacy)(void *) = lib ? (void (*)(void *))dlsym(lib, "cudaemu_live_get") : NULL;
    if (!lib || !dlsym(lib, "cudaemu_stream_hold")) {
        printf("skipped: $XSEG_LIBCUDA is not cudaemu\n");
        return 77;
    }
    CHECK(legacy != NULL); /* still exported for programs built before the size field */
    if (legacy) {
        /* On the stack with guard bytes after it, in one object so the layout is fixed. */
        struct {
            struct live_before_size live;
            unsigned char guard[NGUARD];
        } s;
        memset(&s, GUARD, sizeof s);
        legacy(&s.live);
        CHECK(guard_intact(s.guard, NGUARD));
        CHECK(s.live.handles == 0 && s.live.allocs == 0); /* nothing live: no cuInit here */
        struct {
            struct live_oldest live;
            unsigned char guard[NGUARD];
        } o;
        memset(&o, GUARD, sizeof o);
        legacy(&o.live);
        CHECK(guard_intact(o.guard, NGUARD));
        /* Exactly the old size on the heap: ASan sees a write past it. */
        struct live_oldest *h = malloc(sizeof *h);
        legacy(h);
        free(h);
        legacy(NULL);
    }
    CHECK(query != NULL);
    if (query) {
        struct {
            struct live_sized_short live;
            unsigned char guard[NGUARD];
        } s;
        memset(&s, GUARD, sizeof s);
        s.live.size = sizeof s.live;
        CHECK(query(&s.live) == 0);
        CHECK(s.live.size == sizeof s.live);
        CHECK(s.live.handles == 0 && s.live.mapped_bytes == 0);
        CHECK(guard_intact(s.guard, NGUARD));
        struct live_sized_short *h = malloc(sizeof *h);
        h->size = sizeof *h;
        CHECK(query(h) == 0);
        free(h);
        /* A newer caller: this cudaemu fills its own struct and says so; the rest is untouched. */
        struct live_sized_long l;
        memset(&l, GUARD, sizeof l);
        l.size = sizeof l;
        CHECK(query(&l) == 0);
        /* At least the 17 words installed with the size field, whole words, not past the struct. */
        CHECK(l.size >= 17 * sizeof(size_t) && l.size < sizeof l && l.size % sizeof(size_t) == 0);
        if (l.size < sizeof l)
            CHECK(guard_intact((const unsigned char *)&l + l.size, sizeof l - l.size));
        /* Too small for even the size field, and NULL: refused, nothing written. */
        struct live_sized_short z;
        memset(&z, GUARD, sizeof z);
        z.size = 4;
        CHECK(query(&z) == -1);
        CHECK(z.size == 4 && guard_intact((const unsigned char *)&z.handles, sizeof z - sizeof z.size));
        CHECK(query(NULL) == -1);
    }
    if (failures)
        fprintf(stderr, "%d check(s) failed\n", failures);
    else
        printf("ok\n");
    return failures ? 1 : 0;
}
