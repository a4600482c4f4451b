"""Trajectory metrics: the tool calls an agent made against the calls expected, no judge.

A call matches an expected one when the names are equal and the arguments match
(``argument_match``: ``exact``, or ``subset``: the expected arguments are among the call's). Every
comparison pairs calls one to one (a call answers at most one expected call), so an agent that
calls every tool, or one tool twice, is penalised: its extra calls lower ``precision`` and are
counted in ``extra_calls``.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from evalq.shared.agents.params import ToolCallF1Params, TrajectoryParams
from evalq.shared.agents.trajectory import Call, canonical, read


def _same(made: Call, want: Call, subset: bool) -> bool:
    if made.name != want.name:
        return False
    if subset:
        mine = made.arg_keys
        return all(k in mine and mine[k] == v for k, v in want.arg_keys.items())
    return made.args_key == want.args_key


def _matching(made: list[Call], wanted: list[Call], fits) -> int:
    """The size of a largest one-to-one matching of made calls to wanted ones (augmenting paths;
    trajectories are short)."""
    owner: dict[int, int] = {}  # wanted index -> made index

    def place(i: int, seen: set[int]) -> bool:
        for j, w in enumerate(wanted):
            if j not in seen and fits(made[i], w):
                seen.add(j)
                if j not in owner or place(owner[j], seen):
                    owner[j] = i
                    return True
        return False

    return sum(place(i, set()) for i in range(len(made)))


def _in_order(made: list[Call], wanted: list[Call], fits) -> bool:
    """The expected calls are a subsequence of the calls made."""
    j = 0
    for call in made:
        if j < len(wanted) and fits(call, wanted[j]):
            j += 1
    return j == len(wanted)


def _ratio(a: int, b: int, empty: float) -> float:
    return a / b if b else empty


def trajectory(instance: dict, params: TrajectoryParams) -> dict:
    made, wanted, tools = read(instance)
    subset = params.argument_match == "subset"

    def fits(m: Call, w: Call) -> bool:
        return _same(m, w, subset)

    matched = _matching(made, wanted, fits)
    # with nothing expected, calling nothing is right; with something expected, calling nothing is not
    precision = _ratio(matched, len(made), 1.0 if not wanted else 0.0)
    recall = _ratio(matched, len(wanted), 1.0)
    named = _matching(made, wanted, lambda m, w: m.name == w.name)
    result = {
        "exact_match": len(made) == len(wanted) and all(fits(m, w) for m, w in zip(made, wanted)),
        "in_order_match": _in_order(made, wanted, fits),
        "any_order_match": matched == len(wanted),
        "precision": precision, "recall": recall,
        "f1": 2 * precision * recall / (precision + recall) if precision + recall else 0.0,
        # of the calls paired with an expected call of the same tool, the share whose arguments match too
        "argument_accuracy": _ratio(matched, named, 1.0) if named else None,
        "extra_calls": len(made) - matched, "missing_calls": len(wanted) - matched,
        "sequence_accuracy": sequence_accuracy(made, wanted, params.strict_order),
    }
    if tools is not None and made:
        result["valid_arguments"] = sum(_valid(c, tools) for c in made) / len(made)
    return result


def _valid(call: Call, tools: dict[str, dict]) -> bool:
    """The call's arguments validate against its tool's parameters schema."""
    schema = tools.get(call.name)
    if schema is None:
        return False
    return _validator_of(schema).is_valid(call.arguments)


_BY_OBJECT: dict[int, tuple[dict, Any]] = {}


def _validator_of(schema: dict):
    """The schema's validator, found by the schema object itself where it was seen before (a
    worker decodes a job's tool definitions once for all its runs), else by its text."""
    hit = _BY_OBJECT.get(id(schema))
    if hit is None or hit[0] is not schema:  # the schema is held: its id is not reused
        if len(_BY_OBJECT) >= 1024:
            _BY_OBJECT.clear()
        hit = _BY_OBJECT[id(schema)] = (schema, _validator(json.dumps(schema, sort_keys=True)))
    return hit[1]


@lru_cache(maxsize=256)
def _validator(schema: str):
    """A compiled validator per schema (runs of one agent share their tools' schemas)."""
    from jsonschema import validators

    parsed = json.loads(schema)
    return validators.validator_for(parsed)(parsed)


# --- ragas' definitions ------------------------------------------------------------------

def _ragas_key(call: Call) -> tuple[str, ...]:
    key = [call.name]
    for name in sorted(call.arguments):
        key += [name, str(canonical(call.arguments[name]))]  # ragas' order (its str()), numbers by value
    return tuple(key)


def _ragas_arguments(made: Call, wanted: Call) -> float:
    """ragas' argument score: the share of expected arguments the call gives the same value. ragas
    compares the values' Python ``str()``; evalq compares JSON values (``value_key``): 10.0 is 10,
    and two objects with their keys in another order are the same (docs/how-to/agents.md)."""
    if not wanted.arguments and not made.arguments:
        return 1.0
    if not wanted.arguments:
        return 0.0
    mine = made.arg_keys
    return sum(float(k in mine and mine[k] == v) for k, v in wanted.arg_keys.items()) / len(wanted.arguments)


def sequence_accuracy(made: list[Call], wanted: list[Call], strict_order: bool = True) -> float:
    """ragas' ToolCallAccuracy: 0 unless the tool names line up (in order, or as multisets); then
    the mean argument score of the calls paired in turn, lowered when fewer calls were made than
    expected. (Extra calls beyond the expected ones are not penalised by it: see precision.)"""
    if not made and not wanted:
        return 1.0
    if not made or not wanted:
        return 0.0
    if not strict_order:
        made, wanted = sorted(made, key=_ragas_key), sorted(wanted, key=_ragas_key)
    names_made, names_wanted = [c.name for c in made], [c.name for c in wanted]
    aligned = names_made == names_wanted if strict_order else sorted(names_made) == sorted(names_wanted)
    score = sum(_ragas_arguments(m, w) for w, m in zip(wanted, made) if w.name == m.name)
    score /= len(wanted)
    compared = min(len(made), len(wanted))
    if compared < len(wanted):
        score *= compared / len(wanted)
    return score * int(aligned)


def tool_call_f1(instance: dict, params: ToolCallF1Params) -> float:
    """ragas' ToolCallF1: F1 of the distinct (name, arguments) calls made against those expected,
    rounded to 4 places as ragas does."""
    made, wanted, _ = read(instance)
    actual, expected = {c.key() for c in made}, {c.key() for c in wanted}
    tp, fp, fn = len(actual & expected), len(actual - expected), len(expected - actual)
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    return round(2 * precision * recall / (precision + recall) if precision + recall else 0.0, 4)
