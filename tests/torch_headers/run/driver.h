// What the drivers run against the stand-in share (oom_driver.cpp, hooks_driver.cpp, ...): the
// adapter loaded as PyTorch's import loads an extension, EXPECT with its failure count,
// install() making the adapter the current allocator and alloc_on() asking for memory as PyTorch
// does (device memory: devmem.h). Each driver is its own program: this header is included once in each.
#pragma once

#include <dlfcn.h>

#include <c10/util/Exception.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>
#include <torch/extension.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "xseg.h"

extern cudaStream_t fake_current_stream;
extern c10::DeviceIndex fake_current_device;

namespace {
using Pluggable = torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;
constexpr size_t MiB = size_t(1) << 20;
int failures = 0;

#define EXPECT(cond, ...)                                                                         \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            std::fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                  \
            std::fprintf(stderr, __VA_ARGS__);                                                    \
            std::fputc('\n', stderr);                                                             \
            failures++;                                                                           \
        }                                                                                         \
    } while (0)

[[maybe_unused]] bool contains(const std::string &s, const std::string &part) { return s.find(part) != std::string::npos; }

// The adapter, built as a module of its own ($XSEG_TORCH_ADAPTER) against the stand-in libtorch,
// loaded with RTLD_NOW as Python imports an extension: a symbol the stand-in does not export (as
// the real libraries would not) fails here, naming it. @return its stub module, or nullptr (said
// on stderr).
[[maybe_unused]] xseg_stub_module *load_adapter()
{
    static xseg_stub_module m;
    static bool loaded = false;
    if (loaded)
        return &m;
    const char *path = std::getenv("XSEG_TORCH_ADAPTER");
    void *h = path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : nullptr;
    if (!h) {
        std::fprintf(stderr, "FAIL the adapter does not load: %s\n", path ? dlerror() : "XSEG_TORCH_ADAPTER is not set");
        return nullptr;
    }
    auto init = reinterpret_cast<void (*)(xseg_stub_module &)>(dlsym(h, "xseg_stub_init_module"));
    if (!init) {
        std::fprintf(stderr, "FAIL %s has no xseg_stub_init_module\n", path);
        return nullptr;
    }
    init(m);
    loaded = true;
    return &m;
}

// The stub module's install(), as `xseg.torch.enable()` calls it; @return the adapter, now the
// current allocator, or nullptr (said on stderr) when it did not load or become it.
[[maybe_unused]] Pluggable *install_adapter()
{
    xseg_stub_module *m = load_adapter();
    if (!m)
        return nullptr;
    m->fns.at("install")();
    auto current = torch::cuda::CUDAPluggableAllocator::getCurrentAllocator();
    auto *a = dynamic_cast<Pluggable *>(current.get());
    if (!a || a->name() != "xseg") {
        std::fprintf(stderr, "FAIL install() did not make the adapter the current allocator\n");
        return nullptr;
    }
    return a;
}

// @p size bytes on @p device for @p stream, as PyTorch asks for them: raw_alloc_with_stream on the
// current device (a caching_allocator_alloc; allocate() is the same path with a DataPtr).
[[maybe_unused]] void *alloc_on(Pluggable *a, size_t size, int device, cudaStream_t stream)
{
    c10::DeviceIndex saved = fake_current_device;
    fake_current_device = (c10::DeviceIndex)device;
    try {
        void *p = a->raw_alloc_with_stream(size, stream);
        fake_current_device = saved;
        return p;
    } catch (...) {
        fake_current_device = saved;
        throw;
    }
}
} // namespace
