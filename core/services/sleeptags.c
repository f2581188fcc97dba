/* The pools' tags and the plans of a tagged sleep or wake (core/services/sleeptags.h). */
#include "core/services/sleeptags.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "base/hostmem.h"
#include "base/vec.h"
#include "core/device/check.h"
#include "core/services/sleep.h"

static inline bool id_eq(xseg_pool_id a, xseg_pool_id b) { return a.first == b.first && a.second == b.second; }

/* Is @p tag well formed: 1 to XSEG_TAG_MAX - 1 characters of [A-Za-z0-9_.-]? Else the error, in
 * @p fn's name. */
static xseg_status tag_check(const char *fn, const char *tag)
{
    if (!tag)
        return err_set(XSEG_ERROR_INVALID_VALUE, "%s: a tag is NULL", fn);
    size_t n = strnlen(tag, XSEG_TAG_MAX);
    if (!n || n == XSEG_TAG_MAX)
        return err_set(XSEG_ERROR_INVALID_VALUE, "%s: a tag has 1 to %d characters, got %s", fn, XSEG_TAG_MAX - 1,
                       n ? "a longer one" : "an empty one");
    size_t ok = strspn(tag, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-");
    if (ok != n)
        return err_set(XSEG_ERROR_INVALID_VALUE, "%s: tag '%.31s' has a character other than letters, digits, "
                       "'_', '.' and '-' (byte %zu, 0x%02x)", fn, tag, ok, (unsigned char)tag[ok]);
    return XSEG_SUCCESS;
}

/* Each tag of @p tags well formed and given once. */
static xseg_status tags_check_list(const char *fn, const char *const *tags, size_t count, size_t stride)
{
    if (!count)
        return err_set(XSEG_ERROR_INVALID_VALUE, "%s: no tag given (count is 0)", fn);
    if (!tags)
        return err_set(XSEG_ERROR_INVALID_VALUE, "%s: tags is NULL with a count of %zu", fn, count);
    for (size_t i = 0; i < count; i++) {
        const char *t = *(const char *const *)((const char *)tags + i * stride);
        xseg_status st = tag_check(fn, t);
        if (st != XSEG_SUCCESS)
            return st;
        for (size_t j = 0; j < i; j++)
            if (!strcmp(t, *(const char *const *)((const char *)tags + j * stride)))
                return err_set(XSEG_ERROR_INVALID_VALUE, "%s: tag '%s' is given twice (entries %zu and %zu)", fn, t,
                               j, i);
    }
    return XSEG_SUCCESS;
}

/* Drop the tags of pools seen before and gone now; note the pools that exist. */
static void tags_prune(struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    size_t keep = 0;
    for (size_t i = 0; i < d->tags.n; i++) {
        struct pool_tag *t = &d->tags.v[i];
        bool exists;
        (void)sleep_where(d, t->pool, &exists);
        if (!exists && t->seen)
            continue;
        t->seen |= exists;
        d->tags.v[keep++] = *t;
    }
    d->tags.n = keep;
}

static struct pool_tag *tag_of(struct dev_alloc *d, xseg_pool_id pool)
{
    lock_assert_held(&d->lock);
    for (size_t i = 0; i < d->tags.n; i++)
        if (id_eq(d->tags.v[i].pool, pool))
            return &d->tags.v[i];
    return NULL;
}

static bool tag_known(const struct dev_alloc *d, const char *tag)
{
    lock_assert_held(&d->lock);
    for (size_t i = 0; i < d->tags.n; i++)
        if (!strcmp(d->tags.v[i].tag, tag))
            return true;
    return false;
}

/* INVALID_VALUE for a tag no pool of @p d carries, listing the tags it has. */
static xseg_status tag_unknown(struct dev_alloc *d, const char *fn, const char *tag)
{
    lock_assert_held(&d->lock);
    char list[256] = "";
    size_t len = 0;
    for (size_t i = 0; i < d->tags.n && len < sizeof list - 1; i++) {
        bool seen = false;
        for (size_t j = 0; j < i && !seen; j++)
            seen = !strcmp(d->tags.v[j].tag, d->tags.v[i].tag);
        if (!seen) {
            int w = snprintf(list + len, sizeof list - len, "%s'%s'", len ? ", " : "", d->tags.v[i].tag);
            len += w > 0 ? (size_t)w : 0;
        }
    }
    return err_set(XSEG_ERROR_INVALID_VALUE, "%s: no pool of device %d carries tag '%s' (%s%s)", fn, d->device, tag,
                   len ? "its tags: " : "no pool of it is tagged: xseg_pool_set_tag", list);
}

xseg_status tags_set(struct dev_alloc *d, xseg_pool_id pool, const char *tag)
{
    bool clear = !tag || !*tag;
    xseg_status st = clear ? XSEG_SUCCESS : tag_check("xseg_pool_set_tag", tag);
    if (st != XSEG_SUCCESS)
        return st;
    dev_lock(d, DEV_NEED_OP);
    tags_prune(d);
    struct pool_tag *t = tag_of(d, pool);
    if (clear) {
        if (t) /* the order of the rest is kept: a wake goes through a tag's pools in it */
            memmove(t, t + 1, (size_t)(d->tags.v + d->tags.n - (t + 1)) * sizeof *t);
        d->tags.n -= t != NULL;
    } else if (!t && !VEC_RESERVE(d->tags.v, d->tags.cap, d->tags.n + 1)) {
        st = err_set(XSEG_ERROR_OUT_OF_MEMORY, "xseg_pool_set_tag: out of host memory");
    } else {
        if (!t) {
            t = &d->tags.v[d->tags.n++];
            *t = (struct pool_tag){.pool = pool};
            (void)sleep_where(d, pool, &t->seen);
        }
        snprintf(t->tag, sizeof t->tag, "%s", tag);
    }
    dev_unlock(d);
    return st;
}

xseg_status tags_get(struct dev_alloc *d, xseg_pool_id pool, char *out, size_t capacity)
{
    if (!out)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_pool_get_tag: tag is NULL");
    dev_lock(d, DEV_NEED_OP);
    tags_prune(d);
    const struct pool_tag *t = tag_of(d, pool);
    size_t n = t ? strlen(t->tag) : 0;
    xseg_status st = XSEG_SUCCESS;
    if (n >= capacity)
        st = err_set(XSEG_ERROR_INVALID_VALUE, "xseg_pool_get_tag: the tag '%s' needs %zu bytes, capacity is %zu",
                     t->tag, n + 1, capacity);
    else
        memcpy(out, t ? t->tag : "", n + 1);
    dev_unlock(d);
    return st;
}

static bool plan_add(struct tag_target **v, size_t *n, size_t *cap, const struct pool_tag *t, unsigned flags)
{
    if (!VEC_RESERVE(*v, *cap, *n + 1))
        return false;
    struct tag_target *x = &(*v)[(*n)++];
    x->pool = t->pool;
    x->flags = flags;
    memcpy(x->tag, t->tag, sizeof x->tag);
    return true;
}

static const char *pool_words(xseg_pool_id id, char buf[64])
{
    if (!id.first && !id.second)
        return "the default pool";
    snprintf(buf, 64, "pool {%" PRIu64 ", %" PRIu64 "}", id.first, id.second);
    return buf;
}

xseg_status tags_plan_sleep(struct dev_alloc *d, const xseg_tag_sleep *tags, size_t count, struct tag_target **out,
                            size_t *n)
{
    static const char fn[] = "xseg_sleep_tags";
    *out = NULL;
    *n = 0;
    xseg_status st = tags_check_list(fn, tags ? &tags[0].tag : NULL, count, sizeof *tags);
    for (size_t i = 0; i < count && st == XSEG_SUCCESS; i++)
        if (tags[i].flags != XSEG_SLEEP_OFFLOAD && tags[i].flags != XSEG_SLEEP_DISCARD)
            st = err_set(XSEG_ERROR_INVALID_VALUE, "%s: tag '%s': flags must be XSEG_SLEEP_OFFLOAD (%d) or "
                         "XSEG_SLEEP_DISCARD (%d), got 0x%x%s", fn, tags[i].tag, XSEG_SLEEP_OFFLOAD, XSEG_SLEEP_DISCARD,
                         tags[i].flags, tags[i].flags == XSEG_SLEEP_OFFLOAD_FILE ? " (a file is one pool's: "
                         "xseg_sleep_ex)" : "");
    if (st != XSEG_SUCCESS)
        return st;
    struct tag_target *v = NULL;
    size_t nv = 0, cap = 0;
    char buf[64];
    dev_lock(d, DEV_NEED_OP);
    tags_prune(d);
    for (size_t i = 0; i < count && st == XSEG_SUCCESS; i++)
        if (!tag_known(d, tags[i].tag))
            st = tag_unknown(d, fn, tags[i].tag);
    /* Offloading pools first: a failure among them is undone with every byte (a discarded pool
     * woken again reads zero). */
    static const unsigned order[] = {XSEG_SLEEP_OFFLOAD, XSEG_SLEEP_DISCARD};
    for (size_t o = 0; o < 2 && st == XSEG_SUCCESS; o++)
        for (size_t i = 0; i < count && st == XSEG_SUCCESS; i++) {
            if (tags[i].flags != order[o])
                continue;
            for (size_t k = 0; k < d->tags.n && st == XSEG_SUCCESS; k++) {
                const struct pool_tag *t = &d->tags.v[k];
                if (strcmp(t->tag, tags[i].tag))
                    continue;
                bool exists;
                (void)sleep_where(d, t->pool, &exists);
                if (!exists)
                    continue; /* a pool that never allocated here, or released and gone */
                if ((st = sleep_check(d, t->pool)) != XSEG_SUCCESS)
                    st = err_prefix(st, "%s: %s (tag '%s'), nothing slept", fn, pool_words(t->pool, buf), t->tag);
                else if (!plan_add(&v, &nv, &cap, t, tags[i].flags))
                    st = err_set(XSEG_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
            }
        }
    dev_unlock(d);
    if (st != XSEG_SUCCESS) {
        xs_free(v);
        return st;
    }
    *out = v;
    *n = nv;
    return XSEG_SUCCESS;
}

xseg_status tags_plan_wake(struct dev_alloc *d, const char *const *tags, size_t count, struct tag_target **out,
                           size_t *n)
{
    static const char fn[] = "xseg_wake_tags";
    *out = NULL;
    *n = 0;
    xseg_status st = tags_check_list(fn, tags, count, sizeof *tags);
    if (st != XSEG_SUCCESS)
        return st;
    struct tag_target *v = NULL;
    size_t nv = 0, cap = 0;
    char buf[64];
    dev_lock(d, DEV_NEED_OP);
    tags_prune(d);
    for (size_t i = 0; i < count && st == XSEG_SUCCESS; i++)
        if (!tag_known(d, tags[i]))
            st = tag_unknown(d, fn, tags[i]);
    for (size_t i = 0; i < count && st == XSEG_SUCCESS; i++)
        for (size_t k = 0; k < d->tags.n && st == XSEG_SUCCESS; k++) {
            const struct pool_tag *t = &d->tags.v[k];
            if (strcmp(t->tag, tags[i]))
                continue;
            bool exists;
            enum sleep_where w = sleep_where(d, t->pool, &exists);
            if (w == SLEEP_BUSY)
                st = err_set(XSEG_ERROR_ILLEGAL_STATE, "%s: %s (tag '%s') of device %d is going to sleep or waking "
                             "up in another thread; wake once that call has returned", fn, pool_words(t->pool, buf),
                             t->tag, d->device);
            else if (w == SLEEP_ASLEEP && !plan_add(&v, &nv, &cap, t, 0))
                st = err_set(XSEG_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
        }
    if (st == XSEG_SUCCESS && !nv)
        st = err_set(XSEG_ERROR_ILLEGAL_STATE, "%s: no pool of device %d with %s is asleep", fn, d->device,
                     count == 1 ? "this tag" : "these tags");
    dev_unlock(d);
    if (st != XSEG_SUCCESS) {
        xs_free(v);
        return st;
    }
    *out = v;
    *n = nv;
    return XSEG_SUCCESS;
}

void tags_teardown(struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    xs_free(d->tags.v);
    d->tags = (struct tag_state){0};
}
