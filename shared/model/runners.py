"""The model under test (fmeval's ModelRunner): the ``model`` section of a job.

When records carry no model output, a first stage generates it: each such
instance's prompt (``prompt_template`` with fmeval's ``$model_input``) goes to
the model, either an OpenAI-compatible or Azure endpoint on rate-limited
``generate.<region>`` queues (the judges' budget machinery), or a Python class
with ``predict(prompt) -> (output, log_probability)`` on ``generate.local``.
The metrics then run on the generated outputs.
"""

from __future__ import annotations

import string
from typing import Any

from pydantic import Field, field_validator

from evalq.shared.judging.judges import EndpointConfig
from evalq.shared.cluster.spec import GENERATE
from evalq.shared.core.strict import Strict
from evalq.shared.core.strict import Params
from evalq.shared.metrics.registry import MetricSpec

# The stage's key in the job spec and in Redis (a reserved metric id).
RUNNER_QUEUE = "generate.local"
PLACEHOLDERS = {"model_input", "context"}


class ModelRunner:
    """fmeval's interface: a prompt in, the output and its log probability out.

    A job may name (``model.runner``) only a subclass of this class, or a class
    registered with ``register_runner``, in a module the operator loaded
    (``EVALQ_PLUGINS``) or installed under the ``evalq.model_runners`` entry point.

    A runner that returns log-probabilities says so with ``gives_log_probability = True``
    (``prompt_stereotyping`` needs it); it may also define ``log_probability(prompt)``, which
    is then used where only the log-probability is wanted (no generation).

    ``Parameters``: the typed keyword arguments it takes (an ``evalq.shared.metrics.params.Params``).
    A job's ``model.parameters`` are validated against them where the job is validated (a
    located error, exit 2; a path parameter through ``local_path`` lies under a queue
    request's roots) and again where the runner is built; a runner without them gets the
    job's parameters as they are, so one that loads anything a job names should declare them.
    """

    gives_log_probability = False
    Parameters: "type | None" = None

    def predict(self, prompt: str) -> tuple[str | None, float | None]:
        raise NotImplementedError


class PromptedModel:
    """The model under test as a variants function asks it: an instance's text through the job's
    prompt template. ``sample`` > 0 asks the same prompt again as a new call (never answered
    from the cache: a non-deterministic model's baseline)."""

    def __init__(self, runner, template: str):
        self.runner = runner
        self.template = template

    def prompt(self, instance: dict, model_input: str) -> str:
        return render_prompt(self.template, {**instance, "input": model_input})

    def answer(self, instance: dict, model_input: str, sample: int = 0) -> str:
        from evalq.shared.core.errors import MetricError

        output, _ = self.runner.predict(self.prompt(instance, model_input), sample=sample)
        if output is None:
            raise MetricError("the model returned no output")
        return output

    def log_probability(self, instance: dict, text: str) -> float:
        """The model's log-probability of ``text`` (through the template): its runner's
        ``log_probability``, else the second value ``predict`` returns."""
        from evalq.shared.core.errors import MetricError

        prompt = self.prompt(instance, text)
        ask = getattr(self.runner, "log_probability", None)
        value = ask(prompt) if callable(ask) else self.runner.predict(prompt)[1]
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise MetricError(f"the model gave no log-probability (got {type(value).__name__})")
        return float(value)


RUNNER_ENTRY_POINTS = "evalq.model_runners"
_REGISTERED: dict[str, type] = {}


def register_runner(cls: type) -> type:
    """Allow a class that does not subclass ModelRunner (usable as a decorator)."""
    if not callable(getattr(cls, "predict", None)):
        raise TypeError(f"{cls!r} has no predict(prompt) method")
    _REGISTERED[f"{cls.__module__}:{cls.__qualname__}"] = cls
    return cls


def _entry_point_refs() -> set[str]:
    from importlib.metadata import entry_points

    return {ep.value.strip() for ep in entry_points(group=RUNNER_ENTRY_POINTS)}


