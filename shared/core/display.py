"""Names a job gave (entry names, suites, metric ids) as they are shown to people. A job is
untrusted input: what it names must not move a terminal's cursor, recolour it or fake a second
line, nor mention a whole chat channel or hide a link in a webhook's text."""

from __future__ import annotations

import re
import unicodedata

# C0 and C1 controls, DEL, and the format characters that reorder or hide text (bidi controls,
# zero-width ones): in a name they only deceive the reader
_HIDDEN = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2028\u2029\u2060-\u2064\u2066-\u2069\ufeff]")


def printable(text: object, limit: int = 200) -> str:
    """``text`` on one line for a terminal: every control and hiding character replaced by ``?``,
    cut to ``limit`` characters (an ellipsis says so)."""
    shown = _HIDDEN.sub("?", unicodedata.normalize("NFC", str(text)))
    return shown if len(shown) <= limit else shown[:limit - 1] + "…"


def chat_text(text: object, limit: int = 200) -> str:
    """``text`` for a chat webhook's markup (Slack's, and Teams' and Mattermost's alike): one line
    (``printable``), with ``&``, ``<`` and ``>`` escaped, so no ``<!channel>``, ``<@user>`` or
    ``<url|label>`` a name carries is read as markup."""
    return printable(text, limit).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
