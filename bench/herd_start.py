#!/usr/bin/env python3
"""How the herd starts: N waiters started at once (`bench.herd`) under `perf record -a` on
CLOCK_MONOTONIC; for the winner of the first grant, when its lockctl was exec'd, sent its first
attempt, read its grant, read its watcher's first word, wrote the lease's deadline to it, and
when its `cs` was exec'd and started, all from the first lockctl's exec; then the gaps between
sections.

    python3 bench/herd_start.py BIN N[,N...] REPS

Needs perf (root) and bench/out/cs (bench/run builds it).
"""

import os
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
import handoff_trace as ht  # noqa: E402


def main():
    binary = os.path.abspath(sys.argv[1])
    bench.LOCKCTL = binary
    sizes = [int(x) for x in sys.argv[2].split(",")]
    reps = int(sys.argv[3])
    base = tempfile.mkdtemp(prefix="lockctl-herd-start-", dir="/tmp")
    srv = bench.Redis(base, "r0")
    # The scripts loaded once, as on a server in use: a new server would make every waiter send
    # their source.
    bench.run(bench.lockctl([srv.url()], "exec", "warm", "--", "true"))
    try:
        for rep in range(reps):
            for n in sizes:
                one(srv, base, binary, n, rep)
    finally:
        srv.stop()


def one(srv, base, binary, n, rep):
    d = os.path.join(base, f"{rep}-{n}")
    os.makedirs(d)
    data = os.path.join(d, "perf.data")
    perf = subprocess.Popen(
        ["perf", "record", "-q", "-a", "-k", "CLOCK_MONOTONIC", "-o", data,
         "-e", "raw_syscalls:sys_enter", "--filter", ht.FILTER,
         "-e", "raw_syscalls:sys_exit", "--filter", ht.FILTER,
         "-e", "sched:sched_process_fork,sched:sched_process_exec,sched:sched_process_exit"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1)
    wall, _ = bench.herd("lockctl", srv, d, n, 20)
    perf.send_signal(signal.SIGINT)
    perf.wait()
    with open(os.path.join(d, f"herd-lockctl-{n}.log")) as f:
        secs = sorted(tuple(map(int, line.split())) for line in f)
    ev = ht.parse(data)
    os.remove(data)
    execs = [(t, pid, rest) for t, pid, tid, comm, e, rest in ev
             if e == "sched:sched_process_exec"]
    lockctls = [x for x in execs if x[2].startswith("filename=" + binary)]
    t0 = min(x[0] for x in lockctls)
    forks = {}
    for t, pid, tid, comm, e, rest in ev:
        if e == "sched:sched_process_fork":
            m = re.search(r"pid=(\d+) child_comm=.* child_pid=(\d+)", rest)
            forks[int(m.group(2))] = int(m.group(1))
    first_cs = min(x for x in execs if x[2].split()[0].endswith("/cs"))
    owner = forks[first_cs[1]]
    calls = [(t, e, r) for t, pid, tid, comm, e, r in ev
             if pid == owner and tid == owner and e.startswith("raw_")]
    exec_at = next(x[0] for x in lockctls if x[1] == owner)
    sent = next(t for t, e, r in calls if e.endswith("enter") and r.startswith("NR 44 "))
    told = next(t for t, e, r in calls
                if e.endswith("enter") and r.startswith("NR 1 ") and r.split(", ")[2] == "9")
    ready = max(t for t, e, r in calls if e.endswith("exit") and r == "NR 0 = 5" and t <= told)
    grant = max(t for t, e, r in calls
                if e.endswith("exit") and r.startswith("NR 45 ") and t <= told)

    def ms(t):
        return (t - t0) / 1e6

    gaps = [(b[0] - a[1]) / 1e6 for a, b in zip(secs, secs[1:])]
    print(f"N={n:3} wall {wall:.3f} s | the winner, ms from the first lockctl's exec: exec "
          f"{ms(exec_at):.1f}, attempt sent {ms(sent):.1f}, grant read {ms(grant):.1f}, watcher's "
          f"first word {ms(ready):.1f}, deadline told {ms(told):.1f}, cs exec'd "
          f"{ms(first_cs[0]):.1f}, cs started {ms(secs[0][0]):.1f} | last lockctl exec'd "
          f"{ms(max(x[0] for x in lockctls)):.1f} | gaps: first five {sum(gaps[:5]):.1f}, "
          f"median {statistics.median(gaps):.2f}, all {sum(gaps):.1f}", flush=True)


if __name__ == "__main__":
    main()
