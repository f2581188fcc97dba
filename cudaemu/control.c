/*
 * Per-entry bookkeeping (call counters, latency, injected failures) and the control API of
 * cudaemu.h. Counters and latencies are atomics, updated outside emu.lock; the armed-failure
 * list is under emu.lock.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cudaemu/emu.h"

const char *const emu_api_names[EMU_E_COUNT] = {
#define EMU_API(fn) #fn,
    EMU_FOREACH_ENTRY(EMU_API)
#undef EMU_API
};
const char *const emu_abi_names[EMU_E_COUNT] = {
#define EMU_ABI(fn) EMU_ABI_NAME(fn),
    EMU_FOREACH_ENTRY(EMU_ABI)
#undef EMU_ABI
};

int emu_entry_lookup(const char *name)
{
    if (!name)
        return -1;
    for (int i = 0; i < EMU_E_COUNT; i++)
        if (!strcmp(name, emu_api_names[i]) || !strcmp(name, emu_abi_names[i]))
            return i;
    return -1;
}

static atomic_ulong ctl_calls[EMU_E_COUNT];
static _Atomic uint64_t ctl_latency_ns[EMU_E_COUNT];
/* Per-byte cost of the copies (emu_copy_wait), in picoseconds per byte: 40 is 25 GB/s. */
static _Atomic uint64_t ctl_ps_per_byte[EMU_E_COUNT];
/* The host link's per-byte cost (copies to or from host-located VMM memory) and the bytes it
 * carried (cudaemu_link_bytes, CUDAEMU_REPORT). */
static _Atomic uint64_t ctl_link_ps;
/* The per-byte cost of a copy whose host side is pageable (not cuMemHostAlloc'd or registered):
 * the driver stages it through pinned buffers of its own. 0: such copies run at the entry's rate. */
static _Atomic uint64_t ctl_pageable_ps;
static _Atomic uint64_t ctl_link_bytes;
/* The modelled host clock (emu_model_now), in ns since start. */
static _Atomic uint64_t ctl_model_ns;

/* Armed failures; under emu.lock. A short list: tests arm a handful at a time. */
struct ctl_fail {
    enum emu_entry entry;
    unsigned long remaining;   /* calls until it fires; 1 = the next call */
    CUresult result;
};
static struct ctl_fail *ctl_fails;
static size_t ctl_nfails, ctl_capfails;
/* Fast path: no lock taken on calls while nothing is armed. */
static atomic_size_t ctl_armed;
/* Armed failures that fired (cudaemu_fail_fired). */
static atomic_ulong ctl_fired;

void emu_fail_arm(enum emu_entry e, unsigned long nth, CUresult res)
{
    if (ctl_nfails == ctl_capfails) {
        size_t ncap = ctl_capfails ? ctl_capfails * 2 : 8;
        struct ctl_fail *n = realloc(ctl_fails, ncap * sizeof *n);
        if (!n) {
            fprintf(stderr, "cudaemu: out of host memory arming a failure\n");
            abort();
        }
        ctl_fails = n;
        ctl_capfails = ncap;
    }
    ctl_fails[ctl_nfails++] = (struct ctl_fail){e, nth, res};
    atomic_store(&ctl_armed, ctl_nfails);
}

void emu_latency_set(enum emu_entry e, uint64_t ns) { atomic_store(&ctl_latency_ns[e], ns); }

static uint64_t ctl_ps(uint64_t bytes_per_s)
{
    /* Rounded to whole picoseconds per byte: exact for the figures used (25 GB/s = 40 ps). */
    return bytes_per_s ? (1000000000000ull + bytes_per_s / 2) / bytes_per_s : 0;
}

void emu_bandwidth_set(enum emu_entry e, uint64_t bytes_per_s)
{
    atomic_store(&ctl_ps_per_byte[e], ctl_ps(bytes_per_s));
}

void emu_link_set(uint64_t bytes_per_s) { atomic_store(&ctl_link_ps, ctl_ps(bytes_per_s)); }

