"""The page of `evalq history SUITE --html`, loaded in a real headless browser (Debian's
chromium, skipped where it is missing): it logs no console error, asks the network for
nothing, and its DOM holds one chart per series and one regression marker; a screenshot
is written beside it (look at it)."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from evalq.results.history_page import render
from tests.integration.test_report import browser, render as load
from tests.unit.test_history_page import three_runs

pytestmark = pytest.mark.integration


def page_requests(page, tmp_path) -> list[str]:
    """The URLs the page itself asked the network for while loading (chromium's net log; the
    browser's own background requests, which have no page as their site, are left out)."""
    log = tmp_path / f"{page.name}.netlog.json"
    subprocess.run([browser(), "--headless", "--no-sandbox", "--disable-gpu",
                    f"--user-data-dir={tmp_path / 'netprofile'}", f"--log-net-log={log}", "--dump-dom",
                    f"file://{page}"], capture_output=True, timeout=120)
    events = json.loads(log.read_text())
    kinds = {code: name for name, code in events["constants"]["logEventTypes"].items()}
    return [e["params"]["url"] for e in events["events"]
            if kinds.get(e["type"]) == "URL_REQUEST_START_JOB"
            and str(e.get("params", {}).get("network_isolation_key", "")).startswith("file://")]


def test_the_history_page_is_drawn_and_fetches_nothing(tmp_path):
    browser()
    doc = three_runs(suite="nightly-rag <script>alert(1)</script>")
    doc["runs"][1]["status"] = "failed"
    page = tmp_path / "history.html"
    page.write_text(render(doc))
    dom, log = load(page, tmp_path)
    assert "CONSOLE" not in log and "Uncaught" not in log, log[-2000:]
    assert "<script" not in dom
    assert "nightly-rag &lt;script&gt;alert(1)&lt;/script&gt;" in dom
    charts = re.findall(r'<svg class="chart".*?</svg>', dom, re.S)
    assert len(charts) == 4 + 1  # bleu, rouge1, rouge2, rougeL; the cost per run
    assert len(re.findall(r'<circle[^>]*class="reg"', dom)) == 1
    assert len(re.findall(r'<rect[^>]*class="badrun"', dom)) == 4  # run 2 in each series chart
    assert page_requests(page, tmp_path) == []
    try:
        from PIL import Image
    except ImportError:  # the pixels are checked where Pillow is installed
        return
    # the regression marker is painted: the same page without the regression has fewer red pixels
    del doc["runs"][2]["regressions"][:]
    calm = tmp_path / "calm.html"
    calm.write_text(render(doc))
    load(calm, tmp_path)
    assert red_pixels(Image.open(f"{page}.png")) > red_pixels(Image.open(f"{calm}.png")) + 30


def red_pixels(image) -> int:
    """Pixels of the regression marker's red (#d93025)."""
    return sum(n for n, (r, g, b) in image.convert("RGB").getcolors(1 << 24)
               if abs(r - 0xD9) < 12 and abs(g - 0x30) < 12 and abs(b - 0x25) < 12)


def test_a_page_that_fetches_is_caught(tmp_path):
    """The net-log check sees a request when there is one."""
    browser()
    page = tmp_path / "fetching.html"
    page.write_text('<!doctype html><html><body><img src="http://127.0.0.1:9/x.png"></body></html>')
    assert page_requests(page, tmp_path) == ["http://127.0.0.1:9/x.png"]
