"""Where a process's threads spend their time, sampled: with ``EVALQ_SAMPLE_DIR`` set, a daemon
thread writes every ``EVALQ_SAMPLE_S`` seconds (default 0.01) each other thread's stack to
``$EVALQ_SAMPLE_DIR/<pid>.jsonl`` (one line per sample: time, thread name, frames outermost
first as ``file:function``). measure.py's profile phase puts this folder first on the embedded
workers' PYTHONPATH, so Python imports it as each worker starts, and calls ``start`` for its own
process; nothing here runs without the variable. A sample costs the sampled threads a GIL switch:
a profiled run is a separate run, never a timed one."""

from __future__ import annotations

import json
import os
import sys
import threading
import time


def _frames(frame) -> list[str]:
    out = []
    while frame is not None:
        code = frame.f_code
        out.append(f"{code.co_filename}:{code.co_name}")
        frame = frame.f_back
    return out[::-1]


def start(directory: str, interval: float | None = None) -> None:
    interval = interval or float(os.environ.get("EVALQ_SAMPLE_S") or 0.01)
    os.makedirs(directory, exist_ok=True)
    out = open(os.path.join(directory, f"{os.getpid()}.jsonl"), "a", buffering=1 << 16)
    out.write(json.dumps({"pid": os.getpid(), "argv": sys.argv, "t": time.time(), "interval": interval}) + "\n")

    def run() -> None:
        me = threading.get_ident()
        while True:
            time.sleep(interval)
            try:
                names = {t.ident: t.name for t in threading.enumerate()}
                now = time.time()
                for ident, frame in sys._current_frames().items():
                    if ident != me:
                        out.write(json.dumps({"t": now, "th": names.get(ident, str(ident)), "s": _frames(frame)})
                                  + "\n")
                out.flush()
            except Exception:  # noqa: BLE001 - a sampler never takes its process down
                pass

    threading.Thread(target=run, name="evalq-sampler", daemon=True).start()


if os.environ.get("EVALQ_SAMPLE_DIR"):
    start(os.environ["EVALQ_SAMPLE_DIR"])
