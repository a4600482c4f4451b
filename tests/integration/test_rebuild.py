"""A job whose Redis state is lost is rebuilt from the job store (issue 72): its document and a
marker that it runs are in the store from submission, a chunk with a record part is done, and the
sweeper's rebuild sends again exactly the chunks without one."""

from __future__ import annotations

import base64
import json

import pytest
import redis

from evalq.orchestrator import submit
from evalq.shared.cluster import keys
from evalq.shared.job.schema import parse_job
from evalq.shared.job.stored import load_job
from evalq.shared.store import ledger
from evalq.shared.store.place import Place

INSTANCES = [{"id": f"i{k}", "actual-output": f"the answer {k % 3}", "expected-output": ["the answer 1"]}
             for k in range(10)]


def chunks_in_line(r: redis.Redis, job_id: str) -> set[str]:
    """Every chunk of the job waiting in its pending lists or sent to a Celery queue (its message's
    arguments, as kombu keeps them in the queue's Redis list)."""
    found = set()
    for key in r.scan_iter(match=keys.pending(job_id, "*")):
        found |= {"{}:{}".format(*json.loads(raw)[:2]) for raw in r.lrange(key, 0, -1)}
    for queue in ("cpu", "gpu"):
        for raw in r.lrange(queue, 0, -1):
            args = json.loads(base64.b64decode(json.loads(raw)["body"]))[0]
            if args[0] == job_id:
                found.add(f"{args[1]}:{args[2]}")
    return found


def test_a_job_redis_lost_is_rebuilt_from_the_store_sending_only_its_undone_chunks(private_redis, tmp_path,
                                                                                    monkeypatch):
    from evalq.orchestrator.finalize import fail
    from evalq.orchestrator.rebuild import rebuild_lost
    from evalq.workers import chunk

    monkeypatch.setenv("EVALQ_GROUP_ENTRIES", "0")
    r = redis.Redis.from_url(private_redis)
    store = Place(str(tmp_path / "store"))
    job = parse_job({"instances": INSTANCES, "metrics": [{"id": "exact_match"}, {"id": "bleu"}]})
    job_id = submit.store_job(r, job, submit.job_spec(job, chunk_size=4), store=store)
    stored = load_job(r, job_id)
    assert ledger.document(stored.place) == json.loads(stored.to_json())  # the job itself, beside its parts
    assert [j for j, *_ in ledger.running_jobs(store)] == [job_id]
    plan = [c for c in submit.plan(job, chunk_size=4)]
    ran = plan[:1] + plan[-2:]  # some chunks of each entry done before the loss
    for c in ran:
        chunk.run_chunk(r, job_id, c.metric_key, c.start, c.stop)
    counted = {key: int(r.get(keys.recorded_total(job_id, key))) for key in stored.metrics}
    assert sum(counted.values()) == sum(c.stop - c.start for c in ran)
    aggregates = {key: {int(k): json.loads(v) for k, v in r.hgetall(keys.parts(job_id, key)).items()}
                  for key in stored.metrics}
    timings = {key: {int(k): float(v) for k, v in r.hgetall(keys.timings(job_id, key)).items()}
               for key in stored.metrics}

    r.flushall()  # Redis restarted without persistence, or a replica promoted empty
    monkeypatch.setenv("EVALQ_STORE", store.uri)
    (action,) = rebuild_lost(r, private_redis)
    assert "rebuilt from the job store" in action and f"{len(ran)} chunks" in action
    again = load_job(r, job_id)
    assert again is not None and again.to_json() == stored.to_json()
    assert r.get(keys.status(job_id)) == b"running" and r.zscore(keys.JOBS, job_id) is not None
    assert {key: int(r.get(keys.recorded_total(job_id, key)) or 0) for key in stored.metrics} == counted
    assert {m.decode() for m in r.smembers(keys.chunks_done(job_id, "metrics"))} == {c.id for c in ran}
    # each done chunk's aggregate and time as Redis had them: the final callback merges parts, not records
    assert {key: {int(k): json.loads(v) for k, v in r.hgetall(keys.parts(job_id, key)).items()}
            for key in stored.metrics} == aggregates
    for key in stored.metrics:
        assert {int(k): float(v) for k, v in r.hgetall(keys.timings(job_id, key)).items()} == \
            pytest.approx(timings[key])
    assert chunks_in_line(r, job_id) == {c.id for c in plan} - {c.id for c in ran}  # exactly those undone
    assert rebuild_lost(r, private_redis) == []  # in Redis again: nothing more to do

    fail(r, job_id, "ended here")  # a job that ended leaves the store's running jobs
    assert list(ledger.running_jobs(store)) == []
    r.flushall()
    assert rebuild_lost(r, private_redis) == []


