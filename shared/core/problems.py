"""Collecting a job's problems: every one found, each naming its place, raised together."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from evalq.shared.core.errors import JobError, kind

MAX_PROBLEMS = 25


class Problems:
    def __init__(self, source: str):
        self.roots: list[Path] | None = None
        self.s3 = None  # the S3 places a queue request's tenant may read (None: the operator's lists)
        # False for a check that reads no secret (``evalq plan``, ``validate --offline``): a key
        # variable must be named, not set; the unset ones are kept here, (place, variable)
        self.keys_needed = True
        self.unset_keys: list[tuple[str, str]] = []
        self.source = source
        self.items: list[str] = []
        self.truncated = 0

    def add(self, where: str, message: str) -> None:
        if len(self.items) < MAX_PROBLEMS:
            self.items.append(f"{self.source}: {where}: {message}")
        else:
            self.truncated += 1

    def raise_if_any(self) -> None:
        if self.items:
            if self.truncated:
                self.items.append(f"{self.source}: ... and {self.truncated} more problems")
            raise JobError(self.items)


def parse_section(model: type[BaseModel], raw: Any, where: str, problems: Problems):
    if not isinstance(raw, dict):
        problems.add(where, f"expected an object, got {kind(raw)}")
        return None
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"])
            if err["type"] == "extra_forbidden":
                name = str(err["loc"][-1])
                hint = did_you_mean(name, model.model_fields)
                problems.add(f"{where}.{loc}" if loc else where, f"unknown field{hint}")
            else:
                msg = err["msg"].removeprefix("Value error, ")
                problems.add(f"{where}.{loc}" if loc else where, msg)
        return None


def did_you_mean(name: str, choices) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""
