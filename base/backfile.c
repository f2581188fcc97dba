/* The file behind a file-backed sleep (backfile.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "base/hostmem.h"
#include "base/backfile.h"

xseg_status backfile_create(struct backfile *sp, const char *path, const char *what)
{
    *sp = (struct backfile){.fd = -1};
    size_t n = strlen(path) + 1;
    char *copy = xs_malloc(n);
    if (!copy)
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "%s: out of host memory", what);
    memcpy(copy, path, n);
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        int e = errno;
        xs_free(copy);
        if (e == EEXIST || e == ELOOP)
            return err_set(XSEG_ERROR_INVALID_VALUE, "%s: refusing '%s': a file or link is there already (%s); the "
                           "file must be new (a link is never followed)", what, path, e == EEXIST ? "EEXIST" : "ELOOP");
        return err_set(e == ENOSPC || e == EDQUOT ? XSEG_ERROR_OUT_OF_MEMORY : XSEG_ERROR_INVALID_VALUE,
                       "%s: cannot create '%s': %s (errno %d)", what, path, strerror(e), e);
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        (void)unlink(path);
        (void)close(fd);
        xs_free(copy);
        return err_set(XSEG_ERROR_INVALID_VALUE, "%s: fstat of '%s': %s (errno %d)", what, path, strerror(e), e);
    }
    *sp = (struct backfile){.fd = fd, .path = copy, .dev = st.st_dev, .ino = st.st_ino};
    return XSEG_SUCCESS;
}

static xseg_status io_fail(const struct backfile *sp, const char *what, const char *op, uint64_t off, size_t len, int e)
{
    if (!e)
        return err_set(XSEG_ERROR_INVALID_VALUE, "%s: %s of %zu bytes at offset %" PRIu64 " of '%s': the file ends "
                       "early (truncated by someone else?)", what, op, len, off, sp->path);
    return err_set(e == ENOSPC || e == EFBIG || e == EDQUOT ? XSEG_ERROR_OUT_OF_MEMORY : XSEG_ERROR_INVALID_VALUE,
                   "%s: %s of %zu bytes at offset %" PRIu64 " of '%s' failed: %s (%s, errno %d)", what, op, len, off,
                   sp->path, strerror(e), e == ENOSPC ? "ENOSPC" : e == EIO ? "EIO" : e == EFBIG ? "EFBIG"
                                                      : e == EDQUOT ? "EDQUOT" : "see errno", e);
}

/* SIGXFSZ blocked on this thread around a write: a write past RLIMIT_FSIZE then fails with
 * EFBIG instead of the signal's default action killing the process. The kernel sends that signal
 * to the writing thread, so blocking it here is enough whatever other threads' masks are. *old:
 * the mask before; false when it could not be changed (the write goes on as before). */
static bool xfsz_block(sigset_t *old)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGXFSZ);
    return pthread_sigmask(SIG_BLOCK, &set, old) == 0;
}

/* The mask of xfsz_block back. After an EFBIG (@p efbig) the SIGXFSZ it raised is pending:
 * taken first (unless the caller had it blocked already: theirs to handle), or unblocking would
 * deliver it and kill the process after all. */
static void xfsz_restore(const sigset_t *old, bool efbig)
{
    if (efbig && !sigismember(old, SIGXFSZ)) {
        sigset_t set, pending;
        sigemptyset(&set);
        sigaddset(&set, SIGXFSZ);
        const struct timespec now = {0, 0};
        while (sigpending(&pending) == 0 && sigismember(&pending, SIGXFSZ))
            if (sigtimedwait(&set, NULL, &now) < 0 && errno != EINTR)
                break;
    }
    (void)pthread_sigmask(SIG_SETMASK, old, NULL);
}

xseg_status backfile_write(struct backfile *sp, const void *buf, size_t len, uint64_t off, const char *what)
{
    const char *p = buf;
    sigset_t old;
    bool masked = xfsz_block(&old);
    int e = 0;
    size_t done = 0;
    while (done < len) {
        ssize_t w = pwrite(sp->fd, p + done, len - done, (off_t)(off + done));
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            e = w < 0 ? errno : ENOSPC;
            break;
        }
        done += (size_t)w;
    }
    if (masked)
        xfsz_restore(&old, e == EFBIG);
    return e ? io_fail(sp, what, "write", off + done, len - done, e) : XSEG_SUCCESS;
}

xseg_status backfile_read(struct backfile *sp, void *buf, size_t len, uint64_t off, const char *what)
{
    char *p = buf;
    for (size_t done = 0; done < len;) {
        ssize_t r = pread(sp->fd, p + done, len - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return io_fail(sp, what, "read", off + done, len - done, r < 0 ? errno : 0);
        done += (size_t)r;
    }
    return XSEG_SUCCESS;
}

void backfile_close(struct backfile *sp)
{
    if (sp->fd < 0)
        return;
    struct stat st;
    if (lstat(sp->path, &st) == 0 && st.st_dev == sp->dev && st.st_ino == sp->ino)
        (void)unlink(sp->path);
    (void)close(sp->fd);
    xs_free(sp->path);
    *sp = (struct backfile){.fd = -1};
}
