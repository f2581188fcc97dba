// Scaffolding (tests/torch_headers/common/README.md): what the adapter uses of
// torch/extension.h (pybind11's module macro).
#pragma once
#ifndef TORCH_EXTENSION_NAME
#define TORCH_EXTENSION_NAME xseg_torch_adapter_check
#endif
struct xseg_stub_module {
    template <class F>
    void def(const char *, F, const char *)
    {
    }
};
#define PYBIND11_MODULE(name, m)                                                                  \
    void xseg_stub_init_##name(xseg_stub_module &m);                                              \
    void xseg_stub_init_##name(xseg_stub_module &m)
