"""What the entries of one chunk share of an instance: a value computed from it once.

A chunk that scores several entries on the same instances (``evalq.shared.cluster.spec``: entries
scored together) runs them inside ``shared_reading()``; a helper marked ``per_instance`` (an agent
run's calls parsed from its messages, say) then computes its value once per instance for all of
them, and every entry reads the same one, which it must not change. Outside such a block the
helper computes it each time, as a plain function: a metric called on its own behaves the same.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from functools import wraps
from typing import Any, Callable, Iterator, TypeVar

T = TypeVar("T")

_memo: ContextVar[dict | None] = ContextVar("evalq_instance_memo", default=None)


@contextmanager
def shared_reading() -> Iterator[None]:
    """Within the block, ``per_instance`` helpers compute once per instance (the memo goes with it)."""
    token = _memo.set({})
    try:
        yield
    finally:
        _memo.reset(token)


def per_instance(fn: Callable[[dict], T]) -> Callable[[dict], T]:
    """``fn(instance)``, computed once per instance object inside ``shared_reading()``."""
    @wraps(fn)
    def once(instance: dict) -> T:
        memo = _memo.get()
        if memo is None:
            return fn(instance)
        key = (fn, id(instance))
        hit: Any = memo.get(key)
        if hit is None or hit[0] is not instance:  # the instance is held: its id is not reused
            hit = memo[key] = (instance, fn(instance))
        return hit[1]
    return once
