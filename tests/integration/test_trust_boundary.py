"""The trust boundary, second pass: each attack of an attacker who can put a message on
``evalq.jobs`` (or write a job file) against a cluster configured as the README says:
S3 places and endpoints on the operator's lists only, size limits on every path, a
sweeper no message can blind, callbacks that check again what they write.

Real processes throughout: a private Redis, a jobs worker, moto's S3 server, and a
loopback listener (``Trap``) that must receive nothing."""

from __future__ import annotations

import base64
import gzip
import json
import time
import uuid

import pytest
import redis

from evalq.cli.embedded import EmbeddedRedis
from evalq.shared.cluster import keys
from tests.conftest import evalq, start_worker, stop_worker, wait_for_worker
from tests.integration.test_datasets import AWS, start_moto
from tests.integration.test_jobs_service import await_reply, send
from tests.integration.test_security import Trap
from tests.integration.test_sweeper import wait_for

pytestmark = pytest.mark.integration

INSTANCES = [{"id": f"i{n}", "actual-output": "a b", "expected-output": ["a b"]} for n in range(4)]
EXACT = [{"id": "exact_match"}]
MAX_JOB_BYTES = 100_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A private Redis, moto, and one jobs worker configured as the README says for a
    cluster that takes queue requests: request roots, an S3 endpoint list (moto only),
    an S3 place list, and a small job size limit."""
    import boto3

    base = tmp_path_factory.mktemp("trust")
    (base / "redis").mkdir()
    server = EmbeddedRedis(base / "redis")
    server.start()
    moto, s3_url = start_moto()
    client = boto3.client("s3", endpoint_url=s3_url, aws_access_key_id="testing", aws_secret_access_key="testing",
                          region_name="us-east-1")
    for bucket in ("allowed", "other"):
        client.create_bucket(Bucket=bucket)
    roots = base / "roots"
    roots.mkdir()
    env = {**AWS, "EVALQ_REQUEST_ROOTS": str(roots), "EVALQ_S3_ENDPOINTS": s3_url,
           "EVALQ_S3_PREFIXES": "s3://allowed/in/,s3://allowed/out/", "AWS_ENDPOINT_URL_S3": s3_url,
           "EVALQ_MAX_JOB_BYTES": str(MAX_JOB_BYTES), "EVALQ_SWEEP_INTERVAL": "0"}
    name = f"jobs{uuid.uuid4().hex[:6]}"
    worker = start_worker(server.url, "evalq.jobs,cpu", base, name=name, env=env)
    wait_for_worker(server.url, name)
    yield {"url": server.url, "s3_url": s3_url, "s3": client, "roots": roots, "worker": worker,
           "r": redis.Redis.from_url(server.url)}
    stop_worker(worker)
    moto.terminate()
    moto.wait(10)
    server.stop()


@pytest.fixture
def trap():
    t = Trap()
    yield t
    t.close()


def ask(cluster, **request) -> dict:
    reply_to = f"replies:{uuid.uuid4().hex}"
    send(cluster["url"], **request, reply_to=reply_to)
    return await_reply(cluster["r"], reply_to, timeout=60)


def assert_invalid(doc: dict, *fragments: str) -> None:
    assert doc["status"] == "invalid", doc
    text = "\n".join(doc["errors"])
    for fragment in fragments:
        assert fragment in text, text


# 1. S3 endpoints and places ----------------------------------------------------------------

def test_a_dataset_endpoint_not_on_the_list_is_never_contacted(cluster, trap):
    doc = ask(cluster, job={"dataset": {"uri": "s3://v2/credentials/role", "endpoint_url": trap.url,
                                        "format": "jsonl"}, "metrics": EXACT},
              out=str(cluster["roots"] / "out-a"))
    assert_invalid(doc, f"dataset: S3 endpoint {trap.url} is not one this cluster may use",
                   "EVALQ_S3_ENDPOINTS")
    time.sleep(0.5)
    assert trap.received == []  # nothing signed, nothing sent: no key id, no session token


def test_an_output_endpoint_not_on_the_list_is_never_contacted(cluster, trap):
    doc = ask(cluster, job={"instances": INSTANCES, "metrics": EXACT,
                            "output": {"uri": "s3://allowed/out/x/", "endpoint_url": trap.url}})
    assert_invalid(doc, "output: S3 endpoint", "is not one this cluster may use")
    time.sleep(0.5)
    assert trap.received == []


@pytest.mark.parametrize("field", ["dataset", "job_uri", "out"])
def test_a_request_names_only_the_listed_buckets_and_prefixes(cluster, field):
    """The cluster's own role reads and writes only where the operator lists: a bucket
    outside EVALQ_S3_PREFIXES is refused before anything is read, and the reply shows
    nothing of the document there (no field names, no content)."""
    secret = {"AccessKeyId": "AKIA-SECRET-CANARY", "SecretAccessKey": "canary"}
    cluster["s3"].put_object(Bucket="other", Key="secret.jsonl", Body=json.dumps(secret).encode() + b"\n")
    cluster["s3"].put_object(Bucket="other", Key="job.json", Body=json.dumps({"instances": INSTANCES,
                                                                             "metrics": EXACT}).encode())
    request = {"dataset": {"job": {"dataset": {"uri": "s3://other/secret.jsonl"}, "metrics": EXACT},
                           "out": str(cluster["roots"] / "out-b")},
               "job_uri": {"job_uri": "s3://other/job.json", "out": "s3://allowed/out/b/"},
               "out": {"job": {"instances": INSTANCES, "metrics": EXACT}, "out": "s3://other/out/"}}[field]
    doc = ask(cluster, **request)
    assert_invalid(doc, "is not a place this cluster may read or write", "EVALQ_S3_PREFIXES")
    assert "AccessKeyId" not in json.dumps(doc) and "CANARY" not in json.dumps(doc)
    assert "Contents" not in cluster["s3"].list_objects_v2(Bucket="other", Prefix="out/")


def test_a_listed_place_on_the_listed_endpoint_works(cluster):
    cluster["s3"].put_object(Bucket="allowed", Key="in/job.json.gz",
                             Body=gzip.compress(json.dumps({"instances": INSTANCES, "metrics": EXACT}).encode()))
    prefix = f"out/{uuid.uuid4().hex}/"
    doc = ask(cluster, job_uri="s3://allowed/in/job.json.gz", out=f"s3://allowed/{prefix}")
    assert doc["status"] == "done", doc
    listed = {o["Key"] for o in cluster["s3"].list_objects_v2(Bucket="allowed", Prefix=prefix)["Contents"]}
    assert prefix + "results.json" in listed


# 2. One bounded reader for job documents ------------------------------------------------------

def rss_mib(pid: int) -> float:
    import psutil

    proc = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)]) / 2 ** 20


def test_an_inline_job_is_held_to_the_job_size_limit(cluster):
    big = [{"id": f"i{n}", "actual-output": "x" * 1000, "expected-output": ["x"]} for n in range(300)]
    doc = ask(cluster, job={"instances": big, "metrics": EXACT}, out=str(cluster["roots"] / "out-c"))
    assert_invalid(doc, "request.job: larger than 97.7 KiB (EVALQ_MAX_JOB_BYTES)")


def test_a_gzip_bomb_job_uri_stops_at_the_limit(cluster):
    """A small gzip that inflates to 80 MiB is read only up to the limit: answered invalid,
    and the worker's memory does not grow by anything like the inflated size."""
    bomb = gzip.compress(b"[" + b" " * (80 * 2 ** 20) + b"]", compresslevel=9)
    assert len(bomb) < MAX_JOB_BYTES  # the stored object passes the size check; the content must not
    cluster["s3"].put_object(Bucket="allowed", Key="in/bomb.json.gz", Body=bomb)
    before = rss_mib(cluster["worker"].pid)
    doc = ask(cluster, job_uri="s3://allowed/in/bomb.json.gz", out="s3://allowed/out/bomb/")
    assert_invalid(doc, "s3://allowed/in/bomb.json.gz: larger than", "once decompressed (EVALQ_MAX_JOB_BYTES)")
    assert rss_mib(cluster["worker"].pid) - before < 50


