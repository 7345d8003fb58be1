#!/usr/bin/env python3
"""lockctl side by side with its peers, on real local redis-servers.

Run through `bench/run`, which installs what is missing and builds lockctl in release mode first.
Every comparison interleaves its variants in random order, round after round, so that the noise of a
shared machine (other builds, other tests) falls on all of them alike; the table shows medians and
the ratio of medians. Raw numbers go to bench/out/ (git-ignored).

Each variant checks its own results (the token came back, the release deleted the key, the critical
sections never overlapped): a benchmark of something that failed would be meaningless.
"""

import argparse
import json
import os
import platform
import random
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "bench", "out")
# The plots are committed beside this file; everything else stays in OUT.
PLOTS = os.path.join(ROOT, "bench")
LOCKCTL = os.environ.get("LOCKCTL_BIN", os.path.join(ROOT, "target", "release", "lockctl"))
CS = os.path.join(OUT, "cs")
TRUE = shutil.which("true") or "/bin/true"
# The canonical compare-and-delete that every Redis lock recipe uses.
RELEASE_LUA = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) "
    "else return 0 end"
)
ENV = {
    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    "HOME": os.environ.get("HOME", "/tmp"),
    "LANG": "C",
    # The servers are seconds old: without this, restart quarantine would refuse every grant.
    "LOCKCTL_QUARANTINE": "0",
}


class Failed(Exception):
    pass


def run(argv, capture=False, expect=0, stdin=None):
    """Runs one program, as a shell script would, and returns its stdout."""
    p = subprocess.run(
        argv,
        stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL if stdin is None else stdin,
        env=ENV,
        close_fds=False,
    )
    if expect is not None and p.returncode != expect:
        raise Failed(f"{argv[0]} {' '.join(argv[1:4])}... exited {p.returncode}: "
                     f"{p.stderr.decode(errors='replace').strip()[:300]}")
    return p.stdout or b""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Redis:
    """A redis-server of our own: unix socket (and a loopback port if asked), no persistence."""

    def __init__(self, base, name, tcp=False, extra=()):
        self.dir = os.path.join(base, name)
        os.makedirs(self.dir)
        self.sock = os.path.join(self.dir, "s")
        self.port = free_port() if tcp else 0
        self.log = open(os.path.join(self.dir, "log"), "wb")
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--unixsocket", self.sock, "--unixsocketperm", "700", "--save", "",
             "--appendonly", "no", "--dir", self.dir, *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while True:
            if self.proc.poll() is not None:
                raise Failed(f"redis-server {name} exited; see {self.dir}/log")
            try:
                if run(["redis-cli", "-s", self.sock, "PING"], capture=True).strip() == b"PONG":
                    break
            except Failed:
                pass
            if time.monotonic() > deadline:
                raise Failed(f"redis-server {name} did not start")
            time.sleep(0.05)

    def url(self, tcp=False):
        return f"redis://127.0.0.1:{self.port}" if tcp else f"unix://{self.sock}"

    def cli(self, tcp=False):
        return ["redis-cli", "-p", str(self.port)] if tcp else ["redis-cli", "-s", self.sock]

    def stop(self):
        self.proc.kill()
        self.proc.wait()
        self.log.close()


def lockctl(urls, *args):
    argv = [LOCKCTL]
    for u in urls:
        argv += ["-r", u]
    return argv + list(args)


# ---------------------------------------------------------------- timing


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def interleave(variants, rounds, warmup):
    """Runs each variant `rounds` times, in a new random order every round; returns seconds per run."""
    samples = {k: [] for k in variants}
    for r in range(warmup + rounds):
        order = list(variants)
        random.shuffle(order)
        for k in order:
            t = timed(variants[k])
            if r >= warmup:
                samples[k].append(t)
    return samples


def pct(xs, p):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    i = min(len(xs) - 1, max(0, int(round(p / 100 * (len(xs) - 1)))))
    return xs[i]


def summary(xs):
    return {"n": len(xs), "median": statistics.median(xs), "p10": pct(xs, 10), "p90": pct(xs, 90),
            "min": min(xs), "max": max(xs)}


def save_raw(name, samples):
    with open(os.path.join(OUT, f"{name}.csv"), "w") as f:
        keys = list(samples)
        f.write("round," + ",".join(keys) + "\n")
        for i in range(max(len(v) for v in samples.values())):
            f.write(str(i) + "," + ",".join(
                f"{samples[k][i]:.9f}" if i < len(samples[k]) else "" for k in keys) + "\n")


# ---------------------------------------------------------------- the variants


def lockctl_acquire_release(urls, name):
    def go():
        tok = run(lockctl(urls, "acquire", name, "-n", "--ttl", "30s"), capture=True).strip()
        if len(tok) != 32:
            raise Failed(f"acquire printed {tok!r}")
        run(lockctl(urls, "release", name, "--token", tok))
    return go


