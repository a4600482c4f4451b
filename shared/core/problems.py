"""Collecting a job's problems: every one found, each naming its place, raised together."""

from __future__ import annotations

import difflib
import re
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


# how pydantic names the kinds of a union in an error's location ("tpm.constrained-int",
# "tpm.literal['auto']"): not a field of the job, so not where the problem is
_UNION_MEMBER = re.compile(r"^(?:literal\[.*\]|constrained-\w+|int|float|str|bool|none|(?:function|json-or-python|"
                           r"lax-or-strict|nullable|list|dict|tagged-union)[-\w]*\[.*\])$")


def parse_section(model: type[BaseModel], raw: Any, where: str, problems: Problems):
    if not isinstance(raw, dict):
        problems.add(where, f"expected an object, got {kind(raw)}")
        return None
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        union: dict[str, list[str]] = {}  # a field that may be one of several kinds: its kinds' problems
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"] if not _UNION_MEMBER.match(str(p)))
            at = f"{where}.{loc}" if loc else where
            if err["type"] == "extra_forbidden":
                name = str(err["loc"][-1])
                hint = did_you_mean(name, model.model_fields)
                problems.add(at, f"unknown field{hint}")
            elif any(_UNION_MEMBER.match(str(p)) for p in err["loc"]):
                union.setdefault(at, []).append(err["msg"].removeprefix("Value error, "))
            else:
                problems.add(at, err["msg"].removeprefix("Value error, "))
        for at, said in union.items():  # "should be <= 200000000, or 'auto'": once, without pydantic's names
            rest = [m.removeprefix("Input should be ") for m in said[1:]]
            problems.add(at, ", or ".join([said[0], *rest]))
        return None


def did_you_mean(name: str, choices) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""
