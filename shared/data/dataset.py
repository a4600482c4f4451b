"""The ``dataset`` and ``output`` sections of a job, and how a dataset record
becomes an evalq instance.

A ``data_config`` follows fmeval's ``DataConfig``: every ``<name>_location`` is a
JMESPath expression into the record. The standard ones map to HarpIA's instance
fields; any other ``<name>_location`` (fmeval's rule for extra columns) keeps
the value under ``<name>``. Built-in presets cover the shapes Azure AI Studio
documents (single-turn QA and conversations) and HarpIA's own instances.

Mapping is a pure function with no I/O; reading local or S3 files lives in
``evalq.shared.data.storage`` and the streaming validation in ``evalq.shared.job.schema``.
"""

from __future__ import annotations

import difflib
import re
from functools import cached_property
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from evalq.shared.core.errors import kind as _kind
from evalq.shared.core.strict import Strict
from evalq.shared.traces.select import TraceSelection

# data_config location -> instance field
STANDARD_LOCATIONS = {
    "id_location": "id",
    "model_input_location": "input",
    "model_output_location": "actual-output",
    "target_output_location": "expected-output",
    "context_location": "context",
    "category_location": "category",
    "messages_location": "messages",
    "baseline_output_location": "baseline-output",  # the other answer a pairwise comparison judges
}
FMEVAL_ONLY = {"dataset_name", "dataset_uri", "dataset_mime_type"}
MIME_TYPES = {"application/jsonlines": "jsonl", "application/json": "json"}

_LAST_ASSISTANT = "messages[?role=='assistant'] | [-1]"
PRESETS: dict[str, dict[str, str]] = {
    # Azure AI Studio single-turn QA: question, context, answer, ground_truth
    "azure_qa": {"id_location": "id", "model_input_location": "question",
                 "model_output_location": "answer", "target_output_location": "ground_truth",
                 "context_location": "context", "category_location": "category"},
    # Azure AI Studio conversations: the last user turn is the input, the last
    # assistant turn the output and its citations the context
    "azure_conversation": {"id_location": "id",
                           "model_input_location": "messages[?role=='user'] | [-1].content",
                           "model_output_location": f"{_LAST_ASSISTANT}.content",
                           "context_location": f"{_LAST_ASSISTANT}.context.citations[].content",
                           "messages_location": "messages", "category_location": "category"},
    # OpenAI chat logs of an agent: the conversation with its tool calls and results, the tools it had
    # (``tools``, as the Chat Completions request gives them) and the calls expected
    "openai_chat": {"id_location": "id", "model_input_location": "messages[?role=='user'] | [-1].content",
                    "model_output_location": f"{_LAST_ASSISTANT}.content", "messages_location": "messages",
                    "tool_definitions_location": "tools", "expected_tool_calls_location": "expected_tool_calls",
                    "target_output_location": "ground_truth", "category_location": "category"},
    # Azure AI Evaluation's agent data: query and response message lists with content parts
    # (evalq.shared.agents.azure reads them into chat messages), tool_definitions
    "azure_agent": {"id_location": "id", "query_location": "query", "response_location": "response",
                    "tool_definitions_location": "tool_definitions",
                    "expected_tool_calls_location": "expected_tool_calls", "category_location": "category",
                    "target_output_location": "ground_truth"},
    # HarpIA instances as records (one per line)
    "harpia": {"id_location": "id", "model_input_location": "input",
               "model_output_location": '"actual-output"', "target_output_location": '"expected-output"',
               "context_location": "context", "category_location": "category",
               "messages_location": "messages"},
}

