"""The one base of every model a job's sections and parameters are read into."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """A misspelt or unknown field is an error naming it; a read value never changes.
    (Metric parameters add ``strict=True``: no coercion of ``"1"`` into ``1``.)"""

    model_config = ConfigDict(extra="forbid", frozen=True)
