"""What report.html shows of a pairwise entry (``evalq.shared.pairwise``; issue 74): the candidate's
wins, ties and losses as one bar, each figure of the judge's bias beside what it is for a judge
without that bias, and an item's verdicts in words rather than its counters."""

from __future__ import annotations

from evalq.results.markup import esc

# what each of the judge's figures is for a judge without the bias it measures
BIASES = (("first_position_win_rate", "first-position wins", 0.5, "no seat preference"),
          ("flip_rate", "flips under swap", 0.0, "a judge that never flips"),
          ("longer_win_rate", "longer wins", 0.5, "no length preference"))
WHO = {"candidate": "the candidate won", "baseline": "the baseline won", "tie": "a tie"}
OUTCOMES = (("win", "wins", "#1b7f3b"), ("tie", "ties", "#8a8f9c"), ("loss", "losses", "#b3261e"))


def is_pairwise(score) -> bool:
    return isinstance(score, dict) and "win_rate" in score


def biases(score: dict, num, ci) -> str:
    """The judge's figures, each with its reference: ``; first-position wins 0.62 [CI] (0.5: no seat
    preference)``. ``num`` and ``ci`` format a number and an interval as the report does."""
    return "".join(f"; {label} {num(score[key])}{ci(score.get(key + '_ci95'))} ({reference:g}: {meaning})"
                   for key, label, reference, meaning in BIASES if isinstance(score.get(key), (int, float)))


def outcome_bar(score: dict, title: str, width: int = 520, height: int = 46) -> str:
    """The candidate's wins, ties and losses as one horizontal bar, each part labelled with its count
    and share."""
    counts = [(plural, int(score.get(plural) or 0), colour) for _, plural, colour in OUTCOMES]
    total = sum(n for _, n, _ in counts)
    if not total:
        return ""
    x, parts = 0.0, []
    for label, n, colour in counts:
        w = (width - 2) * n / total
        if n:
            parts.append(f'<rect x="{1 + x:.1f}" y="4" width="{w:.1f}" height="22" fill="{colour}">'
                         f'<title>{label}: {n}</title></rect>')
            if w > 60:
                parts.append(f'<text x="{1 + x + w / 2:.1f}" y="19" text-anchor=middle class=val '
                             f'style="fill:#fff">{n} {label} ({100 * n / total:.0f}%)</text>')
        x += w
    legend = ", ".join(f"{n} {label} ({100 * n / total:.0f}%)" for label, n, _ in counts)
    return (f'<svg class=chart role=img aria-label="{esc(title)}: {legend}" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}">{"".join(parts)}<text x="1" y="40" class=tick>{esc(legend)}'
            f'</text></svg>')


def in_words(result: dict) -> str | None:
    """A pairwise item's result as a sentence: its outcome, then each verdict (who was shown first,
    who won, the judge's reason); None for any other result."""
    if not isinstance(result, dict) or result.get("outcome") not in ("win", "tie", "loss") \
            or not isinstance(result.get("verdicts"), list):
        return None
    said = [f"{v.get('first')} shown first: {WHO.get(v.get('winner'), v.get('winner'))}"
            + (f" ({v['reason']})" if v.get("reason") else "") for v in result["verdicts"] if isinstance(v, dict)]
    split = " (the verdicts disagree)" if result.get("flipped") else ""
    return f"a {result['outcome']} for the candidate{split}: " + "; ".join(said)
