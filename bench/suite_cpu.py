"""Where a command's CPU goes, by kind of process: ``python bench/suite_cpu.py [--every S] -- make test``.

Runs the command and samples /proc every ``--every`` seconds (0.3 by default) until it ends; each
process seen is labelled by its command line (an evalq worker by the queue kinds it consumes, an
`evalq` command by its subcommand, pytest-xdist's processes, Redis, the reference environments, ...)
and charged its last-seen user and system CPU. It prints the seconds and processes per label, most
first, and the command's exit status. A process that lives less than one interval may be missed,
and one sampled last before its final burst is under-counted: the table is for finding what to cut
(docs/how-to/development.md has what it found for `make test`), not for accounting. Linux only.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import time

HZ = os.sysconf("SC_CLK_TCK")


def label(cmd: list[str]) -> str:
    line = " ".join(cmd)
    if "evalq.cli" in cmd or (cmd and cmd[0].endswith("/evalq")) or (len(cmd) > 1 and cmd[1].endswith("/evalq")):
        at = cmd.index("evalq.cli") + 1 if "evalq.cli" in cmd else next(
            i + 1 for i, c in enumerate(cmd) if c.endswith("/evalq"))
        sub = cmd[at] if at < len(cmd) else "?"
        if sub == "worker":
            queues = cmd[cmd.index("--queues") + 1] if "--queues" in cmd else "?"
            return "evalq worker [" + ",".join(sorted({q.split(".")[0] for q in queues.split(",")})) + "]"
        return f"evalq {sub}"
    for needle, name in (("xdist", "pytest (in-process tests)"), ("import sys;exec(eval(", "pytest (in-process tests)"),
                         ("pytest", "pytest"), ("redis-server", "redis-server"), ("llama_cpp", "llama.cpp server"),
                         ("moto", "moto (S3)"), (".venv-fmeval", "fmeval reference"),
                         (".venv-ragas", "ragas reference"), (".venv-azure", "azure reference"),
                         ("flower", "flower"), ("mkdocs", "mkdocs"), ("postgres", "postgresql")):
        if needle in line:
            return name
    if cmd and "node" in os.path.basename(cmd[0]):
        return "node"
    if cmd and "python" in os.path.basename(cmd[0]):
        return "python " + " ".join(cmd[1:3])[:50]
    return os.path.basename(cmd[0]) if cmd else "?"


def sample(seen: dict) -> None:
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            key = (int(entry), fields[19])  # pid and start time: a reused pid is another process
            cpu = (int(fields[11]) + int(fields[12])) / HZ
            if key not in seen:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmd = [part.decode(errors="replace") for part in f.read().split(b"\0") if part]
                if not cmd:
                    continue
                seen[key] = [label(cmd), cpu]
            else:
                seen[key][1] = cpu
        except (OSError, IndexError, ValueError):
            continue


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--every", type=float, default=0.3, help="seconds between samples")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    running: dict = {}
    sample(running)  # what runs before the command (this machine's services) is not its CPU
    seen: dict = {}
    started = time.monotonic()
    proc = subprocess.Popen(command)
    while proc.poll() is None:
        sample(seen)
        time.sleep(args.every)
    wall = time.monotonic() - started
    total: collections.Counter = collections.Counter()
    count: collections.Counter = collections.Counter()
    for key, (name, cpu) in seen.items():
        if key in running:
            cpu -= running[key][1]
        total[name] += cpu
        count[name] += 1
    print(f"\n{command!r}: exit {proc.returncode}, {wall:.0f} s wall, {sum(total.values()):.0f} CPU-s sampled")
    print(f"{'CPU-s':>8} {'procs':>6}  kind")
    for name, cpu in total.most_common():
        if cpu < 0.05:
            break
        print(f"{cpu:8.1f} {count[name]:6d}  {name}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
