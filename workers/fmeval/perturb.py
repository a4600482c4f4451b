"""fmeval's semantic perturbations (``transforms/semantic_perturbations.py``, from NL-Augmenter),
drawing from the generator they are given: evalq seeds one per instance (``instance_rng``), so an
item's perturbed inputs never depend on which worker ran it, or on the items before it (fmeval
draws every record from one generator per run)."""

from __future__ import annotations

import hashlib

import numpy as np

# fmeval's ButterFinger.QUERTY_KEY_APPROX: the keys around each key
NEARBY = {
    "q": "qwasedzx", "w": "wqesadrfcx", "e": "ewrsfdqazxcvgt", "r": "retdgfwsxcvgt", "t": "tryfhgedcvbnju",
    "y": "ytugjhrfvbnji", "u": "uyihkjtgbnmlo", "i": "iuojlkyhnmlp", "o": "oipklujm", "p": "plo['ik",
    "a": "aqszwxwdce", "s": "swxadrfv", "d": "decsfaqgbv", "f": "fdgrvwsxyhn", "g": "gtbfhedcyjn",
    "h": "hyngjfrvkim", "j": "jhknugtblom", "k": "kjlinyhn", "l": "lokmpujn", "z": "zaxsvde",
    "x": "xzcsdbvfrewq", "c": "cxvdfzswergb", "v": "vcfbgxdertyn", "b": "bvnghcftyun", "n": "nbmhjvgtuik",
    "m": "mnkjloik", " ": " ",
}


def instance_rng(seed: int, instance_id: str) -> np.random.Generator:
    """The generator of one instance's perturbations: the entry's ``seed`` and the instance's id."""
    digest = hashlib.sha256(str(instance_id).encode()).digest()
    return np.random.default_rng([seed, int.from_bytes(digest[:8], "big")])


def butter_finger(text: str, n: int, rng: np.random.Generator, perturbation_prob: float) -> list[str]:
    """Keyboard typos: each letter, with ``perturbation_prob``, becomes a nearby key (case kept)."""
    out = []
    for _ in range(n):
        letters = []
        for letter in text:
            lower = letter.lower()
            new = lower
            if lower in NEARBY and rng.random() <= perturbation_prob:
                new = rng.choice(list(NEARBY[lower]))
            letters.append(new.upper() if lower != letter else new)
        out.append("".join(letters))
    return out


def random_upper_case(text: str, n: int, rng: np.random.Generator, uppercase_fraction: float) -> list[str]:
    """A ``uppercase_fraction`` of the characters, drawn without replacement, upper-cased."""
    out = []
    for _ in range(n):
        positions = rng.choice(range(len(text)), int(len(text) * uppercase_fraction), False)
        out.append("".join(c if i not in positions else c.upper() for i, c in enumerate(text)))
    return out


def whitespace_add_remove(text: str, n: int, rng: np.random.Generator, add_prob: float,
                          remove_prob: float) -> list[str]:
    """Each whitespace character dropped with ``remove_prob``; a space added after each other
    character with ``add_prob`` (one draw per character decides both)."""
    out = []
    for _ in range(n):
        chars = []
        for c in text:
            p = rng.random()
            if c.isspace() and p < remove_prob:
                chars.append("")
            elif not c.isspace() and p < add_prob:
                chars.append(c + " ")
            else:
                chars.append(c)
        out.append("".join(chars))
    return out
