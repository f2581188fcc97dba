/* A trace written back in the trace language (xseg-replay --dump): each action's line by the dump
 * function of its row in actions.h, the inverse of the row's parse function. */
#include <stdio.h>
#include <stdlib.h>

#include "tools/replay/actions.h"
#include "tools/replay/trace.h"

struct dumper {
    const struct trace *t;
    FILE *out;
    unsigned char *shown; /* stacks whose frames are printed already */
    size_t nshown;
};

static const char *stream_name(const struct trace *t, int32_t s) { return s >= 0 ? t->streams.names[s] : "default"; }
static const char *pool_name(const struct trace *t, int32_t p) { return p >= 0 ? t->pools.names[p] : "default"; }

/* An action with no field. */
static void dump_bare(struct dumper *d, const char *name, const struct trace_action *a)
{
    (void)a;
    fprintf(d->out, "%s\n", name);
}

static void dump_stream(struct dumper *d, const char *name, const struct trace_action *a)
{
    fprintf(d->out, "%s %s\n", name, stream_name(d->t, a->stream));
}

/* hold, release, capture_end, work: the stream. */
static void dump_at_stream(struct dumper *d, const char *name, const struct trace_action *a)
{
    fprintf(d->out, "%s @%s\n", name, stream_name(d->t, a->stream));
}

/* A stack's frames, before the first allocation that names it (FILE one word: %XX escapes). */
static void dump_frames(struct dumper *d, size_t si)
{
    if (!d->shown) {
        d->nshown = d->t->stack_names.count;
        d->shown = calloc(d->nshown + 1, 1);
    }
    if (!d->shown || si >= d->nshown || d->shown[si])
        return;
    d->shown[si] = 1;
    for (size_t f = 0; f < d->t->stacks[si].n; f++) {
        const struct trace_frame *fr = &d->t->stacks[si].f[f];
        const char *file = trace_text(d->t, fr->file);
        fprintf(d->out, "frame %s %d ", d->t->stack_names.names[si], (int)fr->line);
        if (!*file)
            fputc('-', d->out);
        for (const char *q = file; *q; q++) {
            if (*q == ' ' || *q == '\t' || *q == '%' || *q == '#')
                fprintf(d->out, "%%%02x", (unsigned char)*q);
            else
                fputc(*q, d->out);
        }
        fprintf(d->out, " %s\n", trace_text(d->t, fr->name));
    }
}

static void dump_alloc(struct dumper *d, const char *name, const struct trace_action *a)
{
    char sz[32];
    if (a->stack)
        dump_frames(d, (size_t)a->stack - 1);
    fprintf(d->out, "%s %s %s", name, d->t->bufs.names[a->buf], trace_format_size(a->size, sz, sizeof sz));
    if (a->stream >= 0)
        fprintf(d->out, " @%s", stream_name(d->t, a->stream));
    if (a->stack)
        fprintf(d->out, " ^%s", d->t->stack_names.names[a->stack - 1]);
    fputc('\n', d->out);
}

/* free BUF, record BUF @S */
static void dump_free_record(struct dumper *d, const char *name, const struct trace_action *a)
{
    fprintf(d->out, "%s %s", name, d->t->bufs.names[a->buf]);
    if (a->op == TRACE_RECORD)
        fprintf(d->out, " @%s", stream_name(d->t, a->stream));
    fputc('\n', d->out);
}

static void dump_sync(struct dumper *d, const char *name, const struct trace_action *a)
{
    if (a->stream == TRACE_ALL_STREAMS)
        fprintf(d->out, "%s\n", name);
    else
        dump_at_stream(d, name, a);
}

/* config, mark, snapshot: the rest of the line. */
static void dump_text(struct dumper *d, const char *name, const struct trace_action *a)
{
    fprintf(d->out, "%s %s\n", name, trace_text(d->t, a->text));
}

static void dump_pool_begin(struct dumper *d, const char *name, const struct trace_action *a)
{
    fprintf(d->out, "%s %s", name, d->t->pools.names[a->pool]);
    if (a->stream != TRACE_ALL_STREAMS)
        fprintf(d->out, " @%s", stream_name(d->t, a->stream));
    fputc('\n', d->out);
}

/* pool_end, pool_release, wake: the pool. */
static void dump_pool(struct dumper *d, const char *name, const struct trace_action *a)
{
    fprintf(d->out, "%s %s\n", name, pool_name(d->t, a->pool));
}

static void dump_capture(struct dumper *d, const char *name, const struct trace_action *a)
{
    fprintf(d->out, "%s @%s", name, stream_name(d->t, a->stream));
    if (a->op == TRACE_CAPTURE_BEGIN && a->pool >= 0)
        fprintf(d->out, " %s", d->t->pools.names[a->pool]);
    fputc('\n', d->out);
}

static void dump_wait(struct dumper *d, const char *name, const struct trace_action *a)
{
    fprintf(d->out, "%s @%s @%s\n", name, stream_name(d->t, a->stream), stream_name(d->t, a->stream2));
}

static void dump_trim(struct dumper *d, const char *name, const struct trace_action *a)
{
    fprintf(d->out, "%s %llu\n", name, (unsigned long long)a->size);
}

static void dump_sleep_wake(struct dumper *d, const char *name, const struct trace_action *a)
{
    if (a->op == TRACE_WAKE) {
        dump_pool(d, name, a);
        return;
    }
    fprintf(d->out, "%s %s %s\n", name, pool_name(d->t, a->pool),
            a->size == XSEG_SLEEP_OFFLOAD ? "offload" : "discard");
}

/* The duration in the largest unit that is exact. */
static void dump_idle(struct dumper *d, const char *name, const struct trace_action *a)
{
    static const char *const unit[] = {"s", "ms", "us", "ns"};
    uint64_t div = 1000000000u;
    int u = 0;
    while (a->size % div)
        div /= 1000, u++;
    fprintf(d->out, "%s %llu%s\n", name, (unsigned long long)(a->size / div), unit[u]);
}

static const struct dump_row {
    const char *name;
    void (*dump)(struct dumper *, const char *, const struct trace_action *);
} dump_table[] = {
#define DUMP_ROW(name, op, parse, run, dump) [op] = {#name, dump},
#define DUMP_NO_ACTION(name, parse)
    TRACE_ACTIONS(DUMP_ROW, DUMP_NO_ACTION)
#undef DUMP_ROW
#undef DUMP_NO_ACTION
};

int trace_dump(const struct trace *t, FILE *out)
{
    struct dumper d = {.t = t, .out = out};
    for (size_t i = 0; i < t->count; i++) {
        const struct trace_action *a = &t->actions[i];
        const struct dump_row *row = &dump_table[a->op];
        row->dump(&d, row->name, a);
    }
    free(d.shown);
    return ferror(out) ? -1 : 0;
}