def test_a_redis_behind_the_store_counts_the_parts_before_resending(private_redis, tmp_path, monkeypatch):
    """A failover that lost the last writes: a chunk's part is there, its count and done mark are not;
    ``evalq resume`` sends it no more."""
    from evalq.orchestrator.watch import resume_job
    from evalq.workers import chunk

    monkeypatch.setenv("EVALQ_GROUP_ENTRIES", "0")
    r = redis.Redis.from_url(private_redis)
    job = parse_job({"instances": INSTANCES, "metrics": [{"id": "exact_match"}]})
    job_id = submit.store_job(r, job, submit.job_spec(job, chunk_size=4), store=Place(str(tmp_path / "store")))
    first, *rest = list(submit.plan(job, chunk_size=4))
    chunk.run_chunk(r, job_id, first.metric_key, first.start, first.stop)
    r.delete(keys.recorded(job_id, first.metric_key), keys.recorded_total(job_id, first.metric_key),
             keys.chunks_done(job_id, "metrics"))  # the writes the promoted replica never had
    outcome = resume_job(r, private_redis, job_id)
    assert outcome["sent"] == len(rest)
    assert chunks_in_line(r, job_id) == {c.id for c in rest}
    assert int(r.get(keys.recorded_total(job_id, first.metric_key))) == first.stop - first.start


def test_a_job_cancelled_before_the_loss_is_rebuilt_cancelled_and_only_its_outputs_written(private_redis, tmp_path,
                                                                                          monkeypatch):
    from evalq.orchestrator.jobs import cancel_job
    from evalq.orchestrator.rebuild import rebuild_lost
    from evalq.workers import chunk

    monkeypatch.setenv("EVALQ_GROUP_ENTRIES", "0")
    r = redis.Redis.from_url(private_redis)
    store = Place(str(tmp_path / "store"))
    job = parse_job({"instances": INSTANCES, "metrics": [{"id": "exact_match"}]})
    job_id = submit.store_job(r, job, submit.job_spec(job, chunk_size=4), store=store)
    first = next(iter(submit.plan(job, chunk_size=4)))
    chunk.run_chunk(r, job_id, first.metric_key, first.start, first.stop)
    assert cancel_job(r, private_redis, job_id) == "cancelled"
    assert ledger.was_cancelled(load_job(r, job_id).place)
    r.flushall()
    monkeypatch.setenv("EVALQ_STORE", store.uri)
    (action,) = rebuild_lost(r, private_redis)
    assert "cancelled as it was" in action
    assert r.get(keys.status(job_id)) == b"cancelled" and chunks_in_line(r, job_id) == set()
    # its final callback, to write what was recorded: on the control queue
    sent = [json.loads(raw)["headers"] for raw in r.lrange("evalq.control", 0, -1)]
    assert [(h["task"], h["argsrepr"]) for h in sent] == [("evalq.finalize", repr((job_id,)))]


def test_a_queue_requests_id_is_bound_to_its_rebuilt_job_again(private_redis, tmp_path, monkeypatch):
    """A request redelivered after the loss is answered with the job rebuilt, not made a second job: the
    binding of its tenant's request id (``evalq.orchestrator.service``) comes back with the job."""
    from evalq.orchestrator.rebuild import rebuild_lost

    r = redis.Redis.from_url(private_redis)
    store = Place(str(tmp_path / "store"))
    job = parse_job({"instances": INSTANCES, "metrics": [{"id": "exact_match"}]})
    doc = submit.job_spec(job, chunk_size=4, request_id="nightly-1", namespace="search", message_id="m-1",
                          fingerprint="fp-1")
    job_id = submit.store_job(r, job, doc, store=store)
    r.flushall()
    monkeypatch.setenv("EVALQ_STORE", store.uri)
    rebuild_lost(r, private_redis)
    idem = keys.request_binding("search", "nightly-1", "m-1")
    assert idem == keys.request("search/nightly-1")
    assert (r.get(idem), r.get(f"{idem}:owner"), r.get(f"{idem}:fingerprint")) == (job_id.encode(), b"m-1", b"fp-1")


