"""Simulated regions: each with its own port and RPM/TPM budgets over a sliding
window, its seeded random draws and its counters."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Callable


BATCH_WINDOW_SECONDS = 86400.0  # completion_window "24h"
RATE_HEADERS = ("openai", "azure", "none")  # what replies say of the limits (JudgeSim(rate_headers=...))


@dataclass(frozen=True)
class Region:
    """A simulated region: its own port, RPM and TPM budgets. ``port=0`` picks a free
    port; a limit of 0 or None disables that limit.

    Its Batch API (:mod:`evalq.sim.batches`): a batch takes ``batch_delay`` seconds from
    creation to ``completed``; a fraction ``batch_fail_fraction`` of its lines fail (500),
    chosen by a hash of the custom_id; a batch whose delay exceeds ``batch_expire_after``
    seconds (default: the 24 h window) ends ``expired``; ``enqueued_tokens`` caps the
    estimated tokens of the unfinished batches per model (0 or None: no cap)."""

    name: str
    tpm: int | None = None
    rpm: int | None = None
    port: int = 0
    batch_delay: float = 1.0
    batch_fail_fraction: float = 0.0
    batch_expire_after: float = BATCH_WINDOW_SECONDS
    enqueued_tokens: int | None = None

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ValueError("region name must be a non-empty string")
        for label, value in (("tpm", self.tpm), ("rpm", self.rpm), ("enqueued_tokens", self.enqueued_tokens)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ValueError(f"region {self.name}: {label} must be a non-negative integer")
        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ValueError(f"region {self.name}: bad port {self.port!r}")
        if not isinstance(self.batch_delay, (int, float)) or not self.batch_delay >= 0:
            raise ValueError(f"region {self.name}: batch_delay must be a number >= 0")
        if not isinstance(self.batch_fail_fraction, (int, float)) or not 0 <= self.batch_fail_fraction <= 1:
            raise ValueError(f"region {self.name}: batch_fail_fraction must be in [0, 1]")
        if not isinstance(self.batch_expire_after, (int, float)) or not self.batch_expire_after > 0:
            raise ValueError(f"region {self.name}: batch_expire_after must be a number > 0")


_BATCH_KEYS = {"batch_delay": float, "batch_fail_fraction": float, "batch_expire_after": float,
               "enqueued_tokens": int}


def parse_region(spec: str, defaults: dict | None = None) -> Region:
    """``NAME:TPM:RPM[:PORT][:KEY=VALUE...]`` -> Region (0 disables a limit; no port: a
    free one). KEY is one of batch_delay, batch_fail_fraction, batch_expire_after,
    enqueued_tokens; ``defaults`` gives those the spec leaves out."""
    parts = spec.split(":")
    settings = dict(defaults or {})
    while parts and "=" in parts[-1]:
        key, _, value = parts.pop().partition("=")
        if key not in _BATCH_KEYS:
            raise ValueError(f"region {spec!r}: unknown setting {key!r}; known: {', '.join(_BATCH_KEYS)}")
        try:
            settings[key] = _BATCH_KEYS[key](value)
        except ValueError:
            raise ValueError(f"region {spec!r}: {key} must be a number, not {value!r}") from None
    if len(parts) not in (3, 4) or not parts[0]:
        raise ValueError(f"region {spec!r}: expected NAME:TPM:RPM[:PORT][:KEY=VALUE...]")
    try:
        nums = [int(p) for p in parts[1:]]
    except ValueError:
        raise ValueError(f"region {spec!r}: expected NAME:TPM:RPM[:PORT] with integer TPM, RPM, PORT") from None
    return Region(parts[0], tpm=nums[0], rpm=nums[1], port=nums[2] if len(nums) == 3 else 0, **settings)


_COUNTERS = ("requests", "ok", "rate_limited", "rate_limited_injected", "unauthorized",
             "bad_request", "error500", "timeout", "malformed", "prompt_tokens",
             "completion_tokens", "admitted_requests", "admitted_tokens",
             "peak_window_requests", "peak_window_tokens", "peak_in_flight")


@dataclass
class _Admission:
    admitted: bool
    kind: str = ""            # "requests" | "tokens" when refused
    wait: float = 0.0         # seconds until it would fit
    too_large: bool = False
    remaining_requests: int | None = None
    remaining_tokens: int | None = None
    fault_draw: float = 0.0
    jitter_draw: float = 0.0


class RegionState:
    def __init__(self, region: Region, window: float, seed: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.region = region
        self.clock = clock
        self.window = window
        self.lock = threading.Lock()
        self.rng = random.Random(f"{seed}:{region.name}")
        self.entries: deque[tuple[float, int]] = deque()  # (admitted at, cost)
        self.window_tokens = 0
        self.in_flight = 0
        self.counts = dict.fromkeys(_COUNTERS, 0)
        self.answered: Counter[str] = Counter()  # request sha -> replies (JudgeSim(per_request=True))
        # JudgeSim.hold: admitted calls wait, unanswered, while the gate is shut, all but the
        # next ``let_through`` of them; ``held``: how many wait now
        self.gate = threading.Event()
        self.gate.set()
        self.let_through = 0
        self.held = 0
        self.slots: threading.Semaphore | None = None  # JudgeSim(slots=N): calls served at once

    def _prune(self, now: float) -> None:
        while self.entries and self.entries[0][0] <= now - self.window:
            _, cost = self.entries.popleft()
            self.window_tokens -= cost

    def admit(self, cost: int) -> _Admission:
        rpm, tpm = self.region.rpm or None, self.region.tpm or None
        with self.lock:
            now = self.clock()
            self._prune(now)
            if tpm is not None and cost > tpm:
                return _Admission(False, "tokens", self.window, too_large=True)
            n, tokens = len(self.entries), self.window_tokens
            fits_r = rpm is None or n + 1 <= rpm
            fits_t = tpm is None or tokens + cost <= tpm
            if not (fits_r and fits_t):
                kind = "requests" if not fits_r else "tokens"
                wait = self.window
                for at, c in self.entries:  # oldest first: when has enough expired?
                    n, tokens = n - 1, tokens - c
                    if (rpm is None or n + 1 <= rpm) and (tpm is None or tokens + cost <= tpm):
                        wait = at + self.window - now
                        break
                return _Admission(False, kind, max(wait, 0.001))
            self.entries.append((now, cost))
            self.window_tokens += cost
            c = self.counts
            c["admitted_requests"] += 1
            c["admitted_tokens"] += cost
            c["peak_window_requests"] = max(c["peak_window_requests"], len(self.entries))
            c["peak_window_tokens"] = max(c["peak_window_tokens"], self.window_tokens)
            return _Admission(
                True,
                remaining_requests=None if rpm is None else rpm - len(self.entries),
                remaining_tokens=None if tpm is None else tpm - self.window_tokens,
                fault_draw=self.rng.random(), jitter_draw=self.rng.random())

    def set_limits(self, tpm: int | None, rpm: int | None) -> None:
        import dataclasses

        with self.lock:
            changes = {k: v for k, v in (("tpm", tpm), ("rpm", rpm)) if v is not None}
            self.region = dataclasses.replace(self.region, **changes)

    def reset_after(self, now: float) -> float:
        """Seconds until the oldest call in the window leaves it (the window is full again then, as
        OpenAI's ``x-ratelimit-reset-*`` says it)."""
        with self.lock:
            return max(0.0, self.entries[0][0] + self.window - now) if self.entries else 0.0

    def add(self, **deltas: int) -> None:
        with self.lock:
            for key, delta in deltas.items():
                self.counts[key] += delta

    def answer(self, request: str) -> None:
        with self.lock:
            self.answered[request] += 1

    def enter(self) -> None:
        with self.lock:
            self.counts["requests"] += 1
            self.in_flight += 1
            self.counts["peak_in_flight"] = max(self.counts["peak_in_flight"], self.in_flight)

    def hold(self, after: int) -> None:
        with self.lock:
            self.let_through = after
            self.gate.clear()

    def release(self) -> None:
        with self.lock:
            self.let_through = 0
            self.gate.set()

    def stopped_at_gate(self) -> bool:
        """For an admitted call: whether it must wait at the shut gate (counted in ``held``)."""
        with self.lock:
            if self.gate.is_set():
                return False
            if self.let_through > 0:
                self.let_through -= 1
                return False
            self.held += 1
            return True

    def passed_gate(self) -> None:
        with self.lock:
            self.held -= 1

    def leave(self) -> None:
        with self.lock:
            self.in_flight -= 1

    def snapshot(self, port: int) -> dict:
        with self.lock:
            self._prune(self.clock())
            c = dict(self.counts)
            errors = {"error500": c.pop("error500"), "timeout": c.pop("timeout"),
                      "malformed": c.pop("malformed")}
            errors["total"] = sum(errors.values())
            return {
                "region": self.region.name, "port": port, "tpm": self.region.tpm or None,
                "rpm": self.region.rpm or None, "window_seconds": self.window,
                **{k: c[k] for k in ("requests", "ok", "rate_limited", "rate_limited_injected")},
                "errors": errors,
                **{k: c[k] for k in ("unauthorized", "bad_request", "prompt_tokens",
                                     "completion_tokens", "admitted_requests", "admitted_tokens")},
                "window_requests": len(self.entries), "window_tokens": self.window_tokens,
                "peak_window_requests": c["peak_window_requests"],
                "peak_window_tokens": c["peak_window_tokens"],
                "in_flight": self.in_flight, "peak_in_flight": c["peak_in_flight"],
                "held": self.held,
            }

    def reset(self, clear_limits: bool) -> None:
        with self.lock:
            self.counts = dict.fromkeys(_COUNTERS, 0)
            self.answered.clear()
            self.counts["peak_in_flight"] = self.in_flight
            if clear_limits:
                self.entries.clear()
                self.window_tokens = 0
            else:
                self.counts["peak_window_requests"] = len(self.entries)
                self.counts["peak_window_tokens"] = self.window_tokens
