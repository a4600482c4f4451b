"""The evalq command's own SIGINT/SIGTERM handling (``evalq.cli.interrupt``), in a process of its own."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

CHILD = """
import multiprocessing, os, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a script's background job inherits it
from evalq.cli import interrupt
interrupt.install()
assert signal.getsignal(signal.SIGINT) is interrupt._handler, "SIGINT taken although inherited ignored"
def work(_):
    time.sleep(30)
if __name__ == "__main__":
    pid = os.fork()
    if pid == 0:  # a forked child (a pool worker) has what the process had before
        ok = signal.getsignal(signal.SIGINT) == signal.SIG_IGN and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        os._exit(0 if ok else 3)
    assert os.waitpid(pid, 0)[1] == 0, "the forked child kept evalq's handlers"
    with multiprocessing.get_context("fork").Pool(2) as pool:  # ended with SIGTERM: quietly
        pool.map_async(work, [1, 2])
        time.sleep(0.5)
        pool.terminate()
    print("ok")
"""


def test_signals_are_the_commands_own_and_not_its_forked_childrens(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok" and "Traceback" not in proc.stderr, proc.stderr
