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
from typing import Any, Protocol

from pydantic import Field, field_validator

from evalq.shared.judges import EndpointConfig, _Model
from evalq.shared.params import Params
from evalq.shared.registry import MetricSpec

# The stage's key in the job spec and in Redis (a reserved metric id).
GENERATE = "generate"
RUNNER_QUEUE = "generate.local"
PLACEHOLDERS = {"model_input", "context"}


class ModelRunner(Protocol):
    """fmeval's interface: a prompt in, the output and its log probability out."""

    def predict(self, prompt: str) -> tuple[str | None, float | None]: ...


def _check_template(value: str) -> str:
    template = string.Template(value)
    if not template.is_valid():
        raise ValueError("invalid template: a '$' must start $model_input or $context ('$$' for a dollar)")
    unknown = set(template.get_identifiers()) - PLACEHOLDERS
    if unknown:
        raise ValueError(f"unknown placeholder(s) {', '.join('$' + u for u in sorted(unknown))}; "
                         "use $model_input and $context")
    return value


class _Prompting(_Model):
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
    had. The orchestrator checks it at validation, workers build it."""
    import importlib

    module_name, _, attr = model.runner.partition(":")
    try:
        obj = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as exc:  # ImportError, AttributeError, or the module's own failure
        raise ValueError(f"cannot import {model.runner!r}: {type(exc).__name__}: {exc}") from None
    if not callable(getattr(obj, "predict", None)):
        raise ValueError(f"{model.runner!r} has no predict(prompt) method")
    return obj


class GenerateParams(Params):
    """The stage's parameters, as the log shows them."""

    prompt_template: str
    system: str | None = None
    model: str


def render_prompt(template: str, instance: dict) -> str:
    context = instance.get("context")
    if isinstance(context, list):
        context = "\n\n".join(str(c) for c in context)
    return string.Template(template).substitute(model_input=instance.get("input", ""),
                                                context=context or "")


GENERATE_SPEC = MetricSpec(
    id=GENERATE, params=GenerateParams, impl="evalq.workers.generate:generate", queue="generate",
    description="the model under test answers instances that have no actual-output",
    requires=("input",), chunk_size=4)
