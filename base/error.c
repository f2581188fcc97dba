/* Thread-local error text. Every failing path writes it once, where the detail is known; callers
 * further up may prefix context but never overwrite it. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"

#define ERR_MSG_MAX 1024

static _Thread_local char err_msg[ERR_MSG_MAX];

xseg_status err_set(xseg_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_msg, sizeof err_msg, fmt, ap);
    va_end(ap);
    return status;
}

xseg_status err_prefix(xseg_status status, const char *fmt, ...)
{
    char prev[ERR_MSG_MAX];
    memcpy(prev, err_msg, sizeof prev);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(err_msg, sizeof err_msg, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < sizeof err_msg && prev[0])
        snprintf(err_msg + n, sizeof err_msg - (size_t)n, ": %s", prev);
    return status;
}

xseg_status err_suffix(xseg_status status, const char *fmt, ...)
{
    size_t n = strlen(err_msg);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_msg + n, sizeof err_msg - n, fmt, ap);
    va_end(ap);
    return status;
}

struct err_kept err_keep(void)
{
    struct err_kept k;
    size_t n = strnlen(err_msg, sizeof k.msg - 1);
    memcpy(k.msg, err_msg, n);
    k.msg[n] = '\0';
    return k;
}

void err_clear(void) { err_msg[0] = '\0'; }

const char *err_format_size(size_t bytes, char buf[32])
{
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (bytes < 1024) {
        snprintf(buf, 32, "%zu bytes", bytes);
        return buf;
    }
    double v = (double)bytes / 1024.0;
    size_t u = 0;
    while (v >= 1024.0 && u + 1 < sizeof units / sizeof units[0]) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, 32, "%.2f %s", v, units[u]);
    return buf;
}

const char *err_message(void) { return err_msg; }
