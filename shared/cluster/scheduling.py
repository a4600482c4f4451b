"""Sharing one cluster between jobs and teams: a job's ``scheduling`` fields, the operator's
tenant settings, and the window each queue's broker list is held to.

A job says (job file, ``evalq run/submit --priority --tenant --weight``, or the same keys
as ``evalq.submit_job`` kwargs)::

    "scheduling": {"priority": "high" | "normal" | "low", "tenant": "search", "weight": 2}

Operators give tenants weights, and optionally a cap on their share of a judge (or
generate) queue's tokens per minute, in one setting::

    EVALQ_TENANTS="search=2,ads=1;ads.max_share=0.5"

Entries are separated by ``,`` or ``;``: ``<tenant>=<weight>`` (a number > 0) and
``<tenant>.max_share=<fraction>`` (0 < fraction <= 1). A tenant not listed has weight 1
and no cap. ``evalq.orchestrator.dispatch`` applies them. The spend and size limits (``LIMITS``)
are applied where a request is taken (``evalq.orchestrator.tenancy.tenant_policy``).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from typing import Literal

from pydantic import Field

from evalq.shared.core.config import env_number
from evalq.shared.core.errors import JobError
from evalq.shared.core.strict import Strict

PRIORITIES = ("high", "normal", "low")  # strict precedence, first first
TENANTS_ENV = "EVALQ_TENANTS"
LIMITS = ("job_cost", "job_tokens", "daily_cost", "daily_tokens", "job_staged")  # a tenant's spend and size limits
_TENANT = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}$")  # never "." or "..": it names a folder of each root


class Scheduling(Strict):
    priority: Literal["high", "normal", "low"] = Field(
        default="normal", description="chunks of a higher class go first on every queue")
    tenant: str = Field(default="default", pattern=_TENANT.pattern,
                        description="the team the job belongs to: tenants share queues by their weights")
    weight: float = Field(default=1.0, gt=0, le=1000, allow_inf_nan=False,
                          description="the job's share among its tenant's running jobs")

    def with_overrides(self, priority: str | None = None, tenant: str | None = None,
                       weight: float | None = None) -> "Scheduling":
        """These fields, with what a submission (CLI flags, request kwargs) overrides."""
        update = {k: v for k, v in (("priority", priority), ("tenant", tenant), ("weight", weight)) if v is not None}
        return Scheduling.model_validate({**self.model_dump(), **update}) if update else self

    @property
    def rank(self) -> int:
        return PRIORITIES.index(self.priority)


@dataclass(frozen=True)
class Tenants:
    weights: dict[str, float] = field(default_factory=dict)
    max_share: dict[str, float] = field(default_factory=dict)
    max_priority: dict[str, str] = field(default_factory=dict)
    suites: dict[str, tuple[str, ...]] = field(default_factory=dict)  # the suite patterns a tenant may use
    job_cost: dict[str, float] = field(default_factory=dict)   # most a job of the tenant may spend (prices' currency)
    job_tokens: dict[str, int] = field(default_factory=dict)   # most judge tokens a job of the tenant may reserve
    daily_cost: dict[str, float] = field(default_factory=dict)  # most the tenant's jobs may spend a UTC day
    daily_tokens: dict[str, int] = field(default_factory=dict)  # most tokens its jobs may reserve a UTC day
    job_staged: dict[str, int] = field(default_factory=dict)  # most bytes of instances a job of the tenant may store

    def weight(self, tenant: str) -> float:
        return self.weights.get(tenant, 1.0)

    @property
    def names(self) -> list[str]:
        """The tenants the operator lists: each has a request queue of its own (evalq.jobs.<tenant>)."""
        return sorted(set(self.weights) | set(self.max_share) | set(self.max_priority) | set(self.suites)
                      | set(self.job_cost) | set(self.job_tokens) | set(self.daily_cost) | set(self.daily_tokens)
                      | set(self.job_staged))

    def policy(self, table: dict, tenant: str):
        """A tenant's entry in ``table``, else the default tenant's, else None."""
        return table.get(tenant, table.get("default"))

    def suite_problem(self, tenant: str, suite: str) -> str | None:
        """Why ``tenant`` may not write into ``suite`` (its ``suites`` patterns), or None."""
        import fnmatch

        allowed = self.policy(self.suites, tenant)
        if allowed is None or any(fnmatch.fnmatchcase(suite, p) for p in allowed):
            return None
        return f"suite {suite!r}: tenant {tenant!r} writes only into {' | '.join(allowed)} ({TENANTS_ENV})"

    def priority_problem(self, tenant: str, priority: str) -> str | None:
        """Why ``tenant`` may not use ``priority`` (its ``max_priority``, else the default tenant's), or None."""
        allowed = self.max_priority.get(tenant, self.max_priority.get("default", PRIORITIES[0]))
        if PRIORITIES.index(priority) < PRIORITIES.index(allowed):
            return f"priority {priority!r}: tenant {tenant!r} may use at most {allowed!r} ({TENANTS_ENV})"
        return None

    @classmethod
    def parse(cls, text: str, source: str = TENANTS_ENV) -> "Tenants":
        weights: dict[str, float] = {}
        caps: dict[str, float] = {}
        priorities: dict[str, str] = {}
        suites: dict[str, tuple[str, ...]] = {}
        limits: dict[str, dict] = {key: {} for key in LIMITS}
        for entry in re.split(r"[;,\n]", text):
            entry = entry.strip()
            if not entry:
                continue
            name, eq, value = entry.partition("=")
            name = name.strip()
            tenant, dot, key = name.partition(".")
            try:
                number = float(value)
            except ValueError:
                number = math.nan
            if dot and key == "max_priority" and _TENANT.match(tenant) and value.strip() in PRIORITIES:
                priorities[tenant] = value.strip()
                continue
            if dot and key == "suites" and _TENANT.match(tenant) and value.strip():
                suites[tenant] = tuple(p.strip() for p in value.split("|") if p.strip())
                continue
            if dot and key in LIMITS and _TENANT.match(tenant):
                if not (math.isfinite(number) and number > 0):
                    raise JobError(f"{source}: {entry!r}: {key} must be a number > 0")
                limits[key][tenant] = number if key.endswith("cost") else int(number)
                continue
            if not eq or not _TENANT.match(tenant) or (dot and key != "max_share") or not math.isfinite(number):
                raise JobError(f"{source}: {entry!r}: expected <tenant>=<weight>, <tenant>.max_share=<fraction>, "
                               "<tenant>.max_priority=high|normal|low, <tenant>.suites=<pattern>|..., "
                               "<tenant>.job_cost|daily_cost=<money>, <tenant>.job_tokens|daily_tokens=<tokens> "
                               "or <tenant>.job_staged=<bytes>")
            if dot:
                if not 0 < number <= 1:
                    raise JobError(f"{source}: {entry!r}: max_share must be more than 0 and at most 1")
                caps[tenant] = number
            else:
                if number <= 0:
                    raise JobError(f"{source}: {entry!r}: a weight must be more than 0")
                weights[tenant] = number
        return cls(weights, caps, priorities, suites, limits["job_cost"], limits["job_tokens"], limits["daily_cost"],
                   limits["daily_tokens"], limits["job_staged"])

    @classmethod
    def from_env(cls) -> "Tenants":
        return cls.parse(os.environ.get(TENANTS_ENV, ""))


@dataclass(frozen=True)
class Window:
    """How many chunks a queue's broker list holds: ``factor`` x the slots (worker processes
    or threads) consuming it, at least ``floor``; ``fixed`` (when set) instead."""

    factor: float
    floor: int
    fixed: int

    @classmethod
    def from_env(cls) -> "Window":
        # 1 x the slots: every chunk out is running or about to; a queued chunk is one a newcomer
        # waits behind (BENCHMARKS.md: with 2 x, a small job behind a big one took 2.2 s, with 1 x 0.8 s)
        return cls(factor=env_number("EVALQ_WINDOW_FACTOR", 1.0), floor=max(1, env_number("EVALQ_WINDOW_FLOOR", 4)),
                   fixed=env_number("EVALQ_WINDOW", 0))

    def size(self, slots: int) -> int:
        if self.fixed:
            return self.fixed
        return max(self.floor, math.ceil(self.factor * slots))


def check_env() -> None:
    """Read every scheduling setting (a bad one stops any evalq command before it starts)."""
    Tenants.from_env()
    Window.from_env()
