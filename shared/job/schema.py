"""The job file: HarpIA-style ``instances`` and ``metrics``, loaded and validated whole.

Validation collects every problem it finds, each naming its place (file, line
and column for JSON syntax; instance id and field; metric and parameter), and
raises one ``JobError``. Nothing is enqueued until a job validates.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evalq.shared.data.dataset import DatasetSpec, JailbreakSpec, OutputSpec
from evalq.shared.policy.egress import roots_problem, s3_problem
from evalq.shared.core.errors import JobError, kind
from evalq.shared.data.instances import BadRecords, InstanceChecker, load_dataset, record_place, report_duplicates
from evalq.shared.data.traces import expand_braces, load_traces
from evalq.shared.job.entries import (MetricRun, check_batch, check_cost_cap, check_endpoints,  # noqa: F401
                                      check_key_env, entry_head, parse_judges, parse_metrics, resolve_judges)
from evalq.shared.judging.judges import JudgeConfig, JudgingOptions
from evalq.shared.job.nightly import Regression, Review, suite_of, suite_problem
from evalq.shared.model.runners import (GENERATE_SPEC, EndpointModel, GenerateParams, PythonModel, runner_class,
                                           runner_parameters)
from evalq.shared.core.problems import MAX_PROBLEMS, Problems, did_you_mean, parse_section
from evalq.shared.cluster.scheduling import Scheduling
from evalq.shared.cluster.spec import variants_key
from evalq.shared.data.storage import is_s3

JOB_KEYS = {"instances", "dataset", "output", "model", "metrics", "judges", "judging", "jailbreak", "scheduling",
            "suite", "regression", "review"}
JAILBREAK = "jailbreak"  # the ``variant`` of an injected instance


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
    spans: dict | None = None   # an OTLP trace dataset: what the reading saw (spans read, passed by, sampled)
    output: OutputSpec | None = None
    categories: list[str] = field(default_factory=list)
    jailbreak: JailbreakSpec | None = None
    scheduling: Scheduling = field(default_factory=Scheduling)
    suite: str = ""             # the series its runs belong to in the history store
    regression: Regression = field(default_factory=Regression)
    review: Review = field(default_factory=Review)  # which items a night puts in front of people
    # with a jailbreak: the clean instances come first, then their injected variants
    n_clean: int | None = None
    # the instances' version hashes (``evalq.shared.data.versions``), as they were checked
    versions: Any = None
    # validated without keys (``keys_needed=False``): (place, variable) of each key variable not set here
    unset_keys: list[tuple[str, str]] = field(default_factory=list)

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
    def variant_runs(self) -> list[MetricRun]:
        """The generation stage's runs of variants: the model under test answering each instance's
        variants for an entry that needs them (``MetricSpec.variants``)."""
        if self.model is None:
            return []
        judge = self.model if isinstance(self.model, EndpointModel) else None
        return [dataclasses.replace(m, key=variants_key(m.key), spec=m.spec.variants_spec(), judge=judge)
                for m in self.metrics if m.spec.variants]

    @property
    def runs(self) -> list[MetricRun]:
        """Everything that gets tasks: the generation stage (if any: outputs, variants) and the metrics."""
        return ([self.generation] if self.generation else []) + self.variant_runs + self.metrics

    @property
    def queues(self) -> list[str]:
        return sorted({q for m in self.runs for q in m.queues})


def read_json(path: str | Path) -> Any:
    """Parse a JSON job file (gzipped or not), bounded like every job document;
    a syntax error names the file, line and column."""
    from evalq.shared.data.documents import read_document

    if Path(path).expanduser().is_dir():
        raise JobError(f"{path}: is a directory, expected a JSON job file")
    return read_document(str(path), hint="put the instances in a JSON Lines dataset, which is streamed")


def load_job(path: str | Path, keys_needed: bool = True) -> Job:
    return parse_job(read_json(path), source=str(path), keys_needed=keys_needed)


def parse_job(raw: Any, source: str = "<job>", roots: list[Path] | None = None, keys_needed: bool = True,
              s3=None) -> Job:
    """Validate a job. With ``roots`` (a job from a request: untrusted), a local
    file it names (a dataset, a model, a baseline) must lie under one of these directories; it
    is not opened otherwise; with ``s3`` (an ``evalq.shared.policy.egress.S3Policy``: the request's
    tenant's places) an S3 place must be one of its places. ``keys_needed`` False (a plan, an
    offline check): the judges' and the model's key variables must be named but need not be set
    here (``Job.unset_keys``)."""
    problems = Problems(source)
    problems.roots = roots
    problems.s3 = s3
    problems.keys_needed = keys_needed
    if not isinstance(raw, dict):
        problems.add("top level", f"expected an object with 'instances' and 'metrics', got {kind(raw)}")
        problems.raise_if_any()
    for key in sorted(set(raw) - JOB_KEYS):
        problems.add(key, f"unknown top-level field{did_you_mean(key, JOB_KEYS)}")
    judges = parse_judges(raw.get("judges"), problems)
    judging = parse_section(JudgingOptions, raw.get("judging", {}), "judging", problems) or JudgingOptions()
    model = _parse_model_section(raw.get("model"), problems)
    output = parse_section(OutputSpec, raw["output"], "output", problems) if "output" in raw else None
    if output is not None:
        _s3_allowed(output, "output", problems)
    metrics = parse_metrics(raw.get("metrics"), problems)
    metrics = resolve_judges(metrics, judges, problems, raw.get("judges"))
    check_cost_cap(judging, metrics, model, problems)
    check_batch(judging, metrics, model, problems)
    if isinstance(model, EndpointModel):
        check_key_env(model.api_key_env, "model.api_key_env", problems)
        check_endpoints(model, "model", problems)
    elif isinstance(model, PythonModel):
        try:
            cls = runner_class(model)
        except ValueError as exc:
            problems.add("model.runner", str(exc))
        else:
            try:
                model = model.model_copy(update={"parameters": runner_parameters(model, cls, problems.roots)})
            except ValueError as exc:
                problems.add("model.parameters", str(exc))
    check_variants(metrics, model, problems)
    scheduling = parse_section(Scheduling, raw.get("scheduling", {}), "scheduling", problems) or Scheduling()
    suite = raw.get("suite", suite_of(source))
    if suite_problem(suite):
        problems.add("suite", suite_problem(suite))
    regression = parse_section(Regression, raw.get("regression", {}), "regression", problems) or Regression()
    review = parse_section(Review, raw.get("review", {}), "review", problems) or Review()
    job = Job(source=source, instances=[], metrics=metrics, judges=judges, judging=judging, model=model,
              output=output, scheduling=scheduling, suite=suite, regression=regression, review=review,
              unset_keys=problems.unset_keys)
    _load_instances(raw, job, problems)
    _check_sinks(job, problems)
    if "jailbreak" in raw and not problems.items:
        _add_jailbreak(raw["jailbreak"], job, problems)
    problems.raise_if_any()
    if not metrics:
        raise JobError(f"{source}: metrics: no metric is enabled; nothing to run")
    return job


def _check_sinks(job: Job, problems: Problems) -> None:
    """A sink that attaches scores to the span or trace an item judged (Phoenix, MLflow) needs
    instances that carry one: a trace dataset's (``format: otlp``)."""
    from evalq.shared.core.config import SINK_KINDS, score_sinks

    if job.output is None or not job.output.sinks or problems.items:
        return
    named = score_sinks()
    if job.dataset is not None and job.dataset.format == "otlp":
        return
    for name in (n for n in job.output.sinks if n in named):
        kind = named[name][0]
        problems.add("output.sinks", f"sink {name!r} ({kind}) writes each score on the {SINK_KINDS[kind]} its "
                     "item judged, and this job's instances carry none: a trace dataset's do "
                     "(dataset.format \"otlp\")")


