"""bertscore against bert-score's own ``BERTScorer`` run here on the same pairs,
model and settings; parameter validation; the distribution aggregation."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import evalq.shared.job.catalogue  # noqa: F401
from evalq.shared.scores.aggregate import DistributionAggregator, MeanAggregator, aggregator_for
from evalq.shared.core.errors import JobError
from evalq.shared.job.schema import parse_job
from evalq.shared.metrics.params import BertScoreParams
from evalq.shared.metrics.registry import REGISTRY
from tests.conftest import ROOT
from evalq.shared.metrics import bertscore as models
from evalq.workers.metrics.bertscore import models as bs
from evalq.workers.chunk import score_items

bert_score = pytest.importorskip("bert_score")

MODEL_DIR = models.bundled_model_dir()
LAYERS = models.BUNDLED_NUM_LAYERS
TOL = 1e-4

INSTANCES = [
    {"id": "1", "actual-output": "The cat is sleeping on the sofa.",
     "expected-output": ["The cat sleeps on the couch.", "A cat is asleep on the sofa."]},
    {"id": "2", "actual-output": "I like reading books at night.",
     "expected-output": ["I enjoy reading in the evening."]},
    {"id": "3", "actual-output": "The meeting was postponed until tomorrow.",
     "expected-output": ["Stock prices fell sharply today.", "The meeting has been moved to tomorrow.",
                         "Tomorrow, then."]},
    {"id": "4", "actual-output": "Where is the train station?",
     "expected-output": ["Where can I find the railway station?"]},
    {"id": "5", "actual-output": "She finished report yesterday.",
     "expected-output": ["She finished the report yesterday.", "The report was completed."]},
]


def cands(instances):
    return [i["actual-output"] for i in instances]


def refs(instances):
    return [i["expected-output"] for i in instances]


def all_refs(instances):
    return [r for i in instances for r in i["expected-output"]]


@pytest.fixture(scope="module")
def reference_scorer():
    """bert-score's BERTScorer on the bundled model, one per setting."""
    made = {}

    def get(**kw):
        key = json.dumps(kw, sort_keys=True, default=str)
        if key not in made:
            # nthreads=0: idf without a forked pool (a fork after torch started its threads can hang)
            made[key] = bert_score.BERTScorer(model_type=MODEL_DIR, num_layers=LAYERS, device="cpu",
                                              nthreads=0, **kw)
        return made[key]

    return get


def run(instances, chunk=None, **params):
    """Score as the pipeline does: prepare once, chunks scored apart, prepared via JSON."""
    spec = REGISTRY.get("bertscore")
    p = BertScoreParams.model_validate(params)
    prepared = json.loads(json.dumps(spec.load_prepare()(instances, p)))
    chunk = chunk or len(instances)
    records = []
    for start in range(0, len(instances), chunk):
        records += score_items(spec, p, instances[start:start + chunk], prepared)
    assert all("error" not in r for r in records), records
    return [r["result"] for r in records]


def flat(results):
    return [r[k] for r in results for k in ("precision", "recall", "f1")]


def assert_close(ours, P, R, F):
    assert len(ours) == len(P)
    for o, p, r, f in zip(ours, P.tolist(), R.tolist(), F.tolist()):
        assert o["precision"] == pytest.approx(p, abs=TOL)
        assert o["recall"] == pytest.approx(r, abs=TOL)
        assert o["f1"] == pytest.approx(f, abs=TOL)


# --- values ----------------------------------------------------------------------

@pytest.mark.parametrize("chunk", [None, 2])
def test_equals_bertscorer_with_several_references(reference_scorer, chunk):
    ours = run(INSTANCES, chunk=chunk)
    assert_close(ours, *reference_scorer().score(cands(INSTANCES), refs(INSTANCES)))
    # the best reference wins: item 3's unrelated first reference is not the one scored
    single = run([{**INSTANCES[2], "expected-output": INSTANCES[2]["expected-output"][:1]}])
    assert ours[2]["f1"] > single[0]["f1"] + 0.05


