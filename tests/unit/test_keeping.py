"""Write-behind of kept replies while Redis is away (evalq.workers.keeping), with no
broker: a stand-in client that refuses connections while told Redis is down."""

from __future__ import annotations

import json
import threading
import time

import redis

from evalq.shared.cluster import keys
from evalq.workers.keeping import ItemKeeper, WriteBehind


class Store:
    """Enough of a redis-py client for the keeper: pipelines of hset, hincrby and
    expire, applied all at once, refused while ``down`` is set."""

    def __init__(self):
        self.down = threading.Event()
        self.hashes: dict[str, dict[str, object]] = {}
        self.round_trips = 0

    def pipeline(self, transaction: bool = True) -> "Pipe":
        return Pipe(self)

    def hmget(self, key, fields):
        self.round_trips += 1
        return [self.hashes.get(key, {}).get(f) for f in fields]


class Pipe:
    def __init__(self, store: Store):
        self.store, self.ops = store, []

    def hset(self, key, field, value):
        self.ops.append(lambda h: h.setdefault(key, {}).__setitem__(field, value))

    def hincrby(self, key, field, amount):
        self.ops.append(lambda h: h.setdefault(key, {}).__setitem__(field, h.get(key, {}).get(field, 0) + amount))

    def expire(self, key, seconds):
        pass

    def execute(self):
        self.store.round_trips += 1
        if self.store.down.is_set():
            raise redis.ConnectionError("Error 111 connecting to redis:6379. Connection refused.")
        for op in self.ops:
            op(self.store.hashes)


def wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_reply_answered_while_redis_is_down_is_held_then_written_once():
    store, behind = Store(), WriteBehind(first_wait=0.01, longest_wait=0.05)
    kept = keys.kept("J", "coherence@0")
    keeper = ItemKeeper(store, "J", "coherence@0", [40, 41], {}, ttl=60, write_behind=behind)
    keeper.begin(0)
    keeper.add([("hincrby", (keys.accounting("J", "coherence@0"), "calls", 1))])
    keeper.done({"instance_id": "a", "result": {"score": 4}})
    assert store.round_trips == 1  # the record alone: the call's counters wait for the run's end
    store.down.set()
    keeper.begin(1)
    keeper.answered("sha-b", '{"content": "Score: 2"}')
    keeper.add([("hincrby", (keys.accounting("J", "coherence@0"), "calls", 1))])
    keeper.done({"instance_id": "b", "result": {"score": 2}})
    # held in the process, and readable by a run of the chunk in it
    assert behind.pending() == 1
    # (with what its call counted: the chunk's part carries the sum, for a rebuild after Redis is lost;
    # and, until the run adds it to the accounting, as not yet added, by which run)
    assert json.loads(behind.held(kept, ["40", "41"])["41"]) == {
        "record": {"instance_id": "b", "result": {"score": 2}}, "acct": {"calls": 1}, "fresh": {"calls": 1},
        "run": keeper.run_id}
    assert set(store.hashes[kept]) == {"40"}
    behind.write(store, keeper.closing())  # the run ends: its counts, once, behind what is held
    store.down.clear()
    assert behind.drain(timeout=5)
    assert set(store.hashes[kept]) == {"40", "41"}
    assert store.hashes[keys.accounting("J", "coherence@0")]["calls"] == 2  # counted once each
    assert store.hashes[keys.accounted("J", "coherence@0")] == {keeper.run_id: 1}


def test_a_run_cut_short_has_its_counts_added_by_the_next_and_a_closed_one_does_not():
    store, behind = Store(), WriteBehind()
    acct = keys.accounting("J", "coherence@0")
    first = ItemKeeper(store, "J", "coherence@0", [0, 1, 2], {}, ttl=60, write_behind=behind)
    for i in range(2):  # two items judged and kept, then the worker dies: the run never closes
        first.begin(i)
        first.add([("hincrby", (acct, "calls", 1)), ("hincrby", (acct, "prompt_tokens", 10))])
        first.done({"instance_id": str(i), "result": {"score": 3}})
    assert acct not in store.hashes
    kept = {int(p): json.loads(v) for p, v in store.hashes[keys.kept("J", "coherence@0")].items()}
    second = ItemKeeper(store, "J", "coherence@0", [2], {}, ttl=60, write_behind=behind, kept=kept,
                        accounts={p: k["acct"] for p, k in kept.items()})
    second.begin(0)
    second.add([("hincrby", (acct, "calls", 1)), ("hincrby", (acct, "prompt_tokens", 7))])
    second.done({"instance_id": "2", "result": {"score": 5}})
    behind.write(store, second.closing())
    assert store.hashes[acct] == {"calls": 3, "prompt_tokens": 27}  # the dead run's two calls, and its own
    # a third run (redelivered again) finds both runs marked: it adds nothing of theirs
    kept = {int(p): json.loads(v) for p, v in store.hashes[keys.kept("J", "coherence@0")].items()}
    third = ItemKeeper(store, "J", "coherence@0", [], {}, ttl=60, write_behind=behind, kept=kept)
    behind.write(store, third.closing())
    assert store.hashes[acct] == {"calls": 3, "prompt_tokens": 27}
    assert second.chunk_accounting({}) == {"calls": 1, "prompt_tokens": 7}  # what its item's calls counted