def cli_acquire_release(cli, key):
    def go():
        tok = os.urandom(16).hex()
        if run(cli + ["SET", key, tok, "NX", "PX", "30000"], capture=True).strip() != b"OK":
            raise Failed("SET NX did not take the free key")
        if run(cli + ["EVAL", RELEASE_LUA, "1", key, tok], capture=True).strip() != b"1":
            raise Failed("the release script did not delete the key")
    return go


def lockctl_exec_true(urls, name):
    return lambda: run(lockctl(urls, "exec", name, "--", TRUE))


def recipe_exec_true(cli, key):
    def go():
        tok = os.urandom(16).hex()
        if run(cli + ["SET", key, tok, "NX", "PX", "30000"], capture=True).strip() != b"OK":
            raise Failed("SET NX did not take the free key")
        run([TRUE])
        if run(cli + ["EVAL", RELEASE_LUA, "1", key, tok], capture=True).strip() != b"1":
            raise Failed("the release script did not delete the key")
    return go


# ---------------------------------------------------------------- contention

SH_WORKER = 'read _go; i=0; while [ "$i" -lt "$N" ]; do "$@" || exit 1; i=$((i+1)); done'

PY_WORKER = r"""
import os, sys, time, redis
sock, name, log, n, ms = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
worker = int(os.environ["BENCH_WORKER"])
r = redis.Redis(unix_socket_path=sock)
r.ping()
fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
print("ready", flush=True)
sys.stdin.readline()
for _ in range(n):
    with r.lock(name, timeout=30):  # blocking, polling every 0.1 s: redis-py's defaults
        s = time.monotonic_ns()
        time.sleep(ms / 1000)
        e = time.monotonic_ns()
        os.write(fd, f"{s} {e} {worker}\n".encode())
"""


def contention(tool, srv, workdir, workers, sections, ms, rep):
    """`workers` processes each run `sections` critical sections of `ms` through `tool`. Returns the
    wall time from the start signal to the last exit, and the sections (start, end) in ns."""
    log = os.path.join(workdir, f"{tool}-{rep}.log")
    lockfile = os.path.join(workdir, "flock.lock")
    if tool == "lockctl":
        cmd = ["sh", "-c", SH_WORKER, "sh", *lockctl([srv.url()], "-q", "exec", "contended", "--",
                                                    CS, log, str(ms))]
    elif tool == "flock":
        cmd = ["sh", "-c", SH_WORKER, "sh", "flock", lockfile, CS, log, str(ms)]
    elif tool == "redis-py":
        cmd = [sys.executable, "-c", PY_WORKER, srv.sock, "pylock:contended", log, str(sections),
               str(ms)]
    else:
        raise ValueError(tool)
    py = tool == "redis-py"
    procs = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE if py else None,
                              env=dict(ENV, N=str(sections), BENCH_WORKER=str(w)))
             for w in range(workers)]
    if py:
        # Python's start-up and imports are not the lock's cost: start the clock once all are ready.
        for p in procs:
            if p.stdout.readline().strip() != b"ready":
                raise Failed("a redis-py worker did not start")
    t0 = time.perf_counter()
    for p in procs:
        p.stdin.write(b"go\n")
        p.stdin.close()
    for p in procs:
        if p.wait() != 0:
            raise Failed(f"a {tool} worker exited {p.returncode}")
    wall = time.perf_counter() - t0
    with open(log) as f:
        secs = sorted(tuple(map(int, line.split())) for line in f)
    if len(secs) != workers * sections:
        raise Failed(f"{tool}: {len(secs)} critical sections logged, expected {workers * sections}")
    for a, b in zip(secs, secs[1:]):
        if b[0] < a[1]:
            raise Failed(f"{tool}: two critical sections overlapped: {a} and {b}")
    # A handoff goes to another worker; a worker that takes the lock again right after its own
    # release is counted apart (no waiter had to be woken).
    handoffs = [b[0] - a[1] for a, b in zip(secs, secs[1:]) if a[2] != b[2]]
    again = [b[0] - a[1] for a, b in zip(secs, secs[1:]) if a[2] == b[2]]
    return wall, handoffs, again


# ---------------------------------------------------------------- exec wrapper footprint


def proc_status(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "VmHWM", "Threads"):
                    out[k] = int(v.split()[0])
    except FileNotFoundError:
        return None
    return out


