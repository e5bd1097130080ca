"""The gate: a training container's command, run by the image's interpreter ahead of the script's.

It waits for one byte on the gate (a FIFO hermetic holds open: hermetic.engines.base.Gate); end of file
first (hermetic gave up or died) ends the container with 70 (EX_SOFTWARE), nothing run. Then it runs the
script's command as its child (same arguments, environment, stdin; a process group of its own), passes
on the signals it is sent, and ends as the script ends (128+N for a signal N, as a shell says it). When
the FIFO reaches end of file while the script runs, its driver is gone (kill -9, the OOM killer, a lost
session, the end of a Slurm job): the script's process group gets SIGTERM, then SIGKILL after GRACE
seconds, and the container ends. Run as ``python -I -S -c <this file> FIFO COMMAND...``. Stdlib only.
"""

import os
import select
import signal
import sys
import time

GRACE = 5
FORWARDED = ("SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGWINCH")


def main(argv):
    fifo = os.open(argv[1], os.O_RDONLY)
    if os.read(fifo, 1) != b"g":
        return 70
    wake_r, wake_w = os.pipe()  # a signal's byte (set_wakeup_fd): SIGCHLD ends the wait below
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    pid = os.posix_spawnp(argv[2], argv[2:], os.environ, setpgroup=0)
    for name in FORWARDED:
        signal.signal(getattr(signal, name), lambda signum, _frame: _send(pid, signum))
    poller = select.poll()
    poller.register(wake_r, select.POLLIN)
    poller.register(fifo, select.POLLIN)
    gone, kill_at = False, None  # the driver; when the script's group gets SIGKILL, once it is gone
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            if gone:
                _send(-pid, signal.SIGKILL)  # what the script left of its group
            return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        timeout = None
        if kill_at is not None:
            timeout = max(0, int((kill_at - time.monotonic()) * 1000))
            if timeout == 0:
                _send(-pid, signal.SIGKILL)
                kill_at = timeout = None
        for fd, _event in poller.poll(timeout):
            if fd == wake_r:
                os.read(wake_r, 512)
            elif not os.read(fifo, 512):  # end of file: no process holds the other end
                poller.unregister(fifo)
                try:
                    os.write(2, b"hermetic: the process that drove this run is gone; stopping the script\n")
                except OSError:
                    pass
                _send(-pid, signal.SIGTERM)
                gone, kill_at = True, time.monotonic() + GRACE


def _send(pid, signum):
    try:
        os.kill(pid, signum)
    except OSError:  # gone already
        pass


if __name__ == "__main__":
    sys.exit(main(sys.argv))
