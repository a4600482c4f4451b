"""Runs inside the ragas reference environment (``.venv-ragas``, see the Makefile) and scores tool
calls with ragas' own ToolCallAccuracy and ToolCallF1 (deterministic: no LLM is called).

A request: ``{"op": "tool_calls", "cases": [{"made": [[name, args], ...], "expected": [...],
"strict_order": bool}]}``; an answer: ``[{"tool_call_accuracy": x, "tool_call_f1": y}, ...]``."""

import json
import sys
import warnings

ANSWERS = sys.stdout
sys.stdout = sys.stderr

import asyncio  # noqa: E402

from ragas.dataset_schema import MultiTurnSample  # noqa: E402
from ragas.messages import AIMessage, HumanMessage, ToolCall  # noqa: E402
from ragas.metrics import ToolCallAccuracy, ToolCallF1  # noqa: E402

warnings.simplefilter("ignore")  # ragas warns on every length mismatch


def tool_calls(case):
    made = [ToolCall(name=n, args=a) for n, a in case["made"]]
    messages = [HumanMessage(content="go")] + ([AIMessage(content="", tool_calls=made)] if made else [])
    sample = MultiTurnSample(user_input=messages,
                             reference_tool_calls=[ToolCall(name=n, args=a) for n, a in case["expected"]])
    accuracy = asyncio.run(ToolCallAccuracy(strict_order=case["strict_order"]).multi_turn_ascore(sample))
    f1 = asyncio.run(ToolCallF1().multi_turn_ascore(sample))
    return {"tool_call_accuracy": float(accuracy), "tool_call_f1": float(f1)}


OPS = {"tool_calls": tool_calls}

if __name__ == "__main__":
    print("ready", file=ANSWERS, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        print(json.dumps([OPS[request["op"]](case) for case in request["cases"]]), file=ANSWERS, flush=True)
