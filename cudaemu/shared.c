/*
 * One emulated device's memory shared among processes (CUDAEMU_SHARED=NAME): a small accounting
 * file per device, /dev/shm/cudaemu-<uuid> (shm_open, 0600, O_NOFOLLOW, owner checked), where each
 * process publishes the bytes it holds in a slot of its own. cuMemGetInfo and the capacity checks
 * of cuMemCreate / cuMemAlloc count every live process's bytes, as a real GPU does; a slot whose
 * process is gone (kill(pid, 0) says ESRCH) counts nothing and is taken over, as the driver frees
 * a dead process's memory. Without the variable each process has its own device, as before.
 *
 * An allocation's check and its publish are one step among the sharers (emu_mem_take_locked): a
 * lock word in the file names its holder's pid, and a holder found dead is replaced (its slot no
 * longer counts, so whatever it left half done does not matter). Processes allocating at the
 * same instant never overcommit the device together; giving memory back needs no lock.
 * The device UUID (cuDeviceGetUuid) hashes the name and the ordinal, so processes sharing a name
 * see the same device, as processes on one GPU see one UUID.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cudaemu/emu.h"

#define SHARED_MAGIC 0x32726873756d6563ull /* "cemushr2" */
#define SHARED_SLOTS 256

struct shared_slot {
    _Atomic int32_t pid;   /* 0: free */
    uint32_t pad;
    _Atomic uint64_t bytes;
};

struct shared_file {
    _Atomic uint64_t magic;
    _Atomic int32_t lock;   /* the pid of the process checking and adding; 0: free */
    uint32_t pad;
    struct shared_slot slot[SHARED_SLOTS];
};

/* Per device: the mapping (NULL: not shared or not opened yet) and this process's slot. */
static struct shared_file *shared_map[EMU_MAX_DEVICES];
static int shared_slot_of[EMU_MAX_DEVICES];
static bool shared_tried[EMU_MAX_DEVICES];

static bool pid_alive(int32_t pid)
{
    return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM);
}

