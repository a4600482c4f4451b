"""The cluster's journal and its history checker (``evalq.shared.cluster.journal``): lines of many
processes appended whole, and a history read for lost chunks, chunks run twice, judge calls paid
again against the bound of those in flight, and the time to progress again."""

from __future__ import annotations

import multiprocessing

from evalq.shared.cluster import journal


def _event(t, event, chunk="", run="", **fields):
    return {"t": t, "event": event, "job": "j" if event not in ("fault", "alive") else "", "chunk": chunk,
            "run": run, **fields}


def _history(lost_part: bool = False, repay: int = 0) -> list[dict]:
    events = [_event(0, "enqueue", "bleu:0"), _event(0, "enqueue", "coh:0"), _event(0, "enqueue", "coh:4")]
    events += [_event(1, "start", "bleu:0", "a", n=8), _event(2, "part", "bleu:0", "a"), _event(2, "done", "bleu:0", "a")]
    events += [_event(1, "start", "coh:0", "b", n=4)] + [_event(1.1, "call", "coh:0", "b", item=i) for i in range(4)]
    events += [_event(2, "part", "coh:0", "b"), _event(2, "done", "coh:0", "b")]
    events += [_event(3, "start", "coh:4", "c", n=4)] + [_event(3.1, "call", "coh:4", "c", item=4 + i) for i in range(4)]
    events += [_event(4, "fault", kind="flushall")]
    # the chunk in flight at the fault runs again after the rebuild
    events += [_event(6, "start", "coh:4", "d", n=4)]
    events += [_event(6.1, "call", "coh:4", "d", item=4 + i) for i in range(repay)]
    if not lost_part:
        events += [_event(7, "part", "coh:4", "d"), _event(7, "done", "coh:4", "d")]
    events += [_event(8, "alive", worker="judge")]
    return events


def test_an_undisturbed_history_reads_as_nothing_lost():
    verdict = journal.check(_history(repay=2), "j")
    assert verdict.chunks == 3 and verdict.lost == [] and verdict.doubled == {}
    assert (verdict.calls, verdict.repaid, verdict.in_flight) == (10, 2, 4) and verdict.ok
    assert verdict.recovered_after == 3 and verdict.alive == {"judge"}


def test_the_checker_finds_a_lost_chunk_and_calls_paid_past_the_bound():
    lost = journal.check(_history(lost_part=True), "j")
    assert lost.lost == ["coh:4"] and not lost.ok and lost.recovered_after is None
    over = journal.check(_history(repay=4) + [_event(6.2, "call", "coh:0", "d", item=0)], "j")
    assert over.repaid == 5 > over.in_flight == 4 and not over.ok
    twice = journal.check(_history() + [_event(9, "part", "bleu:0", "e")], "j")
    assert twice.doubled == {"bleu:0": 2}


def _write_many(path: str, tag: int) -> None:
    import os

    os.environ[journal.JOURNAL_ENV] = path
    for i in range(300):
        journal.note("call", "j", f"coh:{tag}", item=i, pad="x" * 200)


def test_lines_of_many_processes_are_appended_whole(tmp_path, monkeypatch):
    path = str(tmp_path / "journal.jsonl")
    procs = [multiprocessing.get_context("spawn").Process(target=_write_many, args=(path, tag)) for tag in range(4)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
    events = journal.read(path)  # each line parses: none was torn
    assert len(events) == 1200 and {e["chunk"] for e in events} == {f"coh:{t}" for t in range(4)}
    monkeypatch.delenv(journal.JOURNAL_ENV, raising=False)
    journal.note("call", "j")  # off: nothing written, nothing raised
    assert len(journal.read(path)) == 1200
