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
