"""The core pipeline against a real Redis and real Celery worker processes."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from nltk.tokenize import wordpunct_tokenize
from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu
from rouge_score.rouge_scorer import RougeScorer

from evalq.cli.run import run_job
from evalq.shared.cluster import keys
from evalq.shared.job.schema import parse_job
from tests.conftest import read_log, read_results

pytestmark = pytest.mark.integration

WORDS = "the a cat dog sat ran on under mat sofa quickly slowly red blue house garden".split()


def synthetic(n: int, seed: int = 1) -> list[dict]:
    rng = random.Random(seed)

    def sentence():
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) + "."

    return [{"id": f"i{i}", "input": "q", "actual-output": sentence(),
             "expected-output": [sentence() for _ in range(rng.randint(1, 3))]} for i in range(n)]


def test_scores_equal_reference_libraries(redis_url, cpu_worker, tmp_path):
    instances = synthetic(57)
    job = parse_job({"instances": instances, "metrics": [
        {"id": "bleu", "parameters": {"smoothing_function": "method1"}},
        {"id": "rouge", "parameters": {"rouge_types": ["rouge1", "rougeL"], "use_stemmer": True}},
        {"id": "f1_score"}, {"id": "exact_match", "enable": False}]})
    summary = run_job(job, tmp_path, broker=redis_url, chunk_size=5, progress=False)

    bleu_ref = [sentence_bleu([wordpunct_tokenize(r) for r in i["expected-output"]],
                              wordpunct_tokenize(i["actual-output"]),
                              smoothing_function=SmoothingFunction().method1) for i in instances]
    scorer = RougeScorer(["rouge1", "rougeL"], use_stemmer=True)
    rouge_ref = [max((scorer.score(r, i["actual-output"]) for r in i["expected-output"]),
                     key=lambda s: s["rougeL"].fmeasure)["rougeL"].fmeasure for i in instances]

    log = read_log(tmp_path)
    assert len(log) == 3 * len(instances)
    by_metric = {m: {line["instance_id"]: line for line in log if line["metric"] == m}
                 for m in ("bleu", "rouge", "f1_score")}
    for inst, b, rl in zip(instances, bleu_ref, rouge_ref):
        assert by_metric["bleu"][inst["id"]]["result"] == pytest.approx(b, abs=1e-12)
        assert by_metric["rouge"][inst["id"]]["result"]["rougeL"] == pytest.approx(rl, abs=1e-12)
        assert by_metric["bleu"][inst["id"]]["entry"] == 0  # its parameters: results.json's first entry

    results = read_results(tmp_path)
    assert list(results) == ["bleu", "rouge", "f1_score"]  # job order; disabled metric absent
    assert results["bleu"]["score"] == pytest.approx(sum(bleu_ref) / len(bleu_ref), abs=1e-12)
    assert results["rouge"]["score"]["rougeL"] == pytest.approx(sum(rouge_ref) / len(rouge_ref), abs=1e-12)
    assert results["bleu"]["parameters"] == {"weights": [0.25] * 4, "smoothing_function": "method1",
                                             "auto_reweigh": False}
    for m in results.values():
        assert (m["n"], m["n_errors"]) == (len(instances), 0)
        assert m["elapsed_time"] > 0
    assert summary == json.loads((tmp_path / "results.json").read_text())


def test_item_failure_is_recorded_and_job_goes_on(redis_url, cpu_worker, tmp_path):
    instances = synthetic(10)
    instances[3]["actual-output"] = "FAIL here"
    instances[7]["actual-output"] = "and FAIL there"
    job = parse_job({"instances": instances, "metrics": [{"id": "fail_on"}, {"id": "exact_match"}]})
    run_job(job, tmp_path, broker=redis_url, chunk_size=4, progress=False)
    log = read_log(tmp_path)
    failed = {line["instance_id"]: line["error"] for line in log if "error" in line}
    assert failed == {"i3": "ValueError: cannot score 'i3'", "i7": "ValueError: cannot score 'i7'"}
    assert all("result" not in line for line in log if "error" in line)
    results = read_results(tmp_path)
    assert (results["fail_on"]["n"], results["fail_on"]["n_errors"]) == (8, 2)
    assert results["fail_on"]["score"] == 1.0
    assert results["exact_match"]["n_errors"] == 0


def test_job_keys_expire(redis_url, cpu_worker, tmp_path):
    import redis

    job = parse_job({"instances": synthetic(3), "metrics": [{"id": "f1_score"}]})
    run_job(job, tmp_path, broker=redis_url, progress=False)
    r = redis.Redis.from_url(redis_url)
    spec_keys = list(r.scan_iter(match=f"{keys.PREFIX}:*:spec"))
    assert spec_keys and all(0 < r.ttl(k) <= 8 * 24 * 3600 for k in spec_keys)


def test_redis_blips_after_many_deferrals_are_still_retried(redis_url, cpu_worker, tmp_path):
    # A judge chunk may be deferred any number of times (budget spent); that
    # must not use up the retries a Redis error is allowed.
    counter = tmp_path / "calls"
    job = parse_job({"instances": [{"id": "1", "actual-output": "a"}], "metrics": [
        {"id": "stubborn", "parameters": {"counter": str(counter), "defers": 7, "blips": 2}}]})
    run_job(job, tmp_path / "out", broker=redis_url, progress=False, stall_timeout=60)
    assert read_log(tmp_path / "out") == [{"instance_id": "1", "metric": "stubborn",
                                           "parameters": {"counter": str(counter), "defers": 7, "blips": 2},
                                           "entry": 0, "result": 10}]


def test_summary_from_chunk_parts_equals_summary_from_items(redis_url, cpu_worker, tmp_path):
    import redis

    from evalq.orchestrator.finalize import finalize
    from evalq.shared.job.stored import stored_job as job_spec

    instances = [{**inst, "category": "xy"[i % 2]} for i, inst in enumerate(synthetic(23, seed=4))]
    instances[5]["actual-output"] = "FAIL here"
    job = parse_job({"instances": instances, "metrics": [
        {"id": "rouge"}, {"id": "f1_score"}, {"id": "fail_on"}, {"id": "spread"}]})
    run_job(job, tmp_path, broker=redis_url, chunk_size=4, progress=False)
    from_parts = read_results(tmp_path)
    r = redis.Redis.from_url(redis_url)
    part_keys = [k for k in r.scan_iter(match="evalq:*:part:*")]
    job_id = {k.decode().split("{")[1].split("}")[0] for k in part_keys
              if json.loads(r.get(keys.spec(k.decode().split("{")[1].split("}")[0])) or "{}").get("n_instances") == 23}
    assert len(job_id) == 1
    job_id = job_id.pop()
    assert r.hlen(keys.parts(job_id, "rouge@0")) == 6  # one per chunk of 4
    r.delete(*[keys.parts(job_id, m) for m in ("rouge@0", "f1_score@1", "fail_on@2")])
    # one chunk scored by an evalq that wrote no distribution parts (a rolling upgrade): the items are read
    assert r.hdel(keys.parts(job_id, "spread@3"), "8") == 1
    job_spec.cache_clear()
    finalize(r, job_id)
    from_items = {m.get("name", m["metric"]): m for m in json.loads(r.get(keys.summary(job_id)))}
    assert from_parts["spread"]["score"]["distribution"]["per_word"][0]["histogram"]["counts"]
    for name in ("rouge", "f1_score", "fail_on", "spread"):  # the same but for the order floats were summed in
        assert _close({k: v for k, v in from_parts[name].items() if k not in ("elapsed_time", "compute_time", "regressions")},
                      {k: v for k, v in from_items[name].items() if k not in ("elapsed_time", "compute_time", "regressions")})
    assert from_parts["fail_on"]["n_errors"] == 1 and set(from_parts["rouge"]["categories"]) == {"x", "y"}


def _close(a, b) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return a == pytest.approx(b, rel=1e-12, abs=1e-12)
    return a == b


def test_an_ended_job_keeps_its_keys_for_the_result_ttl_only(redis_url, cpu_worker, tmp_path):
    """EVALQ_RESULT_TTL: every key of an ended job expires (Redis is not a store of
    every night's item records)."""
    import redis

    from tests.conftest import evalq

    path = tmp_path / "job.json"
    path.write_text(json.dumps({"instances": synthetic(30), "metrics": [{"id": "bleu"}, {"id": "exact_match"}]}))
    proc = evalq("submit", str(path), "--out", str(tmp_path / "out"), "--broker", redis_url, "--chunk-size", "8",
                 env={"EVALQ_RESULT_TTL": "5000"})
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()
    assert evalq("wait", job_id, "--broker", redis_url).returncode == 0
    r = redis.Redis.from_url(redis_url)
    names = sorted(k.decode() for k in r.scan_iter(match=f"{keys.job_prefix(job_id)}:*"))
    assert keys.results(job_id, "bleu@0") in names and keys.views(job_id, "bleu@0") in names
    assert len(names) >= 10
    ttls = {name: r.ttl(name) for name in names}
    assert all(0 < t <= 5000 for t in ttls.values()), ttls


def test_log_lines_carry_their_parameters_unless_the_job_says_not(redis_url, cpu_worker, tmp_path):
    """HarpIA's log: each line reproduces its metric's parameters as run; ``output.log_parameters``
    false (entries with large parameters) leaves them to results.json, and lines keep ``entry``."""
    instances = synthetic(6)
    metrics = [{"id": "bleu", "parameters": {"weights": [0.5, 0.5], "smoothing_function": "method1"}},
               {"id": "bleu", "parameters": {"smoothing_function": "method3"}}, {"id": "f1_score"}]
    for log_parameters, out in ((True, tmp_path / "harpia"), (False, tmp_path / "short")):
        job = parse_job({"instances": instances, "metrics": metrics,
                         **({} if log_parameters else {"output": {"log_parameters": False}})})
        run_job(job, out, broker=redis_url, chunk_size=4, progress=False)
        results, log = json.loads((out / "results.json").read_text()), read_log(out)
        assert len(log) == len(results) * len(instances)
        for line in log:
            assert line["metric"] == results[line["entry"]]["metric"]
            if log_parameters:
                assert line["parameters"] == results[line["entry"]]["parameters"]
            else:
                assert "parameters" not in line
    assert read_log(tmp_path / "harpia")[0]["parameters"] == {"weights": [0.5, 0.5], "smoothing_function": "method1",
                                                              "auto_reweigh": False}
    assert [{k: v for k, v in line.items() if k != "parameters"} for line in read_log(tmp_path / "harpia")] == \
        read_log(tmp_path / "short")


def test_history_values_kept_by_the_workers_equal_those_read_from_the_records(redis_url, cpu_worker, tmp_path):
    """The final callback records per-instance values in the history store from what each chunk's
    worker kept (it parses no item record); they equal what reading every record gives."""
    import redis

    from evalq.results.recording import item_fields
    from evalq.shared.metrics.registry import REGISTRY
    from evalq.shared.cluster.spec import entry_chunks
    from evalq.shared.job.stored import stored_job as stored_spec

    instances = synthetic(31, seed=9)
    instances[4]["actual-output"] = "FAIL here"
    job = parse_job({"instances": instances, "metrics": [
        {"id": "rouge", "parameters": {"rouge_types": ["rouge1", "rougeL"]}}, {"id": "f1_score"},
        {"id": "fail_on"}, {"id": "exact_match"}]})
    run_job(job, tmp_path, broker=redis_url, chunk_size=4, progress=False)
    r = redis.Redis.from_url(redis_url)
    job_id = json.loads((tmp_path / "run.json").read_text())["job_id"]
    spec = stored_spec(r, job_id)
    for key, entry in spec["metrics"].items():
        kind, params = REGISTRY.get(entry["id"]).aggregation, entry["parameters"]
        assert r.hlen(keys.values(job_id, key)) == entry_chunks(spec, entry) == 8
        kept = by_id(item_fields(r, job_id, key, kind, params, entry_chunks(spec, entry)))
        assert kept == by_id(item_fields(r, job_id, key, kind, params)), key  # from the records
        assert all(len(values) == len(instances) - (entry["id"] == "fail_on") for values in kept.values())
    assert set(item_fields(r, job_id, "rouge@0", "mean", spec["metrics"]["rouge@0"]["parameters"], 8)) >= \
        {"rouge1", "rougeL"}


def by_id(fields: dict) -> dict[str, dict[str, float]]:
    """Per field, instance id -> value (the columns in any order)."""
    return {field: dict(zip(ids, values)) for field, (ids, values) in fields.items()}
