"""report.html: one self-contained page people look at (no script, no network; charts are inline
SVG), written beside results.json by every run and by ``evalq report OUT``; and the HTML of ``evalq
compare``. Its header says what the night did at a glance (``evalq.results.report_glance``).

It embeds aggregates and the worst items, never the log: the log is streamed once through
``ReportBuilder`` (histograms from a seeded reservoir sample of at most 20,000 values per field, the
worst N items kept in a heap), so a million-instance run gives a page of the same size as a small one.
"""

from __future__ import annotations

import heapq
import html
import json
import random
from typing import Any, Callable, Iterable

from evalq.shared.core.jsonio import pack_floats, unpack_floats
from evalq.shared.scores.results import read
from evalq.shared.data.loglines import entry_index, entry_slot
from evalq.results.markup import esc
from evalq.results.report_agents import CSS as AGENT_CSS, trajectory_html, turns_html
from evalq.results.report_glance import glance, panel_table, regressed, time_split
from evalq.results.report_pairwise import biases, in_words, is_pairwise, outcome_bar

RESERVOIR = 20_000
WORST = 10
BINS = 20


def _num(value: Any, digits: int = 4) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _ci(ci: Any) -> str:
    if not ci or not isinstance(ci, list) or None in ci:
        return ""
    return f" <span class=ci>95% CI [{ci[0]:.4f}, {ci[1]:.4f}]</span>"


# --- charts (inline SVG) -----------------------------------------------------------

def bar_chart(labels: list[str], values: list[float], title: str, width: int = 520, height: int = 180,
              unit: str = "") -> str:
    if not values:
        return ""
    top = max(values) or 1
    n = len(values)
    slot = (width - 40) / n
    bars = []
    for i, (label, v) in enumerate(zip(labels, values)):
        h = (height - 50) * v / top
        x = 30 + i * slot
        bars.append(f'<rect x="{x + slot * 0.1:.1f}" y="{height - 30 - h:.1f}" width="{slot * 0.8:.1f}" '
                    f'height="{max(h, 0.5):.1f}" class=bar><title>{esc(label)}: {_num(v)}</title></rect>'
                    f'<text x="{x + slot / 2:.1f}" y="{height - 14}" text-anchor=middle class=tick>{esc(label)}</text>'
                    f'<text x="{x + slot / 2:.1f}" y="{height - 34 - h:.1f}" text-anchor=middle class=val>{_num(v, 2)}{unit}</text>')
    return (f'<svg class=chart role=img aria-label="{esc(title)}" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}"><line x1=28 y1="{height - 30}" x2="{width - 8}" y2="{height - 30}" '
            f'class=axis></line>{"".join(bars)}</svg>')


def histogram(values: list[float], title: str) -> str:
    if not values:
        return ""
    if all(v in (0.0, 1.0) for v in values):  # a 0/1 metric: how many of each, not twenty bins
        ones = sum(1 for v in values if v == 1.0)
        return bar_chart(["0", "1"], [len(values) - ones, ones], f"{title}: items per value", width=240)
    lo, hi = min(values), max(values)
    if hi <= lo:
        hi = lo + 1e-9
    width = (hi - lo) / BINS
    counts = [0] * BINS
    for v in values:
        counts[min(int((v - lo) / width), BINS - 1)] += 1
    labels = [f"{lo + i * width:.2g}" if i % 4 == 0 else "" for i in range(BINS)]
    return bar_chart(labels, counts, title)


# --- the run report -------------------------------------------------------------------

def record_view(kind: str, params: dict | None, record: dict) -> tuple[dict[str, float], float | None]:
    """What the report takes from one item record: the numbers it samples for the
    histograms, and how bad the item is (``evalq.shared.scores.results``, by the entry's kind)."""
    reading = read(kind, params, record)
    return reading.sample, reading.badness


