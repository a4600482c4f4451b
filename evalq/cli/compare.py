"""Comparing two runs, and quality gates for pipelines.

A run is read from its output location (directory or S3 prefix):
``results.json`` for the entries and their parameters, ``log.jsonl`` for the
item values (each line names its entry by its position in results.json,
``evalq.shared.data.loglines``), paired across runs by instance id. Each entry's
items become named numbers (its *fields*): ``mean`` for numeric scores and judge ratings,
``defect_rate`` (1 for a defect, 0 otherwise) for safety metrics, and one field
per number for metrics whose result is an object (``rouge.rouge1``,
``bertscore.f1``). A jailbreak's injected variant is left out.

Gates: ``NAME.FIELD OP NUMBER`` on the new run, ``delta(NAME.FIELD) OP NUMBER``
on new minus base (paired instances), with ``OP`` one of ``>= <= > < ==``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Iterator

from evalq.results.regressions import worse_direction
from evalq.shared.scores import stats
from evalq.shared.scores.results import entry_keys, read
from evalq.shared.core.errors import EvalqError, JobError

MAX_LISTED = 20


class GateFailed(EvalqError):
    """At least one quality gate failed (exit 3)."""


@dataclass
class Run:
    location: str
    results: list[dict]
    keys: list[str]                                # entry keys, in results.json order
    values: dict[str, dict[str, dict[str, float]]]  # entry -> instance id -> field -> value
    passed: dict[str, dict[str, bool]]              # entry -> instance id -> passes (when defined)
    categories: dict[str, str]                      # instance id -> category


def load_run(location: str) -> Run:
    import evalq.shared.job.catalogue  # noqa: F401  (the registry: how each metric aggregates)
    from evalq.shared.data.loglines import entry_index, entry_slot
    from evalq.shared.metrics.registry import REGISTRY
    from evalq.shared.data.storage import Destination, open_binary, read_lines

    dest = Destination(location)
    try:
        with open_binary(dest.path("results.json")) as f:
            results = json.loads(f.read().decode("utf-8"))
    except json.JSONDecodeError as exc:
        raise JobError(f"{dest.path('results.json')}: invalid JSON: {exc.msg}") from None
    if not isinstance(results, list):
        raise JobError(f"{dest.path('results.json')}: expected evalq's list of metric results")
    keys = entry_keys(results)
    index = entry_index(results)
    values: dict[str, dict[str, dict[str, float]]] = {k: {} for k in keys}
    passed: dict[str, dict[str, bool]] = {k: {} for k in keys}
    categories: dict[str, str] = {}
    for number, text in read_lines(dest.path("log.jsonl")):
        line = json.loads(text)
        if line.get("metric") == "generate" or line.get("variant") is not None or "result" not in line or \
                line.get("stage") == "variants":
            continue
        slot = entry_slot(line, results, index)
        if slot is None:
            continue
        key, head = keys[slot], results[slot]  # the entry's parameters are in results.json, not on the line
        iid = str(line["instance_id"])
        aggregation = REGISTRY.get(line["metric"]).aggregation if line["metric"] in REGISTRY else "mean"
        reading = read(aggregation, head.get("parameters"), line)
        values[key][iid] = reading.values
        if reading.passes is not None:
            passed[key][iid] = reading.passes
        if isinstance(line.get("category"), str):
            categories[iid] = line["category"]
    return Run(location, results, keys, values, passed, categories)


def _field_names(run: Run, key: str) -> list[str]:
    names: dict[str, None] = {}
    for fields in run.values[key].values():
        names.update(dict.fromkeys(fields))
    return list(names)


def summary(run: Run, key: str, field: str) -> dict:
    """A field's value over a run's items, with the 95% interval results.json gives the same mean
    (``stats.score_interval``: Wilson where every value is 0 or 1, else the normal interval within
    the metric's range, a rating's scale for a rating), so a gate line and results.json agree."""
    xs = [f[field] for f in run.values[key].values() if field in f]
    if not xs:
        return {"value": None, "ci95": None, "n": 0}
    value = sum(xs) / len(xs)
    binary = all(x in (0.0, 1.0) for x in xs)
    ci = stats.score_interval(len(xs), sum(xs), sum(x * x for x in xs), binary, _bounds(run, key))
    return {"value": value, "ci95": ci, "n": len(xs)}


def _bounds(run: Run, key: str) -> tuple[float, float] | None:
    from evalq.shared.metrics.registry import REGISTRY

    head = run.results[run.keys.index(key)]
    if head.get("metric") not in REGISTRY:
        return None
    spec = REGISTRY.get(head["metric"])
    if spec.aggregation == "rating":
        from evalq.shared.scores.results import rating_scale

        return rating_scale(head.get("parameters"))
    return spec.bounds


def compare(base: Run, new: Run) -> dict:
    report: dict = {"base": base.location, "new": new.location, "entries": []}
    base_ids = set().union(*(set(v) for v in base.values.values())) if base.values else set()
    new_ids = set().union(*(set(v) for v in new.values.values())) if new.values else set()
    for only, ids in (("only_in_base", base_ids - new_ids), ("only_in_new", new_ids - base_ids)):
        report[only] = {"n": len(ids), "ids": sorted(ids)[:MAX_LISTED]}
    heads = {k: m for k, m in zip(base.keys, base.results)}
    for key, m in zip(new.keys, new.results):
        if key not in heads:
            report["entries"].append({"entry": key, "metric": m["metric"], "warnings": ["only in the new run"]})
            continue
        entry: dict = {"entry": key, "metric": m["metric"], "warnings": [], "fields": {}, "categories": {}}
        if heads[key]["parameters"] != m["parameters"]:
            changed = sorted(p for p in set(heads[key]["parameters"]) | set(m["parameters"])
                             if heads[key]["parameters"].get(p) != m["parameters"].get(p))
            entry["warnings"].append("parameters differ: " + ", ".join(
                f"{p} {json.dumps(heads[key]['parameters'].get(p))} -> {json.dumps(m['parameters'].get(p))}"
                for p in changed))
        common = sorted(set(base.values[key]) & set(new.values[key]))
        for field in _field_names(new, key):
            pairs = _pairs(base, new, key, field)
            entry["fields"][field] = reading(_paired(list(pairs.values()), summary(base, key, field),
                                                     summary(new, key, field)), worse_direction(field, m["metric"]))
            by_category: dict[str, list] = {}
            for i, pair in pairs.items():
                if i in new.categories:
                    by_category.setdefault(new.categories[i], []).append(pair)
            for category, cat_pairs in sorted(by_category.items()):
                entry["categories"].setdefault(category, {})[field] = _paired(cat_pairs)
        if new.passed[key]:
            down = sorted(i for i in common if base.passed[key].get(i) and new.passed[key].get(i) is False)
            up = sorted(i for i in common if base.passed[key].get(i) is False and new.passed[key].get(i))
            entry["flips"] = {"pass_to_fail": {"n": len(down), "ids": down[:MAX_LISTED]},
                              "fail_to_pass": {"n": len(up), "ids": up[:MAX_LISTED]}}
        report["entries"].append(entry)
    for key in base.keys:
        if key not in new.keys:
            report["entries"].append({"entry": key, "metric": heads[key]["metric"], "warnings": ["only in the base run"]})
    return report


SIGNIFICANT = 0.05


def reading(field: dict, worse: str) -> dict:
    """The field's comparison with which way it gets worse (the registry's word: extra tool calls
    and error rates up, scores down, a stereotyping share neither way) and ``moved``: "better" or
    "worse" when the paired difference is significant (p < 0.05), else null."""
    diff, p = field.get("diff"), field.get("p_value")
    moved = None
    if diff and p is not None and p < SIGNIFICANT and worse != "neither":
        moved = "worse" if (diff > 0) == (worse == "higher") else "better"
    return {**field, "worse": worse, "moved": moved}


def _pairs(base: Run, new: Run, key: str, field: str) -> dict[str, tuple[float, float]]:
    """instance id -> (base value, new value) of a field, for the instances both runs scored."""
    b, n = base.values[key], new.values[key]
    return {i: (b[i][field], n[i][field]) for i in sorted(set(b) & set(n)) if field in b[i] and field in n[i]}


def _paired(pairs: list[tuple[float, float]], base: dict | None = None, new: dict | None = None) -> dict:
    result = stats.paired([a for a, _ in pairs], [b for _, b in pairs])
    out = {"n_pairs": result["n"], "diff": result["diff"], "ci95": result["ci95"], "p_value": result["p_value"]}
    if base is not None:
        out = {"base": base["value"], "new": new["value"], **out}
    return out


# --- gates ----------------------------------------------------------------------

_GATE = re.compile(r"^\s*(?:(delta)\(\s*(?P<dname>[\w.@#-]+)\s*\)|(?P<name>[\w.@#-]+))\s*(?P<op>>=|<=|==|>|<)\s*"
                   r"(?P<value>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$")
_OPS = {">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, "<": lambda a, b: a < b,
        "==": lambda a, b: abs(a - b) <= 1e-12}


@dataclass
class Gate:
    text: str
    delta: bool
    entry: str
    field: str
    op: str
    bound: float


def parse_gate(text: str) -> Gate:
    m = _GATE.match(text)
    target = (m.group("dname") or m.group("name")) if m else None
    if not m or "." not in target:
        raise JobError(f"--gate {text!r}: expected NAME.FIELD OP NUMBER or delta(NAME.FIELD) OP NUMBER, "
                       "e.g. \"groundedness.mean >= 4.0\", \"delta(similarity.mean) >= -0.05\"")
    entry, _, field = target.rpartition(".")
    return Gate(text.strip(), bool(m.group("dname")), entry, field, m.group("op"), float(m.group("value")))


def _check_target(gate: Gate, run: Run, which: str) -> None:
    if gate.entry not in run.values:
        raise JobError(f"gate {gate.text!r}: no metric entry {gate.entry!r} in the {which} run "
                       f"({run.location}; entries: {', '.join(run.keys)})")
    fields = _field_names(run, gate.entry)
    if gate.field not in fields:
        raise JobError(f"gate {gate.text!r}: {gate.entry} has no field {gate.field!r} in the {which} run "
                       f"(fields: {', '.join(fields) or 'none: no item was scored'})")


def evaluate_gates(gates: list[Gate], base: Run | None, new: Run) -> list[dict]:
    """Each gate with its value, interval and verdict; JobError (exit 2) when a gate names
    something a run lacks, before any gate is judged."""
    for gate in gates:
        _check_target(gate, new, "new")
        if gate.delta:
            if base is None:
                raise JobError(f"gate {gate.text!r}: delta() needs a base run (evalq compare BASE NEW)")
            _check_target(gate, base, "base")
    out = []
    for gate in gates:
        if gate.delta:
            pairs = list(_pairs(base, new, gate.entry, gate.field).values())
            res = stats.paired([a for a, _ in pairs], [b for _, b in pairs])
            value, ci = res["diff"], res["ci95"]
        else:
            s = summary(new, gate.entry, gate.field)
            value, ci = s["value"], s["ci95"]
        ok = value is not None and _OPS[gate.op](value, gate.bound)
        out.append({"gate": gate.text, "value": value, "ci95": ci, "passed": ok})
    return out


def render(report: dict, gates: list[dict]) -> Iterator[str]:
    yield f"base {report['base']}  ->  new {report['new']}"
    for entry in report["entries"]:
        yield f"{entry['entry']} ({entry['metric']})"
        for w in entry.get("warnings", []):
            yield f"  warning: {w}"
        for field, f in entry.get("fields", {}).items():
            ci = f"[{f['ci95'][0]:+.4f}, {f['ci95'][1]:+.4f}]" if f.get("ci95") else "n/a"
            base = "n/a" if f.get("base") is None else f"{f['base']:.4f}"
            new = "n/a" if f.get("new") is None else f"{f['new']:.4f}"
            diff = "n/a" if f["diff"] is None else f"{f['diff']:+.4f}"
            p = "n/a" if f["p_value"] is None else f"{f['p_value']:.4f}"
            moved = f"  {f['moved'].upper()}" if f.get("moved") else ""
            yield f"  {field:<18} {base} -> {new}  diff {diff}  95% CI {ci}  p {p}  ({f['n_pairs']} pairs){moved}"
        flips = entry.get("flips")
        if flips:
            yield (f"  pass->fail {flips['pass_to_fail']['n']} {', '.join(flips['pass_to_fail']['ids'][:5])}  "
                   f"fail->pass {flips['fail_to_pass']['n']} {', '.join(flips['fail_to_pass']['ids'][:5])}")
    for only in ("only_in_base", "only_in_new"):
        if report[only]["n"]:
            yield f"{only.replace('_', ' ')}: {report[only]['n']} instance(s), e.g. {', '.join(report[only]['ids'][:5])}"
    for g in gates:
        ci = f" [{g['ci95'][0]:.4f}, {g['ci95'][1]:.4f}]" if g.get("ci95") else ""
        value = "n/a" if g["value"] is None else f"{g['value']:.4f}"
        yield f"gate {g['gate']}: {value}{ci}  {'PASS' if g['passed'] else 'FAIL'}"