def test_a_request_sent_again_before_the_rebuild_is_its_job_not_a_second_one(private_redis, tmp_path, monkeypatch):
    """Between the loss and the sweeper's rebuild a request may come again (redelivered, or a pipeline's
    retry): the store knows its job (a marker by the request's binding), which is bound and rebuilt at
    once. The same message is the job; another with its request id is a duplicate; another asking for
    something else under that id is a conflict. No second job in any case; the job's end removes both
    markers."""
    from evalq.orchestrator.finalize import fail
    from evalq.orchestrator.service import handle_request

    monkeypatch.setenv("EVALQ_STORE", str(tmp_path / "store"))
    monkeypatch.setenv("EVALQ_REQUEST_ROOTS", str(tmp_path))
    r = redis.Redis.from_url(private_redis)
    request = {"job": {"instances": INSTANCES, "metrics": [{"id": "exact_match"}]}, "request_id": "nightly-2",
               "out": str(tmp_path / "out")}
    first = handle_request(None, r, "m-1", private_redis, "evalq.jobs", **request)
    job_id = first["job_id"]
    assert first["status"] == "running"
    r.flushall()
    again = handle_request(None, r, "m-1", private_redis, "evalq.jobs", **request)  # the same message, before any sweep
    assert again == {"job_id": job_id, "status": "running"}
    assert [j.decode() for j in r.zrange(keys.JOBS, 0, -1)] == [job_id] and load_job(r, job_id) is not None
    assert chunks_in_line(r, job_id) == {"exact_match@0:0"}  # its one chunk sent again, once
    r.flushall()
    other = handle_request(None, r, "m-2", private_redis, "evalq.jobs", **request)  # another message with the request's id
    assert (other["job_id"], other.get("duplicate")) == (job_id, True)
    r.flushall()
    changed = handle_request(None, r, "m-3", private_redis, "evalq.jobs", **{**request, "chunk_size": 2})
    assert changed["status"] == "conflict" and [j.decode() for j in r.zrange(keys.JOBS, 0, -1)] == [job_id]
    fail(r, job_id, "ended by the test")
    store = Place(str(tmp_path / "store"))
    assert list(ledger.running_jobs(store)) == [] and ledger.requested(store, keys.request("nightly-2")) is None
    assert ledger.running_place(store).names(ledger.REQUESTS) == []


def test_a_document_changed_in_the_tenants_folder_is_not_taken_for_the_job(private_redis, tmp_path, monkeypatch):
    """A tenant may write its own folder of a shared store: a job.json rewritten there (another tenant's
    namespace, another destination) does not become the job; the marker's digest says it is not the
    cluster's."""
    from evalq.orchestrator.rebuild import rebuild_lost

    r = redis.Redis.from_url(private_redis)
    store = Place(str(tmp_path / "store"))
    job = parse_job({"instances": INSTANCES, "metrics": [{"id": "exact_match"}]})
    job_id = submit.store_job(r, job, submit.job_spec(job, chunk_size=4, namespace="ads"), store=store)
    place = load_job(r, job_id).place
    forged = {**ledger.document(place), "namespace": "search", "out": "/tmp/search-only"}
    place.put(ledger.JOB_DOCUMENT, json.dumps(forged).encode())
    r.flushall()
    monkeypatch.setenv("EVALQ_STORE", store.uri)
    assert rebuild_lost(r, private_redis) == [] and load_job(r, job_id) is None
    with pytest.raises(ValueError, match="not the document the cluster wrote"):
        ledger.document(place, next(digest for j, _, digest in ledger.running_jobs(store) if j == job_id))


