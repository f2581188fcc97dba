// The public header must compile on its own as C++ (PyTorch extensions include it), and still
// declare PyTorch's entry points (xseg_torch.h, which it includes) for code written against it.
#include "xseg.h"

int main()
{
    xseg_stat_counter c = {};
    void (*torch_free)(void *, size_t, int, struct CUstream_st *) = xseg_torch_free;
    return static_cast<int>(c.current) + (torch_free == nullptr);
}
