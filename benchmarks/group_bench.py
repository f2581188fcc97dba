#!/usr/bin/python3
"""Memory groups (issue 37; docs/benchmarks.md#memory-groups): member processes on one cudaemu
device shared among them (CUDAEMU_SHARED), driven through tests/group/group_helper.

  benchmarks/group_bench.py BUILD_DIR [--rounds N] [--only budget|load] [--load-rounds N]

1. Staggered bursts: four members on a 1 GiB device; each keeps 100 MiB live and in its turn
   bursts 300 MiB more (ten 30 MiB allocations), every member checks its byte patterns, then it
   frees the burst (which stays cached). Peaks sum to 1.6x the device; live bytes never exceed
   0.7x. OOMs and failed checks without the group and with it; the give-way latency (malloc
   round trips that asked the group) p50 / p99 against mallocs that mapped new pages without
   asking (the baseline, same run); bytes moved between members.
2. A member killed with SIGKILL while a request to it is pending (stopped first, so it cannot
   answer): the asker's malloc round trip.
3. 32 members holding 20 MiB cached each; one 800 MiB malloc that needs 416 MiB of it.
4. Budgets: a process B with memory_budget_mb:400 holding 64 MiB outside xseg (cuMemAlloc, as a
   library's workspace) beside a hog H holding 300 MiB outside xseg and 100 MiB through xseg;
   B allocates 10 MiB at a time until refused. Its estimate of its foreign bytes against the true
   64 MiB, and what it reached, with H outside B's group, in it (measured after H's memory came),
   and in it with H's foreign memory coming after B measured. Then the group budget: B and H in
   a group with memory_group_budget_mb:700, H holding 300 MiB cached; B allocates 10 MiB at a
   time until refused. Driver calls (cudaemu's counts, CUDAEMU_REPORT): cuMemGetInfo per growth,
   and over 1000 cached malloc/free pairs.
5. Give-way on a busy host (--only load; issue 53): four members on an 8 GiB device take turns
   with 2.4 GiB bursts (24 mallocs of 100 MiB, no pattern), each burst freed (it stays cached)
   before the next member's, with a CPU hog process per core. Failed mallocs (and of them, those
   while other members held at least 100 MiB cached), the give-way latency p50 / p99 (mallocs
   that asked), and asks that timed out (xseg_group_member.ask_timeouts), with the group and
   without; memory_group_wait_ms at its default (500 ms), and at 5 ms (a wait a busy host's
   scheduling delays can pass).
Wall times are this machine's, on cudaemu (no GPU), including the pipe round trip.
"""
import os
import signal
import subprocess
import sys
import time


