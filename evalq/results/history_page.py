"""The page of ``evalq history SUITE --html FILE``: one self-contained HTML page
(report.html's style; no script, no network, inline SVG) drawn from the document
``evalq history SUITE --json`` prints (runs oldest first).

A summary table first (each series' last value, the run before, the change, and the last run's
regression where it has one), then one small chart per series, a series being an entry's (name, field) across the
runs: the value as a line (a run without a value leaves a gap), the 95% interval
as a shaded band, regressed runs as red markers listed under the chart, failed
and cancelled runs as grey stripes; then the cost per run. Everything in the
document comes from jobs (suite, names, parameters) and is escaped; numbers are
only drawn when they are numbers. The page holds only what the document holds.
"""

from __future__ import annotations

import json
import math
from typing import Any

from evalq.results.markup import esc
from evalq.results.report import page_head

MAX_SERIES = 200
WIDTH, HEIGHT = 470, 168
LEFT, RIGHT, TOP, BOTTOM = 52, 24, 10, 26
MAX_TICKS = 6
DOTS_UP_TO = 60  # beyond this many runs, only the line (and the markers that matter) is drawn
STATUSES = ("done", "failed", "cancelled")

CSS = """
.series-grid{display:flex;flex-wrap:wrap;gap:10px 18px}
.series{flex:0 0 470px;margin:0;min-width:0}.series h3{margin:14px 0 0;overflow-wrap:anywhere}
.series .sub{margin:0;font-size:12px;overflow-wrap:anywhere}
.band{fill:#4a78c2;fill-opacity:.18}.line{fill:none;stroke:#4a78c2;stroke-width:1.6}.pt{fill:#4a78c2}
.reg{fill:#d93025;stroke:#7a1410;stroke-width:1.5}.judge{stroke:#7b3fb8;stroke-width:1.5;stroke-dasharray:4 3}.badrun{fill:#8a8f9c;fill-opacity:.22}
.grid{stroke:#e6e8ef}.costbar{fill:#7a6fc2}.costbar.failed,.costbar.cancelled{fill:#a9acb8}
.reglist{margin:2px 0 8px;padding-left:18px;font-size:12px;color:#b3261e}
.status-failed,.status-cancelled{color:#b3261e;font-weight:600}.status-done{color:#1b7f3b}
.legend{font-size:12px;color:#556}.legend .sw{display:inline-block;width:11px;height:11px;vertical-align:-1px;
margin:0 3px 0 10px;border-radius:2px}td.num{text-align:right;font-variant-numeric:tabular-nums}
"""


def number(value: Any) -> float | None:
    """A finite number from the document, or None (anything else is never drawn)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def interval(value: Any) -> tuple[float, float] | None:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        return None
    lo, hi = number(value[0]), number(value[1])
    return (min(lo, hi), max(lo, hi)) if lo is not None and hi is not None else None


def fmt(value: Any, sign: bool = False) -> str:
    v = number(value)
    if v is None:
        return "n/a"
    text = f"{v:+,.0f}" if abs(v) >= 10_000 else f"{v:+.4g}"
    return text if sign else text.lstrip("+")


def money(value: Any) -> str:
    v = number(value)
    return "n/a" if v is None else f"{v:,.2f}" if abs(v) >= 0.01 or v == 0 else f"{v:.2g}"


def count(value: Any) -> str:
    v = number(value)
    return "n/a" if v is None else f"{int(v):,}"


def when(run: dict) -> str:
    """A run's time (its end, else its start), as 'YYYY-MM-DD HH:MM'."""
    stamp = run.get("finished_at") or run.get("started_at")
    return stamp[:16].replace("T", " ") if isinstance(stamp, str) else "?"


def tick_label(run: dict, same_year: bool, with_time: bool = False) -> str:
    """A run's label on a chart's axis: its day ('11-29'), with the year where the runs span several,
    and with the time ('11-29 08:15') where two runs share a day."""
    stamp = when(run)
    day = stamp[5:10] if same_year and len(stamp) >= 10 else stamp[:10]
    return f"{day} {stamp[11:16]}" if with_time and len(stamp) >= 16 else day


