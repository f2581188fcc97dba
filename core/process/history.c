/* Allocation history: the ring of events, shared stacks, interned callback frames (history.h). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unwind.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/fork.h"
#include "base/hostmem.h"
#include "core/process/history.h"
#include "base/witness.h"

#define HIST_DEFAULT_ENTRIES 100000
#define HIST_MAX_FRAMES 256

/* This module's state is xseg_rt.hist (core/process/procstate.h). */
FORK_MUTEX_AT(FORK_RANK_HISTORY, hist_lock, xseg_rt.hist.lock)

static const char *const action_names[HIST_NACTIONS] = {
    "alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
    "segment_map", "segment_unmap", "snapshot", "oom",
};

const char *hist_action_name(int action)
{
    return action >= 0 && action < HIST_NACTIONS ? action_names[action] : "unknown";
}

int64_t hist_now_us(void) { return clock_real_us(); }

static inline uint64_t mix64(uint64_t h, uint64_t v)
{
    h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdull;
    return h ^ (h >> 33);
}

static uint64_t hash_str(uint64_t h, const char *s)
{
    /* FNV-1a over the bytes, then mixed in. */
    uint64_t f = 0xcbf29ce484222325ull;
    for (; *s; s++)
        f = (f ^ (unsigned char)*s) * 0x100000001b3ull;
    return mix64(h, f);
}

/* ---- own text range ------------------------------------------------------------------------ */

struct self_find {
    uintptr_t base;
    uintptr_t lo, hi;
    bool found, is_main;
};

static int phdr_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    struct self_find *sf = arg;
    if ((uintptr_t)info->dlpi_addr != sf->base)
        return 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X)) {
            sf->lo = info->dlpi_addr + ph->p_vaddr;
            sf->hi = sf->lo + ph->p_memsz;
            sf->found = true;
        }
    }
    sf->is_main = !info->dlpi_name || !info->dlpi_name[0];
    return sf->found;
}

static void find_self(void)
{
    Dl_info di;
    xseg_rt.hist.self_known = true;
    if (!dladdr((void *)(uintptr_t)&find_self, &di) || !di.dli_fbase)
        return;
    struct self_find sf = {.base = (uintptr_t)di.dli_fbase};
    /* The main program shows dlpi_addr 0 when it is not position independent. */
    dl_iterate_phdr(phdr_cb, &sf);
    if (sf.found && !sf.is_main) {
        xseg_rt.hist.self_lo = sf.lo;
        xseg_rt.hist.self_hi = sf.hi;
    }
}

/* ---- stacks and frames (xseg_rt.hist.lock held) -------------------------------------------------- */

static bool table_grow(void ***buckets, size_t *nbuckets, size_t count, size_t chain_off, size_t hash_off)
{
    if (*nbuckets && count < *nbuckets)
        return true;
    size_t n = *nbuckets ? *nbuckets * 2 : 1024;
    void **nb = xs_calloc(n, sizeof *nb);
    if (!nb)
        return *nbuckets != 0; /* keep the old table: chains get longer, nothing breaks */
    for (size_t i = 0; i < *nbuckets; i++) {
        for (char *e = (*buckets)[i]; e;) {
            char *next = *(char **)(e + chain_off);
            uint64_t h = *(uint64_t *)(void *)(e + hash_off);
            *(void **)(e + chain_off) = nb[h & (n - 1)];
            nb[h & (n - 1)] = e;
            e = next;
        }
    }
    xs_free(*buckets);
    *buckets = nb;
    *nbuckets = n;
    return true;
}