def test_writes_made_while_others_are_held_land_after_them():
    store, behind = Store(), WriteBehind(first_wait=0.01, longest_wait=0.05)
    store.down.set()
    assert not behind.write(store, [("hset", ("h", "7", "replies"))])
    store.down.clear()  # back, but the older write is still held: the newer one waits behind it
    behind.write(store, [("hset", ("h", "7", "record"))])
    assert behind.drain(timeout=5)
    assert store.hashes["h"]["7"] == "record"


def test_an_item_of_several_calls_keeps_its_answered_calls_before_paying_for_the_next():
    store, behind = Store(), WriteBehind()
    earlier = {5: {"sha-1": "first reply"}}
    keeper = ItemKeeper(store, "J", "rubric@1", [5], earlier, ttl=60, write_behind=behind)
    keeper.begin(0)
    assert keeper.reply("sha-1") == "first reply" and keeper.reply("sha-2") is None
    keeper.before_call()
    assert store.round_trips == 0  # nothing new to keep: no round trip
    keeper.answered("sha-2", "second reply")
    keeper.before_call()
    assert store.round_trips == 1
    assert json.loads(store.hashes[keys.kept("J", "rubric@1")]["5"]) == \
        {"replies": {"sha-1": "first reply", "sha-2": "second reply"}, "run": keeper.run_id}


def test_the_flusher_stops_when_nothing_is_held_and_starts_again_when_needed():
    store, behind = Store(), WriteBehind(first_wait=0.01, longest_wait=0.05)
    for _ in range(2):
        store.down.set()
        behind.write(store, [("hincrby", ("acct", "calls", 1))])
        time.sleep(0.05)
        store.down.clear()
        wait_until(lambda: behind.pending() == 0)
    assert store.hashes["acct"]["calls"] == 2


def test_a_judge_clients_item_record_rides_the_next_calls_admission(redis_url):
    """With a judge client (``carrying``), an item's record is written ahead of its thread's next
    admission, in the reservation's round trip, so the next call is paid only once it is kept; a
    second record of the same thread with no admission between them goes at once, with the first."""
    import uuid

    from evalq.workers.judge.budget import Budget

    r = redis.Redis.from_url(redis_url)
    job = uuid.uuid4().hex
    kept = keys.kept(job, "coherence@0")
    keeper = ItemKeeper(r, job, "coherence@0", [0, 1, 2], {}, ttl=60)
    keeper.carrying = True
    budget = Budget(r, uuid.uuid4().hex, 10_000, 100)
    keeper.begin(0)
    keeper.done({"instance_id": "a", "result": {"score": 4}})
    assert r.hlen(kept) == 0  # waits for the thread's next call
    keeper.begin(1)
    keeper.before_call(carry=True)
    carried = keeper.carried()
    assert [op[0] for op in carried] == ["hset", "expire"] and keeper.carried() == []
    assert budget.reserve(100, carried).admitted
    assert json.loads(r.hget(kept, "0"))["record"] == {"instance_id": "a", "result": {"score": 4}}
    keeper.done({"instance_id": "b", "result": {"score": 2}})  # its call admitted above: waits again
    keeper.begin(2)
    keeper.done({"instance_id": "c", "skipped": "cached"})  # no call between: both now
    assert set(r.hkeys(kept)) == {b"0", b"1", b"2"} and keeper.carried() == []
    # a settling that rides the admission is run as the script it is
    reservation = budget.reserve(50)
    keeper.add(budget.settle_ops(reservation, 80))
    assert budget.reserve(10, keeper.carried()).admitted
    assert int(r.hget(keys.budget(budget.dep_id, "win"), "tok_sum")) == 100 + 80 + 10
