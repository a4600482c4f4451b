"""Bounded work per item (evalq.shared.core.bounds): parameter sizes refused at validation,
ROUGE-L's token limit, the per-item time budget. Each test is an attack from the
trust-boundary review (a job file or queue message is untrusted input); the real
worker path is in tests/integration/test_item_bounds.py."""

from __future__ import annotations

import sys
import time

import pytest
from nltk.tokenize import wordpunct_tokenize
from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu
from rouge_score.rouge_scorer import RougeScorer

from evalq.shared.core import bounds
from evalq.shared.core.errors import JobError, MetricError
from evalq.shared.job.schema import parse_job
from evalq.shared.metrics.params import BleuParams, RougeParams
from evalq.shared.metrics.registry import MetricSpec
from evalq.workers.metrics.lexical import bleu, rouge
from evalq.workers.chunk import score_items

INSTANCE = {"id": "1", "actual-output": "the cat sat on the mat", "expected-output": ["the cat is on the mat"]}
JUDGES = {"j": {"provider": "openai", "model": "m", "api_key_env": "BOUNDS_TEST_API_KEY",
                "deployments": [{"region": "lab", "base_url": "http://127.0.0.1:9/v1", "tpm": 1000, "rpm": 10}]}}


# what "at once" may take on a loaded machine (the suite runs more processes than cores): the
# failures these bounds catch take minutes (a quadratic ROUGE-L, 20,000 BLEU weights per item) or never end
AT_ONCE = 30


def problems(metric: dict, **job) -> list[str]:
    with pytest.raises(JobError) as caught:
        parse_job({"instances": [{**INSTANCE, "context": "c", "input": "q"}], "metrics": [metric], **job},
                  source="job.json")
    return caught.value.problems


# --- parameter sizes: refused at validation, located -------------------------------------------

def test_bleu_weights_of_20000_entries_are_refused_at_validation():
    """The attack: 20,000 weights cost ~10 us each per item, on every item."""
    t0 = time.perf_counter()
    found = problems({"id": "bleu", "parameters": {"weights": [0.00005] * 20_000}})
    assert time.perf_counter() - t0 < AT_ONCE
    assert len(found) == 1
    assert found[0].startswith("job.json: metrics[0] (bleu).parameters: weights: ")
    assert f"at most {bounds.MAX_BLEU_ORDER} items" in found[0]


@pytest.mark.parametrize("metric,fragment", [
    ({"id": "rubric", "parameters": {"judge": "j", "criteria": "x" * (bounds.MAX_CRITERIA_CHARS + 1)}},
     "metrics[0] (rubric).parameters: criteria: String should have at most"),
    ({"id": "rubric", "parameters": {"judge": "j", "criteria": "c",
                                     "examples": [{"score": 3, "output": "o"}] * (bounds.MAX_EXAMPLES + 1)}},
     "metrics[0] (rubric).parameters: examples: List should have at most"),
    ({"id": "rubric", "parameters": {"judge": "j", "criteria": "c",
                                     "examples": [{"score": 3, "output": "o" * (bounds.MAX_EXAMPLE_CHARS + 1)}]}},
     "metrics[0] (rubric).parameters: examples.0.output: String should have at most"),
    ({"id": "coherence", "parameters": {"judge": "j" * (bounds.MAX_NAME_CHARS + 1)}},
     "metrics[0] (coherence).parameters: judge: String should have at most"),
    ({"id": "claims_f1", "parameters": {"judge": "j" * (bounds.MAX_NAME_CHARS + 1)}},
     "metrics[0] (claims_f1).parameters: judge: String should have at most"),
    ({"id": "violence", "parameters": {"judge": "j" * (bounds.MAX_NAME_CHARS + 1)}},
     "metrics[0] (violence).parameters: judge: String should have at most"),
    ({"id": "bertscore", "parameters": {"lang": "x" * (bounds.MAX_LANG_CHARS + 1)}},
     "metrics[0] (bertscore).parameters: lang: String should have at most"),
    ({"id": "bertscore", "parameters": {"batch_size": bounds.MAX_BATCH_SIZE + 1}},
     "metrics[0] (bertscore).parameters: batch_size: Input should be less than or equal to"),
    ({"id": "bertscore", "parameters": {"baseline_path": "/" + "x" * bounds.MAX_PATH_CHARS}},
     "metrics[0] (bertscore).parameters: baseline_path: String should have at most"),
    ({"id": "bleu", "parameters": {"weights": [0.5, float("inf")]}},
     "metrics[0] (bleu).parameters: weights: Value error, weights must be finite"),
])
def test_each_list_and_string_parameter_has_a_maximum(metric, fragment, monkeypatch):
    monkeypatch.setenv("BOUNDS_TEST_API_KEY", "k")
    found = problems(metric, judges=JUDGES)
    assert any(fragment in p for p in found), found