def test_idf_over_the_whole_reference_set_is_shared_by_every_chunk(reference_scorer):
    ours = run(INSTANCES, chunk=2, idf=True)
    scorer = reference_scorer(idf=True, idf_sents=all_refs(INSTANCES))
    assert_close(ours, *scorer.score(cands(INSTANCES), refs(INSTANCES)))
    # idf per chunk would differ: the weights really are the whole set's
    chunk_only = run(INSTANCES[:2], idf=True)
    assert any(abs(a["f1"] - b["f1"]) > 1e-3 for a, b in zip(ours[:2], chunk_only))
    plain = run(INSTANCES)
    assert any(abs(a["f1"] - b["f1"]) > 1e-3 for a, b in zip(ours, plain))


def test_prepare_is_json_and_none_without_idf():
    prepare = REGISTRY.get("bertscore").load_prepare()
    assert prepare(INSTANCES, BertScoreParams()) is None
    prepared = prepare(INSTANCES, BertScoreParams(idf=True, nthreads=0))
    assert prepared["num_docs"] == len(all_refs(INSTANCES))
    assert json.loads(json.dumps(prepared)) == prepared


@pytest.mark.parametrize("use_fast", [False, True])
def test_idf_weights_are_bert_scores(use_fast):
    """bert-score's ``get_idf_dict`` computed directly on the same references, an empty one and
    one longer than the model's limit among them: the same tokens, the same weights."""
    from bert_score.utils import get_idf_dict

    instances = INSTANCES + [{"id": "x", "actual-output": "a",
                              "expected-output": ["", "   ", "word " * 700, "Some text.", "some text"]}]
    prepared = REGISTRY.get("bertscore").load_prepare()(instances, BertScoreParams(idf=True, use_fast_tokenizer=use_fast))
    expected = get_idf_dict(all_refs(instances), bs.load_tokenizer(MODEL_DIR, use_fast), nthreads=0)
    assert prepared["num_docs"] == len(all_refs(instances))
    assert {int(k): v for k, v in prepared["idf"].items()} == dict(expected)