def test_a_stored_job_over_the_limit_is_not_read(cluster):
    cluster["s3"].put_object(Bucket="allowed", Key="in/huge.json", Body=b" " * (MAX_JOB_BYTES + 1))
    doc = ask(cluster, job_uri="s3://allowed/in/huge.json", out="s3://allowed/out/huge/")
    assert_invalid(doc, "s3://allowed/in/huge.json: larger than", "not read")


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_deeply_nested_job_file_is_answered_not_stranded(cluster, where):
    deep = ("[" * 45_000 + "]" * 45_000).encode()  # within the size limit, far past the depth
    if where == "local":
        path = cluster["roots"] / "deep.json"
        path.write_bytes(deep)
        uri = str(path)
    else:
        cluster["s3"].put_object(Bucket="allowed", Key="in/deep.json.gz", Body=gzip.compress(deep))
        uri = "s3://allowed/in/deep.json.gz"
    doc = ask(cluster, job_uri=uri, out=str(cluster["roots"] / "out-d"))
    assert_invalid(doc, "JSON nested deeper than 64 levels (EVALQ_MAX_JSON_DEPTH)")
    assert cluster["r"].get(keys.status(doc["job_id"])) == b"invalid"


def test_a_number_too_long_for_python_is_a_located_error(cluster):
    path = cluster["roots"] / "longnumber.json"
    path.write_text('{"instances": [{"id": ' + "7" * 5000 + ', "actual-output": "a", "expected-output": ["a"]}], '
                    '"metrics": [{"id": "exact_match"}]}')
    doc = ask(cluster, job_uri=str(path), out=str(cluster["roots"] / "out-e"))
    assert_invalid(doc, f"{path}: a number with too many digits")
    proc = evalq("validate", str(path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "too many digits" in proc.stderr


@pytest.mark.parametrize("chunk_size", ["abc", [1], 1e308, 0, -3, True, 10 ** 9])
def test_every_request_field_is_validated_with_a_located_error(cluster, chunk_size):
    doc = ask(cluster, job={"instances": INSTANCES, "metrics": EXACT}, out=str(cluster["roots"] / "out-f"),
              chunk_size=chunk_size)
    assert_invalid(doc, "request.chunk_size: expected a whole number from 1 to 10000")
    assert cluster["r"].llen("cpu") == 0  # nothing enqueued


# 4. A sweeper no message can blind ------------------------------------------------------------

def poison(r: redis.Redis) -> None:
    """A raw message whose body cannot be decoded, with an ETA a year out: on evalq.jobs and
    delivered-unacknowledged (as a worker holding it for its ETA leaves it)."""
    eta = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() + 365 * 86400))
    raw = json.dumps({"body": "%%% not base64 %%%", "content-encoding": "utf-8", "content-type": "application/json",
                      "headers": {"task": "evalq.score_chunk", "id": "poison", "eta": eta},
                      "properties": {"body_encoding": "base64", "delivery_tag": "poison-tag",
                                     "delivery_info": {"exchange": "", "routing_key": "evalq.jobs"}}})
    r.lpush("evalq.jobs", raw)
    r.hset("unacked", "poison-tag", json.dumps([raw, "", "evalq.jobs"]))
    r.hset("unacked", "garbage-tag", b"\xff\x00 not json")