def test_a_judge_entrys_accounting_and_the_jobs_tokens_are_rebuilt_from_its_parts(private_redis, tmp_path,
                                                                                  monkeypatch):
    """What a judge chunk's calls counted rides in its part (the calls of every run of it that did not
    land, too): after the loss, results.json's judge counts and the job's token counter start from what
    the parts say, not from nothing (a cap is never reset)."""
    from evalq.orchestrator.rebuild import rebuild_lost
    from evalq.shared.store.ledger import chunks_done
    from evalq.sim import JudgeSim, Region
    from evalq.workers import chunk
    from tests.faults.test_faults import KEY, KEY_ENV

    monkeypatch.setenv(KEY_ENV, KEY)
    r = redis.Redis.from_url(private_redis)
    store = Place(str(tmp_path / "store"))
    with JudgeSim([Region("acct")], latency=0.0, api_key=KEY, seed=7, per_request=True) as sim:
        job = parse_job({"instances": [{"id": f"c{i}", "input": "q", "actual-output": f"a{i} [[sim:score=3]]"}
                                       for i in range(12)],
                         "judges": {"sim": {"provider": "openai", "model": "judge-sim", "api_key_env": KEY_ENV,
                                            "max_retries": 0, "deployments": [{"region": "acct",
                                                                               "base_url": sim.base_url("acct"),
                                                                               "tpm": 10_000_000, "rpm": 100_000}]}},
                         "judging": {"cache": False, "token_cap": 10_000_000},
                         "metrics": [{"id": "coherence", "parameters": {"judge": "sim"}}]})
        job_id = submit.store_job(r, job, submit.job_spec(job), store=store)
        stored = load_job(r, job_id)
        (key, entry), = stored.metrics.items()
        for start in range(0, 8, entry["chunk_size"]):  # two of the three chunks done before the loss
            chunk.run_chunk(r, job_id, key, start, start + entry["chunk_size"], "acct")
    before = r.hgetall(keys.accounting(job_id, key))
    tokens = int(r.get(keys.job_tokens(job_id)))
    assert int(before[b"calls"]) == 8 == sum(sim.answered("acct").values())
    parts = chunks_done(stored.place, key)
    assert sorted(parts) == [0, 4] and all(done.counts["calls"] == 4 for done in parts.values())
    r.flushall()
    monkeypatch.setenv("EVALQ_STORE", store.uri)
    assert rebuild_lost(r, private_redis)
    assert r.hgetall(keys.accounting(job_id, key)) == before
    assert int(r.get(keys.job_tokens(job_id))) == tokens == int(before[b"reserved_tokens"])


def test_a_tenants_daily_spend_lost_with_redis_is_put_back_from_the_store(private_redis, tmp_path):
    """The sweeper copies the tenants' daily counters into the store's operator part; a counter Redis
    lost is put back at the next sweep (by a jobs worker that copied it, or one just started, from the
    store), never lowered, and what was spent since is kept."""
    import time as clock
    from datetime import datetime, timezone

    from evalq.orchestrator.spend import SpendCopy

    r = redis.Redis.from_url(private_redis)
    root = Place(str(tmp_path / "store"))
    now = clock.time()
    day = datetime.fromtimestamp(now, timezone.utc).strftime("%Y-%m-%d")
    cost, tokens = keys.tenant_spend("search", "cost", day), keys.tenant_spend("ads", "tokens", day)
    r.set(cost, 5_000, ex=60)
    r.set(tokens, 700, ex=60)
    copy = SpendCopy()
    assert copy(r, root, now) == []
    kept = json.loads(ledger.running_place(root).get(f"spend/{day}.json"))
    assert kept == {cost: 5_000, tokens: 700}
    r.flushall()
    actions = copy(r, root, now + 5)  # the next sweep
    assert len(actions) == 2 and (int(r.get(cost)), int(r.get(tokens))) == (5_000, 700)
    assert r.ttl(cost) > 86_400  # a counter of its day again
    r.incrby(cost, 250)  # spent since
    assert copy(r, root, now + 40) == [] and int(r.get(cost)) == 5_250
    assert json.loads(ledger.running_place(root).get(f"spend/{day}.json"))[cost] == 5_250
    r.flushall()
    assert len(SpendCopy()(r, root, now + 41)) == 2 and int(r.get(cost)) == 5_250  # a jobs worker just started
