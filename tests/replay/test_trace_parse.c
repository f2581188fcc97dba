/* The trace language parser, the RMM CSV importer and the workload generators (no driver). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tools/replay/trace.h"
#include "tools/replay/workloads.h"

static char err[TRACE_ERR_MAX];

/* A message shows every byte: none outside printable ASCII. */
static void assert_printable(const char *msg)
{
    for (const unsigned char *c = (const unsigned char *)msg; *c; c++)
        if (*c < 0x20 || *c >= 0x7f)
            fail_msg("byte 0x%02x printed raw in '%s'", *c, msg);
}

static xseg_status parse(struct trace *t, const char *text)
{
    assert_int_equal(trace_init(t, "t.trace"), XSEG_SUCCESS);
    err[0] = '\0';
    return trace_parse_text(t, text, strlen(text), err, sizeof err);
}

static void test_every_action(void **state)
{
    (void)state;
    struct trace t;
    const char *text =
        "# a comment line\n"
        "\n"
        "stream s1\n"
        "alloc x1 4GiB\n"
        "alloc x2 1.5MiB @s1   # trailing comment\n"
        "record x1 @s1\n"
        "hold @s1\n"
        "free x1\n"
        "release @s1\n"
        "sync @s1\n"
        "sync\n"
        "empty_cache\n"
        "config expandable_segments:True,max_split_size_mb:128\n"
        "pool_begin p1 @s1\n"
        "pool_end p1\n"
        "pool_release p1\n"
        "capture_begin @s1 p2\n"
        "capture_end @s1\n"
        "mark After alloc x1, del x#2\n"
        "alloc x1 512\n"
        "hold @default\n";
    assert_int_equal(parse(&t, text), XSEG_SUCCESS);
    enum trace_op want[] = {TRACE_STREAM, TRACE_ALLOC, TRACE_ALLOC, TRACE_RECORD, TRACE_HOLD,
                            TRACE_FREE, TRACE_RELEASE, TRACE_SYNC, TRACE_SYNC, TRACE_EMPTY_CACHE,
                            TRACE_CONFIG, TRACE_POOL_BEGIN, TRACE_POOL_END, TRACE_POOL_RELEASE,
                            TRACE_CAPTURE_BEGIN, TRACE_CAPTURE_END, TRACE_MARK, TRACE_ALLOC, TRACE_HOLD};
    assert_int_equal(t.count, sizeof want / sizeof want[0]);
    for (size_t i = 0; i < t.count; i++)
        assert_int_equal(t.actions[i].op, want[i]);
    const struct trace_action *a = t.actions;
    assert_int_equal(a[0].stream, 0);
    assert_int_equal(a[0].line, 3);
    assert_int_equal(a[1].size, 4ull << 30);
    assert_int_equal(a[1].stream, TRACE_DEFAULT_STREAM);
    assert_int_equal(a[2].size, 3ull << 19);
    assert_int_equal(a[2].stream, 0);
    assert_int_equal(a[3].buf, a[1].buf);
    assert_int_equal(a[7].stream, 0);
    assert_int_equal(a[8].stream, TRACE_ALL_STREAMS);
    assert_string_equal(trace_text(&t, a[10].text), "expandable_segments:True,max_split_size_mb:128");
    assert_int_equal(a[11].pool, 0);
    assert_int_equal(a[11].stream, 0);
    assert_int_equal(a[14].pool, 1);
    assert_string_equal(trace_text(&t, a[16].text), "After alloc x1, del x#2");
    assert_int_equal(a[17].buf, a[1].buf); /* a freed name can be allocated again */
    assert_int_equal(a[17].size, 512);
    assert_int_equal(a[18].stream, TRACE_DEFAULT_STREAM);
    assert_int_equal(t.bufs.count, 2);
    assert_int_equal(t.nallocs, 3);
    trace_destroy(&t);
}

/* wait / work: stream order for forks and joins in a capture. */
static void test_wait_work(void **state)
{
    (void)state;
    struct trace t;
    assert_int_equal(parse(&t, "stream a\nstream b\nwait @b @a\nwork @b\nwait @default @b\n"), XSEG_SUCCESS);
    assert_int_equal(t.count, 5);
    assert_int_equal(t.actions[2].op, TRACE_WAIT);
    assert_int_equal(t.actions[2].stream, 1);
    assert_int_equal(t.actions[2].stream2, 0);
    assert_int_equal(t.actions[3].op, TRACE_WORK);
    assert_int_equal(t.actions[3].stream, 1);
    assert_int_equal(t.actions[4].stream, TRACE_DEFAULT_STREAM);
    assert_int_equal(t.actions[4].stream2, 1);
    trace_destroy(&t);
}

