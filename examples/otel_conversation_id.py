"""Group an application's model calls into one conversation for evalq.

OpenTelemetry's openai-v2 instrumentation puts no ``gen_ai.conversation.id`` on the spans it makes,
and an attribute set on a parent span does not reach them, so evalq reads each turn as a call of
its own. This span processor copies the id from the context's baggage onto every span started
under it; OpenInference users have ``using_session`` for the same.

    provider.add_span_processor(ConversationId())
    with in_conversation("chat-42"):
        ...  # every model call here is a turn of conversation chat-42
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from opentelemetry import baggage, context
from opentelemetry.sdk.trace import SpanProcessor

KEY = "gen_ai.conversation.id"


class ConversationId(SpanProcessor):
    def on_start(self, span, parent_context=None) -> None:
        value = baggage.get_baggage(KEY, parent_context)
        if value is not None:
            span.set_attribute(KEY, str(value))


@contextlib.contextmanager
def in_conversation(conversation_id: str) -> Iterator[None]:
    token = context.attach(baggage.set_baggage(KEY, conversation_id))
    try:
        yield
    finally:
        context.detach(token)