void emu_pageable_set(uint64_t bytes_per_s) { atomic_store(&ctl_pageable_ps, ctl_ps(bytes_per_s)); }

bool emu_pageable_modelled(void) { return atomic_load_explicit(&ctl_pageable_ps, memory_order_relaxed) != 0; }

static uint64_t ctl_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t emu_now_ns(void) { return ctl_now_ns(); }

uint64_t emu_model_now(void) { return atomic_load(&ctl_model_ns); }

void emu_model_advance_to(uint64_t t)
{
    uint64_t cur = atomic_load(&ctl_model_ns);
    while (cur < t && !atomic_compare_exchange_weak(&ctl_model_ns, &cur, t))
        ;
}

uint64_t emu_bytes_ns(enum emu_entry e, size_t bytes)
{
    return (uint64_t)bytes * atomic_load_explicit(&ctl_ps_per_byte[e], memory_order_relaxed) / 1000;
}

uint64_t emu_copy_ns(enum emu_entry e, size_t bytes, size_t link, bool pageable)
{
    uint64_t pps = pageable ? atomic_load_explicit(&ctl_pageable_ps, memory_order_relaxed) : 0;
    if (pps) /* staged through the driver's pinned buffers: the slower of the two paths throughout */
        return (uint64_t)bytes * pps / 1000;
    if (link > bytes)
        link = bytes;
    return emu_bytes_ns(e, bytes - link) +
           (uint64_t)link * atomic_load_explicit(&ctl_link_ps, memory_order_relaxed) / 1000;
}

static _Atomic uint64_t ctl_batch_copy_ns;

void emu_batch_copy_set(uint64_t ns) { atomic_store(&ctl_batch_copy_ns, ns); }

void emu_batch_charge(size_t copies)
{
    uint64_t ns = (uint64_t)copies * atomic_load_explicit(&ctl_batch_copy_ns, memory_order_relaxed);
    if (!ns)
        return;
    atomic_fetch_add(&ctl_model_ns, ns);
    uint64_t until = ctl_now_ns() + ns;
    while (ctl_now_ns() < until)
        ;
}

void emu_bytes_charge(enum emu_entry e, size_t bytes)
{
    uint64_t ns = emu_bytes_ns(e, bytes);
    if (!ns)
        return;
    atomic_fetch_add(&ctl_model_ns, ns);
    uint64_t until = ctl_now_ns() + ns; /* busy, as emu_enter's latency: the call spins in the kernel */
    while (ctl_now_ns() < until)
        ;
}

uint64_t cudaemu_link_bytes(void)
{
    emu_env_once();
    return atomic_load(&ctl_link_bytes);
}

uint64_t cudaemu_model_ns(void)
{
    emu_env_once();
    return emu_model_now();
}

/* Bytes each copy and memset entry moved (CUDAEMU_REPORT: what a debug mode or a service wrote). */
static _Atomic uint64_t ctl_bytes[EMU_E_COUNT];
void emu_bytes_note(enum emu_entry e, size_t bytes) { atomic_fetch_add_explicit(&ctl_bytes[e], bytes, memory_order_relaxed); }

void emu_copy_wait(enum emu_entry e, size_t bytes, size_t link, bool pageable, uint64_t t0)
{
    emu_bytes_note(e, bytes);
    if (link)
        atomic_fetch_add_explicit(&ctl_link_bytes, link, memory_order_relaxed);
    /* The copy itself counts towards the modelled time: the call lasts max(memcpy, model). */
    uint64_t ns = bytes ? emu_copy_ns(e, bytes, link, pageable) : 0;
    while (ns && ctl_now_ns() < t0 + ns)
        ;
}

/* After fork, the child of a process that had run cuInit: the real driver refuses the parent's
 * state there (every call but the error-name lookups and cuDriverGetVersion returns
 * CUDA_ERROR_NOT_INITIALIZED, cuInit included), and so do we. */
static atomic_bool emu_forked;

