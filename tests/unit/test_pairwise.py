"""Issue 61: pairwise comparison. How an item's two verdicts become its outcome (a disagreement is
a tie, never the first seat's win), how the aggregate counts the judge's seat, flip and length
figures (merged from parts as counted directly), and judge-sim's biases against their truth."""

from __future__ import annotations

import hashlib
import random

import pytest

import evalq.shared.job.catalogue  # noqa: F401  (registers the metrics)
from evalq.shared.scores.aggregate import aggregator_for, chunk_part, merge_parts
from evalq.shared.scores.results import read
from evalq.sim.pairwise import Biases, truth, winner
from evalq.workers.pairwise.compare import BASELINE, CANDIDATE, TIE, messages, outcome


def verdicts(*pairs):
    return [{"first": first, "winner": won, "reason": "r"} for first, won in pairs]


def test_two_verdicts_make_a_win_a_loss_or_a_tie_and_a_disagreement_is_a_tie():
    win = outcome(verdicts((CANDIDATE, CANDIDATE), (BASELINE, CANDIDATE)), "tie", 10, 10)
    assert (win["outcome"], win["score"], win["flipped"], win["first_seat_wins"], win["decided"]) == ("win", 1.0, 0, 1, 2)
    # the judge picked the first seat both times: the candidate, then the baseline: a tie, flipped
    seat = verdicts((CANDIDATE, CANDIDATE), (BASELINE, BASELINE))
    tied = outcome(seat, "tie", 10, 10)
    assert (tied["outcome"], tied["score"], tied["flipped"], tied["first_seat_wins"]) == ("tie", 0.5, 1, 2)
    assert outcome(seat, "first", 10, 10)["outcome"] == "win"
    assert outcome(seat, "baseline", 10, 10)["outcome"] == "loss"
    # lengths: the candidate is longer; one verdict for it, one tie
    mixed = outcome(verdicts((CANDIDATE, CANDIDATE), (BASELINE, TIE)), "tie", 30, 10)
    assert (mixed["outcome"], mixed["decided"], mixed["longer_decided"], mixed["longer_wins"]) == ("tie", 1, 1, 1)
    once = outcome(verdicts((CANDIDATE, BASELINE)), "tie", 10, 10)
    assert once["outcome"] == "loss" and "flipped" not in once  # asked once: no flip to count


def test_the_aggregate_merged_from_parts_counts_as_directly():
    rng = random.Random(4)
    records = []
    for i in range(400):
        first_wins = [rng.random() < 0.7, rng.random() < 0.7]
        pairs = [(CANDIDATE, CANDIDATE if first_wins[0] else BASELINE),
                 (BASELINE, BASELINE if first_wins[1] else CANDIDATE)]
        lengths = (20, 10) if i % 2 else (10, 10)
        records.append({"instance_id": f"p{i}", "result": outcome(verdicts(*pairs), "tie", *lengths)})
    records.append({"instance_id": "bad", "error": "judge reply does not fit"})
    parts = [chunk_part("pairwise", {}, records[k:k + 4]) for k in range(0, len(records), 4)]
    merged, _, covered = merge_parts("pairwise", {}, parts)
    direct = aggregator_for("pairwise", {})
    for r in records:
        direct.add(r)
    got = merged.score()
    assert covered == 401 and merged.n_errors == 1 and got == direct.score()
    results = [r["result"] for r in records if "result" in r]
    wins = sum(r["win"] for r in results)
    assert got["win_rate"] == pytest.approx(wins / 400) and got["wins"] == wins
    assert got["score"] == pytest.approx(sum(r["score"] for r in results) / 400)
    seats = sum(r["first_seat_wins"] for r in results)
    assert got["first_position_win_rate"] == pytest.approx(seats / 800) and got["verdicts"] == 800
    assert got["flip_rate"] == pytest.approx(sum(r["flipped"] for r in results) / 400)
    lo, hi = got["first_position_win_rate_ci95"]
    assert lo < 0.7 < hi
    longer = [r for r in results if r["longer_decided"]]
    assert got["longer_win_rate"] == pytest.approx(sum(r["longer_wins"] for r in longer) /
                                                  sum(r["longer_decided"] for r in longer))
    # history and events read an item as its score
    reading = read("pairwise", {}, records[0])
    assert reading.values == {"score": records[0]["result"]["score"]}


def request_text(a: str, b: str) -> str:
    return messages("q?", a, b, "Which is better?")[1]["content"]


def draws(biases: Biases, a: str, b: str, n: int = 4000) -> float:
    """The share of requests judge-sim answers A, over n different requests."""
    text = request_text(a, b)
    won = sum(winner(text, hashlib.sha256(f"{k}".encode()).digest(), biases, 7) == "A" for k in range(n))
    return won / n


def test_judge_sims_biases_are_the_truth_it_was_told():
    assert draws(Biases(first=0.7), "same", "same") == pytest.approx(0.7, abs=0.03)
    assert draws(Biases(), "same", "same") == pytest.approx(0.5, abs=0.03)
    # the longer answer wins 68% wherever it sits, without a seat preference
    assert draws(Biases(longer=0.68), "a much longer answer", "short") == pytest.approx(0.68, abs=0.03)
    assert draws(Biases(longer=0.68), "short", "a much longer answer") == pytest.approx(0.32, abs=0.03)
    # a better answer wins whatever the biases, unless told some noise
    good, bad = "fine [[sim:quality=0.9]]", "fine [[sim:quality=0.1]]"
    assert draws(Biases(first=0.9, longer=0.9), bad, good) == 0.0
    assert draws(Biases(noise=0.2), good, bad) == pytest.approx(0.8, abs=0.03)
    assert winner("no sections here", b"x", Biases(first=0.9), 1) is None
    assert truth(Biases(first=0.7))["flip_rate"] == pytest.approx(0.58)
    with pytest.raises(ValueError, match="first must be in"):
        Biases(first=1.5)


def test_the_report_heads_a_pairwise_entry_with_its_rates_and_the_judges_seat():
    from evalq.results.report import ReportBuilder

    score = {"score": 0.55, "win_rate": 0.4, "win_rate_ci95": [0.3, 0.5], "tie_rate": 0.3, "loss_rate": 0.3,
             "first_position_win_rate": 0.7, "first_position_win_rate_ci95": [0.66, 0.74], "flip_rate": 0.58}
    head = ReportBuilder([], {})._headline({"metric": "pairwise", "score": score})
    assert head.startswith("win rate 0.4") and "first-position wins 0.7" in head and "flips under swap 0.58" in head
    assert "longer wins" not in head


def test_an_items_score_goes_out_labelled_win_tie_or_loss():
    from evalq.shared.traces.events import evaluations

    record = {"instance_id": "s1", "result": outcome(verdicts((CANDIDATE, CANDIDATE), (BASELINE, BASELINE)), "tie",
                                                     5, 5)}
    [ev] = evaluations("j", "pairwise@0", "pairwise", "pairwise", {}, 0, record, {"trace_id": "a" * 32,
                                                                                   "span_id": "b" * 16})
    assert (ev.name, ev.value, ev.label) == ("pairwise", 0.5, "tie") and "candidate first" in ev.explanation
