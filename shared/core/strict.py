"""The one base of every model a job's sections and parameters are read into (``Strict``), and of
every metric's parameters (``Params``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """A misspelt or unknown field is an error naming it; a read value never changes.
    (Metric parameters add ``strict=True``: no coercion of ``"1"`` into ``1``.)"""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Params(Strict):
    """Give every list and string parameter a ``max_length`` (evalq's own are in
    ``evalq.shared.core.bounds``): parameters apply to every item, so a job must not be
    able to multiply what each item costs by making one long."""

    model_config = ConfigDict(strict=True)


class NoParams(Params):
    pass
