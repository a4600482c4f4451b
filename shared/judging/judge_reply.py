"""What a judge call returns to a metric: the reply's text (or tool-call arguments) and
what it cost. Made by the judge client, by the job's reply memo and cache, and by the
capacity planner's stand-in judge."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Reply:
    content: str | None
    tool_arguments: str | None
    usage: dict = field(default_factory=dict)
    cached: bool = False
    model: str | None = None  # the model the provider says answered (a dated version behind an alias)

    def text(self) -> str:
        return self.tool_arguments if self.tool_arguments is not None else (self.content or "")


def reply_from_completion(completion) -> Reply:
    """A chat completion (the ``openai`` SDK's ``ChatCompletion``, from a synchronous
    call or read from a batch's output file) as a Reply: the first choice's text,
    its first tool call's arguments, and the ``usage`` as the SDK dumps it."""
    usage = completion.usage.model_dump() if completion.usage else {}
    message = completion.choices[0].message
    tool_arguments = message.tool_calls[0].function.arguments if message.tool_calls else None
    return Reply(message.content, tool_arguments, usage, model=getattr(completion, "model", None) or None)


def reply_from_json(completion: dict) -> Reply:
    """A chat completion as its JSON says it (a synchronous call's: ``evalq.workers.judge.dialects.
    post_chat``) as a Reply, the same as ``reply_from_completion`` makes of the SDK's model of it: the
    first choice's text, its first tool call's arguments, and the ``usage`` with the fields the SDK's
    dump of it always has (a batch line's reply and a synchronous one's are alike)."""
    message = completion["choices"][0]["message"]
    calls = message.get("tool_calls")
    tool_arguments = calls[0]["function"]["arguments"] if calls else None
    usage = completion.get("usage")
    if isinstance(usage, dict):
        usage = {**usage}
        for name in _USAGE_DETAILS:
            usage.setdefault(name, None)
    return Reply(message.get("content"), tool_arguments, usage or {}, model=completion.get("model") or None)


_USAGE_DETAILS = ("completion_tokens_details", "prompt_tokens_details")  # (the SDK's CompletionUsage's)
