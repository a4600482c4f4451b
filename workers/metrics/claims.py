"""Claim-based metrics (seed 002, the llmevalka evaluation module).

Helpers, each one judge call:
- ``extract_claims(text)``: the claims a text makes (ClaimExtractor);
- ``relation(claim, premise)``: does the premise entail the claim, contradict it,
  or neither? Two questions, "entails?" and "contradicts?", combined
  (EntailmentAnalyzer): entails and not contradicts -> entails; contradicts and
  not entails -> contradicts; otherwise neutral;
- informationless: does a text carry any information, or only formalities.

Every call goes through the judge client (budget, retries, cache) and its
per-job memo: the claims of a text are extracted once per job, whichever metric
asks (precision, recall and F1 share them), and an item re-run after a deferral
never pays again for a call already answered.
"""

from __future__ import annotations


from evalq.shared.data.instances import context_passages
from evalq.shared.judging.judges import (RELATIONS, ClaimScoreParams, ClaimsParams, DefectJudgeParams,
                                 RubricsFCParams)
from evalq.workers.metrics import structured as s

ENTAILS, CONTRADICTS, NEUTRAL = "entails", "contradicts", "neutral"


def extract_claims(judge, text: str) -> list[str]:
    task = ("List the claims the TEXT makes: short, self-contained statements of fact, each understandable "
            "without the others (resolve pronouns), without repeating one. Greetings, questions and "
            "formalities are not claims. A text without claims gives an empty list.")
    schema = {"type": "object", "additionalProperties": False, "required": ["claims"],
              "properties": {"claims": {"type": "array", "items": {"type": "string"}}}}

    def check(obj: dict) -> list[str]:
        claims = obj["claims"]
        if not isinstance(claims, list) or not all(isinstance(c, str) for c in claims):
            raise ValueError("claims must be a list of strings")
        return [c.strip() for c in claims if c.strip()]

    return s.ask(judge, s.messages(task, [("TEXT", text)]), schema, "claims", check)


def _yes_no(judge, task: str, fields: list, key: str) -> bool:
    schema = {"type": "object", "additionalProperties": False, "required": ["reason", key],
              "properties": {"reason": {"type": "string", "description": "one sentence"},
                             key: {"type": "boolean"}}}
    return s.ask(judge, s.messages(task, fields), schema, key, lambda obj: s.boolean(obj, key))


def relation(judge, claim: str, premise: str) -> str:
    entails, contradicts = s.each([
        lambda: _yes_no(judge, "Does the CLAIM follow from the PREMISE (is it true whenever the premise is)? "
                               'First a one-sentence reason, then "entails": true or false.',
                        [("PREMISE", premise), ("CLAIM", claim)], "entails"),
        lambda: _yes_no(judge, "Does the CLAIM contradict the PREMISE (can they not both be true)? First a "
                               'one-sentence reason, then "contradicts": true or false.',
                        [("PREMISE", premise), ("CLAIM", claim)], "contradicts")])
    if entails and not contradicts:
        return ENTAILS
    if contradicts and not entails:
        return CONTRADICTS
    return NEUTRAL


def _value(verdict: str, neutral: float) -> float:
    return {ENTAILS: 1.0, CONTRADICTS: 0.0}.get(verdict, neutral)


def _rounded(raw: float | None, round_up_at: float | None, out: dict) -> dict:
    """``score`` after the optional round-up; the raw value stays beside it."""
    if round_up_at is not None and raw is not None:
        out["raw_score"] = raw
        raw = 1.0 if raw >= round_up_at else raw
    return {"score": raw, **out}


def _fc(judge, claims: list[str], premise: str, neutral: float) -> tuple[float | None, list[dict]]:
    verdicts = s.each(lambda c=c: relation(judge, c, premise) for c in claims)
    checked = [{"claim": c, "verdict": v} for c, v in zip(claims, verdicts)]
    if not checked:
        return None, checked
    return sum(_value(c["verdict"], neutral) for c in checked) / len(checked), checked


def _best(results: list[dict]) -> dict:
    """The best over several references (HarpIA: in the model's favour); None scores last."""
    return max(results, key=lambda r: (r["score"] is not None, r["score"] or 0.0))


def claims_recall(instance: dict, params: ClaimsParams, judge) -> dict:
    """ClaimsFC as the seed defines it: the answer's claims checked against the
    expected answer (entails 1, contradicts 0, neither ``neutral_value``), averaged;
    the seed reads this as recall. Best over the references."""
    claims = extract_claims(judge, instance["actual-output"])
    results = [{"score": score, "claims": checked} for score, checked in
               s.each(lambda ref=ref: _fc(judge, claims, ref, params.neutral_value)
                      for ref in instance["expected-output"])]
    best = _best(results)
    return _rounded(best["score"], params.round_up_at, {"claims": best["claims"]})


def claims_precision(instance: dict, params: ClaimsParams, judge) -> dict:
    """ClaimsFC with the roles swapped: the expected answer's claims checked against the answer."""
    results = [{"score": score, "claims": checked} for score, checked in
               s.each(lambda ref=ref: _fc(judge, extract_claims(judge, ref), instance["actual-output"],
                                          params.neutral_value) for ref in instance["expected-output"])]
    best = _best(results)
    return _rounded(best["score"], params.round_up_at, {"claims": best["claims"]})


