/*
 * Device memory's bytes, as the emulator reaches them. As on a GPU, device memory (VMM handles of
 * a device, cuMemAlloc blocks) is never host-accessible at its device address: that range stays
 * PROT_NONE, so a host load or store there faults (SIGSEGV) as it does with the real driver. The
 * bytes live in memory files (the device's sparse memfd, or a handle's own), and every emulated
 * operation that moves them (copies of every kind, memset, graph nodes, the allocator's kernels)
 * translates its device addresses to pieces of physical memory here and moves the bytes through
 * the emulator's own view of each: a MAP_SHARED mapping of the memory's file range at an address
 * only cudaemu knows, made at the first copy that touches it and unmapped with the memory (one
 * VMA per physical allocation touched, where device mappings take none).
 *
 * Sparse: a zero fill punches whole pages out of the file; large reads and device-to-device
 * copies skip the source's holes (lseek SEEK_DATA / SEEK_HOLE: a hole reads zero, and is punched
 * in a copy's destination), so reading or copying memory never written takes no host memory
 * (the check kernel's compare reads its ranges whole: they were filled).
 *
 * Translation of a device operand byte, in order: a VMM reservation (its mapping's physical
 * memory; unmapped, or without the access asked: ILLEGAL_ADDRESS), a cuMemAlloc block (a range of
 * its device's file; a cuMemAllocManaged block is one too, whose view is its own address, the one
 * device memory the host may touch), pinned or registered host memory (host-accessible: UVA), else no device
 * memory (INVALID_VALUE). A piece's physical memory is pinned while its bytes move, so a
 * concurrent unmap and release cannot unmap its view or close its file under the copy (the race
 * itself is the caller's bug, as on the driver). A copy's host side is touched by the CPU as the
 * driver's staging copy would: a bad host pointer faults.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cudaemu/emu.h"

/* Below this many bytes a read or copy moves them all, holes included (the lseeks, and the
 * kernel's walk of the file's pages they make, cost more than reading a few zero pages); from it
 * on, holes are skipped. */
enum { DEV_SPARSE_MIN = 4 << 20 };

/* One translated piece: the emulator's view of it (or host memory), and for physical memory its
 * file range. */
struct piece {
    unsigned char *p;
    int fd;               /* -1: host memory, or a cuMemAlloc block's anonymous memory */
    off_t off;
    size_t len;
    struct emu_phys *pin; /* pinned while the bytes move; NULL for host memory */
};

/* ---- cuMemAlloc blocks by address (sorted; containment by binary search) ---- */

static struct emu_alloc **alloc_v;
static size_t alloc_n, alloc_cap;

