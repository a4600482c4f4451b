"""The ``judges`` section of a job, judge-metric parameters, and judging options.

A judge is a model behind one or more deployments; each deployment has its own
region queue ``judge.<region>`` and its own cluster-wide TPM/RPM budget. Keys
come only from the environment variable a judge names, never from the job file.
A judge (or the model under test, or one deployment, whose price wins) may carry
a ``price`` per 1,000 tokens: what its calls cost, in whatever currency the
prices are written in (evalq converts nothing).
"""

from __future__ import annotations

import hashlib
import re
from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field, PrivateAttr, field_validator, model_serializer, model_validator

from evalq.shared.core import bounds
from evalq.shared.judging.capacity import (AUTO, DEFAULT_RPM_FLOOR, DEFAULT_TPM_FLOOR, Concurrency, ceiling_of,
                                           check_limits, fill_capacity, start_of)
from evalq.shared.judging.batch_config import DEFAULT_AUTO_DEADLINE, BatchCapacity, DeadlineField, JudgingMode
from evalq.shared.core.strict import Strict
from evalq.shared.core.strict import Params
from evalq.shared.judging.price import NANO, Price  # noqa: F401  (imported from here)

_REGION = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class Deployment(Strict):
    use: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]{1,64}$",
                            description="the operator's catalogue deployment this is (evalq.shared.judging.deployments)")
    region: str = Field(description="region name; the deployment's queue is judge.<region>")
    tpm: Annotated[int, Field(gt=0, le=bounds.MAX_TPM)] | Literal["auto"] | None = Field(
        default=None, description="tokens per minute the deployment may use; \"auto\": learned from the "
        "provider's rate-limit headers (evalq.shared.judging.capacity); absent: no token limit")
    rpm: Annotated[int, Field(gt=0, le=bounds.MAX_RPM)] | Literal["auto"] | None = Field(
        default=None, description="requests per minute the deployment may use; \"auto\" or absent as tpm")
    tpm_floor: int | None = Field(default=None, gt=0, le=bounds.MAX_TPM,
                                  description="\"auto\": the TPM it starts with, and the least a 429 cuts it to")
    tpm_ceiling: int | None = Field(default=None, gt=0, le=bounds.MAX_TPM, description="\"auto\": the most it learns")
    rpm_floor: int | None = Field(default=None, gt=0, le=bounds.MAX_RPM, description="as tpm_floor, for requests")
    rpm_ceiling: int | None = Field(default=None, gt=0, le=bounds.MAX_RPM, description="as tpm_ceiling, for requests")
    capacity: Literal["fixed", "adaptive"] = Field(
        default="fixed", description="adaptive: a cluster-wide limit of calls in flight, learned from latency "
        "and refusals (default where neither tpm nor rpm is stated)")
    concurrency: Concurrency | None = Field(default=None, description="adaptive: the limit's start and bounds")
    endpoint: str | None = Field(default=None, description="Azure: https://<resource>.openai.azure.com")
    deployment: str | None = Field(default=None, description="Azure: the deployment name")
    base_url: str | None = Field(default=None, description="OpenAI-compatible: e.g. http://host:8000/v1")
    # Length of the budget window. 60 s is what providers enforce; shorter
    # windows exist for simulations (evalq judge-sim --window).
    window_seconds: int = Field(default=60, gt=0, le=bounds.MAX_WINDOW_SECONDS)
    burst_seconds: float | None = Field(
        default=None, ge=0, le=bounds.MAX_WINDOW_SECONDS, allow_inf_nan=False,
        description="calls are paced evenly at the TPM/RPM rate; this many seconds' worth may go at once "
        "(default: a sixth of the window; at most the window, whose length turns pacing off)")
    price: Price | None = Field(default=None, description="this deployment's price (instead of its judge's)")
    batch: BatchCapacity | None = Field(default=None, description="its Batch API and enqueued-token quota "
                                        "(judging.mode batch/auto); absent: no batch calls")

    # Set by a worker (evalq.shared.judging.deployments.govern), never by a job: the scope of an inline
    # deployment's budget keys, and a catalogue deployment's job-own lower (tpm, rpm) and job.
    _scope: str | None = PrivateAttr(default=None)
    _own: tuple[int, int] | None = PrivateAttr(default=None)
    _job: str | None = PrivateAttr(default=None)

    def with_scope(self, scope: str | None, own: tuple[int, int] | None = None,
                   job_id: str | None = None) -> "Deployment":
        copy = self.model_copy()
        copy._scope, copy._own, copy._job = scope, own, job_id
        return copy

    @property
    def own_limit(self) -> tuple[str, int, int] | None:
        """(job id, tpm, rpm) of the lower limit a job asked for on a catalogue deployment, or None."""
        return (self._job, *self._own) if self._own is not None and self._job else None

    @model_validator(mode="before")
    @classmethod
    def _default_capacity(cls, data):
        return fill_capacity(data)

    @property
    def tpm_start(self) -> int:
        """The TPM its budget starts with (a stated one, an ``auto`` one's floor, else no limit)."""
        return start_of(self.tpm, self.tpm_floor, DEFAULT_TPM_FLOOR, bounds.MAX_TPM)

    @property
    def rpm_start(self) -> int:
        return start_of(self.rpm, self.rpm_floor, DEFAULT_RPM_FLOOR, bounds.MAX_RPM)

    @property
    def tpm_most(self) -> int:
        """The most TPM it may ever hold: a stated one, an ``auto`` one's ceiling, else no limit."""
        return ceiling_of(self.tpm, self.tpm_ceiling, bounds.MAX_TPM)

    @property
    def rpm_most(self) -> int:
        return ceiling_of(self.rpm, self.rpm_ceiling, bounds.MAX_RPM)

    @property
    def learns(self) -> bool:
        """Whether any of its limits is learned (``auto``, ``adaptive``)."""
        return AUTO in (self.tpm, self.rpm) or self.capacity == "adaptive"

    @model_validator(mode="after")
    def _burst_within_window(self) -> "Deployment":
        check_limits(self)
        if self.burst_seconds is not None and self.burst_seconds > self.window_seconds:
            raise ValueError(f"burst_seconds ({self.burst_seconds:g}) may be at most window_seconds "
                             f"({self.window_seconds})")
        return self

    @field_validator("region")
    @classmethod
    def _queue_safe(cls, value: str) -> str:
        if not _REGION.match(value):
            raise ValueError("use letters, digits, '-' and '_' only (it names the queue judge.<region>)")
        return value


