"""A night at a glance (issue 74): what the report's header says beside the job's identity, one line
each (what each sink took of the scores, how the judges' learned limits moved), and a panel's
members side by side, so that a lenient member shows."""

from __future__ import annotations

from evalq.results.markup import esc

ANSWER_SHOWN = 160  # characters of a sink's answer on its line


def glance(summary: list[dict], run: dict) -> list[tuple[str, str]]:
    """(label, text) rows for the header: ``exports`` (per sink: sent, not sent and why; run.json's
    ``exports``) and ``learned limits`` (per deployment: each limit's first and last value during the
    job, and how many times it moved; the entries' ``judge.limits``)."""
    rows = []
    exports = run.get("exports") or {}
    if exports:
        rows.append(("exports", "; ".join(_export(name, got) for name, got in sorted(exports.items()))))
    limits = learned(summary)
    if limits:
        rows.append(("learned limits", "; ".join(f"{region}: {text}" for region, text in sorted(limits.items()))))
    return rows


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
