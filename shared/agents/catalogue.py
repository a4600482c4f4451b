"""Registry entries for the agent metrics."""

from __future__ import annotations

from evalq.shared.agents.params import ToolCallF1Params, TrajectoryParams, TurnsParams
from evalq.shared.judging.judges import JudgeParams
from evalq.shared.metrics.registry import REGISTRY, MetricSpec

AGENT_RUN = ("messages", "expected_tool_calls")

REGISTRY.register(MetricSpec(
    id="trajectory", params=TrajectoryParams, impl="evalq.workers.agents.trajectory:trajectory", queue="cpu",
    requires=AGENT_RUN, worse=(("extra_calls", "higher"), ("missing_calls", "higher")),
    description="The tool calls made against the calls expected, no judge: exact_match, in_order_match, "
    "any_order_match, precision, recall, f1 (one-to-one), argument_accuracy, extra_calls, missing_calls, "
    "sequence_accuracy (ragas' ToolCallAccuracy) and valid_arguments (JSON schema of each tool)."))

REGISTRY.register(MetricSpec(
    id="tool_call_f1", params=ToolCallF1Params, impl="evalq.workers.agents.trajectory:tool_call_f1", queue="cpu",
    bounds=(0.0, 1.0), requires=AGENT_RUN,
    description="ragas' ToolCallF1: F1 of the distinct (name, arguments) calls made against those expected."))

# Judge metrics over the agent's run (Azure AI Evaluation's agent evaluators, evalq's own prompts): 1-5
# with a one-line reason, on the judge queues, batchable like the others.
# The metrics over ``messages`` score the last assistant turn or, with ``turns: all``, every one.
_JUDGED = [
    ("intent_resolution", TurnsParams, ("messages",),
     "Did the agent identify the user's intent and resolve it? 1-5, per turn (turns: last|all)."),
    ("task_adherence", TurnsParams, ("messages",),
     "Did the agent do the task it was given, within its rules and tools? 1-5, per turn (turns: last|all)."),
    ("response_completeness", JudgeParams, ("actual-output", "expected-output"),
     "Does the final answer hold everything the ground truth holds? 1-5, best over references."),
    # conversation-level: the whole exchange, seen once
    ("conversation_relevance", JudgeParams, ("messages",),
     "Is every assistant turn relevant to what the user asked at that point? 1-5, the whole conversation."),
    ("knowledge_retention", JudgeParams, ("messages",),
     "Does the assistant keep what the user told it earlier, never forgetting or contradicting it? 1-5, "
     "the whole conversation."),
]
for _id, _params, _needs, _description in _JUDGED:
    REGISTRY.register(MetricSpec(id=_id, params=_params, impl=f"evalq.workers.agents.judged:{_id}",
                                 queue="judge", requires=_needs, aggregation="rating", chunk_size=4,
                                 description=_description))

REGISTRY.register(MetricSpec(
    id="tool_call_accuracy", params=TurnsParams, impl="evalq.workers.agents.judged:tool_call_accuracy",
    queue="judge", requires=("messages",), bounds=(1.0, 5.0), chunk_size=2,
    description="Each tool call rated 1-5 by the judge (the right tool, the right arguments, given the "
    "conversation so far and the tool definitions); the mean per turn, each call's verdict beside it; the last "
    "turn that called a tool, or every one (turns: all)."))