static struct hframe *frame_intern(const xseg_frame *f)
{
    const char *fn = f->filename ? f->filename : "", *nm = f->name ? f->name : "";
    uint64_t h = mix64(hash_str(hash_str(0x51ed, fn), nm), (uint64_t)(int64_t)f->line);
    struct hist_state *hs = &xseg_rt.hist;
    if (!table_grow((void ***)&hs->frm_buckets, &hs->frm_nbuckets, hs->frm_count, offsetof(struct hframe, chain),
                    offsetof(struct hframe, hash)))
        return NULL;
    struct hframe **slot = &xseg_rt.hist.frm_buckets[h & (xseg_rt.hist.frm_nbuckets - 1)];
    for (struct hframe *e = *slot; e; e = e->chain)
        if (e->hash == h && e->line == f->line && !strcmp(e->filename, fn) && !strcmp(e->name, nm))
            return e;
    size_t lf = strlen(fn) + 1, ln = strlen(nm) + 1;
    struct hframe *e = xs_malloc(sizeof *e + lf + ln);
    if (!e)
        return NULL;
    char *s = (char *)(e + 1);
    memcpy(s, fn, lf);
    memcpy(s + lf, nm, ln);
    e->filename = s;
    e->name = s + lf;
    e->line = f->line;
    e->hash = h;
    e->chain = *slot;
    *slot = e;
    xseg_rt.hist.frm_count++;
    return e;
}

/* The stack with frames @p f[0..n), made or found, with one more reference; NULL on ENOMEM. */
static struct hstack *stack_intern(const uintptr_t *f, uint32_t n)
{
    uint64_t h = mix64(0x5eed, n);
    for (uint32_t i = 0; i < n; i++)
        h = mix64(h, f[i]);
    struct hist_state *hs = &xseg_rt.hist;
    if (!table_grow((void ***)&hs->stk_buckets, &hs->stk_nbuckets, hs->stk_count, offsetof(struct hstack, chain),
                    offsetof(struct hstack, hash)))
        return NULL;
    struct hstack **slot = &xseg_rt.hist.stk_buckets[h & (xseg_rt.hist.stk_nbuckets - 1)];
    for (struct hstack *e = *slot; e; e = e->chain) {
        if (e->hash == h && e->n == n && !memcmp(e->f, f, n * sizeof *f)) {
            e->refs++;
            return e;
        }
    }
    struct hstack *e = xs_malloc(sizeof *e + n * sizeof *f);
    if (!e)
        return NULL;
    e->hash = h;
    e->refs = 1;
    e->n = n;
    memcpy(e->f, f, n * sizeof *f);
    e->chain = *slot;
    *slot = e;
    xseg_rt.hist.stk_count++;
    return e;
}

static void stack_unref_locked(struct hstack *s)
{
    if (!s || --s->refs)
        return;
    struct hstack **p = &xseg_rt.hist.stk_buckets[s->hash & (xseg_rt.hist.stk_nbuckets - 1)];
    while (*p != s)
        p = &(*p)->chain;
    *p = s->chain;
    xseg_rt.hist.stk_count--;
    xs_free(s);
}

void hist_table_counts(size_t *stacks, size_t *frames)
{
    mutex_lock(&xseg_rt.hist.lock);
    *stacks = xseg_rt.hist.stk_count;
    *frames = xseg_rt.hist.frm_count;
    mutex_unlock(&xseg_rt.hist.lock);
}

void hist_stack_ref(struct hstack *s)
{
    if (!s)
        return;
    mutex_lock(&xseg_rt.hist.lock);
    s->refs++;
    mutex_unlock(&xseg_rt.hist.lock);
}

void hist_stack_unref(struct hstack *s)
{
    if (!s)
        return;
    mutex_lock(&xseg_rt.hist.lock);
    stack_unref_locked(s);
    mutex_unlock(&xseg_rt.hist.lock);
}

/* ---- C stacks ------------------------------------------------------------------------------

 * A DWARF unwind (glibc's backtrace, libgcc's _Unwind_Backtrace) looks each frame up in the unwind
 * tables: far too much per allocation. Programs allocate from a limited set of call chains, so each
 * thread keeps a small cache of the chains it walked, keyed by where the capture starts (its frame
 * address): an entry holds each frame's return address and the stack slot it was read from (the CFA
 * libgcc reports with it, - 8, on x86-64). A capture that finds an entry re-reads those slots (what
 * a recorded allocation costs: benchmarks/bench_history.c, docs/benchmarks-host.md#history); when
 * every slot still holds the address recorded, the chain is the same (the frames below are at the
 * same addresses, hold the same return addresses, and so compute the same CFAs), and the walk is
 * skipped. Any difference walks again and replaces the entry. The cache is per thread, so every
 * slot it reads lies in the reading thread's own stack.
 * libgcc_s is reached with dlopen/dlsym (glibc's backtrace loads it the same way), so libxseg
 * links nothing beyond libc, libpthread and libdl; without it, or off x86-64, backtrace() is used
 * with no cache. */