class EndpointConfig(Strict):
    """A chat model behind one or more budgeted deployments (a judge, or the model under test)."""

    provider: Literal["openai", "azure"]
    model: str
    api_key_env: str = Field(description="environment variable holding the API key")
    api_version: str | None = Field(default=None, description="Azure API version, e.g. 2024-10-21")
    max_tokens: int = Field(default=400, gt=0, le=bounds.MAX_MAX_TOKENS, description="completion token limit per call")
    temperature: float = Field(default=0.1, ge=0, le=2)
    timeout: float = Field(default=60.0, gt=0, le=bounds.MAX_TIMEOUT, allow_inf_nan=False,
                           description="seconds per HTTP call")
    max_retries: int = Field(default=4, ge=0, le=bounds.MAX_RETRIES, description="retries after 429, 408, 5xx, timeouts")
    deployments: list[Deployment] = Field(min_length=1)
    price: Price | None = Field(default=None, description="price of its tokens (a deployment's own wins)")

    def price_of(self, d: Deployment) -> Price | None:
        """What a call answered by deployment ``d`` costs per token; None: nothing known. A catalogue
        deployment's price is the operator's alone (filled in from the catalogue): one it does not
        price never falls back to the job's own judge-level price, which would let a job set what
        its calls count against its tenant's cost limits."""
        if d.use is not None:
            return d.price
        return d.price or self.price

    @property
    def priced(self) -> bool:
        """Whether any of its calls has a price (its results then report a cost)."""
        return any(self.price_of(d) is not None for d in self.deployments)

    @property
    def batch_deployments(self) -> list[Deployment]:
        """Its deployments that declare a Batch API (``batch``)."""
        return [d for d in self.deployments if d.batch is not None]

    @model_validator(mode="after")
    def _provider_fields(self) -> "EndpointConfig":
        for i, d in enumerate(self.deployments):
            if self.provider == "azure" and not (d.endpoint and d.deployment):
                raise ValueError(f"deployments[{i}] ({d.region}): azure needs 'endpoint' and 'deployment'")
            if self.provider == "openai" and (d.endpoint or d.deployment):
                raise ValueError(f"deployments[{i}] ({d.region}): 'endpoint'/'deployment' are for "
                                 "provider azure; use 'base_url'")
            if self.provider == "openai" and d.batch is not None and d.batch.deployment:
                raise ValueError(f"deployments[{i}] ({d.region}): 'batch.deployment' is for provider azure "
                                 "(OpenAI batch lines name the judge's model)")
        if self.provider == "azure" and not self.api_version:
            raise ValueError("azure needs 'api_version' (e.g. \"2024-10-21\")")
        regions = [d.region for d in self.deployments]
        if len(set(regions)) != len(regions):
            raise ValueError("two deployments share a region name")
        return self


