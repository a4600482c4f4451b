"""The resampling statistics drawn with numpy are the plain Python loops they replaced: the same
``random.Random(seed)`` draws (``randrange`` and ``random() < 0.5`` read from numpy's Mersenne
Twister set to Python's state), each resample summed left to right. Compared here with those loops,
written out as they were; the values' agreement with scipy is tests/unit/test_compare.py's."""

from __future__ import annotations

import random
import sys

import pytest

from evalq.shared.scores import stats

# Python 3.12 sums floats with compensation: the loops' sums may then differ in the last bits
SAME_SUMS = sys.version_info < (3, 12)


def loop_bootstrap_mean(values, seed=stats.SEED, resamples=stats.RESAMPLES):
    n = len(values)
    if n < 2:
        return None
    rng = random.Random(seed)
    means = [sum(values[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples)]
    return stats._percentiles(means)


def loop_paired(base, new, seed=stats.SEED, resamples=stats.RESAMPLES):
    diffs = [b - a for a, b in zip(base, new)]
    n = len(diffs)
    if n == 0:
        return {"n": 0, "diff": None, "ci95": None, "p_value": None}
    mean = sum(diffs) / n
    rng = random.Random(seed)
    boots = [sum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples)] if n > 1 else [mean]
    observed = abs(mean)
    nonzero = [d for d in diffs if d != 0]
    if not nonzero:
        p = 1.0
    else:
        extreme = 0
        for _ in range(resamples):
            flipped = sum(d if rng.random() < 0.5 else -d for d in nonzero) / n
            extreme += abs(flipped) >= observed - 1e-12
        p = (extreme + 1) / (resamples + 1)
    return {"n": n, "diff": mean, "ci95": stats._percentiles(boots) if n > 1 else None, "p_value": p}


@pytest.mark.parametrize("n", [2, 3, 5, 7, 8, 100, 1000, 65537, 2**31 + 3, 2**32 - 1])
def test_randrange_draws_are_pythons(n):
    draws = stats._Draws(7)
    rng = random.Random(7)
    got = draws.below(n, 3000).tolist()
    assert got == [rng.randrange(n) for _ in range(3000)]
    # and the stream goes on where Python's does, in pieces of any size
    assert draws.below(n, 1).tolist() + draws.below(n, 999).tolist() == [rng.randrange(n) for _ in range(1000)]


def test_coin_draws_are_pythons_and_follow_the_index_draws():
    draws, rng = stats._Draws(stats.SEED), random.Random(stats.SEED)
    assert draws.below(11, 500).tolist() == [rng.randrange(11) for _ in range(500)]
    assert draws.heads(4000).tolist() == [rng.random() < 0.5 for _ in range(4000)]
    assert draws.below(3, 10).tolist() == [rng.randrange(3) for _ in range(10)]


def close(a, b):
    if SAME_SUMS:
        return a == b
    return a == pytest.approx(b, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("n, seed", [(2, 1), (3, 2), (50, 3), (257, 4)])
def test_paired_and_bootstrap_are_the_loops(n, seed):
    rng = random.Random(seed)
    base = [rng.random() for _ in range(n)]
    new = [b + rng.gauss(0.01, 0.05) for b in base]
    new[0] = base[0]  # a zero difference: left out of the sign flips
    got, want = stats.paired(base, new), loop_paired(base, new)
    assert got["n"] == want["n"] and got["diff"] == want["diff"]
    assert got["p_value"] == want["p_value"]
    assert close(got["ci95"], want["ci95"])
    assert close(stats.bootstrap_mean(new), loop_bootstrap_mean(new))


def test_small_blocks_give_the_same_numbers(monkeypatch):
    rng = random.Random(5)
    base = [rng.random() for _ in range(40)]
    new = [b + rng.gauss(0, 0.1) for b in base]
    whole = stats.paired(base, new, resamples=300)
    monkeypatch.setattr(stats, "_BLOCK", 90)  # two resamples a block, and one sign-flip row
    assert stats.paired(base, new, resamples=300) == whole
    assert whole == loop_paired(base, new, resamples=300) or not SAME_SUMS


def test_edges():
    assert stats.paired([], []) == loop_paired([], [])
    assert stats.paired([1.0], [1.5]) == loop_paired([1.0], [1.5])
    assert stats.paired([1.0, 2.0], [1.0, 2.0]) == loop_paired([1.0, 2.0], [1.0, 2.0])  # no difference: p 1
    assert stats.bootstrap_mean([3.0]) is None
