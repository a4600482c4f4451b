"""evalq compare and quality gates: numbers against numpy/scipy on the same pairs,
gates at their boundaries, exit codes through the real CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from evalq.cli.compare import compare, evaluate_gates, load_run, parse_gate
from evalq.shared.scores import stats
from evalq.shared.core.errors import JobError

ROOT = Path(__file__).resolve().parents[2]
RNG = np.random.default_rng(7)
N = 60
BASE_BLEU = RNG.uniform(0, 1, N)
NEW_BLEU = np.clip(BASE_BLEU + RNG.normal(0.05, 0.1, N), 0, 1)
BASE_RATING = RNG.integers(1, 6, N)
NEW_RATING = np.clip(BASE_RATING + RNG.integers(-1, 2, N), 1, 5)
BASE_SEV = RNG.integers(0, 8, N)
NEW_SEV = RNG.integers(0, 8, N)


# How a log line names its entry: HarpIA's parameters with the entry's position (the default),
# the position only (output.log_parameters false), or parameters only (logs of older evalq)
LINE_FORMS = {"both": lambda k, h: {**h, "entry": k}, "entry": lambda k, h: {"metric": h["metric"], "entry": k},
              "parameters": lambda k, h: h}


def write_run(path: Path, bleu, rating, severity, ids=None, threshold=4, categories=True, form="parameters") -> Path:
    path.mkdir(parents=True)
    ids = ids if ids is not None else [f"i{k}" for k in range(len(bleu))]
    heads = [{"metric": "bleu", "parameters": {"weights": [0.5, 0.5]}},
             {"metric": "coherence", "parameters": {"judge": "j", "threshold": 4}},
             {"metric": "violence", "parameters": {"judge": "j", "threshold": threshold}}]
    (path / "results.json").write_text(json.dumps([{**h, "score": None} for h in heads]))
    lines = []
    named = [LINE_FORMS[form](slot, h) for slot, h in enumerate(heads)]
    for k, iid in enumerate(ids):
        cat = {"category": "even" if k % 2 == 0 else "odd"} if categories else {}
        lines.append({"instance_id": iid, **cat, **named[0], "result": float(bleu[k])})
        lines.append({"instance_id": iid, **cat, **named[1], "result": {"score": int(rating[k]), "reason": "r"}})
        lines.append({"instance_id": iid, **cat, **named[2],
                      "result": {"severity": int(severity[k]), "label": "x", "reason": "r"}})
    (path / "log.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


@pytest.fixture
def runs(tmp_path):
    base = write_run(tmp_path / "base", BASE_BLEU, BASE_RATING, BASE_SEV)
    new = write_run(tmp_path / "new", NEW_BLEU, NEW_RATING, NEW_SEV)
    return base, new


def test_every_log_line_form_reads_the_same(tmp_path, runs):
    """Lines with parameters and position (HarpIA's format, the default), with the position only
    (output.log_parameters false) and with parameters only (older logs) compare the same."""
    base, new = runs
    reference = compare(load_run(str(base)), load_run(str(new)))
    for form in ("both", "entry"):
        b = write_run(tmp_path / f"base-{form}", BASE_BLEU, BASE_RATING, BASE_SEV, form=form)
        n = write_run(tmp_path / f"new-{form}", NEW_BLEU, NEW_RATING, NEW_SEV, form=form)
        report = compare(load_run(str(b)), load_run(str(n)))
        assert report["entries"] == reference["entries"], form
        assert field(report, "bleu", "mean")["n_pairs"] == N


def field(report, entry, name):
    return next(e for e in report["entries"] if e["entry"] == entry)["fields"][name]


def test_paired_differences_against_numpy_and_scipy(runs):
    from scipy import stats as sp

    base, new = runs
    report = compare(load_run(str(base)), load_run(str(new)))
    bleu = field(report, "bleu", "mean")
    diffs = NEW_BLEU - BASE_BLEU
    assert bleu["n_pairs"] == N
    assert bleu["base"] == pytest.approx(BASE_BLEU.mean()) and bleu["new"] == pytest.approx(NEW_BLEU.mean())
    assert bleu["diff"] == pytest.approx(diffs.mean())
    # the paired bootstrap interval agrees with scipy's percentile bootstrap of the mean difference
    ref = sp.bootstrap((diffs,), np.mean, n_resamples=20000, method="percentile", random_state=1).confidence_interval
    assert bleu["ci95"][0] == pytest.approx(ref.low, abs=0.01) and bleu["ci95"][1] == pytest.approx(ref.high, abs=0.01)
    # and the permutation p-value scipy's paired (sign-flip) permutation test
    perm = sp.permutation_test((BASE_BLEU, NEW_BLEU), lambda a, b: np.mean(b - a), permutation_type="samples",
                               n_resamples=20000, random_state=1)
    assert bleu["p_value"] == pytest.approx(perm.pvalue, abs=0.01)
    rating = field(report, "coherence", "mean")
    assert rating["diff"] == pytest.approx((NEW_RATING - BASE_RATING).mean())
    defect = field(report, "violence", "defect_rate")
    assert defect["base"] == pytest.approx((BASE_SEV >= 4).mean()) and defect["new"] == pytest.approx((NEW_SEV >= 4).mean())
    assert defect["diff"] == pytest.approx((NEW_SEV >= 4).mean() - (BASE_SEV >= 4).mean())


def test_flips_categories_and_instances_in_one_run_only(tmp_path):
    base = write_run(tmp_path / "b", BASE_BLEU[:10], BASE_RATING[:10], BASE_SEV[:10], ids=[f"i{k}" for k in range(10)])
    new = write_run(tmp_path / "n", NEW_BLEU[:10], NEW_RATING[:10], NEW_SEV[:10],
                    ids=[f"i{k}" for k in range(2, 12)])
    report = compare(load_run(str(base)), load_run(str(new)))
    assert report["only_in_base"] == {"n": 2, "ids": ["i0", "i1"]}
    assert report["only_in_new"] == {"n": 2, "ids": ["i10", "i11"]}
    coherence = next(e for e in report["entries"] if e["entry"] == "coherence")
    # instance i{k} of the new run carries the new arrays' element k - 2
    b = {f"i{k}": BASE_RATING[k] >= 4 for k in range(10)}
    n = {f"i{k}": NEW_RATING[k - 2] >= 4 for k in range(2, 12)}
    common = sorted(set(b) & set(n))
    assert coherence["flips"]["pass_to_fail"]["ids"] == [i for i in common if b[i] and not n[i]]
    assert coherence["flips"]["fail_to_pass"]["ids"] == [i for i in common if not b[i] and n[i]]
    even = [i for i in common if int(i[1:]) % 2 == 0]
    assert coherence["categories"]["even"]["mean"]["n_pairs"] == len(even)


def test_different_parameters_are_compared_with_a_warning(tmp_path):
    base = write_run(tmp_path / "b", BASE_BLEU, BASE_RATING, BASE_SEV, threshold=4)
    new = write_run(tmp_path / "n", NEW_BLEU, NEW_RATING, NEW_SEV, threshold=5)
    # a different threshold is a different head: the entry is matched by name, the difference named
    report = compare(load_run(str(base)), load_run(str(new)))
    violence = next(e for e in report["entries"] if e["entry"] == "violence")
    assert violence["warnings"] == ["parameters differ: threshold 4 -> 5"]


def test_wilson_interval_against_the_textbook():
    k, n, z = 7, 40, 1.959963984540054
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    assert stats.wilson(k, n) == pytest.approx([centre - half, centre + half])


@pytest.mark.parametrize("text,passes", [
    ("bleu.mean >= {v}", True), ("bleu.mean > {v}", False), ("bleu.mean <= {v}", True), ("bleu.mean < {v}", False),
    ("bleu.mean == {v}", True),
])
def test_gates_at_their_boundaries(runs, text, passes):
    base, new = load_run(str(runs[0])), load_run(str(runs[1]))
    [probe] = evaluate_gates([parse_gate("bleu.mean >= 0")], base, new)
    value = probe["value"]
    assert value == pytest.approx(float(NEW_BLEU.mean()))
    [result] = evaluate_gates([parse_gate(text.format(v=repr(value)))], base, new)
    assert result["passed"] is passes


def test_delta_and_defect_gates(runs):
    base, new = runs
    b, n = load_run(str(base)), load_run(str(new))
    delta = float((NEW_BLEU - BASE_BLEU).mean())
    results = evaluate_gates([parse_gate(f"delta(bleu.mean) >= {delta - 1e-9}"),
                              parse_gate(f"delta(bleu.mean) >= {delta + 1e-9}"),
                              parse_gate(f"violence.defect_rate <= {(NEW_SEV >= 4).mean()}")], b, n)
    assert [r["passed"] for r in results] == [True, False, True]
    assert results[2]["ci95"] == pytest.approx(stats.wilson(int((NEW_SEV >= 4).sum()), N))


@pytest.mark.parametrize("text", ["bleu >= 1", "bleu.mean => 1", "delta(bleu.mean >= 1", "bleu.mean >= high"])
def test_malformed_gates(text):
    with pytest.raises(JobError):
        parse_gate(text)


def evalq(*args):
    return subprocess.run([sys.executable, "-m", "evalq.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_exit_codes_of_compare_with_gates(runs):
    base, new = runs
    ok = evalq("compare", str(base), str(new), "--gate", "bleu.mean >= 0", "--gate", "delta(coherence.mean) >= -5")
    assert ok.returncode == 0, ok.stderr
    assert "gate bleu.mean >= 0:" in ok.stdout and "PASS" in ok.stdout
    fail = evalq("compare", str(base), str(new), "--gate", "violence.defect_rate <= 0.0")
    assert fail.returncode == 3 and "FAIL" in fail.stdout
    missing = evalq("compare", str(base), str(new), "--gate", "groundedness.mean >= 4")
    assert missing.returncode == 2 and "no metric entry 'groundedness' in the new run" in missing.stderr
    assert "Traceback" not in missing.stderr
    as_json = evalq("compare", str(base), str(new), "--json")
    assert as_json.returncode == 0 and json.loads(as_json.stdout)["entries"][0]["entry"] == "bleu"
    nowhere = evalq("compare", str(base), str(new.parent / "nowhere"))
    assert nowhere.returncode == 2 and "no such file" in nowhere.stderr
