"""The job file: HarpIA-style ``instances`` and ``metrics``, loaded and validated whole.

Validation collects every problem it finds, each naming its place (file, line
and column for JSON syntax; instance id and field; metric and parameter), and
raises one ``JobError``. Nothing is enqueued until a job validates.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

import evalq.shared.metrics  # noqa: F401  (registers the built-in metrics)
from evalq.shared.dataset import DatasetSpec, JailbreakSpec, OutputSpec
from evalq.shared.egress import roots_problem, s3_problem
from evalq.shared.errors import JobError, kind as _kind
from evalq.shared.instances import BadRecords, InstanceChecker, load_dataset, record_place, report_duplicates
from evalq.shared.judges import JudgeConfig, JudgingOptions
from evalq.shared.storage import is_s3
from evalq.shared.model import (GENERATE_SPEC, RUNNER_QUEUE, EndpointModel, GenerateParams, PythonModel,
                          runner_class)
from evalq.shared.registry import REGISTRY, MetricSpec, UnknownMetric

MAX_PROBLEMS = 25
JOB_KEYS = {"instances", "dataset", "output", "model", "metrics", "judges", "judging", "jailbreak"}
JAILBREAK = "jailbreak"  # the ``variant`` of an injected instance
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

    @property
    def queues(self) -> list[str]:
        """Queues this run's tasks go to: one per deployment for judge (and generate) runs."""
        if self.judge is not None:
            return [f"{self.spec.queue}.{d.region}" for d in self.judge.deployments]
        if self.spec.queue == "generate":
            return [RUNNER_QUEUE]
        return [self.spec.queue]

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


@dataclass
class Job:
    source: str
    # a list (inline instances) or a SpooledInstances (a dataset): len() and iteration
    instances: Any
    metrics: list[MetricRun]
    judges: dict[str, JudgeConfig] = field(default_factory=dict)
    judging: JudgingOptions = field(default_factory=JudgingOptions)
    model: EndpointModel | PythonModel | None = None
    n_to_generate: int = 0      # instances whose actual-output the model generates
    dataset: DatasetSpec | None = None
    mapping: str = ""           # how dataset records were read (preset or data_config)
    bad_records: BadRecords = field(default_factory=BadRecords)
    output: OutputSpec | None = None
    categories: list[str] = field(default_factory=list)
    jailbreak: JailbreakSpec | None = None
    # with a jailbreak: the clean instances come first, then their injected variants
    n_clean: int | None = None

    def span(self, run: MetricRun) -> int:
        """How many instance positions (from the first) a metric entry grades: all
        of them for safety metrics, only the clean ones for the others."""
        if self.n_clean is None or run.spec.aggregation == "defect" or run.key == GENERATE_SPEC.id:
            return len(self.instances)
        return self.n_clean

    @property
    def generation(self) -> MetricRun | None:
        """The generation stage as a run of the reserved ``generate`` item function."""
        if self.model is None or not self.n_to_generate:
            return None
        name = self.model.runner if isinstance(self.model, PythonModel) else self.model.model
        params = GenerateParams(prompt_template=self.model.prompt_template, system=self.model.system, model=name)
        return MetricRun(key=GENERATE_SPEC.id, spec=GENERATE_SPEC, params=params,
                         judge=self.model if isinstance(self.model, EndpointModel) else None)

    @property
    def runs(self) -> list[MetricRun]:
        """Everything that gets tasks: the generation stage (if any) and the metrics."""
        return ([self.generation] if self.generation else []) + self.metrics

    @property
    def queues(self) -> list[str]:
        return sorted({q for m in self.runs for q in m.queues})


class _Problems:
    def __init__(self, source: str):
        self.roots: list[Path] | None = None
        self.source = source
        self.items: list[str] = []
        self.truncated = 0

    def add(self, where: str, message: str) -> None:
        if len(self.items) < MAX_PROBLEMS:
            self.items.append(f"{self.source}: {where}: {message}")
        else:
            self.truncated += 1

    def raise_if_any(self) -> None:
        if self.items:
            if self.truncated:
                self.items.append(f"{self.source}: ... and {self.truncated} more problems")
            raise JobError(self.items)


