"""Agent judge metrics (evalq's own prompts, written from Azure AI Evaluation's definitions of its
agent evaluators): 1-5 with a one-line reason, on the judge queues like every judge metric.

The agent's run is shown to the judge as a transcript: each turn, each tool call with its
arguments, each tool result. All of it is material, delimited and escaped like any instance text
(``evalq.workers.metrics.structured.data``): a tool's output is untrusted data, never
instructions, whatever it says.
"""

from __future__ import annotations

import json

from evalq.shared.agents.trajectory import read
from evalq.shared.errors import MetricError
from evalq.shared.judges import JudgeParams
from evalq.workers.metrics.quality import prompt, rate, scale


def transcript(messages: list[dict], upto: int | None = None) -> str:
    """The run as lines a reader follows: turns, calls (name and arguments), results."""
    lines = []
    for msg in messages[:upto]:
        role, content = msg.get("role"), msg.get("content")
        text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False) if content else ""
        if role == "assistant" and msg.get("tool_calls"):
            if text:
                lines.append(f"assistant: {text}")
            for tc in msg["tool_calls"]:
                fn = tc.get("function") or {}
                args = fn.get("arguments")
                args = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
                lines.append(f"assistant calls {fn.get('name')}({args}) [call {tc.get('id')}]")
        elif role == "tool":
            lines.append(f"tool result [call {msg.get('tool_call_id')}]: {text}")
        else:
            lines.append(f"{role}: {text}")
    return "\n".join(lines)


def _tools(instance: dict) -> str | None:
    raw = instance.get("tool_definitions")
    if not raw:
        return None
    tools = []
    for tool in raw:
        fn = tool.get("function", tool)
        tools.append({k: fn.get(k) for k in ("name", "description", "parameters") if fn.get(k) is not None})
    return json.dumps(tools, ensure_ascii=False, indent=1)


def _final(instance: dict) -> str:
    answer = instance.get("actual-output")
    if not answer:
        raise MetricError("the run has no final assistant answer (actual-output)")
    return answer


def intent_resolution(instance: dict, params: JudgeParams, judge) -> dict:
    task = ("Rate INTENT RESOLUTION: did the AGENT identify what the user wanted in the CONVERSATION and "
            "resolve it in its FINAL ANSWER (using its tools where needed)?\n"
            + scale("intent resolution", {1: "the agent misread the intent or did not address it",
                                           2: "the agent addressed the intent poorly, mostly unresolved",
                                           3: "the intent was understood but only partly resolved",
                                           4: "the intent was understood and resolved with minor gaps",
                                           5: "the intent was understood and fully resolved"}))
    return rate(judge, prompt(task, [("CONVERSATION", transcript(instance["messages"])),
                                        ("FINAL ANSWER", _final(instance))]))


def task_adherence(instance: dict, params: JudgeParams, judge) -> dict:
    task = ("Rate TASK ADHERENCE: did the AGENT do the task it was given (the system and user instructions in "
            "the CONVERSATION), within its rules and with the TOOLS it had, without doing something else?\n"
            + scale("task adherence", {1: "the agent ignored the task or broke its rules",
                                        2: "the agent mostly strayed from the task",
                                        3: "the agent followed the task in part",
                                        4: "the agent followed the task with a minor deviation",
                                        5: "the agent followed the task and its rules throughout"}))
    return rate(judge, prompt(task, [("TOOLS", _tools(instance)),
                                        ("CONVERSATION", transcript(instance["messages"])),
                                        ("FINAL ANSWER", instance.get("actual-output"))]))


def response_completeness(instance: dict, params: JudgeParams, judge) -> dict:
    """Best over the references, as HarpIA specifies for several."""
    task = ("Rate RESPONSE COMPLETENESS: does the agent's FINAL ANSWER contain everything the GROUND TRUTH "
            "contains (extra content neither helps nor hurts)?\n"
            + scale("completeness", {1: "the answer has none of the ground truth's information",
                                      2: "the answer has little of it",
                                      3: "the answer has about half of it",
                                      4: "the answer has most of it",
                                      5: "the answer has all of it"}))
    best = None
    for ref in instance["expected-output"]:
        out = rate(judge, prompt(task, [("GROUND TRUTH", ref), ("FINAL ANSWER", _final(instance))]))
        if best is None or out["score"] > best["score"]:
            best = out
    return best


def tool_call_accuracy(instance: dict, params: JudgeParams, judge) -> dict:
    """Each tool call rated on its own (the right tool, the right arguments, given the conversation
    up to it and the tool definitions); the item's score is their mean, each call's verdict beside it."""
    made, _, _ = read(instance)
    if not made:
        raise MetricError("the run made no tool call to rate")
    task = ("Rate this TOOL CALL of the agent: given the CONVERSATION so far and the TOOLS it had, was it the "
            "right tool to call, with the right arguments (taken from the conversation, none invented or "
            "missing)?\n"
            + scale("tool call accuracy", {1: "the wrong tool, or arguments that make the call useless",
                                            2: "a poor choice, or arguments mostly wrong",
                                            3: "a reasonable tool with some wrong or missing arguments",
                                            4: "the right tool, arguments nearly right",
                                            5: "the right tool with exactly the right arguments"}))
    calls = []
    messages = instance["messages"]
    for m, msg in enumerate(messages):
        for tc in msg.get("tool_calls") or [] if msg.get("role") == "assistant" else []:
            fn = tc.get("function") or {}
            call = {"name": fn.get("name"), "arguments": fn.get("arguments")}
            verdict = rate(judge, prompt(task, [("TOOLS", _tools(instance)),
                                                   ("CONVERSATION", transcript(messages, upto=m)),
                                                   ("TOOL CALL", call)]))
            calls.append({"name": call["name"], **verdict})
    return {"score": sum(c["score"] for c in calls) / len(calls), "calls": calls}
