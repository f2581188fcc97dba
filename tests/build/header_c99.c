/* The public headers must compile on their own, without CUDA headers, as strict C99: xseg_torch.h
 * first (it includes xseg.h), and xseg.h still declaring the xseg_torch_* entry points. */
#include "xseg_torch.h"
#include "xseg.h"

int main(void)
{
    xseg_device_stats s = {0};
    xseg_status st = XSEG_SUCCESS;
    void *(*torch_malloc)(size_t, int, struct CUstream_st *) = xseg_torch_malloc;
    return (int)st + (int)s.num_ooms + (sizeof(xseg_segment_info) == 0) + (torch_malloc == 0);
}
