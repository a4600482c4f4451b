"""What every evalq HTML page does to a value before it goes into the markup."""

from __future__ import annotations

import html
import json
from typing import Any


def esc(value: Any) -> str:
    """Text escaped for HTML (quotes too); anything else as its JSON, escaped."""
    return html.escape(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False), quote=True)
