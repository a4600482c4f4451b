"""Agent runs end to end: a JSON Lines file of OpenAI chat logs (the openai_chat preset: messages
with tool calls and results, the request's tools, the expected calls), scored by the trajectory
metrics on real cpu workers in chunks; and validation that names the line and the call."""

from __future__ import annotations

import json

import pytest

from tests.agents.test_trajectory import CASES
from evalq.shared.agents.params import ToolCallF1Params, TrajectoryParams
from evalq.workers.agents.trajectory import tool_call_f1, trajectory
from tests.conftest import evalq, read_log, read_results

pytestmark = pytest.mark.integration


def chat_log(name: str, inst: dict) -> dict:
    """A logged Chat Completions exchange, as a team would keep it."""
    inst = json.loads(json.dumps(inst))  # a copy: tests change theirs
    return {"id": name.replace(" ", "-"), "messages": inst["messages"], "tools": inst["tool_definitions"],
            "expected_tool_calls": inst["expected_tool_calls"], "category": "parallel" if "parallel" in name else "serial"}


def test_chat_logs_run_unchanged_with_the_trajectory_metrics(tmp_path):
    data = tmp_path / "agent.jsonl"
    data.write_text("".join(json.dumps(chat_log(n, i)) + "\n" for n, i in CASES.items()))
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"dataset": {"uri": str(data)},
                               "metrics": [{"id": "trajectory"}, {"id": "tool_call_f1"},
                                           {"id": "trajectory", "name": "trajectory_subset",
                                            "parameters": {"argument_match": "subset", "strict_order": False}}]}))
    proc = evalq("run", str(job), "--out", str(tmp_path / "out"), "--chunk-size", "3")
    assert proc.returncode == 0, proc.stderr
    assert "preset openai_chat" in proc.stderr  # picked from the records' shape, and said
    log = read_log(tmp_path / "out")
    by = {(line.get("name") or line["metric"], line["instance_id"]): line["result"] for line in log}
    for name, inst in CASES.items():
        key = name.replace(" ", "-")
        assert by[("trajectory", key)] == trajectory(inst, TrajectoryParams())
        assert by[("trajectory_subset", key)] == trajectory(inst, TrajectoryParams(argument_match="subset",
                                                                                    strict_order=False))
        assert by[("tool_call_f1", key)] == tool_call_f1(inst, ToolCallF1Params())
    results = read_results(tmp_path / "out")
    f1s = [trajectory(i, TrajectoryParams())["f1"] for i in CASES.values()]
    assert results["trajectory"]["score"]["f1"] == pytest.approx(sum(f1s) / len(f1s))
    assert results["trajectory"]["score"]["extra_calls"] == pytest.approx(
        sum(trajectory(i, TrajectoryParams())["extra_calls"] for i in CASES.values()) / len(CASES))
    assert set(results["trajectory"]["categories"]) == {"parallel", "serial"}
    # report.html: the worst runs' calls made against the calls expected, side by side
    page = (tmp_path / "out" / "report.html").read_text()
    wrong = page[page.index("<code>wrong-argument</code>"):]
    wrong = wrong[:wrong.index("</details>")]
    assert ("<tr><td><code>weather({&quot;city&quot;: &quot;Milan&quot;})</code></td>"
            "<td><code>weather({&quot;city&quot;: &quot;Rome&quot;})</code></td>"
            "<td class='arguments'>arguments differ</td>") in wrong
    assert wrong.count("<td class='same'>same</td>") == 2
    nothing = page[page.index("<code>nothing-called</code>"):]
    assert nothing[:nothing.index("</details>")].count("<td class='missing'>missing</td>") == 3
    extra = page[page.index("<code>extra</code>"):]
    assert extra[:extra.index("</details>")].count("<td class='extra'>extra</td>") == 1


def test_a_call_to_an_undefined_tool_is_exit_2_naming_the_line(tmp_path):
    records = [chat_log(n, i) for n, i in list(CASES.items())[:3]]
    records[1]["messages"][1]["tool_calls"][0]["function"]["name"] = "teleport"
    records[2]["messages"][1]["tool_calls"][0]["function"]["arguments"] = "{not json"
    data = tmp_path / "agent.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"dataset": {"uri": str(data)}, "metrics": [{"id": "trajectory"}]}))
    proc = evalq("validate", str(job))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{data} line 2: messages[1].tool_calls[0]: calls 'teleport', which tool_definitions do not define" \
        in proc.stderr
    assert f"{data} line 3: messages[1].tool_calls[0] (weather): arguments are not JSON" in proc.stderr


def test_a_run_larger_than_the_run_bound_is_exit_2_naming_the_line(tmp_path):
    """Before: 502 messages were refused, but 100 calls with 200 kB tool results each (a 20 MB run,
    all of it in every judge prompt) validated. A run's text is bounded (EVALQ_MAX_RUN_BYTES)."""
    from tests.agents.test_trajectory import S, run

    big = run(*[[S]] * 100, expected=[S])
    for msg in big["messages"]:
        if msg["role"] == "tool":
            msg["content"] = "x" * 120_000  # 12 MB in all: under the 16 MiB a record may have
    records = [chat_log("small", CASES["same"]), chat_log("big", big)]
    data = tmp_path / "agent.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"dataset": {"uri": str(data)}, "metrics": [{"id": "trajectory"}]}))
    proc = evalq("validate", str(job))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{data} line 2: " in proc.stderr and "the run has 12,0" in proc.stderr
    assert "bytes of text, over the limit of 1,048,576 (EVALQ_MAX_RUN_BYTES raises it)" in proc.stderr
    assert f"{data} line 1" not in proc.stderr
    raised = evalq("validate", str(job), env={"EVALQ_MAX_RUN_BYTES": "30000000"})
    assert raised.returncode == 0, raised.stderr


def test_compare_reads_more_extra_calls_as_worse(tmp_path):
    """Two nights of the same agent: the second makes an extra call in every run. compare pairs the
    runs and reads extra_calls up and precision down both as worse, recall as unmoved."""
    from tests.agents.test_trajectory import S, W, B, run

    outs = []
    for night, calls in (("base", [[S], [W], [B]]), ("new", [[S], [W], [("search", {"q": "again"})], [B]])):
        records = [{**chat_log(f"r{n}", run(*calls, expected=[S, W, B])), "id": f"r{n}"} for n in range(10)]
        data = tmp_path / f"{night}.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in records))
        job = tmp_path / f"{night}.json"
        job.write_text(json.dumps({"dataset": {"uri": str(data)}, "metrics": [{"id": "trajectory"}]}))
        proc = evalq("run", str(job), "--out", str(tmp_path / night))
        assert proc.returncode == 0, proc.stderr
        outs.append(str(tmp_path / night))
    proc = evalq("compare", *outs, "--json", "--html", str(tmp_path / "compare.html"))
    assert proc.returncode == 0, proc.stderr
    fields = json.loads(proc.stdout)["entries"][0]["fields"]
    assert fields["extra_calls"]["diff"] == 1 and fields["extra_calls"]["worse"] == "higher"
    assert fields["extra_calls"]["moved"] == "worse" and fields["precision"]["moved"] == "worse"
    assert fields["recall"]["diff"] == 0 and fields["recall"]["moved"] is None
    assert "<td class=fail>worse</td>" in (tmp_path / "compare.html").read_text()
