/*
 * PyTorch snapshots given to xseg-replay: recognized by their first byte (a pickle's PROTO
 * opcode, 0x80, whatever the file is called) and converted, one trace file per device that holds
 * data, by the data-only converter tools/snapshot2trace.py run with python3 (it imports nothing
 * the file names and bounds memory and nesting; see its docstring). The library never needs
 * Python; only this step of the tool does, and it says so when python3 is missing.
 */
#ifndef XSEG_TOOLS_REPLAY_SNAPSHOT_H
#define XSEG_TOOLS_REPLAY_SNAPSHOT_H

#include <stddef.h>
#include <sys/types.h>

#include "xseg.h"

/* One device of a converted snapshot. */
struct snapshot_device {
    int device;
    char *trace_path; /* the converted trace (in the caller's folder), malloc'd */
    char *name;       /* "FILE (device N)", for tables and messages, malloc'd */
};

/* 1 when the file at @p path starts with a pickle's PROTO opcode (0x80), 0 otherwise (also when
 * it cannot be read: the trace reader then reports why). */
int snapshot_is_pickle(const char *path);
/* Is @p path named as a snapshot (".pickle", any case) but empty? 1 with the reason in @p why; 0
 * otherwise (a snapshot, a trace in text under any name, or a file that cannot be opened). An
 * empty text trace replays nothing; an empty snapshot is a failed dump, worth an error. */
int snapshot_named_but_not(const char *path, char *why, size_t len);

/*
 * Convert the snapshot at @p path into @p dir (an existing folder the caller owns): one trace per
 * device that holds data, or device @p device only when it is >= 0. @p frames keeps the
 * allocations' frames (for --history and --report). On success *@p devs (malloc'd, free with
 * snapshot_devices_free) holds *@p n >= 1 entries. On failure returns XSEG_ERROR_INVALID_VALUE;
 * the converter has then printed its one-line message on stderr, or @p err holds one (python3 or
 * the converter missing), possibly empty when the message is already out.
 */
xseg_status snapshot_convert(const char *path, int device, int frames, const char *dir,
                             struct snapshot_device **devs, size_t *n, char *err, size_t errlen);

void snapshot_devices_free(struct snapshot_device *devs, size_t n);

/* The converter's process while snapshot_convert waits for it, else 0: a signal handler stops
 * it before removing the folder it writes into. */
extern volatile pid_t snapshot_converter_pid;

#endif
