"""Fault injection: seeded fault rates and the ``[[sim:...]]`` markers a request
can carry (429, 500, timeout, malformed, their ``-once`` forms, ``delay=``, ``score=``,
and ``<field>=<value>`` for any property of a structured reply)."""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass, field

from evalq.sim.tokens import message_text as _message_text

INJECTED_RETRY_AFTER_S = 1


@dataclass(frozen=True)
class Faults:
    """Seeded random fault rates (probabilities per admitted request, summing to at
    most 1). A timeout hangs ``timeout_seconds``, then drops the connection
    (``timeout_action="drop"``) or sends the normal reply late (``"late"``)."""

    error500: float = 0.0
    timeout: float = 0.0
    malformed: float = 0.0
    timeout_seconds: float = 30.0
    timeout_action: str = "drop"

    def __post_init__(self) -> None:
        rates = (self.error500, self.timeout, self.malformed)
        if any(not 0.0 <= r <= 1.0 for r in rates) or sum(rates) > 1.0 + 1e-9:
            raise ValueError("fault rates must be in [0, 1] and sum to at most 1")
        if self.timeout_seconds < 0:
            raise ValueError("timeout_seconds must be >= 0")
        if self.timeout_action not in ("drop", "late"):
            raise ValueError("timeout_action must be 'drop' or 'late'")


_MARKER = re.compile(r"\[\[sim:([^\]\s]+)\]\]")
_FAULT_KINDS = ("429", "500", "timeout", "malformed")


@dataclass
class Markers:
    faults: dict[str, bool] = field(default_factory=dict)  # kind -> once?
    delay: float = 0.0
    score: int | None = None
    # [[sim:<field>=<value>]] in the last user message: the value of reply
    # properties named <field> (or at the dotted path <field>, e.g. violence.severity)
    fields: dict[str, str] = field(default_factory=dict)
    plain: str = ""  # the last user message without its markers
    # [[sim:echo]] in the last user message: a plain reply repeats that message (its
    # other markers kept), as a model under test would carry an injection into its answer
    echo: str | None = None


def parse_markers(messages: list) -> Markers:
    found = Markers()
    for msg in messages:
        for token in _MARKER.findall(_message_text(msg)):
            token = token.lower()
            kind, once = (token[:-5], True) if token.endswith("-once") else (token, False)
            if kind in _FAULT_KINDS:
                # a plain marker wins over the -once form of the same kind
                found.faults[kind] = found.faults.get(kind, True) and once
            elif token.startswith("delay="):
                with contextlib.suppress(ValueError):
                    found.delay += max(0.0, float(token[6:]))
    for msg in reversed(messages):
        if isinstance(msg, dict) and msg.get("role") == "user":
            text = _message_text(msg)
            scores = re.findall(r"\[\[sim:score=(-?\d+)\]\]", text)
            if scores:
                found.score = int(scores[-1])
            for token in _MARKER.findall(text):
                name, eq, value = token.partition("=")
                if eq and name.lower() not in ("score", "delay"):
                    found.fields[name] = value
            found.plain = _MARKER.sub("", text)
            if re.search(r"\[\[sim:echo\]\]", text, re.I):
                found.echo = re.sub(r" ?\[\[sim:echo\]\]", "", text, flags=re.I).strip()
            break
    return found


def break_json(text: str) -> str:
    """Cut JSON text in half so that it no longer parses."""
    cut = text[: len(text) // 2]
    try:
        json.loads(cut)
    except ValueError:
        return cut
    return '{"score": '
