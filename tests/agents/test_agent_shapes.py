"""Issue 38: real agent data runs unchanged. Each shape the peers' own data comes in is read by
evalq and by the peer's own code (azure-ai-evaluation's parser in ``.venv-azure``, ragas in
``.venv-ragas``) and compared: Azure's nested and flat tool-call parts and its tool results as
objects, content given as a list of parts, runs without tool calls (not applicable to
tool_call_accuracy, as Azure's evaluator says), and arguments whose numbers are written two ways."""

from __future__ import annotations

import copy
import json

import pytest

from evalq.shared.agents.azure import to_instance
from evalq.shared.agents.messages import text_of
from evalq.shared.agents.params import ToolCallF1Params, TrajectoryParams
from evalq.shared.agents.trajectory import Call, check
from evalq.shared.agents.trajectory import read as read_run
from evalq.sim import JudgeSim, Region
from evalq.workers.agents.trajectory import sequence_accuracy, tool_call_f1, trajectory
from tests.conftest import evalq, read_log, read_results

pytestmark = pytest.mark.integration

TOOLS = [{"name": "get_orders", "description": "Orders of an account.",
          "parameters": {"type": "object", "properties": {"account_number": {"type": "string"}}}},
         {"name": "get_order", "description": "One order.",
          "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}}}]
QUERY = [{"role": "system", "content": "You are a friendly customer service agent."},
         {"createdAt": 1700000060, "role": "user",
          "content": [{"type": "text", "text": "Hi, I need help with the last 2 orders on my account #888."}]}]


def nested(call_id: str, name: str, arguments) -> dict:
    """Azure's nested tool-call part (its evaluators' docstrings show it)."""
    return {"type": "tool_call", "tool_call": {"id": call_id, "type": "function",
                                               "function": {"name": name, "arguments": arguments}}}


def flat(call_id: str, name: str, arguments) -> dict:
    return {"type": "tool_call", "tool_call_id": call_id, "name": name, "arguments": arguments}


def result(call_id: str, value) -> dict:
    return {"run_id": "0", "tool_call_id": call_id, "role": "tool",
            "content": [{"type": "tool_result", "tool_result": value}]}


def said(text: str, kind: str = "text") -> dict:
    return {"run_id": "0", "role": "assistant", "content": [{"type": kind, "text": text}]}


def response(form) -> list[dict]:
    """A run in Azure's shape: a greeting, one call, its result (a JSON text), two parallel calls,
    their results (an object, and a list), the final answer."""
    return [said("Hello! Let me quickly look up your account details."),
            {"run_id": "0", "role": "assistant", "content": [form("c1", "get_orders", {"account_number": "888"})]},
            result("c1", '[{ "order_id": "123" }, { "order_id": "124" }]'),
            said("I see two orders on your account. Let me fetch both."),
            {"run_id": "0", "role": "assistant", "content": [form("c2", "get_order", {"order_id": "123"}),
                                                             form("c3", "get_order", {"order_id": "124"})]},
            result("c2", {"order": {"id": "123", "status": "shipped"}}),
            result("c3", [{"id": "124", "status": "delayed"}]),
            said("Order 123 has shipped; order 124 is delayed.", "output_text")]


def function_call_form(call_id: str, name: str, arguments) -> dict:
    """The Responses API's names for the same (Azure's converter writes them; its parser reads them)."""
    return {"type": "function_call", "tool_call_id": call_id, "name": name, "arguments": arguments}


def azure_lines(messages: list[dict]) -> list[str]:
    """evalq's reading written as Azure's parser writes a run for its judge (``[TOOL_CALL]
    name(k=v)``, then the call's ``[TOOL_RESULT]``), to compare the two readings line by line."""
    results = {m["tool_call_id"]: m["content"] for m in messages if m.get("role") == "tool"}
    lines = []
    for m in messages:
        for tc in m.get("tool_calls") or []:
            args = json.loads(tc["function"]["arguments"])
            shown = ", ".join(f'{k}="{v}"' if isinstance(v, str) else f"{k}={'None' if v is None else v}"
                              for k, v in args.items())
            lines.append(f"[TOOL_CALL] {tc['function']['name']}({shown})")
            if tc["id"] in results:
                lines.append(f"[TOOL_RESULT] {results[tc['id']]}")
    return lines


@pytest.mark.parametrize("form", [nested, flat, function_call_form], ids=["nested", "flat", "function_call"])
def test_tool_calls_and_results_read_as_azures_parser_reads_them(azure, form):
    run = {"id": "r", "query": QUERY, "response": response(form), "tool_definitions": TOOLS}
    [reference] = azure("tool_calls_results", [run["response"]])
    inst = to_instance(copy.deepcopy(run))
    assert check(inst) == []
    assert azure_lines(inst["messages"]) == reference and len(reference) == 6
    assert inst["input"] == "Hi, I need help with the last 2 orders on my account #888."
    assert inst["actual-output"] == "Order 123 has shipped; order 124 is delayed."
    made, _, _ = read_run(inst)
    assert [(c.name, c.arguments) for c in made] == [("get_orders", {"account_number": "888"}),
                                                     ("get_order", {"order_id": "123"}),
                                                     ("get_order", {"order_id": "124"})]


def test_content_given_as_parts_is_read_as_azure_reads_it(azure):
    contents = [[{"type": "text", "text": "Plan my day."}],
                [{"type": "input_text", "text": "Two"}, {"type": "input_text", "text": "parts."}],
                [{"type": "text", "text": "Look:"}, {"type": "image_url", "image_url": {"url": "http://x/a.png"}}]]
    assert [text_of(c) for c in contents] == azure("text", contents)


def test_an_error_is_named_where_the_users_record_has_it(tmp_path):
    """Before: a nested call was refused ("expected {'id', 'type': 'function', ...}") and the error
    named evalq's converted messages[2], not the record's own response[0]."""
    runs = [{"id": "ok", "query": QUERY, "response": response(nested), "tool_definitions": TOOLS,
             "expected_tool_calls": [{"name": "get_orders", "arguments": {"account_number": "888"}}]}]
    undefined = copy.deepcopy(runs[0])
    undefined["id"] = "undefined"
    undefined["response"][4]["content"][1] = nested("c3", "teleport", {"to": "Mars"})
    orphan = copy.deepcopy(runs[0])
    orphan["id"] = "orphan"
    orphan["response"][2]["tool_call_id"] = "c9"
    not_json = copy.deepcopy(runs[0])
    not_json["id"] = "not-json"
    not_json["response"][1]["content"][0]["tool_call"]["function"]["arguments"] = "{oops"
    data = tmp_path / "azure.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in [*runs, undefined, orphan, not_json]))
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"dataset": {"uri": str(data)}, "metrics": [{"id": "trajectory"}]}))
    proc = evalq("validate", str(job))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{data} line 2: response[4].content[1]: calls 'teleport', which tool_definitions do not define" \
        in proc.stderr
    assert f"{data} line 3: response[2]: a tool message answers no call (tool_call_id 'c9')" in proc.stderr
    assert f"{data} line 4: response[1].content[0] (get_orders): arguments are not JSON" in proc.stderr
    assert f"{data} line 1" not in proc.stderr and "messages[" not in proc.stderr