typedef _Unwind_Reason_Code (*uw_backtrace_fn)(_Unwind_Trace_Fn, void *);
typedef _Unwind_Ptr (*uw_getip_fn)(struct _Unwind_Context *);
typedef _Unwind_Word (*uw_getcfa_fn)(struct _Unwind_Context *);
static uw_backtrace_fn uw_backtrace;
static uw_getip_fn uw_getip;
static uw_getcfa_fn uw_getcfa;
static pthread_once_t uw_once = PTHREAD_ONCE_INIT;
static pthread_key_t cache_key;

#define SCACHE_WAYS 32

struct scache_entry {
    uintptr_t key;  /* the capture's frame address */
    int max;        /* frames walked for */
    int n;          /* frames walked */
    uintptr_t *pc;  /* [n] return addresses (pc[0] inside hist_capture) */
    uintptr_t *slot; /* [n] where return address pc[i] lies on the stack */
};
struct scache {
    struct scache_entry e[SCACHE_WAYS];
};

static void scache_free(void *p)
{
    struct scache *c = p;
    for (int i = 0; c && i < SCACHE_WAYS; i++)
        xs_free(c->e[i].pc);
    xs_free(c);
}

static void uw_find(void)
{
#if defined(__x86_64__)
    void *h = dlopen("libgcc_s.so.1", RTLD_NOW | RTLD_LOCAL); /* kept open: the process's */
    if (!h)
        return;
    uw_backtrace = (uw_backtrace_fn)(uintptr_t)dlsym(h, "_Unwind_Backtrace");
    uw_getip = (uw_getip_fn)(uintptr_t)dlsym(h, "_Unwind_GetIP");
    uw_getcfa = (uw_getcfa_fn)(uintptr_t)dlsym(h, "_Unwind_GetCFA");
    if (!uw_backtrace || !uw_getip || !uw_getcfa || pthread_key_create(&cache_key, scache_free) != 0)
        uw_backtrace = NULL;
#endif
}

static _Thread_local struct scache *tls_cache;

struct walk {
    uintptr_t *pc, *slot;
    int n, max;
};

static _Unwind_Reason_Code walk_cb(struct _Unwind_Context *ctx, void *arg)
{
    struct walk *w = arg;
    if (w->n >= w->max)
        return _URC_END_OF_STACK;
    uintptr_t ip = (uintptr_t)uw_getip(ctx);
    if (!ip)
        return _URC_END_OF_STACK;
    w->pc[w->n] = ip;
    w->slot[w->n] = (uintptr_t)uw_getcfa(ctx) - sizeof(uintptr_t); /* holds ip (x86-64) */
    w->n++;
    return _URC_NO_REASON;
}