def status_of(run: dict) -> str:
    status = run.get("status")
    return status if status in STATUSES else "other"


def series_key(entry: dict) -> tuple[str, str]:
    name = entry.get("name") or entry.get("metric") or "?"
    field = entry.get("field") or "value"
    return (name if isinstance(name, str) else json.dumps(name), field if isinstance(field, str) else json.dumps(field))


# --- the data: series across the runs -------------------------------------------------------

def collect(runs: list[dict]) -> dict[tuple[str, str], dict]:
    """(name, field) -> {"metric", "parameters", "worse", "points": [per run: entry or None],
    "regressions": {run index: regression}}, in order of first appearance."""
    found: dict[tuple[str, str], dict] = {}
    for i, run in enumerate(runs):
        for entry in run.get("metrics") or []:
            if not isinstance(entry, dict):
                continue
            s = found.setdefault(series_key(entry), {"points": [None] * len(runs), "regressions": {},
                                                     "parameters": []})
            s["points"][i] = entry
            s["metric"], s["worse"] = entry.get("metric"), entry.get("worse", s.get("worse"))
            if entry.get("parameters") not in s["parameters"]:
                s["parameters"].append(entry.get("parameters"))
    return found


def attach_regressions(runs: list[dict], series: dict[tuple[str, str], dict]) -> list[tuple[int, dict]]:
    """Hangs each regression on its series; returns those of no series."""
    orphans = []
    for i, run in enumerate(runs):
        for reg in run.get("regressions") or []:
            if not isinstance(reg, dict):
                continue
            s = series.get(series_key(reg))
            if s is None:
                orphans.append((i, reg))
            else:
                s["regressions"][i] = reg
    return orphans


# --- charts -------------------------------------------------------------------------------------

class Frame:
    """Maps run indices and values to the plot area of one chart (``bars``: one slot per run,
    values from zero)."""

    def __init__(self, n: int, lo: float, hi: float, width: int = WIDTH, bars: bool = False):
        if bars:
            lo, hi = 0.0, (hi if hi > 0 else 1.0) * 1.08
        elif hi - lo < 1e-12:
            pad = abs(hi) * 0.05 or 0.5
            lo, hi = lo - pad, hi + pad
        else:
            pad = (hi - lo) * 0.06
            lo, hi = lo - pad, hi + pad
        self.n, self.lo, self.hi, self.width, self.height, self.bars = n, lo, hi, width, HEIGHT, bars
        self.step = (width - LEFT - RIGHT) / (n if bars else max(n - 1, 1))

    def x(self, i: int) -> float:
        if self.bars:
            return LEFT + (i + 0.5) * self.step
        return (self.width + LEFT - RIGHT) / 2 if self.n == 1 else LEFT + i * self.step

    def y(self, v: float) -> float:
        return TOP + (self.hi - v) / (self.hi - self.lo) * (self.height - TOP - BOTTOM)

    def axes(self, runs: list[dict], label=fmt) -> str:
        base = self.height - BOTTOM
        out = [f'<line x1={LEFT} y1={base} x2={self.width - RIGHT} y2={base} class=axis></line>']
        for v in ticks(self.lo, self.hi):
            y = self.y(v)
            out.append(f'<line x1={LEFT} y1="{y:.1f}" x2={self.width - RIGHT} y2="{y:.1f}" class=grid></line>'
                       f'<text x={LEFT - 4} y="{y + 3:.1f}" text-anchor=end class=tick>{esc(label(v))}</text>')
        same_year = len({when(r)[:4] for r in runs}) == 1
        every = max(1, math.ceil(self.n / MAX_TICKS))
        labelled = range(0, self.n, every)
        days = [when(runs[i])[:10] for i in labelled]
        with_time = len(set(days)) < len(days)  # two labelled runs of one day: say which is which
        for i in labelled:
            out.append(f'<text x="{self.x(i):.1f}" y={base + 15} text-anchor=middle class=tick>'
                       f'{esc(tick_label(runs[i], same_year, with_time))}</text>')
        for i, run in enumerate(runs):  # failed and cancelled runs: a grey stripe (bars: a grey bar)
            if status_of(run) in ("failed", "cancelled") and not self.bars:
                w = max(4.0, min(self.step * 0.6, 14.0))
                out.append(f'<rect x="{self.x(i) - w / 2:.1f}" y={TOP} width="{w:.1f}" height={base - TOP} '
                           f'class=badrun data-run={i + 1}><title>run {i + 1} {esc(status_of(run))}</title></rect>')
        return "".join(out)


