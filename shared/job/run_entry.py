"""The typed pieces of a stored job's document (``evalq.shared.job.stored``): the read-only mapping a
document is (``Document``: what the run plan, ``evalq.shared.cluster.spec``, reads), and one run of
the job (``RunEntry``), which ``StoredJob`` hands out for its metric entries, generation stage and
variants runs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterator


class Document(Mapping):
    """A read-only mapping over a stored JSON object (``_doc``): what the run plan reads
    (``evalq.shared.cluster.spec``); everything else asks the subclass's properties."""

    _doc: Mapping

    def __getitem__(self, key: str) -> Any:
        return self._doc[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._doc)

    def __len__(self) -> int:
        return len(self._doc)


class RunEntry(Document):
    """One run of a stored job, typed: a metric entry (``<id>@<position>``), the generation stage
    (``generate``) or an entry's variants run (``<key>/variants``). A read-only mapping for the run
    plan (``evalq.shared.cluster.spec``: chunk sizes, queues, regions, companions)."""

    def __init__(self, key: str, doc: Mapping):
        self.key, self._doc = key, doc

    def __repr__(self) -> str:
        return f"RunEntry({self.key!r})"

    @property
    def id(self) -> str:
        """The metric's id (``generate`` for the generation stage)."""
        return self._doc["id"]

    @property
    def parameters(self) -> dict:
        """Its parameters, validated and resolved at submission (as JSON)."""
        return self._doc.get("parameters") or {}

    @property
    def name(self) -> str | None:
        """The name the job gave the entry, if any."""
        return self._doc.get("name")

    @property
    def human(self) -> str:
        """The name human grades and reports use: its name, else its metric id."""
        return self.name or self.id

    @property
    def judge(self) -> str | None:
        """The judge it calls (a panel's first member), if any."""
        judge = self.parameters.get("judge")
        return judge if isinstance(judge, str) else None

    @property
    def chunk_size(self) -> int:
        return int(self._doc["chunk_size"])

    @property
    def queue(self) -> str:
        """Its queue's kind (``cpu``, ``gpu``, ``judge``, ``generate``); regions make the names."""
        return self._doc["queue"]

    @property
    def companions(self) -> list[str]:
        """The keys of the entries its chunks also score (none for an entry run alone)."""
        return list(self._doc.get("companions") or ())

    @property
    def led_by(self) -> str | None:
        """The entry whose chunks score it, where it has no chunks of its own."""
        return self._doc.get("led_by")

    @property
    def n_items(self) -> int | None:
        """The generation stage's items (instances without an output)."""
        return self._doc.get("n_items")

    @property
    def prepared(self) -> Any:
        """What the orchestrator prepared for the whole entry (bertscore's idf, ...)."""
        return self._doc.get("prepared")
