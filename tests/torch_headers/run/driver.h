// What the drivers run against the stand-in share (oom_driver.cpp, hooks_driver.cpp): the stub
// module's entry point, EXPECT with its failure count, and install() making the adapter the
// current allocator. Each driver is its own program: this header is included once in each.
#pragma once

#include <c10/util/Exception.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>
#include <torch/extension.h>

#include <cstdio>
#include <string>

#include "xseg.h"

void xseg_stub_init_module(xseg_stub_module &m);

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

bool contains(const std::string &s, const std::string &part) { return s.find(part) != std::string::npos; }

// The stub module's install(), as `xseg.torch.enable()` calls it; @return the adapter, now the
// current allocator, or nullptr (said on stderr) when it did not become it.
[[maybe_unused]] Pluggable *install_adapter()
{
    static xseg_stub_module m;
    xseg_stub_init_module(m);
    m.fns.at("install")();
    auto current = torch::cuda::CUDAPluggableAllocator::getCurrentAllocator();
    auto *a = dynamic_cast<Pluggable *>(current.get());
    if (!a || a->name() != "xseg") {
        std::fprintf(stderr, "FAIL install() did not make the adapter the current allocator\n");
        return nullptr;
    }
    return a;
}
} // namespace