def read_json(path: str | Path) -> Any:
    """Parse a JSON job file (gzipped or not), bounded like every job document;
    a syntax error names the file, line and column."""
    from evalq.shared.limits import read_document

    if Path(path).expanduser().is_dir():
        raise JobError(f"{path}: is a directory, expected a JSON job file")
    return read_document(str(path), hint="put the instances in a JSON Lines dataset, which is streamed")


def load_job(path: str | Path) -> Job:
    return parse_job(read_json(path), source=str(path))


def parse_job(raw: Any, source: str = "<job>", roots: list[Path] | None = None) -> Job:
    """Validate a job. With ``roots`` (a job from a request: untrusted), a local
    file it names (a dataset) must lie under one of these directories; it is not
    opened otherwise."""
    problems = _Problems(source)
    problems.roots = roots
    if not isinstance(raw, dict):
        problems.add("top level", f"expected an object with 'instances' and 'metrics', got {_kind(raw)}")
        problems.raise_if_any()
    for key in sorted(set(raw) - JOB_KEYS):
        problems.add(key, f"unknown top-level field{_did_you_mean(key, JOB_KEYS)}")
    judges = _parse_judges(raw.get("judges"), problems)
    judging = _parse_model(JudgingOptions, raw.get("judging", {}), "judging", problems) or JudgingOptions()
    model = _parse_model_section(raw.get("model"), problems)
    output = _parse_model(OutputSpec, raw["output"], "output", problems) if "output" in raw else None
    if output is not None:
        _s3_allowed(output, "output", problems)
    metrics = _parse_metrics(raw.get("metrics"), problems)
    metrics = _resolve_judges(metrics, judges, problems)
    if isinstance(model, EndpointModel):
        _check_key_env(model.api_key_env, "model.api_key_env", problems)
        _check_endpoints(model, "model", problems)
    elif isinstance(model, PythonModel):
        try:
            runner_class(model)
        except ValueError as exc:
            problems.add("model.runner", str(exc))
    job = Job(source=source, instances=[], metrics=metrics, judges=judges, judging=judging, model=model,
              output=output)
    _load_instances(raw, job, problems)
    if "jailbreak" in raw and not problems.items:
        _add_jailbreak(raw["jailbreak"], job, problems)
    problems.raise_if_any()
    if not metrics:
        raise JobError(f"{source}: metrics: no metric is enabled; nothing to run")
    return job


def _parse_model_section(raw: Any, problems: _Problems) -> EndpointModel | PythonModel | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        problems.add("model", f"expected an object, got {_kind(raw)}")
        return None
    return _parse_model(PythonModel if "runner" in raw else EndpointModel, raw, "model", problems)


def _required_fields(metrics: list[MetricRun]) -> dict[str, list[str]]:
    required: dict[str, list[str]] = {}
    for run in metrics:
        for f in run.spec.requires:
            users = required.setdefault(f, [])
            if run.label not in users:  # a metric listed twice is named once
                users.append(run.label)
    return required


