/* The stale-access debug mode: quarantine, pattern, checks and findings (quarantine.h). */
#include "core/device/quarantine.h"
#include "core/device/blockops.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "base/hostmem.h"
#include "base/vec.h"
#include "core/process/settings.h"
#include "vmm/host.h"
#include "vmm/segment.h"
#include "vmm/stream.h"

#define QUAR_POISON 0xFFu               /* all-ones bytes: NaN in fp32, fp16 and bf16 */
#define QUAR_CHECK_CHUNK ((size_t)1 << 20) /* bytes read back a copy */
#define QUAR_FRAME_TEXT 256             /* a C frame's symbol text (hist_frame_info) */

/* Is a capture underway, or does @p stream capture (then no driver call may be queued on it)? */
static bool capturing(struct dev_alloc *d, CUstream stream)
{
    if (cap_underway(d))
        return true;
    xseg_status st;
    bool c = dev_stream_capturing(d, stream, &st);
    return c || st != XSEG_SUCCESS;
}

/* The ranges of @p it that hold the pattern, as (offset, length): the bytes before a canary
 * span, one page of it (every granule of the span maps that page), the bytes after. */
static int ranges(const struct dev_alloc *d, const struct quar_item *it, size_t off[3], size_t len[3])
{
    if (it->swap_lo == it->swap_hi) {
        off[0] = 0;
        len[0] = it->size;
        return 1;
    }
    off[0] = 0, len[0] = it->swap_lo;
    off[1] = it->swap_lo, len[1] = d->info.granularity;
    off[2] = it->swap_hi, len[2] = it->size - it->swap_hi;
    return 3;
}

/* Queue the pattern over @p it's bytes on its stream (after everything queued there before). */
static void fill(struct dev_alloc *d, struct quar_item *it)
{
    if (drv_ctx_ensure(d->info.primary_ctx) != XSEG_SUCCESS)
        return;
    size_t off[3], len[3];
    int n = ranges(d, it, off, len);
    for (int i = 0; i < n; i++)
        if (len[i] && vhost_fill((CUdeviceptr)(it->addr + off[i]), (unsigned char)QUAR_POISON, len[i], it->stream) !=
                          XSEG_SUCCESS)
            return;
    it->filled = true;
    d->quar.unfilled -= 1;
}

/* Swap the whole chunks inside expandable block @p b for a canary page (vmm/segment.h), so that
 * its fill and its check touch one page there: not for a segment whose handles were handed out
 * (importers map them) or under expandable_segments_defrag (it re-backs pages of blocks in use). */
static void swap(struct dev_alloc *d, struct block *b, struct quar_item *it)
{
    if (!b->expandable || b->seg->handles_out || d->cfg.expandable_segments_defrag)
        return;
    struct seg *vs = b->seg->vseg;
    size_t g = d->info.granularity, base = (size_t)seg_base(vs);
    size_t lo = (b->addr - base + g - 1) / g * g, hi = (b->addr + b->size - base) / g * g;
    size_t f, e;
    if (hi > lo && seg_canary_swap(vs, lo, hi - lo, &f, &e) == XSEG_SUCCESS && e > f) {
        it->swap_lo = base + f - b->addr;
        it->swap_hi = base + e - b->addr;
    }
}

/* The first byte of @p p[0, n) that is not the pattern, or n. */
static size_t first_changed(const unsigned char *p, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        if (w != UINT64_MAX)
            break;
    }
    for (; i < n; i++)
        if (p[i] != QUAR_POISON)
            return i;
    return n;
}

/* Read @p it back on its stream (after its fill and whatever else was queued there): the first
 * changed offset in *@p off (it->size: none). */
static xseg_status read_back(struct dev_alloc *d, const struct quar_item *it, unsigned char *buf, size_t *off)
{
    *off = it->size;
    xseg_status st = drv_ctx_ensure(d->info.primary_ctx);
    if (st != XSEG_SUCCESS)
        return st;
    size_t ro[3], rl[3];
    int n = ranges(d, it, ro, rl);
    for (int i = 0; i < n; i++)
        for (size_t at = ro[i]; at < ro[i] + rl[i]; at += QUAR_CHECK_CHUNK) {
            size_t len = ro[i] + rl[i] - at < QUAR_CHECK_CHUNK ? ro[i] + rl[i] - at : QUAR_CHECK_CHUNK;
            st = vhost_copy_dtoh(buf, (CUdeviceptr)(it->addr + at), len, it->stream);
            if (st == XSEG_SUCCESS)
                st = vstream_wait(it->stream, "debug_stale_access: reading a quarantined block back");
            if (st != XSEG_SUCCESS)
                return st;
            size_t f = first_changed(buf, len);
            if (f < len) {
                *off = at + f; /* in the canary page: the offset in the first page of the span */
                return XSEG_SUCCESS;
            }
        }
    return XSEG_SUCCESS;
}

