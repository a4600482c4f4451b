"""report.html (written by every run, and by `evalq report`) and the comparison's
HTML, rendered in a real headless browser (Debian's chromium): a screenshot is
taken, the page logs no console error, and every chart is drawn."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import uuid

import pytest

from evalq.sim import JudgeSim, Region
from tests.conftest import evalq

pytestmark = pytest.mark.integration

KEY_ENV, KEY = "TEST_REPORT_API_KEY", "sk-report-" + uuid.uuid4().hex


def browser() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("chromium is not installed (.ci/run installs it with apt-get)")
    return path


def render(page, tmp_path) -> tuple[str, str]:
    """(the DOM after loading, chromium's log) of a page; a screenshot is written beside it."""
    chrome = browser()
    common = [chrome, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
              f"--user-data-dir={tmp_path / 'profile'}"]
    shot = subprocess.run([*common, "--window-size=1100,2000", f"--screenshot={page}.png", f"file://{page}"],
                          capture_output=True, text=True, timeout=120)
    assert os.path.getsize(f"{page}.png") > 10_000, shot.stderr[-2000:]
    dom = subprocess.run([*common, "--dump-dom", f"file://{page}"], capture_output=True, text=True, timeout=120)
    return dom.stdout, shot.stderr + dom.stderr


def assert_drawn(dom: str, log: str, min_charts: int) -> None:
    assert "CONSOLE" not in log and "Uncaught" not in log, log[-2000:]
    charts = re.findall(r"<svg class=\"chart\".*?</svg>", dom, re.S)
    assert len(charts) >= min_charts
    for chart in charts:  # every chart has bars with a height
        heights = [float(h) for h in re.findall(r'<rect[^>]* height="([\d.]+)"', chart)]
        assert heights and max(heights) > 1, chart[:300]


def test_every_run_writes_a_report_that_a_browser_draws(tmp_path):
    browser()
    tag = uuid.uuid4().hex
    with JudgeSim([Region("lab")], api_key=KEY) as sim:
        job = {"instances": [{"id": f"r{i}", "input": f"Question {i}?", "category": "ab"[i % 2],
                              "actual-output": f"Answer {i} {tag} [[sim:score={1 + i % 5}]] [[sim:severity={i % 8}]]",
                              "expected-output": [f"Answer {i} reference"]} for i in range(16)],
               "judges": {"sim": {"provider": "openai", "model": "judge-sim", "api_key_env": KEY_ENV,
                                  "deployments": [{"region": "lab", "base_url": sim.base_url("lab"),
                                                   "tpm": 10_000_000, "rpm": 100_000}]}},
               "metrics": [{"id": "bleu", "parameters": {"smoothing_function": "method1"}},
                           {"id": "coherence", "parameters": {"judge": "sim", "threshold": 4}},
                           {"id": "violence", "parameters": {"judge": "sim"}},
                           {"id": "content_safety", "parameters": {"judge": "sim"}}]}
        path = tmp_path / "job.json"
        path.write_text(json.dumps(job))
        proc = evalq("run", str(path), "--out", str(tmp_path / "out"), "-q", env={KEY_ENV: KEY})
        assert proc.returncode == 0, proc.stderr
    page = tmp_path / "out" / "report.html"
    text = page.read_text()
    # self-contained: nothing to fetch
    assert "<script" not in text and "<link" not in text and not re.search(r"(src|href)=[\"']?https?:", text)
    for section in ("Overview", "Judge spend", "Where the time went", "Worst items", "Per category", "95% CI"):
        assert section in text, section
    assert "Question 7?" in text  # a worst item shows its input (violence severity 7)
    dom, log = render(page, tmp_path)
    assert_drawn(dom, log, min_charts=5)  # slowest, bleu histogram, ratings, severities, harms
    # `evalq report` rebuilds it from the outputs alone
    again = evalq("report", str(tmp_path / "out"), "--html", str(tmp_path / "again.html"))
    assert again.returncode == 0, again.stderr
    dom, log = render(tmp_path / "again.html", tmp_path)
    assert_drawn(dom, log, min_charts=5)


def test_the_comparison_html_is_drawn(tmp_path):
    browser()
    from tests.unit.test_compare import BASE_BLEU, BASE_RATING, BASE_SEV, NEW_BLEU, NEW_RATING, NEW_SEV, write_run

    base = write_run(tmp_path / "base", BASE_BLEU, BASE_RATING, BASE_SEV)
    new = write_run(tmp_path / "new", NEW_BLEU, NEW_RATING, NEW_SEV)
    proc = evalq("compare", str(base), str(new), "--html", str(tmp_path / "compare.html"),
                 "--gate", "bleu.mean >= 0.99")
    assert proc.returncode == 3
    text = (tmp_path / "compare.html").read_text()
    assert "FAIL" in text and "bleu.mean &gt;= 0.99" in text
    dom, log = render(tmp_path / "compare.html", tmp_path)
    assert_drawn(dom, log, min_charts=3)


def test_the_report_from_the_workers_views_equals_the_one_rebuilt_from_the_log(tmp_path):
    """Every run's report.html is made from what each worker kept of its chunks (worst
    items, samples), not from the log; `evalq report` rebuilds it from log.jsonl. On a
    job small enough to sample every value, the two pages are the same: same
    histograms, same worst items (errors, severities, harms, flags, scores, numbers)
    merged across chunks. No browser needed."""
    tag = uuid.uuid4().hex
    with JudgeSim([Region("lab")], api_key=KEY) as sim:
        job = {"instances": [{"id": f"v{i}", "input": f"Question {i}?", "category": "ab"[i % 2],
                              "actual-output": f"Answer {i} {tag} [[sim:score={1 + i % 5}]] [[sim:severity={i % 8}]]"
                                               + (" FAIL" if i % 11 == 3 else ""),
                              "expected-output": [f"Answer {i} reference"]} for i in range(37)],
               "judges": {"sim": {"provider": "openai", "model": "judge-sim", "api_key_env": KEY_ENV,
                                  "deployments": [{"region": "lab", "base_url": sim.base_url("lab"),
                                                   "tpm": 10_000_000, "rpm": 100_000}]}},
               "metrics": [{"id": "bleu", "parameters": {"smoothing_function": "method1"}},
                           {"id": "f1_score"},
                           {"id": "fail_on"},
                           {"id": "coherence", "parameters": {"judge": "sim", "threshold": 4}},
                           {"id": "violence", "parameters": {"judge": "sim"}},
                           {"id": "content_safety", "parameters": {"judge": "sim"}},
                           {"id": "protected_material", "parameters": {"judge": "sim"}}]}
        path = tmp_path / "job.json"
        path.write_text(json.dumps(job))
        proc = evalq("run", str(path), "--out", str(tmp_path / "out"), "-q", "--chunk-size", "5",
                     env={KEY_ENV: KEY})
        assert proc.returncode == 0, proc.stderr
    again = evalq("report", str(tmp_path / "out"), "--html", str(tmp_path / "again.html"))
    assert again.returncode == 0, again.stderr
    made = (tmp_path / "out" / "report.html").read_text()
    # the run's page also shows each worst item's texts (from Redis), which the outputs do not hold
    texts = re.compile(r"<p><b>(input|output|references)</b></p><pre>.*?</pre>", re.S)
    assert len(texts.findall(made)) >= 7 * 3
    assert texts.sub("", made) == (tmp_path / "again.html").read_text()
    assert made.count("<svg") >= 5 and "Worst items" in made
    assert "ValueError" in made  # fail_on's errors rank worst


def test_the_page_people_look_at_reads_at_a_glance(tmp_path):
    """Issue 60's report: a rated metric's pass rate (results.json had it, the page did not); worst
    items as text (score and the judge's reason, not a JSON object under a bare id); the slowest
    metrics with their unit; a 0/1 metric as two bars, not twenty bins; rouge's fields side by side."""
    tag = uuid.uuid4().hex
    with JudgeSim([Region("lab")], api_key=KEY) as sim:
        job = {"instances": [{"id": f"g{i}", "input": f"Question {i}?",
                              "actual-output": f"answer {i % 3} {tag} [[sim:score={1 + i % 5}]]",
                              "expected-output": [f"answer {i % 2} {tag}"]} for i in range(12)],
               "judges": {"sim": {"provider": "openai", "model": "judge-sim", "api_key_env": KEY_ENV,
                                  "deployments": [{"region": "lab", "base_url": sim.base_url("lab"),
                                                   "tpm": 10_000_000, "rpm": 100_000}]}},
               "metrics": [{"id": "coherence", "parameters": {"judge": "sim", "threshold": 4}},
                           {"id": "exact_match"}, {"id": "rouge"}]}
        path = tmp_path / "job.json"
        path.write_text(json.dumps(job))
        proc = evalq("run", str(path), "--out", str(tmp_path / "out"), "-q", env={KEY_ENV: KEY})
        assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "out" / "report.html").read_text()
    results = {m["metric"]: m for m in json.loads((tmp_path / "out" / "results.json").read_text())}
    rate = results["coherence"]["score"]["pass_rate"]
    assert f"pass rate {rate:.4f}" in text and "(score &ge; 4)" in text
    # the worst coherence item (score 1) reads as its score and the judge's words
    worst = re.search(r"<summary><code>g0</code> ([^<]*)</summary>", text)
    assert worst and worst.group(1).startswith("score 1") and "{" not in worst.group(1), text[:3000]
    # where the time went: each metric's worker seconds split into compute and waiting (issue 74)
    assert "<h2>Where the time went (worker seconds: compute, then waiting)</h2>" in text
    for name, m in results.items():
        assert 0 <= m["compute_time"] <= m["elapsed_time"], m
        if m["elapsed_time"] >= 0.05:  # (the chart leaves out a metric that took no time)
            said = (f"{m['elapsed_time']:,.1f} s: compute {m['compute_time']:,.1f}, "
                    f"waiting {m['elapsed_time'] - m['compute_time']:,.1f}</text>")
            assert said in text, (name, said)
    assert results["exact_match"]["compute_time"] == results["exact_match"]["elapsed_time"]  # calls nothing
    em = text.split("<h2>exact_match</h2>", 1)[1].split("</section>", 1)[0]
    assert len(re.findall(r"<rect ", em)) == 2 and "items per value" in em  # two bars: 0 and 1
    rouge = text.split("<h2>rouge</h2>", 1)[1].split("</section>", 1)[0]
    assert "<div class=grid>" in rouge and rouge.count("<svg class=chart") == 9
    if shutil.which("chromium") or shutil.which("chromium-browser"):  # and drawn by a real browser (CI has one)
        dom, log = render(tmp_path / "out" / "report.html", tmp_path)
        assert_drawn(dom, log, min_charts=1 + 1 + 1 + 9)  # slowest, coherence's scores, exact_match, rouge's nine