/* The raw C stack into raw[0..): pc[0] inside the caller. Returns the count. */
static __attribute__((noinline)) int c_stack(uintptr_t *raw, int want)
{
    pthread_once(&uw_once, uw_find);
    if (!uw_backtrace) {
        void *b[HIST_MAX_FRAMES + 16];
        int got = backtrace(b, want + 1 > (int)(sizeof b / sizeof *b) ? (int)(sizeof b / sizeof *b) : want + 1);
        for (int i = 1; i < got; i++) /* b[0] is in this function */
            raw[i - 1] = (uintptr_t)b[i];
        return got > 0 ? got - 1 : 0;
    }
    uintptr_t key = (uintptr_t)__builtin_frame_address(0);
    struct scache *c = tls_cache;
    if (!c) {
        c = xs_calloc(1, sizeof *c);
        if (c && pthread_setspecific(cache_key, c) != 0) {
            xs_free(c);
            c = NULL;
        }
        tls_cache = c;
    }
    struct scache_entry *e = c ? &c->e[(key >> 4) % SCACHE_WAYS] : NULL;
    if (e && e->key == key && e->max == want && e->pc) {
        /* pc[0] is this function's own call site (its slot lies below our frame, reused by
         * calls): the same for every capture. */
        int i = 1;
        while (i < e->n && *(const uintptr_t *)e->slot[i] == e->pc[i])
            i++;
        if (i >= e->n) {
            memcpy(raw, e->pc, (size_t)e->n * sizeof *raw);
            return e->n;
        }
    }
    uintptr_t slot[HIST_MAX_FRAMES + 16];
    struct walk w = {raw, slot, 0, want};
    uw_backtrace(walk_cb, &w);
    if (e && w.n > 0) {
        if (!e->pc || e->max < want) {
            xs_free(e->pc);
            e->pc = xs_malloc(2 * (size_t)want * sizeof *e->pc);
            if (!e->pc) {
                e->key = 0;
                return w.n;
            }
        }
        e->slot = e->pc + want;
        memcpy(e->pc, raw, (size_t)w.n * sizeof *raw);
        memcpy(e->slot, slot, (size_t)w.n * sizeof *slot);
        e->key = key;
        e->max = want;
        e->n = w.n;
    }
    return w.n;
}

/* This thread is inside the frames callback: an allocation the callback makes gets no callback
 * frames (calling it again would recurse without end). */
static _Thread_local bool in_callback;

struct hstack *hist_capture(void)
{
    if (!atomic_load_explicit(&xseg_rt.hist.opt_stacks, memory_order_relaxed))
        return NULL;
    mutex_lock(&xseg_rt.hist.lock);
    int stacks = xseg_rt.hist.opt_stacks, max = xseg_rt.hist.opt_max_frames;
    xseg_stack_callback cb = xseg_rt.hist.opt_callback;
    void *user = xseg_rt.hist.opt_user;
    if (!xseg_rt.hist.self_known)
        find_self();
    mutex_unlock(&xseg_rt.hist.lock);
    if (!stacks || !hist_mode())
        return NULL;

    uintptr_t f[2 * HIST_MAX_FRAMES];
    uint32_t n = 0;
    if (stacks & XSEG_STACKS_C) {
        /* A few more than asked for: xseg's own frames at the top are left out. */
        uintptr_t raw[HIST_MAX_FRAMES + 16];
        int got = c_stack(raw, max + 8);
        int i = 1; /* raw[0] is in this function */
        while (i < got && xseg_rt.hist.self_hi && raw[i] >= xseg_rt.hist.self_lo && raw[i] < xseg_rt.hist.self_hi)
            i++;
        for (; i < got && n < (uint32_t)max; i++)
            f[n++] = raw[i];
    }
    xseg_frame cf[HIST_MAX_FRAMES];
    int nc = 0;
    if ((stacks & XSEG_STACKS_CALLBACK) && cb && !in_callback) {
        in_callback = true;
        nc = cb(cf, max, user);
        in_callback = false;
        if (nc < 0 || nc > max)
            nc = 0;
    }
    mutex_lock(&xseg_rt.hist.lock);
    for (int i = 0; i < nc; i++) {
        struct hframe *e = frame_intern(&cf[i]);
        if (e)
            f[n++] = HIST_FRAME_TAG | (uintptr_t)e;
    }
    struct hstack *s = stack_intern(f, n);
    mutex_unlock(&xseg_rt.hist.lock);
    return s;
}

/* ---- the ring ------------------------------------------------------------------------------ */

/* Append @p e (xseg_rt.hist.lock held), taking a reference on its stack. */
static void push_locked(const struct hist_event *e)
{
    if (!xseg_rt.hist.ring_cap)
        return;
    if (e->stack)
        e->stack->refs++;
    if (xseg_rt.hist.ring_count == xseg_rt.hist.ring_cap) {
        stack_unref_locked(xseg_rt.hist.ring[xseg_rt.hist.ring_head].stack);
        xseg_rt.hist.ring[xseg_rt.hist.ring_head] = *e;
        xseg_rt.hist.ring_head = xseg_rt.hist.ring_head + 1 == xseg_rt.hist.ring_cap ? 0 : xseg_rt.hist.ring_head + 1;
        xseg_rt.hist.ring_dropped++;
    } else {
        size_t i = xseg_rt.hist.ring_head + xseg_rt.hist.ring_count;
        xseg_rt.hist.ring[i >= xseg_rt.hist.ring_cap ? i - xseg_rt.hist.ring_cap : i] = *e;
        xseg_rt.hist.ring_count++;
    }
}

