/* The file behind a file-backed sleep (xseg_sleep_ex with XSEG_SLEEP_OFFLOAD_FILE).
 *
 * Created with O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode 0600: an existing file or a link
 * planted at the path is refused, never followed, truncated or reused, and only the owner reads
 * the device bytes in it. Transfers are whole: pwrite/pread continue after a short transfer and
 * retry EINTR; a failure (ENOSPC, EIO, EFBIG over RLIMIT_FSIZE, a file shorter than written)
 * names the path, the offset and the errno. A write blocks SIGXFSZ on its thread and takes the
 * one its EFBIG raised, so going past RLIMIT_FSIZE is that error, not the signal killing the
 * process. backfile_close unlinks the path only while it still
 * names the file created here (same device and inode), so a file someone put there is kept. */
#ifndef XSEG_BASE_BACKFILE_H
#define XSEG_BASE_BACKFILE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "xseg.h"

struct backfile {
    int fd;     /* -1: none */
    char *path; /* xs_malloc'd copy */
    dev_t dev;
    ino_t ino;
};

/* Create the file at @p path (*sp empty on failure). @p what names the caller in the message:
 * INVALID_VALUE for an existing path or a link ("refusing"), the open's errno otherwise. */
xseg_status backfile_create(struct backfile *sp, const char *path, const char *what);
/* Write (read) @p len bytes at @p off. XSEG_ERROR_DRIVER is not used: a failed transfer is
 * XSEG_ERROR_OUT_OF_MEMORY for ENOSPC/EFBIG/EDQUOT (no room), else XSEG_ERROR_INVALID_VALUE. */
xseg_status backfile_write(struct backfile *sp, const void *buf, size_t len, uint64_t off, const char *what);
xseg_status backfile_read(struct backfile *sp, void *buf, size_t len, uint64_t off, const char *what);
/* Close the file and unlink its path (see above); *sp empty after. No effect on an empty one. */
void backfile_close(struct backfile *sp);

#endif
