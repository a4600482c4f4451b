"""A job's ``metrics`` and ``judges`` sections: each enabled entry resolved into a
``MetricRun`` (parameters validated and defaults filled in, its judge attached)."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Any, Callable

from pydantic import BaseModel, ValidationError

import evalq.shared.job.catalogue  # noqa: F401  (registers the built-in metrics)
from evalq.shared.core.errors import JobError, kind
from evalq.shared.judging.judges import EndpointConfig, JudgeConfig, JudgingOptions
from evalq.shared.model.runners import RUNNER_QUEUE
from evalq.shared.cluster.spec import entry_queues
from evalq.shared.core.problems import Problems, did_you_mean, parse_section
from evalq.shared.metrics.registry import REGISTRY, MetricSpec, UnknownMetric

METRIC_KEYS = {"id", "enable", "parameters", "name"}
MAX_NAME = 200  # an entry's name is on every log line of the entry


@dataclass(frozen=True)
class MetricRun:
    """One enabled metric entry of a job, with its parameters resolved (defaults filled in).

    A job may list one metric several times with different parameters (as HarpIA
    allows); ``key`` tells the entries apart inside evalq (Redis keys, task
    arguments) and is derived from the entry's position, never asked of users.
    """

    key: str  # unique within the job: ``<id>@<position>`` (``generate`` for that stage)
    spec: MetricSpec
    params: BaseModel
    judge: Any = None  # judge metrics: the judge its parameters name (generation: the model)
    name: str | None = None  # the entry's optional ``name``, as the job gave it
    position: int | None = None  # index in the job's ``metrics`` list

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def label(self) -> str:
        """How messages name the entry: its ``name``, else its id."""
        return self.name or self.spec.id

    @property
    def where(self) -> str:
        """The entry's place in the job file, as validation errors give it."""
        return f"metrics[{self.position}] ({self.spec.id})" if self.position is not None else self.spec.id

    def head(self) -> dict[str, Any]:
        """What outputs say about the entry: ``metric``, ``name`` (if given), ``parameters``."""
        return entry_head({"id": self.spec.id, "name": self.name, "parameters": self.params_json()})

    def routing(self) -> dict[str, Any]:
        """Where the run's chunks go, as its spec entry says it: ``queue`` (the kind, or a
        queue of its own) and, for runs with deployments, their ``regions`` (``[name, TPM]``)."""
        if self.judge is not None:
            return {"queue": self.spec.queue, "regions": [[d.region, d.tpm_start] for d in self.judge.deployments]}
        return {"queue": RUNNER_QUEUE if self.spec.queue == "generate" else self.kind}

    @property
    def kind(self) -> str:
        """The queue kind the entry runs on (its parameters may decide: ``MetricSpec.kind``)."""
        return self.spec.kind(self.params)

    @property
    def queues(self) -> list[str]:
        """Queues this run's tasks go to (named by ``evalq.shared.cluster.spec``, as the cluster names them)."""
        return entry_queues(self.routing())

    @property
    def queue(self) -> str:
        return self.queues[0]

    def params_json(self) -> dict[str, Any]:
        return self.params.model_dump(mode="json")


def entry_head(entry: dict) -> dict[str, Any]:
    """What outputs say about a metric entry (as stored in a job's spec):
    ``metric``, ``name`` (only when the job gave one), ``parameters``."""
    head: dict[str, Any] = {"metric": entry["id"]}
    if entry.get("name") is not None:
        head["name"] = entry["name"]
    head["parameters"] = entry["parameters"]
    return head


def parse_judges(raw: Any, problems: Problems) -> dict[str, JudgeConfig]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        problems.add("judges", f"expected an object of named judges, got {kind(raw)}")
        return {}
    from evalq.shared.judging.deployments import resolve_endpoint

    judges = {}
    for name, cfg in raw.items():
        cfg = resolve_endpoint(cfg, f"judges.{name}", problems)  # the operator's catalogue deployments
        judge = parse_section(JudgeConfig, cfg, f"judges.{name}", problems)
        if judge is not None:
            judges[name] = judge
    return judges


