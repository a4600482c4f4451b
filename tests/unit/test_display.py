"""What a job names, shown to people: one line without control characters on a terminal, and
escaped for a chat webhook's markup (a `<!channel>` mention, a disguised link and a forged second
line reached the operator's webhook before)."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime
from pathlib import Path

from evalq.results import alerts
from evalq.results.history import open_store
from evalq.shared.core.display import chat_text, printable
from evalq.shared.job.nightly import Regression

ROOT = Path(__file__).resolve().parents[2]
EVIL = "bleu <!channel> <https://evil.example/x|the dashboard> &\nsearch: all fine\x1b[2J\u202egnp.exe"


def test_printable_keeps_a_name_on_one_plain_line():
    assert printable("rouge-L (strict)") == "rouge-L (strict)"
    shown = printable(EVIL)
    assert "\n" not in shown and "\x1b" not in shown and "\u202e" not in shown
    assert shown.startswith("bleu <!channel>") and "?search: all fine?[2J?gnp.exe" in shown
    assert printable("x" * 500, 20) == "x" * 19 + "…"


def test_chat_text_escapes_the_markup():
    text = chat_text(EVIL)
    assert "<" not in text and ">" not in text and "\n" not in text
    assert text.startswith("bleu &lt;!channel&gt; &lt;https://evil.example/x|the dashboard&gt; &amp;?search")


def test_the_alert_names_the_entry_escaped_on_one_line():
    found = {"slot": 0, "metric": "bleu", "name": EVIL, "field": "mean", "value": 0.1, "baseline": 0.5,
             "delta": -0.4, "p_value": 0.001, "paired": True, "n": 40, "baseline_runs": 3}
    body = alerts.payload("rag-nightly", "j1", [found])
    assert body["text"].count("\n") == 0 and "<!channel>" not in body["text"] and "<https://" not in body["text"]
    assert body["text"].startswith("rag-nightly: bleu &lt;!channel&gt;")
    assert body["regressions"][0]["name"] == EVIL  # the data stays as it was; only the text is markup


def test_evalq_history_prints_no_control_character(tmp_path):
    url = f"sqlite:///{tmp_path / 'history.sqlite'}"
    store = open_store(url)
    run = {"job_id": "j1", "suite": "nightly", "request_id": None, "tenant": None, "status": "done",
           "started_at": datetime(2026, 11, 1), "finished_at": datetime(2026, 11, 1, 1), "source": "n.json",
           "dataset": None, "model": None, "out": None, "n_instances": 2, "calls": 0, "tokens": 0, "cost": None,
           "error": None}
    entry = {"slot": 0, "metric": "bleu", "name": EVIL, "parameters": "{}", "n": 2, "n_errors": 0, "n_skipped": 0,
             "calls": None, "tokens": None, "cost": None}
    series = {"slot": 0, "metric": "bleu", "name": EVIL, "field": "mean", "value": 0.5, "ci95": None, "n": 2,
              "sd": 0.1, "worse": "lower", "items": None}
    store.record(run, [entry], [series], Regression().resolved())
    done = subprocess.run([sys.executable, "-m", "evalq.cli", "history", "nightly"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "EVALQ_HISTORY_URL": url})
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and "\u202e" not in done.stdout
    assert not [line for line in done.stdout.splitlines() if line.startswith("search: all fine")]  # no forged line
    assert "bleu <!channel>" in done.stdout
