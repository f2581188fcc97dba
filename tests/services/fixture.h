/*
 * The services suite's shared fixture (test_services.c, test_host.c): the pinned host cache's
 * calls that must succeed, and the check that it gave everything back. Include after cmocka.h
 * and tests/common/testutil.h.
 */
#ifndef XSEG_TESTS_SERVICES_FIXTURE_H
#define XSEG_TESTS_SERVICES_FIXTURE_H

#include <stdint.h>

#include "tests/common/testutil.h"
#include "xseg.h"

#define MiB ((size_t)1 << 20)

static inline int64_t hstat(const char *key)
{
    int64_t v = -1;
    if (xseg_host_stat(key, &v) != XSEG_SUCCESS)
        fail_msg("xseg_host_stat(%s): %s", key, xseg_last_error());
    return v;
}

static inline void *hmalloc(size_t size)
{
    void *p = NULL;
    if (xseg_host_malloc(&p, size) != XSEG_SUCCESS)
        fail_msg("xseg_host_malloc(%zu): %s", size, xseg_last_error());
    assert_non_null(p);
    return p;
}

static inline void hfree(void *p)
{
    if (xseg_host_free(p) != XSEG_SUCCESS)
        fail_msg("xseg_host_free(%p): %s", p, xseg_last_error());
}

/* Everything given back: no pinned memory left with the driver, the statistics at zero. */
static inline void assert_host_empty(void)
{
    assert_int_equal(xseg_host_empty_cache(), XSEG_SUCCESS);
    assert_int_equal(hstat("segment.current"), 0);
    assert_int_equal(hstat("reserved_bytes.current"), 0);
    assert_int_equal(hstat("allocation.current"), 0);
    if (tu_emulated())
        assert_int_equal(tu_host_live(NULL), 0);
}

#endif
