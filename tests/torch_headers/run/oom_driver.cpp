// The adapter's allocation path, loaded (run/driver.h) and run (on cudaemu in the test suite)
// against a stand-in for PyTorch's side of the `main` stub interface (fake_torch.cpp): the
// adapter's install() makes xseg the current allocator, every way PyTorch allocates and frees
// (allocate and its DataPtr's deleter, raw_alloc, raw_alloc_with_stream, raw_delete,
// raw_deallocate) reaches xseg, and then a failed allocation must raise
// c10::OutOfMemoryError carrying xseg's message, which names the OOM snapshot, where a bare
// CUDAPluggableAllocator would hand the NULL on as a tensor's data pointer. Not a PyTorch test:
// tests/torch_headers/README.md says what it shows.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include "driver.h"

namespace {
int64_t allocated_bytes()
{
    int64_t v = -1;
    if (xseg_stat(0, "allocated_bytes.all.current", &v) != XSEG_SUCCESS)
        return -1;
    return v;
}

// Run f, which must raise c10::OutOfMemoryError with xseg's OOM message naming @p snapshot.
template <class F>
void expect_oom(const char *what, F f, const std::string &snapshot)
{
    try {
        void *p = f();
        EXPECT(false, "%s returned %p instead of raising", what, p);
    } catch (const c10::OutOfMemoryError &e) {
        std::string msg = e.what();
        EXPECT(contains(msg, "CUDA out of memory. Tried to allocate 1.00 TiB"), "%s: message: %s", what,
               msg.c_str());
        EXPECT(contains(msg, snapshot), "%s: the message does not name the snapshot %s: %s", what,
               snapshot.c_str(), msg.c_str());
        std::printf("ok   %s raised c10::OutOfMemoryError: %s\n", what, msg.c_str());
    } catch (const c10::Error &e) {
        EXPECT(false, "%s raised c10::Error, not c10::OutOfMemoryError: %s", what, e.what());
    }
}
} // namespace

int main()
{
    const char *tmp = std::getenv("TMPDIR");
    std::string dir = std::string(tmp && *tmp ? tmp : "/tmp") + "/xseg-torch-oom-XXXXXX";
    if (!mkdtemp(&dir[0])) {
        std::perror("mkdtemp");
        return 1;
    }
    std::string snapshot = dir + "/oom.pickle";
    setenv("XSEG_OOM_SNAPSHOT", snapshot.c_str(), 1); // read when xseg initializes

    Pluggable *a = install_adapter();
    if (!a)
        return 1;

    // Tensors: allocate() on the current device and stream, freed through the DataPtr's deleter,
    // which is raw_deleter() (cudagraph trees compare the two) and frees nothing else.
    c10::DataPtr d = a->allocate(MiB);
    EXPECT(d.get() && d.get_context() == d.get() && d.device().type == c10::DeviceType::CUDA &&
               d.device().index == 0 && d.get_deleter() == a->raw_deleter() && a->is_simple_data_ptr(d),
           "allocate(1 MiB): %p ctx %p", d.get(), d.get_context());
    EXPECT(allocated_bytes() == (int64_t)MiB, "allocated %lld", (long long)allocated_bytes());
    d.get_deleter()(d.get_context());
    EXPECT(allocated_bytes() == 0, "allocated %lld after the DataPtr's deleter", (long long)allocated_bytes());
    // Workspaces: raw_alloc / raw_alloc_with_stream and raw_delete; raw_deallocate is raw_deleter().
    void *p = a->raw_alloc(MiB);
    void *q = a->raw_alloc_with_stream(2 * MiB, nullptr);
    EXPECT(p && q && allocated_bytes() == (int64_t)(3 * MiB), "raw_alloc: %p %p, allocated %lld", p, q,
           (long long)allocated_bytes());
    a->raw_delete(p);
    a->raw_deleter()(q);
    EXPECT(allocated_bytes() == 0, "allocated %lld after raw_delete", (long long)allocated_bytes());
    try {
        a->raw_delete(p);
        EXPECT(false, "raw_delete of a freed pointer did not raise");
    } catch (const c10::Error &e) {
        EXPECT(contains(e.what(), "xseg: raw_delete"), "message: %s", e.what());
        std::printf("ok   raw_delete of a freed pointer raises: %s\n", e.what());
    }

    try {
        EXPECT(a->allocate(0).get() == nullptr && a->raw_alloc(0) == nullptr, "allocate(0) gave memory");
    } catch (const c10::Error &e) {
        EXPECT(false, "allocate(0) raised: %s", e.what());
    }

    // PyTorch's allocate() and raw_alloc() (cuBLAS and cuDNN workspaces) both raise.
    expect_oom("allocate(1 TiB)", [&] { return a->allocate(size_t(1) << 40).get(); }, snapshot);
    struct stat st;
    EXPECT(stat(snapshot.c_str(), &st) == 0 && st.st_size > 0, "no OOM snapshot at %s", snapshot.c_str());
    expect_oom("raw_alloc(1 TiB)", [&] { return a->raw_alloc(size_t(1) << 40); }, snapshot);
    EXPECT(a->getDeviceStats(0).num_ooms == 2, "num_ooms %lld", (long long)a->getDeviceStats(0).num_ooms);

    // Any other failure is a c10::Error (RuntimeError), with xseg's message.
    try {
        alloc_on(a, MiB, 99, nullptr);
        EXPECT(false, "allocating on device 99 did not raise");
    } catch (const c10::OutOfMemoryError &e) {
        EXPECT(false, "allocating on device 99 raised OutOfMemoryError: %s", e.what());
    } catch (const c10::Error &e) {
        std::string msg = e.what();
        EXPECT(contains(msg, "xseg: allocating 1048576 bytes on device 99: ") && contains(msg, "99"),
               "message: %s", msg.c_str());
        std::printf("ok   allocating on device 99 raised c10::Error: %s\n", msg.c_str());
    }

    // The allocator is usable after the failures.
    p = a->raw_alloc(MiB);
    EXPECT(p != nullptr, "raw_alloc after the OOM: %s", xseg_last_error());
    a->raw_delete(p);
    EXPECT(allocated_bytes() == 0, "allocated %lld at the end", (long long)allocated_bytes());

    unlink(snapshot.c_str());
    rmdir(dir.c_str());
    if (failures)
        return 1;
    std::printf("ok   the adapter raises c10::OutOfMemoryError with xseg's message\n");
    return 0;
}
