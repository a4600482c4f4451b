"""The three kinds of failure evalq distinguishes.

- ``JobError``: the user's input is wrong. Never retried; the CLI prints the
  messages and exits 2.
- ``InfraError``: something around the job failed (broker unreachable, workers
  lost). The CLI prints one line and exits 1.
- ``MetricError``: one item could not be scored. Recorded on that item as data;
  the job goes on.
"""

from __future__ import annotations


class EvalqError(Exception):
    """Base class for errors the CLI reports without a traceback."""


class JobError(EvalqError):
    """Invalid job input. Carries every problem found, each naming its place."""

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


class InfraError(EvalqError):
    """Broker, worker or storage failure: a one-line reason."""


class MetricError(Exception):
    """A metric could not score one item (bad item content, not a bug in evalq)."""


class Deferred(Exception):
    """Work cannot proceed now (a judge budget is spent for a while): the task
    re-schedules itself after ``wait`` seconds, on the queue of deployment
    ``region`` when given (the region with the shortest wait). ``own``: what holds it back is
    the job's own or its tenant's (its share of a deployment, its own lower limit, its caps), not
    the deployment: the chunk gives its slot on the queue to other jobs while it waits
    (``evalq.orchestrator.holding``) instead of keeping it."""

    def __init__(self, wait: float, region: str | None = None, reason: str = "", own: bool = False):
        self.wait = wait
        self.region = region
        self.own = own
        super().__init__(reason or f"deferred {wait:.1f} s")


class Pending(Exception):
    """A judge call waits for a provider batch (``judging.mode`` batch or auto): the item is
    scored again once its replies are back; ``digests`` name the calls (their requests' sha256)."""

    def __init__(self, *digests: str):
        self.digests = list(digests)
        super().__init__(f"waiting for {len(self.digests)} batch repl{'y' if len(self.digests) == 1 else 'ies'}")


class Skipped(Exception):
    """An item deliberately not run (e.g. the job's token cap was reached):
    recorded as skipped, not as an error and not lost."""


class NotApplicable(Exception):
    """The metric has nothing to score in this item (``tool_call_accuracy`` on a run that called no
    tool): recorded as not applicable, saying why, and counted apart (``n_not_applicable``), out of
    the score and of the error rate."""


def kind(value: object) -> str:
    """A JSON value's type in words, for messages: 'an object', 'a list', ..."""
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)
