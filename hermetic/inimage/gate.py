"""The gate: a training container's command, run by the image's interpreter ahead of the script's.

It waits for one byte on the gate (a FIFO hermetic holds open: hermetic.engines.base.Gate); end of file
first (hermetic gave up or died) ends the container with 70 (EX_SOFTWARE), nothing run. Then it becomes the
script's command (exec: same process, arguments, environment). Run as ``python -I -S -c <this file>
FIFO COMMAND...``: nothing of the image's site-packages or of the run's environment is read first.
Stdlib only.
"""

import os
import sys


def main(argv):
    fifo = os.open(argv[1], os.O_RDONLY)
    if os.read(fifo, 1) != b"g":
        return 70
    os.close(fifo)
    os.execvp(argv[2], argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
