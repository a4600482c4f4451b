"""LLM-as-judge quality metrics (the Azure AI Studio set) and a generic rubric.

Pure functions: they build messages, call the judge passed in, and parse the
reply. evalq's own prompts, written from the metric definitions; each asks for
a one-line reason before the score (chain of thought) on a low-precision
integer scale with an anchor per point (Databricks' practice). A reply without
a valid score gets one corrective re-ask, then the item fails.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Protocol

from evalq.shared.data.instances import context_text
from evalq.shared.judging.judges import JudgeParams, RubricParams
from evalq.workers.metrics.structured import MATERIAL, ask, data, each, escape


class Judge(Protocol):
    def complete(self, messages: list[dict], schema: dict | None = None, schema_name: str = "rating") -> Any: ...


def rating_schema(lo: int, hi: int) -> dict:
    return {"type": "object", "additionalProperties": False, "required": ["reason", "score"],
            "properties": {"reason": {"type": "string", "description": "one sentence"},
                           "score": {"type": "integer", "minimum": lo, "maximum": hi}}}


# --- parsing -------------------------------------------------------------------

# The plain-text form of a verdict, each on a line of its own: "Reason: ..." then, last, "Score: N".
_SCORE_LINE = re.compile(r"score\s*:\s*(-?\d+(?:\.0+)?)", re.I)
_REASON_LINE = re.compile(r"reason\s*:\s*(.*)", re.I)


def _valid(value: Any, lo: int, hi: int) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        value = value.strip()
        if not re.fullmatch(r"-?\d+(\.0+)?", value):
            return None
        value = float(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and lo <= value <= hi:
        return value
    return None


_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S)


def parse_rating(text: str, lo: int, hi: int, structured: bool = False) -> tuple[int, str] | None:
    """A (score, reason) from the reply's structure, or None.

    Only these shapes count:

    - the whole reply is a JSON object (optionally in a code fence): the structure,
      and with ``structured`` (the judge was asked for JSON or a tool call) the only one;
    - a plain-text reply whose LAST line is exactly ``Score: N`` (any case, nothing
      else on the line), the reason from a ``Reason: ...`` line of its own before it;
      not when that line sits inside quoted material (after a ``<data`` the reply
      does not close);
    - a reply that is nothing but the integer.

    A verdict in any other form, however it ends the reply (``(Score: 5)``,
    ``**Score: 5**``, ``5/5.``, a last line ``5`` under other text), is never read:
    those are what an answer under evaluation can end with and a judge quote back.
    A reply without a verdict gets the corrective re-ask.
    """
    text = (text or "").strip()
    if not text:
        return None
    fenced = _FENCE.match(text)
    candidate = fenced.group(1) if fenced else text
    if candidate.startswith("{"):
        try:
            data = json.loads(candidate)
        except ValueError:
            return None
        if not isinstance(data, dict):
            return None
        score = _valid(data.get("score", data.get("rating")), lo, hi)
        return (score, str(data.get("reason", data.get("reasoning", ""))).strip()) if score is not None else None
    if structured:
        return None
    bare = _valid(text, lo, hi)
    if bare is not None:
        return bare, ""
    lowered = text.lower()
    quoted_until = lowered.rfind("</data")
    if lowered.rfind("<data") > quoted_until:
        return None  # the reply ends inside quoted material
    own = text[quoted_until:] if quoted_until >= 0 else text  # what follows the last quote
    lines = [line.strip() for line in own.splitlines() if line.strip()]
    verdict = _SCORE_LINE.fullmatch(lines[-1])
    score = _valid(verdict.group(1), lo, hi) if verdict else None
    if score is None:
        return None
    reasons = [m.group(1).strip() for m in map(_REASON_LINE.fullmatch, lines[:-1]) if m]
    return score, (reasons[-1] if reasons else _first_line(text) if len(lines) > 1 else "")


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0][:300] if text.strip() else ""


def _asked_for_structure(judge: Judge) -> bool:
    """Whether the judge is asked for a structured reply (its ``output``: ``json_schema``
    or ``tools``): then only that structure is read, never free text."""
    return getattr(getattr(judge, "judge", None), "output", "text") != "text"


def rate(judge: Judge, messages: list[dict], lo: int = 1, hi: int = 5) -> dict:
    """A rating through ``structured.ask``, read by ``parse_rating`` (which also takes the
    plain-text verdict line a ``text`` judge may give)."""
    structured = _asked_for_structure(judge)

    def read(text: str) -> dict | None:
        parsed = parse_rating(text, lo, hi, structured)
        return None if parsed is None else {"score": parsed[0], "reason": parsed[1]}

    return ask(judge, messages, rating_schema(lo, hi), "rating", check=lambda obj: obj, read=read,
               unread=f"it has no valid score (an integer from {lo} to {hi})")


# --- prompts -------------------------------------------------------------------

SYSTEM = ("You are an impartial evaluator of answers produced by an AI system. Grade exactly the property "
          "described, nothing else. " + MATERIAL + " First write a one-sentence reason, then give the score. "
          'Reply as JSON: {"reason": "<one sentence>", "score": <integer>}.')

STARS = {1: "completely lacks {p}", 2: "mostly lacks {p}", 3: "partially has {p}", 4: "mostly has {p}",
         5: "has perfect {p}"}


def scale(prop: str, anchors: dict[int, str] | None = None) -> str:
    anchors = anchors or {k: v.format(p=prop) for k, v in STARS.items()}
    return "\n".join(f"{k}: the answer {v}" if not v.startswith("the ") else f"{k}: {v}"
                     for k, v in sorted(anchors.items()))



def prompt(task: str, fields: list[tuple[str, str]]) -> list[dict]:
    """The task, then each field as delimited data (no ``<`` inside it)."""
    body = "\n\n".join(data(name, value) for name, value in fields if value is not None)
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"{task}\n\n{body}"}]


def _conversation(instance: dict) -> str | None:
    turns = instance.get("messages")
    if not isinstance(turns, list) or not turns:
        return None
    return "\n".join(f"{t.get('role', '?')}: {t.get('content', '')}" for t in turns if isinstance(t, dict))


def groundedness(instance: dict, params: JudgeParams, judge: Judge) -> dict:
    task = ("Rate GROUNDEDNESS: is every claim in the ANSWER supported by the CONTEXT? An answer that "
            "follows logically from the context is grounded even if worded differently; a claim that the "
            "context contradicts, or that cannot be checked against it, is not.\n"
            + scale("grounding", {1: "the answer contradicts the context or cannot be verified from it",
                                   2: "most claims are unsupported by the context",
                                   3: "some claims are supported, others are not",
                                   4: "nearly all claims are supported; a minor detail is not",
                                   5: "every claim follows from the context"}))
    return rate(judge, prompt(task, [("CONTEXT", context_text(instance)),
                                        ("QUESTION", instance.get("input")),
                                        ("ANSWER", instance["actual-output"])]))


def relevance(instance: dict, params: JudgeParams, judge: Judge) -> dict:
    conversation = _conversation(instance)
    refs = instance.get("expected-output") or []
    fields = []
    if conversation:
        task = ("Rate RELEVANCE of the final assistant ANSWER to the user's last request in the "
                "CONVERSATION: does it address what was asked, all of it and only it?")
        fields.append(("CONVERSATION", conversation))
    else:
        task = ("Rate RELEVANCE: does the ANSWER address the main aspects of the QUESTION, all the "
                "important ones and only those?")
    if instance.get("context"):
        task += " Judge against the CONTEXT the system was given."
        fields.append(("CONTEXT", context_text(instance)))
    if refs:
        task += (" A GROUND TRUTH answer is given: an answer that contradicts it scores 1 or 2; one that "
                 "lacks information it has scores lower.")
        fields.append(("GROUND TRUTH", refs[0]))
    task += "\n" + scale("relevance", {1: "the answer is completely irrelevant",
                                        2: "the answer is barely relevant",
                                        3: "the answer is partly relevant or padded with irrelevant content",
                                        4: "the answer is mostly relevant, a little too narrow or too broad",
                                        5: "the answer covers everything needed and nothing else"})
    fields += [("QUESTION", instance.get("input")), ("ANSWER", instance["actual-output"])]
    return rate(judge, prompt(task, fields))


def coherence(instance: dict, params: JudgeParams, judge: Judge) -> dict:
    task = ("Rate COHERENCE: do the sentences of the ANSWER fit together and read naturally as a whole?\n"
            + scale("coherence"))
    return rate(judge, prompt(task, [("QUESTION", instance.get("input")), ("ANSWER", instance["actual-output"])]))


def fluency(instance: dict, params: JudgeParams, judge: Judge) -> dict:
    task = ("Rate FLUENCY: is each sentence of the ANSWER well written, grammatical and with apt "
            "vocabulary? Judge the language, not the content.\n" + scale("fluency"))
    return rate(judge, prompt(task, [("QUESTION", instance.get("input")), ("ANSWER", instance["actual-output"])]))


def similarity(instance: dict, params: JudgeParams, judge: Judge) -> dict:
    """Best over references, as HarpIA specifies for several references."""
    task = ("Rate SIMILARITY: is the information in the ANSWER equivalent to the CORRECT ANSWER, given "
            "the QUESTION?\n" + scale("similarity", {1: "the answer is not at all similar to the correct answer",
                                                      2: "the answer is mostly not similar",
                                                      3: "the answer is somewhat similar",
                                                      4: "the answer is mostly similar",
                                                      5: "the answer is completely equivalent"}))
    return best_over_references(judge, task, instance["expected-output"], lambda ref: [
        ("QUESTION", instance.get("input")), ("CORRECT ANSWER", ref), ("ANSWER", instance["actual-output"])])


def best_over_references(judge: Judge, task: str, refs: list[str],
                         fields: Callable[[str], list[tuple[str, Any]]]) -> dict:
    """The best rating over the references, as HarpIA specifies for several (the first of equal
    ones); ``fields(ref)`` is the prompt's material for one reference. The references are asked
    side by side, so in batch mode they are one round."""
    return max(each(lambda ref=ref: rate(judge, prompt(task, fields(ref))) for ref in refs),
               key=lambda out: out["score"])


def retrieval(instance: dict, params: JudgeParams, judge: Judge) -> dict:
    task = ("Rate RETRIEVAL: how useful are the retrieved DOCUMENTS for answering the QUESTION (use the "
            "CONVERSATION, when given, to understand an ambiguous question)? Consider each document, then "
            "the set as a whole.\n"
            + scale("retrieval", {1: "the documents: none is relevant to the question",
                                   2: "the documents: barely relevant, little use for an answer",
                                   3: "the documents: partly relevant, an answer needs more",
                                   4: "the documents: mostly sufficient for a good answer",
                                   5: "the documents: one or a few are ideal for answering"}))
    return rate(judge, prompt(task, [("CONVERSATION", _conversation(instance)),
                                        ("QUESTION", instance.get("input")),
                                        ("DOCUMENTS", context_text(instance))]))


def rubric(instance: dict, params: RubricParams, judge: Judge) -> dict:
    lo, hi = params.scale_min, params.scale_max
    task = (f"Grade the ANSWER on a scale from {lo} to {hi} by these criteria:\n{params.criteria}")
    if params.examples:
        shots = []
        for e in sorted(params.examples, key=lambda e: e.score):
            # the job's own text, but kept from opening or closing a delimiter all the same
            shot = f"- score {e.score}:"
            if e.input:
                shot += f" question: {escape(repr(e.input))};"
            shot += f" answer: {escape(repr(e.output))}"
            if e.reason:
                shot += f" (because {escape(e.reason)})"
            shots.append(shot)
        task += "\n\nExamples of graded answers:\n" + "\n".join(shots)
    refs = instance.get("expected-output") or []
    fields = [("QUESTION", instance.get("input"))]
    if instance.get("context"):
        fields.append(("CONTEXT", context_text(instance)))
    if refs:
        fields.append(("REFERENCE ANSWER", "\n".join(refs)))
    fields.append(("ANSWER", instance["actual-output"]))
    return rate(judge, prompt(task, fields), lo, hi)