def ticks(lo: float, hi: float, want: int = 4) -> list[float]:
    """Round values between lo and hi, about ``want`` of them (steps of 1, 2, 2.5 or 5 times 10^k)."""
    raw = (hi - lo) / want
    if raw <= 0:
        return [lo]
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.ceil(lo / step - 1e-9)
    return [k * step for k in range(first, math.floor(hi / step + 1e-9) + 1)]


def runs_of(indices: list[int]) -> list[list[int]]:
    """Consecutive runs of indices: [1, 2, 4] -> [[1, 2], [4]]."""
    groups: list[list[int]] = []
    for i in indices:
        if groups and groups[-1][-1] == i - 1:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def split_at(group: list[int], breaks: set[int]) -> list[list[int]]:
    """A run of consecutive indices cut before each index in ``breaks``."""
    out: list[list[int]] = []
    for i in group:
        if not out or i in breaks:
            out.append([])
        out[-1].append(i)
    return out


def judge_name(identity: dict) -> str:
    versions = identity.get("versions") or []
    return f"{identity.get('model', '?')}" + (f" ({', '.join(versions)})" if versions else "")


def series_chart(title: str, runs: list[dict], s: dict) -> str:
    n = len(runs)
    values = {i: v for i, e in enumerate(s["points"]) if e and (v := number(e.get("value"))) is not None}
    bands = {i: ci for i, e in enumerate(s["points"]) if e and (ci := interval(e.get("ci95")))}
    marks = {i: number(r.get("value")) if number(r.get("value")) is not None else values.get(i)
             for i, r in s["regressions"].items()}
    marks = {i: v for i, v in marks.items() if v is not None}
    everything = list(values.values()) + [b for ci in bands.values() for b in ci] + list(marks.values())
    if not everything:
        return '<p class=sub>no value in any run</p>'
    frame = Frame(n, min(everything), max(everything))
    out = [f'<svg class=chart role=img aria-label="{esc(title)}" width={WIDTH} height={HEIGHT} '
           f'viewBox="0 0 {WIDTH} {HEIGHT}">', frame.axes(runs)]
    for group in runs_of(sorted(bands)):
        if len(group) == 1:
            i = group[0]
            lo, hi = bands[i]
            out.append(f'<rect x="{frame.x(i) - 3:.1f}" y="{frame.y(hi):.1f}" width=6 '
                       f'height="{max(frame.y(lo) - frame.y(hi), 0.5):.1f}" class=band></rect>')
            continue
        upper = [f"{frame.x(i):.1f},{frame.y(bands[i][1]):.1f}" for i in group]
        lower = [f"{frame.x(i):.1f},{frame.y(bands[i][0]):.1f}" for i in reversed(group)]
        out.append(f'<polygon points="{" ".join(upper + lower)}" class=band></polygon>')
    # a run whose judge changed starts a new stretch: the line is not drawn across the break
    breaks = {i for i, e in enumerate(s["points"]) if e and e.get("judge_changed")}
    stretches = [part for group in runs_of(sorted(values)) for part in split_at(group, breaks)]
    path = " ".join("M" + " L".join(f"{frame.x(i):.1f},{frame.y(values[i]):.1f}" for i in group)
                    for group in stretches)
    if path:
        out.append(f'<path d="{path}" class=line></path>')
    for i, v in values.items():
        if i in marks or (n > DOTS_UP_TO and 0 < i < n - 1 and i - 1 in values and i + 1 in values):
            continue
        ci = bands.get(i)
        out.append(f'<circle cx="{frame.x(i):.1f}" cy="{frame.y(v):.1f}" r=2.6 class=pt data-run={i + 1}>'
                   f'<title>run {i + 1} · {esc(when(runs[i]))}: {esc(fmt(v))}'
                   + (f' [{esc(fmt(ci[0]))}, {esc(fmt(ci[1]))}]' if ci else '') + '</title></circle>')
    for i in sorted(breaks):
        change = s["points"][i]["judge_changed"]
        x = frame.x(i) - (frame.x(i) - frame.x(i - 1)) / 2 if i > 0 else frame.x(i)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{frame.y(frame.hi):.1f}" y2="{frame.y(frame.lo):.1f}" '
                   f'class=judge data-run={i + 1}><title>judge changed in run {i + 1}: '
                   f'{esc(judge_name(change.get("before") or {}))} -&gt; {esc(judge_name(change.get("after") or {}))}'
                   f'; not compared with the runs before</title></line>')
    for i, v in marks.items():
        reg = s["regressions"][i]
        out.append(f'<circle cx="{frame.x(i):.1f}" cy="{frame.y(v):.1f}" r=5.5 class=reg data-run={i + 1}>'
                   f'<title>regression in run {i + 1}: {esc(fmt(v))} vs baseline {esc(fmt(reg.get("baseline")))}'
                   f'</title></circle>')
    out.append("</svg>")
    return "".join(out)


