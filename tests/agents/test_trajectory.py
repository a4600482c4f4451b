"""Trajectory metrics on hand-built agent runs (extra, missing, reordered, wrong-argument and
parallel calls), against ragas' ToolCallAccuracy and ToolCallF1 computed by ragas itself, and the
strict validation of agent instances."""

from __future__ import annotations

import json

import pytest

from evalq.shared.agents.params import ToolCallF1Params, TrajectoryParams
from evalq.shared.agents.trajectory import check
from evalq.workers.agents.trajectory import tool_call_f1, trajectory

TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {
            "type": "object", "properties": {"q": {"type": "string"}, "k": {"type": "integer"}}, "required": ["q"]}}},
         {"type": "function", "function": {"name": "weather", "parameters": {
             "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
         {"name": "book", "parameters": {"type": "object", "properties": {"when": {"type": "string"}}}}]


def call(n: int, name: str, args: dict, raw: bool = False) -> dict:
    return {"id": f"c{n}", "type": "function",
            "function": {"name": name, "arguments": args if raw else json.dumps(args)}}


def run(*turns: list[tuple[str, dict]], expected: list[tuple[str, dict]]) -> dict:
    """An agent run: each turn an assistant message with its (parallel) calls, each answered."""
    messages, n = [{"role": "user", "content": "plan my day"}], 0
    for turn in turns:
        calls = []
        for name, args in turn:
            calls.append(call(n, name, args))
            n += 1
        messages.append({"role": "assistant", "content": None, "tool_calls": calls})
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in calls]
    messages.append({"role": "assistant", "content": "done"})
    return {"id": "r", "messages": messages, "tool_definitions": TOOLS,
            "expected_tool_calls": [{"name": name, "arguments": args} for name, args in expected]}


S, W, B = ("search", {"q": "cafes", "k": 3}), ("weather", {"city": "Rome"}), ("book", {"when": "noon"})
CASES = {
    "same": run([S], [W], [B], expected=[S, W, B]),
    "parallel": run([S, W], [B], expected=[S, W, B]),
    "reordered": run([W], [S], [B], expected=[S, W, B]),
    "extra": run([S], [W], [("search", {"q": "bars"})], [B], expected=[S, W, B]),
    "everything twice": run([S, S], [W, W], [B, B], expected=[S, W, B]),
    "missing": run([S], [B], expected=[S, W, B]),
    "wrong argument": run([S], [("weather", {"city": "Milan"})], [B], expected=[S, W, B]),
    "extra argument": run([S], [("weather", {"city": "Rome", "units": "C"})], [B], expected=[S, W, B]),
    "nothing called": run(expected=[S, W, B]),
    "nothing expected": run([S], expected=[]),
    "both empty": run(expected=[]),
}


def test_every_case_is_a_valid_agent_run():
    for name, inst in CASES.items():
        assert check(inst) == [], name


@pytest.mark.parametrize("strict", [True, False])
def test_sequence_accuracy_and_f1_equal_ragas(ragas, strict):
    cases = []
    for inst in CASES.values():
        made = [[c["function"]["name"], json.loads(c["function"]["arguments"])]
                for m in inst["messages"] for c in m.get("tool_calls") or []]
        cases.append({"made": made, "expected": [[c["name"], c["arguments"]] for c in inst["expected_tool_calls"]],
                      "strict_order": strict})
    expected = ragas("tool_calls", cases)
    for (name, inst), want in zip(CASES.items(), expected):
        got = trajectory(inst, TrajectoryParams(strict_order=strict))
        assert got["sequence_accuracy"] == pytest.approx(want["tool_call_accuracy"]), name
        assert tool_call_f1(inst, ToolCallF1Params()) == want["tool_call_f1"], name


def test_evalqs_own_fields_on_each_case():
    t = {name: trajectory(inst, TrajectoryParams()) for name, inst in CASES.items()}
    assert t["same"]["exact_match"] and t["same"]["f1"] == 1.0 and t["same"]["valid_arguments"] == 1.0
    assert t["parallel"]["exact_match"]  # parallel calls keep their order within the message
    assert (t["reordered"]["exact_match"], t["reordered"]["in_order_match"], t["reordered"]["any_order_match"]) == \
        (False, False, True)
    extra = t["extra"]
    assert (extra["exact_match"], extra["in_order_match"], extra["extra_calls"], extra["recall"]) == (False, True, 1, 1.0)
    assert extra["precision"] == pytest.approx(3 / 4)
    # calling everything twice: ragas' ToolCallAccuracy sees no order (0) but ToolCallF1 sees sets (1.0);
    # evalq pairs calls one to one, so the extra three cost precision
    twice = t["everything twice"]
    assert (twice["precision"], twice["recall"], twice["extra_calls"]) == (0.5, 1.0, 3)
    assert tool_call_f1(CASES["everything twice"], ToolCallF1Params()) == 1.0
    assert (t["missing"]["missing_calls"], t["missing"]["recall"]) == (1, pytest.approx(2 / 3))
    wrong = t["wrong argument"]
    assert (wrong["argument_accuracy"], wrong["missing_calls"], wrong["extra_calls"]) == (pytest.approx(2 / 3), 1, 1)
    assert not t["extra argument"]["exact_match"]
    subset = trajectory(CASES["extra argument"], TrajectoryParams(argument_match="subset"))
    assert subset["exact_match"] and subset["f1"] == 1.0
    assert (t["nothing called"]["precision"], t["nothing called"]["recall"]) == (0.0, 0.0)
    assert (t["nothing expected"]["precision"], t["nothing expected"]["extra_calls"]) == (0.0, 1)
    assert t["both empty"]["exact_match"] and t["both empty"]["f1"] == 1.0


def test_an_argument_the_call_leaves_out_is_not_an_expected_null():
    """An expected argument whose value is JSON null is matched only by a call that gives it null,
    not by a call without it (as ragas, which scores only arguments the call has)."""
    inst = run([("search", {"q": "cafes"})], expected=[("search", {"q": "cafes", "k": None})])
    subset = trajectory(inst, TrajectoryParams(argument_match="subset"))
    assert (subset["exact_match"], subset["recall"], subset["sequence_accuracy"]) == (False, 0.0, 0.5)
    given = run([("search", {"q": "cafes", "k": None})], expected=[("search", {"q": "cafes", "k": None})])
    assert trajectory(given, TrajectoryParams(argument_match="subset"))["exact_match"]


def test_arguments_are_checked_against_each_tools_schema():
    inst = run([("search", {"k": "three"})], [("weather", {"city": "Oslo"})], expected=[W])
    assert trajectory(inst, TrajectoryParams())["valid_arguments"] == 0.5  # search: no q, k not an integer


@pytest.mark.parametrize("change,problem", [
    (lambda i: i["messages"][1]["tool_calls"][0]["function"].update(name="teleport"),
     "messages[1].tool_calls[0]: calls 'teleport', which tool_definitions do not define"),
    (lambda i: i["messages"][1]["tool_calls"][0]["function"].update(arguments="{q: cafes"),
     "messages[1].tool_calls[0] (search): arguments are not JSON"),
    (lambda i: i["messages"][1]["tool_calls"][0]["function"].update(arguments="[1, 2]"),
     "messages[1].tool_calls[0] (search): arguments must be a JSON object"),
    (lambda i: i["messages"][2].update(tool_call_id="nope"),
     "messages[2]: a tool message answers no call (tool_call_id 'nope')"),
    (lambda i: i["expected_tool_calls"].append({"name": "fly", "arguments": {}}),
     "expected_tool_calls[3]: names 'fly', which tool_definitions do not define"),
    (lambda i: i["messages"].append({"role": "robot", "content": "x"}),
     "expected a chat message with a role"),
])
def test_a_malformed_agent_run_is_located(change, problem):
    inst = json.loads(json.dumps(CASES["same"]))
    change(inst)
    assert any(problem in p for p in check(inst)), check(inst)