void emu_device_uuid(int dev, unsigned char out[16])
{
    /* FNV-1a over the share name and the ordinal, spread over 16 bytes. */
    const char *name = emu.cfg.shared[0] ? emu.cfg.shared : "";
    uint64_t h = 1469598103934665603ull;
    for (const char *s = name; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    h = (h ^ (unsigned)dev) * 1099511628211ull;
    uint64_t h2 = (h ^ 0x9e3779b97f4a7c15ull) * 1099511628211ull;
    memcpy(out, "CEMU", 4);
    memcpy(out + 4, &h, 8);
    memcpy(out + 12, &h2, 4);
}

static char shared_path[EMU_MAX_DEVICES][64];

/* At exit: free our slots; the last process out removes the file (one starting at that instant
 * may keep counting in the removed file: the emulator's only gap, as CUDAEMU_SHARED is for tests
 * and benchmarks). */
static void shared_atexit(void)
{
    for (int d = 0; d < EMU_MAX_DEVICES; d++) {
        struct shared_file *f = shared_map[d];
        if (!f)
            continue;
        atomic_store(&f->slot[shared_slot_of[d]].bytes, 0);
        atomic_store(&f->slot[shared_slot_of[d]].pid, 0);
        bool empty = true;
        for (int i = 0; i < SHARED_SLOTS; i++) {
            int32_t p = atomic_load(&f->slot[i].pid);
            empty = empty && !(p && pid_alive(p));
        }
        if (empty)
            shm_unlink(shared_path[d]);
    }
}

/* Open (create) the device's file and take a slot; NULL when not shared. Under emu.lock. */
static struct shared_file *shared_open_locked(int dev)
{
    if (!emu.cfg.shared[0] || dev < 0 || dev >= EMU_MAX_DEVICES)
        return NULL;
    if (shared_tried[dev])
        return shared_map[dev];
    shared_tried[dev] = true;
    unsigned char u[16];
    emu_device_uuid(dev, u);
    char path[64];
    int n = snprintf(path, sizeof path, "/cudaemu-");
    for (int i = 0; i < 16; i++)
        n += snprintf(path + n, sizeof path - (size_t)n, "%02x", u[i]);
    int fd = shm_open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) || st.st_uid != geteuid() || (st.st_mode & 077) ||
        (st.st_size != 0 && st.st_size != (off_t)sizeof(struct shared_file)) ||
        (st.st_size == 0 && ftruncate(fd, sizeof(struct shared_file)))) {
        fprintf(stderr, "cudaemu: CUDAEMU_SHARED: cannot use /dev/shm%s (%s): device %d is not "
                "shared\n", path, fd < 0 ? strerror(errno) : "not ours, or a bad size", dev);
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    void *m = mmap(NULL, sizeof(struct shared_file), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return NULL;
    struct shared_file *f = m;
    uint64_t zero = 0;
    /* A fresh file is all zeros: the first process stamps it; slots start free either way. */
    atomic_compare_exchange_strong(&f->magic, &zero, SHARED_MAGIC);
    if (atomic_load(&f->magic) != SHARED_MAGIC) {
        fprintf(stderr, "cudaemu: CUDAEMU_SHARED: /dev/shm%s is not an accounting file: device %d "
                "is not shared\n", path, dev);
        munmap(m, sizeof(struct shared_file));
        return NULL;
    }
    int32_t me = (int32_t)getpid();
    for (int i = 0; i < SHARED_SLOTS; i++) {
        int32_t p = atomic_load(&f->slot[i].pid);
        if (p && pid_alive(p))
            continue;
        if (!atomic_compare_exchange_strong(&f->slot[i].pid, &p, me))
            continue;
        atomic_store(&f->slot[i].bytes, emu.used[dev]);
        shared_map[dev] = f;
        shared_slot_of[dev] = i;
        snprintf(shared_path[dev], sizeof shared_path[dev], "%s", path);
        static bool registered;
        if (!registered)
            registered = !atexit(shared_atexit);
        return f;
    }
    fprintf(stderr, "cudaemu: CUDAEMU_SHARED: %d processes already share device %d: this one "
            "is not counted\n", SHARED_SLOTS, dev);
    munmap(m, sizeof(struct shared_file));
    return NULL;
}

/* Bytes that other live processes hold on @p dev. */
static size_t shared_others(struct shared_file *f, int dev)
{
    size_t sum = 0;
    for (int i = 0; i < SHARED_SLOTS; i++) {
        if (i == shared_slot_of[dev])
            continue;
        int32_t p = atomic_load(&f->slot[i].pid);
        if (p && pid_alive(p))
            sum += atomic_load(&f->slot[i].bytes);
    }
    return sum;
}

/* The file's lock: taken from a dead holder (kill says ESRCH), else waited for (a holder does a
 * sum of 256 slots and a store: microseconds). */
static void shared_lock(struct shared_file *f)
{
    int32_t me = (int32_t)getpid();
    for (unsigned spins = 0;; spins++) {
        int32_t holder = 0;
        if (atomic_compare_exchange_strong(&f->lock, &holder, me))
            return;
        if (holder == me || !pid_alive(holder)) {
            /* A dead holder (our own pid: a dead process's, reused since) */
            if (atomic_compare_exchange_strong(&f->lock, &holder, me))
                return;
            continue;
        }
        if (spins < 64)
            sched_yield();
        else
            nanosleep(&(struct timespec){0, 20000}, NULL);
    }
}

static void shared_unlock(struct shared_file *f)
{
    atomic_store(&f->lock, 0);
}

bool emu_mem_take_locked(int dev, size_t bytes)
{
    struct shared_file *f = shared_open_locked(dev);
    if (!f) {
        if (bytes > emu_mem_free_locked(dev))
            return false;
        emu.used[dev] += bytes;
        return true;
    }
    shared_lock(f);
    size_t used = emu.used[dev] + shared_others(f, dev);
    bool fits = used <= emu.cfg.total_mem && bytes <= emu.cfg.total_mem - used;
    if (fits) {
        emu.used[dev] += bytes;
        atomic_store(&f->slot[shared_slot_of[dev]].bytes, emu.used[dev]);
    }
    shared_unlock(f);
    return fits;
}

size_t emu_mem_free_locked(int dev)
{
    size_t used = emu.used[dev];
    struct shared_file *f = shared_open_locked(dev);
    if (f)
        used += shared_others(f, dev);
    return used < emu.cfg.total_mem ? emu.cfg.total_mem - used : 0;
}

void emu_mem_add_locked(int dev, size_t bytes, bool add)
{
    if (add)
        emu.used[dev] += bytes;
    else
        emu.used[dev] -= bytes;
    struct shared_file *f = shared_open_locked(dev);
    if (f)
        atomic_store(&f->slot[shared_slot_of[dev]].bytes, emu.used[dev]);
}