/* A finding from @p it (its stacks referenced again: the finding outlives the item). */
static void add_finding(struct dev_alloc *d, const struct quar_item *it, size_t off, const char *when)
{
    if (d->quar.nfound >= QUAR_MAX_FINDINGS ||
        !VEC_RESERVE(d->quar.found, d->quar.capfound, d->quar.nfound + 1)) {
        d->quar.dropped++;
        return;
    }
    struct quar_item f = *it;
    f.b = NULL;
    f.first_offset = off;
    f.found_us = hist_now_us();
    f.when = when;
    f.delivered = false;
    hist_stack_ref(f.alloc_stack);
    hist_stack_ref(f.free_stack);
    d->quar.found[d->quar.nfound++] = f;
}

/* Check @p it once (filled and not reported yet). Returns 1 on a finding, 0 otherwise; *st: a
 * driver failure (the block stays unreported). */
static int check_item(struct dev_alloc *d, struct quar_item *it, unsigned char *buf, const char *when,
                      xseg_status *st)
{
    if (!it->filled || it->reported)
        return 0;
    size_t off;
    xseg_status s = read_back(d, it, buf, &off);
    d->quar.checked++;
    if (s != XSEG_SUCCESS) {
        if (*st == XSEG_SUCCESS)
            *st = s;
        return 0;
    }
    if (off >= it->size)
        return 0;
    it->reported = true;
    add_finding(d, it, off, when);
    return 1;
}

/* The oldest block leaves: checked (with @p buf, NULL: not checked), then back to its pool. */
static void leave_oldest(struct dev_alloc *d, unsigned char *buf, xseg_status *st)
{
    struct quar_item *it = &d->quar.q[d->quar.head];
    if (buf)
        (void)check_item(d, it, buf, "quarantine exit", st);
    struct block *b = it->b;
    if (it->swap_lo != it->swap_hi) { /* the chunks' own handles back under the block */
        size_t at = b->addr - (size_t)seg_base(b->seg->vseg);
        seg_canary_restore(b->seg->vseg, at + it->swap_lo, at + it->swap_hi);
    }
    struct block_side *sd = block_side(b);
    xseg_assert(sd && sd->event_count == 1);
    sd->event_count = 0;
    if (!it->filled)
        d->quar.unfilled -= 1;
    d->quar.bytes -= it->size;
    hist_stack_unref(it->alloc_stack);
    hist_stack_unref(it->free_stack);
    d->quar.head++;
    if (--d->quar.n == 0)
        d->quar.head = 0;
    dev_pending_add(d, b, -1);
    dev_free_block(d, b);
}

/* Fill what was freed during a capture (now over). */
static void fill_pending(struct dev_alloc *d)
{
    for (size_t i = 0; i < d->quar.n && d->quar.unfilled; i++) {
        struct quar_item *it = &d->quar.q[d->quar.head + i];
        if (!it->filled && !capturing(d, it->stream))
            fill(d, it);
    }
}

/* Keep the bound: the oldest leave while the bytes pass it (never during a capture). */
static xseg_status trim(struct dev_alloc *d, size_t bound)
{
    if ((d->quar.bytes <= bound && d->quar.n <= QUAR_MAX_BLOCKS) || cap_underway(d))
        return XSEG_SUCCESS;
    xseg_status st = XSEG_SUCCESS;
    unsigned char *buf = xs_malloc(QUAR_CHECK_CHUNK);
    while (d->quar.n && (d->quar.bytes > bound || d->quar.n > QUAR_MAX_BLOCKS))
        leave_oldest(d, buf, &st); /* without a buffer (host OOM) it leaves unchecked */
    xs_free(buf);
    return st;
}

void quar_keep_free_stack(struct dev_alloc *d, struct block *b)
{
    lock_assert_held(&d->lock);
    struct block_side *sd = block_side(b);
    if (!sd || !d->quar.free_stack || b->private_pool) /* a private pool's block is not quarantined */
        return;
    hist_stack_unref(sd->free_stack);
    sd->free_stack = d->quar.free_stack;
    d->quar.free_stack = NULL;
}