def test_the_sweeper_resumes_a_job_whose_own_messages_were_lost(tmp_path, monkeypatch):
    """Job A's chunks are lost while job B's wait on the same queue, and a poisoned message sits
    on evalq.jobs and in unacked: the sweeper still finds A idle (it reads every message for the
    job its arguments name) and re-sends A's chunks; B is not resumed."""
    from tests.integration.test_sweeper import FAST, N, CHUNK, check_outputs, submit

    monkeypatch.setenv("EVALQ_WINDOW", FAST["EVALQ_WINDOW"])
    (tmp_path / "redis").mkdir()
    server = EmbeddedRedis(tmp_path / "redis")
    server.start()
    r = redis.Redis.from_url(server.url)
    logs = tmp_path / "logs"
    logs.mkdir()
    workers = []
    try:
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        job_a = submit(server.url, tmp_path / "a")
        r.delete("cpu")  # A's chunks are lost
        job_b = submit(server.url, tmp_path / "b")  # B's wait on the shared queue
        assert r.llen("cpu") == N // CHUNK
        poison(r)
        workers.append(start_worker(server.url, "evalq.jobs", logs, concurrency=1, env=FAST, name="jobs"))
        wait_for(lambda: f"job {job_a}: no progress" in workers[0].log_path.read_text(), 60,
                 "the sweeper to resume job A")
        assert f"job {job_b}: no progress" not in workers[0].log_path.read_text()
        assert "skipping a message in unacked that is not a readable task" in workers[0].log_path.read_text()
        assert r.llen("cpu") == 2 * N // CHUNK  # B's, and A's again
        workers.append(start_worker(server.url, "cpu", logs, name="cpu"))
        for job in (job_a, job_b):
            wait_for(lambda: r.get(keys.status(job)) == b"done", 60, f"job {job} to end")
    finally:
        for w in workers:
            stop_worker(w)
        server.stop()
    check_outputs(tmp_path / "a" / "out")
    check_outputs(tmp_path / "b" / "out")


