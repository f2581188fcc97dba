// Device memory as the drivers that check bytes reach it (hooks_driver.cpp, ipc_driver.cpp):
// through the CUDA driver xseg loaded, never a host touch. Included once in each program.
#pragma once

#include <cstdlib>

#include <cuda.h>
#include <dlfcn.h>

namespace {
// Device memory through the driver xseg loaded ($XSEG_LIBCUDA, else libcuda.so.1), with device 0's
// primary context current on the calling thread: a host touch of device memory faults, on a GPU as
// on cudaemu. dev_set: true when the memset went through; dev_byte: the byte, or -1.
#define XSEG_STUB_ABI2(x) #x
#define XSEG_STUB_ABI(x) XSEG_STUB_ABI2(x)
struct dev_calls {
    decltype(&::cuMemsetD8) memset_d8 = nullptr;
    decltype(&::cuMemcpyDtoH) dtoh = nullptr;
    decltype(&::cuCtxSynchronize) sync = nullptr;
    decltype(&::cuDevicePrimaryCtxRetain) retain = nullptr;
    decltype(&::cuCtxSetCurrent) set_current = nullptr;
};
[[maybe_unused]] const dev_calls &dev_driver()
{
    static dev_calls c = [] {
        dev_calls d;
        const char *path = std::getenv("XSEG_LIBCUDA");
        void *lib = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOLOAD | RTLD_NOW);
        if (lib) {
            d.memset_d8 = reinterpret_cast<decltype(d.memset_d8)>(dlsym(lib, XSEG_STUB_ABI(cuMemsetD8)));
            d.dtoh = reinterpret_cast<decltype(d.dtoh)>(dlsym(lib, XSEG_STUB_ABI(cuMemcpyDtoH)));
            d.sync = reinterpret_cast<decltype(d.sync)>(dlsym(lib, XSEG_STUB_ABI(cuCtxSynchronize)));
            d.retain = reinterpret_cast<decltype(d.retain)>(dlsym(lib, XSEG_STUB_ABI(cuDevicePrimaryCtxRetain)));
            d.set_current = reinterpret_cast<decltype(d.set_current)>(dlsym(lib, XSEG_STUB_ABI(cuCtxSetCurrent)));
        }
        return d;
    }();
    return c;
}
[[maybe_unused]] bool dev_ctx()
{
    const dev_calls &d = dev_driver();
    static CUcontext ctx = nullptr; // retained once, kept for the program's life
    if (!ctx && (!d.retain || d.retain(&ctx, 0) != CUDA_SUCCESS))
        ctx = nullptr;
    return ctx && d.set_current && d.set_current(ctx) == CUDA_SUCCESS;
}
[[maybe_unused]] bool dev_set(void *p, unsigned char v, size_t n)
{
    const dev_calls &d = dev_driver();
    return dev_ctx() && d.memset_d8 && d.sync && d.memset_d8(reinterpret_cast<CUdeviceptr>(p), v, n) == CUDA_SUCCESS &&
           d.sync() == CUDA_SUCCESS;
}
[[maybe_unused]] int dev_byte(const void *p)
{
    const dev_calls &d = dev_driver();
    unsigned char b = 0;
    if (!dev_ctx() || !d.dtoh || d.dtoh(&b, reinterpret_cast<CUdeviceptr>(p), 1) != CUDA_SUCCESS)
        return -1;
    return b;
}
} // namespace