class Member:
    def __init__(self, helper, config, env, stderr=None):
        self.p = subprocess.Popen([helper, config], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=stderr, env=env, text=True, bufsize=1)
        self.next = 0  # the helper numbers successful allocations from 0

    def send(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

    def recv(self):
        return self.p.stdout.readline().strip()

    def cmd(self, line):
        self.send(line)
        return self.recv()

    def alloc(self, mib, tag):
        a = self.cmd("alloc %d %d" % (mib, tag))
        if a == "ok":
            self.next += 1
            return self.next - 1
        return None

    def reserved(self):
        return int(self.cmd("stats").split()[1])

    def group(self):
        r = self.cmd("group").split()
        return (int(r[1]), int(r[3]), int(r[5])) if r and r[0] == "asked" else (0, 0, 0)

    def foreign(self):
        r = self.cmd("group").split()
        return int(r[7]) if r and r[0] == "asked" else None

    def cached(self):
        r = self.cmd("stats").split()
        return int(r[1]) - int(r[3])

    def timeouts(self):
        r = self.cmd("group").split()
        return int(r[13]) if len(r) > 13 and r[12] == "timeouts" else 0

    def fill(self, step, tag):
        """Allocate `step` MiB at a time until refused: (MiB reached, the refusal's message)."""
        n = 0
        while True:
            a = self.cmd("alloc %d %d" % (step, tag + n))
            if a != "ok":
                return n * step, a
            n += 1

    def quit(self):
        try:
            self.cmd("quit")
        except (BrokenPipeError, ValueError):
            pass
        self.p.wait()


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")


def env_for(share, total):
    e = dict(os.environ)
    e.update(CUDAEMU_SHARED=share, CUDAEMU_TOTAL_MEM=total)
    return e


def bursts(helper, config, rounds, share):
    ms = [Member(helper, config, env_for(share, "1G")) for _ in range(4)]
    ooms = bad = 0
    lat, plain = [], []
    for i, m in enumerate(ms):
        assert m.alloc(100, i + 1) == 0
    for r in range(rounds):
        m = ms[r % 4]
        asked = m.group()[0]
        got = []
        for k in range(10):
            res = m.reserved()
            t = time.perf_counter()
            idx = m.alloc(30, 100 + r * 10 + k)
            dt = time.perf_counter() - t
            if idx is None:
                ooms += 1
                continue
            got.append(idx)
            now = m.group()[0] if config else asked
            if now != asked:
                lat.append(dt)
                asked = now
            elif m.reserved() > res:
                plain.append(dt)  # new pages mapped without asking: the baseline
        bad += sum(mm.cmd("check") != "ok" for mm in ms)
        for idx in got:
            m.cmd("free %d" % idx)
    moved = sum(m.group()[2] for m in ms) if config else 0
    for m in ms:
        m.quit()
    return ooms, bad, lat, plain, moved


def hogs_start():
    """One CPU hog process per core (a busy loop each)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]


def hogs_stop(hogs):
    for h in hogs:
        h.kill()
        h.wait()


def load_bursts(helper, config, rounds, share):
    """Section 5: (failed mallocs, of them with >= 100 MiB cached in other members, give-way
    latencies in s, asks timed out)."""
    ms = [Member(helper, config, env_for(share, "8G")) for _ in range(4)]
    hogs = hogs_start()
    ooms = idle = 0
    lat = []
    try:
        for _ in range(rounds):
            for i, m in enumerate(ms):
                asked = m.group()[0] if config else 0
                for _ in range(24):
                    t = time.perf_counter()
                    a = m.cmd("take 100")
                    dt = time.perf_counter() - t
                    if a != "ok":
                        ooms += 1
                        idle += sum(o.cached() for o in ms if o is not m) >= 100 << 20
                        continue
                    now = m.group()[0] if config else asked
                    if now != asked:
                        lat.append(dt)
                        asked = now
                m.cmd("freeall")  # the burst stays cached
    finally:
        hogs_stop(hogs)
    timeouts = sum(m.timeouts() for m in ms) if config else 0
    for m in ms:
        m.quit()
    return ooms, idle, lat, timeouts


def load_table(helper, tag, rounds):
    print("| four members, 2.4 GiB bursts in turn on 8 GiB, %d CPU hogs, %d rounds | failed mallocs "
          "(with >= 100 MiB cached elsewhere) | give-way p50 / p99 ms (n) | asks timed out |"
          % (os.cpu_count() or 1, rounds))
    print("|---|---|---|---|")
    for name, cfg in (("without the group", ""), ("with the group", "memory_group:load"),
                      ("with the group, memory_group_wait_ms:5", "memory_group:load,memory_group_wait_ms:5")):
        ooms, idle, lat, timeouts = load_bursts(helper, cfg, rounds, tag + ("lg" if cfg else "ln"))
        l = "%.1f / %.1f (%d)" % (pct(lat, .5) * 1e3, pct(lat, .99) * 1e3, len(lat)) if cfg else "-"
        print("| %s | %d (%d) | %s | %s |" % (name, ooms, idle, l, timeouts if cfg else "-"))


def killed_mid_request(helper, share):
    cfg = "memory_group:bench,memory_group_wait_ms:2000"
    a = Member(helper, cfg, env_for(share, "1G"))
    b = Member(helper, cfg, env_for(share, "1G"))
    assert b.alloc(600, 1) == 0
    b.cmd("free 0")
    b.p.send_signal(signal.SIGSTOP)
    t = time.perf_counter()
    a.send("alloc 700 2")
    time.sleep(0.05)
    b.p.kill()
    b.p.wait()
    ans = a.recv()
    dt = time.perf_counter() - t
    a.quit()
    return ans, dt


def many(helper, share, n=32):
    cfg = "memory_group:bench"
    ms = [Member(helper, cfg, env_for(share, "1G")) for _ in range(n)]
    for i, m in enumerate(ms):
        assert m.alloc(20, i + 1) == 0
        m.cmd("free 0")
    asker = Member(helper, cfg, env_for(share, "1G"))
    t = time.perf_counter()
    ans = asker.cmd("alloc 800 99")
    dt = time.perf_counter() - t
    givers = sum(m.group()[1] > 0 for m in ms)
    moved = sum(m.group()[2] for m in ms)
    for m in ms + [asker]:
        m.quit()
    return ans, dt, givers, moved


def budget(helper, share, case):
    """Case 4 (docstring): B's true foreign bytes are 64 MiB; @return (estimate MiB, reached MiB,
    xseg reserved MiB at the refusal, the refusal's budget sentence)."""
    env = env_for(share, "1G")
    bcfg = "memory_group:bb,memory_budget_mb:400"
    h = Member(helper, "memory_group:bb" if case != "outside" else "", env)
    b = Member(helper, bcfg, env)
    first = 0
    if case == "late":  # H's 300 MiB come after it measured; B measures (grows) next
        assert h.alloc(100, 2) == 0
        assert b.cmd("cualloc 64") == "ok" and b.alloc(10, 1) == 0
        assert h.cmd("cualloc 300") == "ok"
        first = 10
    else:
        assert h.cmd("cualloc 300") == "ok" and h.alloc(100, 2) == 0
        assert b.cmd("cualloc 64") == "ok"
    reached, msg = b.fill(10, 10)
    est = (b.foreign() or 0) / 2**20
    res = b.reserved() / 2**20
    i = msg.find("memory_budget_mb is")
    b.quit()
    h.quit()
    return est, first + reached, res, msg[i:i + 150] if i >= 0 else msg[:150]


def group_budget(helper, share):
    env = env_for(share, "1G")
    cfg = "memory_group:gb,memory_group_wait_ms:2000,memory_group_budget_mb:700"
    h = Member(helper, cfg, env)
    assert h.alloc(300, 1) == 0
    h.cmd("free 0")
    b = Member(helper, cfg, env)
    reached, msg = b.fill(10, 10)
    gave = h.group()[2] / 2**20
    held = (b.reserved() + h.reserved()) / 2**20
    i = msg.find("memory_group_budget_mb")
    b.quit()
    h.quit()
    return reached, gave, held, msg[i:i + 160] if i >= 0 else msg[:160]


def driver_calls(helper, share):
    """cuMemGetInfo and cuMemCreate calls (cudaemu's counts) of a budgeted process: 8 growths of
    100 MiB, then 1000 cached malloc/free pairs."""
    env = dict(env_for(share, "1G"), CUDAEMU_REPORT="1")
    counts = []
    for pairs in (0, 1000):
        b = Member(helper, "memory_budget_mb:900", env, stderr=subprocess.PIPE)
        for k in range(8):
            assert b.alloc(100, k) is not None
        b.cmd("free 7")
        for k in range(pairs):
            b.alloc(100, 99)
            b.cmd("free %d" % (8 + k))
        b.send("quit")
        err = b.p.communicate()[1]
        c = {}
        for line in err.splitlines():
            w = line.split()
            if len(w) == 5 and w[0] == "cudaemu" and w[4] == "call(s)":
                c[w[2]] = int(w[3])
        counts.append((c.get("cuMemGetInfo", 0), c.get("cuMemCreate", 0)))
    return counts


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: group_bench.py BUILD_DIR [--rounds N]")
    helper = os.path.join(sys.argv[1], "tests", "group", "group_helper")
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 16
    os.environ.setdefault("XSEG_LIBCUDA", os.path.join(sys.argv[1], "cudaemu", "libcudaemu.so"))
    tag = "gb%d" % os.getpid()
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None
    load_rounds = int(sys.argv[sys.argv.index("--load-rounds") + 1]) if "--load-rounds" in sys.argv else 10
    if only == "budget":
        return budgets(helper, tag)
    if only == "load":
        return load_table(helper, tag, load_rounds)
    print("| staggered bursts, %d rounds | OOMs | failed pattern checks | malloc p50 ms, new pages, no ask "
          "(n) | malloc p50 / p99 ms, asked (n) | bytes moved |" % rounds)
    print("|---|---|---|---|---|---|")
    for name, cfg in (("without the group", ""), ("with the group", "memory_group:bench")):
        ooms, bad, lat, plain, moved = bursts(helper, cfg, rounds, tag + ("g" if cfg else "n"))
        l = "%.1f / %.1f (%d)" % (pct(lat, .5) * 1e3, pct(lat, .99) * 1e3, len(lat)) if cfg else "-"
        print("| %s | %d | %d | %.1f (%d) | %s | %s |" % (
            name, ooms, bad, pct(plain, .5) * 1e3, len(plain), l,
            "%.0f MiB" % (moved / 2**20) if cfg else "-"))
    ans, dt = killed_mid_request(helper, tag + "k")
    print("\nmember SIGKILLed mid-request: malloc answered '%s' after %.1f ms (kill at 50 ms)"
          % (ans[:40], dt * 1e3))
    ans, dt, givers, moved = many(helper, tag + "m")
    print("32 members x 20 MiB cached, one 800 MiB malloc: '%s' in %.1f ms, %d members gave "
          "%.0f MiB" % (ans[:40], dt * 1e3, givers, moved / 2**20))
    budgets(helper, tag)
    print()
    load_table(helper, tag, load_rounds)


def budgets(helper, tag):
    print("\n| B: memory_budget_mb:400, 64 MiB outside xseg; H: 300 MiB outside xseg + 100 MiB in xseg "
          "| B's foreign estimate MiB (true 64) | B reached MiB (within the budget: 336) "
          "| B's xseg reserved at the refusal MiB |")
    print("|---|---|---|---|")
    for case, name in (("outside", "H in no group"), ("member", "H in B's group"),
                       ("late", "H in B's group, its memory after B measured")):
        est, reached, res, _ = budget(helper, tag + "b" + case[0], case)
        print("| %s | %.0f | %d | %.0f |" % (name, est, reached, res))
    reached, gave, held, msg = group_budget(helper, tag + "gb")
    print("\ngroup budget 700 MiB, H 300 MiB cached: B reached %d MiB, H gave %.0f MiB, the two hold "
          "%.0f MiB at B's refusal: '%s'" % (reached, gave, held, msg))
    (i0, c0), (i1, c1) = driver_calls(helper, tag + "dc")
    print("budgeted process, 8 growths: %d cuMemGetInfo, %d cuMemCreate; with 1000 cached pairs "
          "more: %d cuMemGetInfo, %d cuMemCreate" % (i0, c0, i1, c1))


if __name__ == "__main__":
    main()
