"""The metric pages say what the registry says (issue 60: the index cut descriptions at "..",
and README and the docs filed `informationless` under different families)."""

from __future__ import annotations

import re
from pathlib import Path

import evalq.shared.job.catalogue  # noqa: F401  (the registry, with every built-in metric)
from evalq.shared.metrics.registry import REGISTRY

ROOT = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\| `([a-z0-9_]+)` \| [^|]+ \| (.+) \| \[[^\]]+\]\(([^)]+)\.md(?:#[^)]*)?\) \|$")


def index_rows() -> dict[str, tuple[str, str]]:
    rows = {}
    for line in (ROOT / "docs" / "reference" / "metrics" / "index.md").read_text().splitlines():
        found = ROW.match(line)
        if found:
            rows[found.group(1)] = (found.group(2).replace("\\|", "|"), found.group(3).rsplit("/", 1)[-1])
    return rows


def first_sentence(text: str) -> str:
    """Up to the first ". " outside parentheses (the index gives a description's first sentence)."""
    depth = 0
    for i, c in enumerate(text):
        depth += (c == "(") - (c == ")")
        if c == "." and depth == 0 and text[i + 1:i + 2] in (" ", ""):
            return text[:i + 1]
    return text


def test_the_index_gives_each_metrics_first_sentence_whole():
    rows = index_rows()
    assert len(rows) >= len([s for s in REGISTRY.all() if s.impl.startswith("evalq.")]) - 2, sorted(rows)
    for metric, (said, _) in rows.items():
        assert metric in REGISTRY, metric
        whole = REGISTRY.get(metric).description.replace("<", "&lt;").replace(">", "&gt;")
        assert said == first_sentence(whole), metric
        assert said.count("(") == said.count(")") and " ." not in said, metric


def test_the_readme_files_each_metric_where_the_docs_do():
    pages = {"lexical": "lexical", "LLM-as-judge": "judges", "risk and safety": "safety", "claims": "claims"}
    rows = index_rows()
    readme = (ROOT / "README.md").read_text()
    for family, page in pages.items():
        line = next(l for l in readme.splitlines() if l.startswith(f"| {family} |"))
        listed = re.findall(r"`([a-z0-9_]+)`", line.split("|")[2])
        assert listed, family
        for metric in listed:
            assert rows[metric][1] == page, (metric, family, rows[metric][1])