def cost_chart(runs: list[dict]) -> str:
    costs = {i: c for i, r in enumerate(runs) if (c := number(r.get("cost"))) is not None}
    if not costs:
        return ""
    n = len(runs)
    width = WIDTH * 2 if n > 12 else WIDTH
    top = max(costs.values())
    frame = Frame(n, 0.0, top, width=width, bars=True)
    slot = frame.step
    out = [f'<svg class=chart role=img aria-label="cost per run" width={width} height={HEIGHT} '
           f'viewBox="0 0 {width} {HEIGHT}">',
           frame.axes(runs, label=money)]
    for i, c in costs.items():
        y = frame.y(c)
        h = max(HEIGHT - BOTTOM - y, 0.8)
        out.append(f'<rect x="{frame.x(i) - slot * 0.35:.1f}" y="{HEIGHT - BOTTOM - h:.1f}" '
                   f'width="{slot * 0.7:.1f}" height="{h:.1f}" class="costbar {status_of(runs[i])}" data-run={i + 1}>'
                   f'<title>run {i + 1} · {esc(when(runs[i]))} ({esc(status_of(runs[i]))}): {esc(money(c))}'
                   '</title></rect>')
    for i in range(n if slot >= 18 else 0):
        if i not in costs:
            out.append(f'<text x="{frame.x(i):.1f}" y={HEIGHT - BOTTOM - 3} text-anchor=middle class=tick>n/a</text>')
    out.append("</svg>")
    return "".join(out)


# --- the page -----------------------------------------------------------------------------

def header(suite: str, runs: list[dict]) -> str:
    parts = [f"<h1>evalq history: {esc(suite)}</h1>"]
    if not runs:
        return parts[0] + "<p>no run recorded</p>"
    first, last = runs[0], runs[-1]
    start = first.get("started_at") or first.get("finished_at")
    span = f"{when({'finished_at': start})} &rarr; {esc(when(last))}"
    tally = ", ".join(f"{sum(status_of(r) == s for r in runs)} {s}" for s in (*STATUSES, "other")
                      if any(status_of(r) == s for r in runs))
    costs = [c for r in runs if (c := number(r.get("cost"))) is not None]
    total = f" &middot; total cost {esc(money(sum(costs)))} over {len(costs)} runs" if costs else ""
    regs = len(last.get("regressions") or [])
    parts.append(f"<p class=headline>{len(runs)} run{'s' if len(runs) != 1 else ''} ({esc(tally)}), {span}"
                 f"{total}</p><p>last run: <span class=status-{status_of(last)}>{esc(status_of(last))}</span>"
                 f", {regs} regression{'s' if regs != 1 else ''}</p>")
    return "".join(parts)