bool quar_enter(struct dev_alloc *d, struct block *b, bool pending)
{
    lock_assert_held(&d->lock);
    /* The stack of a free that waited for events travels in the side struct (quar_keep_free_stack). */
    struct hstack *waited = NULL;
    if (b->sided && b->u.side->free_stack) {
        waited = b->u.side->free_stack;
        b->u.side->free_stack = NULL;
    }
    bool fits = d->cfg.debug_stale_access && !b->private_pool && b->size <= d->cfg.debug_quarantine;
    if (fits && d->quar.head + d->quar.n == d->quar.cap && d->quar.head) {
        memmove(d->quar.q, d->quar.q + d->quar.head, d->quar.n * sizeof *d->quar.q);
        d->quar.head = 0;
    }
    struct block_side *sd = NULL;
    if (!fits || !VEC_RESERVE(d->quar.q, d->quar.cap, d->quar.n + 1) || !(sd = block_side_get(b))) {
        hist_stack_unref(waited);
        return false;
    }
    xseg_assert(sd->event_count == 0 && sd->uses.n == 0);
    sd->event_count = 1; /* the quarantine's hold: no merge takes it, dev_check counts it pending */
    if (!pending)
        dev_pending_add(d, b, 1);
    struct quar_item it = {
        .b = b,
        .addr = b->addr,
        .size = b->size,
        .requested = sd->requested_size,
        .stream = b->stream,
        .pool = b->small_pool ? XSEG_STAT_SMALL_POOL : XSEG_STAT_LARGE_POOL,
        .expandable = b->expandable,
        .alloc_stack = sd->hist_stack,
        .free_stack = waited ? waited : d->quar.free_stack,
        .freed_us = hist_now_us(),
    };
    hist_stack_ref(it.alloc_stack);
    if (!waited)
        d->quar.free_stack = NULL; /* the entry took the free's reference */
    d->quar.unfilled++;
    bool cap = capturing(d, b->stream);
    if (!cap) {
        swap(d, b, &it);
        fill(d, &it);
    }
    d->quar.q[d->quar.head + d->quar.n++] = it;
    d->quar.bytes += it.size;
    d->quar.entered++;
    if (!cap) {
        if (d->quar.unfilled)
            fill_pending(d);
        (void)trim(d, d->cfg.debug_quarantine); /* a failed check leaves the block unreported */
    }
    return true;
}

void quar_begin_free(struct dev_alloc *d, struct hstack *free_stack)
{
    lock_assert_held(&d->lock);
    hist_stack_unref(d->quar.free_stack);
    d->quar.free_stack = free_stack;
}

void quar_end_free(struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    hist_stack_unref(d->quar.free_stack);
    d->quar.free_stack = NULL;
}

xseg_status quar_check_all(struct dev_alloc *d, const char *when, bool drain, size_t *found)
{
    lock_assert_held(&d->lock);
    if (found)
        *found = 0;
    if (dev_capture_underway(d))
        return err_set(XSEG_ERROR_ILLEGAL_STATE,
                       "%s: a capture is underway on device %d: quarantined blocks are checked once it ends "
                       "(a check would synchronize the captured streams)",
                       when, d->device);
    if (!d->quar.n)
        return XSEG_SUCCESS;
    if (d->quar.unfilled)
        fill_pending(d);
    unsigned char *buf = xs_malloc(QUAR_CHECK_CHUNK);
    if (!buf)
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "%s: no host memory to read quarantined blocks back", when);
    xseg_status st = XSEG_SUCCESS;
    size_t n = 0;
    for (size_t i = 0; i < d->quar.n; i++)
        n += (size_t)check_item(d, &d->quar.q[d->quar.head + i], buf, when, &st);
    xs_free(buf);
    if (found)
        *found = n;
    xseg_status st2 = trim(d, drain || !d->cfg.debug_stale_access ? 0 : d->cfg.debug_quarantine);
    return st != XSEG_SUCCESS ? st : st2;
}

size_t quar_count(const struct dev_alloc *d, size_t *bytes)
{
    if (bytes)
        *bytes = d->quar.bytes;
    return d->quar.n;
}

void quar_take(struct dev_alloc *d, struct quar_batch *out)
{
    lock_assert_held(&d->lock);
    *out = (struct quar_batch){d->device, NULL, 0};
    size_t n = d->quar.nfound - d->quar.ndelivered;
    if (!n)
        return;
    out->v = xs_malloc(n * sizeof *out->v);
    if (!out->v)
        return; /* kept undelivered: the next operation tries again */
    for (size_t i = 0; i < n; i++) {
        struct quar_item *f = &d->quar.found[d->quar.ndelivered + i];
        f->delivered = true;
        out->v[i] = *f;
        hist_stack_ref(f->alloc_stack);
        hist_stack_ref(f->free_stack);
    }
    out->n = n;
    d->quar.ndelivered += n;
}