def _check_template(value: str) -> str:
    template = string.Template(value)
    if not template.is_valid():
        raise ValueError("invalid template: a '$' must start $model_input or $context ('$$' for a dollar)")
    unknown = set(template.get_identifiers()) - PLACEHOLDERS
    if unknown:
        raise ValueError(f"unknown placeholder(s) {', '.join('$' + u for u in sorted(unknown))}; "
                         "use $model_input and $context")
    return value


class _Prompting(Strict):
    prompt_template: str = Field(default="$model_input",
                                 description="prompt sent to the model; $model_input and $context are replaced")
    system: str | None = Field(default=None, description="system message sent before the prompt")

    @field_validator("prompt_template")
    @classmethod
    def _valid_template(cls, value: str) -> str:
        return _check_template(value)


class EndpointModel(EndpointConfig, _Prompting):
    """A model behind OpenAI-compatible or Azure deployments."""

    temperature: float = Field(default=0.0, ge=0, le=2)
    cache: bool = Field(default=True, description="answer identical requests from the Redis cache, so a "
                        "re-run of the same job does not generate again")


class PythonModel(_Prompting):
    """A ``ModelRunner`` class, imported and built once per worker process."""

    runner: str = Field(pattern=r"^[\w.]+:[\w.]+$", description="'package.module:Class'")
    parameters: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the class")


def parse_model_config(raw: dict) -> EndpointModel | PythonModel:
    return (PythonModel if "runner" in raw else EndpointModel).model_validate(raw)


def runner_class(model: PythonModel) -> type:
    """The ``module:Class`` a job names; ValueError saying why when it cannot be
    had. The orchestrator checks it at validation, workers build it.

    A job file is untrusted: naming a module must not run it. Only a module
    already loaded by the operator's configuration (evalq itself, ``EVALQ_PLUGINS``)
    or a runner installed under the ``evalq.model_runners`` entry point is looked
    at; anything else is refused before any import.
    """
    import importlib
    import sys

    ref = model.runner
    if ref in _REGISTERED:
        return _REGISTERED[ref]
    module_name, _, attr = ref.partition(":")
    if module_name not in sys.modules and ref not in _entry_point_refs():
        raise ValueError(f"{ref!r} is not an allowed model runner (nothing was imported): name a ModelRunner "
                         f"subclass from a module in EVALQ_PLUGINS, or one installed under the "
                         f"{RUNNER_ENTRY_POINTS!r} entry point")
    try:
        obj = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as exc:  # ImportError, AttributeError, or the module's own failure
        raise ValueError(f"cannot import {ref!r}: {type(exc).__name__}: {exc}") from None
    if not (isinstance(obj, type) and issubclass(obj, ModelRunner)) and ref not in _REGISTERED:
        raise ValueError(f"{ref!r} is not a subclass of evalq.shared.model.runners.ModelRunner (nor registered "
                         "with register_runner)")
    return obj


def runner_parameters(model: PythonModel, cls: type, roots=None) -> dict:
    """``model.parameters`` as the runner class ``cls`` declares them (``Parameters``), validated
    (``roots``: a queue request's, for path parameters); ValueError listing every problem, each
    at its field. A runner without ``Parameters`` takes them as they are."""
    declared = getattr(cls, "Parameters", None)
    if declared is None:
        return dict(model.parameters)
    from pydantic import ValidationError

    try:
        return declared.model_validate(model.parameters, context={"roots": roots}).model_dump()
    except ValidationError as exc:
        raise ValueError("; ".join(f"{'.'.join(map(str, e['loc'])) or '(all)'}: {e['msg']}"
                                   for e in exc.errors()[:10])) from None


class GenerateParams(Params):
    """The stage's parameters, as the log shows them."""

    prompt_template: str
    system: str | None = None
    model: str


def render_prompt(template: str, instance: dict) -> str:
    from evalq.shared.data.instances import context_text

    return string.Template(template).substitute(model_input=instance.get("input", ""),
                                                context=context_text(instance))


GENERATE_SPEC = MetricSpec(
    id=GENERATE, params=GenerateParams, impl="evalq.workers.generate:generate", queue="generate",
    description="the model under test answers instances that have no actual-output",
    requires=("input",), chunk_size=4)
