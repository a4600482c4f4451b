"""Capacity a deployment learns (issue 62): what ``"tpm": "auto"``, ``"rpm": "auto"`` and
``"capacity": "adaptive"`` mean, how a provider's rate-limit headers are read, and where the
learned values live in Redis. The learning itself is the workers' (``evalq.workers.judge.learning``
for TPM/RPM, ``evalq.workers.judge.concurrency`` for the concurrency limit); the history of the
limits is read for run.json by ``evalq.results.limits``.

Two modes, either or both on one deployment:

- **Learned quota** (``tpm``/``rpm`` ``"auto"``): the cluster-wide budget starts at the floor
  (``tpm_floor``, ``rpm_floor``) and takes what the provider says: a stated limit
  (``x-ratelimit-limit-tokens``/``-requests``, ``ratelimit-limit`` with ``ratelimit-policy``'s
  window) is the limit; a remaining count alone (Azure OpenAI sends only
  ``x-ratelimit-remaining-*``) is added to what the cluster has in the window now; where no header
  says anything, the limit grows while the budget is what holds calls back and no 429 comes,
  and a 429 cuts it by a fifth (AIMD), never below the floor. Never above the ceiling
  (``tpm_ceiling``, ``rpm_ceiling``; an operator's catalogue sets them, a job may only lower them).
- **Adaptive concurrency** (``"capacity": "adaptive"``, the default of a deployment that states
  neither TPM nor RPM: a self-hosted server has no quota to state): a cluster-wide limit on calls
  in flight, grown while latency stays within ``latency_tolerance`` of the least seen and no call
  is refused, cut on rising latency, 429, 503 or a timeout.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, model_validator

from evalq.shared.core import bounds
from evalq.shared.core.strict import Strict

AUTO = "auto"
DEFAULT_TPM_FLOOR = 30_000   # where an "auto" TPM starts until a header says more (about 50 small calls a minute)
DEFAULT_RPM_FLOOR = 60
MAX_CONCURRENCY = 4_096


class Concurrency(Strict):
    """The bounds of an adaptive deployment's cluster-wide concurrency limit."""

    # 1: the first rounds then measure the server unloaded, the least latency every later round is
    # held to (begun at 4 on a server of 2 slots, that least was twice the truth, and the limit
    # settled at 5x the knee's latency); slow start doubles it each round from there
    start: int = Field(default=1, ge=1, le=MAX_CONCURRENCY, description="calls in flight to begin with")
    min: int = Field(default=1, ge=1, le=MAX_CONCURRENCY, description="the least it is cut to")
    max: int = Field(default=64, ge=1, le=MAX_CONCURRENCY, description="the most it grows to (the operator's "
                     "ceiling in a catalogue)")
    latency_tolerance: float = Field(default=2.0, gt=1.0, le=20.0, allow_inf_nan=False,
                                     description="a round's median latency above this many times the least "
                                     "seen is a sign of queueing: the limit is cut")

    @model_validator(mode="after")
    def _ordered(self) -> "Concurrency":
        if not self.min <= self.start <= self.max:
            raise ValueError(f"expected min <= start <= max, got {self.min}, {self.start}, {self.max}")
        return self


def fill_capacity(data: Any) -> Any:
    """A deployment's raw fields with ``capacity`` filled in: ``adaptive`` where it states neither
    ``tpm`` nor ``rpm`` (a self-hosted server has no quota to state), else ``fixed``."""
    if isinstance(data, dict) and data.get("capacity") is None:
        data = {**data, "capacity": "adaptive" if data.get("tpm") is None and data.get("rpm") is None else "fixed"}
    return data


def check_limits(d) -> None:
    """ValueError when a deployment's limit fields do not fit together."""
    for axis in ("tpm", "rpm"):
        value, floor, ceiling = getattr(d, axis), getattr(d, f"{axis}_floor"), getattr(d, f"{axis}_ceiling")
        if value != AUTO and (floor is not None or ceiling is not None):
            raise ValueError(f"{axis}_floor and {axis}_ceiling are for \"{axis}\": \"auto\"")
        if floor is not None and ceiling is not None and floor > ceiling:
            raise ValueError(f"{axis}_floor ({floor}) is above {axis}_ceiling ({ceiling})")
    if d.capacity == "fixed" and d.tpm is None and d.rpm is None:
        raise ValueError("a deployment of fixed capacity states 'tpm' or 'rpm' (a number, or \"auto\" to learn "
                         "it); without them say \"capacity\": \"adaptive\"")
    if d.concurrency is not None and d.capacity != "adaptive":
        raise ValueError("'concurrency' bounds are for \"capacity\": \"adaptive\"")