def check_variants(metrics: list[MetricRun], model: Any, problems: Problems) -> None:
    """An entry whose items call the model under test on variants needs a model, and one that
    can give what the entry asks of it (``MetricSpec.model_check``)."""
    for m in metrics:
        if not m.spec.variants:
            continue
        if model is None:
            problems.add(m.where, "needs the model under test (a 'model' section): it answers each instance's "
                         "variants")
        elif m.spec.model_check is not None:
            problem = m.spec.model_check(m.params, model)
            if problem:
                problems.add(m.where, problem)


def _parse_model_section(raw: Any, problems: Problems) -> EndpointModel | PythonModel | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        problems.add("model", f"expected an object, got {kind(raw)}")
        return None
    if "runner" in raw:
        return parse_section(PythonModel, raw, "model", problems)
    from evalq.shared.judging.deployments import resolve_endpoint

    return parse_section(EndpointModel, resolve_endpoint(raw, "model", problems), "model", problems)


def _required_fields(metrics: list[MetricRun]) -> dict[str, list[str]]:
    required: dict[str, list[str]] = {}
    for run in metrics:
        for f in run.spec.required(run.params):
            users = required.setdefault(f, [])
            if run.label not in users:  # a metric listed twice is named once
                users.append(run.label)
    return required


def _add_jailbreak(raw: Any, job: Job, problems: Problems) -> None:
    """Append each clean instance's injected variant (``"variant": "jailbreak"``,
    no output: the model under test answers it)."""
    from string import Template

    spec = parse_section(JailbreakSpec, raw, "jailbreak", problems)
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


def _within_roots(uri: str, where: str, problems: Problems) -> bool:
    problem = roots_problem(uri, problems.roots) if problems.roots is not None else None
    if problem:
        problems.add(where, problem)
    return problem is None


