"""What a worker keeps for its life leaves the cyclic collector's reach (``evalq.workers.chunk.settle``):
the metric's modules as it is first imported, and what its first chunk loaded (a model) as its second
chunk starts; nothing later is frozen, so a chunk's own objects stay collectable."""

from __future__ import annotations

import gc
from types import SimpleNamespace

from evalq.workers import chunk


def collectable(obj) -> bool:
    """Whether the collector still walks ``obj`` (a frozen object is in no generation it scans)."""
    return any(o is obj for o in gc.get_objects())


def test_what_the_first_chunk_loaded_is_frozen_as_the_second_starts(monkeypatch):
    monkeypatch.setattr(chunk, "_SETTLED", {})
    spec = SimpleNamespace(impl="tests:a_model_metric", load=lambda: None)
    try:
        chunk.settle(spec)  # the first chunk: the metric imported
        model = [[n] for n in range(1000)]  # what the first chunk loads
        assert collectable(model) and collectable(model[-1])
        chunk.settle(spec)  # the second chunk: the model joins what is frozen
        assert not collectable(model) and not collectable(model[-1])
        later = [[n] for n in range(10)]  # a later chunk's objects: left to the collector
        chunk.settle(spec)
        assert collectable(later) and collectable(later[0])
    finally:
        gc.unfreeze()  # this test process's objects back under the collector