def resolve_judges(runs: list[MetricRun], judges: dict[str, JudgeConfig],
                    problems: Problems, declared: Any = None) -> list[MetricRun]:
    """Attach each judge metric's judge; a judge in use must have its key variable set. ``declared``:
    the job's ``judges`` as written: a judge there that did not parse has said what is wrong with
    it, and is not called missing again by every entry that names it."""
    broken = set(declared) - set(judges) if isinstance(declared, dict) else set()
    resolved = []
    checked_env = set()
    for run in runs:
        name = getattr(run.params, "judge", None)
        if run.spec.queue != "judge" or name is None:
            resolved.append(run)
            continue
        judge = judges.get(name)
        if judge is None and name not in broken:
            known = ", ".join(sorted(judges)) or "none defined"
            problems.add(f"{run.where}.parameters.judge",
                         f"no judge named {name!r}{did_you_mean(name, judges)} (judges: {known})")
            continue
        for member in getattr(run.params, "panel", None) or [name]:
            if member in broken:
                continue
            if member not in judges:
                problems.add(f"{run.where}.parameters.panel", f"no judge named {member!r}{did_you_mean(member, judges)}")
            elif member not in checked_env:
                check_key_env(judges[member].api_key_env, f"judges.{member}.api_key_env", problems)
                check_endpoints(judges[member], f"judges.{member}", problems)
                checked_env.add(member)
        if getattr(run.params, "panel", None) and not run.spec.panel:
            problems.add(f"{run.where}.parameters.panel", "a panel scores the rated quality metrics and rubric "
                         "(one score and a reason per item); this metric takes one judge")
        if judge is None:  # its judge did not parse (said above): nothing later checks it against one
            continue
        resolved.append(dataclasses.replace(run, judge=judge))
    return resolved


def check_cost_cap(judging: JudgingOptions, runs: list[MetricRun], model: Any, problems: Problems) -> None:
    """A cost cap counts priced calls only: with no price on the judges the enabled
    entries use, nor on the model under test, it could never stop anything."""
    if judging.cost_cap is None:
        return
    endpoints = [run.judge for run in runs if run.judge is not None] + ([model] if hasattr(model, "priced") else [])
    if not any(e.priced for e in endpoints):
        problems.add("judging.cost_cap", "no judge or model has a price")


def batched(judging: JudgingOptions, runs: list[MetricRun]) -> list[tuple[MetricRun, str, str]]:
    """The judge entries whose mode (their ``mode`` parameter, else ``judging.mode``) is batch
    or auto: (run, mode, where the mode comes from as messages say it: "" or " (judging.mode)")."""
    from evalq.shared.judging.batch_config import BATCHED

    found = []
    for run in runs:
        if run.judge is None or not hasattr(run.params, "effective_mode"):
            continue
        mode = run.params.effective_mode(judging)
        if mode in BATCHED:
            found.append((run, mode, "" if run.params.mode else " (judging.mode)"))
    return found


def check_batch(judging: JudgingOptions, runs: list[MetricRun], model: Any, problems: Problems) -> None:
    """An entry whose mode is batch or auto (``batched``) needs a judge with a deployment
    that declares ``batch``; so does generation through an endpoint model when
    ``judging.mode`` is batch (with auto, a model without one generates synchronously)."""
    for run, mode, source in batched(judging, runs):
        if not run.judge.batch_deployments:
            where = f"{run.where}.parameters.mode" if run.params.mode else run.where
            problems.add(where, f"mode {mode!r}{source} needs a batch-capable deployment, and none of judge "
                         f"{run.params.judge!r}'s deployments ({_regions(run.judge)}) declares 'batch' "
                         "(e.g. \"batch\": {\"enqueued_tokens\": 50000000})")
    if judging.mode == "batch" and isinstance(model, EndpointConfig) and not model.batch_deployments:
        problems.add("model", f"judging.mode 'batch' also generates through the Batch API, and none of the "
                     f"model's deployments ({_regions(model)}) declares 'batch'")


def _regions(config: EndpointConfig) -> str:
    return ", ".join(d.region for d in config.deployments)


def check_key_env(variable: str, where: str, problems: Problems) -> None:
    """The API key's variable must be set here; for a check that reads no secret
    (``problems.keys_needed`` False) it is only named, and an unset one is noted."""
    if not os.environ.get(variable):
        if not problems.keys_needed:
            problems.unset_keys.append((where, variable))
        else:
            problems.add(where, f"environment variable {variable} is not set (the API key is read from it)")


def check_endpoints(config, where: str, problems: Problems) -> None:
    """Every deployment's endpoint must be one the operator lets its key go to
    (``EVALQ_ENDPOINTS``, when set here; workers check again before each call)."""
    from evalq.shared.policy.endpoints import EndpointPolicy, endpoint_url

    try:
        policy = EndpointPolicy.from_env()
    except ValueError as exc:
        raise JobError(str(exc)) from None
    if policy is None:
        return
    for i, d in enumerate(config.deployments):
        problem = policy.problem(config.api_key_env, endpoint_url(config.provider, d))
        if problem:
            problems.add(f"{where}.deployments[{i}] ({d.region})", problem)