/* The child handler. No prepare handler takes emu.lock: it is the innermost lock of the process
 * (callers such as libxseg call the driver under their own locks), and handlers registered at
 * dlopen run their prepare before those registered earlier, so taking it there could deadlock
 * with a thread that holds a caller's lock and waits for emu.lock. A child whose parent never ran
 * cuInit finds the state untouched; one whose parent did is refused everything that reads it. */
static void emu_fork_child(void)
{
    pthread_mutex_init(&emu.lock, NULL); /* a thread that held it does not exist here */
    if (atomic_load(&emu_initialized)) {
        atomic_store(&emu_forked, true);
        atomic_store(&emu_initialized, false);
    }
}

__attribute__((constructor)) static void emu_fork_register(void)
{
    (void)pthread_atfork(NULL, NULL, emu_fork_child);
}

/* The gate (cudaemu_gate): its own mutex, never held with emu.lock, so a parked call blocks
 * nobody else. */
static pthread_mutex_t gate_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static atomic_bool gate_armed;
static int gate_entry = -1;          /* under gate_lock */
static unsigned long gate_remaining; /* calls until it parks one */
static bool gate_parked, gate_opened;

static void gate_pass(enum emu_entry e)
{
    pthread_mutex_lock(&gate_lock);
    if (gate_entry == (int)e && --gate_remaining == 0) {
        gate_entry = -1;
        atomic_store(&gate_armed, false);
        gate_parked = true;
        pthread_cond_broadcast(&gate_cv);
        while (!gate_opened)
            pthread_cond_wait(&gate_cv, &gate_lock);
        gate_parked = false;
    }
    pthread_mutex_unlock(&gate_lock);
}

int cudaemu_gate(const char *entry, unsigned long nth)
{
    emu_env_once();
    int e = emu_entry_lookup(entry);
    if (e < 0 || nth == 0)
        return -1;
    pthread_mutex_lock(&gate_lock);
    gate_entry = e;
    gate_remaining = nth;
    gate_opened = false;
    atomic_store(&gate_armed, true);
    pthread_mutex_unlock(&gate_lock);
    return 0;
}

int cudaemu_gate_wait(unsigned timeout_ms)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&gate_lock);
    int r = 0;
    while (!gate_parked && !gate_opened && r == 0)
        r = pthread_cond_timedwait(&gate_cv, &gate_lock, &until);
    bool parked = gate_parked;
    pthread_mutex_unlock(&gate_lock);
    return parked ? 0 : -1;
}

void cudaemu_gate_open(void)
{
    pthread_mutex_lock(&gate_lock);
    gate_entry = -1;
    atomic_store(&gate_armed, false);
    gate_opened = true;
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_lock);
}

_Thread_local int emu_entry_now = -1;

CUresult emu_enter(enum emu_entry e)
{
    emu_entry_now = (int)e;
    if (atomic_load_explicit(&emu_forked, memory_order_relaxed) && e != EMU_E_cuGetErrorName &&
        e != EMU_E_cuGetErrorString && e != EMU_E_cuDriverGetVersion)
        return CUDA_ERROR_NOT_INITIALIZED;
    emu_env_once();
    atomic_fetch_add_explicit(&ctl_calls[e], 1, memory_order_relaxed);
    uint64_t lat = atomic_load_explicit(&ctl_latency_ns[e], memory_order_relaxed);
    if (lat) {
        atomic_fetch_add(&ctl_model_ns, lat);
        /* Busy-wait, like a driver call that spins in the kernel: sleeping would hand the core
         * to another thread and model a different cost. */
        uint64_t until = ctl_now_ns() + lat;
        while (ctl_now_ns() < until)
            ;
    }
    if (atomic_load_explicit(&gate_armed, memory_order_relaxed))
        gate_pass(e);
    if (!atomic_load_explicit(&ctl_armed, memory_order_relaxed))
        return CUDA_SUCCESS;
    CUresult res = CUDA_SUCCESS;
    emu_lock();
    /* Every armed failure of this entry counts the call; the first that reaches zero fires, and
     * all that reached zero are disarmed. */
    size_t kept = 0;
    for (size_t i = 0; i < ctl_nfails; i++) {
        struct ctl_fail f = ctl_fails[i];
        if (f.entry == e && --f.remaining == 0) {
            if (res == CUDA_SUCCESS) {
                res = f.result;
                atomic_fetch_add(&ctl_fired, 1);
            }
            continue;
        }
        ctl_fails[kept++] = f;
    }
    ctl_nfails = kept;
    atomic_store(&ctl_armed, kept);
    emu_unlock();
    return res;
}