void hist_record(int action, int device, uint64_t addr, uint64_t size, uint64_t stream, struct hstack *stack)
{
    if (!(hist_mode() & HIST_TRACE))
        return;
    struct hist_event e = {addr, size, stream, hist_now_us(), stack, device, action};
    mutex_lock(&xseg_rt.hist.lock);
    push_locked(&e);
    mutex_unlock(&xseg_rt.hist.lock);
}

struct hstack *hist_on_malloc(int device, uint64_t addr, uint64_t size, uint64_t stream, struct hstack **s,
                              unsigned mode)
{
    struct hstack *keep = (mode & HIST_STATE) ? *s : NULL;
    if (!(mode & HIST_TRACE)) {
        if (keep)
            *s = NULL; /* the caller's reference is the block's now */
        return keep;
    }
    struct hist_event e = {addr, size, stream, hist_now_us(), *s, device, HIST_ALLOC};
    mutex_lock(&xseg_rt.hist.lock);
    push_locked(&e);
    mutex_unlock(&xseg_rt.hist.lock);
    if (keep)
        *s = NULL;
    return keep;
}

void hist_on_free(int device, uint64_t addr, uint64_t size, uint64_t stream, struct hstack *s, bool requested,
                  bool completed)
{
    bool trace = hist_mode() & HIST_TRACE;
    if (!trace && !(completed && s))
        return;
    struct hist_event e = {addr, size, stream, trace ? hist_now_us() : 0, s, device, HIST_FREE_REQUESTED};
    mutex_lock(&xseg_rt.hist.lock);
    if (trace && requested)
        push_locked(&e);
    if (trace && completed) {
        e.action = HIST_FREE_COMPLETED;
        push_locked(&e);
    }
    if (completed)
        stack_unref_locked(s);
    mutex_unlock(&xseg_rt.hist.lock);
}

xseg_status hist_events_copy(struct hist_event **out, size_t *n, uint64_t *dropped)
{
    mutex_lock(&xseg_rt.hist.lock);
    size_t cnt = xseg_rt.hist.ring_count;
    struct hist_event *ev = xs_malloc((cnt ? cnt : 1) * sizeof *ev);
    if (!ev) {
        mutex_unlock(&xseg_rt.hist.lock);
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory copying %zu history events", cnt);
    }
    for (size_t i = 0; i < cnt; i++) {
        ev[i] = xseg_rt.hist.ring[(xseg_rt.hist.ring_head + i) % xseg_rt.hist.ring_cap];
        if (ev[i].stack)
            ev[i].stack->refs++;
    }
    if (dropped)
        *dropped = xseg_rt.hist.ring_dropped;
    mutex_unlock(&xseg_rt.hist.lock);
    *out = ev;
    *n = cnt;
    return XSEG_SUCCESS;
}

void hist_events_free(struct hist_event *ev, size_t n)
{
    if (!ev)
        return;
    mutex_lock(&xseg_rt.hist.lock);
    for (size_t i = 0; i < n; i++)
        stack_unref_locked(ev[i].stack);
    mutex_unlock(&xseg_rt.hist.lock);
    xs_free(ev);
}

static void clear_locked(void)
{
    for (size_t i = 0; i < xseg_rt.hist.ring_count; i++)
        stack_unref_locked(xseg_rt.hist.ring[(xseg_rt.hist.ring_head + i) % xseg_rt.hist.ring_cap].stack);
    xseg_rt.hist.ring_head = xseg_rt.hist.ring_count = 0;
    xseg_rt.hist.ring_dropped = 0;
}

void hist_clear_events(void)
{
    mutex_lock(&xseg_rt.hist.lock);
    clear_locked();
    mutex_unlock(&xseg_rt.hist.lock);
}