/* `frame` lines build named stacks (no action), `alloc ... ^NAME` refers to one,
 * `snapshot LABEL` is an action. */
static void test_frames_and_snapshot(void **state)
{
    (void)state;
    struct trace t;
    const char *text = "stream s1\n"
                       "frame k1 42 model%20dir/model.py forward (x) -> y\n"
                       "frame k1 7 train.py main\n"
                       "frame k2 0 - <module>\n"
                       "alloc x1 3MiB ^k1\n"
                       "alloc x2 1000 @s1 ^k2\n"
                       "alloc x3 5MiB @s1\n"
                       "snapshot at the peak\n";
    assert_int_equal(parse(&t, text), XSEG_SUCCESS);
    assert_int_equal(t.count, 5);
    assert_int_equal(t.actions[1].stack, 1);
    assert_int_equal(t.actions[2].stack, 2);
    assert_int_equal(t.actions[2].stream, 0);
    assert_int_equal(t.actions[3].stack, 0);
    assert_int_equal(t.actions[4].op, TRACE_SNAPSHOT);
    assert_string_equal(trace_text(&t, t.actions[4].text), "at the peak");
    assert_int_equal(t.stacks[0].n, 2);
    assert_string_equal(trace_text(&t, t.stacks[0].f[0].file), "model dir/model.py");
    assert_string_equal(trace_text(&t, t.stacks[0].f[0].name), "forward (x) -> y");
    assert_int_equal(t.stacks[0].f[0].line, 42);
    assert_string_equal(trace_text(&t, t.stacks[0].f[1].name), "main");
    assert_string_equal(trace_text(&t, t.stacks[1].f[0].file), "");
    assert_string_equal(trace_op_name(TRACE_SNAPSHOT), "snapshot");
    trace_destroy(&t);
}

static void test_sizes(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        uint64_t v;
    } ok[] = {{"0", 0}, {"512", 512}, {"512B", 512}, {"2KiB", 2048}, {"3M", 3 << 20}, {"3MB", 3 << 20},
              {"4GiB", 4ull << 30}, {"1.5GiB", 3ull << 29}, {"2TiB", 2ull << 40}, {"0.5KiB", 512},
              {"18446744073709551615", UINT64_MAX}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        uint64_t v = 1;
        assert_int_equal(trace_parse_size(ok[i].s, strlen(ok[i].s), &v, err, sizeof err), XSEG_SUCCESS);
        assert_int_equal(v, ok[i].v);
    }
    static const char *const bad[] = {"", "GiB", "4XB", "-1", "1.5", "4GiBs", "4 GiB", "0x10",
                                      "18446744073709551616", "99999999999TiB"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t v;
        err[0] = '\0';
        assert_int_equal(trace_parse_size(bad[i], strlen(bad[i]), &v, err, sizeof err), XSEG_ERROR_INVALID_VALUE);
        assert_true(strlen(err) > 0);
    }
    uint64_t v;
    assert_int_equal(trace_parse_size("\t5", 2, &v, err, sizeof err), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(err, "bad size '\\x095'"));
    assert_printable(err);
    char buf[32];
    assert_string_equal(trace_format_size(4ull << 30, buf, sizeof buf), "4GiB");
    assert_string_equal(trace_format_size(1536 << 10, buf, sizeof buf), "1536KiB");
    assert_string_equal(trace_format_size(1000, buf, sizeof buf), "1000");
    assert_string_equal(trace_format_size(0, buf, sizeof buf), "0");
}

/* Every error names the source and line and says what is wrong. */
/* services: trim KEEP parses to xseg_trim(-1, KEEP). */
static void test_trim(void **state)
{
    (void)state;
    struct trace t;
    assert_int_equal(parse(&t, "alloc x 1GiB\nfree x\ntrim 256MiB\ntrim 0\n"), XSEG_SUCCESS);
    assert_int_equal(t.count, 4);
    assert_int_equal(t.actions[2].op, TRACE_TRIM);
    assert_int_equal(t.actions[2].size, 256ull << 20);
    assert_int_equal(t.actions[2].line, 3);
    assert_int_equal(t.actions[3].op, TRACE_TRIM);
    assert_int_equal(t.actions[3].size, 0);
    assert_string_equal(trace_op_name(TRACE_TRIM), "trim");
    trace_destroy(&t);
}

