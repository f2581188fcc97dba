/* Files written whole, then renamed into place (snapshots, the live-process log).
 *
 * The data goes to a fresh temporary file in the destination's folder, created with
 * O_CREAT | O_EXCL | O_NOFOLLOW under a random name (64 bits from getrandom), so a link or file
 * planted there is never followed or reused; mode 0666 less the process umask, what fopen would
 * give. afile_commit renames it over the destination: a link at the destination is replaced,
 * never written through, and readers see the old file or the whole new one. Not fsync'd: these
 * are diagnostics, and the OOM path should not wait for the disk. */
#ifndef XSEG_BASE_AFILE_H
#define XSEG_BASE_AFILE_H

#include <stdio.h>

#include "xseg.h"

struct afile {
    FILE *f;   /* write here between afile_open and afile_commit */
    char *tmp; /* the temporary file's name (malloc'd) */
};

/* Create the temporary file for @p path. @p what names the caller in the message.
 * @return XSEG_ERROR_INVALID_VALUE naming the path when it cannot be created,
 *         XSEG_ERROR_OUT_OF_MEMORY for host memory; *a is then empty. */
xseg_status afile_open(struct afile *a, const char *path, const char *what);

/* Close the file and rename it to @p path. On any failure (a write, the close, the rename) the
 * temporary file is removed and the message names @p path and the cause. *a is empty after. */
xseg_status afile_commit(struct afile *a, const char *path, const char *what);

/* Close and remove the temporary file; @p path is left as it was (the caller found the data
 * incomplete, e.g. out of host memory half way). *a is empty after. */
void afile_discard(struct afile *a);

#endif