def test_parameters_at_their_maxima_are_valid(monkeypatch):
    monkeypatch.setenv("BOUNDS_TEST_API_KEY", "k")
    examples = [{"score": 1 + k % 5, "output": "o" * bounds.MAX_EXAMPLE_CHARS} for k in range(bounds.MAX_EXAMPLES)]
    job = parse_job({"instances": [INSTANCE], "judges": JUDGES, "metrics": [
        {"id": "bleu", "parameters": {"weights": [1 / bounds.MAX_BLEU_ORDER] * bounds.MAX_BLEU_ORDER}},
        {"id": "rouge", "parameters": {"rouge_types": [f"rouge{n}" for n in range(1, 10)] + ["rougeL", "rougeLsum"]}},
        {"id": "rubric", "parameters": {"judge": "j", "criteria": "c" * bounds.MAX_CRITERIA_CHARS,
                                        "examples": examples}}]})
    assert len(job.metrics) == 3


# --- ROUGE-L/Lsum: tokens per text ---------------------------------------------------------------

def long_text(tokens: int) -> str:
    return " ".join(f"w{k % 997}" for k in range(tokens))


@pytest.mark.parametrize("rouge_type", ["rougeL", "rougeLsum"])
def test_a_20k_token_text_is_an_error_at_once_for_rouge_l(rouge_type):
    """The attack: ROUGE-L is quadratic in tokens (20k tokens: minutes and gigabytes per item)."""
    item = {"id": "big", "actual-output": long_text(20_000), "expected-output": [long_text(20_000)]}
    t0 = time.perf_counter()
    with pytest.raises(MetricError) as caught:
        rouge(item, RougeParams(rouge_types=["rouge1", rouge_type]))
    assert time.perf_counter() - t0 < AT_ONCE
    message = str(caught.value)
    assert "actual-output has 20000 tokens" in message and f"limit of {bounds.ROUGE_L_TOKENS_DEFAULT}" in message
    assert bounds.ROUGE_L_TOKENS_ENV in message


def test_the_limit_names_the_reference_and_counts_rouge_scores_tokens():
    # "a-b" is two tokens to rouge-score (punctuation splits), so 1,200 of them are 2,400 tokens
    item = {"id": "r", "actual-output": "short answer", "expected-output": ["ok", "a-b " * 1_200]}
    with pytest.raises(MetricError, match=r"expected-output\[1\] has 2400 tokens"):
        rouge(item, RougeParams(rouge_types=["rougeL"]))


def test_n_gram_rouge_has_no_token_limit():
    item = {"id": "big", "actual-output": long_text(20_000), "expected-output": [long_text(20_000)]}
    assert rouge(item, RougeParams(rouge_types=["rouge1", "rouge2"]))["rouge1"] == pytest.approx(1.0)


def test_the_rouge_l_limit_is_a_setting(monkeypatch):
    """Lowered and raised around texts of 250 tokens (the default's 2,000 are held above: a pure-
    Python LCS of 2,500 x 2,400 tokens took 7 s a run on the suite's loaded 2 cores, three runs)."""
    item = {"id": "mid", "actual-output": long_text(250), "expected-output": [long_text(240)]}
    assert rouge(item, RougeParams(rouge_types=["rougeL"]))  # under the default
    monkeypatch.setenv(bounds.ROUGE_L_TOKENS_ENV, "200")
    with pytest.raises(MetricError):
        rouge(item, RougeParams(rouge_types=["rougeL"]))
    monkeypatch.setenv(bounds.ROUGE_L_TOKENS_ENV, "300")
    expected = RougeScorer(["rougeL"]).score(item["expected-output"][0], item["actual-output"])["rougeL"]
    assert rouge(item, RougeParams(rouge_types=["rougeL"]))["rougeL"] == expected.fmeasure
    monkeypatch.setenv(bounds.ROUGE_L_TOKENS_ENV, "0")  # no limit
    assert rouge(item, RougeParams(rouge_types=["rougeL"]))["rougeL"] == expected.fmeasure