def _add_jailbreak(raw: Any, job: Job, problems: _Problems) -> None:
    """Append each clean instance's injected variant (``"variant": "jailbreak"``,
    no output: the model under test answers it)."""
    from string import Template

    spec = _parse_model(JailbreakSpec, raw, "jailbreak", problems)
    if spec is None:
        return
    if job.model is None:
        problems.add("jailbreak", "needs a 'model': the model under test answers the injected prompts")
        return
    if not any(m.spec.aggregation == "defect" for m in job.metrics):
        problems.add("jailbreak", "no safety metric is enabled to grade the injected answers (e.g. violence, "
                                  "content_safety)")
        return
    injected_inputs: dict[str, str] | None = None
    if spec.dataset is not None:
        dataset = _relative_to_job(spec.dataset, job.source)
        if (not _within_roots(dataset.uri, "jailbreak.dataset.uri", problems)
                or not _s3_allowed(dataset, "jailbreak.dataset", problems)):
            return
        checker = InstanceChecker({"input": ["jailbreak"]}, generating=False)
        loaded = load_dataset(dataset, checker, lambda where, msg: problems.add(f"jailbreak: {where}", msg),
                              MAX_PROBLEMS)
        injected_inputs = {str(inst["id"]): inst["input"] for inst in loaded.instances}
    template = Template(spec.template) if spec.template is not None else None
    variants, matched = [], set()
    for n, inst in enumerate(job.instances):
        key = str(inst["id"])
        if injected_inputs is not None:
            if key not in injected_inputs:
                continue
            prompt = injected_inputs[key]
            matched.add(key)
        elif "input" not in inst:
            problems.add(f"instance {inst['id']!r}", "has no 'input' for the jailbreak template to wrap")
            continue
        else:
            prompt = template.safe_substitute(model_input=inst["input"])
        variant = {k: v for k, v in inst.items() if k not in ("actual-output", "human")}
        variant.update({"input": prompt, "variant": JAILBREAK})
        variants.append(variant)
    if injected_inputs is not None:
        for key in sorted(set(injected_inputs) - matched)[:10]:
            problems.add("jailbreak.dataset", f"injected prompt {key!r} matches no instance id")
    if problems.items:
        return
    job.n_clean = len(job.instances)
    for variant in variants:
        job.instances.append(variant)
    job.n_to_generate += len(variants)
    job.jailbreak = spec


def _within_roots(uri: str, where: str, problems: _Problems) -> bool:
    problem = roots_problem(uri, problems.roots) if problems.roots is not None else None
    if problem:
        problems.add(where, problem)
    return problem is None


def _s3_allowed(spec, where: str, problems: _Problems) -> bool:
    """An S3 dataset or output the operator's lists allow (checked again at every read and write)."""
    problem = s3_problem(spec.uri, spec.endpoint_url) if is_s3(spec.uri) else None
    if problem:
        problems.add(where, problem)
    return problem is None


def _check_endpoints(config, where: str, problems: _Problems) -> None:
    """Every deployment's endpoint must be one the operator lets its key go to
    (``EVALQ_ENDPOINTS``, when set here; workers check again before each call)."""
    from evalq.shared.endpoints import EndpointPolicy, endpoint_url

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


def _human_scales(metrics: list[MetricRun]) -> dict:
    """The scale human grades of each entry must be on, by the name grades use
    (the entry's ``name``, else its metric id): only metrics with an agreement measure."""
    from evalq.shared.instances import HumanScale

    scales = {}
    for run in metrics:
        if run.spec.aggregation == "rating":
            scale = HumanScale("rating", getattr(run.params, "scale_min", 1), getattr(run.params, "scale_max", 5))
        elif run.spec.aggregation == "defect":
            scale = HumanScale("severity" if hasattr(run.params, "threshold") else "flag")
        else:
            continue
        scales[run.name or run.spec.id] = scale
    return scales


