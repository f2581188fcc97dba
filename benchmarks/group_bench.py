#!/usr/bin/python3
"""Memory groups (issue 37; docs/benchmarks.md#memory-groups): member processes on one cudaemu
device shared among them (CUDAEMU_SHARED), driven through tests/group/group_helper.

  benchmarks/group_bench.py BUILD_DIR [--rounds N]

1. Staggered bursts: four members on a 1 GiB device; each keeps 100 MiB live and in its turn
   bursts 300 MiB more (ten 30 MiB allocations), every member checks its byte patterns, then it
   frees the burst (which stays cached). Peaks sum to 1.6x the device; live bytes never exceed
   0.7x. OOMs and failed checks without the group and with it; the give-way latency (malloc
   round trips that asked the group) p50 / p99 against mallocs that mapped new pages without
   asking (the baseline, same run); bytes moved between members.
2. A member killed with SIGKILL while a request to it is pending (stopped first, so it cannot
   answer): the asker's malloc round trip.
3. 32 members holding 20 MiB cached each; one 800 MiB malloc that needs 416 MiB of it.
Wall times are this machine's, on cudaemu (no GPU), including the pipe round trip.
"""
import os
import signal
import subprocess
import sys
import time


class Member:
    def __init__(self, helper, config, env):
        self.p = subprocess.Popen([helper, config], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  env=env, text=True, bufsize=1)
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


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: group_bench.py BUILD_DIR [--rounds N]")
    helper = os.path.join(sys.argv[1], "tests", "group", "group_helper")
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 16
    os.environ.setdefault("XSEG_LIBCUDA", os.path.join(sys.argv[1], "cudaemu", "libcudaemu.so"))
    tag = "gb%d" % os.getpid()
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


if __name__ == "__main__":
    main()
