"""Test-only metrics, loaded through EVALQ_PLUGINS by the test workers.

They exercise the real plugin path; what they compute is deliberately trivial:
- ``fail_on``: raises for instances whose actual-output contains "FAIL".
- ``slow_len``: sleeps, then returns the answer's length (mid-job kills land
  while tasks are running; ``started`` names a file that shows they are, and
  ``gate`` one each item waits for before it sleeps: a test holds the job open
  at a known point, however fast or slow the machine).
- ``hang_on``: sleeps ``seconds`` on instances whose actual-output contains
  "HANG" (a metric that runs away on some items), else scores 1.
- ``stubborn``: asks to be deferred ``defers`` times, then hits ``blips``
  Redis errors, then scores the number of calls (counted in a file: the worker's
  processes share nothing else).
"""

from __future__ import annotations

import time
from pathlib import Path

from pydantic import Field

from evalq.shared.metrics.params import Params
from evalq.shared.metrics.registry import REGISTRY, MetricSpec


class SlowParams(Params):
    seconds: float = Field(default=0.05)
    started: str | None = Field(default=None, description="a file each item appends to as it starts: a test "
                                "sees work under way")
    gate: str | None = Field(default=None, description="a file each item waits for (after `started`): a test "
                             "holds the job open until it creates it")


class StubbornParams(Params):
    counter: str
    defers: int = 0
    blips: int = 0


def stubborn(instance: dict, params: StubbornParams) -> int:
    import redis

    from evalq.shared.core.errors import Deferred

    path = Path(params.counter)
    calls = int(path.read_text() or 0) + 1 if path.exists() else 1
    path.write_text(str(calls))
    if calls <= params.defers:
        raise Deferred(0.05, reason="test deferral")
    if calls <= params.defers + params.blips:
        raise redis.ConnectionError("test blip")
    return calls


def fail_on(instance: dict, params) -> float:
    if "FAIL" in instance["actual-output"]:
        raise ValueError(f"cannot score {instance['id']!r}")
    return 1.0


def slow_len(instance: dict, params: SlowParams) -> int:
    if params.started:
        with open(params.started, "a") as f:
            f.write(f"{instance['id']}\n")
    if params.gate:
        while not Path(params.gate).exists():
            time.sleep(0.01)
    time.sleep(params.seconds)
    return len(instance["actual-output"])


def hang_on(instance: dict, params: SlowParams) -> float:
    if "HANG" in instance["actual-output"]:
        time.sleep(params.seconds)
    return 1.0


def spread(instance: dict, params) -> dict:
    # a cpu-queue metric aggregated as a distribution (bertscore's aggregation), for its parts
    words = instance["actual-output"].split()
    return {"chars": len(instance["actual-output"]) / 7, "per_word": [len(w) / 3 for w in words[:3]]}


if "fail_on" not in REGISTRY:
    from evalq.shared.metrics.params import NoParams

    REGISTRY.register(MetricSpec(id="fail_on", params=NoParams, impl="tests.plugins.faulty:fail_on",
                                 queue="cpu", description="test: fails on 'FAIL'"))
    REGISTRY.register(MetricSpec(id="stubborn", params=StubbornParams, impl="tests.plugins.faulty:stubborn",
                                 queue="cpu", chunk_size=1, description="test: deferred, then Redis blips"))
    REGISTRY.register(MetricSpec(id="slow_len", params=SlowParams, impl="tests.plugins.faulty:slow_len",
                                 queue="cpu", chunk_size=2, description="test: slow length"))
    REGISTRY.register(MetricSpec(id="hang_on", params=SlowParams, impl="tests.plugins.faulty:hang_on",
                                 queue="cpu", description="test: sleeps on 'HANG'"))
    REGISTRY.register(MetricSpec(id="spread", params=NoParams, impl="tests.plugins.faulty:spread", queue="cpu",
                                 aggregation="distribution", description="test: a distribution of lengths"))