def _load_instances(raw: dict, job: Job, problems: _Problems) -> None:
    """Inline instances or a dataset (exactly one), each checked as it is read."""
    has_inline, has_dataset = "instances" in raw, "dataset" in raw
    if has_inline == has_dataset:
        problems.add("instances" if has_inline else "top level",
                     "give either 'instances' or 'dataset', not both" if has_inline
                     else "missing 'instances' (a list) or 'dataset' (a file to read them from)")
        return
    checker = InstanceChecker(_required_fields(job.metrics), generating=job.model is not None,
                              human_scales=_human_scales(job.metrics))
    if has_inline:
        job.instances = _check_instances(raw["instances"], checker, problems)
        places = ((f"instance {i.get('id')!r} (instances[{n}])", f"instances[{n}]")
                  for n, i in enumerate(job.instances) if isinstance(i, dict))
    else:
        dataset = _parse_model(DatasetSpec, raw["dataset"], "dataset", problems)
        if dataset is None:
            return
        dataset = _relative_to_job(dataset, job.source)
        allowed = _within_roots(dataset.uri, "dataset.uri", problems) and _s3_allowed(dataset, "dataset", problems)
        if not allowed or problems.items:  # a typo elsewhere is not worth reading a big file for
            return
        loaded = load_dataset(dataset, checker, problems.add, MAX_PROBLEMS)
        job.dataset, job.instances, job.mapping, job.bad_records = dataset, loaded.instances, loaded.mapping, loaded.bad
        places = ((record_place(dataset, n), record_place(dataset, n, short=True)) for n in loaded.lines)
    suspects = checker.duplicate_ids()
    if suspects:
        report_duplicates(job.instances, places, suspects, problems.add)
    job.n_to_generate = checker.n_to_generate
    job.categories = sorted(checker.categories)


def _parse_model(model: type[BaseModel], raw: Any, where: str, problems: _Problems):
    if not isinstance(raw, dict):
        problems.add(where, f"expected an object, got {_kind(raw)}")
        return None
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"])
            if err["type"] == "extra_forbidden":
                name = str(err["loc"][-1])
                hint = _did_you_mean(name, model.model_fields)
                problems.add(f"{where}.{loc}" if loc else where, f"unknown field{hint}")
            else:
                msg = err["msg"].removeprefix("Value error, ")
                problems.add(f"{where}.{loc}" if loc else where, msg)
        return None


def _parse_judges(raw: Any, problems: _Problems) -> dict[str, JudgeConfig]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        problems.add("judges", f"expected an object of named judges, got {_kind(raw)}")
        return {}
    judges = {}
    for name, cfg in raw.items():
        judge = _parse_model(JudgeConfig, cfg, f"judges.{name}", problems)
        if judge is not None:
            judges[name] = judge
    return judges


def _resolve_judges(runs: list[MetricRun], judges: dict[str, JudgeConfig],
                    problems: _Problems) -> list[MetricRun]:
    """Attach each judge metric's judge; a judge in use must have its key variable set."""
    resolved = []
    checked_env = set()
    for run in runs:
        name = getattr(run.params, "judge", None)
        if run.spec.queue != "judge" or name is None:
            resolved.append(run)
            continue
        judge = judges.get(name)
        if judge is None:
            known = ", ".join(sorted(judges)) or "none defined"
            problems.add(f"{run.where}.parameters.judge",
                         f"no judge named {name!r}{_did_you_mean(name, judges)} (judges: {known})")
            continue
        if name not in checked_env:
            _check_key_env(judge.api_key_env, f"judges.{name}.api_key_env", problems)
            _check_endpoints(judge, f"judges.{name}", problems)
        checked_env.add(name)
        resolved.append(dataclasses.replace(run, judge=judge))
    return resolved


def _check_key_env(variable: str, where: str, problems: _Problems) -> None:
    if not os.environ.get(variable):
        problems.add(where, f"environment variable {variable} is not set (the API key is read from it)")


