"""A night at a glance (issue 74): what the report's header says beside the job's identity, one line
each (what each sink took of the scores, how the judges' learned limits moved), and a panel's
members side by side, so that a lenient member shows."""

from __future__ import annotations

import shlex

from evalq.results.markup import esc

ANSWER_SHOWN = 160  # characters of a sink's answer on its line


def glance(summary: list[dict], run: dict) -> list[tuple[str, str]]:
    """(label, text) rows for the header: ``regressions`` (how many against the suite's baseline, the
    biggest, and the command that lists them; run.json's ``regressions``), ``exports`` (per sink: sent, not sent and why; run.json's
    ``exports``) and ``learned limits`` (per deployment: each limit's first and last value during the
    job, and how many times it moved; the entries' ``judge.limits``)."""
    rows = []
    if isinstance(run.get("regressions"), dict):
        rows.append(("regressions", regressions_line(summary, run["regressions"])))
        if run["regressions"].get("dataset"):
            from evalq.results.dataset_versions import dataset_line

            rows.append(("dataset", dataset_line(run["regressions"]["dataset"])))
        people = run["regressions"].get("people")
        if people:
            from evalq.results.labels import agreement_line

            rows.append(("judges vs people", f"night {people['job_id']} ({people['finished_at'][:10]}): " + "; ".join(
                agreement_line(name, got) for name, got in sorted(people["entries"].items()))))
    if isinstance(run.get("review"), dict):
        from evalq.results.review import review_line

        rows.append(("for review", review_line(run["review"])))
    exports = run.get("exports") or {}
    if exports:
        rows.append(("exports", "; ".join(_export(name, got) for name, got in sorted(exports.items()))))
    retiring = retirements(summary, run)
    if retiring:
        rows.append(("judges retiring", retiring))
    limits = learned(summary)
    if limits:
        rows.append(("learned limits", "; ".join(f"{region}: {text}" for region, text in sorted(limits.items()))))
    return rows


SHOWN = 3  # regressions named on the header's line, the biggest moves first


def regressions_line(summary: list[dict], said: dict) -> str:
    """How the night compares with its suite's baseline, in a line: how many series regressed, the
    biggest of them, and ``evalq history SUITE`` to list them all."""
    suite, runs = said.get("suite"), said.get("baseline_runs", 0)
    if not runs:
        return f"none: no earlier run of suite {suite} that ended done to compare with"
    against = f"against the suite's baseline ({runs} earlier run{'s' if runs != 1 else ''} of {suite})"
    found = [(abs(f["delta"]), m.get("name") or m.get("metric"), f) for m in summary for f in m.get("regressions") or []]
    if not found:
        return f"none {against}"
    found.sort(key=lambda item: -item[0])
    named = "; ".join(f"{series_name(name, f['field'])} {f['value']:.4g} vs {f['baseline']:.4g} ({f['delta']:+.4g})"
                      for _, name, f in found[:SHOWN])
    more = f"; and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
    return f"{len(found)} {against}: {named}{more}; evalq history {shlex.quote(str(suite))} lists them"


def series_name(name: str, field: str) -> str:
    return name if field == "mean" else f"{name}.{field}"


def regressed(m: dict) -> str:
    """An entry's regressions, for its section of the report ('' for none)."""
    found = m.get("regressions") or []
    return "".join(f"<p class=fail>REGRESSION {esc(series_name(m.get('name') or m.get('metric'), f['field']))} "
                   f"{f['value']:.4f} vs baseline {f['baseline']:.4f} ({f['delta']:+.4f}, p={f['p_value']:.3g}, "
                   f"{'paired' if f['paired'] else 'unpaired'}, n={f['n']})</p>" for f in found)


def retirements(summary: list[dict], run: dict) -> str:
    """The night's judges (and model under test) whose model retires soon, as their providers said
    (results.json's ``judge.retires``), in a line; '' for none."""
    from evalq.shared.judging.retirement import gathered, said

    found = gathered(m.get("judge") for m in [*summary, run.get("generation") or {}])
    if not found:
        return ""
    return ("; ".join(said(f) for f in found) + " (switch judges before then: a new judge is a marked break in "
            "the suite's history)")