void hist_shutdown(void)
{
    mutex_lock(&xseg_rt.hist.lock);
    atomic_store_explicit(&xseg_rt.hist.mode_word, 0, memory_order_relaxed);
    clear_locked();
    xs_free(xseg_rt.hist.ring);
    xseg_rt.hist.ring = NULL;
    xseg_rt.hist.ring_cap = 0;
    xseg_rt.hist.opt_stacks = 0;
    xseg_rt.hist.opt_max_frames = HIST_DEFAULT_FRAMES;
    xseg_rt.hist.opt_callback = NULL;
    xseg_rt.hist.opt_user = NULL;
    /* Stacks go with their last reference; the tables (and the frames stacks point to) once
     * none is left, which is the case once every device is empty. */
    if (xseg_rt.hist.stk_count == 0) {
        xs_free(xseg_rt.hist.stk_buckets);
        xseg_rt.hist.stk_buckets = NULL;
        xseg_rt.hist.stk_nbuckets = 0;
        for (size_t i = 0; i < xseg_rt.hist.frm_nbuckets; i++)
            for (struct hframe *e = xseg_rt.hist.frm_buckets[i], *next; e; e = next) {
                next = e->chain;
                xs_free(e);
            }
        xs_free(xseg_rt.hist.frm_buckets);
        xseg_rt.hist.frm_buckets = NULL;
        xseg_rt.hist.frm_nbuckets = xseg_rt.hist.frm_count = 0;
    }
    mutex_unlock(&xseg_rt.hist.lock);
    /* The calling thread's stack cache; another thread's goes when it exits (cache_key). */
    if (tls_cache) {
        (void)pthread_setspecific(cache_key, NULL);
        scache_free(tls_cache);
        tls_cache = NULL;
    }
}

/* Resize the ring to @p cap slots, keeping the newest events that fit. */
static xseg_status ring_resize_locked(size_t cap)
{
    if (cap == xseg_rt.hist.ring_cap)
        return XSEG_SUCCESS;
    struct hist_event *nr = xs_malloc(cap * sizeof *nr);
    if (!nr)
        return err_set(XSEG_ERROR_OUT_OF_MEMORY,
                       "xseg_record_memory_history: out of host memory for a ring of %zu events", cap);
    size_t keep = xseg_rt.hist.ring_count < cap ? xseg_rt.hist.ring_count : cap, skip = xseg_rt.hist.ring_count - keep;
    for (size_t i = 0; i < skip; i++)
        stack_unref_locked(xseg_rt.hist.ring[(xseg_rt.hist.ring_head + i) % xseg_rt.hist.ring_cap].stack);
    for (size_t i = 0; i < keep; i++)
        nr[i] = xseg_rt.hist.ring[(xseg_rt.hist.ring_head + skip + i) % xseg_rt.hist.ring_cap];
    xs_free(xseg_rt.hist.ring);
    xseg_rt.hist.ring = nr;
    xseg_rt.hist.ring_cap = cap;
    xseg_rt.hist.ring_head = 0;
    xseg_rt.hist.ring_count = keep;
    xseg_rt.hist.ring_dropped += skip;
    return XSEG_SUCCESS;
}

