"""A job's instances: inline in the job file, or read from a dataset, checked
one at a time against what the job's metrics need.

Datasets are streamed: each record is mapped (``evalq.shared.data.dataset``), checked and
appended to a spool file of instance JSON lines, so validating a million-line
file holds one record at a time plus 16 bytes per instance (id hash and line
number, for the duplicate-id check). Nothing reaches Redis until the whole job
has validated.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import tempfile
from array import array
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

from evalq.shared.data.dataset import DataConfig, DatasetSpec, RecordError, RecordMapper, detect_preset
from evalq.shared.core.errors import JobError, kind as _kind
from evalq.shared.core.jsonio import encode
from evalq.shared.data.documents import read_document
from evalq.shared.core.limits import Limits, OverLimit, loads
from evalq.shared.data.storage import LineError, read_lines

MAX_BAD_SHOWN = 20  # bad records quoted in run.json when they are skipped
SMALL_ID_CHECK = 100_000  # ids checked for repeats with a set up to this many, sorted with numpy beyond


# Fields that most instances of a dataset carry identically (every run of an agent had the same
# tools): stored once per job, each instance holding {SHARED: <digest>} in their place. 100,000 runs
# of an agent with 30 tools would otherwise keep 100,000 copies of their schemas in Redis, and
# every worker would decode each copy.
SHARED = "$shared"
SHARED_FIELDS = ("tool_definitions",)


def share(instance: dict, shared: dict[str, str]) -> dict:
    """The instance with each shared field replaced by a reference to its one copy, added to
    ``shared`` (digest -> JSON text) the first time it is seen."""
    out = instance
    for name in SHARED_FIELDS:
        value = instance.get(name)
        if isinstance(value, list) and value:
            text = encode(value)
            digest = hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()
            shared.setdefault(digest, text)
            out = {**out, name: {SHARED: digest}}
    return out


def shared_refs(instance: dict) -> list[str]:
    """The digests an instance read back from storage refers to (validation keeps a dict out of
    these fields, so a reference is always evalq's own)."""
    return [v[SHARED] for v in (instance.get(name) for name in SHARED_FIELDS) if isinstance(v, dict) and SHARED in v]


def unshare(instance: dict, values: dict[str, Any]) -> dict:
    """Put the shared values (digest -> decoded value) back in place, in the instance itself."""
    for name in SHARED_FIELDS:
        value = instance.get(name)
        if isinstance(value, dict) and SHARED in value:
            instance[name] = values[value[SHARED]]
    return instance


class SpooledInstances:
    """Instances as JSON lines in a temporary file: ``len`` and repeatable iteration; the values
    they share (``SHARED_FIELDS``) are kept once, in ``shared``."""

    def __init__(self) -> None:
        self._file = tempfile.NamedTemporaryFile("w+b", prefix="evalq-instances-", suffix=".jsonl")
        self._n = 0
        self.shared: dict[str, str] = {}

    def append(self, instance: dict) -> None:
        self._file.write(encode(share(instance, self.shared)).encode("utf-8") + b"\n")
        self._n += 1

    def __len__(self) -> int:
        return self._n

    def size(self) -> int:
        """Bytes of the spool: the instances in their stored form, a line each."""
        self._file.flush()
        return os.fstat(self._file.fileno()).st_size

    def extend_from(self, path: str, n: int, shared: dict[str, str]) -> None:
        """Append ``n`` instances already in their stored form, one per line of ``path``."""
        with open(path, "rb") as part:
            shutil.copyfileobj(part, self._file)
        self._n += n
        self.shared.update(shared)

    def json_lines(self) -> Iterator[str]:
        """The stored form: shared fields as references (``shared`` holds their values)."""
        self._file.flush()
        with open(self._file.name, encoding="utf-8") as f:
            for line in f:
                yield line.rstrip("\n")

    def __iter__(self) -> Iterator[dict]:
        values = {digest: json.loads(text) for digest, text in self.shared.items()}
        return (unshare(json.loads(line), values) for line in self.json_lines())


def context_passages(instance: dict) -> list[str]:
    """An instance's ``context`` as passages, the one way every prompt reads it: a list is
    its passages, anything else one passage; a passage that is not text is its JSON."""
    ctx = instance.get("context")
    if ctx is None or ctx == "":
        return []
    items = ctx if isinstance(ctx, list) else [ctx]
    return [c if isinstance(c, str) else json.dumps(c, ensure_ascii=False) for c in items]


def context_text(instance: dict) -> str:
    """The passages as one text, blank lines between them."""
    return "\n\n".join(context_passages(instance))


def stored_bytes(instances: Iterable[dict], sample: int = 256) -> float:
    """About how many bytes an instance takes stored (JSON, shared fields as references): a spool's
    average, or that of the first ``sample`` inline instances."""
    if isinstance(instances, SpooledInstances):
        return instances.size() / max(1, len(instances))
    lines = [len(line.encode("utf-8")) + 1 for line, _ in zip(json_lines(instances, {}), range(sample))]
    return sum(lines) / len(lines) if lines else 0.0


def json_lines(instances: Iterable[dict], shared: dict[str, str]) -> Iterator[str]:
    """Each instance as one JSON string in its stored form (shared fields as references, their
    values added to ``shared``), without re-encoding a spool."""
    if isinstance(instances, SpooledInstances):
        shared.update(instances.shared)
        return instances.json_lines()
    return (encode(share(inst, shared)) for inst in instances)


@dataclass
class BadRecords:
    """Records left out under ``on_bad_record: skip``."""

    count: int = 0
    shown: list[dict] = field(default_factory=list)

    def add(self, where: str, messages: list[str]) -> None:
        self.count += 1
        if len(self.shown) < MAX_BAD_SHOWN:
            self.shown.append({"where": where, "errors": messages})


@dataclass(frozen=True)
class HumanScale:
    """What a human grade for one metric entry may be (``"human": {"<name>": grade}``)."""

    kind: str  # "rating" (integers lo..hi), "severity" (0-7 or true/false), "flag" (true/false)
    lo: int = 0
    hi: int = 0

    def problem(self, grade: Any) -> str | None:
        is_int = isinstance(grade, int) and not isinstance(grade, bool)
        if self.kind == "flag":
            return None if isinstance(grade, bool) else "expected true or false (a defect or not)"
        if self.kind == "severity":
            return None if isinstance(grade, bool) or (is_int and 0 <= grade <= 7) else \
                "expected a severity 0 to 7, or true/false (a defect or not)"
        return None if is_int and self.lo <= grade <= self.hi else f"expected an integer from {self.lo} to {self.hi}"


def is_agent_run(inst: dict) -> bool:
    """An instance that carries an agent's run or a conversation: messages, tool definitions or
    expected calls (all checked: the conversation metrics read the messages' roles too)."""
    return "messages" in inst or "tool_definitions" in inst or "expected_tool_calls" in inst


class InstanceChecker:
    """Checks instances one by one against the fields the job's metrics need.

    ``missing(field)`` words a missing field for the source at hand: an inline
    instance lacks ``'expected-output'``, a dataset record's
    ``target_output_location 'ground_truth'`` was not found.
    """

    def __init__(self, required: dict[str, list[str]], generating: bool,
                 missing: Callable[[str], str] = lambda f: f"missing {f!r}",
                 human_scales: dict[str, HumanScale] | None = None, version_fields: list[str] | None = None):
        from evalq.shared.data.versions import VersionCounter

        self.required = required
        self.human_scales = human_scales or {}
        self.generating = generating
        self.missing = missing
        self.n_to_generate = 0
        self.categories: set[str] = set()
        self._hashes = array("q")
        self.versions = VersionCounter(version_fields)  # the dataset's version (evalq.shared.data.versions)
        # the instances are a trace dataset's spans (evalq.shared.data.traces): the one source whose
        # instances carry ``otel``, the ids of the span each came from, which score sinks write onto
        self.traces = False

    def check(self, inst: dict) -> list[str]:
        problems = []
        if "otel" in inst and not self.traces:
            problems.append("'otel' is evalq's own field: the ids of the span a trace dataset's instance was read "
                            "from (dataset.format \"otlp\"), which scores are written back onto; a job's own "
                            "instances may not name spans")
        for name in ("input", "actual-output"):
            if name in inst and not isinstance(inst[name], str):
                problems.append(f"{name!r} must be a string, got {_kind(inst[name])}")
        refs = inst.get("expected-output")
        if refs is not None and not (isinstance(refs, list) and all(isinstance(r, str) for r in refs)):
            problems.append("'expected-output' must be a list of strings (the acceptable references), "
                            f"got {_kind(refs)}")
        if is_agent_run(inst):  # tool calls, tool results, definitions, the expected calls: all checked
            from evalq.shared.agents.trajectory import check as check_agent_run

            problems += check_agent_run(inst)
        category = inst.get("category")
        if category is not None and not isinstance(category, str):
            problems.append(f"'category' must be a string, got {_kind(category)}")
        human = inst.get("human")
        if human is not None:
            if not isinstance(human, dict):
                problems.append(f"'human' must be an object of grades by metric name, got {_kind(human)}")
            else:
                for name, grade in human.items():
                    scale = self.human_scales.get(name)
                    problem = scale.problem(grade) if scale is not None else None
                    if problem:
                        problems.append(f"'human'.{name}: {json.dumps(grade)} is outside {name}'s scale; {problem}")
        generate = self.generating and "actual-output" not in inst
        for name, needed_by in self.required.items():
            if name == "actual-output" and generate:
                continue
            if name not in inst:
                hint = " (or give the job a 'model' to generate it)" if name == "actual-output" else ""
                problems.append(f"{self.missing(name)}, required by {', '.join(needed_by)}{hint}")
            elif name == "expected-output" and refs == []:
                problems.append(f"'expected-output' is empty; {', '.join(needed_by)} needs at least one reference")
        if generate and "input" not in inst:
            problems.append(f"{self.missing('input')}, required to generate the missing actual-output")
        if not problems:
            self.n_to_generate += generate
            if isinstance(category, str):
                self.categories.add(category)
            self._hashes.append(hash(str(inst["id"])))
            self.versions.add(inst)
        return problems

    def hashes(self) -> array:
        return self._hashes

    def apart(self) -> "InstanceChecker":
        """A checker that checks the same way and counts from zero: for a part of the records read
        in another process (which may read several parts), merged back with ``merge``."""
        twin = copy.copy(self)
        twin.n_to_generate, twin.categories, twin._hashes = 0, set(), array("q")
        twin.versions = self.versions.apart()
        return twin

    def merge(self, n_to_generate: int, categories: set[str], hashes: array,
              versions: tuple[array, array] | None = None) -> None:
        """Add what another process's checker counted over its part of the records (in order)."""
        self.n_to_generate += n_to_generate
        self.categories |= categories
        self._hashes.extend(hashes)
        if versions is not None:
            self.versions.merge(*versions)

    def duplicate_ids(self) -> set[int] | None:
        """Hashes of ids seen twice or more (None when there are none): with a set up to
        ``SMALL_ID_CHECK`` ids (no numpy to import, 0.1 s of `evalq run` before it starts its
        workers), beyond with numpy's sort (8 MB for a million ids, not a set of a million ints)."""
        if len(self._hashes) <= SMALL_ID_CHECK:
            seen: set[int] = set()
            return {h for h in self._hashes if h in seen or seen.add(h)} or None
        import numpy as np

        ordered = np.sort(np.frombuffer(self._hashes, dtype=np.int64))
        return set(ordered[1:][ordered[1:] == ordered[:-1]].tolist()) or None


def report_duplicates(instances: Iterable[dict], places: Iterable[tuple[str, str]], suspects: set,
                      add: Callable[[str, str], None]) -> None:
    """Second pass, only when the hash check found suspects: name each repeat.
    ``places`` gives, per instance (dicts only), its full and its short place."""
    first: dict[str, str] = {}
    for inst, (where, short) in zip((i for i in instances if isinstance(i, dict)), places):
        sid = str(inst.get("id"))
        if hash(sid) not in suspects:
            continue
        if sid in first:
            add(where, f"duplicate id; first used at {first[sid]}")
        else:
            first[sid] = short


@dataclass
class LoadedDataset:
    instances: SpooledInstances
    lines: array            # source line (or array position) of each instance
    bad: BadRecords
    mapping: str            # what the records were read as, for messages and run.json
    spans: dict | None = None  # format otlp: what the reading saw (evalq.shared.data.traces.SpanCounts)


def load_dataset(spec: DatasetSpec, checker: InstanceChecker, add_problem: Callable[[str, str], None],
                 max_problems: int) -> LoadedDataset:
    """Stream the dataset through the mapper and checker into a spool (a large local JSON Lines
    file in several processes: ``evalq.shared.data.parallel_read``, the same result)."""
    from evalq.shared.data import parallel_read

    if spec.format == "otlp":
        raise JobError(f"{spec.uri}: format otlp is read as the job's dataset only (evalq.shared.data.traces)")
    uri = spec.uri
    records = _records(spec)
    mapper: RecordMapper | None = None
    spool, lines, bad = SpooledInstances(), array("q"), BadRecords()
    n_problems = 0
    processes = parallel_read.processes_for(spec)
    for number, where, record in records:
        if not isinstance(record, RecordError) and mapper is None:  # from the first readable record
            mapper = _mapper(spec, record, where)
            checker.missing = lambda f, m=mapper: f"{m.origin(f)} not found"
            if processes > 1 and not n_problems and not bad.count:  # (nothing said yet: the parts read it all)
                records.close()
                steps = parallel_read.Steps(parsed=parsed, examine=examine, share=share, place=record_place)
                n_problems = parallel_read.read_parallel(spec, checker, mapper, processes, steps, spool, lines, bad,
                                                         add_problem, max_problems, MAX_BAD_SHOWN)
                break
        inst, problems = examine(mapper, checker, record, number)
        if not problems:
            spool.append(inst)
            lines.append(number)
        elif (n_problems := said(spec, bad, add_problem, where, problems, n_problems, max_problems)) < 0:
            break
        if spec.limit is not None and len(spool) + bad.count >= spec.limit:
            break
    if not len(spool) and not n_problems:
        add_problem(uri, "no valid records; nothing to evaluate" if bad.count else "no records; nothing to evaluate")
    return LoadedDataset(spool, lines, bad, mapper.describe() if mapper else "")


def said(spec: DatasetSpec, bad: BadRecords, add_problem, where: str, problems: list[str], n_problems: int,
          max_problems: int) -> int:
    """A record's problems listed (``on_bad_record: skip``) or said: the count said, negative to stop reading."""
    if spec.on_bad_record == "skip":
        bad.add(where, problems)
        return n_problems
    for p in problems:
        add_problem(where, p)
    n_problems += len(problems)
    if n_problems >= max_problems - 1:
        add_problem(where, "stopped reading here: fix the problems above first")
        return -n_problems
    return n_problems


def examine(mapper: RecordMapper | None, checker: InstanceChecker, record: Any, number: int
            ) -> tuple[dict | None, list[str]]:
    """One record mapped and checked: (the instance, []) or (None, what is wrong with it)."""
    if isinstance(record, RecordError):
        return None, [str(record)]
    try:
        inst = mapper.map(record, default_id=str(number))
        problems = checker.check(inst)
    except RecordError as exc:
        return None, [str(exc)]
    return (None, problems) if problems else (inst, [])


def _mapper(spec: DatasetSpec, first: Any, where: str) -> RecordMapper:
    if spec.data_config is not None:
        return RecordMapper(spec.data_config)
    if spec.format == "harpia":
        return RecordMapper(DataConfig(preset="harpia"))
    preset = detect_preset(first)
    if preset is None:
        fields = ", ".join(sorted(first)[:12]) if isinstance(first, dict) else _kind(first)
        raise JobError(f"{where}: cannot tell what the records hold (fields: {fields}); give "
                       "dataset.data_config, e.g. {\"model_input_location\": \"question\", "
                       "\"target_output_location\": \"answer\"}, or a preset: azure_qa, "
                       "azure_conversation, harpia")
    return RecordMapper(DataConfig(preset=preset))


def record_place(spec: DatasetSpec, number: int, short: bool = False) -> str:
    """How messages name a record: ``line 7`` of JSON Lines, ``[6]`` of an array,
    ``instances[6]`` of a HarpIA file; prefixed by the URI unless ``short``."""
    place = {"jsonl": f"line {number}", "json": f"[{number - 1}]", "otlp": f"instance {number}"}.get(spec.format, f"instances[{number - 1}]")
    return place if short else f"{spec.uri} {place}"


def parsed(text: str, limits: Limits) -> Any:
    """A JSON Lines line as a record, a RecordError saying what is wrong with it, or None (blank)."""
    if isinstance(text, LineError):
        return RecordError(str(text))
    if not text.strip():
        return None
    try:
        return loads(text, limits.json_depth)
    except json.JSONDecodeError as exc:  # a record cut short fails at its end, not at "line 2, column 1"
        end = len(text.rstrip("\r\n"))
        cut = f"the record ends before its JSON does ({exc.msg}; a closing }} or ] missing?)"
        return RecordError(f"invalid JSON at column {end + 1}: {cut}" if exc.pos >= end else
                           f"invalid JSON at column {exc.colno}: {exc.msg}")
    except OverLimit as exc:
        return RecordError(str(exc))


def _records(spec: DatasetSpec) -> Iterator[tuple[int, str, Any]]:
    """(number, place, record or RecordError) in file order."""
    uri = spec.uri
    limits = Limits.from_env()
    if spec.format == "jsonl":
        for number, text in read_lines(uri, spec.endpoint_url):
            record = parsed(text, limits)
            if record is not None:
                yield number, record_place(spec, number), record
        return
    doc = read_document(uri, spec.endpoint_url, hint="use a JSON Lines dataset, which is streamed")
    if spec.format == "harpia":
        if not isinstance(doc, dict) or not isinstance(doc.get("instances"), list):
            raise JobError(f"{uri}: format harpia expects an object with an 'instances' list")
        items = doc["instances"]
    else:
        if not isinstance(doc, list):
            raise JobError(f"{uri}: format json expects an array of records, got {_kind(doc)}")
        items = doc
    for i, record in enumerate(items):
        yield i + 1, record_place(spec, i + 1), record