def start_of(value: int | str | None, floor: int | None, default_floor: int, unlimited: int) -> int:
    """The number a budget starts with: a stated one, an ``auto`` one's floor, or no limit."""
    if isinstance(value, int):
        return value
    if value == AUTO:
        return floor or default_floor
    return unlimited


def ceiling_of(value: int | str | None, ceiling: int | None, unlimited: int) -> int:
    """The most a budget may hold: a stated number, an ``auto`` one's ceiling, or no limit."""
    if isinstance(value, int):
        return value
    return ceiling or unlimited


def describe(d) -> str:
    """How a deployment's capacity is decided, in a few words (``evalq plan``)."""
    parts = []
    for axis in ("tpm", "rpm"):
        value = getattr(d, axis)
        if value == AUTO:
            ceiling = getattr(d, f"{axis}_ceiling")
            parts.append(f"{axis.upper()} learned from {getattr(d, f'{axis}_start'):,}"
                         + (f" up to {ceiling:,}" if ceiling else ""))
        elif isinstance(value, int):
            parts.append(f"{axis.upper()} {value:,}")
    if d.capacity == "adaptive":
        c = d.concurrency or Concurrency()
        parts.append(f"adaptive concurrency from {c.start} ({c.min}-{c.max})")
    return ", ".join(parts)


# -- what providers say -------------------------------------------------------------------------

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_SCALE = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration(text: str | None) -> float | None:
    """``x-ratelimit-reset-*`` as seconds: ``"6m0s"``, ``"1s"``, ``"20ms"``, or a bare number of seconds."""
    if not text:
        return None
    text = text.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    found = _DURATION.findall(text)
    if not found or "".join(n + u for n, u in found) != text.replace(" ", ""):
        return None
    return sum(float(n) * _SCALE[u] for n, u in found)


def _number(headers, *names: str) -> float | None:
    for name in names:
        value = headers.get(name)
        if value is None:
            continue
        try:
            number = float(str(value).split(",")[0].split(";")[0].strip())
        except ValueError:
            continue
        if number >= 0:
            return number
    return None


def _policy_window(headers) -> float | None:
    """``ratelimit-policy: 100;w=60`` (the IETF draft's form): the policy's window in seconds."""
    raw = headers.get("ratelimit-policy")
    if not raw:
        return None
    match = re.search(r"\bw=(\d+(?:\.\d+)?)", str(raw))
    return float(match.group(1)) if match else None


def rate_headers(headers, window: float) -> dict[str, float]:
    """What a reply's headers say of the deployment's limits, per ``window`` seconds: any of
    ``tokens_limit``, ``tokens_remaining``, ``requests_limit``, ``requests_remaining``,
    ``tokens_reset``, ``requests_reset`` (seconds). OpenAI's and Azure's ``x-ratelimit-*``, and the
    generic ``ratelimit-limit``/``-remaining``/``-reset`` (with ``ratelimit-policy``'s ``w=``),
    counted as requests. Unreadable values are left out."""
    said: dict[str, float] = {}
    for kind in ("tokens", "requests"):
        limit = _number(headers, f"x-ratelimit-limit-{kind}")
        remaining = _number(headers, f"x-ratelimit-remaining-{kind}")
        reset = duration(headers.get(f"x-ratelimit-reset-{kind}"))
        if kind == "requests" and limit is None and remaining is None:
            limit = _number(headers, "ratelimit-limit")
            remaining = _number(headers, "ratelimit-remaining")
            reset = duration(headers.get("ratelimit-reset"))
            w = _policy_window(headers)
            if w and limit is not None:  # a limit per w seconds, per the budget's window
                limit = limit * window / w
        for name, value in (("limit", limit), ("remaining", remaining), ("reset", reset)):
            if value is not None:
                said[f"{kind}_{name}"] = value
    return said


# -- the learned values and their history, in Redis ---------------------------------------------

HISTORY_KEEP = 500  # changes of a deployment's limits kept (a list per deployment)
KEPT_SECONDS = 30 * 86400  # what a deployment learned (limits, their history) lives after its last change


