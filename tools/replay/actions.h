/*
 * The trace language's actions, one row each: the name a trace spells, its trace_op, the parse
 * function that checks a line and fills the action (parse.c), the run function that replays it
 * through xseg (runner.c) and the dump function that writes it back as a line (dump.c). Adding an
 * action is adding a row here, an enum trace_op value (trace.h), the three functions and a line
 * in docs/trace-format.md.
 *
 * X(name, op, parse, run, dump) for actions; N(name, parse) for lines that build no action (a frame
 * only describes later allocations). The order is the one the parser's "unknown action" message
 * lists them in.
 */
#ifndef XSEG_TOOLS_REPLAY_ACTIONS_H
#define XSEG_TOOLS_REPLAY_ACTIONS_H

#define TRACE_ACTIONS(X, N)                                                                  \
    X(stream, TRACE_STREAM, parse_stream, run_stream, dump_stream)                           \
    X(alloc, TRACE_ALLOC, parse_alloc, run_alloc, dump_alloc)                                \
    X(free, TRACE_FREE, parse_free_record, run_free, dump_free_record)                       \
    X(record, TRACE_RECORD, parse_free_record, run_record, dump_free_record)                 \
    X(hold, TRACE_HOLD, parse_hold_release, run_hold_release, dump_at_stream)                \
    X(release, TRACE_RELEASE, parse_hold_release, run_hold_release, dump_at_stream)          \
    X(sync, TRACE_SYNC, parse_sync, run_sync, dump_sync)                                     \
    X(empty_cache, TRACE_EMPTY_CACHE, parse_empty_cache, run_empty_cache, dump_bare)         \
    X(config, TRACE_CONFIG, parse_text, run_config, dump_text)                               \
    X(pool_begin, TRACE_POOL_BEGIN, parse_pool_begin, run_pool_begin, dump_pool_begin)       \
    X(pool_end, TRACE_POOL_END, parse_pool_end_release, run_pool_end, dump_pool)             \
    X(pool_release, TRACE_POOL_RELEASE, parse_pool_end_release, run_pool_release, dump_pool) \
    X(capture_begin, TRACE_CAPTURE_BEGIN, parse_capture, run_capture_begin, dump_capture)    \
    X(capture_end, TRACE_CAPTURE_END, parse_capture, run_capture_end, dump_capture)          \
    X(mark, TRACE_MARK, parse_text, run_mark, dump_text)                                     \
    X(wait, TRACE_WAIT, parse_wait, run_wait_work, dump_wait)                                \
    X(work, TRACE_WORK, parse_work, run_wait_work, dump_at_stream)                           \
    X(snapshot, TRACE_SNAPSHOT, parse_text, run_snapshot, dump_text)                         \
    N(frame, parse_frame)                                                                    \
    X(trim, TRACE_TRIM, parse_trim, run_trim, dump_trim)                                     \
    X(sleep, TRACE_SLEEP, parse_sleep_wake, run_sleep_wake, dump_sleep_wake)                 \
    X(wake, TRACE_WAKE, parse_sleep_wake, run_sleep_wake, dump_sleep_wake)                   \
    X(idle, TRACE_IDLE, parse_idle, run_idle, dump_idle)

#endif
