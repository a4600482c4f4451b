"""The page of `evalq history SUITE --html`, from documents built by hand: read back with
the standard library's HTML parser (what a browser would see), never by trusting the
module's own helpers."""

from __future__ import annotations

import re
from html.parser import HTMLParser

from evalq.results.history_page import MAX_SERIES, render

SCRIPT = "<script>alert(1)</script>"


def entry(name, field, value, ci=None, metric=None, parameters=None, worse="lower"):
    return {"metric": metric or name, "name": name, "field": field, "parameters": parameters or {},
            "value": value, "ci95": ci, "n": 100, "n_errors": 0, "worse": worse}


def run(day, metrics, regressions=(), status="done", cost=None, job_id=None):
    return {"job_id": job_id or f"job-{day}", "request_id": None, "tenant": None, "status": status,
            "started_at": f"2026-11-{day:02d}T01:00:00+00:00", "finished_at": f"2026-11-{day:02d}T01:42:10+00:00",
            "dataset": None, "model": "m", "out": None, "cost": cost, "tokens": 1000 * day, "calls": 10,
            "metrics": list(metrics), "regressions": list(regressions)}


def regression(name, field, value, baseline, p=0.001):
    return {"metric": name, "name": name, "field": field, "value": value, "baseline": baseline,
            "delta": round(value - baseline, 6), "p_value": p, "paired": True, "n": 100}


