// The adapter's pinned host allocator (PyTorch 2.8 and later: at::HostAllocator in the registry
// at::getHostAllocator(kCUDA)), installed by the stub module's install_host() over a stand-in of
// PyTorch's own, and called as pin_memory(), the copy kernel (record_event), the host statistics
// and empty_cache, and CUDA graph capture (the pool hooks, the `main` stub interface) call it, on
// cudaemu; each check reads the effect from xseg's host statistics. Not a PyTorch test:
// tests/torch_headers/README.md says what it shows.
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>

#include <ATen/core/CachingHostAllocator.h>
#include <cuda.h>

#include "driver.h"

namespace {
int64_t hstat(const char *key)
{
    int64_t v = -1;
    return xseg_host_stat(key, &v) == XSEG_SUCCESS ? v : -1;
}

// PyTorch's CachingHostAllocator as registered before enable() (REGISTER_HOST_ALLOCATOR, priority
// 0): it owns `block` and counts what is passed on to it.
struct TorchOwnHost : at::HostAllocator {
    static inline char block[4096];
    int records = 0, empties = 0;
    c10::DataPtr allocate(size_t) override { return {block, block, nullptr, c10::Device(c10::DeviceType::CPU, -1)}; }
    void copy_data(void *, const void *, std::size_t) const override {}
    bool record_event(void *, void *ctx, c10::Stream) override
    {
        records++;
        return ctx == block;
    }
    void empty_cache() override { empties++; }
    at::HostStats get_stats() override { return {}; }
    void reset_accumulated_stats() override {}
    void reset_peak_stats() override {}
};

// Emulator controls and the driver calls a test stream needs (from the libcuda stand-in).
template <class F>
F sym(const char *name)
{
    static void *lib = dlopen(std::getenv("XSEG_LIBCUDA"), RTLD_NOW | RTLD_GLOBAL);
    return reinterpret_cast<F>(lib ? dlsym(lib, name) : nullptr);
}
} // namespace

