"""How a ``log.jsonl`` line names its metric entry: written by the final callback
(``evalq.results.outputs``), read by ``evalq report``, ``evalq compare`` and history.

As in HarpIA's log, a line carries ``metric``, ``name`` (when the job gave one) and
the entry's ``parameters`` as run (defaults filled in), and beside them ``entry``, the
entry's position in results.json (and in run.json's ``metrics``). A job whose
parameters are large (a rubric with many examples) may set ``output.log_parameters``
to false: its lines then carry ``entry`` only, and results.json and run.json hold
the parameters once. Readers take a line's entry from ``entry`` when it has one,
else from its metric, name and parameters (logs written before lines carried ``entry``).
"""

from __future__ import annotations

import json


def log_head(entry: dict, slot: int | None, parameters: bool = True) -> dict:
    """The fields a line of ``entry`` (as stored in a job's spec) starts with; ``slot``
    is its position in results.json (None for the generation stage's lines);
    ``parameters``: the entry's parameters too (HarpIA's format, the default)."""
    head: dict = {"metric": entry["id"]}
    if entry.get("name") is not None:
        head["name"] = entry["name"]
    if parameters:
        head["parameters"] = entry["parameters"]
    if slot is not None:
        head["entry"] = slot
    return head


def entry_key(head: dict) -> tuple:
    """An entry as a results.json object (or an old log line) names it."""
    return head["metric"], head.get("name"), json.dumps(head.get("parameters"), sort_keys=True)


def entry_slot(line: dict, results: list[dict], index: dict[tuple, list[int]] | None = None) -> int | None:
    """The position in ``results`` (results.json) of a log line's entry, or None.
    ``index`` (``entry_key`` -> positions, see ``entry_index``) finds the entry of a
    line written before lines carried ``entry``."""
    slot = line.get("entry")
    if type(slot) is int and 0 <= slot < len(results) and results[slot].get("metric") == line.get("metric"):
        return slot
    if "entry" not in line and "parameters" in line and index is not None:
        slots = index.get(entry_key(line))
        return slots[0] if slots else None
    return None


def entry_index(results: list[dict]) -> dict[tuple, list[int]]:
    index: dict[tuple, list[int]] = {}
    for i, m in enumerate(results):
        index.setdefault(entry_key(m), []).append(i)
    return index
