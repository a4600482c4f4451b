"""The generation stage: the model under test answers an instance's prompt.

``generate`` is a pure item function like any metric: it renders the prompt
and asks the ``ModelRunner`` passed in. A runner is either a Python class named
in the job (built once per worker process) or ``EndpointRunner``, which sends
the prompt as a chat completion through the judges' ``JudgeClient`` (budget,
cache, retries and accounting included).
"""

from __future__ import annotations

import json
import threading
from typing import Any

from evalq.shared.core.errors import MetricError
from evalq.shared.model.runners import (GenerateParams, ModelRunner, PythonModel, render_prompt, runner_class,
                                           runner_parameters)


def generate(instance: dict, params: GenerateParams, runner: ModelRunner) -> dict:
    output, log_probability = runner.predict(render_prompt(params.prompt_template, instance))
    if output is None:
        raise MetricError("the model returned no output")
    return {"output": output, "log_probability": log_probability}


class EndpointRunner:
    """``predict`` as one chat completion (system message first when given)."""

    def __init__(self, client, system: str | None):
        self.client = client
        self.system = system

    def predict(self, prompt: str, sample: int = 0) -> tuple[str | None, float | None]:
        """``sample`` > 0: the same prompt asked again, a call of its own (not the cached answer)."""
        messages = ([{"role": "system", "content": self.system}] if self.system else []) + \
            [{"role": "user", "content": prompt}]
        return (self.client.complete(messages, sample=sample) if sample else self.client.complete(messages)).content, \
            None


class _Serialized:
    """A user's runner called from a threads pool: one call at a time, since a
    model object is rarely thread-safe."""

    def __init__(self, runner: Any):
        self.runner = runner
        self.lock = threading.Lock()

    def predict(self, prompt: str, sample: int = 0) -> tuple[str | None, float | None]:
        """(``sample``: each call of a Python runner is a call; there is no cache to pass by.)"""
        with self.lock:
            result = self.runner.predict(prompt)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise MetricError(f"{type(self.runner).__name__}.predict must return (output, log_probability), "
                              f"got {type(result).__name__}")
        return result

    @property
    def log_probability(self):
        """The runner's own ``log_probability(prompt)``, serialized, when it has one (else None)."""
        ask = getattr(self.runner, "log_probability", None)
        if not callable(ask):
            return None

        def call(prompt: str) -> float | None:
            with self.lock:
                return ask(prompt)
        return call


_runners: dict[str, _Serialized] = {}
_runners_lock = threading.Lock()


def python_runner(model: PythonModel) -> _Serialized:
    """The job's runner class, built once per process and configuration."""
    key = json.dumps([model.runner, model.parameters], sort_keys=True)
    with _runners_lock:
        if key not in _runners:
            try:
                cls = runner_class(model)
                _runners[key] = _Serialized(cls(**runner_parameters(model, cls)))
            except Exception as exc:  # every item records why; the next chunk tries again
                return _Unbuildable(f"building {model.runner} failed: {type(exc).__name__}: {exc}")
        return _runners[key]


class _Unbuildable:
    def __init__(self, reason: str):
        self.reason = reason

    def predict(self, prompt: str, sample: int = 0) -> tuple[str | None, float | None]:
        raise MetricError(self.reason)