def cpu_ns(pid):
    """CPU time of every live thread of `pid` (schedstat: nanoseconds, unlike the ticks of stat)."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
            except FileNotFoundError:
                pass
    except FileNotFoundError:
        return None
    return total


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime, all threads, dead ones included


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return f.read().split()
    except FileNotFoundError:
        return []


def footprint(argv, seconds, label):
    """Starts `argv` (a wrapper whose child sleeps `seconds`), samples /proc until it exits."""
    p = subprocess.Popen(argv, env=ENV, stdin=subprocess.DEVNULL)
    t0 = time.monotonic()
    samples = []
    child_at = None
    while time.monotonic() - t0 < 5:
        if children(p.pid):
            child_at = time.monotonic()
            break
        time.sleep(0.001)
    if child_at is None:
        p.kill()
        raise Failed(f"{label}: no child appeared")
    start_cpu, start_ticks = cpu_ns(p.pid), cpu_ticks(p.pid)
    end_cpu = end_ticks = end_at = None
    stop_at = child_at + seconds - 1.0
    while p.poll() is None:
        st = proc_status(p.pid)
        # An exiting process (a zombie) has no memory lines left: not a sample.
        if st and "VmRSS" in st and "VmHWM" in st:
            samples.append((time.monotonic() - t0, st))
        if end_at is None and time.monotonic() >= stop_at:
            end_cpu, end_ticks, end_at = cpu_ns(p.pid), cpu_ticks(p.pid), time.monotonic()
        time.sleep(0.05)
    if end_at is None:
        raise Failed(f"{label}: exited early ({p.returncode})")
    if p.returncode != 0:
        raise Failed(f"{label}: exited {p.returncode}")
    window = end_at - child_at
    return {
        "label": label,
        "rss_kib_max": max(s["VmRSS"] for _, s in samples),
        "hwm_kib": max(s["VmHWM"] for _, s in samples),
        "threads": max(s.get("Threads", 0) for _, s in samples),
        "startup_cpu_ms": start_cpu / 1e6,
        "window_s": window,
        "window_cpu_ms": (end_cpu - start_cpu) / 1e6,
        "window_cpu_ticks": end_ticks - start_ticks,
        "cpu_percent": (end_cpu - start_cpu) / 1e9 / window * 100,
        "samples": [(round(t, 3), s) for t, s in samples],
    }


# ---------------------------------------------------------------- list over a large keyspace


def run_rusage(argv):
    """Runs `argv` under GNU time, counts the lines it prints, and returns (seconds, lines, peak RSS
    KiB, exit, stderr). A child forked from this Python process would inherit its RSS as the starting
    point of ru_maxrss; forked from the small `time` process, the peak is the program's own."""
    fd, tfile = tempfile.mkstemp(prefix="bench-rss-")
    os.close(fd)
    t0 = time.perf_counter()
    p = subprocess.Popen(["/usr/bin/time", "-q", "-f", "%M", "-o", tfile, *argv],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
    lines = 0
    while True:
        chunk = p.stdout.read(1 << 16)
        if not chunk:
            break
        lines += chunk.count(b"\n")
    err = p.stderr.read()
    p.wait()
    wall = time.perf_counter() - t0
    with open(tfile) as f:
        rss = int(f.read().split()[-1])
    os.unlink(tfile)
    return wall, lines, rss, p.returncode, err.decode(errors="replace").strip()



# ---------------------------------------------------------------- start-up


def startup_variants(srv):
    """Single invocations, each one process: /bin/true, lockctl's floor (--version), an acquire of a
    free lock (one round trip), and redis-cli's nearest equivalent (one SET NX PX)."""
    n = [0]

    def acquire():
        n[0] += 1
        tok = run(lockctl([srv.url()], "acquire", f"su-{n[0]}", "-n", "--ttl", "30s"),
                  capture=True).strip()
        if len(tok) != 32:
            raise Failed(f"acquire printed {tok!r}")

    def cli_set():
        n[0] += 1
        if run(srv.cli() + ["SET", f"lockctl:su-cli-{n[0]}", "x", "NX", "PX", "30000"],
               capture=True).strip() != b"OK":
            raise Failed("SET NX did not take the free key")

    def version():
        if not run([LOCKCTL, "--version"], capture=True).startswith(b"lockctl "):
            raise Failed("--version printed no version")

    return {
        "/bin/true": lambda: run([TRUE]),
        "lockctl --version": version,
        "lockctl acquire -n": acquire,
        "redis-cli SET NX PX": cli_set,
    }


def plot_startup(medians, path):
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(8, 3.8))
    names = list(medians)
    ms = [medians[k] * 1000 for k in names]
    base = medians["/bin/true"]
    bars = ax.bar(names, ms, color=["tab:gray", "tab:blue", "tab:blue", "tab:red"][:len(names)])
    ax.bar_label(bars, labels=[f"{m:.2f} ms\n{medians[k] / base:.2f}x true"
                               for k, m in zip(names, ms)], fontsize=8)
    ax.set_ylabel("median wall time per invocation (ms)")
    ax.set_ylim(0, max(ms) * 1.3)
    ax.set_title("Start-up: one invocation, spawned by the harness (interleaved rounds)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot", file=sys.stderr)
        return None
    return plt


# ---------------------------------------------------------------- topologies


def wait_until(what, cond, limit=60):
    deadline = time.monotonic() + limit
    while not cond():
        if time.monotonic() > deadline:
            raise Failed(f"{what} never happened")
        time.sleep(0.1)


def info_field(cli, section, key):
    try:
        text = run(cli + ["INFO", section], capture=True).decode()
    except Failed:
        return None
    for line in text.splitlines():
        if line.startswith(key + ":"):
            return line.split(":", 1)[1].strip()
    return None