def _parse_metrics(raw: Any, problems: _Problems) -> list[MetricRun]:
    if raw is None:
        problems.add("metrics", "missing; expected a list of {id, enable, parameters}")
        return []
    if not isinstance(raw, list):
        problems.add("metrics", f"expected a list, got {_kind(raw)}")
        return []
    runs: list[MetricRun] = []
    names: dict[str, int] = {}  # name -> position of the enabled entry that has it
    computed: dict[tuple[str, str], int] = {}  # (id, resolved parameters) -> position
    for i, entry in enumerate(raw):
        where = f"metrics[{i}]"
        if not isinstance(entry, dict):
            problems.add(where, f"expected an object, got {_kind(entry)}")
            continue
        metric_id = entry.get("id")
        if isinstance(metric_id, str):
            where = f"metrics[{i}] ({metric_id})"
        for key in sorted(set(entry) - METRIC_KEYS):
            problems.add(where, f"unknown field {key!r}{_did_you_mean(key, METRIC_KEYS)}")
        if not isinstance(metric_id, str):
            problems.add(where, "'id' is required and must be a string")
            continue
        enable = entry.get("enable", True)
        if not isinstance(enable, bool):
            problems.add(where, f"'enable' must be true or false, got {json.dumps(enable)}")
            continue
        try:
            spec = REGISTRY.get(metric_id)
        except UnknownMetric as exc:
            problems.add(where, str(exc))
            continue
        params_raw = entry.get("parameters", {})
        if params_raw is None:
            params_raw = {}
        if not isinstance(params_raw, dict):
            problems.add(f"{where}.parameters", f"expected an object, got {_kind(params_raw)}")
            continue
        try:
            # a queue request's local paths (bertscore's model_type, baseline_path) must lie under its roots
            params = spec.params.model_validate(params_raw, context={"roots": problems.roots})
        except ValidationError as exc:
            for message in _param_errors(exc, spec):
                problems.add(f"{where}.parameters", message)
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
        # (defaults filled in) it would compute the same thing twice
        same = (metric_id, json.dumps(params.model_dump(mode="json"), sort_keys=True))
        if same in computed:
            problems.add(where, f"same metric and parameters as metrics[{computed[same]}] (defaults filled "
                         "in): it would compute the same thing twice; change the parameters or remove one")
            continue
        computed[same] = i
        runs.append(MetricRun(key=f"{metric_id}@{i}", spec=spec, params=params, name=name, position=i))
    return runs


def _param_errors(exc: ValidationError, spec: MetricSpec) -> list[str]:
    allowed = list(spec.params.model_fields)
    messages = []
    for err in exc.errors():
        loc = ".".join(str(part) for part in err["loc"])
        if err["type"] == "extra_forbidden":
            name = str(err["loc"][0])
            listing = ", ".join(allowed) if allowed else "none"
            messages.append(f"unknown parameter {name!r}{_did_you_mean(name, allowed)} "
                            f"(parameters of {spec.id}: {listing})")
        else:
            got = json.dumps(err.get("input"), default=str)
            if len(got) > 200:  # a refused parameter may be huge: say what it was, not all of it
                got = got[:200] + f"... ({len(got):,} characters)"
            messages.append(f"{loc}: {err['msg']} (got {got})")
    return messages


def _relative_to_job(dataset: DatasetSpec, source: str) -> DatasetSpec:
    """A relative local dataset path is read from the job file's folder."""
    job_file = Path(source)
    if is_s3(dataset.uri) or Path(dataset.uri).expanduser().is_absolute() or not job_file.is_file():
        return dataset
    return dataset.model_copy(update={"uri": str(job_file.parent / dataset.uri)})


def _check_instances(raw: Any, checker: InstanceChecker, problems: _Problems) -> list[dict]:
    if not isinstance(raw, list):
        problems.add("instances", f"expected a list, got {_kind(raw)}")
        return []
    if not raw:
        problems.add("instances", "empty; nothing to evaluate")
        return []
    for i, inst in enumerate(raw):
        if not isinstance(inst, dict):
            problems.add(f"instances[{i}]", f"expected an object, got {_kind(inst)}")
            continue
        iid = inst.get("id")
        if isinstance(iid, bool) or not isinstance(iid, (str, int)) or iid == "":
            problems.add(f"instances[{i}]", "'id' is required (a non-empty string or an integer)")
            continue
        for message in checker.check(inst):
            problems.add(f"instance {iid!r} (instances[{i}])", message)
    return raw


def _did_you_mean(name: str, choices) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""