int main()
{
    TorchOwnHost own;
    at::setHostAllocator(c10::DeviceType::CUDA, &own, 0);
    xseg_stub_module *m = load_adapter();
    if (!m)
        return 1;
    std::string why = m->strs.at("install_host")();
    at::HostAllocator *h = at::getHostAllocator(c10::DeviceType::CUDA);
    EXPECT(why.empty() && h && h != &own, "install_host: '%s'; the registry holds %p", why.c_str(), (void *)h);
    if (!h || h == &own)
        return 1;
    at::setHostAllocator(c10::DeviceType::CUDA, &own, 0); // a later registration at PyTorch's priority
    EXPECT(at::getHostAllocator(c10::DeviceType::CUDA) == h, "a priority-0 registration displaced xseg's");
    EXPECT(m->strs.at("install_host")().empty() && at::getHostAllocator(c10::DeviceType::CUDA) == h,
           "a second install_host changed the registry");
    std::printf("ok   install_host: at::getHostAllocator(kCUDA) is xseg's, above PyTorch's priority\n");

    auto stream_create = sym<CUresult (*)(CUstream *, unsigned)>("cuStreamCreate");
    auto retain = sym<CUresult (*)(CUcontext *, CUdevice)>("cuDevicePrimaryCtxRetain");
    auto set_current = sym<CUresult (*)(CUcontext)>("cuCtxSetCurrent");
    auto hold = sym<void (*)(CUstream)>("cudaemu_stream_hold");
    auto release = sym<void (*)(CUstream)>("cudaemu_stream_release");
    auto work = sym<int (*)(CUstream)>("cudaemu_stream_work");
    if (!stream_create || !retain || !set_current || !hold || !release || !work) {
        std::fprintf(stderr, "FAIL the emulator's controls are missing (XSEG_LIBCUDA=%s)\n", std::getenv("XSEG_LIBCUDA"));
        return 1;
    }

    // ---- pin_memory(): a block of xseg's host cache, its statistics in HostStats ----
    c10::DataPtr d = h->allocate(1000);
    void *p = d.get();
    EXPECT(p && d.ctx_ == p && d.device().type == c10::DeviceType::CPU, "allocate(1000): %p ctx %p", p, d.ctx_);
    std::memset(p, 7, 1000);
    EXPECT(hstat("allocation.current") == 1 && hstat("allocated_bytes.current") == 1024, "xseg: %lld blocks, %lld bytes",
           (long long)hstat("allocation.current"), (long long)hstat("allocated_bytes.current"));
    at::HostStats st = h->get_stats();
    EXPECT(st.active_requests.current == 1 && st.active_bytes.current == 1024 && st.allocations.current == 1 &&
               st.allocated_bytes.current == hstat("reserved_bytes.current") && st.num_host_alloc == 1 &&
               st.host_alloc_time.count == 1,
           "get_stats: %lld requests, %lld bytes, %lld segments, %lld reserved, %lld driver allocations",
           (long long)st.active_requests.current, (long long)st.active_bytes.current,
           (long long)st.allocations.current, (long long)st.allocated_bytes.current, (long long)st.num_host_alloc);
    EXPECT(h->raw_deleter() == d.get_deleter() && d.get_deleter(), "raw_deleter is not the DataPtr's deleter");
    EXPECT(h->allocate(0).get() == nullptr, "allocate(0) gave memory");
    char copy[16];
    h->copy_data(copy, p, sizeof copy);
    EXPECT(copy[0] == 7 && copy[15] == 7, "copy_data");
    std::printf("ok   allocate: xseg_host_malloc's block, HostStats from xseg's host keys\n");

    // ---- record_event: no reuse before the stream's work up to the free is done ----
    CUcontext ctx = nullptr;
    CUstream s = nullptr, s2 = nullptr;
    EXPECT(retain(&ctx, 0) == CUDA_SUCCESS && set_current(ctx) == CUDA_SUCCESS, "context");
    EXPECT(stream_create(&s, 1) == CUDA_SUCCESS && stream_create(&s2, 1) == CUDA_SUCCESS, "streams");
    hold(s);
    EXPECT(work(s) == 0, "queueing work on the held stream");
    EXPECT(h->record_event(p, d.ctx_, c10::Stream(0, s)), "record_event of xseg's block returned false");
    d.get_deleter()(p);
    EXPECT(hstat("allocation.current") == 0, "the free did not return the block");
    h->empty_cache();
    EXPECT(h->get_stats().allocations.current == 1, "empty_cache released a segment the stream still uses");
    release(s);
    h->empty_cache();
    EXPECT(h->get_stats().allocations.current == 0, "the segment stayed after the stream's work was done");
    std::printf("ok   record_event: the block waits for its stream, then empty_cache gives it back\n");

    // ---- tensors pinned before install: record_event and empty_cache reach PyTorch's own ----
    EXPECT(h->record_event(TorchOwnHost::block, TorchOwnHost::block, c10::Stream(0, s)) && own.records == 1,
           "record_event of PyTorch's block: %d calls passed on", own.records);
    EXPECT(own.empties == 2, "empty_cache passed on %d times", own.empties);
    std::printf("ok   a block of the allocator installed before goes to it\n");

    // ---- resets ----
    c10::DataPtr e = h->allocate(MiB);
    e.get_deleter()(e.get());
    h->reset_peak_stats();
    st = h->get_stats();
    EXPECT(st.active_bytes.peak == 0 && st.host_alloc_time.max == 0, "reset_peak_stats: peak %lld, max %lld",
           (long long)st.active_bytes.peak, (long long)st.host_alloc_time.max);
    h->reset_accumulated_stats();
    st = h->get_stats();
    EXPECT(st.num_host_alloc == 0 && st.active_requests.allocated == 0 && st.host_alloc_time.count == 0,
           "reset_accumulated_stats: %lld driver allocations, %lld requests", (long long)st.num_host_alloc,
           (long long)st.active_requests.allocated);

    // ---- out of pinned memory: c10::OutOfMemoryError with xseg's message; usable afterwards ----
    try {
        h->allocate(size_t(1) << 50);
        EXPECT(false, "a 1 PiB pinned allocation succeeded");
    } catch (const c10::OutOfMemoryError &err) {
        EXPECT(contains(err.what(), "xseg") && contains(err.what(), "pinned"), "message: %s", err.what());
    }
    c10::DataPtr after = h->allocate(100);
    EXPECT(after.get() != nullptr, "allocation after the OOM");
    after.get_deleter()(after.get());
    std::printf("ok   resets, and OOM raised as c10::OutOfMemoryError\n");

    // ---- CUDA graph capture into a pool: its blocks wait for the pool's release ----
    c10::MempoolId_t pool{5, 0};
    c10::DataPtr before = h->allocate(8192); // allocated before, used by the capture
    fake_current_stream = reinterpret_cast<cudaStream_t>(s2);
    h->begin_allocate_to_pool(pool, [s2](c10::Stream st) { return st.native_handle() == (void *)s2; });
    c10::DataPtr in = h->allocate(4096);
    EXPECT(h->record_event(before.get(), before.get(), c10::Stream(0, s2)), "record_event during the capture");
    fake_current_stream = nullptr; // another stream: not the capture's
    c10::DataPtr other = h->allocate(4096);
    h->end_allocate_to_pool(pool);
    fake_current_stream = reinterpret_cast<cudaStream_t>(s2);
    c10::DataPtr later = h->allocate(4096);
    for (c10::DataPtr *x : {&before, &in, &other, &later})
        x->get_deleter()(x->get());
    EXPECT(hstat("allocation.current") == 2, "%lld blocks live after the frees (the capture's two are held)",
           (long long)hstat("allocation.current"));
    h->release_pool(pool);
    EXPECT(hstat("allocation.current") == 0, "%lld blocks live after release_pool", (long long)hstat("allocation.current"));
    fake_current_stream = nullptr;
    std::printf("ok   pool hooks: the capture's blocks are reused only after release_pool\n");

    h->empty_cache();
    EXPECT(hstat("segment.current") == 0, "%lld segments at the end", (long long)hstat("segment.current"));
    if (failures)
        return 1;
    std::printf("ok   the pinned host allocator\n");
    return 0;
}