class Proc:
    """A redis-server in some other mode (Sentinel, cluster node) on a loopback port."""

    def __init__(self, base, name, argv_of):
        self.dir = os.path.join(base, name)
        os.makedirs(self.dir)
        # A cluster node also listens on port + 10000 (its bus).
        self.port = free_port()
        while self.port > 55000:
            self.port = free_port()
        self.log = open(os.path.join(self.dir, "log"), "wb")
        self.proc = subprocess.Popen(argv_of(self), stdout=self.log, stderr=subprocess.STDOUT)
        def up():
            if self.proc.poll() is not None:
                raise Failed(f"{name} exited: {open(os.path.join(self.dir, 'log')).read()[-300:]}")
            return subprocess.run(self.cli() + ["PING"], capture_output=True).stdout.strip() == \
                b"PONG"
        wait_until(f"{name} answering PING", up, 20)

    def cli(self):
        return ["redis-cli", "-p", str(self.port)]

    def url(self):
        return f"redis://127.0.0.1:{self.port}"

    def stop(self):
        self.proc.kill()
        self.proc.wait()
        self.log.close()


def sentinel_group(base, servers):
    """A master with one replica and one Sentinel (quorum 1) watching it, as `bench-master`."""
    master = Redis(base, "s-master", tcp=True)
    servers.append(master)
    replica = Redis(base, "s-replica", tcp=True,
                    extra=["--replicaof", "127.0.0.1", str(master.port)])
    servers.append(replica)
    # Online on the master's side too: only then does a grant wait for it (WAIT).
    wait_until("the replica's sync", lambda: "state=online" in (info_field(
        master.cli(True), "replication", "slave0") or ""))

    def argv(p):
        conf = os.path.join(p.dir, "sentinel.conf")
        with open(conf, "w") as f:
            f.write(f"port {p.port}\nbind 127.0.0.1\ndir {p.dir}\n"
                    f"sentinel monitor bench-master 127.0.0.1 {master.port} 1\n"
                    "sentinel down-after-milliseconds bench-master 5000\n")
        return ["redis-server", conf, "--sentinel"]
    sentinel = Proc(base, "sentinel", argv)
    servers.append(sentinel)
    return master, sentinel


def cluster(base, servers, n=3):
    """A Redis Cluster of `n` masters without replicas (so no WAIT: comparable with a standalone)."""
    def argv(p):
        return ["redis-server", "--port", str(p.port), "--bind", "127.0.0.1", "--cluster-enabled",
                "yes", "--cluster-config-file", os.path.join(p.dir, "nodes.conf"), "--dir", p.dir,
                "--save", "", "--appendonly", "no"]
    nodes = []
    for i in range(n):
        nodes.append(Proc(base, f"c{i}", argv))
        servers.append(nodes[-1])
    run(["redis-cli", "--cluster", "create", *[f"127.0.0.1:{p.port}" for p in nodes],
         "--cluster-replicas", "0", "--cluster-yes"])
    wait_until("cluster_state:ok", lambda: all(
        b"cluster_state:ok" in subprocess.run(p.cli() + ["CLUSTER", "INFO"],
                                              capture_output=True).stdout for p in nodes))
    return nodes


def slot_owner(nodes, name):
    """The node that owns lock `name`'s slot, and one that does not: lockctl's own trace says
    whether a node redirected it."""
    owner = other = None
    for p in nodes:
        err = subprocess.run(lockctl([p.url()], "-v", "status", name), env=ENV,
                             capture_output=True).stderr
        if b"moved to" in err:
            other = other or p
        else:
            owner = owner or p
    if owner is None or other is None:
        raise Failed(f"no owner and non-owner of {name}'s slot found")
    return owner, other


# ---------------------------------------------------------------- herd


def commands_total(cli):
    """Commands the server ran since the last CONFIG RESETSTAT (INFO commandstats; commands a
    script runs are counted too)."""
    text = run(cli + ["INFO", "commandstats"], capture=True).decode()
    return sum(int(m) for m in re.findall(r"^cmdstat_\S+:calls=(\d+)", text, re.M))


def herd(tool, srv, workdir, n, ms):
    """`n` processes wait for one lock at once; each takes one critical section of `ms`. Returns
    the wall time from the start signal to the last exit and the server's commands (lockctl)."""
    log = os.path.join(workdir, f"herd-{tool}-{n}.log")
    if tool == "lockctl":
        inner = lockctl([srv.url()], "-q", "exec", f"herd-{n}", "--", CS, log, str(ms))
    else:
        inner = ["flock", os.path.join(workdir, f"herd-{n}.lock"), CS, log, str(ms)]
    cmd = ["sh", "-c", 'read _go; exec "$@"', "sh", *inner]
    procs = [subprocess.Popen(cmd, stdin=subprocess.PIPE, env=dict(ENV, BENCH_WORKER=str(w)))
             for w in range(n)]
    time.sleep(0.2)  # every shell is up and blocked on its read
    if tool == "lockctl":
        run(srv.cli() + ["CONFIG", "RESETSTAT"])
    t0 = time.perf_counter()
    for p in procs:
        p.stdin.write(b"go\n")
        p.stdin.close()
    for p in procs:
        if p.wait() != 0:
            raise Failed(f"herd: a {tool} waiter exited {p.returncode}")
    wall = time.perf_counter() - t0
    commands = commands_total(srv.cli()) if tool == "lockctl" else None
    with open(log) as f:
        secs = sorted(tuple(map(int, line.split())) for line in f)
    if len(secs) != n:
        raise Failed(f"herd {tool}: {len(secs)} critical sections logged, expected {n}")
    for a, b in zip(secs, secs[1:]):
        if b[0] < a[1]:
            raise Failed(f"herd {tool}: two critical sections overlapped")
    return wall, commands


