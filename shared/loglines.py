"""How a ``log.jsonl`` line names its metric entry: written by the final callback
(``evalq.orchestrator.outputs``), read by ``evalq report`` and ``evalq compare``.

A line carries ``metric``, ``name`` (when the job gave one) and ``entry``, the
entry's position in results.json (and in run.json's ``metrics``), never the
entry's parameters: results.json and run.json hold those once, where a line each
would repeat them for every instance (a job's parameters are its own to make
long). Logs written before lines carried ``entry`` named it by its parameters;
readers still accept those.
"""

from __future__ import annotations

import json


def log_head(entry: dict, slot: int | None) -> dict:
    """The fields a line of ``entry`` (as stored in a job's spec) starts with; ``slot``
    is its position in results.json (None for the generation stage's lines)."""
    head: dict = {"metric": entry["id"]}
    if entry.get("name") is not None:
        head["name"] = entry["name"]
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
