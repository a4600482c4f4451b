"""The stored job is one typed object (issue 71): built once at submission, read once per process,
reading what an older evalq stored, choosing once where its instances and records live; and no
module outside it reads the stored document by key or loads it raw."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from evalq.shared.job.nightly import suite_of
from evalq.shared.job.stored import VERSION, StoredJob, as_stored
from evalq.shared.store.instances import PartInstances, RedisInstances
from evalq.shared.store.place import Place
from evalq.shared.store.records import PartRecords, RedisRecords

ROOT = Path(__file__).resolve().parents[2]
# the stored job's module, and the run plan it hands its runs to as a mapping
OWNERS = {ROOT / "shared" / "job" / "stored.py", ROOT / "shared" / "cluster" / "spec.py"}
# reading a stored document by key (a write, ``spec[...] = ...``, is the builder's: submit.job_spec)
BY_KEY = re.compile(r"\bspec\[[^\]]*\](?!\s*=[^=])|\bspec\.get\(|\bspec\.(?:keys|items|values)\(")
RAW = re.compile(r"\bkeys\.spec\(")


def sources():
    for room in ("evalq", "orchestrator", "workers", "shared"):
        for path in sorted((ROOT / room).rglob("*.py")):
            if path not in OWNERS:
                yield path


def test_no_module_outside_the_stored_job_reads_it_by_key_or_loads_it_raw():
    found = []
    for path in sources():
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#", 1)[0]
            if BY_KEY.search(code) or RAW.search(code):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "read through evalq.shared.job.stored.StoredJob instead:\n" + "\n".join(found)


def test_the_rule_catches_what_it_is_for():
    """The check above can fail: each way of reading around the stored job is caught."""
    for line in ('name = spec["source"]', 'spec.get("ttl")', 'json.loads(r.get(keys.spec(job_id)))',
                 'for k, v in spec.items():'):
        assert BY_KEY.search(line) or RAW.search(line), line
    assert not BY_KEY.search('spec["out"] = dest.uri') and not BY_KEY.search("job.spec.params")


def test_a_document_an_older_evalq_stored_reads_with_its_defaults(monkeypatch):
    """Version 1 (no ``version``, and before that no ttl, scheduling, judging or regression)."""
    monkeypatch.setenv("EVALQ_RESULT_TTL", "4321")
    old = StoredJob({"source": "jobs/nightly.v2.json", "n_instances": 3,
                     "metrics": {"bleu@0": {"id": "bleu", "parameters": {}, "chunk_size": 2, "queue": "cpu"}}}, "j1")
    assert old.version == 1 and old.ttl == 4321
    assert old.scheduling == {"priority": "normal", "tenant": "default", "weight": 1.0} and old.tenant is None
    assert old.series == suite_of("jobs/nightly.v2.json") and old.suite is None  # named from the file
    assert old.judging.mode == "sync" and old.judges == {} and old.model is None
    assert old.log_parameters and old.sinks == [] and old.otel_export is None and old.destination is None
    assert old.auto_deadline == 0.0 and old.submitted_epoch is None
    assert isinstance(old.records, RedisRecords) and isinstance(old.instances, RedisInstances)
    assert list(old.metrics) == ["bleu@0"] and old["n_instances"] == 3  # a mapping for the run plan
    assert json.loads(old.to_json())["source"] == "jobs/nightly.v2.json"


def test_submission_stamps_the_version_and_the_job_reads_back_typed(monkeypatch, tmp_path):
    from evalq.orchestrator.submit import job_spec
    from evalq.shared.job.schema import parse_job
    from evalq.shared.judging.judges import JudgeConfig

    monkeypatch.setenv("EVALQ_RESULT_TTL", "777")
    job = parse_job({
        "instances": [{"id": "a", "input": "q", "actual-output": "x", "expected-output": ["x"]}],
        "judges": {"j": {"provider": "openai", "model": "m", "api_key_env": "TEST_UNIT_API_KEY", "deployments": [
            {"region": "lab", "base_url": "http://127.0.0.1:9/v1", "tpm": 1000, "rpm": 10}]}},
        "metrics": [{"id": "bleu"}, {"id": "fluency", "parameters": {"judge": "j"}}],
        "scheduling": {"tenant": "search", "priority": "high"}, "suite": "rag-nightly"})
    doc = job_spec(job, out=str(tmp_path / "out"), request_id="r-1", namespace="search", message_id="m-1")
    stored = StoredJob(json.loads(json.dumps(doc)), "j2")  # as Redis gives it back
    assert doc["version"] == VERSION == stored.version == 2 and stored.ttl == 777
    assert (stored.tenant, stored.namespace, stored.store_tenant) == ("search", "search", "search")
    assert stored.scheduling["priority"] == "high" and stored.series == "rag-nightly"
    assert stored.request_id == "r-1" and stored.message_id == "m-1"
    assert stored.destination.uri == str((tmp_path / "out").resolve())
    assert isinstance(stored.judge("j"), JudgeConfig) and stored.judge("j").model == "m"
    with pytest.raises(KeyError):
        stored.judge("nobody")
    assert stored.submitted_epoch is not None and not stored.priced("fluency@1", stored.metrics["fluency@1"])
    assert as_stored(stored) is stored and as_stored(doc, "j2").ttl == 777


def test_where_its_bulk_lives_is_chosen_once_by_the_job(tmp_path):
    from evalq.shared.store import instances as staged

    place = Place(str(tmp_path / "job"))
    doc = {"metrics": {"m@0": {"id": "exact_match", "chunk_size": 4}}, "n_instances": 2,
           "instances": staged.stage(place, iter(['{"id": "a"}', '{"id": "b"}'])), "records": "parts"}
    job = StoredJob(doc, "j3")
    assert isinstance(job.records, PartRecords) and job.records.sizes == {"m@0": 4}
    assert isinstance(job.instances, PartInstances)
    assert job.instances.lines(None, 0, 5) == ['{"id": "a"}', '{"id": "b"}']
    assert job.records is job.records  # carried, not asked again
    # staged instances without parts for records (an older evalq's job store): records in Redis
    assert isinstance(StoredJob({**doc, "records": None}, "j3").records, RedisRecords)
    job.instances.drop()
    assert not job.instances.still_there()


def test_its_runs_are_typed_entries_and_still_the_mapping_the_plan_reads():
    from evalq.shared.cluster.spec import plan, stage_runs
    from evalq.shared.job.stored import RunEntry

    raw = {"id": "bleu", "parameters": {"n": 4}, "chunk_size": 2, "queue": "cpu", "name": "b4"}
    job = StoredJob({"n_instances": 5, "metrics": {"bleu@0": raw, "exact_match@1": {
        "id": "exact_match", "parameters": {}, "chunk_size": 5, "queue": "cpu"}},
        "generate": {"id": "generate", "parameters": {}, "chunk_size": 4, "queue": "generate", "n_items": 3}}, "j4")
    bleu = job.entry("bleu@0")
    assert isinstance(bleu, RunEntry) and bleu.key == "bleu@0" and bleu == raw  # equal to what was stored
    assert (bleu.id, bleu.human, bleu.chunk_size, bleu.parameters, bleu.judge) == ("bleu", "b4", 2, {"n": 4}, None)
    assert job.entry("exact_match@1").human == "exact_match" and job.generate.n_items == 3
    assert all(isinstance(entry, RunEntry) for _, entry in stage_runs(job, "metrics"))
    assert [c.id for c in plan(job, "metrics")] == ["bleu@0:0", "bleu@0:2", "bleu@0:4", "exact_match@1:0"]
    with pytest.raises(KeyError):
        job.entry("rouge@9")
