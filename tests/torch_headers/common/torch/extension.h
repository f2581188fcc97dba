// Scaffolding (tests/torch_headers/common/README.md): what the adapter uses of
// torch/extension.h (pybind11's module macro). The stub module keeps the functions defined with
// no arguments by name (and apart, those returning a string), so that the run/ drivers can call
// the adapter's install() and install_host() once they have loaded it (run/driver.h).
#pragma once
#include <functional>
#include <map>
#include <string>
#include <type_traits>

#ifndef TORCH_EXTENSION_NAME
#define TORCH_EXTENSION_NAME xseg_torch_adapter_check
#endif
struct xseg_stub_module {
    std::map<std::string, std::function<void()>> fns;
    std::map<std::string, std::function<std::string()>> strs; // those that return a string
    template <class F>
    void def(const char *name, F f, const char *)
    {
        if constexpr (std::is_invocable_v<F>)
            fns[name] = f;
        if constexpr (std::is_invocable_r_v<std::string, F>)
            strs[name] = f;
    }
};
// The module's entry point, found by name when the module is loaded (as PyInit_<name> is).
#define PYBIND11_MODULE(name, m)                                                                  \
    extern "C" __attribute__((visibility("default"))) void xseg_stub_init_module(xseg_stub_module &m); \
    extern "C" void xseg_stub_init_module(xseg_stub_module &m)