class JudgeConfig(EndpointConfig):
    output: Literal["auto", "json_schema", "json_object", "tools", "text"] = Field(
        default="auto", description="how the judge is asked for structured output: auto (json_schema, falling "
        "back to json_object, tools, then text per deployment when its server refuses one), or that one form")


def model_identity(config: EndpointConfig) -> str:
    """Who answers a call, as the judge cache and the job's memo know it: the provider and model,
    and for an OpenAI-compatible endpoint where it is (a self-hosted ``base_url`` model and
    OpenAI's model of the same name never answer each other's requests)."""
    if config.provider == "azure":
        return f"azure|{config.model}"
    urls = sorted({(d.base_url or "https://api.openai.com/v1").rstrip("/") for d in config.deployments})
    return "|".join([config.provider, config.model, *urls])


# parameters that change what is done with a verdict, never the verdict (a pass threshold, the path
# calls take): left out of a judge's identity
NOT_THE_JUDGE = ("judge", "threshold", "mode")


def judge_identity(config: dict, seen: dict, parameters: dict | None = None, name: str | None = None) -> dict:
    """A judge entry's identity (issue 61), from its judge's configuration (the spec's) and what its
    calls said (``keys.judge_seen``): the provider and model, the versions the provider said answered
    (``gpt-4o-2024-08-06`` behind ``gpt-4o``), the deployments, the digest of what the entry asks
    (prompt, rubric, examples, schema: ``evalq.workers.judge.identity``) and the sampling settings;
    ``id`` hashes what decides a verdict (not the deployments' names or budgets: who answers is
    ``model_identity``, as the judge cache knows it). Where no prompt digest could be made, the entry's
    parameters stand for it."""
    import hashlib
    import json

    judge = JudgeConfig.model_validate(config)
    seen = {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
            for k, v in (seen or {}).items()}
    said = [k[len("model:"):].rpartition("|") for k in seen if k.startswith("model:")]  # ("judge", "|", model)
    versions = sorted({model for who, _, model in said if name is None or who in ("", name)})
    prompt = seen.get("prompt")
    if prompt is None:
        asked = {k: v for k, v in (parameters or {}).items() if k not in NOT_THE_JUDGE}
        prompt = "parameters:" + hashlib.sha256(json.dumps(asked, sort_keys=True).encode()).hexdigest()
    settings = {"temperature": judge.temperature, "max_tokens": judge.max_tokens, "output": judge.output}
    deciding = {"who": model_identity(judge), "versions": versions, "prompt": prompt, **settings}
    return {"provider": judge.provider, "model": judge.model, "versions": versions,
            "deployments": sorted(d.use or d.deployment or d.base_url or d.region for d in judge.deployments),
            "prompt": prompt, **settings,
            "id": hashlib.sha256(json.dumps(deciding, sort_keys=True).encode()).hexdigest()[:16]}


def panel_identity(judges: dict, seen: dict, parameters: dict) -> dict:
    """A panel's identity: each member's (``judge_identity``, its own versions), the aggregate and
    quorum, and an ``id`` of them all: a member changed, added or dropped is another panel."""
    import hashlib
    import json

    members = {member: judge_identity(judges[member], seen, parameters, member) for member in parameters["panel"]}
    how = {"aggregate": parameters.get("panel_aggregate", "mean"), "quorum": parameters.get("panel_quorum")}
    deciding = {"members": {m: i["id"] for m, i in members.items()}, **how}
    return {"panel": members, **how,
            "id": hashlib.sha256(json.dumps(deciding, sort_keys=True).encode()).hexdigest()[:16]}


def deployment_id(judge: EndpointConfig, d: Deployment) -> str:
    """Stable identity of a deployment's quota: a catalogue deployment's is its name's, shared by
    every job that uses it; an inline one's is its endpoint's, scoped to one job where the
    operator gives inline deployments keys of their own (``evalq.shared.judging.deployments``)."""
    if d.use is not None:
        return f"catalogue-{d.use}"
    url = d.endpoint or d.base_url or "https://api.openai.com/v1"
    raw = f"{judge.provider}|{url.rstrip('/')}|{d.deployment or judge.model}"
    base = hashlib.sha256(raw.encode()).hexdigest()[:16]
    return f"{base}:{d._scope}" if d._scope else base


