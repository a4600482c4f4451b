"""A time budget per item (``EVALQ_ITEM_TIMEOUT``, see ``evalq.shared.core.bounds``).

A metric computed in the worker's own process (the cpu metrics, a plugin) is
watched by a real-time timer (``setitimer``, one per chunk: ``_Watch``); when an
item's budget is spent, the signal handler raises ``ItemTimeout`` in the item's
code, which ``score_items`` records as that item's error, and the chunk goes on
with the next item. Signals are delivered to the main thread only, which is where
the prefork pool's children (cpu) and the solo pool (gpu) run tasks. Elsewhere the
budget is not set:

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

import _signal
import contextlib
import signal
import threading
import time
from typing import Any, Callable, Iterator

from evalq.shared.core.bounds import ITEM_TIMEOUT_ENV, item_timeout
from evalq.shared.core.errors import MetricError
from evalq.shared.metrics.registry import MetricSpec


class ItemTimeout(MetricError):
    """The item ran past its time budget."""


@contextlib.contextmanager
def bounded(spec: MetricSpec, fn: Callable[..., Any]) -> Iterator[Callable[..., Any]]:
    """``fn``, interrupted on each call after the item budget where one applies (above), for
    the ``with`` block: a chunk's items. The timer is armed once for the block, not per item."""
    seconds = item_timeout()
    if (not seconds or spec.batch or spec.calls_endpoint or not hasattr(signal, "setitimer")
            or threading.current_thread() is not threading.main_thread()):
        yield fn
        return
    watch = _Watch(seconds, f"the item took longer than {seconds:g} s, the time budget per item "
                            f"({ITEM_TIMEOUT_ENV} raises it)")
    call = watch.wrap(fn)
    previous = signal.signal(signal.SIGALRM, watch.handler)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield call
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous if previous is not None else signal.SIG_DFL)


class _Watch:
    """One timer for a run of items. It always fires no later than the running item's start plus
    the budget: armed for the budget when the run begins (every item starts later), and, when it
    fires before an item ran its budget out (or between items), armed again for what that item has
    left (or for the whole budget). So an item costs a clock read and a look at the installed
    handler rather than two ``setitimer`` calls and ``signal.getsignal`` (together 5 us: a third of
    a fast metric's time, measured), and a runaway item is still stopped when its own budget is
    spent. An item that installed a SIGALRM handler of its own finds ours back, armed, at the next
    item; one that cancels the process's real-time timer and leaves our handler in place
    (``signal.alarm(0)``) leaves the rest of its chunk unwatched (docs: known limits)."""

    def __init__(self, seconds: float, message: str):
        self.seconds, self.message = seconds, message
        self.started: float | None = None  # when the running item began (monotonic), None between items
        self.handler = self.expired  # one bound method, installed and compared by identity

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        handler = self.handler

        def call(*args: Any) -> Any:
            # the C getsignal: signal.getsignal wraps it in an enum lookup that costs four times as much
            if _signal.getsignal(signal.SIGALRM) is not handler:  # an item put its own: ours back, armed
                signal.signal(signal.SIGALRM, handler)
                signal.setitimer(signal.ITIMER_REAL, self.seconds)
            try:  # inside the try: a timeout raised at any point of the item is the item's error
                self.started = time.monotonic()
                return fn(*args)
            finally:
                self.started = None

        return call

    def expired(self, signum, frame) -> None:
        started = self.started
        left = self.seconds if started is None else started + self.seconds - time.monotonic()
        if left <= 0.001:
            signal.setitimer(signal.ITIMER_REAL, self.seconds)  # the next item's budget
            raise ItemTimeout(self.message)
        signal.setitimer(signal.ITIMER_REAL, left)
