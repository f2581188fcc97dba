/* Public: the thread's last error message and status names (the text lives in base/error.c). */
#include "base/error.h"

XSEG_API const char *xseg_last_error(void) { return err_message(); }

XSEG_API const char *xseg_status_name(xseg_status status)
{
    switch (status) {
    case XSEG_SUCCESS: return "XSEG_SUCCESS";
    case XSEG_ERROR_INVALID_VALUE: return "XSEG_ERROR_INVALID_VALUE";
    case XSEG_ERROR_OUT_OF_MEMORY: return "XSEG_ERROR_OUT_OF_MEMORY";
    case XSEG_ERROR_DRIVER: return "XSEG_ERROR_DRIVER";
    case XSEG_ERROR_INVALID_DEVICE: return "XSEG_ERROR_INVALID_DEVICE";
    case XSEG_ERROR_ILLEGAL_STATE: return "XSEG_ERROR_ILLEGAL_STATE";
    case XSEG_ERROR_NOT_SUPPORTED: return "XSEG_ERROR_NOT_SUPPORTED";
    }
    return "XSEG_ERROR_UNKNOWN";
}