/* @p s's frames into @p fr (at most @p max) with their text in @p text (QUAR_FRAME_TEXT each). */
static int frames_of(const struct hstack *s, xseg_frame *fr, char *text, int max)
{
    int n = 0;
    for (uint32_t i = 0; s && i < s->n && n < max; i++, n++) {
        const char *file, *name;
        int line;
        hist_frame_info(s->f[i], text + (size_t)n * QUAR_FRAME_TEXT, QUAR_FRAME_TEXT, &file, &name, &line);
        fr[n] = (xseg_frame){file, name, line};
    }
    return n;
}

/* Append @p fmt to @p buf (@p size, *@p len used), truncating. */
static void put(char *buf, size_t size, size_t *len, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void put(char *buf, size_t size, size_t *len, const char *fmt, ...)
{
    if (*len + 1 >= size)
        return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(buf + *len, size - *len, fmt, ap);
    va_end(ap);
    if (k > 0)
        *len = *len + (size_t)k < size ? *len + (size_t)k : size - 1;
}

static void put_frames(char *buf, size_t size, size_t *len, const char *what, const xseg_frame *fr, int n)
{
    put(buf, size, len, "  %s:%s\n", what, n ? "" : " (no frames recorded: history was off or kept no stack)");
    for (int i = 0; i < n; i++)
        put(buf, size, len, "    %s (%s:%d)\n", fr[i].name ? fr[i].name : "??", fr[i].filename ? fr[i].filename : "??",
            fr[i].line);
}

void quar_deliver(struct quar_batch *b)
{
    enum { MAXF = 256, MSG = 1 << 15 };
    xseg_frame *fa = xs_malloc(2 * MAXF * sizeof *fa);
    char *text = xs_malloc((size_t)2 * MAXF * QUAR_FRAME_TEXT);
    char *msg = xs_malloc(MSG);
    for (size_t i = 0; i < b->n; i++) {
        const struct quar_item *f = &b->v[i];
        int na = 0, nf = 0;
        if (fa && text) {
            na = frames_of(f->alloc_stack, fa, text, MAXF);
            nf = frames_of(f->free_stack, fa + MAXF, text + (size_t)MAXF * QUAR_FRAME_TEXT, MAXF);
        }
        size_t len = 0;
        const char *pool = f->pool == XSEG_STAT_SMALL_POOL ? "small" : "large";
        if (msg) {
            msg[0] = 0;
            put(msg, MSG, &len,
                "xseg: stale access on device %d: block 0x%" PRIxPTR " (%zu bytes, %zu requested, stream %p, %s pool, "
                "%s segment) was written after its free: first changed byte at offset %zu (found at %s, %.3f s "
                "after the free)\n",
                b->device, f->addr, f->size, f->requested, (void *)f->stream, pool,
                f->expandable ? "expandable" : "classic", f->first_offset, f->when,
                (double)(f->found_us - f->freed_us) / 1e6);
            put_frames(msg, MSG, &len, "allocated at", fa, na);
            put_frames(msg, MSG, &len, "freed at", fa ? fa + MAXF : NULL, nf);
        }
        xseg_stale_report r = {
            .device = b->device,
            .addr = f->addr,
            .size = f->size,
            .requested = f->requested,
            .stream = f->stream,
            .pool = pool,
            .expandable = f->expandable,
            .first_offset = f->first_offset,
            .freed_us = f->freed_us,
            .found_us = f->found_us,
            .when = f->when,
            .alloc_frames = fa,
            .n_alloc_frames = na,
            .free_frames = fa ? fa + MAXF : NULL,
            .n_free_frames = nf,
            .message = msg ? msg : "xseg: stale access (no host memory to describe it)\n",
        };
        if (!settings_run_stale_observers(&r))
            fputs(r.message, stderr);
        hist_stack_unref(f->alloc_stack);
        hist_stack_unref(f->free_stack);
    }
    xs_free(fa);
    xs_free(text);
    xs_free(msg);
    xs_free(b->v);
    *b = (struct quar_batch){0};
}

void quar_destroy(struct dev_alloc *d)
{
    xseg_assert(!d->quar.n);
    for (size_t i = 0; i < d->quar.nfound; i++) {
        hist_stack_unref(d->quar.found[i].alloc_stack);
        hist_stack_unref(d->quar.found[i].free_stack);
    }
    hist_stack_unref(d->quar.free_stack);
    xs_free(d->quar.q);
    xs_free(d->quar.found);
    d->quar = (struct quar_state){0};
}
