"""Test-only metrics, loaded through EVALQ_PLUGINS by the test workers.

They exercise the real plugin path; what they compute is deliberately trivial:
- ``fail_on``: raises for instances whose actual-output contains "FAIL".
- ``slow_len``: sleeps, then returns the answer's length (mid-job kills land
  while tasks are running).
"""

from __future__ import annotations

import time

from pydantic import Field

from shared.params import Params
from shared.registry import REGISTRY, MetricSpec


class SlowParams(Params):
    seconds: float = Field(default=0.05)


def fail_on(instance: dict, params) -> float:
    if "FAIL" in instance["actual-output"]:
        raise ValueError(f"cannot score {instance['id']!r}")
    return 1.0


def slow_len(instance: dict, params: SlowParams) -> int:
    time.sleep(params.seconds)
    return len(instance["actual-output"])


if "fail_on" not in REGISTRY:
    from shared.params import NoParams

    REGISTRY.register(MetricSpec(id="fail_on", params=NoParams, impl="tests.plugins.faulty:fail_on",
                                 queue="cpu", description="test: fails on 'FAIL'"))
    REGISTRY.register(MetricSpec(id="slow_len", params=SlowParams, impl="tests.plugins.faulty:slow_len",
                                 queue="cpu", chunk_size=2, description="test: slow length"))
