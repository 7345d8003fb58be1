#!/usr/bin/env python3
"""Where one handoff's time goes: the contention benchmark (4 workers x 15 x `lockctl exec NAME --
cs LOG 20`), or with --herd N the herd of N waiters, under `perf record -a` on CLOCK_MONOTONIC, the clock `cs` logs its sections on, with
the syscall and process tracepoints of every process. For each handoff between two workers it
finds, in order, the holder's job exiting, its lockctl seeing it, the release sent and answered,
the server's writes, the waiter's wake read, its attempt, the grant, the deadline told to the
watcher, the fork, the exec and the next section's start, and prints the medians of each step.

    python3 bench/handoff_trace.py [--bin PATH [--bin PATH2]] [--runs N] [--herd N]

Needs perf (root, or perf_event_paranoid <= -1) and bench/out/cs (bench/run builds it). Files go to
bench/out/trace/.
"""

import argparse
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402

DIR = os.path.join(bench.OUT, "trace")
# x86_64 syscall numbers.
READ, WRITE, SENDTO, RECVFROM, WAIT4, EXIT_GROUP, WAITID, WRITEV = 0, 1, 44, 45, 61, 231, 247, 20
# Only the syscalls the steps are found by, to keep the tracing's own cost down.
FILTER = " || ".join(f"id == {n}" for n in (READ, WRITE, SENDTO, RECVFROM, EXIT_GROUP, WAITID,
                                               WRITEV))
LINE = re.compile(r"^\s*(.+?)\s+(\d+)/(\d+)\s+(\d+)\.(\d+):\s+(\S+):\s*(.*)$")


def parse(path):
    """Events of one perf.data as tuples (ns, tgid, tid, comm, event, fields)."""
    p = subprocess.run(["perf", "script", "-i", path, "--ns", "-F", "comm,pid,tid,time,event,trace"],
                       capture_output=True, text=True, check=True)
    out = []
    for line in p.stdout.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        comm, pid, tid, s, frac, ev, rest = m.groups()
        ns = int(s) * 1_000_000_000 + int(frac.ljust(9, "0")[:9])
        out.append((ns, int(pid), int(tid), comm, ev, rest))
    return out


def steps_of(events, sections):
    forks, execs, exits = {}, {}, {}
    sysc = {}  # tgid -> list of (ns, tid, kind, nr, value)
    redis_writes = []
    for ns, pid, tid, comm, ev, rest in events:
        if ev == "sched:sched_process_fork":
            m = re.search(r"pid=(\d+) child_comm=.* child_pid=(\d+)", rest)
            forks[int(m.group(2))] = (int(m.group(1)), ns)
        elif ev == "sched:sched_process_exec":
            m = re.search(r"filename=(\S+) pid=(\d+)", rest)
            if m.group(1).endswith("/cs"):
                execs[int(m.group(2))] = ns
        elif ev == "sched:sched_process_exit":
            exits.setdefault(pid, []).append((ns, tid, comm))
        elif ev == "raw_syscalls:sys_enter":
            m = re.match(r"NR (-?\d+) \(([0-9a-f]+), ([0-9a-f]+), ([0-9a-f]+)", rest)
            if m is None:
                continue
            nr = int(m.group(1))
            sysc.setdefault(pid, []).append((ns, tid, "enter", nr, int(m.group(4), 16)))
            if comm.startswith("redis-server") and nr in (WRITE, WRITEV):
                redis_writes.append(ns)
        elif ev == "raw_syscalls:sys_exit":
            m = re.match(r"NR (-?\d+) = (-?\d+)", rest)
            if m is None:
                continue
            sysc.setdefault(pid, []).append((ns, tid, "exit", int(m.group(1)), int(m.group(2))))

    def first(tgid, after, pred):
        for e in sysc.get(tgid, []):
            if e[0] >= after and pred(e):
                return e[0]
        return None

    def last(tgid, after, before, pred):
        found = None
        for e in sysc.get(tgid, []):
            if after <= e[0] < before and pred(e):
                found = e[0]
        return found

    # The cs process of each section: the exec just before its start.
    cs_by_start = []
    for start, end, worker in sections:
        cands = [(start - t, pid) for pid, t in execs.items() if 0 <= start - t < 20_000_000]
        cs_by_start.append(min(cands)[1] if cands else None)

    rows = []
    for k in range(len(sections) - 1):
        (s0, e0, w0), (s1, e1, w1) = sections[k], sections[k + 1]
        jh, jw = cs_by_start[k], cs_by_start[k + 1]
        if w0 == w1 or jh is None or jw is None or jh not in forks or jw not in forks:
            continue
        lh, lw = forks[jh][0], forks[jw][0]
        r = {"cs end": e0}
        r["job exit_group"] = first(jh, e0, lambda e: e[2] == "enter" and e[3] == EXIT_GROUP)
        r["job exited"] = next((t for t, tid, _ in exits.get(jh, []) if t >= e0), None)
        r["lockctl's waitid returns"] = first(lh, e0, lambda e: e[1] == lh and e[2] == "exit"
                                             and e[3] == WAITID and e[4] == 0)
        after = r["lockctl's waitid returns"] or e0
        r["release sent"] = first(lh, after, lambda e: e[1] == lh and e[2] == "enter"
                                  and e[3] == SENDTO)
        sent = r["release sent"]
        if sent is None:
            continue
        r["watcher told forget"] = first(lh, after, lambda e: e[1] == lh and e[2] == "enter"
                                         and e[3] == WRITE and e[4] == 1)
        r["watcher told done"] = last(lh, after, sent, lambda e: e[1] == lh and e[2] == "enter"
                                      and e[3] == WRITE and e[4] == 1)
        r["server's first write"] = next((t for t in redis_writes if t >= sent), None)
        r["release reply read"] = first(lh, sent, lambda e: e[1] == lh and e[2] == "exit"
                                        and e[3] == RECVFROM and e[4] > 0)
        r["waiter's wake read"] = first(lw, sent, lambda e: e[1] != lw and e[2] == "exit"
                                        and e[3] == RECVFROM and e[4] > 0)
        woke = r["waiter's wake read"] or sent
        r["attempt sent"] = first(lw, woke, lambda e: e[1] == lw and e[2] == "enter"
                                  and e[3] == SENDTO)
        r["grant read"] = first(lw, r["attempt sent"] or woke, lambda e: e[1] == lw
                                and e[2] == "exit" and e[3] == RECVFROM and e[4] > 0)
        granted = r["grant read"] or woke
        r["watcher told deadline"] = first(lw, granted, lambda e: e[1] == lw and e[2] == "enter"
                                           and e[3] == WRITE and e[4] == 9)
        r["job forked"] = forks[jw][1]
        r["job exec'd"] = execs[jw]
        r["cs start"] = s1
        r["holder lockctl exited"] = next((t for t, tid, _ in exits.get(lh, []) if tid == lh),
                                          None)
        rows.append(r)
    return rows