/* ---- control API ---- */

int cudaemu_fail(const char *entry, unsigned long nth, CUresult result)
{
    emu_env_once();
    int e = emu_entry_lookup(entry);
    if (e < 0 || nth == 0)
        return -1;
    emu_lock();
    emu_fail_arm((enum emu_entry)e, nth, result);
    emu_unlock();
    return 0;
}

void cudaemu_fail_clear(void)
{
    emu_env_once();
    emu_lock();
    ctl_nfails = 0;
    atomic_store(&ctl_armed, 0);
    emu_unlock();
}

unsigned long cudaemu_fail_fired(void) { return atomic_load(&ctl_fired); }

unsigned long cudaemu_call_count(const char *entry)
{
    int e = emu_entry_lookup(entry);
    return e < 0 ? 0 : atomic_load(&ctl_calls[e]);
}

void cudaemu_counts_reset(void)
{
    for (int i = 0; i < EMU_E_COUNT; i++)
        atomic_store(&ctl_calls[i], 0);
}

int cudaemu_set_latency(const char *entry, uint64_t ns)
{
    emu_env_once();
    int e = emu_entry_lookup(entry);
    if (e < 0)
        return -1;
    emu_latency_set((enum emu_entry)e, ns);
    return 0;
}

int cudaemu_get_latency(const char *entry, uint64_t *ns, uint64_t *ps_per_byte)
{
    emu_env_once();
    if (entry && (!strcmp(entry, "link") || !strcmp(entry, "pageable"))) { /* rates, no latency */
        if (ns)
            *ns = 0;
        if (ps_per_byte)
            *ps_per_byte = atomic_load(entry[0] == 'l' ? &ctl_link_ps : &ctl_pageable_ps);
        return 0;
    }
    int e = emu_entry_lookup(entry);
    if (e < 0)
        return -1;
    if (ns)
        *ns = atomic_load(&ctl_latency_ns[e]);
    if (ps_per_byte)
        *ps_per_byte = atomic_load(&ctl_ps_per_byte[e]);
    return 0;
}

int cudaemu_set_bandwidth(const char *entry, uint64_t bytes_per_second)
{
    emu_env_once();
    if (entry && !strcmp(entry, "link")) {
        emu_link_set(bytes_per_second);
        return 0;
    }
    if (entry && !strcmp(entry, "pageable")) {
        emu_pageable_set(bytes_per_second);
        return 0;
    }
    int e = emu_entry_lookup(entry);
    if (e < 0)
        return -1;
    emu_bandwidth_set((enum emu_entry)e, bytes_per_second);
    return 0;
}

/* Every count, in the current layout (size = the whole struct). */
static void live_fill(struct cudaemu_live *live)
{
    memset(live, 0, sizeof *live);
    live->size = sizeof *live;
    emu_lock();
    live->handles = emu.nphys;
    live->mapped_bytes = emu.mapped_bytes;
    live->reservations = emu.nresv;
    for (size_t i = 0; i < emu.nresv; i++)
        live->reserved_bytes += emu.resv[i]->size;
    live->allocs = emu.allocs.count;
    for (int d = 0; d < 8 && d < EMU_MAX_DEVICES; d++)
        live->used_bytes[d] = emu.used[d];
    live->events = emu.events.count;
    live->graphs = emu.graphs.count;
    live->graph_execs = emu.execs.count;
    live->modules = emu_modules_locked();
    emu_unlock();
}