def run_table(runs: list[dict]) -> str:
    """Newest first; the run numbers are those of the charts' tooltips."""
    rows = []
    for i in range(len(runs) - 1, -1, -1):
        r = runs[i]
        regs = len(r.get("regressions") or [])
        status = status_of(r)
        model = r.get("model")
        rows.append(f"<tr><td class=num>{i + 1}</td><td>{esc(when(r))}</td><td><code>{esc(r.get('job_id') or '')}"
                    f"</code></td><td class=status-{status}>{esc(r.get('status') or '?')}</td>"
                    f"<td>{esc(model) if isinstance(model, str) else ''}</td><td class=num>{esc(money(r.get('cost')))}"
                    f"</td><td class=num>{esc(count(r.get('tokens')))}</td><td class=num>{esc(count(r.get('calls')))}"
                    f"</td><td class='num{' status-failed' if regs else ''}'>{regs}</td></tr>")
    return ("<h2>Runs (newest first)</h2><table><tr><th>#</th><th>finished</th><th>job id</th><th>status</th>"
            "<th>model</th><th>cost</th><th>tokens</th><th>judge calls</th><th>regressions</th></tr>"
            + "".join(rows) + "</table>")


def summary_table(keys: list[tuple[str, str]], runs: list[dict], series: dict) -> str:
    """Every series at a glance, one row each: its last value, the one before, the change, and the
    last run's regression against its baseline (value, baseline, delta, p) where it regressed."""
    rows, last_run = [], len(runs) - 1
    for key in keys:
        s = series[key]
        values = [(i, v) for i, e in enumerate(s["points"]) if e and (v := number(e.get("value"))) is not None]
        last = values[-1][1] if values else None
        before = values[-2][1] if len(values) > 1 else None
        change = last - before if last is not None and before is not None else None
        reg = s["regressions"].get(last_run)
        cells = ([fmt(reg.get("baseline")), fmt(reg.get("delta"), sign=True), fmt(reg.get("p_value"))] if reg
                 else ["", "", ""])
        rows.append(f"<tr{' class=status-failed' if reg else ''}><td>{esc(key[0])} · {esc(key[1])}</td>"
                    f"<td class=num>{esc(fmt(last))}</td><td class=num>{esc(fmt(before))}</td>"
                    f"<td class=num>{esc(fmt(change, sign=True)) if change is not None else ''}</td>"
                    + "".join(f"<td class=num>{esc(c)}</td>" for c in cells) + "</tr>")
    return ("<h2>Summary</h2><table class=summary><tr><th>series</th><th>last</th><th>run before</th><th>change</th>"
            "<th>baseline (if the last run regressed)</th><th>delta</th><th>p</th></tr>" + "".join(rows) + "</table>")


def regression_line(i: int, run: dict, reg: dict, label: str = "") -> str:
    paired = reg.get("paired")
    how = "paired" if paired is True else "unpaired" if paired is False else ""
    extra = ", ".join(x for x in (how, f"n {count(reg.get('n'))}" if number(reg.get("n")) is not None else "") if x)
    job = str(run.get("job_id") or "")[:12]
    return (f"<li>{esc(label + ': ') if label else ''}run {i + 1} ({esc(when(run))}, job <code>{esc(job)}</code>): "
            f"{esc(fmt(reg.get('value')))} vs baseline {esc(fmt(reg.get('baseline')))}, delta "
            f"{esc(fmt(reg.get('delta'), sign=True))}, p {esc(fmt(reg.get('p_value')))}"
            + (f" ({esc(extra)})" if extra else "") + "</li>")


