"""Conversations: metrics over ``messages`` score the last assistant turn (default) or every one
(``turns: all``, per-turn results in the log, a conversation-level aggregate in results.json);
conversation-level judge metrics see the whole exchange once. On real judge workers with judge-sim,
whose ``[[sim:score=N]]`` markers sit in each turn's answer (and in a call's arguments), so each
turn's verdict says which turn the judge was shown."""

from __future__ import annotations

import uuid

import pytest

from evalq.shared.agents.conversation import turn_view, turns
from evalq.shared.agents.params import TurnsParams
from evalq.shared.scores.aggregate import RatingAggregator
from evalq.workers.agents.judged import intent_resolution, tool_call_accuracy
from tests.agents.test_agent_judges import Recorder, judged_run
from tests.agents.test_trajectory import TOOLS, call
from tests.conftest import read_log, read_results


def conversation(cid: str, scores: list[int], calls: list[int] | None = None) -> dict:
    """A support chat of len(scores) turns; turn k's answer carries the marker scores[k]; the turns
    listed in ``calls`` first call ``weather`` (its arguments marked with the same score)."""
    nonce = uuid.uuid4().hex[:8]
    messages = [{"role": "system", "content": "You are a travel agent."}]
    for k, score in enumerate(scores, 1):
        messages.append({"role": "user", "content": f"question {k} of chat {cid} {nonce}"})
        if k in (calls or []):
            tc = call(k, "weather", {"city": f"Rome {k} [[sim:score={score}]]"})
            messages += [{"role": "assistant", "content": None, "tool_calls": [tc]},
                         {"role": "tool", "tool_call_id": tc["id"], "content": "sunny"}]
        messages.append({"role": "assistant", "content": f"answer {k} [[sim:score={score}]]"})
    return {"id": cid, "messages": messages, "tool_definitions": TOOLS, "actual-output": messages[-1]["content"]}


def test_turns_split_at_user_messages_with_the_history_before_each():
    chat = conversation("c", [1, 2, 3], calls=[2])
    found = turns(chat["messages"], chat["actual-output"])
    assert [t.number for t in found] == [1, 2, 3]
    assert [t.answer for t in found] == [f"answer {k} [[sim:score={k}]]" for k in (1, 2, 3)]
    second = turn_view(chat, found[1])
    assert second["messages"][-1]["content"] == "answer 2 [[sim:score=2]]"  # up to its end, nothing later
    assert second["actual-output"] == "answer 2 [[sim:score=2]]"
    # a record keeping the final answer apart from the history (HarpIA's): the last turn is still there
    apart = {"messages": chat["messages"][:-1], "actual-output": "the final answer"}
    assert turns(apart["messages"], apart["actual-output"])[-1].answer == "the final answer"
    # a turn in which the assistant only called tools has no answer of its own
    only_calls = chat["messages"][:5] + [{"role": "user", "content": "and then?"}]
    assert [t.answer for t in turns(only_calls)] == ["answer 1 [[sim:score=1]]", None]


def test_the_last_turn_is_scored_by_default_and_every_turn_on_its_own_history():
    chat = conversation("c", [4, 2, 5])
    judge = Recorder()
    intent_resolution(chat, TurnsParams(judge="j"), judge)
    assert len(judge.prompts) == 1 and "answer 3" in judge.prompts[0]  # the last turn, not the first
    judge = Recorder()
    out = intent_resolution(chat, TurnsParams(judge="j", turns="all"), judge)
    assert [t["turn"] for t in out["turns"]] == [1, 2, 3]
    for k, seen in enumerate(judge.prompts, 1):  # each turn judged on the conversation up to it
        assert f"answer {k}" in seen and f"question {k + 1}" not in seen
    assert out["score"] == 3 and out["reason"].startswith("turn 1 of 3")


def test_tool_call_accuracy_rates_the_calls_of_the_scored_turns():
    chat = conversation("c", [1, 2, 3], calls=[1, 2])
    judge = Recorder()
    out = tool_call_accuracy(chat, TurnsParams(judge="j"), judge)  # the last turn that called a tool
    assert len(judge.prompts) == 1 and "Rome 2" in judge.prompts[0] and [c["name"] for c in out["calls"]] == ["weather"]
    out = tool_call_accuracy(chat, TurnsParams(judge="j", turns="all"), Recorder())
    assert [t["turn"] for t in out["turns"]] == [1, 2]  # turn 3 called nothing


