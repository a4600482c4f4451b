"""A worker loads what ``EVALQ_PRELOAD`` names (``evalq.shared.job.preload``) as it starts, in a
thread beside Celery's own start, so that its first chunk finds the model loaded.

A chunk that arrives first waits for the load rather than loading a second copy (the model
caches load under a lock and keep what was loaded). A load that fails is logged and left to the
chunks, which load it themselves and record the failure on their items as they would anyway.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from evalq.shared.core.errors import JobError
from evalq.shared.job.preload import ENV, parse

log = logging.getLogger("evalq.worker")

_threads: list[threading.Thread] = []


def start(kinds: set[str], text: str | None = None) -> threading.Thread | None:
    """Load, in a thread, the entries of the setting (``text``, else the environment's) whose
    queue kind is among ``kinds``; None when there is nothing to load."""
    text = os.environ.get(ENV, "") if text is None else text
    try:
        wanted = [(spec, params) for spec, params in parse(text) if spec.kind(params) in kinds]
    except JobError as exc:  # `evalq worker` refuses a bad setting before Celery starts
        log.error("%s is not used: %s", ENV, exc)
        return None
    if not wanted:
        return None

    def load() -> None:
        for spec, params in wanted:
            t0 = time.perf_counter()
            try:
                what = spec.load_warm()(params)
            except Exception as exc:  # noqa: BLE001 - the chunks load it again and say why on their items
                log.warning("preloading %s failed, its chunks will load it: %s: %s", spec.id,
                            type(exc).__name__, exc)
            else:
                log.info("preloaded %s: %s in %.1f s", spec.id, what, time.perf_counter() - t0)

    thread = threading.Thread(target=load, name="evalq-preload", daemon=True)
    thread.start()
    _threads.append(thread)
    return thread