def test_values_under_the_limits_equal_the_reference_libraries():
    params = BleuParams(weights=[0.1] * 10, smoothing_function="method1")
    expected = sentence_bleu([wordpunct_tokenize(r) for r in INSTANCE["expected-output"]],
                             wordpunct_tokenize(INSTANCE["actual-output"]), weights=(0.1,) * 10,
                             smoothing_function=SmoothingFunction().method1)
    assert bleu(INSTANCE, params) == expected
    item = {"id": "x", "actual-output": long_text(2_000), "expected-output": [long_text(1_999)]}
    scores = RougeScorer(["rougeL", "rougeLsum"]).score(item["expected-output"][0], item["actual-output"])
    got = rouge(item, RougeParams(rouge_types=["rougeL", "rougeLsum"]))
    assert (got["rougeL"], got["rougeLsum"]) == (scores["rougeL"].fmeasure, scores["rougeLsum"].fmeasure)


# --- the time budget per item ---------------------------------------------------------------------

def spin(instance: dict, params) -> str:
    """A metric that runs away on one item (busy, not sleeping: a signal must still stop it)."""
    if instance["actual-output"] == "hang":
        while True:
            pass
    return instance["actual-output"]


SPIN = MetricSpec(id="spin", params=BleuParams, impl=f"{__name__}:spin", queue="cpu", description="test")


def test_an_item_past_its_time_budget_gets_an_error_and_the_others_are_scored(monkeypatch):
    monkeypatch.setenv(bounds.ITEM_TIMEOUT_ENV, "0.3")
    items = [{"id": "a", "actual-output": "x"}, {"id": "b", "actual-output": "hang"}, {"id": "c", "actual-output": "y"}]
    t0 = time.perf_counter()
    records = score_items(SPIN, BleuParams(), items)
    assert time.perf_counter() - t0 < AT_ONCE
    assert [r.get("result") for r in records] == ["x", None, "y"]
    assert records[1]["error"] == ("ItemTimeout: the item took longer than 0.3 s, the time budget per item "
                                   "(EVALQ_ITEM_TIMEOUT raises it)")


def test_no_budget_outside_the_main_thread_nor_for_endpoint_or_batch_metrics(monkeypatch):
    import threading

    from evalq.workers.item_budget import bounded

    def wrapped(spec):
        with bounded(spec, spin) as fn:
            return fn

    monkeypatch.setenv(bounds.ITEM_TIMEOUT_ENV, "0.3")
    assert wrapped(SPIN) is not spin
    for kind in ({"queue": "judge"}, {"queue": "generate"}, {"batch": True}):
        spec = MetricSpec(id="x", params=BleuParams, impl="m:f", description="test", **{"queue": "cpu", **kind})
        assert wrapped(spec) is spin, kind
    seen = []
    thread = threading.Thread(target=lambda: seen.append(wrapped(SPIN)))
    thread.start()
    thread.join()
    assert seen == [spin]  # a threads pool: judge timeouts bound the work, no signal can
    monkeypatch.setenv(bounds.ITEM_TIMEOUT_ENV, "0")
    assert wrapped(SPIN) is spin


def pause(instance: dict, params) -> str:
    """A metric that takes its time on every item, busy (a signal must find it working)."""
    if instance["actual-output"] == "hang":
        while True:
            pass
    until = time.perf_counter() + float(instance["actual-output"])
    while time.perf_counter() < until:
        pass
    return instance["actual-output"]


PAUSE = MetricSpec(id="pause", params=BleuParams, impl=f"{__name__}:pause", queue="cpu", description="test")


def test_the_budget_is_each_items_own_however_long_the_chunk(monkeypatch):
    """One timer watches the whole chunk: the items before the runaway take four budgets together,
    each under its own, and are scored (the timer fires during several of them); the runaway is
    stopped one budget after its own start."""
    monkeypatch.setenv(bounds.ITEM_TIMEOUT_ENV, "0.25")
    items = [{"id": f"i{k}", "actual-output": "0.1"} for k in range(10)]
    items += [{"id": "runaway", "actual-output": "hang"}, {"id": "last", "actual-output": "0.2"}]
    starts = {}
    real = pause

    def timed(instance, params):
        starts[instance["id"]] = time.perf_counter()
        return real(instance, params)

    monkeypatch.setattr(sys.modules[__name__], "pause", timed)
    t0 = time.perf_counter()
    records = score_items(PAUSE, BleuParams(), items)
    ended = time.perf_counter()
    assert [r.get("result") for r in records] == ["0.1"] * 10 + [None, "0.2"]
    assert records[10]["error"].startswith("ItemTimeout: the item took longer than 0.25 s")
    stopped_after = starts["last"] - starts["runaway"]
    assert 0.25 <= stopped_after < 0.6, stopped_after  # its own budget, not what the chunk had left
    assert ended - t0 < 3