class Page(HTMLParser):
    """Every element (tag, attributes, index of the series section it is in or None), the
    text of each section, and all the text."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict, int | None]] = []
        self.sections: list[dict] = []
        self.text: list[str] = []
        self.depth = 0  # of <section> elements, while inside a series section
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section" and attrs.get("class") == "series":
            self.sections.append({"title": None, "text": []})
            self.depth = 1
        elif tag == "section" and self.depth:
            self.depth += 1
        self.elements.append((tag, attrs, len(self.sections) - 1 if self.depth else None))
        self.in_h3 = tag == "h3"

    def handle_endtag(self, tag):
        if tag == "section" and self.depth:
            self.depth -= 1
        self.in_h3 = False

    def handle_data(self, data):
        self.text.append(data)
        if self.depth:
            section = self.sections[-1]
            section["text"].append(data)
            if getattr(self, "in_h3", False):
                section["title"] = (section["title"] or "") + data

    def section(self, title: str) -> int:
        found = [i for i, s in enumerate(self.sections) if s["title"] == title]
        assert len(found) == 1, (title, [s["title"] for s in self.sections])
        return found[0]

    def within(self, i: int, tag: str, cls: str | None = None) -> list[dict]:
        return [a for t, a, s in self.elements if s == i and t == tag and (cls is None or a.get("class") == cls)]

    def all(self, tag: str, cls: str | None = None) -> list[dict]:
        return [a for t, a, _ in self.elements if t == tag and (cls is None or a.get("class") == cls)]


def three_runs(**kw):
    """bleu and rouge (three fields) over three nights; the third regresses on rouge2 only."""
    nights = []
    for day, (b, r2) in zip((20, 21, 22), ((0.40, 0.30), (0.42, 0.31), (0.41, 0.22))):
        metrics = [entry("bleu", "mean", b, [b - 0.02, b + 0.02])]
        metrics += [entry("rouge", f, v, [v - 0.01, v + 0.01]) for f, v in (("rouge1", 0.5), ("rouge2", r2),
                                                                          ("rougeL", 0.45))]
        regs = [regression("rouge", "rouge2", 0.22, 0.305)] if day == 22 else []
        nights.append(run(day, metrics, regs, cost=kw.get("costs", (1.0, 2.0, 4.0))[day - 20]))
    return {"suite": kw.get("suite", "nightly-rag"), "runs": nights}


def points(d: str) -> list[list[tuple[float, float]]]:
    """The sub-paths of an SVG path of M/L commands."""
    return [[tuple(map(float, p.split(","))) for p in re.findall(r"-?[\d.]+,-?[\d.]+", sub)]
            for sub in d.split("M")[1:]]


def test_job_data_is_escaped_and_the_page_fetches_nothing():
    doc = three_runs(suite=f"nightly {SCRIPT}")
    doc["runs"][0]["metrics"].append(entry(f"judge {SCRIPT}", f"f<{SCRIPT}", 0.5, metric=f"m{SCRIPT}",
                                           parameters={"prompt": f"a {SCRIPT} b", "<k>": "<v>"}))
    doc["runs"][0]["job_id"] = f"j{SCRIPT}"
    doc["runs"][0]["model"] = f"model{SCRIPT}"
    doc["runs"][1]["status"] = f"done{SCRIPT}"
    doc["runs"][2]["regressions"].append(regression(f"other {SCRIPT}", "mean", 0.1, 0.2))
    text = render(doc)
    assert "<script" not in text.lower() and "<link" not in text.lower()
    assert not re.search(r"""(src|href)\s*=|url\(|@import""", text)
    page = Page(text)
    assert not page.all("script") and not page.all("k") and not page.all("img")
    words = "".join(page.text)
    # each untrusted string reaches the reader as text, intact
    for shown in (f"evalq history: nightly {SCRIPT}", f"judge {SCRIPT} · f<{SCRIPT}", f"m{SCRIPT}",
                  f"j{SCRIPT}", f"model{SCRIPT}", f"done{SCRIPT}", f"other {SCRIPT}", '"<k>": "<v>"'):
        assert shown in words, shown
    title = [a for a in page.all("svg") if a.get("aria-label", "").startswith("judge")]
    assert title and title[0]["aria-label"] == f"judge {SCRIPT} · f<{SCRIPT}"


def test_header_and_table_of_runs():
    doc = three_runs()
    doc["runs"][1]["status"] = "failed"
    page = Page(render(doc))
    words = " ".join(page.text)
    assert "evalq history: nightly-rag" in words and "3 runs" in words
    assert "2026-11-20" in words and "2026-11-22 01:42" in words and "total cost 7.00 over 3 runs" in words
    text = render(doc)
    table = text[text.index("<table>"):text.index("</table>")]
    assert table.count("<tr") == 1 + 3  # header + one per run
    body = re.findall(r"<tr><td class=num>(\d+)</td><td>([^<]*)</td><td><code>([^<]*)</code></td>"
                      r"<td class=status-(\w+)>[^<]*</td>.*?<td class='num[^']*'>(\d+)</td></tr>", table)
    assert [(n, job, status, regs) for n, _, job, status, regs in body] == [
        ("3", "job-22", "done", "1"), ("2", "job-21", "failed", "0"), ("1", "job-20", "done", "0")]
    assert "4.00" in table and "22,000" in table


def test_one_chart_per_name_and_field_and_a_cost_chart():
    page = Page(render(three_runs()))
    titles = [s["title"] for s in page.sections]
    assert titles == ["bleu · mean", "rouge · rouge1", "rouge · rouge2", "rouge · rougeL"]
    charts = page.all("svg", "chart")
    assert len(charts) == 4 + 1
    for i in range(4):  # three dots (no regression) or two dots and the marker on each line
        assert len(page.within(i, "circle")) == 3


def test_a_regression_is_marked_on_its_run_and_series_only():
    text = render(three_runs())
    page = Page(text)
    marks = [(s, a) for t, a, s in page.elements if t == "circle" and a.get("class") == "reg"]
    assert len(marks) == 1
    where, mark = marks[0]
    assert where == page.section("rouge · rouge2") and mark["data-run"] == "3"
    dots = page.within(where, "circle", "pt")
    assert sorted(d["data-run"] for d in dots) == ["1", "2"]
    # the marker sits on the line's last point, right of and below the others (0.22 < 0.30, 0.31)
    line = points(page.within(where, "path", "line")[0]["d"])
    assert len(line) == 1 and len(line[0]) == 3
    assert (float(mark["cx"]), float(mark["cy"])) == line[0][2]
    assert all(float(mark["cy"]) > float(d["cy"]) and float(mark["cx"]) > float(d["cx"]) for d in dots)
    listed = "".join(page.sections[where]["text"])
    assert "run 3" in listed and "0.22 vs baseline 0.305" in listed and "delta -0.085" in listed
    assert "p 0.001" in listed and "paired" in listed
    for other in ("bleu · mean", "rouge · rouge1", "rouge · rougeL"):
        assert "baseline" not in "".join(page.sections[page.section(other)]["text"])


def test_a_run_without_a_value_leaves_a_gap():
    doc = three_runs()
    doc["runs"].append(run(23, [entry("bleu", "mean", 0.43, [0.41, 0.45])]))
    doc["runs"].append(run(24, [entry("bleu", "mean", 0.44), *doc["runs"][0]["metrics"][1:]]))
    doc["runs"][1]["metrics"][0]["value"] = None  # bleu: none in run 2
    doc["runs"][1]["metrics"][0]["ci95"] = None
    page = Page(render(doc))
    bleu = page.section("bleu · mean")
    parts = points(page.within(bleu, "path", "line")[0]["d"])
    assert [len(p) for p in parts] == [1, 3]  # run 1 | runs 3, 4, 5
    assert sorted(d["data-run"] for d in page.within(bleu, "circle", "pt")) == ["1", "3", "4", "5"]
    rouge = page.section("rouge · rouge1")  # absent from run 4
    assert [len(p) for p in points(page.within(rouge, "path", "line")[0]["d"])] == [3, 1]
    assert "4" not in [d["data-run"] for d in page.within(rouge, "circle")]
    # the interval: a band over runs 3-4 (run 5 has none) and a bar for the lone run 1
    assert len(page.within(bleu, "polygon", "band")) == 1 and len(page.within(bleu, "rect", "band")) == 1


def test_the_band_holds_the_line():
    page = Page(render(three_runs()))
    i = page.section("bleu · mean")
    band = [tuple(map(float, p.split(","))) for p in page.within(i, "polygon", "band")[0]["points"].split()]
    upper, lower = band[:3], band[3:][::-1]
    line = points(page.within(i, "path", "line")[0]["d"])[0]
    for (x, y), (ux, uy), (lx, ly) in zip(line, upper, lower):
        assert x == ux == lx and uy < y < ly  # SVG y grows downwards
    # a higher value is drawn higher: 0.42 (run 2) above 0.41 (run 3) above 0.40 (run 1)
    assert line[1][1] < line[2][1] < line[0][1]


def test_no_cost_chart_when_no_cost_is_known():
    text = render(three_runs(costs=(None, None, None)))
    page = Page(text)
    assert "Cost per run" not in text and not page.all("rect", "costbar done")
    assert len(page.all("svg", "chart")) == 4


def test_cost_bars_stand_in_proportion():
    page = Page(render(three_runs(costs=(1.0, None, 4.0))))
    bars = {a["data-run"]: float(a["height"]) for a in page.all("rect") if a.get("class", "").startswith("costbar")}
    assert set(bars) == {"1", "3"}
    assert abs(bars["3"] / bars["1"] - 4.0) < 0.01


def test_failed_and_cancelled_runs_are_marked():
    doc = three_runs()
    doc["runs"][0]["status"], doc["runs"][1]["status"] = "cancelled", "failed"
    page = Page(render(doc))
    for i in range(4):
        assert sorted(a["data-run"] for a in page.within(i, "rect", "badrun")) == ["1", "2"]
    assert {a["class"] for a in page.all("rect") if a.get("class", "").startswith("costbar")} == \
        {"costbar cancelled", "costbar failed", "costbar done"}
    assert len(page.all("td", "status-failed")) == 1 and len(page.all("td", "status-cancelled")) == 1


def test_at_most_200_charts_and_the_rest_counted():
    extra = MAX_SERIES + 5
    nights = [run(d, [entry(f"e{k:03d}", "mean", 0.5 + d / 100) for k in range(extra)]) for d in (1, 2)]
    nights[1]["regressions"] = [regression(f"e{extra - 1:03d}", "mean", 0.3, 0.5)]  # the very last series
    text = render({"suite": "wide", "runs": nights})
    page = Page(text)
    assert len(page.sections) == MAX_SERIES
    assert f"e{extra - 1:03d} · mean" in [s["title"] for s in page.sections]  # a regressed one is kept
    assert "5 more series not charted" in text and "e199 · mean" in text
    assert len(page.all("circle", "reg")) == 1


def test_a_regression_of_no_series_is_still_listed():
    doc = three_runs()
    doc["runs"][2]["regressions"].append(regression("gone", "mean", 0.1, 0.3))
    text = render(doc)
    assert "Regressions of entries without values" in text and "gone · mean: run 3" in text


def test_what_is_not_a_number_is_never_drawn():
    doc = three_runs()
    doc["runs"][1]["metrics"][0].update(value="0.9", ci95=["<a>", 1])
    doc["runs"][1]["cost"] = "12"
    doc["runs"][0]["metrics"][0].update(value=float("nan"))
    page = Page(render(doc))
    bleu = page.section("bleu · mean")
    assert [d["data-run"] for d in page.within(bleu, "circle", "pt")] == ["3"]
    assert len(page.all("rect", "costbar done")) == 2


def test_no_runs_and_one_run():
    assert "no run recorded" in render({"suite": "empty", "runs": []})
    page = Page(render({"suite": "s", "runs": [run(1, [entry("bleu", "mean", 0.5, [0.4, 0.6])])]}))
    assert len(page.all("svg", "chart")) == 1 and len(page.all("circle", "pt")) == 1


def test_two_runs_of_one_day_are_told_apart_on_the_axis():
    """Issue 74, item 6: two runs of 11-29 were both labelled '11-29'."""
    first, second = run(29, [entry("bleu", "score", 0.5)]), run(29, [entry("bleu", "score", 0.6)], job_id="again")
    second["finished_at"] = "2026-11-29T18:05:00+00:00"
    ticks = re.findall(r"class=tick>([^<]*)</text>",
                       render({"suite": "s", "runs": [run(28, [entry("bleu", "score", 0.4)]), first, second]}))
    assert {"11-28 01:42", "11-29 01:42", "11-29 18:05"} <= set(ticks), ticks
    days = re.findall(r"class=tick>([^<]*)</text>",
                      render({"suite": "s", "runs": [run(d, [entry("bleu", "score", 0.5)]) for d in (27, 28)]}))
    assert {"11-27", "11-28"} <= set(days) and not any(":" in t for t in days), days  # one a day: the day


class Cells(HTMLParser):
    """The rows of the summary table, as (row class, [cell texts])."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.rows: list[tuple[str | None, list[str]]] = []
        self.inside = False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table":
            self.inside = attrs.get("class") == "summary"
        elif tag == "tr" and self.inside:
            self.rows.append((attrs.get("class"), []))
        elif tag in ("td", "th") and self.inside:
            self.rows[-1][1].append("")

    def handle_endtag(self, tag):
        if tag == "table":
            self.inside = False

    def handle_data(self, data):
        if self.inside and self.rows and self.rows[-1][1]:
            self.rows[-1][1][-1] += data


def test_a_summary_table_says_each_series_last_value_its_change_and_the_regression():
    """Issue 74: a night's change read at a glance, without going through a chart per field."""
    rows = Cells(render(three_runs())).rows
    header, body = rows[0], rows[1:]
    assert header[1][:4] == ["series", "last", "run before", "change"]
    by_series = {cells[0]: (cls, cells[1:]) for cls, cells in body}
    assert list(by_series) == ["bleu · mean", "rouge · rouge1", "rouge · rouge2", "rouge · rougeL"]
    assert by_series["bleu · mean"] == (None, ["0.41", "0.42", "-0.01", "", "", ""])
    assert by_series["rouge · rouge1"] == (None, ["0.5", "0.5", "+0", "", "", ""])
    assert by_series["rouge · rouge2"] == ("status-failed", ["0.22", "0.31", "-0.09", "0.305", "-0.085", "0.001"])
    one = Cells(render({"suite": "s", "runs": [run(1, [entry("bleu", "mean", 0.4)])]})).rows
    assert one[1][1] == ["bleu · mean", "0.4", "n/a", "", "", "", ""]
