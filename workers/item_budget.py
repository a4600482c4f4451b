"""A time budget per item (``EVALQ_ITEM_TIMEOUT``, see ``evalq.shared.core.bounds``).

A metric computed in the worker's own process (the cpu metrics, a plugin) gets
a real-time timer (``setitimer``) per item; when it fires, the signal handler
raises ``ItemTimeout`` in the item's code, which ``score_items`` records as that
item's error, and the chunk goes on with the next item. Signals are delivered
to the main thread only, which is where the prefork pool's children (cpu) and
the solo pool (gpu) run tasks. Elsewhere the budget is not set:

- in a thread that is not the main one (a threads pool: judge and generate
  workers), where no signal can interrupt it;
- for metrics that call a model (judges, the model under test): their calls are
  bounded by the endpoint's ``timeout`` and ``max_retries``, and an interrupt in
  the middle of a call could leave a budget reservation or a claim half made;
- for batch metrics (bertscore), which score a chunk in one call.

Python runs a signal handler between bytecodes, so code stuck inside one long C
call (a single huge regular expression, say) is interrupted when that call returns.
"""

from __future__ import annotations

import signal
import threading
from typing import Any, Callable

from evalq.shared.core.bounds import ITEM_TIMEOUT_ENV, item_timeout
from evalq.shared.core.errors import MetricError
from evalq.shared.metrics.registry import MetricSpec


class ItemTimeout(MetricError):
    """The item ran past its time budget."""


def bounded(spec: MetricSpec, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, interrupted on each call after the item budget, where one applies (above)."""
    seconds = item_timeout()
    if (not seconds or spec.batch or spec.calls_endpoint or not hasattr(signal, "setitimer")
            or threading.current_thread() is not threading.main_thread()):
        return fn
    message = (f"the item took longer than {seconds:g} s, the time budget per item "
               f"({ITEM_TIMEOUT_ENV} raises it)")

    def call(*args: Any) -> Any:
        # The handler stays installed between items (installing it costs more than a 0.02 ms
        # metric: two signal.signal calls were a third of a fast metric's chunk path); another
        # code's own handler is put back after the item, the default one is not.
        previous = signal.getsignal(signal.SIGALRM)
        if previous is not _expired:
            signal.signal(signal.SIGALRM, _expired)
        _BUDGET[0] = message
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            return fn(*args)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            if callable(previous) and previous is not _expired:
                signal.signal(signal.SIGALRM, previous)

    return call


_BUDGET = [""]  # what the running item's timeout says


def _expired(signum, frame):
    raise ItemTimeout(_BUDGET[0])
