"""The documentation tells the truth, and a reader can find it (issue 39): the README keeps what a
newcomer needs on its first screens, every page of the site is in its navigation, every job file the
docs show is a valid job, and every metric and setting the code has is documented.
(`mkdocs build --strict`, which `make test` runs first, fails on a broken link or anchor.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
# variables evalq sets for itself (not the operator's): the cluster-worker flag, a node's metrics
# directory, the CPUs a gpu worker's processes share
INTERNAL = {"EVALQ_CLUSTER_WORKER", "EVALQ_METRICS_NODE_DIR", "EVALQ_GPU_CPUS"}


def nav_pages(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [p for item in node for p in nav_pages(item)]
    if isinstance(node, dict):
        return [p for value in node.values() for p in nav_pages(value)]
    return []


def test_the_readme_keeps_to_its_first_screens_and_links_into_the_site():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    first = readme.splitlines()[:12]
    assert any(line.startswith("make demo") for line in first) and any(line.startswith("make test") for line in first)
    linked = set(re.findall(r"\]\((docs/[^)#]+)", readme))
    assert linked and all((ROOT / link).is_file() for link in linked), linked


def test_every_page_is_in_the_navigation():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    listed = nav_pages(config["nav"])
    assert sorted(listed) == sorted(str(p.relative_to(DOCS)) for p in PAGES)


def job_examples() -> list[tuple[str, dict]]:
    """Every JSON block of the docs (and the README) that is a job file: an object with metrics."""
    found = []
    for path in [ROOT / "README.md", *PAGES]:
        for n, block in enumerate(re.findall(r"```json\n(.*?)```", path.read_text(), re.S)):
            try:
                value = json.loads(block)
            except ValueError:
                continue  # a fragment of a job (a section shown alone), not a job file
            if isinstance(value, dict) and "metrics" in value:
                found.append((f"{path.relative_to(ROOT)}#{n}", value))
    return found


EXAMPLES = job_examples()


def test_the_docs_show_job_files():
    assert len(EXAMPLES) >= 4, [name for name, _ in EXAMPLES]


@pytest.mark.parametrize("name, job", EXAMPLES, ids=[name for name, _ in EXAMPLES])
def test_every_job_file_the_docs_show_is_valid(name, job, tmp_path, monkeypatch):
    """Each is validated as `evalq validate --offline` would (key variables named, not read), with
    the operator's sample catalogue; a dataset it names is one of the repository's examples, or an
    S3 object, checked for its shape (the bucket is yours)."""
    from evalq.shared.data.dataset import DatasetSpec
    from evalq.shared.job.schema import parse_job

    monkeypatch.setenv("EVALQ_CATALOGUE", str(ROOT / "deploy" / "catalogue.json"))
    monkeypatch.delenv("EVALQ_ENDPOINTS", raising=False)  # a person's own run: the job's endpoints
    job = json.loads(json.dumps(job))
    dataset = job.get("dataset")
    if isinstance(dataset, dict) and dataset.get("format") == "otlp":  # an app's traces: the example export
        DatasetSpec.model_validate(dataset)
        job["dataset"] = {**dataset, "uri": str(ROOT / "examples" / "data" / "otel_traces.jsonl")}
        # a window relative to now is the production export's: the example's spans only grow older
        # (the docs' "-24h" left it with no span a day after it was recorded)
        traces = job["dataset"]["traces"] = dict(job["dataset"].get("traces") or {})
        traces.pop("since", None)
        traces.pop("until", None)
    elif isinstance(dataset, dict) and str(dataset.get("uri", "")).startswith("s3://"):
        DatasetSpec.model_validate(dataset)  # its fields, as the job has them
        job["dataset"] = {**dataset, "uri": str(ROOT / "examples" / "data" / "qa.jsonl")}
        job["dataset"].pop("data_config", None)
    elif isinstance(dataset, dict):
        job["dataset"]["uri"] = str(ROOT / dataset["uri"])
    parse_job(job, source=name, keys_needed=False)


def test_every_metric_is_documented():
    import evalq.shared.job.catalogue  # noqa: F401
    from evalq.shared.metrics.registry import REGISTRY

    text = "\n".join(p.read_text() for p in PAGES)
    shipped = [spec for spec in REGISTRY.all() if spec.impl.startswith("evalq.")]  # not the test plugins
    missing = [spec.id for spec in shipped if f"`{spec.id}`" not in text]
    assert not missing, missing


def test_every_setting_is_in_the_configuration_reference():
    code = "\n".join(p.read_text() for folder in ("orchestrator", "workers", "shared", "evalq")
                     for p in (ROOT / folder).rglob("*.py"))
    variables = set(re.findall(r'"(EVALQ_[A-Z0-9_]+)"', code)) - INTERNAL
    reference = (DOCS / "reference" / "configuration.md").read_text()
    missing = sorted(v for v in variables if v not in reference)
    assert not missing, missing