static size_t alloc_floor(uintptr_t addr) /* the number of blocks with base <= addr */
{
    size_t lo = 0, hi = alloc_n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (alloc_v[mid]->base <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int emu_alloc_index_add_locked(struct emu_alloc *a)
{
    if (alloc_n == alloc_cap) {
        size_t ncap = alloc_cap ? alloc_cap * 2 : 64;
        struct emu_alloc **n = realloc(alloc_v, ncap * sizeof *n);
        if (!n)
            return -1;
        alloc_v = n;
        alloc_cap = ncap;
    }
    size_t at = alloc_floor(a->base);
    memmove(&alloc_v[at + 1], &alloc_v[at], (alloc_n - at) * sizeof *alloc_v);
    alloc_v[at] = a;
    alloc_n++;
    return 0;
}

void emu_alloc_index_del_locked(struct emu_alloc *a)
{
    size_t at = alloc_floor(a->base);
    if (at && alloc_v[at - 1] == a) {
        memmove(&alloc_v[at - 1], &alloc_v[at], (alloc_n - at) * sizeof *alloc_v);
        alloc_n--;
    }
}

struct emu_alloc *emu_alloc_at_locked(uintptr_t addr)
{
    size_t at = alloc_floor(addr);
    if (!at)
        return NULL;
    struct emu_alloc *a = alloc_v[at - 1];
    return addr - a->base < a->mapped ? a : NULL;
}

/* ---- views ---- */

void emu_phys_views_drop_locked(struct emu_phys *ph, bool all)
{
    if (ph->stale_view && (all || !ph->pins)) {
        munmap(ph->stale_view, ph->size);
        ph->stale_view = NULL;
    }
    if (all && ph->view) {
        munmap(ph->view, ph->size);
        ph->view = NULL;
    }
}

void emu_phys_moved_locked(struct emu_phys *ph)
{
    if (!ph->view)
        return;
    /* A copy still moving bytes through the old view keeps it until its unpin. */
    if (ph->pins && !ph->stale_view)
        ph->stale_view = ph->view;
    else
        munmap(ph->view, ph->size);
    ph->view = NULL;
}

/* The emulator's view of @p ph, mapped at first use (NULL: the kernel refused a mapping). */
static unsigned char *phys_view_locked(struct emu_phys *ph)
{
    if (!ph->view && ph->fd >= 0) {
        void *v = mmap(NULL, ph->size, PROT_READ | PROT_WRITE, MAP_SHARED, ph->fd, ph->off);
        ph->view = v == MAP_FAILED ? NULL : v;
    }
    return ph->view;
}

/* ---- translation ---- */

static bool access_ok(unsigned have, unsigned need)
{
    /* READWRITE includes READ; READ does not satisfy a write. */
    return need == CU_MEM_ACCESS_FLAGS_PROT_READ ? have != CU_MEM_ACCESS_FLAGS_PROT_NONE
                                                 : have == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
}

CUresult emu_dev_check_locked(uintptr_t addr, size_t size, int dev, unsigned need, bool kernel)
{
    if (!size)
        return CUDA_SUCCESS;
    if (addr + size < addr)
        return CUDA_ERROR_INVALID_VALUE;
    uintptr_t end = addr + size;
    for (uintptr_t cur = addr; cur < end;) {
        const struct emu_mapping *m;
        int in = emu_vmm_lookup_locked(cur, &m);
        if (in > 0) {
            if (!access_ok(m->access[dev], need))
                return CUDA_ERROR_ILLEGAL_ADDRESS;
            cur = m->base + m->size;
            continue;
        }
        if (in == 0)
            return CUDA_ERROR_ILLEGAL_ADDRESS;
        const struct emu_alloc *a = emu_alloc_at_locked(cur);
        if (a && (!kernel || a->dev == dev || a->managed)) { /* managed: every device's */
            cur = a->base + a->mapped;
            continue;
        }
        size_t avail = 0;
        if (!kernel && emu_host_range_locked(cur, &avail)) {
            cur = end - cur > avail ? cur + avail : end;
            continue;
        }
        return kernel ? CUDA_ERROR_ILLEGAL_ADDRESS : CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

CUresult emu_dev_check(uintptr_t addr, size_t size, int dev, unsigned need)
{
    emu_lock();
    CUresult r = emu_dev_check_locked(addr, size, dev, need, false);
    emu_unlock();
    return r;
}

/* The piece at @p addr, at most @p n bytes, its memory pinned: CUDA_SUCCESS;
 * CUDA_ERROR_ILLEGAL_ADDRESS when no device memory is there (unmapped since the caller's check:
 * a concurrent unmap); CUDA_ERROR_OUT_OF_MEMORY when its view cannot be mapped. Lock held. */
static CUresult piece_at_locked(uintptr_t addr, size_t n, struct piece *p)
{
    const struct emu_mapping *m;
    struct emu_phys *ph = NULL;
    size_t left = 0, at = 0;
    int in = emu_vmm_lookup_locked(addr, &m);
    if (in > 0) {
        ph = m->handle->phys;
        left = m->base + m->size - addr;
        at = m->offset + (addr - m->base);
    } else if (in < 0) {
        struct emu_alloc *a = emu_alloc_at_locked(addr);
        if (a) {
            ph = a->phys;
            left = a->base + a->mapped - addr;
            at = addr - a->base;
        } else if (emu_host_range_locked(addr, &left)) {
            *p = (struct piece){(unsigned char *)addr, -1, 0, n < left ? n : left, NULL};
            return CUDA_SUCCESS;
        }
    }
    if (!ph)
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    unsigned char *v = phys_view_locked(ph);
    if (!v)
        return CUDA_ERROR_OUT_OF_MEMORY;
    ph->pins++;
    *p = (struct piece){v + at, ph->fd, ph->off + (off_t)at, n < left ? n : left, ph};
    return CUDA_SUCCESS;
}

static void piece_unpin_locked(struct piece *p)
{
    if (p->pin && !--p->pin->pins) {
        emu_phys_views_drop_locked(p->pin, false);
        emu_phys_maybe_free_locked(p->pin);
    }
    p->pin = NULL;
}

static void piece_unpin(struct piece *p)
{
    if (!p->pin)
        return;
    emu_lock();
    piece_unpin_locked(p);
    emu_unlock();
}

/* ---- moving bytes ---- */

/* The next data extent of [at, end) of @p fd: *data its start (end when none), *hole its end. */
static void file_extent(int fd, off_t at, off_t end, off_t *data, off_t *hole)
{
    off_t d = lseek(fd, at, SEEK_DATA);
    if (d < 0 || d > end)
        d = end; /* ENXIO: no data past at */
    off_t h = d < end ? lseek(fd, d, SEEK_HOLE) : end;
    if (h < 0 || h > end)
        h = end;
    *data = d;
    *hole = h;
}

/* Zeros over @p n bytes of piece @p p from @p from: whole host pages of physical memory given
 * back (punched out of its file, or MADV_DONTNEED of a cuMemAlloc block's anonymous memory: they
 * read zero and hold no memory), the unaligned edges (or all of it, where that is refused or the
 * piece is host memory) written. File offsets and views share their page offset. */
static void piece_zero(const struct piece *p, size_t from, size_t n)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    if (p->pin && n >= page) {
        uintptr_t s = (uintptr_t)p->p + from, e = s + n;
        uintptr_t lo = (s + page - 1) & ~(page - 1), hi = e & ~(page - 1);
        bool done = lo < hi && (p->fd >= 0 ? fallocate(p->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                                                       p->off + (off_t)(from + (lo - s)), (off_t)(hi - lo)) == 0
                                           : madvise((void *)lo, hi - lo, MADV_DONTNEED) == 0);
        if (done) {
            memset((void *)s, 0, lo - s);
            memset((void *)hi, 0, e - hi);
            return;
        }
    }
    memset(p->p + from, 0, n);
}

/* Copy @p n bytes from piece @p s to piece @p d. From a file range of DEV_SPARSE_MIN or more only
 * its data extents are copied; the destination is zeroed (punched where it can be) over its holes. */
static void piece_copy(const struct piece *d, const struct piece *s, size_t n)
{
    if (s->fd < 0 || n < DEV_SPARSE_MIN) {
        memmove(d->p, s->p, n);
        return;
    }
    off_t s0 = s->off, s1 = s0 + (off_t)n;
    for (off_t at = s0; at < s1;) {
        off_t data, hole;
        file_extent(s->fd, at, s1, &data, &hole);
        if (data > at)
            piece_zero(d, (size_t)(at - s0), (size_t)(data - at));
        if (data >= s1)
            break;
        memmove(d->p + (data - s0), s->p + (data - s0), (size_t)(hole - data));
        at = hole;
    }
}

/* The walk every mover shares: the pieces of [addr, addr + n) in order, each pinned while @p fn
 * moves it (@p done: the bytes before it). @p fn returns false to stop early. */
static CUresult each_piece(uintptr_t addr, size_t n, bool (*fn)(void *ctx, const struct piece *p, size_t done),
                           void *ctx)
{
    for (size_t done = 0; done < n;) {
        struct piece p;
        emu_lock();
        CUresult r = piece_at_locked(addr + done, n - done, &p);
        emu_unlock();
        if (r != CUDA_SUCCESS)
            return r;
        bool more = fn(ctx, &p, done);
        piece_unpin(&p);
        if (!more)
            break;
        done += p.len;
    }
    return CUDA_SUCCESS;
}

static bool write_piece(void *src, const struct piece *p, size_t done)
{
    memmove(p->p, (const unsigned char *)src + done, p->len);
    return true;
}

CUresult emu_dev_write(uintptr_t dst, const void *src, size_t n)
{
    return each_piece(dst, n, write_piece, (void *)src);
}

static bool read_piece(void *dst, const struct piece *p, size_t done)
{
    struct piece h = {(unsigned char *)dst + done, -1, 0, p->len, NULL};
    piece_copy(&h, p, p->len);
    return true;
}

CUresult emu_dev_read(void *dst, uintptr_t src, size_t n) { return each_piece(src, n, read_piece, dst); }

static bool set_piece(void *v, const struct piece *p, size_t done)
{
    (void)done;
    unsigned char c = *(const unsigned char *)v;
    if (c)
        memset(p->p, c, p->len);
    else
        piece_zero(p, 0, p->len);
    return true;
}

CUresult emu_dev_set(uintptr_t dst, unsigned char v, size_t n) { return each_piece(dst, n, set_piece, &v); }

CUresult emu_dev_copy(uintptr_t dst, uintptr_t src, size_t n)
{
    if (dst < src + n && src < dst + n && dst != src) {
        /* Overlapping ranges: the caller's bug on a GPU; kept defined (memmove) through host memory. */
        unsigned char *tmp = malloc(n);
        if (!tmp)
            return CUDA_ERROR_OUT_OF_MEMORY;
        CUresult r = emu_dev_read(tmp, src, n);
        if (r == CUDA_SUCCESS)
            r = emu_dev_write(dst, tmp, n);
        free(tmp);
        return r;
    }
    for (size_t done = 0; done < n;) {
        struct piece d, s;
        emu_lock();
        CUresult r = piece_at_locked(dst + done, n - done, &d);
        if (r == CUDA_SUCCESS && (r = piece_at_locked(src + done, d.len, &s)) != CUDA_SUCCESS)
            piece_unpin_locked(&d);
        emu_unlock();
        if (r != CUDA_SUCCESS)
            return r;
        piece_copy(&d, &s, s.len); /* s.len <= d.len */
        emu_lock();
        piece_unpin_locked(&d);
        piece_unpin_locked(&s);
        emu_unlock();
        done += s.len;
    }
    return CUDA_SUCCESS;
}

/* The first byte of @p p[0, n) that is not @p v, or n. */
static size_t first_diff_host(const unsigned char *p, size_t n, unsigned char v)
{
    size_t i = 0;
    uint64_t v8 = 0x0101010101010101ull * v;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        if (w != v8)
            break;
    }
    while (i < n && p[i] == v)
        i++;
    return i;
}

struct diff_ctx {
    unsigned char v;
    size_t *first;
};

static bool diff_piece(void *ctx, const struct piece *p, size_t done)
{
    struct diff_ctx *c = ctx;
    size_t f = first_diff_host(p->p, p->len, c->v);
    if (f < p->len)
        *c->first = done + f;
    return f == p->len;
}

CUresult emu_dev_first_diff(uintptr_t addr, size_t n, unsigned char v, size_t *first)
{
    *first = n;
    struct diff_ctx c = {v, first};
    return each_piece(addr, n, diff_piece, &c);
}
