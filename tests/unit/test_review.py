"""Items out for review (issue 75): the picker weighs each judged item as its log line passes and
fills the night's number by reason (panel disagreement, near the threshold, changed since the
baseline) and then at random by category. The expected picks are counted here from the items."""

from __future__ import annotations

import json

from evalq.results.review import Picker, review_line, said
from evalq.shared.job.nightly import Review


def line(i: int, score: float, members: dict | None = None, category: str | None = None) -> str:
    result = {"score": score, "reason": "r"}
    if members:
        result["members"] = {m: {"score": v} for m, v in members.items()}
    row = {"instance_id": f"q{i}", "metric": "coherence", "entry": 0, "result": result}
    if category:
        row["category"] = category
    return json.dumps(row)


def picker(items: int, random: float = 0.0, baseline=None) -> Picker:
    return Picker("job1", Review(items=items, random=random), {"coherence@0": ("coherence", "rating", {"threshold": 4})},
                  baseline)


def test_reasons_fill_the_number_in_order_and_an_item_carries_all_its_reasons():
    p = picker(6, baseline={("coherence", "mean"): {f"q{i}": 5.0 for i in range(40)}})
    scores = {}
    for i in range(40):
        members = {"a": 1.0, "b": 5.0} if i in (3, 7) else ({"a": 3.0, "b": 5.0} if i == 11 else {"a": 4.0, "b": 4.0})
        score = sum(members.values()) / 2
        if i in (20, 21, 22, 23, 24, 25):
            score, members = 5.0, {"a": 5.0, "b": 5.0}
        scores[i] = score
        p.offer("coherence@0", i, line(i, score, members))
    rows = p.pick()
    # disagreements: spread 4 (q3, q7), then spread 2 (q11); then near 3.5 (score 3 or 4): every item at 4 ...
    assert [r["instance_id"] for r in rows[:3]] == ["q7", "q3", "q11"]
    assert rows[2]["reasons"][0] == {"reason": "panel disagreement", "why": "scores a 3, b 5"}
    # its other reason too (4.0 is near 3.5), though the baseline's 5 passed as it does: not a change
    assert [r["reason"] for r in rows[2]["reasons"]] == ["panel disagreement", "near the threshold"]
    assert [r["reason"] for r in rows[0]["reasons"]] == ["panel disagreement", "near the threshold",
                                                     "changed since the baseline"]  # 3.0: failed, passed before
    near = [i for i, s in scores.items() if abs(s - 3.5) <= 0.5 and i not in (3, 7, 11)]
    assert all(r["reasons"][0]["reason"] == "near the threshold" and int(r["instance_id"][1:]) in near for r in rows[3:])
    assert len(rows) == 6


def test_a_verdict_that_flipped_since_the_baseline_is_chosen_and_the_rest_drawn_by_category():
    base = {f"q{i}": (2.0 if i < 5 else 5.0) for i in range(30)}  # q0..q4 failed in the baseline
    p = picker(10, random=0.5, baseline={("coherence", "mean"): base})
    for i in range(30):
        p.offer("coherence@0", i, line(i, 5.0, category="a" if i < 20 else "b"))  # all pass tonight
    rows = p.pick()
    flipped = [r for r in rows if r["reasons"][0]["reason"] == "changed since the baseline"]
    assert sorted(r["instance_id"] for r in flipped) == [f"q{i}" for i in range(5)]
    drawn = [r for r in rows if r["reasons"][0]["reason"] == "at random"]
    assert len(drawn) == 5 and len(rows) == 10
    # stratified: category a has 20 of the 30 items, b 10: the draw is split about 2:1
    by = [r["category"] for r in drawn]
    assert by.count("a") >= by.count("b") >= 1
    again = picker(10, random=0.5, baseline={("coherence", "mean"): base})
    for i in range(30):
        again.offer("coherence@0", i, line(i, 5.0, category="a" if i < 20 else "b"))
    assert [r["instance_id"] for r in again.pick()] == [r["instance_id"] for r in rows]  # the same draw twice
    summary = said(rows, {"phx": 3})
    assert summary["reasons"] == {"changed since the baseline": 5, "at random": 5} and summary["marked"] == {"phx": 3}
    assert review_line(summary) == ("10 item(s) in review.jsonl: 5 changed since the baseline, 5 at random; "
                                    "marked in phx (3)")


def test_errors_and_no_review_pick_nothing():
    p = picker(0)
    assert not p.wants("coherence@0") and p.pick() == []
    p = picker(3)
    p.offer("coherence@0", 0, json.dumps({"instance_id": "q0", "metric": "coherence", "error": "boom"}))
    assert p.pick() == []


def test_the_random_draw_fills_the_number_past_items_already_chosen_for_a_reason():
    for job in ("job1", "job2", "job3", "job4"):
        p = Picker(job, Review(items=10, random=0.5), {"coherence@0": ("coherence", "rating", {"threshold": 4})})
        for i in range(12):  # every item a disagreement: the draw meets the chosen ones
            p.offer("coherence@0", i, line(i, 3.0, {"a": 1.0, "b": 5.0}))
        rows = p.pick()
        assert len(rows) == 10 == len({r["instance_id"] for r in rows})
        assert sum(r["reasons"][0]["reason"] == "at random" for r in rows) == 5