/* Services: sleep POOL offload|discard, wake POOL (`default` is the default pool), idle DURATION. */
static void test_sleep_wake_idle(void **state)
{
    (void)state;
    struct trace t;
    const char *text = "stream s\n"
                       "pool_begin p @s\nalloc g 1MiB @s\npool_end p\n"
                       "alloc w 1GiB\n"
                       "sleep default offload\nsleep p discard\nfree w\nidle 300ms\nidle 1.5s\nidle 20us\n"
                       "wake p\nwake default\nalloc w 1GiB\n";
    assert_int_equal(parse(&t, text), XSEG_SUCCESS);
    const struct trace_action *a = t.actions;
    assert_int_equal(t.count, 14);
    assert_int_equal(a[5].op, TRACE_SLEEP);
    assert_int_equal(a[5].pool, -1);
    assert_int_equal(a[5].size, XSEG_SLEEP_OFFLOAD);
    assert_int_equal(a[6].op, TRACE_SLEEP);
    assert_int_equal(a[6].pool, 0);
    assert_int_equal(a[6].size, XSEG_SLEEP_DISCARD);
    assert_int_equal(a[8].op, TRACE_IDLE);
    assert_int_equal(a[8].size, 300000000ull);
    assert_int_equal(a[9].size, 1500000000ull);
    assert_int_equal(a[10].size, 20000ull);
    assert_int_equal(a[11].op, TRACE_WAKE);
    assert_int_equal(a[11].pool, 0);
    assert_int_equal(a[12].pool, -1);
    assert_string_equal(trace_op_name(TRACE_SLEEP), "sleep");
    assert_string_equal(trace_op_name(TRACE_WAKE), "wake");
    assert_string_equal(trace_op_name(TRACE_IDLE), "idle");
    trace_destroy(&t);
    /* While the default pool sleeps, a pool that records may take allocations. */
    assert_int_equal(parse(&t, "sleep default discard\npool_begin q\nalloc x 1MiB\npool_end q\nwake default\n"),
                     XSEG_SUCCESS);
    trace_destroy(&t);
}