ORDER = ["cs end", "job exit_group", "job exited", "lockctl's waitid returns", "watcher told forget",
         "watcher told done",
         "release sent", "server's first write", "waiter's wake read", "attempt sent",
         "grant read", "watcher told deadline", "job forked", "job exec'd", "cs start"]
APART = [("release sent", "release reply read"), ("release sent", "holder lockctl exited")]


def report(rows_by_bin):
    names = list(rows_by_bin)
    counts = ", ".join(f"{len(rows_by_bin[k])} ({k})" for k in names)
    print(f"handoffs between workers traced: {counts}; medians, ms (p90 in brackets)")
    print(f"  {'':>55}" + "".join(f"{k[-18:]:>20}" for k in names))

    def line(a, b):
        cells = []
        for k in names:
            d = [(r[b] - r[a]) / 1e6 for r in rows_by_bin[k]
                 if r.get(a) is not None and r.get(b) is not None]
            cells.append(f"{statistics.median(d):8.3f} [{bench.pct(d, 90):7.3f}]" if d else
                         f"{'-':>18}")
        print(f"  {a:>26} -> {b:<26}" + "".join(f"{c:>20}" for c in cells))

    for a, b in zip(ORDER, ORDER[1:]):
        line(a, b)
    for a, b in APART:
        line(a, b)
    line("cs end", "cs start")


def trace_one(args, srv, base, tag):
    """One traced run of the contention benchmark (or the herd) with bench.LOCKCTL."""
    data = os.path.join(DIR, f"run{tag}.data")
    perf = subprocess.Popen(
        ["perf", "record", "-q", "-a", "-k", "CLOCK_MONOTONIC", "-o", data,
         "-e", "raw_syscalls:sys_enter", "--filter", FILTER,
         "-e", "raw_syscalls:sys_exit", "--filter", FILTER,
         "-e", "sched:sched_process_fork,sched:sched_process_exec,sched:sched_process_exit"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    if args.herd:
        work = os.path.join(base, f"herd{tag}")
        os.makedirs(work)
        bench.herd("lockctl", srv, work, args.herd, 20)
        log = os.path.join(work, f"herd-lockctl-{args.herd}.log")
    else:
        bench.contention("lockctl", srv, base, 4, 15, 20, tag)
        log = os.path.join(base, f"lockctl-{tag}.log")
    perf.send_signal(signal.SIGINT)
    perf.wait()
    with open(log) as f:
        sections = sorted(tuple(map(int, line.split())) for line in f)
    rows = steps_of(parse(data), sections)
    os.remove(data)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", action="append", help="a lockctl binary; several are interleaved, "
                    "in a new random order each run")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--herd", type=int, default=0, help="trace the herd of N waiters instead")
    args = ap.parse_args()
    bins = [os.path.abspath(b) for b in (args.bin or [bench.LOCKCTL])]
    os.makedirs(DIR, exist_ok=True)
    base = tempfile.mkdtemp(prefix="lockctl-trace-", dir="/tmp")
    srv = bench.Redis(base, "r0")
    rows = {b: [] for b in bins}
    try:
        for run in range(args.runs):
            order = list(bins)
            random.shuffle(order)
            for i, b in enumerate(order):
                bench.LOCKCTL = b
                rows[b] += trace_one(args, srv, base, f"{run}-{i}")
    finally:
        srv.stop()
    report(rows)


if __name__ == "__main__":
    main()
