"""Runs inside the Azure AI Evaluation reference environment (``.venv-azure``, see the Makefile) and
reads agent messages with azure-ai-evaluation's own parser (no model is called).

Ops, each over ``cases``:
- ``tool_calls_results``: a ``response`` message list -> the ``[TOOL_CALL] name(k=v)`` /
  ``[TOOL_RESULT] ...`` lines its evaluators show a judge (``_get_tool_calls_results`` after its
  ``_preprocess_messages``);
- ``has_tool_calls``: ``{"query", "response", "tool_definitions"}`` -> false when
  ToolCallAccuracyEvaluator answers "not applicable" for lack of a tool call;
- ``text``: a message ``content`` given as parts -> its text as Azure reads it (text parts joined by
  line breaks)."""

import copy
import json
import sys
import warnings

ANSWERS = sys.stdout
sys.stdout = sys.stderr
warnings.simplefilter("ignore")

from azure.ai.evaluation import ToolCallAccuracyEvaluator  # noqa: E402
from azure.ai.evaluation._common.utils import (_extract_text_from_content, _get_tool_calls_results,  # noqa: E402
                                               _preprocess_messages)

_EVALUATOR = None


def evaluator():
    global _EVALUATOR
    if _EVALUATOR is None:  # a configuration is required, never used: nothing is called
        _EVALUATOR = ToolCallAccuracyEvaluator(model_config={
            "azure_endpoint": "http://127.0.0.1:9", "azure_deployment": "unused", "api_key": "unused",
            "api_version": "2024-10-21"})
    return _EVALUATOR


def tool_calls_results(response):
    return _get_tool_calls_results(_preprocess_messages(copy.deepcopy(response)))


def has_tool_calls(case):
    converted = evaluator()._convert_kwargs_to_eval_input(**copy.deepcopy(case))
    return converted.get("error_message") != ToolCallAccuracyEvaluator._NO_TOOL_CALLS_MESSAGE


def text(content):
    return "\n".join(_extract_text_from_content(content))


OPS = {"tool_calls_results": tool_calls_results, "has_tool_calls": has_tool_calls, "text": text}

if __name__ == "__main__":
    print("ready", file=ANSWERS, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        print(json.dumps([OPS[request["op"]](case) for case in request["cases"]]), file=ANSWERS, flush=True)
