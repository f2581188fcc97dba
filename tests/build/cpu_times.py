#!/usr/bin/env python3
"""Each test's CPU time against its meson time limit (docs/testing.md, "Time limits").

    tests/build/cpu_times.py BUILD_DIR [--setup NAME] [--factor 3] [--markdown FILE] [TEST ...]

Runs `meson test` in BUILD_DIR (the named setup, two at a time) with this script as the wrapper of
every test, which records the user+sys CPU time of the test's process and of every child it
waited for (wait4's rusage). Then prints one row per test: CPU seconds, wall seconds, meson's
result, the limit (the test's timeout times the setup's timeout_multiplier) and limit / CPU,
flagging the tests whose limit is below FACTOR times their CPU time. Exits 1 when any is
flagged, timed out or failed. CPU time barely depends on the machine's load, wall time does: that is why
the limits are set from CPU time, with margin. The tests run with their limits raised
(--measure-multiplier, default 4) so that a loaded machine yields a measurement, not a timeout;
tools/test.sh --cpu-times runs every setup through this script at the limits themselves (1).

    tests/build/cpu_times.py --summary [--min S] BUILD[:SETUP[:LOG]]...   (no run: one table over the
        setups' last runs, the tests with S or more seconds of CPU (2) or within 10x of their limit)
    tests/build/cpu_times.py --wrap LOG CMD...   (the wrapper itself; meson calls it)
"""
import argparse
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_ROOT = os.path.dirname(os.path.dirname(HERE))


def wrap(log, cmd):
    """Run CMD, append {argv, env, cpu, wall, status} to LOG, exit as CMD did."""
    t0 = time.monotonic()
    stopped = []

    # meson's timeout sends SIGTERM to the whole process group: the test gets it too; record what
    # the test used until it ended, then end the same way.
    def on_term(sig, _frame):
        stopped.append(sig)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    try:
        child = subprocess.Popen(cmd)
    except OSError as e:
        print(f"cpu_times.py: cannot run {cmd[0]}: {e}", file=sys.stderr)
        return 127
    while True:
        try:
            _, status, ru = os.wait4(child.pid, 0)
            break
        except InterruptedError:
            continue
    rec = {'argv': cmd, 'env': dict(os.environ), 'user': ru.ru_utime, 'sys': ru.ru_stime,
           'wall': time.monotonic() - t0, 'status': status, 'signalled': bool(stopped)}
    with open(log, 'a', encoding='utf-8') as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(json.dumps(rec) + '\n')
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1


def setup_multipliers():
    """timeout_multiplier of each add_test_setup in the root meson.build (1 when not given)."""
    text = open(os.path.join(SOURCE_ROOT, 'meson.build'), encoding='utf-8').read()
    mult = {}
    for m in re.finditer(r"add_test_setup\(\s*'([^']+)'", text):
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {'(': 1, ')': -1}.get(text[i], 0)
            i += 1
        t = re.search(r'timeout_multiplier\s*:\s*(\d+(?:\.\d+)?)', text[m.end():i])
        mult[m.group(1)] = float(t.group(1)) if t else 1.0
    return mult


def same_value(got, want):
    """An environment value as set; a path list (LD_LIBRARY_PATH) in any order."""
    return got == want or (got is not None and set(got.split(':')) == set(want.split(':')))


def match(tests, rec):
    """The introspected test that REC ran: same command line, and the most of its own env set."""
    best, score = None, -1
    for t in tests:
        # the program by name: find_program's path depends on the PATH of the last reconfigure
        if t['cmd'][1:] != rec['argv'][1:] or os.path.basename(t['cmd'][0]) != os.path.basename(rec['argv'][0]):
            continue
        env = t.get('env') or {}
        if any(not same_value(rec['env'].get(k), v) for k, v in env.items()):
            continue
        if len(env) > score:
            best, score = t, len(env)
    return best


