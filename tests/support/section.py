# One critical section of tests/nemesis.rs, run by `lockctl exec` with the lock held.
#
# It does what a job under a lock does, in the way that shows when the lock failed:
#   - a read-modify-write of a counter that is not atomic (read, sleep HOLD_MS, write back plus one):
#     two sections at once lose an update. The counter file also names the section that wrote it
#     last (its version), so the checker can tell whose update was lost and who overwrote it;
#   - a fenced write into SQLite, `UPDATE ... WHERE fence < $LOCKCTL_FENCE`: a store that checks
#     fencing tokens refuses a holder whose fence is not the largest it has seen.
# It appends its start to the history only once it runs, and its end just before it exits, both on
# CLOCK_MONOTONIC (the test reads the same clock). A SIGTERM (lockctl lost the lease) ends it at once,
# after recording how far it got; a SIGKILL leaves no end record, and the checker then takes the
# moment the process was seen gone.
import os
import signal
import time


def mono():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


d = os.environ["DIR"]
exec_id = os.environ["EXEC"]
worker = os.environ["W"]
fence = int(os.environ["LOCKCTL_FENCE"])
hold = int(os.environ["HOLD_MS"]) / 1000.0
pid = os.getpid()
# What the section has done so far: the counter version it read, when it wrote the counter (taken
# just before the write, so a write cut short by SIGTERM is still counted as possibly made), and
# whether the store accepted its fence.
done = {"read": "-", "wrote": "-", "store": "-"}


def record(line):
    fd = os.open(os.path.join(d, "history"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def finish(how):
    record("E %s %s %d %d %d %s %s %s %s" % (
        exec_id, worker, fence, pid, mono(), how, done["read"], done["wrote"], done["store"]))


def on_term(signum, frame):
    finish("term")
    os._exit(128 + signum)


with open(os.path.join(d, "run", exec_id), "w") as f:
    f.write(str(pid))
record("S %s %s %d %d %d" % (exec_id, worker, fence, pid, mono()))
signal.signal(signal.SIGTERM, on_term)

counter = os.path.join(d, "counter")
with open(counter) as f:
    value, version = f.read().split()
done["read"] = version
time.sleep(hold)
tmp = "%s.%d" % (counter, pid)
with open(tmp, "w") as f:
    f.write("%d %s\n" % (int(value) + 1, exec_id))
done["wrote"] = str(mono())
os.replace(tmp, counter)

import sqlite3  # noqa: E402 (after the counter, to keep the section's start prompt)

db = sqlite3.connect(os.path.join(d, "store.db"), timeout=60, isolation_level=None)
db.execute("BEGIN IMMEDIATE")
cur = db.execute("UPDATE store SET fence = ?, writer = ? WHERE id = 1 AND fence < ?",
                 (fence, exec_id, fence))
accepted = cur.rowcount == 1
if accepted:
    db.execute("INSERT INTO accepted(fence, writer) VALUES (?, ?)", (fence, exec_id))
db.execute("COMMIT")
db.close()
done["store"] = "1" if accepted else "0"
finish("end")
