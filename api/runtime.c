/* Public: initialization, configuration, device count, callbacks (state in core/runtime.c and
 * core/process/settings.c). */
#include "base/error.h"
#include "core/process/config.h"
#include "core/runtime.h"
#include "core/process/settings.h"
#include "core/shutdown.h"

XSEG_API xseg_status xseg_init(const char *config) { return rt_init(config); }

XSEG_API xseg_status xseg_set_config(const char *config)
{
    if (!config)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_set_config: config is NULL");
    return rt_set_config(config);
}

XSEG_API xseg_status xseg_get_config(char *buf, size_t size, size_t *len)
{
    /* A forked child reads the configuration it inherited (it has no runtime to initialize). */
    xseg_status st = rt_forked_child() ? XSEG_SUCCESS : rt_ensure();
    if (st != XSEG_SUCCESS)
        return st;
    if (!buf && size)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_get_config: buf is NULL but size is %zu", size);
    struct cfg c;
    unsigned gen;
    settings_copy(&c, &gen);
    cfg_format(&c, buf, size, len);
    return XSEG_SUCCESS;
}

XSEG_API xseg_status xseg_check_config(const char *config, char *canonical, size_t size, size_t *len)
{
    if (!config)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_check_config: config is NULL");
    if (!canonical && size)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_check_config: canonical is NULL but size is %zu", size);
    struct cfg def, out;
    cfg_default(&def);
    xseg_status st = cfg_parse(config, &def, &out);
    if (st != XSEG_SUCCESS)
        return st;
    cfg_format(&out, canonical, size, len);
    return XSEG_SUCCESS;
}

XSEG_API xseg_status xseg_shutdown(void) { return shutdown_process(); }

XSEG_API xseg_status xseg_device_count(int *count)
{
    if (!count)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_device_count: count is NULL");
    xseg_status st = rt_ensure();
    if (st != XSEG_SUCCESS)
        return st;
    *count = rt_device_count();
    return XSEG_SUCCESS;
}

XSEG_API xseg_status xseg_attach_oom_observer(xseg_oom_observer fn, void *user)
{
    if (!fn)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_attach_oom_observer: fn is NULL");
    return settings_add_oom_observer(fn, user);
}

XSEG_API xseg_status xseg_attach_stale_observer(xseg_stale_observer fn, void *user)
{
    if (!fn)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_attach_stale_observer: fn is NULL");
    return settings_add_stale_observer(fn, user);
}

XSEG_API xseg_status xseg_attach_free_memory_callback(xseg_free_memory_callback fn, void *user)
{
    if (!fn)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_attach_free_memory_callback: fn is NULL");
    return settings_add_free_memory_callback(fn, user);
}