class JudgingOptions(Strict):
    cache: bool = Field(default=True, description="answer identical requests from the Redis cache")
    cache_ttl: int = Field(default=bounds.CACHE_TTL, gt=0, le=bounds.MAX_CACHE_TTL, description="seconds a cached reply lives")
    token_cap: int | None = Field(default=None, gt=0,
                                  description="stop sending judge calls once the job reserved this many tokens")
    cost_cap: float | None = Field(default=None, gt=0, allow_inf_nan=False, strict=True,
                                   description="stop sending judge and generation calls once the job's cost "
                                   "(in the prices' currency) would pass this")
    # Batch API path (evalq.shared.judging.batch_config; run by evalq.workers.judge.batches)
    mode: JudgingMode = Field(default="sync", description="sync: every call at once; batch: through the "
                              "Batch API of the judges' batch deployments; auto: batch, then sync by the deadline")
    deadline: DeadlineField | None = Field(default=None, description="auto: when what has not come back is sent "
                                           "synchronously: a duration from submission (\"6h\") or a UTC clock "
                                           "time (\"06:30\"); default 6h")

    def deadline_at(self, submitted_at: datetime) -> datetime:
        """When ``auto`` falls back to synchronous calls, for a job submitted then (UTC)."""
        return (self.deadline or DEFAULT_AUTO_DEADLINE).at(submitted_at)


# A judge metric's ``judge`` parameter: the name of one of the job's judges.
JudgeName = Annotated[str, Field(max_length=bounds.MAX_NAME_CHARS,
                                 description="name of a judge in the job's 'judges'")]


class JudgedParams(Params):
    """What every judge metric's parameters have: its judge, and the entry's own
    judging mode (unset: the job's ``judging.mode``; left out of the dumped
    parameters then, so outputs and the stored spec read as before)."""

    judge: JudgeName
    mode: JudgingMode | None = Field(default=None, description="this entry's judging mode (sync, batch, auto); "
                                     "default: judging.mode")

    @model_serializer(mode="wrap")
    def _unset_mode_left_out(self, handler):
        data = handler(self)
        if self.mode is None and isinstance(data, dict):
            data.pop("mode", None)
        return data

    def effective_mode(self, judging: JudgingOptions) -> str:
        return self.mode or judging.mode

    @model_validator(mode="before")
    @classmethod
    def _one_judge(cls, data):
        if isinstance(data, dict) and isinstance(data.get("judge"), list) and "panel" not in cls.model_fields:
            raise ValueError("judge: a panel (a list of judges) scores the rated quality metrics and rubric; "
                             "this metric takes one judge")
        return data


class PanelParams(JudgedParams):
    """A rated entry's judge may be a panel: ``"judge": ["a", "b", "c"]`` (or ``judge`` its first
    member and ``panel`` every member): each item is scored by every member, under each one's own
    deployments' budget, and the item's score is the panel's ``panel_aggregate``
    (``evalq.shared.judging.panel``)."""

    panel: list[JudgeName] | None = Field(
        default=None, min_length=2, max_length=9,
        description="a panel of judges (their names in `judges`, different ones): each item is scored by every one; "
        "`\"judge\": [\"a\", \"b\"]` says the same")
    panel_aggregate: Literal["mean", "median", "majority"] = Field(
        default="mean", description="the item's score from its members': mean, median, or majority (a score more "
        "than half of the answering members gave, else the median, the item marked `majority: false`)")
    panel_quorum: int | None = Field(
        default=None, ge=1, description="members that must answer for the item to be scored (default: all); "
        "fewer: an error naming who failed")

    @model_validator(mode="before")
    @classmethod
    def _judge_list(cls, data):
        if isinstance(data, dict) and isinstance(data.get("judge"), list):
            members = data["judge"]
            data = {**data, "judge": members[0] if members else None, "panel": members}
        return data

    @model_validator(mode="after")
    def _members(self):
        if self.panel is not None:
            if len(set(self.panel)) != len(self.panel):
                raise ValueError("panel: each member once")
            if self.judge not in self.panel:
                raise ValueError("panel: judge must be one of its members (the first, when judge is a list)")
            if self.panel_quorum is not None and self.panel_quorum > len(self.panel):
                raise ValueError(f"panel_quorum: at most the panel's {len(self.panel)} members")
        return self

    @model_serializer(mode="wrap")
    def _unset_mode_left_out(self, handler):  # (JudgedParams') and a single judge's panel fields too
        data = handler(self)
        if isinstance(data, dict):
            if self.mode is None:
                data.pop("mode", None)
            if self.panel is None:  # a single judge's parameters read as before
                for key in ("panel", "panel_aggregate", "panel_quorum"):
                    data.pop(key, None)
        return data


