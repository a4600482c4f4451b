"""Done when (issues 33, 38): an Azure AI Evaluation agent dataset (tool calls flat and nested) and a
JSONL of OpenAI chat logs (contents as text and as parts) run unchanged with every agent metric, on
real cpu and judge workers (embedded mode) against judge-sim."""

from __future__ import annotations

import json

import pytest

from evalq.sim import JudgeSim, Region
from tests.agents.test_agent_runs import chat_log
from tests.agents.test_azure_agent import record
from tests.agents.test_conversations import conversation
from tests.agents.test_trajectory import CASES
from tests.conftest import evalq, read_log, read_results

pytestmark = pytest.mark.integration
KEY_ENV = "TEST_EVERY_AGENT_METRIC_API_KEY"
METRICS = ["trajectory", "tool_call_f1", "intent_resolution", "task_adherence", "response_completeness",
           "tool_call_accuracy", "conversation_relevance", "knowledge_retention"]


def openai_chat_logs() -> list[dict]:
    logs = [chat_log(name, CASES[name]) for name in ("same", "parallel", "extra", "wrong argument")]
    chat = conversation("multi-turn", [4, 2, 5], calls=[1, 3])  # three turns, tools in two
    logs.append({"id": chat["id"], "messages": chat["messages"], "tools": chat["tool_definitions"],
                 "expected_tool_calls": [{"name": "weather", "arguments": {"city": "Rome"}}]})
    for log in logs:
        log["ground_truth"] = "A plan for the day."
    return logs


def azure_nested_records() -> list[dict]:
    """Azure's agent samples in the nested tool-call form (issue 38), results as text and objects."""
    from tests.agents.test_agent_shapes import QUERY, TOOLS, nested, response

    return [{"id": f"n{n}", "query": QUERY, "response": response(nested), "tool_definitions": TOOLS,
             "expected_tool_calls": [{"name": "get_orders", "arguments": {"account_number": "888"}},
                                     {"name": "get_order", "arguments": {"order_id": str(123 + n)}}],
             "ground_truth": "Order 123 has shipped; 124 is delayed."} for n in range(2)]


def chat_logs_with_parts() -> list[dict]:
    """OpenAI chat logs whose contents are lists of parts (issue 38)."""
    logs = openai_chat_logs()[:3]
    for log in logs:
        for msg in log["messages"]:
            if isinstance(msg.get("content"), str):
                msg["content"] = [{"type": "text", "text": msg["content"]}]
    return logs


@pytest.mark.parametrize("preset, records", [
    ("azure_agent", [{**record(n, args), "ground_truth": "Order 123 has shipped."}
                     for n, args in enumerate([{"order_id": "123"}, {"order_id": "999"}])]),
    ("azure_agent", azure_nested_records()),
    ("openai_chat", openai_chat_logs()),
    ("openai_chat", chat_logs_with_parts())], ids=["azure", "azure-nested", "chat", "chat-parts"])
def test_every_agent_metric_on_each_format_unchanged(tmp_path, preset, records):
    data = tmp_path / "agents.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    with JudgeSim([Region("lab")], api_key="k", seed=3) as sim:
        judge = {"provider": "openai", "model": "judge-sim", "api_key_env": KEY_ENV, "max_tokens": 100,
                 "deployments": [{"region": "lab", "base_url": sim.base_url("lab"), "tpm": 1_000_000, "rpm": 10_000}]}
        metrics = [{"id": m, "parameters": {"judge": "j"} if m not in ("trajectory", "tool_call_f1") else {}}
                   for m in METRICS]
        job = tmp_path / "job.json"
        job.write_text(json.dumps({"dataset": {"uri": str(data)}, "judges": {"j": judge}, "metrics": metrics}))
        proc = evalq("run", str(job), "--out", str(tmp_path / "out"), env={KEY_ENV: "k"})
    assert proc.returncode == 0, proc.stderr
    assert f"preset {preset}" in proc.stderr  # picked from the records' shape
    lines = read_log(tmp_path / "out")
    assert len(lines) == len(METRICS) * len(records)
    assert [line for line in lines if "error" in line] == []  # every metric scored every run
    results = read_results(tmp_path / "out")
    assert all(results[m]["n"] == len(records) for m in METRICS)
