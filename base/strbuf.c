#include <stdarg.h>
#include <stdio.h>

#include "base/strbuf.h"

void strbuf_printf(struct strbuf *sb, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *dst = sb->len < sb->size ? sb->buf + sb->len : NULL;
    size_t room = sb->len < sb->size ? sb->size - sb->len : 0;
    int n = vsnprintf(dst, room, fmt, ap);
    va_end(ap);
    if (n > 0)
        sb->len += (size_t)n;
}