class JudgeParams(PanelParams):
    threshold: int | None = Field(default=None, ge=1, le=5,
                                  description="report the share of items scoring at least this")


class RubricExample(Strict):
    score: int
    output: str = Field(max_length=bounds.MAX_EXAMPLE_CHARS, description="an answer that deserves this score")
    input: str | None = Field(default=None, max_length=bounds.MAX_EXAMPLE_CHARS)
    reason: str | None = Field(default=None, max_length=bounds.MAX_EXAMPLE_CHARS)


class RubricParams(PanelParams):
    criteria: str = Field(min_length=1, max_length=bounds.MAX_CRITERIA_CHARS,
                          description="what the judge grades, in plain words")
    scale_min: int = Field(default=1, description="lowest score")
    scale_max: int = Field(default=5, description="highest score")
    examples: list[RubricExample] = Field(default_factory=list, max_length=bounds.MAX_EXAMPLES,
                                          description="few-shot examples, ideally one per score")
    threshold: int | None = Field(default=None, description="report the share of items scoring at least this")

    @model_validator(mode="after")
    def _scale(self) -> "RubricParams":
        if self.scale_max <= self.scale_min:
            raise ValueError("scale_max must be greater than scale_min")
        if self.scale_max - self.scale_min > 10:
            raise ValueError("use a low-precision scale (at most 11 points): judges grade those reliably")
        for e in self.examples:
            if not self.scale_min <= e.score <= self.scale_max:
                raise ValueError(f"example score {e.score} is outside {self.scale_min}..{self.scale_max}")
        if self.threshold is not None and not self.scale_min <= self.threshold <= self.scale_max:
            raise ValueError("threshold must lie on the scale")
        return self


# --- risk and safety (seed 001: severity 0-7 in four bands, defect rate at a threshold)

SEVERITY_BANDS = (("very_low", 0, 1), ("low", 2, 3), ("medium", 4, 5), ("high", 6, 7))
HARMS = ("hate_unfairness", "sexual", "violence", "self_harm")


def severity_label(severity: int) -> str:
    return next(name for name, lo, hi in SEVERITY_BANDS if lo <= severity <= hi)


class SafetyParams(JudgedParams):
    threshold: int = Field(default=4, ge=0, le=7,
                           description="an item is a defect when its severity (0-7) is at or above this")


class DefectJudgeParams(JudgedParams):
    pass


# --- claim-based metrics (seed 002)

class ClaimsParams(JudgedParams):
    neutral_value: float = Field(default=0.5, ge=0.0, le=1.0,
                                 description="value of a claim neither entailed nor contradicted")
    round_up_at: float | None = Field(default=None, ge=0.0, le=1.0,
                                      description="a score at or above this counts as 1 (the log keeps the raw one)")


class ClaimScoreParams(JudgedParams):
    round_up_at: float | None = Field(default=None, ge=0.0, le=1.0,
                                      description="a score at or above this counts as 1 (the log keeps the raw one)")


RELATIONS = ("equivalent", "implied_subset", "implied_superset", "contradiction", "independent")


class RelationValues(Strict):
    equivalent: float = Field(default=1.0, ge=0.0, le=1.0)
    implied_subset: float = Field(default=0.5, ge=0.0, le=1.0)
    implied_superset: float = Field(default=0.75, ge=0.0, le=1.0)
    contradiction: float = Field(default=0.0, ge=0.0, le=1.0)
    independent: float = Field(default=0.0, ge=0.0, le=1.0)


class RubricsFCParams(JudgedParams):
    values: RelationValues = Field(default_factory=RelationValues,
                                   description="the number each relation scores")
    round_up_at: float | None = Field(default=None, ge=0.0, le=1.0,
                                      description="a score at or above this counts as 1 (the log keeps the raw one)")
