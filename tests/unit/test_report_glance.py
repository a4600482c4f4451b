"""The report's header says what the night did (issue 74, item 3): what each sink took of the
scores and why not, how the judges' learned limits moved; and a panel's members side by side."""

from __future__ import annotations

from evalq.results.report import ReportBuilder
from evalq.results.report_glance import glance, learned, panel_table

PANEL = {"metric": "coherence", "parameters": {"judge": "a", "panel": ["a", "b", "c"]}, "n": 30, "n_errors": 0,
         "score": {"mean": 3.24, "panel": {"members": {"a": {"mean": 2.97, "n": 30}, "b": {"mean": 3.76, "n": 30},
                                                       "c": {"mean": 3.0, "n": 29, "failed": 1}}}},
         "judge": {"calls": 89, "limits": {"lab": [{"t": 1.0, "tpm": 2000, "reason": "floor"},
                                                   {"t": 2.0, "tpm": 8000, "reason": "headers"},
                                                   {"t": 3.0, "tpm": 6000, "reason": "429"}],
                                           "gpu": [{"t": 1.0, "concurrency": 8, "reason": "in force"}]}}}
RUN = {"job_id": "j1", "status": "done", "source": "nightly.json",
       "exports": {"phx": {"kind": "phoenix", "endpoint": "http://phoenix:6006", "sent": 116, "unsent": 4,
                           "answer": "404 Spans with IDs 4a1f do not exist"},
                   "ml": {"kind": "mlflow", "endpoint": "http://mlflow:5000", "sent": 120, "unsent": 0}}}


def test_the_header_says_what_each_sink_took_and_how_the_limits_moved():
    rows = dict(glance([PANEL], RUN))
    assert rows["exports"] == ("ml (mlflow): all 120 sent; phx (phoenix): 116 sent, 4 NOT sent (404 Spans with IDs "
                               "4a1f do not exist; evalq resend JOB sends them again)")
    assert rows["learned limits"] == "gpu: concurrency 8 (held); lab: tpm 2,000 -> 6,000 (2 changes)"
    assert learned([{"judge": {"calls": 1}}]) == {} and glance([], {"job_id": "j"}) == []


def test_the_page_shows_the_header_lines_and_the_panels_members():
    page = ReportBuilder([PANEL], RUN).html()
    assert "<th>exports</th><td>ml (mlflow): all 120 sent; phx (phoenix): 116 sent, 4 NOT sent" in page
    assert "<th>learned limits</th>" in page
    table = panel_table(PANEL["score"])
    assert table in page and "<td>b</td><td>3.76</td><td>30</td><td>0</td>" in table
    assert "<td>c</td><td>3</td><td>29</td><td>1</td>" in table
    assert panel_table({"mean": 3.0}) == "" and panel_table(4) == ""


def _regressed(name: str, field: str, value: float, baseline: float) -> dict:
    return {"field": field, "value": value, "baseline": baseline, "delta": value - baseline, "p_value": 0.001,
            "paired": True, "n": 40, "baseline_runs": 7}


def test_the_header_says_the_regressions_biggest_first_with_the_command_that_lists_them():
    from evalq.results.report_glance import regressions_line

    summary = [{"metric": "bleu", "parameters": {}, "n": 40, "score": 0.3,
                "regressions": [_regressed("bleu", "mean", 0.30, 0.32)]},
               {"metric": "rouge", "name": "r", "parameters": {}, "n": 40, "score": {"rouge1": 0.2, "rougeL": 0.1},
                "regressions": [_regressed("r", "rouge1", 0.2, 0.4), _regressed("r", "rougeL", 0.1, 0.15)]},
               {"metric": "exact_match", "parameters": {}, "n": 40, "score": 0.5,
                "regressions": [_regressed("exact_match", "mean", 0.5, 0.6)]}]
    line = regressions_line(summary, {"suite": "night ly", "found": 4, "baseline_runs": 7})
    assert line == ("4 against the suite's baseline (7 earlier runs of night ly): r.rouge1 0.2 vs 0.4 (-0.2); "
                    "exact_match 0.5 vs 0.6 (-0.1); r.rougeL 0.1 vs 0.15 (-0.05); and 1 more; "
                    "evalq history 'night ly' lists them")
    assert regressions_line([], {"suite": "s", "found": 0, "baseline_runs": 1}) == \
        "none against the suite's baseline (1 earlier run of s)"
    assert regressions_line([], {"suite": "s", "found": 0, "baseline_runs": 0}).startswith("none: no earlier run")
    page = ReportBuilder(summary, {"job_id": "j", "regressions": {"suite": "s", "found": 4, "baseline_runs": 7}}).html()
    assert "<th>regressions</th><td>4 against the suite" in page
    assert "<b class=fail>2 regressed</b>" in page  # the overview marks the entry
    assert "<p class=fail>REGRESSION r.rouge1 0.2000 vs baseline 0.4000 (-0.2000, p=0.001, paired, n=40)</p>" in page
    assert "<th>regressions</th>" not in ReportBuilder(summary, {"job_id": "j"}).html()  # history off: no line


