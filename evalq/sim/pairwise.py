"""A judge's biases, told to judge-sim (issue 61), so that tests can check the figures evalq reports
against the truth the simulator was given.

A pairwise request (two answers as ``<data name="ANSWER A">`` and ``<data name="ANSWER B">``
material, as evalq's pairwise comparison sends them) is answered with a winner drawn, from the
request's digest and the sim's seed, with these odds of A over B, multiplied:

- **position**: ``first / (1 - first)`` (``first`` 0.5: no seat preference; FastChat's GPT-4: 0.526);
- **length**, when the two differ in length: ``longer / (1 - longer)`` for the longer one;
- **quality**, when the answers carry different ``[[sim:quality=<q>]]`` markers: the better one
  wins with probability ``1 - noise`` (with ``noise`` 0 it always does, whatever the biases).

Two equally good answers of the same length are thus judged A with probability ``first``; the
truths a test checks follow from these odds (``truth``). ``[[sim:winner=A]]`` in the request still
forces the verdict. A rating request (1-5) from a model with ``leniency`` is scored that many points
higher (capped at 5), and with ``noise`` moved a point up or down that often: a panel's members can
be told apart.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

_SECTION = re.compile(r'<data name="ANSWER ([AB])">\n(.*?)\n</data>', re.S)
_QUALITY = re.compile(r"\[\[sim:quality=(-?[0-9.]+)\]\]", re.I)
_MARKERS = re.compile(r"\[\[sim:[^\]]*\]\]", re.I)


@dataclass(frozen=True)
class Biases:
    first: float = 0.5    # P(the first seat wins) between two equal answers of one length
    longer: float = 0.5   # P(the longer wins) between two equal answers, position aside
    noise: float = 0.0    # P(the worse of two different answers wins); for ratings, P(a point off)
    leniency: int = 0     # points added to a rating (capped at the scale's top)

    def __post_init__(self) -> None:
        for name in ("first", "longer", "noise"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"judge-sim biases: {name} must be in [0, 1], got {value!r}")


def _draw(digest: bytes, salt: str, seed: int | None) -> float:
    """A uniform number in [0, 1) from the request, the purpose and the sim's seed."""
    h = hashlib.sha256(digest + salt.encode() + str(seed).encode()).digest()
    return int.from_bytes(h[:8], "big") / 2 ** 64


def sections(text: str) -> dict[str, str] | None:
    found = dict(_SECTION.findall(text or ""))
    return found if set(found) == {"A", "B"} else None


def winner(text: str, digest: bytes, biases: Biases, seed: int | None) -> str | None:
    """The verdict (``A`` or ``B``) for a pairwise request's text, or None when it is not one."""
    found = sections(text)
    if found is None:
        return None
    quality = {k: _QUALITY.findall(v) for k, v in found.items()}
    qa, qb = (float(quality[k][-1]) if quality[k] else 0.5 for k in ("A", "B"))
    if qa != qb and biases.noise == 0.0:
        return "A" if qa > qb else "B"
    length = {k: len(_MARKERS.sub("", v).strip()) for k, v in found.items()}
    p = _odds_a(biases, qa, qb, length["A"], length["B"])
    return "A" if _draw(digest, "pairwise", seed) < p else "B"


def _odds_a(biases: Biases, qa: float, qb: float, la: int, lb: int) -> float:
    """P(A wins): the biases' odds multiplied."""
    def odds(p: float) -> float:
        return float("inf") if p >= 1.0 else p / (1.0 - p)

    factors = [odds(biases.first)]
    if la != lb:
        factors.append(odds(biases.longer) if la > lb else 1.0 / max(odds(biases.longer), 1e-300))
    if qa != qb:
        good = odds(1.0 - biases.noise)
        factors.append(good if qa > qb else 1.0 / max(good, 1e-300))
    total = 1.0
    for f in factors:
        total *= f
    if total == float("inf"):
        return 1.0
    return total / (1.0 + total)


def rated(score: int, digest: bytes, biases: Biases, seed: int | None, lo: int = 1, hi: int = 5) -> int:
    """A rating as a judge with these biases gives it: ``leniency`` points up, and ``noise`` of the
    time a point up or down (within the scale)."""
    score = min(hi, score + biases.leniency)
    if biases.noise and _draw(digest, "rating-noise", seed) < biases.noise:
        score += 1 if _draw(digest, "rating-sign", seed) < 0.5 else -1
    return max(lo, min(hi, score))


def truth(biases: Biases) -> dict[str, float]:
    """What evalq should report of a judge with these biases over pairs of equal answers: the first
    position's win rate (equal lengths), the longer answer's win rate (no seat preference), and the
    flip rate under the swap (equal lengths: the first seat wins both orders or neither)."""
    f = biases.first
    return {"first_position_win_rate": f, "longer_win_rate": biases.longer, "flip_rate": f * f + (1 - f) * (1 - f)}