def test_idleness_is_read_from_the_jobs_own_messages(redis_url):
    """A unit of the sweeper against a real Redis: base64 and plain bodies are read, an
    unreadable message counts for no job, another job's message does not make a job busy."""
    from evalq.orchestrator.broker import busy_jobs
    from evalq.orchestrator.app import client_app

    r = redis.Redis.from_url(redis_url)
    queue = f"cpu-test-{uuid.uuid4().hex[:6]}"
    client_app(redis_url).send_task("evalq.score_chunk", args=("jobA", "m", 0, 4), queue=queue)
    plain = json.dumps({"body": json.dumps([["jobC", "m", 0, 4], {}, {}]), "headers": {"task": "evalq.score_chunk"},
                        "properties": {}})
    r.rpush(queue, plain, b"\x00garbage", json.dumps({"body": base64.b64encode(b"[[\"jobX\"]").decode(),
                                                       "headers": {"task": "other.task"},
                                                       "properties": {"body_encoding": "base64"}}))
    try:
        assert busy_jobs(r, {queue}, {"jobA", "jobB", "jobC", "jobX"}) == {"jobA", "jobC"}
    finally:
        r.delete(queue)


# 5. Callbacks check again what they write -------------------------------------------------------

@pytest.mark.parametrize("target", ["local", "s3"])
def test_a_forged_destination_is_refused_by_the_final_callback(cluster, trap, target):
    """A spec in Redis with ``out`` outside the roots (or an S3 endpoint off the list), and an
    ``evalq.finalize`` message: the callback writes nothing there; the job fails saying why,
    and the outputs go to the operator's fallback directory under the first root."""
    from evalq.orchestrator import submit as submitting
    from evalq.shared.job.schema import parse_job
    from evalq.orchestrator.app import client_app

    r = cluster["r"]
    job = parse_job({"instances": INSTANCES, "metrics": EXACT})
    spec = submitting.job_spec(job, out=str(cluster["roots"] / "fine"))
    forged = f"/tmp/evalq-forged-{uuid.uuid4().hex}"
    if target == "local":
        spec["out"] = forged
    else:
        spec["out"], spec["out_endpoint_url"] = "s3://allowed/out/forged/", trap.url
    job_id = submitting.store_job(r, job, spec)
    client_app(cluster["url"]).send_task("evalq.finalize", args=(job_id,), queue="evalq.control")
    wait_for(lambda: r.get(keys.status(job_id)) in (b"failed", b"done"), 60, "the final callback")
    error = r.get(keys.error(job_id)).decode()
    assert r.get(keys.status(job_id)) == b"failed" and "not written there" in error, error
    assert ("EVALQ_REQUEST_ROOTS" if target == "local" else "EVALQ_S3_ENDPOINTS") in error
    assert not __import__("os").path.exists(forged) and trap.received == []
    assert (cluster["roots"] / "evalq-fallback" / job_id / "results.json").is_file()


def test_garbage_on_a_queue_is_dropped_and_the_worker_goes_on(cluster):
    """Before: one raw LPUSH whose body was not base64 stopped the worker ("Unrecoverable
    error"). Now each unreadable shape is dropped with a warning and the next request is served."""
    r = cluster["r"]
    good = json.loads(json.dumps({"body": "%%%", "headers": {"task": "evalq.submit_job"},
                                  "properties": {"body_encoding": "base64", "delivery_tag": "t1",
                                                 "delivery_info": {"exchange": "", "routing_key": "evalq.jobs"}}}))
    for raw in (b"not json at all", b"123", b'{"no": "body"}', json.dumps(good)):
        r.lpush("evalq.jobs", raw)
    doc = ask(cluster, job={"instances": INSTANCES, "metrics": EXACT}, out=str(cluster["roots"] / "out-g"))
    assert doc["status"] == "done", doc
    assert cluster["worker"].poll() is None  # still running
    assert "dropped a message that is not a readable task" in cluster["worker"].log_path.read_text()


@pytest.mark.parametrize("request_id", [{"a": 1}, "x" * 201, "", True])
def test_a_request_id_that_is_no_key_is_answered_invalid(cluster, request_id):
    doc = ask(cluster, job={"instances": INSTANCES, "metrics": EXACT}, out=str(cluster["roots"] / "out-h"),
              request_id=request_id)
    assert_invalid(doc, "request.request_id: expected a string (or whole number) of 1 to 200 characters")