def test_a_pairwise_entry_shows_its_outcomes_as_a_bar_its_biases_beside_their_references_and_items_in_words():
    from evalq.results.report_pairwise import in_words, outcome_bar
    from evalq.workers.pairwise.compare import outcome

    score = {"score": 0.55, "win_rate": 0.45, "tie_rate": 0.2, "loss_rate": 0.35, "wins": 9, "ties": 4, "losses": 7,
             "first_position_win_rate": 0.62, "flip_rate": 0.1, "longer_win_rate": 0.68}
    head = ReportBuilder([], {})._headline({"metric": "pairwise", "score": score})
    assert "first-position wins 0.6200 (0.5: no seat preference)" in head
    assert "flips under swap 0.1000 (0: a judge that never flips)" in head
    assert "longer wins 0.6800 (0.5: no length preference)" in head
    bar = outcome_bar(score, "p")
    assert "9 wins (45%), 4 ties (20%), 7 losses (35%)" in bar and bar.count("<rect") == 3
    assert outcome_bar({"win_rate": 0.0}, "p") == ""
    result = outcome([{"first": "candidate", "winner": "baseline", "reason": "B cites the source"},
                      {"first": "baseline", "winner": "candidate", "reason": "A is shorter"}], "tie", 10, 20)
    assert in_words(result) == ("a tie for the candidate (the verdicts disagree): candidate shown first: the "
                                "baseline won (B cites the source); baseline shown first: the candidate won "
                                "(A is shorter)")
    assert in_words({"score": 1.0}) is None and in_words(0.5) is None
    entry = {"metric": "pairwise", "parameters": {}, "n": 1, "n_errors": 0, "score": score}
    builder = ReportBuilder([entry], {})
    builder.add({"metric": "pairwise", "parameters": {}, "instance_id": "s1", "result": result}, 0)
    page = builder.html()
    assert outcome_bar(score, "pairwise: the candidate's outcomes") in page
    assert "<code>s1</code> a tie for the candidate (the verdicts disagree)" in page
    assert "win 0, tie 1" not in page  # not the counters


def test_the_time_is_split_into_compute_and_waiting():
    from evalq.results.report_glance import time_split
    from evalq.shared.cluster.keys import timing_sums

    # a chunk that measured its CPU (its items call a judge), and one that did not (all its time is work)
    assert timing_sums({b"0": b"10.0", b"cpu:0": b"1.5", b"4": b"2.0"}) == (12.0, 3.5)
    assert timing_sums({"0": "1.0", "cpu:0": "3.0"}) == (1.0, 1.0)  # never more than its time
    summary = [{"metric": "relevance", "parameters": {}, "elapsed_time": 1446.0, "compute_time": 12.5},
               {"metric": "bleu", "parameters": {}, "elapsed_time": 3.0, "compute_time": 3.0},
               {"metric": "none", "parameters": {}, "elapsed_time": 0}]
    chart = time_split(summary, lambda m: m["metric"])
    assert "1,446.0 s: compute 12.5, waiting 1,433.5" in chart and "3.0 s: compute 3.0, waiting 0.0" in chart
    assert ">none<" not in chart and time_split([], str) == ""
    assert chart in ReportBuilder(summary, {}).html()