def _s3_allowed(spec, where: str, problems: Problems, uri: str | None = None) -> bool:
    """An S3 dataset or output (or ``uri``, one place of it) the operator's lists allow (checked
    again at every read and write)."""
    uri = uri or spec.uri
    problem = s3_problem(uri, spec.endpoint_url, problems.s3) if uri and is_s3(uri) else None
    if problem:
        problems.add(where, problem)
    return problem is None


def _human_scales(metrics: list[MetricRun]) -> dict:
    """The scale human grades of each entry must be on, by the name grades use
    (the entry's ``name``, else its metric id): only metrics with an agreement measure."""
    from evalq.shared.data.instances import HumanScale

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


def _load_instances(raw: dict, job: Job, problems: Problems) -> None:
    """Inline instances or a dataset (exactly one), each checked as it is read."""
    has_inline, has_dataset = "instances" in raw, "dataset" in raw
    if has_inline == has_dataset:
        problems.add("instances" if has_inline else "top level",
                     "give either 'instances' or 'dataset', not both" if has_inline
                     else "missing 'instances' (a list) or 'dataset' (a file to read them from)")
        return
    required = _required_fields(job.metrics)
    # the model generates missing outputs only where a metric reads them (prompt_stereotyping does not)
    checker = InstanceChecker(required, generating=job.model is not None and "actual-output" in required,
                              human_scales=_human_scales(job.metrics), version_fields=job.regression.dataset_fields)
    if has_inline:
        job.instances = _check_instances(raw["instances"], checker, problems)
        places = ((f"instance {i.get('id')!r} (instances[{n}])", f"instances[{n}]")
                  for n, i in enumerate(job.instances) if isinstance(i, dict))
    else:
        dataset = parse_section(DatasetSpec, raw["dataset"], "dataset", problems)
        if dataset is None:
            return
        dataset = _relative_to_job(dataset, job.source)
        if dataset.format == "otlp":  # model calls, runs and conversations mixed: an entry that needs
            checker.required = {}     # what a span lacks records it not applicable there (evalq.workers.chunk)
            checker.traces = True     # ... and each carries the ids of its span (``otel``), read by evalq
        # a trace dataset's {a,b} alternatives each name a place of their own: each must lie inside
        # the roots, and each S3 one among the tenant's places (as the uri itself must)
        places = expand_braces(dataset.uri) if dataset.format == "otlp" else [dataset.uri]
        allowed = all(_within_roots(uri, "dataset.uri", problems) for uri in places) and \
            all(_s3_allowed(dataset, "dataset", problems, uri) for uri in dict.fromkeys([dataset.uri, *places]))
        if not allowed or problems.items:  # a typo elsewhere is not worth reading a big file for
            return
        if dataset.format == "otlp":  # an application's traces (evalq.shared.data.traces)
            loaded = load_traces(dataset, checker, problems.add, MAX_PROBLEMS, problems.roots)
        else:
            loaded = load_dataset(dataset, checker, problems.add, MAX_PROBLEMS)
        job.dataset, job.instances, job.mapping, job.bad_records = dataset, loaded.instances, loaded.mapping, loaded.bad
        job.spans = loaded.spans
        places = ((record_place(dataset, n), record_place(dataset, n, short=True)) for n in loaded.lines)
    suspects = checker.duplicate_ids()
    if suspects:
        report_duplicates(job.instances, places, suspects, problems.add)
    job.n_to_generate = checker.n_to_generate
    job.categories = sorted(checker.categories)
    job.versions = checker.versions


def _relative_to_job(dataset: DatasetSpec, source: str) -> DatasetSpec:
    """A relative local dataset path is read from the job file's folder."""
    job_file = Path(source)
    if is_s3(dataset.uri) or Path(dataset.uri).expanduser().is_absolute() or not job_file.is_file():
        return dataset
    return dataset.model_copy(update={"uri": str(job_file.parent / dataset.uri)})


def _check_instances(raw: Any, checker: InstanceChecker, problems: Problems) -> list[dict]:
    if not isinstance(raw, list):
        problems.add("instances", f"expected a list, got {kind(raw)}")
        return []
    if not raw:
        problems.add("instances", "empty; nothing to evaluate")
        return []
    for i, inst in enumerate(raw):
        if not isinstance(inst, dict):
            problems.add(f"instances[{i}]", f"expected an object, got {kind(inst)}")
            continue
        iid = inst.get("id")
        if isinstance(iid, bool) or not isinstance(iid, (str, int)) or iid == "":
            problems.add(f"instances[{i}]", "'id' is required (a non-empty string or an integer)")
            continue
        for message in checker.check(inst):
            problems.add(f"instance {iid!r} (instances[{i}])", message)
    return raw


