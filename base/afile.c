/* Files written whole, then renamed into place (afile.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "base/afile.h"
#include "base/error.h"
#include "base/hostmem.h"

/* 64 unpredictable bits; without getrandom (old kernels, seccomp), the clock, the pid and a
 * counter: guessable, but O_EXCL | O_NOFOLLOW still refuse whatever is planted. */
static uint64_t random_bits(void)
{
    uint64_t r;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) == (ssize_t)sizeof r)
        return r;
    static _Atomic uint64_t seq;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    r = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ ((uint64_t)getpid() << 42) ^
        (atomic_fetch_add(&seq, 1) * 0x9E3779B97F4A7C15ull);
    return r;
}

xseg_status afile_open(struct afile *a, const char *path, const char *what)
{
    a->f = NULL;
    a->tmp = NULL;
    size_t n = strlen(path) + 32;
    char *tmp = xs_malloc(n);
    if (!tmp)
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "%s: out of host memory", what);
    int fd = -1, e = 0;
    /* A name taken (a collision, or something planted): another name. */
    for (int tries = 0; tries < 64; tries++) {
        snprintf(tmp, n, "%s.tmp.%016" PRIx64, path, random_bits());
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        e = errno;
        if (fd >= 0 || e != EEXIST)
            break;
    }
    if (fd < 0) {
        err_set(XSEG_ERROR_INVALID_VALUE, "%s: cannot write %s: cannot create a temporary file beside it: %s",
                what, path, strerror(e));
        xs_free(tmp);
        return XSEG_ERROR_INVALID_VALUE;
    }
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        e = errno;
        close(fd);
        unlink(tmp);
        xs_free(tmp);
        return e == ENOMEM ? err_set(XSEG_ERROR_OUT_OF_MEMORY, "%s: out of host memory writing %s", what, path)
                           : err_set(XSEG_ERROR_INVALID_VALUE, "%s: cannot write %s: %s", what, path, strerror(e));
    }
    a->f = f;
    a->tmp = tmp;
    return XSEG_SUCCESS;
}

xseg_status afile_commit(struct afile *a, const char *path, const char *what)
{
    /* ferror does not keep errno: a failed write's cause is what the flush at close reports
     * again, or EIO. */
    int werr = ferror(a->f) ? EIO : 0;
    errno = 0;
    if (fclose(a->f) != 0)
        werr = errno ? errno : EIO;
    a->f = NULL;
    xseg_status st = XSEG_SUCCESS;
    if (werr) {
        unlink(a->tmp);
        st = err_set(XSEG_ERROR_INVALID_VALUE, "%s: writing %s failed: %s", what, path, strerror(werr));
    } else if (rename(a->tmp, path) != 0) {
        int r = errno;
        unlink(a->tmp);
        st = err_set(XSEG_ERROR_INVALID_VALUE, "%s: cannot rename %s to %s: %s", what, a->tmp, path, strerror(r));
    }
    xs_free(a->tmp);
    a->tmp = NULL;
    return st;
}

void afile_discard(struct afile *a)
{
    fclose(a->f);
    a->f = NULL;
    unlink(a->tmp);
    xs_free(a->tmp);
    a->tmp = NULL;
}
