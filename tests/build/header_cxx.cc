// The public header must compile on its own as C++ (PyTorch extensions include it), and still
// declare PyTorch's entry points (xseg_torch.h, which it includes) for code written against it.
#include "xseg.h"

int main()
{
    xseg_stat_counter c = {};
    // Type-checked, never evaluated (inside sizeof): nothing to link.
    void (*torch_free)(void *, size_t, int, struct CUstream_st *) = nullptr;
    return static_cast<int>(c.current) + (sizeof(torch_free = xseg_torch_free) == 0);
}
