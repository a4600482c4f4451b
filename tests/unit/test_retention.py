"""A job's retention is one rule (issue 71): the seconds stamped into its spec at submission, else
the process's EVALQ_RESULT_TTL, else one default; and every multi-day duration is a named constant,
not a literal repeated where it is used."""

from __future__ import annotations

import re
from pathlib import Path

from evalq.shared.job.stored import StoredJob, default_retention
from evalq.shared.core.config import RESULT_TTL

ROOT = Path(__file__).resolve().parents[2]


def test_the_stamp_wins_then_the_setting_then_the_default(monkeypatch):
    monkeypatch.setenv("EVALQ_RESULT_TTL", "1234")
    assert StoredJob({"ttl": 99}).ttl == 99
    assert StoredJob({"ttl": None}).ttl == 1234
    assert StoredJob({}).ttl == 1234 and default_retention() == 1234
    monkeypatch.delenv("EVALQ_RESULT_TTL")
    assert StoredJob({}).ttl == RESULT_TTL == 7 * 24 * 3600


# a week or a month of seconds, however spelled
DAYS = re.compile(r"\b(?:7|30)\s*\*\s*(?:24\s*\*\s*3600|86400)\b|\b(?:604800|2592000)\b")
CONSTANT = re.compile(r"^\s*[A-Z][A-Z0-9_]* = ")


def test_no_week_or_month_of_seconds_is_written_where_it_is_used():
    found = []
    for room in ("evalq", "orchestrator", "workers", "shared"):
        for path in (ROOT / room).rglob("*.py"):
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if DAYS.search(line) and not CONSTANT.match(line):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "\n".join(found)
