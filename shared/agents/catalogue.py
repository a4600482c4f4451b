"""Registry entries for the agent metrics."""

from __future__ import annotations

from evalq.shared.agents.params import ToolCallF1Params, TrajectoryParams
from evalq.shared.registry import REGISTRY, MetricSpec

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