def plot_herd(herd_res, path):
    plt = pyplot()
    if plt is None:
        return
    ns = sorted(int(k) for k in herd_res)
    ratio = [herd_res[str(n)]["ratio"] for n in ns]
    per = [herd_res[str(n)]["commands_per_section"] for n in ns]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    ax1.plot(ns, ratio, "o-", label="lockctl exec / flock(1)")
    ax1.axhline(1.1, color="tab:red", ls="--", lw=1, label="goal 1.1")
    ax1.axhline(1.0, color="gray", lw=0.8)
    ax1.set_xlabel("waiters N (each takes one 20 ms section)")
    ax1.set_ylabel("wall-time ratio")
    ax1.set_title("Wall time against flock(1)")
    ax1.legend()
    ax1.grid(alpha=0.3)
    ax2.plot(ns, per, "o-", color="tab:orange")
    ax2.set_xlabel("waiters N")
    ax2.set_ylabel("Redis commands per critical section")
    ax2.set_title("Server work per handoff (INFO commandstats)")
    ax2.grid(alpha=0.3)
    for x, y in zip(ns, per):
        ax2.annotate(f"{y:.0f}", (x, y), textcoords="offset points", xytext=(0, 6), ha="center",
                     fontsize=8)
    fig.suptitle("Herd: N waiters for one lock at once")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- main


def machine():
    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    redis_v = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "kernel": platform.release(),
        "redis": redis_v.split()[2].removeprefix("v=") if redis_v else "?",
        "python": platform.python_version(),
        "loadavg_start": open("/proc/loadavg").read().split()[:3],
    }