xseg_status hist_configure(const xseg_history_options *o)
{
    if (!o || !o->enabled) {
        mutex_lock(&xseg_rt.hist.lock);
        atomic_store_explicit(&xseg_rt.hist.mode_word, 0, memory_order_relaxed);
        if (o && o->clear)
            clear_locked();
        mutex_unlock(&xseg_rt.hist.lock);
        return XSEG_SUCCESS;
    }
    const char *f = "xseg_record_memory_history";
    unsigned mode;
    switch (o->record) {
    case XSEG_HISTORY_ALL: mode = HIST_STATE | HIST_TRACE; break;
    case XSEG_HISTORY_STATE: mode = HIST_STATE; break;
    case XSEG_HISTORY_TRACE: mode = HIST_TRACE; break;
    default:
        return err_set(XSEG_ERROR_INVALID_VALUE,
                       "%s: record is %d; use XSEG_HISTORY_ALL (0), XSEG_HISTORY_STATE (1) or XSEG_HISTORY_TRACE (2)",
                       f, (int)o->record);
    }
    if (o->stacks & ~(XSEG_STACKS_C | XSEG_STACKS_CALLBACK))
        return err_set(XSEG_ERROR_INVALID_VALUE,
                       "%s: stacks is 0x%x; use XSEG_STACKS_NONE or XSEG_STACKS_C and/or XSEG_STACKS_CALLBACK", f,
                       (unsigned)o->stacks);
    if ((o->stacks & XSEG_STACKS_CALLBACK) && !o->callback)
        return err_set(XSEG_ERROR_INVALID_VALUE, "%s: stacks has XSEG_STACKS_CALLBACK but callback is NULL", f);
    if (o->max_frames < 0 || o->max_frames > HIST_MAX_FRAMES)
        return err_set(XSEG_ERROR_INVALID_VALUE, "%s: max_frames is %d; use 0 (default %d) to %d", f, o->max_frames,
                       HIST_DEFAULT_FRAMES, HIST_MAX_FRAMES);
    size_t cap = o->max_entries ? o->max_entries : HIST_DEFAULT_ENTRIES;
    if (cap > ((size_t)1 << 40) / sizeof(struct hist_event))
        return err_set(XSEG_ERROR_INVALID_VALUE, "%s: max_entries %zu is too large", f, o->max_entries);
    mutex_lock(&xseg_rt.hist.lock);
    if (o->clear)
        clear_locked();
    xseg_status st = (mode & HIST_TRACE) ? ring_resize_locked(cap) : XSEG_SUCCESS;
    if (st == XSEG_SUCCESS) {
        xseg_rt.hist.opt_stacks = o->stacks;
        xseg_rt.hist.opt_max_frames = o->max_frames ? o->max_frames : HIST_DEFAULT_FRAMES;
        xseg_rt.hist.opt_callback = o->callback;
        xseg_rt.hist.opt_user = o->user;
        atomic_store_explicit(&xseg_rt.hist.mode_word, mode, memory_order_relaxed);
    }
    mutex_unlock(&xseg_rt.hist.lock);
    return st;
}

/* ---- symbolization ------------------------------------------------------------------------ */

typedef char *(*demangle_fn)(const char *, char *, size_t *, int *);
static demangle_fn demangle;
static pthread_once_t demangle_once = PTHREAD_ONCE_INIT;

/* __cxa_demangle is there when the process has libstdc++ loaded (e.g. under PyTorch); without
 * it C++ names stay mangled. */
static void demangle_find(void)
{
    demangle = (demangle_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "__cxa_demangle");
}

void hist_frame_info(uintptr_t f, char *buf, size_t size, const char **filename, const char **name, int *line)
{
    if (f & HIST_FRAME_TAG) {
        const struct hframe *e = (const struct hframe *)(f & ~HIST_FRAME_TAG);
        *filename = e->filename;
        *name = e->name;
        *line = e->line;
        return;
    }
    /* A return address: look up the call instruction just before it. */
    pthread_once(&demangle_once, demangle_find);
    Dl_info di;
    *line = 0;
    if (!dladdr((void *)(f - 1), &di) || !di.dli_fname) {
        *filename = "??";
        snprintf(buf, size, "0x%llx", (unsigned long long)f);
        *name = buf;
        return;
    }
    *filename = di.dli_fname[0] ? di.dli_fname : "??";
    if (di.dli_sname) {
        char *dm = NULL;
        int status = -1;
        if (demangle && di.dli_sname[0] == '_' && di.dli_sname[1] == 'Z')
            dm = demangle(di.dli_sname, NULL, NULL, &status);
        snprintf(buf, size, "%s", dm && status == 0 ? dm : di.dli_sname);
        xs_free(dm);
    } else {
        /* No dynamic symbol (static function, or a program linked without -rdynamic): the offset
         * in the object, for addr2line -e FILE. */
        snprintf(buf, size, "+0x%llx", (unsigned long long)(f - 1 - (uintptr_t)di.dli_fbase));
    }
    *name = buf;
}