@pytest.mark.parametrize("empty", ["", "   "])
def test_empty_candidate_scores_zero_and_leaves_the_others_alone(reference_scorer, empty):
    instances = [INSTANCES[0], {"id": "e", "actual-output": empty, "expected-output": ["Some text.", "x"]},
                 INSTANCES[1]]
    ours = run(instances)
    assert ours[1] == {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    others = [instances[0], instances[2]]
    assert_close([ours[0], ours[2]], *reference_scorer().score(cands(others), refs(others)))


def test_empty_candidate_scores_zero_with_idf():
    instances = [{"id": "e", "actual-output": "", "expected-output": ["Some text."]}, INSTANCES[1]]
    assert run(instances, idf=True)[0] == {"precision": 0.0, "recall": 0.0, "f1": 0.0}


def test_very_long_texts_are_truncated_not_an_error(reference_scorer):
    long_cand = " ".join(["the cat sat on the mat and looked around"] * 400)  # ~3600 tokens
    long_ref = " ".join(["a dog slept under the table all day long"] * 400)
    instances = [{"id": "l", "actual-output": long_cand, "expected-output": [long_ref, "short one"]},
                 INSTANCES[3]]
    ours = run(instances)
    assert_close(ours, *reference_scorer().score(cands(instances), refs(instances)))
    # truncation: the long candidate scores as its first 510 word pieces do
    tok = bs.load_tokenizer(MODEL_DIR, False)
    head = tok.decode(tok(long_cand, add_special_tokens=False)["input_ids"][:510])
    truncated = run([{"id": "h", "actual-output": head, "expected-output": [long_ref, "short one"]}])
    assert truncated[0]["f1"] == pytest.approx(ours[0]["f1"], abs=TOL)


def test_all_layers_gives_one_value_per_layer(reference_scorer):
    single = [{**i, "expected-output": i["expected-output"][:1]} for i in INSTANCES]
    ours = run(single, all_layers=True)
    P, R, F = reference_scorer(all_layers=True).score(cands(single), [r[0] for r in refs(single)])
    assert P.shape == (LAYERS + 1, len(single))
    for j, item in enumerate(ours):
        for key, ref in (("precision", P), ("recall", R), ("f1", F)):
            assert item[key] == pytest.approx(ref[:, j].tolist(), abs=TOL)
    # several references: per layer, the best over the references
    multi = run(INSTANCES[:1], all_layers=True)[0]
    per_ref = [run([{**INSTANCES[0], "expected-output": [r]}], all_layers=True)[0]
               for r in INSTANCES[0]["expected-output"]]
    assert multi["f1"] == pytest.approx([max(v) for v in zip(*(p["f1"] for p in per_ref))], abs=TOL)


def test_rescale_with_baseline_file(reference_scorer, tmp_path):
    baseline = tmp_path / "baseline.tsv"
    rows = ["LAYER,P,R,F"] + [f"{i},{0.3 + i / 50},{0.31 + i / 50},{0.305 + i / 50}" for i in range(LAYERS + 1)]
    baseline.write_text("\n".join(rows) + "\n")
    ours = run(INSTANCES, model_type=models.BUNDLED_MODEL, lang="en", rescale_with_baseline=True,
               baseline_path=str(baseline))
    scorer = reference_scorer(lang="en", rescale_with_baseline=True, baseline_path=str(baseline))
    assert_close(ours, *scorer.score(cands(INSTANCES), refs(INSTANCES)))
    assert ours != run(INSTANCES)


def test_all_layers_rescaled_per_layer(reference_scorer, tmp_path):
    baseline = tmp_path / "baseline.tsv"
    rows = ["LAYER,P,R,F"] + [f"{i},{0.2 + i / 20},{0.25 + i / 20},{0.22 + i / 20}" for i in range(LAYERS + 1)]
    baseline.write_text("\n".join(rows) + "\n")
    single = [{**i, "expected-output": i["expected-output"][:1]} for i in INSTANCES]
    ours = run(single, all_layers=True, rescale_with_baseline=True, baseline_path=str(baseline))
    P, R, F = reference_scorer(all_layers=True, lang="en", rescale_with_baseline=True,
                               baseline_path=str(baseline)).score(cands(single), [r[0] for r in refs(single)])
    for j, item in enumerate(ours):
        assert item["precision"] == pytest.approx(P[:, j].tolist(), abs=TOL)
        assert item["f1"] == pytest.approx(F[:, j].tolist(), abs=TOL)


def test_tokenizer_without_a_length_limit_gets_the_models():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(MODEL_DIR)
    tok.model_max_length = int(1e30)
    assert bs._fix_tokenizer(tok, MODEL_DIR).model_max_length == 512


def test_model_is_loaded_once_per_process():
    bs.clear_cache()
    before = bs.stats["model_loads"]
    run(INSTANCES[:2])
    run(INSTANCES[2:], idf=True)
    run(INSTANCES[:1], batch_size=2)
    assert bs.stats["model_loads"] == before + 1
    run(INSTANCES[:1], num_layers=3)  # another layer is another model
    assert bs.stats["model_loads"] == before + 2


def test_small_batches_give_the_same_scores():
    assert flat(run(INSTANCES, batch_size=1)) == pytest.approx(flat(run(INSTANCES, batch_size=64)), abs=TOL)


def test_device_defaults_to_cpu_without_cuda(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bs.pick_device(None) == "cpu"
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        bs.pick_device("cuda:0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert bs.pick_device(None) == "cuda"
    assert bs.pick_device("cpu") == "cpu"


# --- validation -------------------------------------------------------------------

def problems(params: dict) -> str:
    with pytest.raises(JobError) as info:
        parse_job({"instances": INSTANCES, "metrics": [{"id": "bertscore", "parameters": params}]},
                  source="job.json")
    return "\n".join(info.value.problems)


def test_ten_harpia_parameters_validate():
    job = parse_job({"instances": INSTANCES, "metrics": [{"id": "bertscore", "parameters": {
        "lang": "en", "model_type": MODEL_DIR, "num_layers": 4, "verbose": False, "idf": True,
        "device": "cpu", "batch_size": 16, "nthreads": 2, "all_layers": False,
        "rescale_with_baseline": False}}]})
    assert job.queues == ["gpu"]
    assert job.metrics[0].params_json()["num_layers"] == 4


def test_misspelt_parameter_is_named():
    text = problems({"num_layer": 5})
    assert ("metrics[0] (bertscore).parameters: unknown parameter 'num_layer'; "
            "did you mean 'num_layers'?") in text


def test_unknown_model_is_a_validation_error():
    text = problems({"model_type": "nobody/no-such-model"})
    assert "metrics[0] (bertscore).parameters: model_type: model 'nobody/no-such-model' not found" in text
    assert "never downloads" in text


def test_missing_local_directory_is_a_validation_error(tmp_path):
    assert "model_type: model" in problems({"model_type": str(tmp_path / "absent")})
    assert "has no config.json" in problems({"model_type": str(tmp_path)})
    (tmp_path / "config.json").write_text("{}")
    assert "has no PyTorch weights" in problems({"model_type": str(tmp_path)})


def test_lang_picks_bert_scores_model_which_must_be_cached():
    text = problems({"lang": "en"})
    assert "lang 'en' selects bert-score's model 'roberta-large'" in text


@pytest.mark.parametrize("params,fragment", [
    ({"num_layers": 7}, "num_layers: 7 is out of range"),
    ({"num_layers": -1}, "num_layers: Input should be greater than or equal to 0"),
    ({"batch_size": 0}, "batch_size"),
    ({"device": "gpu"}, "device"),
    ({"idf": "yes"}, "idf"),
    ({"rescale_with_baseline": True}, "rescale_with_baseline: rescaling needs lang"),
    ({"rescale_with_baseline": True, "model_type": models.BUNDLED_MODEL, "lang": "en"},
     "rescale_with_baseline: bert-score ships no baseline for model "
     "'sentence-transformers/all-MiniLM-L6-v2' and lang 'en' (the bundled offline model has none); "
     "give baseline_path"),
    ({"baseline_path": "/no/such/baseline.tsv"}, "baseline_path: no such file"),
])
def test_invalid_parameters(params, fragment):
    assert fragment in problems(params)


def test_short_baseline_file_is_refused(tmp_path):
    baseline = tmp_path / "b.tsv"
    baseline.write_text("LAYER,P,R,F\n0,0.1,0.1,0.1\n")
    text = problems({"rescale_with_baseline": True, "baseline_path": str(baseline)})
    assert "has 1 layer rows; num_layers 6 needs 7" in text


def test_hub_id_in_the_local_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    snapshot = tmp_path / "models--someone--minilm-copy" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (tmp_path / "models--someone--minilm-copy" / "refs").mkdir()
    (tmp_path / "models--someone--minilm-copy" / "refs" / "main").write_text("0" * 40)
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "model.safetensors"):
        (snapshot / f).symlink_to(f"{MODEL_DIR}/{f}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    # not in bert-score's layer table: num_layers is required
    assert "num_layers: required for model 'someone/minilm-copy'" in problems({"model_type": "someone/minilm-copy"})
    params = BertScoreParams(model_type="someone/minilm-copy", num_layers=LAYERS)
    assert models.resolve(params).path == str(snapshot)
    assert flat(run(INSTANCES[:2], model_type="someone/minilm-copy", num_layers=LAYERS)) == pytest.approx(
        flat(run(INSTANCES[:2])), abs=TOL)


def test_validation_imports_neither_torch_nor_the_workers():
    code = ("import sys; from evalq.shared.job.schema import parse_job; "
            f"parse_job({{'instances': {INSTANCES!r}, 'metrics': [{{'id': 'bertscore', "
            "'parameters': {'idf': True, 'num_layers': 5}}]}); "
            "print(sorted(m for m in ('torch', 'transformers', 'bert_score', 'evalq.workers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# --- registry, worker arguments, aggregation ---------------------------------------

def test_registry_entry():
    spec = REGISTRY.get("bertscore")
    assert (spec.queue, spec.batch, spec.aggregation) == ("gpu", True, "distribution")
    # a GPU-sized chunk: an eighth of the pairs, 512 to 4,096, a multiple of 512 (every power-of-two batch_size)
    from evalq.shared.metrics.registry import device_chunk

    assert spec.device_chunk == (512, 4096)
    assert [device_chunk(n, *spec.device_chunk) for n in (10, 4000, 20_000, 1_000_000)] == [512, 512, 2560, 4096]
    assert all(device_chunk(n, *spec.device_chunk) % BertScoreParams().batch_size == 0 for n in range(1, 50_000, 997))
    assert spec.needs_references and callable(spec.load()) and callable(spec.load_prepare())


def test_gpu_worker_is_one_solo_process_with_prefetch_one():
    from evalq.cli.workerargs import worker_argv

    for concurrency in (None, 4):
        argv = worker_argv(["gpu"], concurrency=concurrency)
        assert argv[argv.index("-P") + 1] == "solo"
        assert argv[argv.index("-c") + 1] == "1"
    argv = worker_argv(["cpu"], concurrency=3)
    assert (argv[argv.index("-P") + 1], argv[argv.index("-c") + 1]) == ("prefork", "3")


def test_a_gpu_worker_of_several_processes_is_a_prefork_pool_sharing_the_cpus(monkeypatch):
    from evalq.cli import workerargs
    from evalq.cli.workerargs import gpu_environment, local_gpu_processes, worker_argv

    argv = worker_argv(["gpu"], concurrency=7, gpu_processes=3)  # -c is not a gpu worker's processes
    assert (argv[argv.index("-P") + 1], argv[argv.index("-c") + 1]) == ("prefork", "3")
    argv = worker_argv(["gpu"], pool="solo", gpu_processes=3)  # an explicit solo pool stays one process
    assert (argv[argv.index("-P") + 1], argv[argv.index("-c") + 1]) == ("solo", "1")
    monkeypatch.setattr(workerargs, "cpu_count", lambda: 16)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    # each its share; the CPUs of the idle ones lent to the busy (evalq.workers.cores)
    assert gpu_environment(2) == {"EVALQ_GPU_PROCESSES": "2", "OMP_NUM_THREADS": "8", "EVALQ_GPU_CPUS": "16"}
    assert gpu_environment(32) == {"EVALQ_GPU_PROCESSES": "32", "OMP_NUM_THREADS": "1", "EVALQ_GPU_CPUS": "16"}
    assert gpu_environment(1) == {"EVALQ_GPU_PROCESSES": "1"}  # one process: torch's own default
    assert gpu_environment(2, {"OMP_NUM_THREADS": "3"}) == {"EVALQ_GPU_PROCESSES": "2"}  # the operator's
    # evalq run: two where there are two CPUs, one on one CPU, else what the setting says
    monkeypatch.delenv("EVALQ_GPU_PROCESSES", raising=False)
    assert local_gpu_processes() == 2
    monkeypatch.setattr(workerargs, "cpu_count", lambda: 1)
    assert local_gpu_processes() == 1
    monkeypatch.setenv("EVALQ_GPU_PROCESSES", "4")
    assert local_gpu_processes() == 4


def test_embedded_mode_starts_no_gpu_process_the_job_has_no_chunk_for(monkeypatch):
    from evalq.cli import workerargs
    from evalq.cli.run import embedded_gpu_processes
    from evalq.shared.job.schema import parse_job

    monkeypatch.setattr(workerargs, "cpu_count", lambda: 8)
    monkeypatch.delenv("EVALQ_GPU_PROCESSES", raising=False)

    def job(n: int, *metrics: str):
        instances = [{"id": f"i{i}", "actual-output": "a b", "expected-output": ["a c"]} for i in range(n)]
        return parse_job({"instances": instances, "metrics": [{"id": m} for m in metrics]}, source="job.json")

    assert embedded_gpu_processes(job(200, "bertscore")) == 1  # one chunk of 512: one process loads the model
    assert embedded_gpu_processes(job(200, "bertscore"), chunk_size=100) == 2  # three chunks
    assert embedded_gpu_processes(job(20_000, "bertscore")) == 2  # evalq run's default, not the 8 chunks
    assert embedded_gpu_processes(job(20_000, "bleu")) == 1  # no gpu entry
    monkeypatch.setenv("EVALQ_GPU_PROCESSES", "3")
    assert embedded_gpu_processes(job(200, "bertscore"), chunk_size=50) == 3


def test_embedded_mode_starts_no_more_cpu_processes_than_the_job_has_cpu_chunks(monkeypatch):
    """Issue 76: an embedded run of a few instances started a cpu pool process per core, each importing
    the metrics to wait; entries scored together are one chunk, as `evalq validate` shows."""
    from evalq.cli import workerargs
    from evalq.cli.run import embedded_cpu_processes
    from evalq.shared.job.schema import parse_job

    monkeypatch.setattr(workerargs, "cpu_count", lambda: 8)

    def job(n: int, *metrics: str):
        instances = [{"id": f"i{i}", "actual-output": "a b", "expected-output": ["a c"]} for i in range(n)]
        return parse_job({"instances": instances, "metrics": [{"id": m} for m in metrics]}, source="job.json")

    assert embedded_cpu_processes(job(6, "bleu", "rouge", "exact_match")) == 1  # scored together: one chunk
    assert embedded_cpu_processes(job(200, "bleu"), chunk_size=50) == 4
    assert embedded_cpu_processes(job(30_000, "bleu"), chunk_size=1_000) == 8  # the machine's, not 30 chunks
    assert embedded_cpu_processes(job(6, "bertscore")) == 1  # no cpu chunk: the pool's least


def test_distribution_aggregation_gives_means_and_spread():
    agg = aggregator_for("distribution")
    values = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 0.55]
    for v in values:
        agg.add({"result": {"precision": v, "recall": 1 - v, "f1": v / 2}})
    agg.add({"error": "boom"})
    agg.add({"result": {"precision": None, "recall": 0.5, "f1": 0.0}})
    score = agg.score()
    assert (agg.n, agg.n_errors) == (12, 1)
    assert score["precision"] == pytest.approx(sum(values) / len(values))
    assert score["recall"] == pytest.approx((sum(1 - v for v in values) + 0.5) / 12)
    d = score["distribution"]["precision"]
    assert (d["min"], d["max"]) == (0.1, 1.0)
    import numpy as np

    for name, q in (("p5", 0.05), ("p25", 0.25), ("median", 0.5), ("p75", 0.75), ("p95", 0.95)):
        assert d[name] == pytest.approx(float(np.quantile(values, q)))  # numpy's default: linear
    assert d["median"] == pytest.approx(0.55)
    assert d["histogram"]["edges"][0] == 0.1 and d["histogram"]["edges"][-1] == 1.0
    assert sum(d["histogram"]["counts"]) == len(values)
    assert d["std"] == pytest.approx((sum((v - score["precision"]) ** 2 for v in values) / len(values)) ** 0.5)


def test_distribution_of_lists_is_per_position_and_of_scalars_is_flat():
    agg = DistributionAggregator()
    agg.add({"result": {"f1": [0.2, 0.4]}})
    agg.add({"result": {"f1": [0.4, 0.8]}})
    score = agg.score()
    assert score["f1"] == pytest.approx([0.3, 0.6])
    assert [d["max"] for d in score["distribution"]["f1"]] == [0.4, 0.8]
    scalar = DistributionAggregator()
    for v in (1.0, 3.0):
        scalar.add({"result": v})
    assert scalar.score()["mean"] == 2.0 and scalar.score()["distribution"]["median"] == 2.0
    assert DistributionAggregator().score() is None


def test_mean_aggregation_is_unchanged():
    agg = aggregator_for("mean")
    assert type(agg) is MeanAggregator
    agg.add({"result": {"f1": 1.0}})
    agg.add({"result": {"f1": 0.0}})
    assert agg.score() == {"f1": 0.5}