static void test_errors(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        const char *want; /* a substring of the message */
    } cases[] = {
        {"allocate x1 4GiB\n", "t.trace:1: unknown action 'allocate'"},
        {"alloc x1\n", "t.trace:1: alloc: missing argument (usage: alloc NAME SIZE [@STREAM] [^STACK])"},
        {"alloc x1 1 @s1 ^k extra\n", "t.trace:1: alloc: too many arguments"},
        /* Frames and snapshots: */
        {"alloc x1 1 ^k9\n", "t.trace:1: alloc x1: no stack 'k9' (define it with 'frame k9 LINE FILE FUNCTION'"},
        {"stream s\nalloc x1 1 @s junk\n", "t.trace:2: alloc x1: expected '^STACK', got 'junk'"},
        {"frame k1 x f.py g\n", "t.trace:1: frame k1: bad line number 'x'"},
        {"frame k1 1 f.py\n", "t.trace:1: frame: missing argument (usage: frame STACK LINE FILE FUNCTION)"},
        {"frame k/1 1 f.py g\n", "t.trace:1: bad stack name 'k/1'"},
        {"snapshot\n", "t.trace:1: snapshot: missing the label"},
        {"alloc x1 4QB\n", "t.trace:1: alloc x1: bad size '4QB'"},
        {"alloc x1 1GiB @s1\n", "t.trace:1: stream 's1' is not declared"},
        {"alloc x1 1GiB s1\n", "t.trace:1: expected a stream '@NAME', got 's1'"},
        {"alloc x1 1\nalloc x1 2\n", "t.trace:2: alloc x1: 'x1' is still allocated (line 1)"},
        {"free x9\n", "t.trace:1: free x9: no buffer 'x9' was allocated"},
        {"alloc x1 1\nfree x1\nfree x1\n", "t.trace:3: free x1: 'x1' was already freed (line 2)"},
        {"stream s\nalloc x1 1\nfree x1\nrecord x1 @s\n", "t.trace:4: record x1: 'x1' was already freed"},
        {"record x1\n", "t.trace:1: record: missing argument"},
        {"free\n", "t.trace:1: free: missing argument"},
        {"hold\n", "t.trace:1: hold: missing argument"},
        {"release @nope\n", "t.trace:1: stream 'nope' is not declared"},
        {"sync @a @b\n", "t.trace:1: sync: too many arguments"},
        {"empty_cache now\n", "t.trace:1: empty_cache: too many arguments"},
        {"trim\n", "t.trace:1: trim: missing argument"},               /* services */
        {"trim 1GiB 2\n", "t.trace:1: trim: too many arguments"},
        {"trim lots\n", "t.trace:1: trim: "},
        {"sleep default\n", "t.trace:1: sleep: missing argument (usage: sleep POOL offload|discard)"},
        {"sleep default keep\n", "t.trace:1: sleep default: expected offload or discard, got 'keep'"},
        {"sleep p offload\n", "t.trace:1: sleep p: no pool 'p' was begun ('default' names the default pool)"},
        {"sleep default discard\nsleep default offload\n", "t.trace:2: sleep default: the pool is asleep already (line 1)"},
        {"wake default\n", "t.trace:1: wake default: the pool is not asleep"},
        {"wake\n", "t.trace:1: wake: missing argument (usage: wake POOL)"},
        {"sleep default discard\nalloc x 1\n", "t.trace:2: alloc x: the default pool is asleep (sleep at line 1)"},
        {"pool_begin p\nsleep p discard\n", "t.trace:2: sleep p: pool 'p' records (line 1)"},
        {"stream s\ncapture_begin @s\nsleep default offload\n", "t.trace:3: sleep default: stream 's' captures (line 2)"},
        {"pool_begin p\npool_end p\nsleep p discard\npool_begin p\n", "t.trace:4: pool_begin p: the pool is asleep (sleep at line 3)"},
        {"idle\n", "t.trace:1: idle: missing argument (usage: idle DURATION)"},
        {"idle 3\n", "t.trace:1: idle: '3' is not a duration (e.g. 300ms, 1.5s, 20us)"},
        {"idle ms\n", "t.trace:1: idle: 'ms' is not a duration"},
        {"idle 99999999999999999999s\n", "t.trace:1: idle: '99999999999999999999s' is not a duration"},
        {"idle 100000000s\n", "t.trace:1: idle: '100000000s' is longer than the maximum, 3600s"},
        {"idle 3600000001us\n", "t.trace:1: idle: '3600000001us' is longer than the maximum, 3600s"},
        {"config\n", "t.trace:1: config: missing the config string"},
        {"config expandable_segments: True\n", "t.trace:1: config: the config string has a blank"},
        {"mark   \n", "t.trace:1: mark: missing the label"},
        {"stream s1\nstream s1\n", "t.trace:2: stream 's1' is declared twice"},
        {"stream default\n", "t.trace:1: stream: 'default' is the legacy default stream"},
        {"stream a/b\n", "t.trace:1: bad stream name 'a/b'"},
        {"alloc @x 1\n", "t.trace:1: bad buffer name '@x'"},
        {"pool_end p1\n", "t.trace:1: pool_end p1: no pool 'p1' was begun"},
        {"pool_begin p1\npool_begin p1\n", "t.trace:2: pool_begin p1: pool already begun"},
        {"pool_begin p1\npool_release p1\n", "t.trace:2: pool_release p1: end the pool first"},
        {"pool_begin p1\npool_end p1\npool_end p1\n", "t.trace:3: pool_end p1: the pool is not begun"},
        {"capture_begin @default\n", "t.trace:1: capture_begin: the legacy default stream cannot be captured"},
        /* stream order (wait / work) */
        {"stream s\nwait @s @s\n", "t.trace:2: wait: a stream cannot wait for itself"},
        {"stream s\nwait @s\n", "t.trace:2: wait: missing argument"},
        {"stream s\nwait @s @u\n", "t.trace:2: stream 'u' is not declared"},
        {"work\n", "t.trace:1: work: missing argument"},
        {"stream s\ncapture_end @s\n", "t.trace:2: capture_end: stream 's' is not capturing"},
        {"stream s\ncapture_begin @s\ncapture_begin @s\n", "t.trace:3: capture_begin: stream 's' is already capturing"},
        {"\n\n# ok\nfrob\n", "t.trace:4: unknown action 'frob'"},
        /* what the user wrote is echoed with its invisible bytes shown as \xNN */
        {"\xef\xbb\xbf" "alloc x 1\n", "t.trace:1: unknown action '\\xEF\\xBB\\xBFalloc'"},
        {"alloc x \x01" "5\n", "t.trace:1: alloc x: bad size '\\x015'"},
        {"alloc x 1\x7fKiB\n", "t.trace:1: alloc x: bad size '1\\x7FKiB'"},
        {"stream s\x1b[1m\n", "t.trace:1: bad stream name 's\\x1B[1m'"},
        /* What a replay refuses, --check refuses first: */
        {"pool_begin p\npool_end p\npool_release p\npool_release p\n",
         "t.trace:4: pool_release p: the pool has no users left (every pool_begin and capture_begin into it "
         "is released already; last release line 3)"},
        {"stream s\ncapture_begin @s g\ncapture_end @s\ncapture_begin @s g\ncapture_end @s\n"
         "pool_release g\npool_release g\npool_release g\n", "t.trace:8: pool_release g: the pool has no users left"},
        {"stream s\npool_begin p\ncapture_begin @s p\n",
         "t.trace:3: capture_begin: pool 'p' is already recording (pool_begin, line 2)"},
        {"stream s\nstream u\ncapture_begin @s p\ncapture_begin @u p\n",
         "t.trace:4: capture_begin: pool 'p' is already recording (a capture on stream 's', line 3)"},
        {"stream s\ncapture_begin @s p\npool_begin p\n",
         "t.trace:3: pool_begin p: a capture on stream 's' records into this pool (line 2)"},
        {"stream s\ncapture_begin @s p\npool_release p\n",
         "t.trace:3: pool_release p: a capture on stream 's' still records into it (line 2)"},
        {"stream s\nstream u\ncapture_begin @s\ncapture_begin @u q\ncapture_end @u\nalloc x 1\n",
         "t.trace:3: capture_begin: the capture on stream 's' is never ended (add 'capture_end @s')"},
        /* What the driver refuses during a capture (the replay would stop with
         * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, _ISOLATION, _IMPLICIT or _MERGE): */
        {"stream s\ncapture_begin @s\nsync @s\ncapture_end @s\n",
         "t.trace:3: sync @s: 's' captures (line 2); a capturing stream cannot be synchronized"},
        /* xseg-replay captures in the driver's GLOBAL mode: a synchronize of any stream is refused */
        {"stream s\nstream u\ncapture_begin @s\nsync @u\ncapture_end @s\n",
         "t.trace:4: sync @u: stream 's' captures (line 3); no stream can be synchronized during a capture"},
        {"stream s\ncapture_begin @s\nsync @default\ncapture_end @s\n",
         "t.trace:3: sync @default: stream 's' captures (line 2); no stream can be synchronized during a capture"},
        {"stream s\ncapture_begin @s\nsync\ncapture_end @s\n",
         "t.trace:3: sync: stream 's' captures (line 2); the whole device cannot be synchronized during a capture"},
        {"stream s\nstream u\ncapture_begin @s\nwait @s @u\ncapture_end @s\n",
         "t.trace:4: wait @s @u: 's' captures (line 3) and 'u' does not; a capture cannot wait for work outside it"},
        {"stream s\ncapture_begin @s\nwait @s @default\ncapture_end @s\n",
         "t.trace:3: wait @s @default: 's' captures (line 2) and 'default' does not"},
        {"stream s\ncapture_begin @s\nwait @default @s\ncapture_end @s\n",
         "t.trace:3: wait @default @s: 's' captures (line 2); the legacy default stream cannot join a capture"},
        {"stream s\nstream u\ncapture_begin @s\ncapture_begin @u\nwait @s @u\n",
         "t.trace:5: wait @s @u: 's' captures (line 3) and 'u' captures (line 4); two captures cannot be merged"},
        /* a stream that joined a capture by a wait (a fork) captures too, until the capture ends */
        {"stream s\nstream u\ncapture_begin @s\nwait @u @s\nsync @u\n",
         "t.trace:5: sync @u: 'u' takes part in the capture on stream 's' (line 3; joined at line 4); a capturing "
         "stream cannot be synchronized"},
        {"stream s\nstream u\nstream v\ncapture_begin @s\nwait @u @s\nwait @v @s\nwait @u @v\nwait @s @u\n"
         "wait @v @default\n", "t.trace:9: wait @v @default: 'v' takes part in the capture on stream 's'"},
        {"stream s\nstream u\ncapture_begin @s\nwait @u @s\ncapture_begin @u\n",
         "t.trace:5: capture_begin: stream 'u' takes part in the capture on stream 's' (line 3) since its wait at "
         "line 4"},
        {"stream s\nstream u\ncapture_begin @s\nwait @u @s\nwait @s @u\ncapture_end @u\n",
         "t.trace:6: capture_end: stream 'u' joined the capture on stream 's' (line 3) by its wait at line 4; end "
         "the capture on the stream that began it"},
    };
    /* ... and what a replay accepts, --check accepts: a pool used again after its release, one
     * pool captured into by two streams in turn, a pool_begin left open to the end. */
    static const char *const fine[] = {
        "pool_begin p\npool_end p\npool_release p\npool_begin p\nalloc x 1\npool_end p\nfree x\npool_release p\n",
        "stream s\nstream u\ncapture_begin @s p\ncapture_end @s\ncapture_begin @u p\ncapture_end @u\n"
        "pool_release p\n",
        "pool_begin p\nalloc x 1\n",
        /* two captures into one pool: two uses, two releases (seed 003's shared graph pool) */
        "stream s\ncapture_begin @s g\ncapture_end @s\ncapture_begin @s g\ncapture_end @s\n"
        "pool_release g\npool_release g\n",
        /* an older use released while the pool records again */
        "pool_begin p\npool_end p\npool_begin p\npool_release p\npool_end p\npool_release p\n",
        /* during a capture: another stream working, the cache emptied or trimmed, a config */
        "stream s\nstream u\nalloc a 1MiB @u\ncapture_begin @s\nwork @u\nhold @u\n"
        "release @u\nfree a\nempty_cache\ntrim 0\nconfig garbage_collection_threshold:0.5\nidle 1ms\n"
        "mark m\nwait @u @default\ncapture_end @s\n",
        /* forks joined back: directly, through a chain, as a diamond; a fork with no work of its
         * own needs no join; after the end the streams are free again */
        "stream s\nstream u\ncapture_begin @s\nwork @s\nwait @u @s\nalloc a 1MiB @u\nwork @u\nfree a\n"
        "wait @s @u\nwork @s\ncapture_end @s\nsync @u\nsync\ncapture_begin @u\ncapture_end @u\n",
        "stream s\nstream u\nstream v\ncapture_begin @s\nwait @u @s\nwork @u\nwait @v @u\nwork @v\n"
        "wait @s @v\ncapture_end @s\n",
        "stream s\nstream u\nstream v\ncapture_begin @s\nwork @s\nwait @u @s\nwait @v @s\nwork @u\nwork @v\n"
        "wait @v @u\nwait @s @v\ncapture_end @s\n",
        "stream s\nstream u\ncapture_begin @s\nwork @s\nwait @u @s\nwork @s\ncapture_end @s\n",
        /* work forked off and never joined back: the H200's driver (580.159.04) ends such a
         * capture with the side work in its graph, and the streams are free again after it */
        "stream s\nstream u\ncapture_begin @s\nwait @u @s\nwork @u\ncapture_end @s\ncapture_begin @u\n"
        "capture_end @u\n",
        "stream s\nstream u\nstream v\ncapture_begin @s\nwait @u @s\nwork @u\nwait @v @u\nwork @v\n"
        "wait @s @u\ncapture_end @s\nsync @v\n",
        "stream s\nstream u\ncapture_begin @s\nwait @u @s\nwait @s @u\nwork @u\ncapture_end @s\n",
        /* two captures side by side, each with a fork of its own */
        "stream s\nstream u\nstream a\nstream b\ncapture_begin @s\ncapture_begin @a\nwait @u @s\nwait @b @a\n"
        "work @u\nwork @b\nwait @a @b\nwait @s @u\ncapture_end @a\ncapture_end @s\n",
    };
    for (size_t i = 0; i < sizeof fine / sizeof fine[0]; i++) {
        struct trace t;
        if (parse(&t, fine[i]) != XSEG_SUCCESS)
            fail_msg("fine case %zu rejected: %s", i, err);
        trace_destroy(&t);
    }
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct trace t;
        assert_int_equal(parse(&t, cases[i].text), XSEG_ERROR_INVALID_VALUE);
        if (!strstr(err, cases[i].want))
            fail_msg("case %zu: message '%s' lacks '%s'", i, err, cases[i].want);
        assert_printable(err);
        trace_destroy(&t);
    }
    /* A NUL byte: a binary file, not a crash. */
    struct trace t;
    assert_int_equal(trace_init(&t, "bin"), XSEG_SUCCESS);
    assert_int_equal(trace_parse_text(&t, "alloc x 1\0\n", 11, err, sizeof err), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(err, "bin:1: a NUL byte"));
    trace_destroy(&t);
}