def _export(name: str, got: dict) -> str:
    sent, unsent = got.get("sent", 0), got.get("unsent", 0)
    text = f"{name} ({got.get('kind', name)}): " + (f"all {sent} sent" if not unsent else f"{sent} sent, {unsent} NOT sent")
    if got.get("skipped"):
        text += f", {got['skipped']} with nothing to send"
    if unsent and got.get("answer"):
        text += f" ({str(got['answer'])[:ANSWER_SHOWN]}; evalq resend JOB sends them again)"
    return text


def learned(summary: list[dict]) -> dict[str, str]:
    """Per deployment region, how its learned limits moved during the job (one line)."""
    seen: dict[str, list[dict]] = {}
    for m in summary:
        for region, rows in ((m.get("judge") or {}).get("limits") or {}).items():
            if isinstance(rows, list) and len(rows) > len(seen.get(region, [])):
                seen[region] = rows  # entries on one deployment share its history: the longest is all of it
    out = {}
    for region, rows in seen.items():
        parts = []
        for field in ("tpm", "rpm", "concurrency"):
            values = [row[field] for row in rows if isinstance(row.get(field), (int, float))]
            if values:
                first, last = values[0], values[-1]
                moved = sum(1 for a, b in zip(values, values[1:]) if a != b)
                parts.append(f"{field} {first:,.0f}" + (f" -> {last:,.0f} ({moved} changes)" if moved else " (held)"))
        if parts:
            out[region] = ", ".join(parts)
    return out


def panel_table(score) -> str:
    """A panel's members side by side: each member's mean, items, failed calls ('' for no panel)."""
    panel = score.get("panel") if isinstance(score, dict) else None
    members = panel.get("members") if isinstance(panel, dict) else None
    if not isinstance(members, dict) or not members:
        return ""
    rows = "".join(f"<tr><td>{esc(name)}</td><td>{_mean(m.get('mean'))}</td>"
                   f"<td>{m.get('n', 0)}</td><td>{m.get('failed', 0)}</td></tr>"
                   for name, m in sorted(members.items()) if isinstance(m, dict))
    return ("<h3>Panel members</h3><table><tr><th>member</th><th>mean</th><th>items</th><th>failed calls</th></tr>"
            f"{rows}</table>")


def _mean(value) -> str:
    return f"{value:.4g}" if isinstance(value, (int, float)) else ""


def time_split(summary: list[dict], label, top: int = 5, width: int = 520) -> str:
    """The metrics that took the most worker seconds (their chunks' times, summed: chunks run side by
    side, so the sum passes the wall time), each a bar split into compute (the CPU's seconds) and
    waiting (for a judge's replies, its budget); ``label(m)`` names an entry."""
    timed = sorted(((m.get("elapsed_time") or 0.0, label(m), m) for m in summary), key=lambda t: -t[0])[:top]
    timed = [t for t in timed if t[0] > 0]
    if not timed:
        return ""
    most, rows, height = timed[0][0], [], 24 * len(timed) + 26
    for k, (seconds, name, m) in enumerate(timed):
        compute = min(m.get("compute_time", seconds), seconds)
        y, full = 4 + 24 * k, (width - 190) * seconds / most
        part = full * compute / seconds
        rows.append(f'<text x="0" y="{y + 13}" class=tick>{esc(name[:28])}</text>'
                    f'<rect x="150" y="{y}" width="{max(part, 0.5):.1f}" height="16" class=bar>'
                    f'<title>compute {compute:,.1f} s</title></rect>'
                    f'<rect x="{150 + part:.1f}" y="{y}" width="{full - part:.1f}" height="16" fill="#c9d3e6">'
                    f'<title>waiting {seconds - compute:,.1f} s</title></rect>'
                    f'<text x="{154 + full:.1f}" y="{y + 13}" class=val>{seconds:,.1f} s: compute {compute:,.1f}, '
                    f'waiting {seconds - compute:,.1f}</text>')
    return ("<h2>Where the time went (worker seconds: compute, then waiting)</h2>"
            "<p class=sub>a metric's chunks' seconds, summed (they run side by side, so the sum passes the "
            "wall time); compute is the CPU's share, waiting the rest: a judge's replies, its budget</p>"
            f'<svg class=chart role=img aria-label="worker seconds per metric" width="{width + 120}" '
            f'height="{height}" viewBox="0 0 {width + 120} {height}">{"".join(rows)}</svg>')