class DataConfig(Strict):
    """fmeval's DataConfig: where each value sits in a record (JMESPath)."""

    model_config = ConfigDict(extra="allow")  # any <name>_location (fmeval's rule), checked below

    preset: Literal["azure_qa", "azure_conversation", "openai_chat", "azure_agent", "harpia"] | None = Field(
        default=None, description="start from a built-in mapping; locations given here override it")
    dataset_name: str | None = None
    dataset_uri: str | None = Field(default=None, description="fmeval's name for dataset.uri")
    dataset_mime_type: str | None = Field(default=None, description="application/jsonlines or application/json")
    target_output_delimiter: str | None = Field(
        default="<OR>", description="splits one target string into several references (fmeval's <OR>)")

    @model_validator(mode="after")
    def _locations(self) -> "DataConfig":
        import jmespath

        for name, value in (self.model_extra or {}).items():
            if not name.endswith("_location"):
                close = difflib.get_close_matches(name, [*STANDARD_LOCATIONS, *type(self).model_fields], n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ValueError(f"unknown field {name!r}{hint} (locations end in '_location')")
            if value is None:
                continue
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"{name}: expected a JMESPath expression (a string)")
            try:
                jmespath.compile(value)
            except jmespath.exceptions.JMESPathError as exc:
                raise ValueError(f"{name}: invalid JMESPath {value!r}: {_one_line(exc)}") from None
        if self.dataset_mime_type is not None and self.dataset_mime_type not in MIME_TYPES:
            raise ValueError(f"dataset_mime_type must be one of {', '.join(MIME_TYPES)}")
        return self

    def locations(self) -> dict[str, str]:
        """Every location in force: the preset's, overridden by those given."""
        merged = dict(PRESETS.get(self.preset or "", {}))
        for name, value in (self.model_extra or {}).items():
            if value is None:
                merged.pop(name, None)
            else:
                merged[name] = value
        return merged


def detect_preset(record: Any) -> str | None:
    """The preset a record's shape calls for, when no data_config is given."""
    if not isinstance(record, dict):
        return None
    if isinstance(record.get("response"), list) and ("query" in record or "tool_definitions" in record):
        return "azure_agent"
    if isinstance(record.get("messages"), list):
        return "openai_chat" if "tools" in record or "expected_tool_calls" in record else "azure_conversation"
    if "question" in record or "ground_truth" in record:
        return "azure_qa"
    if "actual-output" in record or "expected-output" in record:
        return "harpia"
    return None