static void test_rmm_csv(void **state)
{
    (void)state;
    const char *csv =
        "Thread,Time,Action,Pointer,Size,Stream\n"
        "1,09:00:00.000001,allocate,0x7f0000000000,1048576,0x0\n"
        "1,09:00:00.000002,allocate,0x7f0000100000,4096,0x55aa\n"
        "1,09:00:00.000003,allocate failure,0x0,999999999999,0x0\n"
        "2,09:00:00.000004,free,0x7f0000000000,1048576,0x0\n"
        "2,09:00:00.000005,free,0x7f00dead0000,2048,0x0\n"      /* allocated before the log */
        "1,09:00:00.000006,allocate,0x7f0000000000,512,0x0\r\n" /* the address again, CRLF */
        "1,09:00:00.000007,free,0x7f0000100000,4096,0x55aa\n";
    struct trace t;
    assert_int_equal(trace_init(&t, "log.csv"), XSEG_SUCCESS);
    assert_int_equal(trace_import_rmm_csv(&t, csv, strlen(csv), err, sizeof err), XSEG_SUCCESS);
    /* stream decl, seed, then the log: alloc, alloc@s, free, free(seed), alloc, free */
    enum trace_op want[] = {TRACE_STREAM, TRACE_ALLOC, TRACE_ALLOC, TRACE_ALLOC, TRACE_FREE,
                            TRACE_FREE, TRACE_ALLOC, TRACE_FREE};
    assert_int_equal(t.count, sizeof want / sizeof want[0]);
    for (size_t i = 0; i < t.count; i++)
        assert_int_equal(t.actions[i].op, want[i]);
    assert_string_equal(t.streams.names[0], "s55aa");
    assert_int_equal(t.actions[1].size, 2048); /* the seed */
    assert_int_equal(t.actions[1].line, 0);
    assert_int_equal(t.actions[2].size, 1048576);
    assert_int_equal(t.actions[3].stream, 0);
    assert_int_equal(t.actions[4].buf, t.actions[2].buf);
    assert_int_equal(t.actions[5].buf, t.actions[1].buf);
    assert_int_not_equal(t.actions[6].buf, t.actions[2].buf); /* a new buffer at an old address */
    assert_int_equal(t.actions[6].size, 512);
    assert_int_equal(t.actions[7].buf, t.actions[3].buf);
    trace_destroy(&t);

    /* Blanks and quotes around a number are fine; a leading 0 is decimal, not octal; the largest
     * pointer and size still fit; two pointers differing only above bit 60 stay distinct. */
    const char *edge =
        "Thread,Time,Action,Pointer,Size,Stream\n"
        "1,0,allocate,\t0xffffffffffffffff ,\"010\",0\n"
        "1,0,allocate,0x0fffffffffffffff,18446744073709551615,0\n";
    assert_int_equal(trace_init(&t, "log.csv"), XSEG_SUCCESS);
    assert_int_equal(trace_import_rmm_csv(&t, edge, strlen(edge), err, sizeof err), XSEG_SUCCESS);
    assert_int_equal(t.count, 2);
    assert_int_equal(t.actions[0].size, 10);
    assert_true(t.actions[1].size == UINT64_MAX);
    assert_int_not_equal(t.actions[0].buf, t.actions[1].buf);
    trace_destroy(&t);

    static const struct {
        const char *text, *want;
    } bad[] = {
        {"Thread,Time,Action,Pointer,Size,Stream\n1,0,allocate,0x10\n", "log.csv:2: expected 6 fields"},
        {"Thread,Time,Action,Pointer,Size,Stream\n1,0,grab,0x10,1,0\n", "log.csv:2: unknown action 'grab'"},
        {"Thread,Time,Action,Pointer,Size,Stream\n1,0,allocate,zz,1,0\n", "log.csv:2: bad pointer 'zz'"},
        {"Thread,Time,Action,Pointer,Size,Stream\n1,0,allocate,0x10,-5,0\n", "log.csv:2: bad size '-5'"},
        {"Thread,Time,Action,Pointer,Size,Stream\n1,0,allocate,0x10,1,0\n1,0,allocate,0x10,1,0\n",
         "log.csv:3: pointer 0x10 allocated again without a free"},
        /* Out of range: strtoull would wrap a tab-led "-5" to 2^64-5 and clamp wide pointers. */
        {"Thread,Time,Action,Pointer,Size,Stream\n1,0,allocate,0x10,\t-5,0\n", "log.csv:2: bad size '\\x09-5'"},
        {"Thread,Time,Action,Pointer,Size,Stream\n1,0,allocate,0x10, +5,0\n", "log.csv:2: bad size ' +5'"},
        {"Thread,Time,Action,Pointer,Size,Stream\n1,0,allocate,0x10,18446744073709551616,0\n",
         "log.csv:2: bad size '18446744073709551616'"},
        {"Thread,Time,Action,Pointer,Size,Stream\n1,0,allocate,0x1ffffffffffffffff,1,0\n",
         "log.csv:2: bad pointer '0x1ffffffffffffffff'"},
        {"Thread,Time,Action,Pointer,Size,Stream\n1,0,allocate,0x,1,0\n", "log.csv:2: bad pointer '0x'"},
        {"Thread,Time,Action,Pointer,Size,Stream\n1,0,allocate,0x10,1 2,0\n", "log.csv:2: bad size '1 2'"},
        {"Thread,Time,Action,Pointer,Size,Stream\n1,0,allocate,0x10,1,-0x1\n", "log.csv:2: bad stream '-0x1'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(trace_init(&t, "log.csv"), XSEG_SUCCESS);
        assert_int_equal(trace_import_rmm_csv(&t, bad[i].text, strlen(bad[i].text), err, sizeof err),
                         XSEG_ERROR_INVALID_VALUE);
        if (!strstr(err, bad[i].want))
            fail_msg("case %zu: message '%s' lacks '%s'", i, err, bad[i].want);
        assert_printable(err);
        trace_destroy(&t);
    }
    /* Bytes the reader does not take are shown, never printed raw. */
    const char *ctl = "Thread,Time,Action,Pointer,Size,Stream\n1,0,\x1b[2Jallocate,0x10,1,0\n";
    assert_int_equal(trace_init(&t, "log.csv"), XSEG_SUCCESS);
    assert_int_equal(trace_import_rmm_csv(&t, ctl, strlen(ctl), err, sizeof err), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(err, "log.csv:2: unknown action '\\x1B[2Jallocate'"));
    trace_destroy(&t);
}

static void test_workloads_parse(void **state)
{
    (void)state;
    for (size_t i = 0; i < wl_count; i++) {
        char *text;
        size_t len;
        assert_int_equal(wl_generate(wl_list[i].name, 1, &text, &len, err, sizeof err), XSEG_SUCCESS);
        struct trace t;
        assert_int_equal(trace_init(&t, wl_list[i].name), XSEG_SUCCESS);
        if (trace_parse_text(&t, text, len, err, sizeof err) != XSEG_SUCCESS)
            fail_msg("builtin:%s does not parse: %s", wl_list[i].name, err);
        assert_true(t.nallocs > 1000);
        int marks = 0;
        for (size_t k = 0; k < t.count; k++)
            marks += t.actions[k].op == TRACE_MARK;
        assert_true(marks >= 2);
        /* Deterministic: the same seed gives the same text, another seed another text. */
        char *again, *other;
        size_t len2, len3;
        assert_int_equal(wl_generate(wl_list[i].name, 1, &again, &len2, err, sizeof err), XSEG_SUCCESS);
        assert_int_equal(wl_generate(wl_list[i].name, 2, &other, &len3, err, sizeof err), XSEG_SUCCESS);
        assert_true(len == len2 && memcmp(text, again, len) == 0);
        assert_false(len == len3 && memcmp(text, other, len) == 0);
        free(text);
        free(again);
        free(other);
        trace_destroy(&t);
    }
    char *text;
    size_t len;
    assert_int_equal(wl_generate("nope", 1, &text, &len, err, sizeof err), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(err, "unknown workload 'nope' (known: training inference)"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_action),
        cmocka_unit_test(test_wait_work),
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_frames_and_snapshot),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_trim), /* services */
        cmocka_unit_test(test_sleep_wake_idle),
        cmocka_unit_test(test_rmm_csv),
        cmocka_unit_test(test_workloads_parse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