def claims_f1(instance: dict, params: ClaimsParams, judge) -> dict:
    """The harmonic mean of both directions, per reference; the best reference."""
    answer_claims = extract_claims(judge, instance["actual-output"])

    def both(ref: str) -> tuple:
        (recall, _), (precision, _) = s.each([
            lambda: _fc(judge, answer_claims, ref, params.neutral_value),
            lambda: _fc(judge, extract_claims(judge, ref), instance["actual-output"], params.neutral_value)])
        return recall, precision

    results = []
    for recall, precision in s.each(lambda ref=ref: both(ref) for ref in instance["expected-output"]):
        if recall is None or precision is None:
            f1 = None
        else:
            f1 = 0.0 if recall + precision == 0 else 2 * precision * recall / (precision + recall)
        results.append({"score": f1, "precision": precision, "recall": recall})
    best = _best(results)
    return _rounded(best["score"], params.round_up_at,
                    {"precision": best["precision"], "recall": best["recall"]})



def faithfulness(instance: dict, params: ClaimScoreParams, judge) -> dict:
    """The share of the answer's claims entailed by at least one context passage."""
    claims = extract_claims(judge, instance["actual-output"])
    sources = context_passages(instance)
    # each claim's sources are asked in turn until one entails it (as synchronously); the
    # claims are asked side by side, so a batch round holds one question of every claim
    supported = s.each(lambda c=c: any(relation(judge, c, source) == ENTAILS for source in sources)
                       for c in claims)
    checked = [{"claim": c, "supported": ok} for c, ok in zip(claims, supported)]
    raw = sum(c["supported"] for c in checked) / len(checked) if checked else None
    return _rounded(raw, params.round_up_at, {"claims": checked})


def context_relevancy(instance: dict, params: ClaimScoreParams, judge) -> dict:
    """The share of context passages the judge finds needed (or useful) for writing the answer."""
    sources = context_passages(instance)
    needed = s.each(lambda p=p: _yes_no(
        judge, "Was the PASSAGE needed, or clearly useful, to write this ANSWER to the QUESTION? "
               'First a one-sentence reason, then "needed": true or false.',
        [("QUESTION", instance.get("input")), ("PASSAGE", p), ("ANSWER", instance["actual-output"])], "needed")
        for p in sources)
    raw = sum(needed) / len(needed) if needed else None
    return _rounded(raw, params.round_up_at, {"needed": needed})


def informationless(instance: dict, params: DefectJudgeParams, judge) -> dict:
    task = ("Does the TEXT carry no information at all, only formalities (greetings, thanks, asking the user "
            "to rephrase or to wait, apologies, refusals without substance)? First a one-sentence reason, then "
            '"informationless": true or false.')
    schema = {"type": "object", "additionalProperties": False, "required": ["reason", "informationless"],
              "properties": {"reason": {"type": "string", "description": "one sentence"},
                             "informationless": {"type": "boolean"}}}
    return s.ask(judge, s.messages(task, [("TEXT", instance["actual-output"])]), schema, "informationless",
                 lambda obj: {"informationless": s.boolean(obj, "informationless"), "reason": s.reason(obj)})


RELATION_TEXT = {
    "equivalent": "the ANSWER and the EXPECTED answer state exactly the same thing",
    "implied_subset": "the ANSWER is true given the EXPECTED answer, but the EXPECTED answer states more",
    "implied_superset": "the ANSWER states more than the EXPECTED answer and does not contradict it",
    "contradiction": "the ANSWER contradicts the EXPECTED answer",
    "independent": "the ANSWER and the EXPECTED answer talk past each other",
}


def rubrics_fc(instance: dict, params: RubricsFCParams, judge) -> dict:
    """RubricsFC: the judge picks one of five relations, each mapped to a number. Best over references."""
    options = "\n".join(f"- {name}: {text}" for name, text in RELATION_TEXT.items())
    task = (f"Which relation holds between the ANSWER and the EXPECTED answer?\n{options}\nFirst a "
            'one-sentence reason, then "relation": one of the names above.')
    schema = {"type": "object", "additionalProperties": False, "required": ["reason", "relation"],
              "properties": {"reason": {"type": "string", "description": "one sentence"},
                             "relation": {"type": "string", "enum": list(RELATIONS)}}}

    def check(obj: dict) -> dict:
        if obj["relation"] not in RELATIONS:
            raise ValueError(f"relation must be one of {', '.join(RELATIONS)}")
        return {"relation": obj["relation"], "reason": s.reason(obj)}

    verdicts = s.each(lambda ref=ref: s.ask(judge, s.messages(task, [("EXPECTED", ref),
                                                                    ("ANSWER", instance["actual-output"])]),
                                           schema, "relation", check) for ref in instance["expected-output"])
    results = [{"score": getattr(params.values, v["relation"]), **v} for v in verdicts]
    best = _best(results)
    return _rounded(best["score"], params.round_up_at, {"relation": best["relation"], "reason": best["reason"]})
