#!/usr/bin/env python3
"""Two lockctl binaries against each other, interleaved: the contention benchmark (4 workers x 15
x 20 ms) and the herd, each repetition running A and B in a new random order, on one local
redis-server. Prints every repetition and the ratios B / A of the pooled numbers.

    python3 bench/ab.py OLD_BIN NEW_BIN [--reps 6] [--herd 30,100] [--only contention,herd]

Needs bench/out/cs (bench/run builds it).
"""

import argparse
import os
import random
import statistics
import sys
import tempfile

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402


def ms(ns_list, p):
    return bench.pct(ns_list, p) / 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--herd", default="30,100")
    ap.add_argument("--only", default="contention,herd", help="contention,herd,exec (exec: "
                    "`exec NAME -- true` on a free lock, --rounds rounds)")
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args()
    bins = {"A": os.path.abspath(args.a), "B": os.path.abspath(args.b)}
    only = set(args.only.split(","))
    herd_ns = [int(n) for n in args.herd.split(",") if n]
    base = tempfile.mkdtemp(prefix="lockctl-ab-", dir="/tmp")
    srv = bench.Redis(base, "r0")
    gaps = {k: [] for k in bins}
    walls = {k: [] for k in bins}
    herd = {(k, n): [] for k in bins for n in herd_ns}
    cmds = {(k, n): [] for k in bins for n in herd_ns}
    try:
        if "exec" in only:
            def go(k):
                return lambda: bench.run([bins[k], "-r", srv.url(), "exec", "free", "--",
                                          bench.TRUE])
            t = bench.interleave({k: go(k) for k in bins}, args.rounds, 10)
            a, b = statistics.median(t["A"]), statistics.median(t["B"])
            print(f"exec -- true, free lock, {args.rounds} rounds: A {a * 1e3:.2f} ms  "
                  f"B {b * 1e3:.2f} ms  B/A {b / a:.3f}", flush=True)
        for rep in range(args.reps if only & {"contention", "herd"} else 0):
            line = [f"rep {rep}:"]
            if "contention" in only:
                order = list(bins)
                random.shuffle(order)
                for k in order:
                    bench.LOCKCTL = bins[k]
                    wall, g, _ = bench.contention("lockctl", srv, base, 4, 15, 20, f"{k}{rep}")
                    gaps[k] += g
                    walls[k].append(wall)
                    line.append(f"{k} p50 {ms(g, 50):.2f} p99 {ms(g, 99):.2f} wall {wall:.3f}")
            if "herd" in only:
                for n in herd_ns:
                    order = list(bins)
                    random.shuffle(order)
                    for k in order:
                        bench.LOCKCTL = bins[k]
                        d = os.path.join(base, f"h{k}{rep}-{n}")
                        os.makedirs(d)
                        wall, c = bench.herd("lockctl", srv, d, n, 20)
                        herd[k, n].append(wall)
                        cmds[k, n].append(c / n)
                        line.append(f"herd{n} {k} {wall:.3f}")
            print("  ".join(line), flush=True)
    finally:
        srv.stop()
    if "contention" in only:
        for p in (50, 90, 99):
            a, b = ms(gaps["A"], p), ms(gaps["B"], p)
            print(f"handoff p{p}: A {a:.2f} ms  B {b:.2f} ms  B/A {b / a:.3f}")
        a, b = statistics.median(walls["A"]), statistics.median(walls["B"])
        print(f"contention wall: A {a:.3f} s  B {b:.3f} s  B/A {b / a:.3f}")
    for n in herd_ns:
        if herd["A", n]:
            a, b = statistics.median(herd["A", n]), statistics.median(herd["B", n])
            print(f"herd N={n}: A {a:.3f} s  B {b:.3f} s  B/A {b / a:.3f}  commands/section "
                  f"A {statistics.median(cmds['A', n]):.1f} B {statistics.median(cmds['B', n]):.1f}")


if __name__ == "__main__":
    main()
