"""Two answers to one input, compared by a judge in both orders (``evalq.shared.pairwise``).

Each order is one judge call: the question and the two answers as delimited material (``<data
name="ANSWER A">``, ``<data name="ANSWER B">``), the criteria, and a reply ``{"reason", "winner"}``
with ``winner`` one of ``A``, ``B``, ``tie``. The first call shows the candidate as A, the second
(``swap``, the default) the baseline as A; each verdict is turned back into who won (the candidate,
the baseline, or neither), and the item is:

- a **win** (score 1) when every verdict picked the candidate, a **loss** (0) when every verdict
  picked the baseline, a **tie** (1/2) when every verdict said tie;
- otherwise the verdicts disagree: a tie by default (``disagreement``), never a silent win for the
  seat the judge prefers.

The result keeps each verdict (the seat, the winner, the reason) and the counts the aggregate reads
(``evalq.shared.pairwise.aggregate``): verdicts that picked the first seat, verdicts that picked one
of two answers of different lengths and the longer of them, and whether the winner flipped.
"""

from __future__ import annotations

import re
from typing import Any

from evalq.shared.pairwise.params import PairwiseParams
from evalq.workers.metrics.structured import MATERIAL, reply_object, ask, data, each

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["reason", "winner"],
          "properties": {"reason": {"type": "string", "description": "one sentence"},
                         "winner": {"type": "string", "enum": ["A", "B", "tie"]}}}
SYSTEM = ("You are an impartial judge comparing two answers to the same question. " + MATERIAL
          + " Do not let the order in which the answers are shown, their length or their style decide; "
          "judge only by the criteria. First write a one-sentence reason, then name the winner: A, B, or tie. "
          'Reply as JSON: {"reason": "<one sentence>", "winner": "A" | "B" | "tie"}.')
_WINNER_LINE = re.compile(r"^\s*winner\s*:\s*\**\s*(a|b|tie)\b", re.I | re.M)
CANDIDATE, BASELINE, TIE = "candidate", "baseline", "tie"


def messages(question: Any, first: str, second: str, criteria: str) -> list[dict]:
    fields = [("QUESTION", question), ("ANSWER A", first), ("ANSWER B", second)]
    body = "\n\n".join(data(name, value) for name, value in fields if value is not None)
    task = f"Which answer is better by these criteria?\n{criteria}"
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"{task}\n\n{body}"}]


def _read(structured: bool):
    def read(text: str) -> dict | None:
        obj = reply_object(text)
        if obj is not None or structured:
            return obj
        found = _WINNER_LINE.findall(text or "")  # a text judge's last "Winner: X" line
        if not found:
            return None
        winner = found[-1].upper() if found[-1].lower() != "tie" else "tie"
        return {"reason": (text or "").strip().splitlines()[0][:300], "winner": winner}
    return read


def _verdict(obj: dict) -> tuple[str, str]:
    winner = obj["winner"]
    if not isinstance(winner, str) or winner.strip().upper() not in ("A", "B", "TIE"):
        raise ValueError("winner must be A, B or tie")
    winner = winner.strip().upper()
    reason = obj.get("reason")
    return ("tie" if winner == "TIE" else winner), reason if isinstance(reason, str) else ""


def pairwise(instance: dict, params: PairwiseParams, judge: Any) -> dict:
    candidate, baseline = str(instance["actual-output"]), str(instance["baseline-output"])
    structured = getattr(getattr(judge, "judge", None), "output", "text") != "text"
    orders = [(CANDIDATE, candidate, BASELINE, baseline)]
    if params.swap:
        orders.append((BASELINE, baseline, CANDIDATE, candidate))
    answers = each(
        (lambda order=order: ask(judge, messages(instance.get("input"), order[1], order[3], params.criteria),
                                 SCHEMA, "verdict", check=_verdict, read=_read(structured),
                                 unread="it names no winner (A, B or tie)"))
        for order in orders)
    verdicts = []
    for (first, first_text, second, second_text), (seat, reason) in zip(orders, answers):
        winner = first if seat == "A" else second if seat == "B" else TIE
        verdicts.append({"first": first, "winner": winner, "reason": reason})
    return outcome(verdicts, params.disagreement, len(candidate), len(baseline))


def outcome(verdicts: list[dict], disagreement: str, candidate_len: int, baseline_len: int) -> dict:
    """The item's result from its verdicts (each ``first``: who sat first, ``winner``)."""
    winners = [v["winner"] for v in verdicts]
    if len(set(winners)) == 1:
        decided = winners[0]
    elif disagreement == "first":
        decided = winners[0]
    elif disagreement == "baseline":
        decided = BASELINE
    else:
        decided = TIE
    picked = [v for v in verdicts if v["winner"] != TIE]
    longer = CANDIDATE if candidate_len > baseline_len else BASELINE if baseline_len > candidate_len else None
    result: dict[str, Any] = {
        "outcome": {CANDIDATE: "win", BASELINE: "loss", TIE: "tie"}[decided],
        "score": {CANDIDATE: 1.0, BASELINE: 0.0, TIE: 0.5}[decided],
        "win": int(decided == CANDIDATE), "tie": int(decided == TIE), "loss": int(decided == BASELINE),
        "asked": len(verdicts), "decided": len(picked),
        "first_seat_wins": sum(1 for v in picked if v["winner"] == v["first"]),
        "longer_decided": len(picked) if longer else 0,
        "longer_wins": sum(1 for v in picked if v["winner"] == longer) if longer else 0,
        "verdicts": verdicts,
        "reason": "; ".join(f"{v['first']} first: {v['winner']} ({v['reason']})" for v in verdicts),
    }
    if len(verdicts) == 2:
        result["flipped"] = int(winners[0] != winners[1])
    return result