def series_section(key: tuple[str, str], runs: list[dict], s: dict) -> str:
    name, field = key
    title = f"{name} · {field}"
    latest = next((e for e in reversed(s["points"]) if e and number(e.get("value")) is not None), None)
    facts = []
    if latest:
        ci = interval(latest.get("ci95"))
        facts.append(f"last {fmt(latest.get('value'))}" + (f" [{fmt(ci[0])}, {fmt(ci[1])}]" if ci else "")
                     + f", n {count(latest.get('n'))}"
                     + (f", {count(latest.get('n_errors'))} errors" if number(latest.get("n_errors")) else ""))
    better = {"lower": "higher is better", "higher": "lower is better"}.get(s.get("worse"))
    if better:
        facts.append(better)
    params = s["parameters"]
    about = (f"metric <code>{esc(s.get('metric') or name)}</code>"
             + (f" parameters <code>{esc(params[-1])}</code>" if params[-1] else "")
             + (f" (parameters changed {len(params) - 1} time{'s' if len(params) > 2 else ''})"
                if len(params) > 1 else ""))
    regs = "".join(regression_line(i, runs[i], reg) for i, reg in sorted(s["regressions"].items()))
    return (f"<section class=series><h3>{esc(title)}</h3><p class=sub>{esc(' · '.join(facts))}</p>"
            f"<p class=sub>{about}</p>{series_chart(title, runs, s)}"
            + (f"<ul class=reglist>{regs}</ul>" if regs else "") + "</section>")


LEGEND = ("<p class=legend>In each chart: <span class=sw style='background:#4a78c2'></span>value "
          "<span class=sw style='background:rgba(74,120,194,.25)'></span>95% interval "
          "<span class=sw style='background:#d93025;border-radius:50%'></span>regression "
          "<span class=sw style='background:rgba(138,143,156,.35)'></span>failed or cancelled run; "
          "a run without a value leaves a gap.</p>")


def render(doc: dict) -> str:
    """The page of ``evalq history SUITE --html`` from the document of ``--json``."""
    suite = doc.get("suite")
    suite = suite if isinstance(suite, str) else json.dumps(suite)
    runs = [r for r in doc.get("runs") or [] if isinstance(r, dict)]
    series = collect(runs)
    orphans = attach_regressions(runs, series)
    keys = list(series)
    if len(keys) > MAX_SERIES:  # the regressed ones first, then in order of appearance
        chosen = set([k for k in keys if series[k]["regressions"]][:MAX_SERIES])
        chosen |= set([k for k in keys if k not in chosen][:MAX_SERIES - len(chosen)])
        left_out = [k for k in keys if k not in chosen]
        keys = [k for k in keys if k in chosen]
    else:
        left_out = []
    parts = [page_head(f"evalq history: {suite}", CSS), header(suite, runs)]
    if runs:
        parts.append(run_table(runs))
    if keys and runs:
        parts.append(summary_table(keys, runs, series))
    if keys:
        parts.append(f"<h2>Series ({len(keys)})</h2>{LEGEND}<div class=series-grid>")
        parts.extend(series_section(k, runs, series[k]) for k in keys)
        parts.append("</div>")
    if left_out:
        names = ", ".join(f"{n} · {f}" for n, f in left_out[:20])
        parts.append(f"<p class=sub>{len(left_out)} more series not charted (at most {MAX_SERIES}): "
                     f"{esc(names)}{', ...' if len(left_out) > 20 else ''}</p>")
    if orphans:
        parts.append("<h2>Regressions of entries without values</h2><ul class=reglist>"
                     + "".join(regression_line(i, runs[i], reg, " · ".join(series_key(reg))) for i, reg in orphans)
                     + "</ul>")
    chart = cost_chart(runs)
    if chart:
        parts.append(f"<h2>Cost per run</h2><p class=legend>grey bars: failed or cancelled runs; n/a: no price "
                     f"known</p>{chart}")
    parts.append("</body></html>")
    return "".join(parts)
