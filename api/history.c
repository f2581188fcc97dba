/* Public entry points of allocation history and snapshots (include/xseg.h): argument
 * checks and device iteration; the work is in core/process/history.c and core/snapshot.c. */
#include "api/api.h"
#include "api/dispatch.h"
#include "base/error.h"
#include "core/alloc.h"
#include "core/devops.h"
#include "core/process/history.h"
#include "core/runtime.h"
#include "core/snapshot.h"

XSEG_API xseg_status xseg_history_enabled(int *enabled)
{
    if (!enabled)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_history_enabled: enabled is NULL");
    *enabled = hist_mode() != 0;
    return XSEG_SUCCESS;
}

static xseg_status history_start_on(struct dev_alloc *d, void *ctx)
{
    (void)ctx;
    devops_history_start(d);
    return XSEG_SUCCESS;
}

XSEG_API xseg_status xseg_record_memory_history(const xseg_history_options *opts)
{
    xseg_status st = rt_ensure();
    if (st != XSEG_SUCCESS)
        return st;
    unsigned before = hist_mode();
    if ((st = hist_configure(opts)) != XSEG_SUCCESS)
        return st;
    /* Starting: every device's live blocks get their frees recorded, and malloc leaves its fast
     * path (devices created later start without the permit and see the mode themselves). */
    return !before && hist_mode() ? api_each_device(-1, history_start_on, NULL) : XSEG_SUCCESS;
}

/* The writers' arguments, checked here so that core/snapshot.c trusts its callers: a non-empty
 * @p path, the runtime initialized, @p device -1 (all) or a device the driver reports. */
static xseg_status check_writer(const char *what, int device, const char *path)
{
    if (!path || !*path)
        return err_set(XSEG_ERROR_INVALID_VALUE, "%s: path is %s", what, path ? "empty" : "NULL");
    xseg_status st = rt_ensure();
    if (st != XSEG_SUCCESS)
        return st;
    int ndev = rt_device_count();
    if (device < -1 || device >= ndev)
        return err_set(XSEG_ERROR_INVALID_DEVICE, "%s: invalid device %d: the driver reports %d device%s", what,
                       device, ndev, ndev == 1 ? "" : "s");
    return XSEG_SUCCESS;
}

XSEG_API xseg_status xseg_dump_snapshot(int device, const char *path)
{
    xseg_status st = check_writer("xseg_dump_snapshot", device, path);
    return st == XSEG_SUCCESS ? snapshot_write(device, path, false) : st;
}

XSEG_API xseg_status xseg_dump_snapshot_json(int device, const char *path)
{
    xseg_status st = check_writer("xseg_dump_snapshot_json", device, path);
    return st == XSEG_SUCCESS ? snapshot_write(device, path, true) : st;
}

XSEG_API xseg_status xseg_set_oom_snapshot(const char *path) { return snapshot_set_oom_path(path); }

XSEG_API xseg_status xseg_dump_trace(int device, const char *path)
{
    xseg_status st = check_writer("xseg_dump_trace", device, path);
    return st == XSEG_SUCCESS ? snapshot_write_trace(device, path) : st;
}