def parse_metrics(raw: Any, problems: Problems) -> list[MetricRun]:
    if raw is None:
        problems.add("metrics", "missing; expected a list of {id, enable, parameters}")
        return []
    if not isinstance(raw, list):
        problems.add("metrics", f"expected a list, got {kind(raw)}")
        return []
    runs: list[MetricRun] = []
    names: dict[str, int] = {}  # name -> position of the enabled entry that has it
    computed: dict[tuple[str, str], int] = {}  # (id, resolved parameters) -> position
    for i, entry in enumerate(raw):
        where = f"metrics[{i}]"
        if not isinstance(entry, dict):
            problems.add(where, f"expected an object, got {kind(entry)}")
            continue
        metric_id = entry.get("id")
        if isinstance(metric_id, str):
            where = f"metrics[{i}] ({metric_id})"
        for key in sorted(set(entry) - METRIC_KEYS):
            problems.add(where, f"unknown field {key!r}{did_you_mean(key, METRIC_KEYS)}")
        if not isinstance(metric_id, str):
            problems.add(where, "'id' is required and must be a string")
            continue
        enable = entry.get("enable", True)
        if not isinstance(enable, bool):
            problems.add(where, f"'enable' must be true or false, got {json.dumps(enable)}")
            continue
        spec = entry_spec(where, metric_id, problems.add)
        if spec is None:
            continue
        # a queue request's local paths (bertscore's model_type, baseline_path) must lie under its roots
        params = entry_params(where, spec, entry.get("parameters"), problems.add, problems.roots)
        if params is None:
            continue
        name = entry.get("name")
        if name is not None and (not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME):
            problems.add(where, f"'name' must be a non-empty string of at most {MAX_NAME} characters, "
                         f"got {json.dumps(name)[:80]}")
            continue
        if not enable:  # validated, not run
            continue
        if name is not None:
            if name in names:
                problems.add(where, f"name {name!r} is already used by metrics[{names[name]}]; "
                             "names must be distinct (or leave them out)")
                continue
            names[name] = i
        # the same metric may be listed again with other parameters; with the same
        # (defaults filled in) it would compute the same thing twice, whichever path (mode) its calls take
        same = (metric_id, json.dumps(params.model_dump(mode="json", exclude={"mode"}), sort_keys=True))
        if same in computed:
            problems.add(where, f"same metric and parameters as metrics[{computed[same]}] (defaults filled "
                         "in): it would compute the same thing twice; change the parameters or remove one")
            continue
        computed[same] = i
        runs.append(MetricRun(key=f"{metric_id}@{i}", spec=spec, params=params, name=name, position=i))
    return runs


def entry_spec(where: str, metric_id: str, add: Callable[[str, str], None]) -> MetricSpec | None:
    """The metric an entry names, or None, said through ``add(where, message)``."""
    try:
        return REGISTRY.get(metric_id)
    except UnknownMetric as exc:
        add(where, str(exc))
        return None


def entry_params(where: str, spec: MetricSpec, raw: Any, add: Callable[[str, str], None],
                 roots: list | None = None) -> Any | None:
    """An entry's ``parameters`` validated, defaults filled in (``roots``: a queue request's, under
    which its local paths must lie), or None, each problem said through ``add(where, message)``."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        add(f"{where}.parameters", f"expected an object, got {kind(raw)}")
        return None
    try:
        return spec.params.model_validate(raw, context={"roots": roots})
    except ValidationError as exc:
        for message in param_errors(exc, spec):
            add(f"{where}.parameters", message)
        return None


def param_errors(exc: ValidationError, spec: MetricSpec) -> list[str]:
    allowed = list(spec.params.model_fields)
    messages = []
    for err in exc.errors():
        loc = ".".join(str(part) for part in err["loc"])
        if err["type"] == "extra_forbidden":
            name = str(err["loc"][0])
            listing = ", ".join(allowed) if allowed else "none"
            messages.append(f"unknown parameter {name!r}{did_you_mean(name, allowed)} "
                            f"(parameters of {spec.id}: {listing})")
        else:
            got = json.dumps(err.get("input"), default=str)
            if len(got) > 200:  # a refused parameter may be huge: say what it was, not all of it
                got = got[:200] + f"... ({len(got):,} characters)"
            messages.append(f"{loc}: {err['msg']} (got {got})")
    return messages
