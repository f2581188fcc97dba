/* The public headers must compile on their own, without CUDA headers, as strict C99: xseg_torch.h
 * first (it includes xseg.h), and xseg.h still declaring the xseg_torch_* entry points. */
#include "xseg_torch.h"
#include "xseg.h"

int main(void)
{
    xseg_device_stats s = {0};
    xseg_status st = XSEG_SUCCESS;
    /* The assignment is type-checked but, inside sizeof, never evaluated: nothing to link. */
    void *(*torch_malloc)(size_t, int, struct CUstream_st *) = 0;
    return (int)st + (int)s.num_ooms + (sizeof(xseg_segment_info) == 0) +
           (sizeof(torch_malloc = xseg_torch_malloc) == 0);
}