def own_alarm(instance: dict, params) -> str:
    """A metric with a SIGALRM handler of its own, which it leaves installed."""
    import signal

    if instance["actual-output"] == "hang":
        while True:
            pass
    signal.signal(signal.SIGALRM, lambda *_: None)
    return instance["actual-output"]


OWN_ALARM = MetricSpec(id="own", params=BleuParams, impl=f"{__name__}:own_alarm", queue="cpu", description="test")


def test_an_item_that_installs_its_own_alarm_handler_does_not_unwatch_the_next(monkeypatch):
    monkeypatch.setenv(bounds.ITEM_TIMEOUT_ENV, "0.3")
    items = [{"id": "a", "actual-output": "x"}, {"id": "b", "actual-output": "hang"}]
    t0 = time.perf_counter()
    records = score_items(OWN_ALARM, BleuParams(), items)
    assert time.perf_counter() - t0 < AT_ONCE
    assert records[0]["result"] == "x" and records[1]["error"].startswith("ItemTimeout")


def test_the_timer_is_disarmed_and_the_handler_restored_after_each_item(monkeypatch):
    import signal

    monkeypatch.setenv(bounds.ITEM_TIMEOUT_ENV, "0.2")
    before = signal.getsignal(signal.SIGALRM)
    score_items(SPIN, BleuParams(), [{"id": "a", "actual-output": "x"}])
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) == before


@pytest.mark.parametrize("variable,value", [(bounds.ITEM_TIMEOUT_ENV, "-1"), (bounds.ROUGE_L_TOKENS_ENV, "2.5")])
def test_a_bad_setting_is_a_job_error(monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    with pytest.raises(JobError, match=variable):
        bounds.check_env()


@pytest.mark.parametrize("field, value, message", [
    ("window_seconds", 10**9, "less than or equal to 3600"),
    ("burst_seconds", 10**6, "less than or equal to 3600"),
    ("burst_seconds", 120, "burst_seconds (120) may be at most window_seconds (60)"),
    ("tpm", 10**9, "less than or equal to 200000000"),
    ("rpm", 10**7, "less than or equal to 1000000"),
])
def test_a_deployment_declares_bounded_rates_and_durations(field, value, message):
    """Before: window_seconds 1e9 and burst_seconds 1e6 moved a shared deployment's pace key by
    weeks per call. Every rate and duration a job may declare now has a documented bound."""
    from evalq.shared.job.schema import parse_job

    deployment = {"region": "lab", "base_url": "http://127.0.0.1:9/v1", "tpm": 1000, "rpm": 10, field: value}
    job = {"instances": [{"id": "1", "actual-output": "a", "context": "c"}],
           "judges": {"j": {"provider": "openai", "model": "m", "api_key_env": "TEST_UNIT_API_KEY",
                            "deployments": [deployment]}},
           "metrics": [{"id": "coherence", "parameters": {"judge": "j"}}]}
    with pytest.raises(JobError) as exc:
        parse_job(job)
    assert any("judges.j" in p and message in p for p in exc.value.problems), exc.value.problems


@pytest.mark.parametrize("section, field, value", [
    ("judge", "max_tokens", 10**6), ("judge", "timeout", 10**5), ("judge", "max_retries", 100),
    ("judging", "cache_ttl", 10**9), ("batch", "enqueued_tokens", 10**12)])
def test_every_other_endpoint_number_is_bounded(section, field, value):
    from evalq.shared.job.schema import parse_job

    deployment = {"region": "lab", "base_url": "http://127.0.0.1:9/v1", "tpm": 1000, "rpm": 10}
    judge = {"provider": "openai", "model": "m", "api_key_env": "TEST_UNIT_API_KEY", "deployments": [deployment]}
    judging = {}
    if section == "judge":
        judge[field] = value
    elif section == "judging":
        judging[field] = value
    else:
        deployment["batch"] = {field: value}
    job = {"instances": [{"id": "1", "actual-output": "a", "context": "c"}], "judges": {"j": judge},
           "judging": judging, "metrics": [{"id": "coherence", "parameters": {"judge": "j"}}]}
    with pytest.raises(JobError) as exc:
        parse_job(job)
    assert any(field in p and "less than or equal to" in p for p in exc.value.problems), exc.value.problems