def main():
    if len(sys.argv) > 2 and sys.argv[1] == '--wrap':
        return wrap(sys.argv[2], sys.argv[3:])
    if len(sys.argv) > 1 and sys.argv[1] == '--summary':
        return summary(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('build')
    ap.add_argument('--setup', default='')
    ap.add_argument('--factor', type=float, default=3.0, help='flag limits below FACTOR x CPU (3)')
    ap.add_argument('--measure-multiplier', type=float, default=4.0,
                    help='limits raised this much more while measuring (4)')
    ap.add_argument('--num-processes', default='2')
    ap.add_argument('--markdown', help='also write the table (Markdown) to this file')
    ap.add_argument('--report-only', action='store_true',
                    help='no run: report the records of the last run')
    ap.add_argument('tests', nargs='*')
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    suffix = '-' + a.setup if a.setup else ''
    log = os.path.join(build, 'meson-logs', f'cpu-times{suffix}.jsonl')
    mult = setup_multipliers().get(a.setup, 1.0) if a.setup else 1.0
    meson_rc = 0
    if not a.report_only:
        if os.path.exists(log):
            os.unlink(log)
        wrapper = f'{sys.executable} {os.path.abspath(__file__)} --wrap {log}'
        cmd = ['meson', 'test', '-C', build, '--print-errorlogs', '--num-processes', a.num_processes,
               '--wrapper', wrapper, '--timeout-multiplier', f'{mult * a.measure_multiplier:g}',
               '--logbase', f'testlog{suffix}']
        if a.setup:
            cmd += ['--setup', a.setup]
        meson_rc = subprocess.run(cmd + a.tests, check=False).returncode
        sys.stdout.flush()
        # meson appends the wrapper's name to the log's: give the logs their usual names back
        logs = os.path.join(build, 'meson-logs')
        for ext in ('json', 'txt', 'junit.xml'):
            made = os.path.join(logs, f'testlog{suffix}-{os.path.basename(sys.executable)}.{ext}')
            if os.path.exists(made):
                os.replace(made, os.path.join(logs, f'testlog{suffix}.{ext}'))
    rows = records(build, a.setup)
    bad = sum(1 for r in rows.values() if below(r, a.factor) or r['result'] == 'TIMEOUT')
    title = f"{os.path.basename(build)}{' (setup ' + a.setup + ')' if a.setup else ''}"
    out = [f'CPU time per test, {title}: {len(rows)} tests, {sum(r["cpu"] for r in rows.values()):.0f} s'
           f' of CPU in all; limit = timeout x {mult:g}; flagged below {a.factor:g}x', '',
           '| test | CPU s | wall s | result | limit s | limit / CPU |', '|---|---:|---:|---|---:|---:|']
    for name, r in sorted(rows.items(), key=lambda kv: -kv[1]['cpu']):
        out.append(f"| {name} | {r['cpu']:.1f} | {r['wall']:.1f} | {r['result']} | {fmt_limit(r)} | "
                   f"{fmt_ratio(r)}{' **LOW**' if below(r, a.factor) else ''} |")
    print('\n'.join(out))
    if a.markdown:
        with open(a.markdown, 'w', encoding='utf-8') as f:
            f.write('\n'.join(out) + '\n')
    if bad:
        print(f'{bad} test(s) with a limit below {a.factor:g}x their CPU time or timed out',
              file=sys.stderr)
    return 1 if bad or meson_rc else 0


def records(build, setup, log=None):
    """{test name: cpu, wall, result, limit} from BUILD's last run in SETUP (its wrapper log,
    or LOG, a copy of one)."""
    suffix = '-' + setup if setup else ''
    mult = setup_multipliers().get(setup, 1.0) if setup else 1.0
    log = log or os.path.join(build, 'meson-logs', f'cpu-times{suffix}.jsonl')
    tests = json.loads(subprocess.run(['meson', 'introspect', build, '--tests'], check=True,
                                      capture_output=True, text=True).stdout)
    results = {}
    testlog = os.path.join(build, 'meson-logs', f'testlog{suffix}.json')
    if os.path.exists(testlog):
        for line in open(testlog, encoding='utf-8'):
            r = json.loads(line)
            results[r['name'].split(' / ')[-1]] = r['result']
    rows = {}
    for line in open(log, encoding='utf-8') if os.path.exists(log) else []:
        rec = json.loads(line)
        t = match(tests, rec)
        name = t['name'] if t else ' '.join(rec['argv'])[:60]
        timeout = t['timeout'] if t else 30
        rows[name] = {'cpu': rec['user'] + rec['sys'], 'wall': rec['wall'],
                      'result': results.get(name, '?'),
                      'limit': timeout * mult if timeout and mult else None}
    return rows


def below(r, factor):
    return r['limit'] is not None and r['limit'] < factor * r['cpu']


def fmt_limit(r):
    return f"{r['limit']:g}" if r['limit'] else 'none'


def fmt_ratio(r):
    return f"{r['limit'] / r['cpu']:.0f}" if r['limit'] and r['cpu'] > 0 else '-'


def summary(argv):
    """--summary [--min S] BUILD[:SETUP[:LOG]]...: one table over the setups' last runs (no run): the
    tests that took at least S seconds of CPU (default 2) in one of them, or came within 10x of
    their limit."""
    ap = argparse.ArgumentParser(prog='cpu_times.py --summary')
    ap.add_argument('--min', type=float, default=2.0)
    ap.add_argument('runs', nargs='+', help='BUILD, BUILD:SETUP or BUILD:SETUP:LOG')
    a = ap.parse_args(argv)
    runs = [(r.split(':', 2) + ['', ''])[:3] for r in a.runs]
    data = [records(os.path.abspath(b), s, log or None) for b, s, log in runs]
    names = sorted({n for d in data for n in d})
    heads = [f"{os.path.basename(os.path.abspath(b))}{' (' + s + ')' if s else ''}" for b, s, _ in runs]
    out = ['| test | ' + ' | '.join(f'{h}: CPU s, limit s' for h in heads) + ' | lowest limit / CPU |',
           '|---|' + '---:|' * (len(runs) + 1)]
    keep = []
    for n in names:
        rs = [d.get(n) for d in data]
        ratios = [r['limit'] / r['cpu'] for r in rs if r and r['limit'] and r['cpu'] > 0]
        low = min(ratios) if ratios else None
        if any(r and r['cpu'] >= a.min for r in rs) or (low is not None and low < 10):
            keep.append((low if low is not None else 1e9, n, rs))
    for low, n, rs in sorted(keep):
        cells = [f"{r['cpu']:.1f}, {fmt_limit(r)}" if r else '-' for r in rs]
        out.append(f"| {n} | " + ' | '.join(cells) + f" | {low:.1f} |")
    print('\n'.join(out))
    return 0


if __name__ == '__main__':
    sys.exit(main())
