"""Azure AI Evaluation's agent data (query/response message lists with content parts, flat
tool_definitions), run unchanged through the azure_agent preset with the trajectory and agent judge
metrics' validation."""

from __future__ import annotations

import json

import pytest

from evalq.shared.agents.params import TrajectoryParams
from evalq.workers.agents.trajectory import trajectory
from tests.conftest import evalq, read_log

pytestmark = pytest.mark.integration

TOOLS = [{"name": "get_orders", "description": "Orders of an account.",
          "parameters": {"type": "object", "properties": {"account_number": {"type": "string"}},
                         "required": ["account_number"]}},
         {"name": "get_order", "description": "One order's status.",
          "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}]


def record(n: int, order_args: dict) -> dict:
    """The shape of Azure AI Evaluation's agent evaluator samples."""
    return {
        "id": f"a{n}",
        "query": [{"role": "system", "content": "You are a customer service agent."},
                  {"createdAt": "2025-03-14T06:14:20Z", "role": "user",
                   "content": [{"type": "text", "text": "What is the status of my orders on account #888?"}]}],
        "response": [
            {"createdAt": "2025-03-14T06:14:30Z", "run_id": "0", "role": "assistant",
             "content": [{"type": "tool_call", "tool_call_id": f"t{n}_1", "name": "get_orders",
                          "arguments": {"account_number": "888"}}]},
            {"createdAt": "2025-03-14T06:14:35Z", "run_id": "0", "tool_call_id": f"t{n}_1", "role": "tool",
             "content": [{"type": "tool_result", "tool_result": [{"order_id": "123"}]}]},
            {"createdAt": "2025-03-14T06:14:40Z", "run_id": "0", "role": "assistant",
             "content": [{"type": "tool_call", "tool_call_id": f"t{n}_2", "name": "get_order",
                          "arguments": order_args}]},
            {"createdAt": "2025-03-14T06:14:45Z", "run_id": "0", "tool_call_id": f"t{n}_2", "role": "tool",
             "content": [{"type": "tool_result", "tool_result": {"status": "shipped"}}]},
            {"createdAt": "2025-03-14T06:14:50Z", "run_id": "0", "role": "assistant",
             "content": [{"type": "text", "text": "Order 123 has shipped."}]}],
        "tool_definitions": TOOLS,
        "expected_tool_calls": [{"name": "get_orders", "arguments": {"account_number": "888"}},
                                {"name": "get_order", "arguments": {"order_id": "123"}}]}


def test_azure_agent_records_run_unchanged(tmp_path):
    data = tmp_path / "azure_agent.jsonl"
    data.write_text("".join(json.dumps(record(n, args)) + "\n" for n, args in
                            enumerate([{"order_id": "123"}, {"order_id": "999"}])))
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"dataset": {"uri": str(data)}, "metrics": [{"id": "trajectory"}]}))
    proc = evalq("run", str(job), "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert "preset azure_agent" in proc.stderr
    got = {line["instance_id"]: line["result"] for line in read_log(tmp_path / "out")}
    assert got["a0"]["exact_match"] and got["a0"]["valid_arguments"] == 1.0
    assert (got["a1"]["exact_match"], got["a1"]["argument_accuracy"], got["a1"]["extra_calls"]) == (False, 0.5, 1)
    from evalq.shared.agents.azure import to_instance

    inst = to_instance({"id": "x", **{k: v for k, v in record(0, {"order_id": "123"}).items() if k != "id"},
                        "tool_definitions": TOOLS})
    assert trajectory(inst, TrajectoryParams()) == got["a0"]
    assert inst["input"] == "What is the status of my orders on account #888?"
    assert inst["actual-output"] == "Order 123 has shipped."
    assert inst["messages"][3]["content"] == json.dumps([{"order_id": "123"}])  # the tool's result, kept


def test_a_part_of_another_type_is_kept_and_an_unreadable_one_is_located(tmp_path):
    """A part that is not text, a call or a result (an image) is kept with its message, never
    dropped; a part evalq cannot read at all is an error named where the record has it."""
    from evalq.shared.agents.azure import to_instance
    from evalq.shared.agents.trajectory import check

    kept = record(0, {"order_id": "123"})
    kept["response"][0]["content"].append({"type": "image_url", "image_url": {"url": "http://x"}})
    inst = to_instance({k: v for k, v in kept.items()})
    assert check(inst) == [] and inst["messages"][2]["parts"] == [{"type": "image_url", "image_url": {"url": "http://x"}}]
    bad = record(0, {"order_id": "123"})
    bad["response"][0]["content"].append("not a part")
    bad["response"][2]["content"][0]["name"] = "teleport"
    data = tmp_path / "azure_agent.jsonl"
    data.write_text(json.dumps(kept) + "\n" + json.dumps(bad) + "\n")
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"dataset": {"uri": str(data)}, "metrics": [{"id": "trajectory"}]}))
    proc = evalq("validate", str(job))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "line 2: response[0].content[1]: expected a content part with a type, got a string" in proc.stderr
    assert "line 1" not in proc.stderr
