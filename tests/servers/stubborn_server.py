"""A stdio "server" that will not stop: it starts a grandchild (and prints its pid to stderr,
which the gateway logs), ignores the end of stdin and SIGTERM, and answers nothing. For the test
that the gateway's shutdown signals reach the child's whole process group."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

GRANDCHILD = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"


def main() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    grandchild = subprocess.Popen([sys.executable, "-c", GRANDCHILD])
    print(f"grandchild {grandchild.pid}", file=sys.stderr, flush=True)
    while True:
        time.sleep(120)  # stdin closed or not: it stays


if __name__ == "__main__":
    main()