def test_chat_logs_with_content_parts_run_unchanged(tmp_path):
    """OpenAI Chat Completions logs give content as parts and the tools beside the messages."""
    log = {"id": "chat", "tools": [{"type": "function", "function": TOOLS[1]}],
           "messages": [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                        {"role": "user", "content": [{"type": "text", "text": "Where is"},
                                                     {"type": "text", "text": "order 123?"}]},
                        {"role": "assistant", "content": None, "tool_calls": [
                            {"id": "c1", "type": "function",
                             "function": {"name": "get_order", "arguments": "{\"order_id\": \"123\"}"}}]},
                        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "shipped"}]},
                        {"role": "assistant", "content": [{"type": "text", "text": "It has shipped."}]}],
           "expected_tool_calls": [{"name": "get_order", "arguments": {"order_id": "123"}}]}
    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps(log) + "\n")
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"dataset": {"uri": str(data)}, "metrics": [{"id": "trajectory"}]}))
    proc = evalq("run", str(job), "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    [line] = read_log(tmp_path / "out")
    assert line["result"]["exact_match"] is True


def test_a_run_without_tool_calls_is_not_applicable_to_tool_call_accuracy(azure, tmp_path):
    """Before: 7 of 9 runs of one of Azure's samples were errors ("no turn with a tool call"). Azure
    answers "not applicable" there; so does evalq: counted apart, out of the mean and the errors."""
    runs = []
    for n in range(9):
        answer = [said(f"Our opening hours are 9 to 5 ({n}).")] if n >= 2 else response(nested)
        runs.append({"id": f"r{n}", "query": QUERY, "response": answer, "tool_definitions": TOOLS})
    decided = azure("has_tool_calls", [{"query": r["query"], "response": r["response"],
                                        "tool_definitions": r["tool_definitions"]} for r in runs])
    assert decided == [True, True] + [False] * 7
    data = tmp_path / "azure.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in runs))
    key = "TEST_AGENT_SHAPES_API_KEY"
    with JudgeSim([Region("lab")], api_key="k", seed=2) as sim:
        judge = {"provider": "openai", "model": "judge-sim", "api_key_env": key, "max_tokens": 100,
                 "deployments": [{"region": "lab", "base_url": sim.base_url("lab"), "tpm": 1_000_000,
                                  "rpm": 10_000}]}
        job = tmp_path / "job.json"
        job.write_text(json.dumps({"dataset": {"uri": str(data)}, "judges": {"j": judge},
                                   "metrics": [{"id": "tool_call_accuracy", "parameters": {"judge": "j"}}]}))
        proc = evalq("run", str(job), "--out", str(tmp_path / "out"), env={key: "k"})
    assert proc.returncode == 0, proc.stderr
    lines = {line["instance_id"]: line for line in read_log(tmp_path / "out")}
    for n, applicable in enumerate(decided):
        line = lines[f"r{n}"]
        assert ("result" in line) == applicable and "error" not in line, line
        if not applicable:
            assert "no turn with a tool call" in line["not_applicable"]
    result = read_results(tmp_path / "out")["tool_call_accuracy"]
    assert (result["n"], result["n_errors"], result["n_not_applicable"]) == (2, 0, 7)
    scores = [lines[f"r{n}"]["result"]["score"] for n in range(2)]
    assert result["score"]["score"] == pytest.approx(sum(scores) / 2)  # the 7 are out of the mean


CALLS = [  # (made, expected): arguments whose numbers are written two ways, nested and in lists
    ([["f", {"n": 10.0}]], [["f", {"n": 10}]]),
    ([["f", {"p": {"x": 1.0, "y": [2.0, 3]}}]], [["f", {"p": {"y": [2, 3.0], "x": 1}}]]),
    ([["f", {"n": 1e2}], ["g", {}]], [["f", {"n": 100}], ["g", {}]]),
    ([["f", {"n": 10.5}]], [["f", {"n": 10}]]),
]
BOOLEANS = ([["f", {"flag": True}]], [["f", {"flag": 1}]])


def calls(pairs: list) -> list[Call]:
    return [Call(name, args) for name, args in pairs]


def test_numbers_compare_by_value_as_ragas_tool_call_f1_does(ragas):
    """Before: evalq gave 0 where ragas' ToolCallF1 counts {"n": 10.0} as matching {"n": 10}. JSON
    has one number type: evalq compares numbers by value. It deliberately differs on booleans (true
    is not 1, which ragas' Python equality takes for equal) and from ToolCallAccuracy, which compares
    the values' Python str() (so 10.0 is not 10 there): docs/how-to/agents.md."""
    cases = [{"made": m, "expected": e, "strict_order": True} for m, e in [*CALLS, BOOLEANS]]
    reference = ragas("tool_calls", cases)
    for (made, wanted), ref in zip(CALLS, reference):
        f1 = _f1(made, wanted)
        assert f1 == ref["tool_call_f1"], (made, wanted, f1, ref)
    assert [r["tool_call_f1"] for r in reference[:4]] == [1.0, 1.0, 1.0, 0.0]
    # the documented differences, as ragas' own code gives them
    assert reference[4]["tool_call_f1"] == 1.0 and _f1(*BOOLEANS) == 0.0
    assert reference[0]["tool_call_accuracy"] == 0.0 and sequence_accuracy(*map(calls, CALLS[0])) == 1.0
    # and evalq's own trajectory fields read numbers by value too
    run = _run(*CALLS[1])
    assert trajectory(run, TrajectoryParams())["exact_match"] is True
    assert trajectory(_run(*BOOLEANS), TrajectoryParams())["exact_match"] is False


def _run(made: list, wanted: list) -> dict:
    return {"messages": [{"role": "user", "content": "go"},
                         {"role": "assistant", "content": None, "tool_calls": [
                             {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
                             for i, (n, a) in enumerate(made)]}],
            "expected_tool_calls": [{"name": n, "arguments": a} for n, a in wanted]}


def _f1(made: list, wanted: list) -> float:
    return tool_call_f1(_run(made, wanted), ToolCallF1Params())
