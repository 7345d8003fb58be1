#!/usr/bin/env python3
"""Where one invocation of lockctl spends its effort: syscalls (strace), round trips to Redis, and
user-space instructions (valgrind's callgrind, which counts instructions and so does not depend on the
machine's speed or load). Run through `bench/run --profile`; files go to bench/out/profile/.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ beside the sources
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import ENV, LOCKCTL, OUT, TRUE, Redis, lockctl, run  # noqa: E402

DIR = os.path.join(OUT, "profile")


def strace(label, argv):
    """Syscall counts of one run, all threads, and the requests written to Redis sockets."""
    log = os.path.join(DIR, f"{label}.strace")
    subprocess.run(["strace", "-f", "-tt", "-o", log, *argv], env=ENV, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=False)
    text = open(log).read()
    # One line per call; the "<... NAME resumed>" halves of interrupted lines are not counted again.
    calls = re.findall(r"^\d+\s+[\d:.]+\s+(\w+)\(", text, re.M)
    requests = len(re.findall(r"(?:sendto|write)\(\d+, \"\*\d+\\r\\n", text))
    connects = len(re.findall(r"\bconnect\(\d+, \{sa_family=AF_(?:UNIX|INET)", text))
    threads = len(re.findall(r"\bclone3?\(", text))
    return {"syscalls": len(calls), "requests": requests, "connects": connects, "threads": threads}


def callgrind(label, argv):
    """Instructions executed by the lockctl process itself (children not followed)."""
    out = os.path.join(DIR, f"{label}.callgrind")
    p = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *argv],
                       env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    m = re.search(r"Collected : (\d+)", p.stderr)
    return int(m.group(1)) if m else None


def main():
    shutil.rmtree(DIR, ignore_errors=True)
    os.makedirs(DIR)
    base = tempfile.mkdtemp(prefix="lockctl-prof-", dir="/tmp")
    servers = []
    try:
        for i in range(5):
            servers.append(Redis(base, f"p{i}"))
        one = [servers[0].url()]
        five = [s.url() for s in servers]
        # A token that holds nothing: release and renew do their full work and answer 76.
        tok = "0" * 32
        cases = [
            ("version", [LOCKCTL, "--version"]),
            ("acquire", lockctl(one, "acquire", "prof-a", "-n")),
            ("release", lockctl(one, "release", "prof-r", "--token", tok)),
            ("exec-true", lockctl(one, "exec", "prof-e", "--", TRUE)),
            ("acquire-5-nodes", lockctl(five, "acquire", "prof-a5", "-n")),
            ("release-5-nodes", lockctl(five, "release", "prof-r5", "--token", tok)),
        ]
        print(f"{'invocation':18} {'syscalls':>8} {'requests':>8} {'connects':>8} {'clones':>7}"
              f" {'instructions':>13}")
        flush = lambda: [run(srv.cli() + ["FLUSHALL"]) for srv in servers]  # noqa: E731
        for label, argv in cases:
            # Once first, so that the servers have the scripts cached as in steady state.
            subprocess.run(argv, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            flush()
            s = strace(label, argv)
            flush()
            ins = callgrind(label, argv)
            flush()
            print(f"{label:18} {s['syscalls']:8} {s['requests']:8} {s['connects']:8} "
                  f"{s['threads']:7} {ins if ins is not None else '?':>13}")
        print(f"\nstrace logs and callgrind profiles: {DIR}/ "
              "(callgrind_annotate FILE for a breakdown)")
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