int cudaemu_live_query(struct cudaemu_live *live)
{
    if (!live || live->size < sizeof live->size)
        return -1;
    struct cudaemu_live all;
    live_fill(&all);
    /* Whole fields only: a caller's struct ends on a field boundary (every field is a size_t). */
    size_t n = live->size < sizeof all ? live->size : sizeof all;
    n -= n % sizeof(size_t);
    all.size = n;
    memcpy(live, &all, n);
    return 0;
}

/* The earlier entry point, for binaries built against a header without the size field: their
 * struct began with `handles` and was never shorter than 12 size_t words (handles, mapped_bytes,
 * reservations, allocs, used_bytes[8]), so that many words are written, from `handles` on, and no
 * more, whatever header the caller had. Not declared in cudaemu.h: new code uses the query. */
#define LIVE_LEGACY_WORDS 12
#ifndef CUDAEMU_DRIVER_ONLY
__attribute__((visibility("default")))
#endif
void cudaemu_live_get(void *live);
void cudaemu_live_get(void *live)
{
    if (!live)
        return;
    struct cudaemu_live all;
    live_fill(&all);
    _Static_assert(sizeof all - offsetof(struct cudaemu_live, handles) >= LIVE_LEGACY_WORDS * sizeof(size_t),
                   "the legacy words are a prefix of the current fields");
    memcpy(live, (const char *)&all + offsetof(struct cudaemu_live, handles), LIVE_LEGACY_WORDS * sizeof(size_t));
}

void emu_report_print(void)
{
    struct cudaemu_live live;
    live_fill(&live);
    fprintf(stderr, "cudaemu report: %zu live handle(s), %zu mapped byte(s), %zu reservation(s), "
            "%zu cuMemAlloc block(s), %zu event(s), %zu graph(s), %zu executable graph(s)\n", live.handles,
            live.mapped_bytes, live.reservations, live.allocs, live.events, live.graphs, live.graph_execs);
    if (live.modules)
        fprintf(stderr, "cudaemu report: %zu module(s) loaded\n", live.modules);
    for (int d = 0; d < emu.cfg.devices && d < 8; d++)
        fprintf(stderr, "cudaemu report: device %d: %zu byte(s) in use of %zu\n", d,
                live.used_bytes[d], emu.cfg.total_mem);
    for (int i = 0; i < EMU_E_COUNT; i++) {
        unsigned long n = atomic_load(&ctl_calls[i]);
        uint64_t lat = atomic_load(&ctl_latency_ns[i]), ps = atomic_load(&ctl_ps_per_byte[i]);
        if (!n && !lat && !ps)
            continue;
        fprintf(stderr, "cudaemu report: %-34s %lu call(s)", emu_api_names[i], n);
        if (lat)
            fprintf(stderr, ", latency %llu ns", (unsigned long long)lat);
        if (ps)
            fprintf(stderr, ", %llu ps per byte", (unsigned long long)ps);
        fprintf(stderr, "\n");
        uint64_t moved = atomic_load(&ctl_bytes[i]);
        if (moved)
            fprintf(stderr, "cudaemu report: %-34s %llu byte(s) moved\n", emu_api_names[i], (unsigned long long)moved);
    }
    uint64_t link = atomic_load(&ctl_link_bytes), lps = atomic_load(&ctl_link_ps);
    if (link || lps)
        fprintf(stderr, "cudaemu report: link bytes %llu (copies to or from host-located VMM memory, "
                "counted in their entries' bytes moved too), %llu ps per byte\n", (unsigned long long)link,
                (unsigned long long)lps);
    uint64_t pps = atomic_load(&ctl_pageable_ps);
    if (pps)
        fprintf(stderr, "cudaemu report: pageable host memory copies %llu ps per byte\n", (unsigned long long)pps);
}

void cudaemu_report(void)
{
    emu_env_once();
    emu_report_print();
}