def chunk_view(items: list[tuple[int, dict]], readings: list, span: int, seed: int, worst: int = WORST) -> dict:
    """What the report needs of one chunk of a metric entry, made by the worker that
    scored it (so the final callback parses no item record): the chunk's ``worst``
    items and a sample of its numbers, whose size is the chunk's share of
    ``RESERVOIR`` (the merged chunks give about RESERVOIR values per field), each field's packed
    as float64s in ``sample_f64`` (``jsonio.pack_floats``; ``add_views`` reads an older chunk's
    plain lists in ``sample`` too).
    ``readings``: each item's ``evalq.shared.scores.results.read``, in the items' order."""
    quota = max(1, -(-RESERVOIR * len(items) // max(span, 1)))
    heap: list = []
    values: dict[str, list[float]] = {}
    for (position, record), reading in zip(items, readings):
        if record.get("variant") is not None:
            continue
        fields, badness = reading.sample, reading.badness
        for name, v in fields.items():
            values.setdefault(name, []).append(float(v))
        if badness is not None:
            _push(heap, (badness, -position, record.get("instance_id"), position, record.get("result"),
                         record.get("error")), worst)
    rng = random.Random(seed)
    # "sample" stays, empty: a final callback of an older evalq (a rolling upgrade) then draws
    # no histogram from this chunk rather than reading the packed columns as numbers
    return {"worst": heap, "seen": {name: len(vs) for name, vs in values.items()}, "sample": {},
            "sample_f64": {name: pack_floats(vs if len(vs) <= quota else rng.sample(vs, quota))
                           for name, vs in values.items()}}


def _push(heap: list, item: tuple, size: int) -> None:
    if len(heap) < size:
        heapq.heappush(heap, item)
    elif item > heap[0]:
        heapq.heapreplace(heap, item)


def _kind(metric_id: str | None) -> str:
    """How the registry aggregates a metric (a metric no longer known: ``mean``)."""
    import evalq.shared.job.catalogue  # noqa: F401  (registers the built-in metrics)
    from evalq.shared.metrics.registry import REGISTRY

    return REGISTRY.get(metric_id).aggregation if metric_id in REGISTRY else "mean"


class ReportBuilder:
    """Fed one log line at a time (``add``), or the chunk views the workers made
    (``add_views``); ``html()`` renders the page."""

    def __init__(self, summary: list[dict], run: dict, worst: int = WORST):
        self.summary, self.run, self.worst = summary, run, worst
        self.index = entry_index(summary)
        self.samples: list[dict[str, list[float]]] = [{} for _ in summary]
        self.seen: list[dict[str, int]] = [{} for _ in summary]
        self.heaps: list[list] = [[] for _ in summary]
        self.rng = random.Random(0)
        self._counter = 0

    def add(self, line: dict, position: int | None = None) -> None:
        if line.get("metric") == "generate" or line.get("variant") is not None or line.get("stage") == "variants":
            return
        i = entry_slot(line, self.summary, self.index)
        if i is None:
            return
        self._counter += 1
        head = self.summary[i]
        fields, badness = record_view(_kind(head.get("metric")), head.get("parameters"), line)
        for name, v in fields.items():
            seen = self.seen[i][name] = self.seen[i].get(name, 0) + 1
            bucket = self.samples[i].setdefault(name, [])
            if len(bucket) < RESERVOIR:
                bucket.append(float(v))
            else:
                j = self.rng.randrange(seen)
                if j < RESERVOIR:
                    bucket[j] = float(v)
        if badness is not None:
            # on a tie the earlier item ranks worse (lines come in position order), as in chunk_view
            _push(self.heaps[i], (badness, -(position if position is not None else self._counter),
                                  line.get("instance_id"), position, line.get("result"), line.get("error")),
                  self.worst)

    def add_views(self, i: int, views: Iterable[dict | None], expect: int | None = None) -> bool:
        """Summary entry ``i`` from its chunks' views (see ``chunk_view``), in any order. With
        ``expect`` (the entry's chunks): False, and nothing of the entry kept, when a chunk left no view
        (None) or fewer came: the entry is then reported from its log lines (``add``)."""
        n = 0
        for view in views:
            if view is None:
                break
            n += 1
            for item in view["worst"]:
                _push(self.heaps[i], tuple(item), self.worst)
            for name, count in view["seen"].items():
                self.seen[i][name] = self.seen[i].get(name, 0) + count
            packed = view.get("sample_f64")  # a chunk of an older evalq: "sample", plain lists
            sample = {n: unpack_floats(t) for n, t in packed.items()} if packed is not None else view["sample"]
            for name, values in sample.items():
                self.samples[i].setdefault(name, []).extend(values)
        if expect is not None and n != expect:
            self.heaps[i], self.seen[i], self.samples[i] = [], {}, {}
            return False
        for name, values in self.samples[i].items():
            if len(values) > RESERVOIR:
                self.samples[i][name] = self.rng.sample(values, RESERVOIR)
        return True

    def worst_positions(self) -> list[int]:
        return sorted({item[3] for heap in self.heaps for item in heap if item[3] is not None})

    def html(self, instances: dict[int, dict] | None = None) -> str:
        instances = instances or {}
        run = self.run
        meta = [("job", run.get("source")), ("job id", run.get("job_id")), ("status", run.get("status")),
                ("instances", run.get("n_instances")), ("evalq", run.get("evalq_version")),
                ("started", run.get("started_at")), ("wall time", f"{run['wall_time']} s" if "wall_time" in run else None),
                ("cost", run.get("cost"))]
        if run.get("dataset"):
            meta.append(("dataset", run["dataset"].get("uri")))
        if run.get("generation"):
            meta.append(("model", run["generation"].get("parameters", {}).get("model")))
        meta += glance(self.summary, run)  # what the night did: exports, learned limits
        parts = [_HEAD, "<h1>evalq report</h1><table class=meta>",
                 "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in meta if v is not None),
                 "</table>", self._overview(), self._spend(), time_split(self.summary, self._label)]
        for i, m in enumerate(self.summary):
            parts.append(self._section(i, m, instances))
        parts.append("</body></html>")
        return "".join(parts)

    def _label(self, m: dict) -> str:
        return m.get("name") or m["metric"]

    def _headline(self, m: dict) -> str:
        score = m.get("score")
        if isinstance(score, dict) and "defect_rate" in score:
            return f"defect rate {_num(score['defect_rate'])}{_ci(score.get('ci95'))}"
        if isinstance(score, dict) and "any" in score:
            return f"any-harm defect rate {_num(score['any']['defect_rate'])}{_ci(score['any'].get('ci95'))}"
        if isinstance(score, dict) and "mean" in score:
            ci = score.get("ci95") if isinstance(score.get("ci95"), list) else m.get("ci95")
            passing = ""  # a rated metric with a threshold: the share of items at or above it
            if isinstance(score.get("pass_rate"), (int, float)):
                at = (m.get("parameters") or {}).get("threshold")
                passing = (f"; pass rate {_num(score['pass_rate'])}{_ci(score.get('pass_rate_ci95'))}"
                           + (f" (score &ge; {esc(at)})" if at is not None else ""))
            panel = score.get("panel") if isinstance(score.get("panel"), dict) else {}
            if panel:  # a panel of judges: what it is worth (evalq.shared.judging.panel)
                passing += f"; panel of {len(panel.get('members') or {})}" + "".join(
                    f", {label} {_num(panel[k])}" for k, label in (("alpha", "alpha"),
                                                                    ("effective_votes", "effective votes"))
                    if isinstance(panel.get(k), (int, float)))
            return f"mean {_num(score['mean'])}{_ci(ci)}{passing}"
        if is_pairwise(score):  # a pairwise comparison: and the judge's biases, each beside its reference
            return (f"win rate {_num(score['win_rate'])}{_ci(score.get('win_rate_ci95'))}, ties "
                    f"{_num(score['tie_rate'])}, losses {_num(score['loss_rate'])}{biases(score, _num, _ci)}")
        if isinstance(score, (int, float)):
            return f"{_num(score)}{_ci(m.get('ci95'))}"
        if isinstance(score, dict):
            cis = m.get("ci95") if isinstance(m.get("ci95"), dict) else {}
            return ", ".join(f"{k} {_num(v)}{_ci(cis.get(k))}" for k, v in score.items()
                             if isinstance(v, (int, float)))
        return "no score"

    def _overview(self) -> str:
        rows = "".join(f"<tr><td><a href='#m{i}'>{esc(self._label(m))}</a></td><td>{self._headline(m)}"
                       + (f" <b class=fail>{len(m['regressions'])} regressed</b>" if m.get("regressions") else "")
                       + "</td>"
                       f"<td>{m.get('n', 0)}</td><td>{m.get('n_errors', 0)}</td></tr>"
                       for i, m in enumerate(self.summary))
        return (f"<h2>Overview</h2><table><tr><th>metric</th><th>score</th><th>items</th><th>errors</th></tr>"
                f"{rows}</table>")

    def _spend(self) -> str:
        rows = [(self._label(m), m["judge"]) for m in self.summary if m.get("judge")]
        if (self.run.get("generation") or {}).get("judge"):  # what the model under test's calls cost
            rows.append(("generate (model under test)", self.run["generation"]["judge"]))
        if not rows:
            return ""
        cols = ("calls", "cache_hits", "reused", "prompt_tokens", "completion_tokens", "rate_limited", "failed_calls")
        if any("cost" in j for _, j in rows):  # a judge with a price: money, in the prices' currency
            cols += ("cost",)
        body = "".join(f"<tr><td>{esc(label)}</td>" + "".join(f"<td>{j.get(c, '' if c == 'cost' else 0)}</td>" for c in cols) + "</tr>"
                       + "".join(f"<tr class=sub><td>&nbsp;&nbsp;{esc(region)}</td>"
                                 + "".join(f"<td>{r.get(c, '')}</td>" for c in cols) + "</tr>"
                                 for region, r in j.get("regions", {}).items())
                       for label, j in rows)
        return (f"<h2>Judge spend (per metric, then per region)</h2><table><tr><th>metric</th>{''.join(f'<th>{c}</th>' for c in cols)}</tr>"
                f"{body}</table>")

    def _section(self, i: int, m: dict, instances: dict[int, dict]) -> str:
        score = m.get("score")
        out = [f"<section id=m{i}><h2>{esc(self._label(m))}</h2>",
               f"<p class=headline>{self._headline(m)}</p>", regressed(m),
               f"<p class=params>metric <code>{esc(m['metric'])}</code> parameters <code>{esc(m['parameters'])}</code>"
               f" &middot; {m.get('n', 0)} items, {m.get('n_errors', 0)} errors"
               + (f", {m['n_skipped']} skipped" if m.get("n_skipped") else "")
               + (f", {m['n_not_applicable']} not applicable" if m.get("n_not_applicable") else "") + "</p>"]
        if is_pairwise(score):  # the candidate's wins, ties and losses, one bar
            out.append(outcome_bar(score, f"{self._label(m)}: the candidate's outcomes"))
        elif isinstance(score, dict) and isinstance(score.get("distribution"), dict) and \
                all(isinstance(v, int) for v in score["distribution"].values()):
            per = "turns" if isinstance(score.get("turns"), dict) else "items"  # a conversation's every turn counts
            out.append(bar_chart(list(score["distribution"]), list(score["distribution"].values()),
                                 f"{self._label(m)}: {per} per score"))
        elif isinstance(score, dict) and isinstance(score.get("severity"), dict):
            out.append(bar_chart(list(score["severity"]), list(score["severity"].values()),
                                 f"{self._label(m)}: items per severity band"))
        elif isinstance(score, dict) and "any" in score:
            harms = [h for h in score if h != "any"]
            out.append(bar_chart(harms + ["any"], [score[h]["defect_rate"] for h in harms + ["any"]],
                                 f"{self._label(m)}: defect rate per harm"))
        else:  # a metric of many fields (rouge's nine): side by side, each small
            fields = list(self.samples[i].items())
            small = len(fields) > 2
            out.append("<div class=grid>" if small else "")
            for name, values in fields:
                chart = histogram(values, f"{self._label(m)} {name}")
                if small:  # drawn narrower: the viewBox keeps its drawing whole
                    chart = chart.replace(' width="520"', ' width="300"', 1)
                out.append(f"<div><p class=sub>{esc(name)}</p>{chart}</div>")
            out.append("</div>" if small else "")
        if isinstance(score, dict) and isinstance(score.get("jailbreak"), dict):
            jb = score["jailbreak"]
            out.append(f"<p>with the jailbreak: defect rate {_num(jb['defect_rate'])} (delta {jb['delta']:+.4f}, "
                       f"{jb['n']} items)</p>")
        out.append(panel_table(score))
        if m.get("agreement"):
            out.append("<p>agreement with people: " + ", ".join(f"{k} {_num(v)}" for k, v in m["agreement"].items())
                       + "</p>")
        if m.get("categories"):
            rows = "".join(f"<tr><td>{esc(c)}</td><td>{self._headline(v)}</td><td>{v.get('n', 0)}</td></tr>"
                           for c, v in m["categories"].items())
            out.append(f"<h3>Per category</h3><table><tr><th>category</th><th>score</th><th>items</th></tr>{rows}</table>")
        worst = sorted(self.heaps[i], reverse=True)
        if worst:
            out.append("<h3>Worst items</h3>")
            for badness, _, iid, position, result, error in worst:
                inst = instances.get(position, {}) if position is not None else {}
                what = error if error else (result.get("reason") if isinstance(result, dict) else None)
                otel = inst.get("otel") if isinstance(inst.get("otel"), dict) else {}
                where = (f" <span class=sub>{esc(otel.get('service', ''))} trace <code>{esc(otel.get('trace_id', ''))}"
                         f"</code></span>") if otel.get("trace_id") else ""
                said = error or in_words(result) or _short(result)  # a pairwise verdict in words
                out.append(f"<details><summary><code>{esc(iid)}</code>{where} {esc(said)}</summary>")
                for label, key in (("input", "input"), ("output", "actual-output"), ("references", "expected-output")):
                    if key in inst:
                        out.append(f"<p><b>{label}</b></p><pre>{esc(inst[key])}</pre>")
                out.append(trajectory_html(inst, result) + turns_html(result))  # an agent's run, a conversation
                if what:
                    out.append(f"<p><b>{'error' if error else 'judge reason'}</b> {esc(what)}</p>")
                out.append(f"<p><b>result</b></p><pre>{esc(result)}</pre></details>")
        out.append("</section>")
        return "".join(out)


def _short(result: Any) -> str:
    """An item's result in a line a person reads: its score (or its numbers) and the judge's reason
    as text, not the record's JSON."""
    if isinstance(result, dict):
        numbers = [f"{k} {_num(v, 3)}" for k, v in result.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "raw_score"]
        flags = [f"{k} {str(v).lower()}" for k, v in result.items() if isinstance(v, bool)]
        reason = result.get("reason") if isinstance(result.get("reason"), str) else ""
        text = ", ".join(numbers + flags) + (f": {reason}" if reason else "")
    else:
        text = _num(result, 3) if isinstance(result, (int, float)) and not isinstance(result, bool) else \
            json.dumps(result, ensure_ascii=False)
    return text if len(text) <= 160 else text[:157] + "..."


_HEAD = """<!doctype html><html lang=en><head><meta charset=utf-8><title>evalq report</title><style>
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1000px;color:#1d2330;padding:0 16px}
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #dde}h3{font-size:15px}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #dde;padding:3px 8px;text-align:left}
th{background:#f3f5fa}.ci{color:#667}.headline{font-size:16px}.params,.sub{color:#556}
.chart{display:block;margin:6px 0}.bar{fill:#4a78c2}.axis{stroke:#889}.tick,.val{font-size:10px;fill:#445}
details{margin:4px 0;border:1px solid #e3e6ee;padding:4px 8px;border-radius:4px}
pre{white-space:pre-wrap;background:#f7f8fb;padding:6px;margin:2px 0}code{font-size:12px}
.pass{color:#1b7f3b}.fail{color:#b3261e}.grid{display:flex;flex-wrap:wrap;gap:0 16px}
""" + AGENT_CSS + """
</style></head><body>"""


def page_head(title: str, css: str = "") -> str:
    """The head every evalq page shares (report.html's style), with its title and extra rules."""
    return _HEAD.replace("evalq report", html.escape(title), 1).replace("</style>", css + "</style>", 1)


def run_html(summary: list[dict], run: dict, lines: Iterable[tuple[dict, int | None]],
             lookup: Callable[[list[int]], dict[int, dict]] | None = None) -> str:
    builder = ReportBuilder(summary, run)
    for line, position in lines:
        builder.add(line, position)
    instances = lookup(builder.worst_positions()) if lookup else {}
    return builder.html(instances)


def report_from_outputs(location: str) -> str:
    """The report of a run from its output location (``evalq report OUT``)."""
    from evalq.shared.core.errors import JobError
    from evalq.shared.data.storage import Destination, open_binary, read_lines

    dest = Destination(location)
    try:
        with open_binary(dest.path("results.json")) as f:
            summary = json.loads(f.read().decode("utf-8"))
        try:
            with open_binary(dest.path("run.json")) as f:
                run = json.loads(f.read().decode("utf-8"))
        except JobError:
            run = {}
    except json.JSONDecodeError as exc:
        raise JobError(f"{location}: invalid JSON in its outputs: {exc.msg}") from None
    lines = ((json.loads(text), None) for _, text in read_lines(dest.path("log.jsonl")))
    return run_html(summary, run, lines)


# --- the comparison ----------------------------------------------------------------------

def compare_html(report: dict) -> str:
    parts = [_HEAD.replace("evalq report", "evalq comparison"), "<h1>evalq comparison</h1>",
             f"<p>base <code>{esc(report['base'])}</code> &rarr; new <code>{esc(report['new'])}</code></p>"]
    if report.get("gates"):
        rows = "".join(f"<tr><td><code>{esc(g['gate'])}</code></td><td>{_num(g['value'])}{_ci(g.get('ci95'))}</td>"
                       f"<td class={'pass' if g['passed'] else 'fail'}>{'PASS' if g['passed'] else 'FAIL'}</td></tr>"
                       for g in report["gates"])
        parts.append(f"<h2>Gates</h2><table><tr><th>gate</th><th>value</th><th></th></tr>{rows}</table>")
    for entry in report["entries"]:
        parts.append(f"<h2>{esc(entry['entry'])}</h2>")
        for w in entry.get("warnings", []):
            parts.append(f"<p class=fail>{esc(w)}</p>")
        fields = entry.get("fields", {})
        if fields:
            moved = {"worse": "<td class=fail>worse</td>", "better": "<td class=pass>better</td>"}
            rows = "".join(f"<tr><td>{esc(k)}</td><td>{_num(f.get('base'))}</td><td>{_num(f.get('new'))}</td>"
                           f"<td>{_num(f['diff'])}{_ci(f.get('ci95'))}</td><td>{_num(f['p_value'])}</td>"
                           f"<td>{f['n_pairs']}</td>{moved.get(f.get('moved'), '<td></td>')}</tr>"
                           for k, f in fields.items())
            parts.append("<table><tr><th>field</th><th>base</th><th>new</th><th>difference</th><th>p</th>"
                         f"<th>pairs</th><th>reads as</th></tr>{rows}</table>")
            parts.append(bar_chart([f"{k} base" for k in fields] + [f"{k} new" for k in fields],
                                   [f.get("base") or 0 for f in fields.values()] +
                                   [f.get("new") or 0 for f in fields.values()], f"{entry['entry']} base vs new"))
        if entry.get("flips"):
            fl = entry["flips"]
            parts.append(f"<p>pass &rarr; fail: {fl['pass_to_fail']['n']} "
                         f"<code>{esc(', '.join(fl['pass_to_fail']['ids']))}</code>; fail &rarr; pass: "
                         f"{fl['fail_to_pass']['n']} <code>{esc(', '.join(fl['fail_to_pass']['ids']))}</code></p>")
    for only in ("only_in_base", "only_in_new"):
        if report.get(only, {}).get("n"):
            parts.append(f"<p>{only.replace('_', ' ')}: {report[only]['n']} "
                         f"<code>{esc(', '.join(report[only]['ids']))}</code></p>")
    parts.append("</body></html>")
    return "".join(parts)