def test_a_conversation_counts_once_and_each_turn_in_the_distribution():
    agg = RatingAggregator({"threshold": 3})
    agg.add({"result": {"score": 3.0, "turns": [{"turn": 1, "score": 1}, {"turn": 2, "score": 5}]}})
    agg.add({"result": {"score": 4.0, "turns": [{"turn": 1, "score": 4}, {"turn": 2, "error": "x"}]}})
    part = RatingAggregator({"threshold": 3})
    part.merge(agg.state())
    out = part.score()
    assert out["mean"] == pytest.approx(3.5)
    assert out["distribution"] == {"1": 1, "2": 0, "3": 0, "4": 1, "5": 1}
    assert out["pass_rate"] == 0.5  # the first has a turn under the threshold
    assert out["turns"] == {"rated": 3, "failed": 1, "mean": pytest.approx(10 / 3), "last_mean": pytest.approx(4.5),
                            "lowest_mean": pytest.approx(2.5)}


@pytest.mark.integration
def test_conversations_on_real_judge_workers(redis_url, tmp_path):
    chats = [conversation("a", [2, 4, 5], calls=[1, 3]), conversation("b", [3, 1], calls=[2]),
             conversation("c", [5])]
    chats[1]["messages"][-1]["content"] += " [[sim:malformed]]"  # the judge cannot rate b's last turn
    chats[1]["actual-output"] = chats[1]["messages"][-1]["content"]
    metrics = [{"id": "intent_resolution", "name": "last", "parameters": {"judge": "j"}},
               {"id": "intent_resolution", "name": "every turn", "parameters": {"judge": "j", "turns": "all"}},
               {"id": "tool_call_accuracy", "name": "calls", "parameters": {"judge": "j", "turns": "all"}},
               {"id": "conversation_relevance", "parameters": {"judge": "j"}},
               {"id": "knowledge_retention", "parameters": {"judge": "j"}}]
    judged_run(redis_url, tmp_path, chats, metrics)
    lines = {(line.get("name") or line["metric"], line["instance_id"]): line for line in read_log(tmp_path / "out")}
    assert lines["last", "a"]["result"]["score"] == 5 and "turns" not in lines["last", "a"]["result"]
    assert "error" in lines["last", "b"]  # its only scored turn could not be rated
    every = lines["every turn", "a"]["result"]
    assert [(t["turn"], t["score"]) for t in every["turns"]] == [(1, 2), (2, 4), (3, 5)]
    assert every["score"] == pytest.approx(11 / 3)
    b_turns = lines["every turn", "b"]["result"]["turns"]
    assert b_turns[0]["score"] == 3 and "error" in b_turns[1]  # recorded on the turn; the conversation goes on
    assert [[c["score"] for c in t["calls"]] for t in lines["calls", "a"]["result"]["turns"]] == [[2], [5]]
    for metric in ("conversation_relevance", "knowledge_retention"):  # the whole exchange, seen once
        assert lines[metric, "a"]["result"]["score"] == 5 and lines[metric, "c"]["result"]["score"] == 5
    results = read_results(tmp_path / "out")
    every = results["every turn"]["score"]
    assert every["mean"] == pytest.approx((11 / 3 + 3 + 5) / 3)
    assert every["turns"] == {"rated": 5, "failed": 1, "mean": pytest.approx((2 + 4 + 5 + 3 + 5) / 5),
                              "last_mean": pytest.approx((5 + 3 + 5) / 3), "lowest_mean": pytest.approx((2 + 3 + 5) / 3)}
    assert every["distribution"] == {"1": 0, "2": 1, "3": 1, "4": 1, "5": 2}
    # one call per conversation, whatever its length; b's unreadable verdict was asked again once
    assert results["conversation_relevance"]["judge"]["calls"] == 3 + 1
    # report.html: each turn's score and reason, and the judge's verdict beside each call it rated
    page = (tmp_path / "out" / "report.html").read_text()
    assert "<tr><th>turn</th><th>score</th><th>judge reason</th></tr><tr><td>1</td><td>2</td>" in page
    assert "every turn: turns per score" in page and "last: items per score" in page
    assert "<td><code>weather({&quot;city&quot;: &quot;Rome 3 [[sim:score=5]]&quot;})</code></td><td></td><td></td>" \
           "<td>5: " in page


def test_side_by_side_pairs_the_longest_run_of_the_same_tools():
    from evalq.shared.agents.trajectory import Call, side_by_side

    s, w, b = Call("search", {"q": 1}), Call("weather", {"city": "Rome"}), Call("book", {})
    rows = side_by_side([w, s, Call("weather", {"city": "Milan"}), b], [s, w, b])
    assert [(a and a.name, e and e.name, status) for a, e, status in rows] == [
        ("weather", None, "extra"), ("search", "search", "same"), ("weather", "weather", "arguments differ"),
        ("book", "book", "same")]
    assert [status for _, _, status in side_by_side([], [s])] == ["missing"]
