/* The public header must compile on its own, without CUDA headers, as strict C99. */
#include "xseg.h"

int main(void)
{
    xseg_device_stats s = {0};
    xseg_status st = XSEG_SUCCESS;
    return (int)st + (int)s.num_ooms + (sizeof(xseg_segment_info) == 0);
}
