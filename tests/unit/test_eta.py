"""The time a job has left is its slowest stage's (issue 74): each stage's items left over its own
recent rate; no estimate while a stage with items left has not moved."""

from __future__ import annotations

import pytest

from evalq.orchestrator.eta import Eta, at_once, slowest


def test_the_slowest_stage_sets_the_time_left():
    # the cpu stage is done; the judge has 900 items left at 30 a second: 30 s, not the pooled few seconds
    assert slowest({"cpu": (2000, 2000, 500.0), "judge.lab": (100, 1000, 30.0)}) == (30.0, "judge.lab")
    assert slowest({"cpu": (10, 2000, 500.0), "judge.lab": (100, 1000, 30.0)}) == (30.0, "judge.lab")
    assert slowest({"cpu": (10, 20, 0.0), "judge.lab": (100, 1000, 30.0)}) == (None, None)  # not moved yet
    assert slowest({"cpu": (20, 20, 0.0)}) == (None, None)  # nothing left
    assert at_once({"cpu": (100, 100), "judge.lab": (50, 150)}, 10.0) == (20.0, "judge.lab")


def test_a_stage_is_measured_from_just_before_it_moved_over_its_recent_window():
    now = [0.0]
    eta = Eta(clock=lambda: now[0])
    assert eta.update({"gen": (0, 100), "cpu": (0, 100)}) == (None, None)
    now[0] = 60.0  # the metrics wait for the generation stage: a minute of nothing is not their rate
    assert eta.update({"gen": (50, 100), "cpu": (0, 100)}) == (None, None)
    now[0] = 70.0
    eta.update({"gen": (100, 100), "cpu": (20, 100)})
    now[0] = 80.0
    assert eta.update({"gen": (100, 100), "cpu": (40, 100)}) == (pytest.approx(30.0), "cpu")  # 2 a second
    now[0] = 130.0  # then it slowed down: 10 items in 50 s
    left, stage = eta.update({"gen": (100, 100), "cpu": (50, 100)})
    # its rate over its recent window (at least half its run: the looks from t=80 on), 0.2 a second:
    # 250 s for the 50 left, not the 0.71 a second since it moved
    assert (left, stage) == (pytest.approx(250.0), "cpu")