class DatasetSpec(Strict):
    uri: str | None = Field(default=None, description="local path or s3://bucket/key; .gz is read transparently")
    format: Literal["jsonl", "json", "harpia", "otlp"] | None = Field(
        default=None, description="jsonl (JSON Lines), json (an array of records), harpia "
        "(a HarpIA job's instances) or otlp (OpenTelemetry trace exports, OTLP JSON: a file, "
        "folder, prefix or glob); unset: from the file name")
    traces: TraceSelection | None = Field(
        default=None, description="format otlp: which GenAI spans are scored (sample, filters, unit)")
    data_config: DataConfig | None = Field(
        default=None, description="where each value sits in a record; unset: a preset picked from "
        "the first record's fields")
    endpoint_url: str | None = Field(default=None, description="S3-compatible endpoint (MinIO, ...)")
    on_bad_record: Literal["fail", "skip"] = Field(
        default="fail", description="skip: leave out records that fail validation, count and report them")
    limit: int | None = Field(default=None, gt=0, description="read only the first N records")

    @field_validator("data_config", mode="before")
    @classmethod
    def _preset_by_name(cls, value):
        return {"preset": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _uri_and_format(self) -> "DatasetSpec":
        dc = self.data_config
        if dc is not None and dc.dataset_uri is not None:
            if self.uri is not None and self.uri != dc.dataset_uri:
                raise ValueError("uri and data_config.dataset_uri differ; give one")
            object.__setattr__(self, "uri", dc.dataset_uri)
        if dc is not None and dc.dataset_mime_type is not None:
            fmt = MIME_TYPES[dc.dataset_mime_type]
            if self.format is not None and self.format != fmt:
                raise ValueError(f"format {self.format!r} and dataset_mime_type {dc.dataset_mime_type!r} differ")
            object.__setattr__(self, "format", fmt)
        if not self.uri:
            raise ValueError("'uri' is required: a local path or s3://bucket/key")
        if self.format is None:
            object.__setattr__(self, "format", format_from_name(self.uri))
        if self.format == "otlp":
            if dc is not None:
                raise ValueError("format otlp reads GenAI spans as they are; a data_config does not apply")
            if self.traces is None:
                object.__setattr__(self, "traces", TraceSelection())
        elif self.traces is not None:
            raise ValueError("'traces' applies to format otlp only")
        return self


def format_from_name(uri: str) -> str:
    name = uri.lower().removesuffix(".gz")
    if name.endswith((".jsonl", ".ndjson", ".jsonlines")):
        return "jsonl"
    if name.endswith(".json"):
        return "json"
    raise ValueError(f"cannot tell the format of {uri!r} from its name; set 'format' "
                     "(jsonl, json, harpia or otlp)")


class OutputSpec(Strict):
    uri: str | None = Field(default=None, description="directory for results: a local path or s3://bucket/prefix/")
    endpoint_url: str | None = Field(default=None, description="S3-compatible endpoint")
    log_parameters: bool = Field(
        default=True, description="log.jsonl lines repeat their entry's parameters, as HarpIA's log does; "
        "false: lines name their entry by `entry` only (for entries with large parameters)")
    otel: bool | str | None = Field(
        default=None, description="scores out as OpenTelemetry evaluation events: unset, to the operator's "
        "default exporter where one is configured; false, none; a name, that exporter of the operator's "
        "(EVALQ_OTEL_EXPORTERS)")

    @field_validator("otel")
    @classmethod
    def _operators_exporter(cls, value):
        from evalq.shared.core.config import otel_exporters

        if value is True:
            return None  # the default, where the operator configured one
        named = otel_exporters()
        if isinstance(value, str) and named and value not in named:
            raise ValueError(f"no exporter named {value!r} (the operator's: {', '.join(sorted(named))})")
        return value

    sinks: list[str] = Field(
        default_factory=list, max_length=8,
        description="the operator's score sinks (EVALQ_SINKS: Phoenix span annotations, MLflow assessments) "
        "this job's scores are also written into, by name; each item's scores once, on the span or trace "
        "it judged")

    @field_validator("sinks")
    @classmethod
    def _operators_sinks(cls, value):
        from evalq.shared.core.config import score_sinks, sink_problem

        named = score_sinks()
        for name in value if named else ():  # a client that knows none: the cluster's jobs worker checks
            if name not in named:
                raise ValueError(f"no sink named {name!r} (the operator's EVALQ_SINKS: "
                                 f"{', '.join(sorted(named)) or 'none'})")
            problem = sink_problem(name)
            if problem:
                raise ValueError(problem)
        return list(dict.fromkeys(value))


class RecordError(ValueError):
    """A record that cannot become an instance; the message names the field."""


class RecordMapper:
    """Turns one record into an instance dict (pure; compiled once per job)."""

    def __init__(self, config: DataConfig):
        self.config = config
        self.locations = config.locations()
        self._compiled = {name: _getter(expr) for name, expr in self.locations.items()}

    @cached_property
    def fields(self) -> dict[str, str]:
        """location name -> instance field."""
        return {name: STANDARD_LOCATIONS.get(name, name.removesuffix("_location"))
                for name in self.locations}

    def describe(self) -> str:
        head = f"preset {self.config.preset}" if self.config.preset else "data_config"
        return f"{head}: " + ", ".join(f"{self.fields[n]} <- {e}" for n, e in self.locations.items())

    def map(self, record: Any, default_id: str) -> dict[str, Any]:
        if not isinstance(record, dict):
            raise RecordError(f"expected a JSON object, got {_kind(record)}")
        inst: dict[str, Any] = {}
        for name, get in self._compiled.items():
            value = get(record)
            if value is not None:  # an absent field is an error only where a metric needs it
                inst[self.fields[name]] = self._convert(name, value)
        inst.setdefault("id", default_id)
        if self.config.preset == "azure_agent":  # query and response message lists into chat messages
            from evalq.shared.agents.azure import AzureAgentError, to_instance

            try:
                return to_instance(inst)
            except AzureAgentError as exc:
                raise RecordError(str(exc)) from None
        return inst

    def origin(self, field: str) -> str:
        """Where a field comes from, for messages: ``target_output_location 'ground_truth'``."""
        for name, target in self.fields.items():
            if target == field:
                return f"{name} {self.locations[name]!r}"
        return f"{field!r} (no location in the data_config)"

    def _convert(self, name: str, value: Any) -> Any:
        field = self.fields[name]
        where = f"{name} {self.locations[name]!r}"
        if field == "id":
            if isinstance(value, bool) or not isinstance(value, (str, int)):
                raise RecordError(f"{where}: an id must be a string or an integer, got {_kind(value)}")
            return value
        if field in ("input", "actual-output", "category"):
            return _text(value, where)
        if field == "expected-output":
            if isinstance(value, list):
                return [_text(v, where) for v in value]
            text = _text(value, where)
            delimiter = self.config.target_output_delimiter
            parts = text.split(delimiter) if delimiter else [text]
            return [p.strip() for p in parts if p.strip()]
        return value


def _getter(expression: str):
    """A JMESPath search function. Plain field paths (``a``, ``meta.category``,
    ``"actual-output"``), most locations in practice, become direct dict
    look-ups with JMESPath's semantics (None when absent or not an object):
    a million records a minute faster than the general interpreter."""
    import jmespath
    from jmespath.visitor import TreeInterpreter

    ast = jmespath.compile(expression).parsed
    nodes = ast["children"] if ast["type"] == "subexpression" else [ast]
    if all(n["type"] == "field" for n in nodes):
        names = [n["value"] for n in nodes]

        def lookup(record: Any) -> Any:
            for name in names:
                if not isinstance(record, dict):
                    return None
                record = record.get(name)
            return record

        return lookup
    last = _LAST_MATCH.fullmatch(expression)
    if last:  # the presets' "the last message from the user": read backwards, no interpreter
        return _last_match(*last.groups())
    interpreter = TreeInterpreter()
    return lambda record: interpreter.visit(ast, record)


# ``items[?key=='value'] | [-1]`` and ``... | [-1].field``: the last element of a list whose key
# equals a string, as JMESPath gives it (None where anything is missing or of another type)
_LAST_MATCH = re.compile(r"(\w+)\[\?(\w+)\s*==\s*'([^'\\]*)'\]\s*\|\s*\[-1\](?:\.(\w+))?")


def _last_match(items: str, key: str, value: str, field: str | None):
    def lookup(record: Any) -> Any:
        found = record.get(items) if isinstance(record, dict) else None
        if not isinstance(found, list):
            return None
        for item in reversed(found):
            if isinstance(item, dict) and isinstance(item.get(key), str) and item[key] == value:
                return item if field is None else item.get(field)
        return None

    return lookup


def _text(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, list) and value and all(isinstance(p, dict) and "type" in p for p in value):
        from evalq.shared.agents.messages import text_of  # a message's content given as parts

        text = text_of(value)
        if text is not None:
            return text
        raise RecordError(f"{where}: content parts without a text part (types: "
                          f"{', '.join(sorted({str(p['type']) for p in value}))[:200]})")
    raise RecordError(f"{where}: expected a string, got {_kind(value)}")


def _one_line(exc: Exception) -> str:
    return re.sub(r"\s+", " ", str(exc)).strip()


class JailbreakSpec(Strict):
    """Seed 001's jailbreak defect rate: the same prompts with and without an
    injection, both answered by the model under test and graded by every safety
    metric. ``template`` wraps each prompt (``$model_input`` marks where it goes);
    ``dataset`` gives the injected prompts, matched to the clean ones by id."""

    template: str | None = Field(default=None, description="the injection around each prompt, with $model_input")
    dataset: DatasetSpec | None = Field(default=None, description="injected prompts (id and input per record)")

    @model_validator(mode="after")
    def _one_source(self) -> "JailbreakSpec":
        if (self.template is None) == (self.dataset is None):
            raise ValueError("give exactly one of 'template' (with $model_input) or 'dataset'")
        if self.template is not None and "$model_input" not in self.template \
                and "${model_input}" not in self.template:
            raise ValueError("template must contain $model_input (where the clean prompt goes)")
        return self
