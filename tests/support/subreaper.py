"""Runs a program as the child subreaper of what it leaves behind, and says what that was.

A process still running when its parent exits is adopted by the nearest ancestor marked with
PR_SET_CHILD_SUBREAPER, not by init. This script is that ancestor for PROGRAM (a test's
`lockctl`): whatever PROGRAM had not reaped when it exited is reaped here, and named. It is a
process of its own so that the test process, which runs other tests beside, adopts nothing.

Usage: python3 subreaper.py BOUND_SECS PROGRAM ARGS...

PROGRAM runs with stdin and stderr inherited and stdout on /dev/null. On stdout, once no
descendant is left: `exit CODE` or `signal N` for PROGRAM, `orphan PID COMM` for every other
process reaped here (COMM read from the zombie before it is reaped), and `bound` if PROGRAM was
still running after BOUND_SECS and was killed (SIGKILL) then.
"""

import ctypes
import os
import signal
import sys

PR_SET_CHILD_SUBREAPER = 36


def main():
    bound, argv = int(sys.argv[1]), sys.argv[2:]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.execvp(argv[0], argv)
        finally:
            os._exit(127)

    lines = []

    def at_bound(_signum, _frame):
        lines.append("bound")
        os.kill(pid, signal.SIGKILL)

    signal.signal(signal.SIGALRM, at_bound)
    signal.alarm(bound)
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:
            break
        if info.si_pid == pid:
            signal.alarm(0)
            if info.si_code == os.CLD_EXITED:
                lines.append(f"exit {info.si_status}")
            else:
                lines.append(f"signal {info.si_status}")
        else:
            with open(f"/proc/{info.si_pid}/stat") as f:
                stat = f.read()
            comm = stat[stat.index("(") + 1 : stat.rindex(")")]
            lines.append(f"orphan {info.si_pid} {comm}")
        os.waitpid(info.si_pid, 0)
    print("\n".join(lines), flush=True)


main()