def fmt_ms(s):
    return f"{s * 1000:8.2f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=200, help="rounds per micro-benchmark")
    ap.add_argument("--reps", type=int, default=5, help="repetitions of each contention run")
    ap.add_argument("--only", default="", help="comma-separated subset: "
                    "startup,acq,exec,redlock,contention,topo,herd,footprint,list")
    ap.add_argument("--herd", default="10,30,60,100", help="waiter counts of the herd benchmark")
    ap.add_argument("--list-keys", type=int, default=1_000_000)
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    want = lambda k: not only or k in only  # noqa: E731

    os.makedirs(OUT, exist_ok=True)
    results = {"machine": machine(), "lockctl": LOCKCTL, "benchmarks": {}}
    rows = []  # (what, lockctl ms, peer, peer ms, ratio, goal)
    base = tempfile.mkdtemp(prefix="lockctl-bench-", dir="/tmp")
    servers = []
    try:
        main_srv = Redis(base, "r0", tcp=True)
        servers.append(main_srv)
        warm = max(5, args.rounds // 20)

        # The spawn floor: what starting any program costs this harness.
        floor = interleave({"true": lambda: run([TRUE])}, args.rounds, warm)
        results["benchmarks"]["spawn_floor"] = summary(floor["true"])

        if want("startup"):
            s = interleave(startup_variants(main_srv), args.rounds, warm)
            save_raw("startup", s)
            med = {k: statistics.median(v) for k, v in s.items()}
            results["benchmarks"]["startup"] = {k: summary(v) for k, v in s.items()}
            rows.append(("start-up: --version", med["lockctl --version"], "/bin/true",
                         med["/bin/true"], "<= 1.3"))
            rows.append(("start-up: acquire -n (one round trip)", med["lockctl acquire -n"],
                         "/bin/true", med["/bin/true"], "<= 1.5"))
            rows.append(("start-up: acquire -n (one round trip)", med["lockctl acquire -n"],
                         "redis-cli SET NX PX", med["redis-cli SET NX PX"], "-"))
            plot_startup(med, os.path.join(PLOTS, "startup.png"))

        if want("acq"):
            for tcp in (False, True):
                tr = "tcp" if tcp else "unix"
                s = interleave({
                    "lockctl": lockctl_acquire_release([main_srv.url(tcp)], f"ar-{tr}"),
                    "redis-cli": cli_acquire_release(main_srv.cli(tcp), f"lockctl:cli-ar-{tr}"),
                }, args.rounds, warm)
                save_raw(f"acquire_release_{tr}", s)
                a, b = statistics.median(s["lockctl"]), statistics.median(s["redis-cli"])
                results["benchmarks"][f"acquire_release_{tr}"] = {k: summary(v) for k, v in s.items()}
                rows.append((f"acquire + release ({tr})", a, "redis-cli SET NX PX + EVAL", b,
                             "<= 0.8"))

        if want("exec"):
            try:
                run(lockctl([main_srv.url()], "exec", "probe", "--", TRUE))
                s = interleave({
                    "lockctl": lockctl_exec_true([main_srv.url()], "ex"),
                    "recipe": recipe_exec_true(main_srv.cli(), "lockctl:recipe-ex"),
                }, args.rounds, warm)
                save_raw("exec_true", s)
                a, b = statistics.median(s["lockctl"]), statistics.median(s["recipe"])
                results["benchmarks"]["exec_true"] = {k: summary(v) for k, v in s.items()}
                rows.append(("exec NAME -- true", a, "redis-cli SET; true; redis-cli EVAL", b,
                             "<= 0.6"))
            except Failed as e:
                print(f"exec: skipped: {e}", file=sys.stderr)
                results["benchmarks"]["exec_true"] = {"skipped": str(e)}

        if want("redlock"):
            for i in range(1, 5):
                servers.append(Redis(base, f"r{i}"))
            five = [s.url() for s in servers[:5]]
            s = interleave({
                "5 nodes": lockctl_acquire_release(five, "rl"),
                "1 node": lockctl_acquire_release(five[:1], "rl1"),
            }, args.rounds, warm)
            save_raw("redlock", s)
            a, b = statistics.median(s["5 nodes"]), statistics.median(s["1 node"])
            results["benchmarks"]["redlock"] = {k: summary(v) for k, v in s.items()}
            rows.append(("Redlock 5 nodes, acquire + release", a, "lockctl on 1 node", b, "<= 1.4"))

        if want("contention"):
            workdir = os.path.join(base, "contention")
            os.makedirs(workdir)
            tools = ["flock", "redis-py"]
            try:
                run(lockctl([main_srv.url()], "exec", "probe", "--", TRUE))
                tools.insert(0, "lockctl")
            except Failed as e:
                print(f"contention: lockctl skipped: {e}", file=sys.stderr)
            workers, sections, ms = 4, 15, 20
            walls = {t: [] for t in tools}
            gaps = {t: [] for t in tools}
            agains = {t: [] for t in tools}
            for rep in range(args.reps):
                order = list(tools)
                random.shuffle(order)
                for t in order:
                    wall, g, again = contention(t, main_srv, workdir, workers, sections, ms, rep)
                    walls[t].append(wall)
                    gaps[t].extend(g)
                    agains[t].extend(again)
            with open(os.path.join(OUT, "handoff_gaps.json"), "w") as f:
                json.dump({"handoff_ns": gaps, "same_worker_again_ns": agains}, f)
            save_raw("contention_wall", walls)
            bench = {"workers": workers, "sections": sections, "ms": ms,
                     "ideal_s": workers * sections * ms / 1000}
            for t in tools:
                gs = [g / 1e6 for g in gaps[t]]
                bench[t] = {"wall": summary(walls[t]), "handoff_ms": {
                    "p50": pct(gs, 50), "p90": pct(gs, 90), "p99": pct(gs, 99), "max": max(gs),
                    "n": len(gs)}, "same_worker_again": len(agains[t])}
            results["benchmarks"]["contention"] = bench
            if "lockctl" in tools:
                a = statistics.median(walls["lockctl"])
                rows.append(("4 x 15 x 20 ms via exec, wall", a, "flock(1)",
                             statistics.median(walls["flock"]), "<= 1.2"))
                rows.append(("4 x 15 x 20 ms via exec, wall", a, "redis-py Lock (polling)",
                             statistics.median(walls["redis-py"]), "-"))
            plot_handoff(gaps, os.path.join(PLOTS, "handoff.png"), workers, sections, ms, args.reps)

        if want("topo"):
            topo = {}
            master, sentinel = sentinel_group(base, servers)
            direct = f"redis://127.0.0.1:{master.port}"
            s = interleave({
                "sentinel": lockctl_acquire_release(
                    [f"redis+sentinel://127.0.0.1:{sentinel.port}/bench-master"], "tp-s"),
                "direct": lockctl_acquire_release([direct], "tp-d"),
                "direct, no WAIT": lockctl_acquire_release([direct + "?replicas=0"], "tp-n"),
            }, args.rounds, warm)
            save_raw("topo_sentinel", s)
            med = {k: statistics.median(v) for k, v in s.items()}
            topo["sentinel"] = {k: summary(v) for k, v in s.items()}
            rows.append(("redis+sentinel:// acquire + release", med["sentinel"],
                         "direct on the master", med["direct"], "<= 1.3"))
            rows.append(("WAIT for 1 replica, acquire + release", med["direct"],
                         "the same with ?replicas=0", med["direct, no WAIT"], "-"))
            nodes = cluster(base, servers)
            owner, other = slot_owner(nodes, "tp-c")
            s = interleave({
                "slot owner": lockctl_acquire_release([owner.url()], "tp-c"),
                "one redirect": lockctl_acquire_release([other.url()], "tp-c"),
                "standalone": lockctl_acquire_release([main_srv.url(True)], "tp-c"),
            }, args.rounds, warm)
            save_raw("topo_cluster", s)
            med = {k: statistics.median(v) for k, v in s.items()}
            topo["cluster"] = {k: summary(v) for k, v in s.items()}
            rows.append(("cluster, slot owner, acquire + release", med["slot owner"],
                         "standalone server (TCP)", med["standalone"], "<= 1.1"))
            rows.append(("cluster, one MOVED, acquire + release", med["one redirect"],
                         "standalone server (TCP)", med["standalone"], "<= 1.5"))
            results["benchmarks"]["topologies"] = topo

        if want("herd"):
            workdir = os.path.join(base, "herd")
            os.makedirs(workdir)
            run(lockctl([main_srv.url()], "exec", "probe", "--", TRUE))
            herd_res = {}
            for n in [int(x) for x in args.herd.split(",") if x]:
                walls = {"lockctl": [], "flock": []}
                cmds = []
                for rep in range(max(1, args.reps // 3)):
                    order = ["lockctl", "flock"]
                    random.shuffle(order)
                    for t in order:
                        wall, c = herd(t, main_srv, workdir, n, 20)
                        walls[t].append(wall)
                        if c is not None:
                            cmds.append(c)
                        os.unlink(os.path.join(workdir, f"herd-{t}-{n}.log"))
                a, b = statistics.median(walls["lockctl"]), statistics.median(walls["flock"])
                herd_res[str(n)] = {"lockctl_s": walls["lockctl"], "flock_s": walls["flock"],
                                    "ratio": a / b, "commands": cmds,
                                    "commands_per_section": statistics.median(cmds) / n}
                rows.append((f"herd N={n}, 1 x 20 ms each, wall", a, "flock(1)", b, "<= 1.1"))
            results["benchmarks"]["herd"] = herd_res
            plot_herd(herd_res, os.path.join(PLOTS, "herd.png"))

        if want("footprint"):
            fp = {}
            try:
                for ttl in ("30s", "3s"):
                    fp[f"lockctl exec --ttl {ttl}"] = footprint(
                        lockctl([main_srv.url()], "exec", f"fp-{ttl}", "--ttl", ttl, "--",
                                "sleep", "10"), 10, f"lockctl exec --ttl {ttl}")
            except Failed as e:
                print(f"footprint: lockctl skipped: {e}", file=sys.stderr)
            fp["flock"] = footprint(["flock", os.path.join(base, "fp.lock"), "sleep", "10"], 10,
                                    "flock")
            with open(os.path.join(OUT, "footprint.json"), "w") as f:
                json.dump(fp, f, indent=1)
            results["benchmarks"]["footprint"] = {
                k: {kk: vv for kk, vv in v.items() if kk != "samples"} for k, v in fp.items()}

        if want("list"):
            results["benchmarks"]["list"] = bench_list(base, args.list_keys)

    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(base, ignore_errors=True)

    results["machine"]["loadavg_end"] = open("/proc/loadavg").read().split()[:3]
    results["rows"] = [dict(zip(("what", "lockctl_s", "peer", "peer_s", "goal"), r[:2] + r[2:4] +
                                (r[4],)), ratio=r[1] / r[3]) for r in rows]
    with open(os.path.join(OUT, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    print_report(results)


def bench_list(base, nkeys):
    srv = Redis(base, "big", extra=["--enable-debug-command", "yes"])
    out = {"keys": nkeys}
    try:
        url = srv.url()
        held = 200
        for i in range(held):
            run(lockctl([url], "acquire", f"job-{i}", "-n", "--ttl", "10m"), capture=True)
        run(srv.cli() + ["DEBUG", "POPULATE", str(nkeys), "other"])
        # Scenario 1: a busy keyspace, few locks in it.
        scen = {}
        for label, argv in (
            ("lockctl list", lockctl([url], "list")),
            ("lockctl list --format json", lockctl([url], "list", "--format", "json")),
            ("redis-cli --scan --pattern lockctl:*",
             srv.cli() + ["--scan", "--pattern", "lockctl:*"]),
        ):
            wall, lines, rss, rc, err = run_rusage(argv)
            scen[label] = {"s": wall, "lines": lines, "maxrss_kib": rss, "exit": rc,
                           "stderr": err[:300]}
        out[f"{nkeys} other keys + {held} locks"] = scen
        # Scenario 2: every key is under the prefix, so all of them are listed (streaming).
        run(srv.cli() + ["FLUSHALL"])
        run(srv.cli() + ["DEBUG", "POPULATE", str(nkeys), "lockctl:bulk"])
        scen = {}
        for label, argv in (
            ("lockctl list", lockctl([url], "list")),
            ("redis-cli --scan --pattern lockctl:*",
             srv.cli() + ["--scan", "--pattern", "lockctl:*"]),
        ):
            wall, lines, rss, rc, err = run_rusage(argv)
            scen[label] = {"s": wall, "lines": lines, "maxrss_kib": rss, "exit": rc,
                           "stderr": err[:300]}
        out[f"{nkeys} keys under the prefix"] = scen
    finally:
        srv.stop()
    return out


def plot_handoff(gaps, path, workers, sections, ms, reps):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot", file=sys.stderr)
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = {"lockctl": "tab:blue", "flock": "tab:green", "redis-py": "tab:red"}
    tools = list(gaps)
    for t in tools:
        gs = sorted(g / 1e6 for g in gaps[t])
        ys = [(i + 1) / len(gs) for i in range(len(gs))]
        ax1.step(gs, ys, where="post", label=f"{t} ({len(gs)} handoffs)", color=colors.get(t))
    ax1.set_xscale("log")
    ax1.set_xlabel("handoff: one worker's section ends -> another's starts (ms, log)")
    ax1.set_ylabel("fraction of handoffs")
    ax1.set_title("CDF")
    ax1.grid(True, which="both", alpha=0.3)
    ax1.legend()
    x = range(len(tools))
    p50 = [pct([g / 1e6 for g in gaps[t]], 50) for t in tools]
    p99 = [pct([g / 1e6 for g in gaps[t]], 99) for t in tools]
    w = 0.38
    b1 = ax2.bar([i - w / 2 for i in x], p50, w, label="p50")
    b2 = ax2.bar([i + w / 2 for i in x], p99, w, label="p99")
    ax2.bar_label(b1, fmt="%.2f", fontsize=8)
    ax2.bar_label(b2, fmt="%.2f", fontsize=8)
    ax2.set_xticks(list(x), tools)
    ax2.set_yscale("log")
    ax2.set_ylabel("ms (log)")
    ax2.set_title("p50 and p99")
    ax2.legend()
    fig.suptitle(f"Handoff under contention: {workers} workers x {sections} sections of {ms} ms, "
                 f"{reps} runs each")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_report(results):
    m = results["machine"]
    print(f"\nmachine: {m['nproc']} x {m['cpu']}, kernel {m['kernel']}, redis {m['redis']}, "
          f"load {' '.join(m['loadavg_start'])} -> {' '.join(m['loadavg_end'])}")
    b = results["benchmarks"]
    print(f"spawn floor (harness starting /bin/true): {b['spawn_floor']['median'] * 1000:.2f} ms")
    print(f"\n{'benchmark':38} {'lockctl ms':>10}  {'peer':36} {'peer ms':>8} {'ratio':>6}  goal")
    for r in results["rows"]:
        print(f"{r['what']:38} {r['lockctl_s'] * 1000:10.2f}  {r['peer']:36} "
              f"{r['peer_s'] * 1000:8.2f} {r['ratio']:6.2f}  {r['goal']}")
    c = b.get("contention")
    if c:
        print(f"\nhandoff latency ({c['workers']} workers x {c['sections']} x {c['ms']} ms; "
              f"ideal wall {c['ideal_s']:.2f} s)")
        for t, v in c.items():
            if isinstance(v, dict):
                h = v["handoff_ms"]
                print(f"  {t:9} wall {v['wall']['median']:6.3f} s   handoff p50 {h['p50']:7.2f} ms"
                      f"   p90 {h['p90']:7.2f} ms   p99 {h['p99']:7.2f} ms   max {h['max']:7.2f} ms"
                      f"   ({h['n']} handoffs, {v['same_worker_again']} re-takes by the same"
                      " worker)")
    h = b.get("herd")
    if h:
        print("\nherd: Redis commands per critical section (INFO commandstats)")
        for n, v in h.items():
            print(f"  N={n:4}  {v['commands_per_section']:7.1f} per section  "
                  f"wall ratio {v['ratio']:.2f}")
    fp = b.get("footprint")
    if fp:
        print("\nwrapper footprint while the child sleeps 10 s")
        for k, v in fp.items():
            print(f"  {k:26} VmHWM {v['hwm_kib'] / 1024:5.2f} MiB  VmRSS {v['rss_kib_max'] / 1024:5.2f}"
                  f" MiB  threads {v['threads']}  start-up CPU {v['startup_cpu_ms']:.2f} ms  "
                  f"CPU over {v['window_s']:.1f} s: {v['window_cpu_ms']:.2f} ms "
                  f"({v['cpu_percent']:.3f} %)")
    li = b.get("list")
    if li:
        print(f"\nlist over a keyspace of {li['keys']} keys")
        for scen, vs in li.items():
            if not isinstance(vs, dict):
                continue
            print(f"  {scen}")
            for k, v in vs.items():
                extra = f"  exit {v['exit']}: {v['stderr'][:80]}" if v["exit"] else ""
                print(f"    {k:40} {v['s']:7.2f} s  {v['lines']:8} lines  peak RSS "
                      f"{v['maxrss_kib'] / 1024:6.1f} MiB{extra}")
    print(f"\nraw numbers: {OUT}/")


if __name__ == "__main__":
    try:
        main()
    except Failed as e:
        print(f"bench: {e}", file=sys.stderr)
        sys.exit(1)
