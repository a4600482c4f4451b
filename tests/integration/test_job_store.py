"""The job store on a real cluster (a private Redis, a jobs and a cpu worker): instances staged
as Parquet parts in a local folder and in S3 (moto in server mode, on loopback), read by the
workers from there, with the same outputs as the same job kept in Redis; and a store that
refuses leaves nothing behind."""

from __future__ import annotations

import json
import os
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis

from evalq.shared.cluster import keys
from evalq.shared.store.place import Place
from tests.conftest import evalq, read_log, running_worker, write_job
from tests.integration.test_datasets import AWS, start_moto

pytestmark = pytest.mark.integration

N = 240


@pytest.fixture(scope="module")
def cluster(module_redis, tmp_path_factory):
    """A private cluster whose workers have the test's AWS keys (for moto), one for the module's tests
    (each has job ids and folders of its own: issue 76 shares it instead of starting one a test)."""
    tmp_path = tmp_path_factory.mktemp("store-cluster")
    workers = []
    try:
        for queues, prefix in (("evalq.jobs", "jobs"), ("cpu", "cpu")):
            workers.append(running_worker(module_redis, queues, tmp_path, prefix, env=AWS))
            next(workers[-1])
        yield module_redis
    finally:
        for worker in workers:
            worker.close()  # stopped


@pytest.fixture
def night_bucket():
    """A real S3 API on loopback (moto in server mode) with a bucket "night": (endpoint, client)."""
    import boto3

    moto, url = start_moto()
    try:
        client = boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                              aws_access_key_id=AWS["AWS_ACCESS_KEY_ID"],
                              aws_secret_access_key=AWS["AWS_SECRET_ACCESS_KEY"])
        client.create_bucket(Bucket="night")
        yield url, client
    finally:
        moto.terminate()
        moto.wait(10)


def qa_job(tmp_path):
    instances = [{"id": f"q{i}", "actual-output": f"answer {i % 7} to {'x' * (i % 50)}",
                  "expected-output": [f"answer {i % 5} to {'x' * (i % 50)}"], "category": f"c{i % 3}"}
                 for i in range(N)]
    return write_job(tmp_path / "job.json", instances,
                     [{"id": "exact_match"}, {"id": "f1_score"}, {"id": "bleu"}])


def folder_of(store, tenant: str, job_id: str):
    """A job's folder in the store: <store>/<tenant>/suite=<suite>/job=<job id>."""
    (found,) = (store / tenant).glob(f"suite=*/job={job_id}")
    return found


def run(job, out, url, env=None):
    done = evalq("run", str(job), "--out", str(out), "--broker", url, "-q", "--chunk-size", "50", env=env)
    assert done.returncode == 0, done.stderr
    return json.loads((out / "run.json").read_text())["job_id"]


def same_outputs(a, b):
    def lines(out):
        return sorted(json.dumps({k: v for k, v in line.items() if k != "elapsed"}, sort_keys=True)
                      for line in read_log(out))

    def results(out):
        return [{k: v for k, v in m.items() if k not in ("timing", "elapsed_time", "compute_time", "regressions")}
                for m in json.loads((out / "results.json").read_text())]

    assert lines(a) == lines(b)
    assert results(a) == results(b)


def test_instances_staged_in_a_local_store_score_as_those_kept_in_redis(cluster, tmp_path):
    job = qa_job(tmp_path)
    kept = run(job, tmp_path / "kept", cluster)
    store = tmp_path / "store"
    staged = run(job, tmp_path / "staged", cluster, env={"EVALQ_STORE": str(store), "EVALQ_STORE_PART_BYTES": "2000"})
    same_outputs(tmp_path / "kept", tmp_path / "staged")
    r = redis.Redis.from_url(cluster)
    assert r.exists(keys.instances(kept)) and not r.exists(keys.instances(staged))
    spec = json.loads(r.get(keys.spec(staged)))
    assert folder_of(store, "default", staged).parent.name == "suite=job"  # the job file's name
    # the dataset's version (issue 75): its table beside the instances in the store, in Redis without one
    version, kept_version = spec["dataset_version"], json.loads(r.get(keys.spec(kept)))["dataset_version"]
    assert version["digest"] == kept_version["digest"] and (version["table"], kept_version["table"]) == ("store", "redis")
    table_bytes = (folder_of(store, "default", staged) / "dataset-version.bin").read_bytes()
    assert table_bytes == r.get(keys.dataset_version(kept)) and len(table_bytes) == 16 * N == 16 * version["n"]
    assert not r.exists(keys.dataset_version(staged))
    parts = sorted((folder_of(store, "default", staged) / "instances").glob("part-*.parquet"))
    assert len(parts) == len(spec["instances"]["starts"]) > 3
    table = pa.concat_tables([pq.read_table(p) for p in parts])
    assert table.column("position").to_pylist() == list(range(N))
    ids = [json.loads(text)["id"] for text in table.column("instance").to_pylist()]
    assert ids == [f"q{i}" for i in range(N)]
    # the item records too: a part per chunk, no res:{M} in Redis, and what pyarrow reads of the
    # parts adds up to results.json
    assert not [k for k in r.scan_iter(f"evalq:{{{staged}}}:res:*")] and r.exists(keys.results(kept, "exact_match@0"))
    assert not r.exists(keys.values(staged, "exact_match@0")) and r.exists(keys.values(kept, "exact_match@0"))
    # what the report needs of each chunk rides in its part too: Redis keeps nothing per item, and the
    # report's worst items are those made from Redis
    assert not r.exists(keys.views(staged, "f1_score@1")) and r.exists(keys.views(kept, "f1_score@1"))

    def worst_items(out):
        return re.findall(r"<details><summary>.*?</summary>", (out / "report.html").read_text())

    assert worst_items(tmp_path / "staged") == worst_items(tmp_path / "kept") and len(worst_items(tmp_path / "kept")) > 5
    records = pa.concat_tables([pq.read_table(p) for p in
                                sorted((folder_of(store, "default", staged) / "records" / "entry=exact_match%400").iterdir())])
    assert sorted(records.column("position").to_pylist()) == list(range(N))
    assert records.column("instance_id").to_pylist() == [f"q{p}" for p in records.column("position").to_pylist()]
    scores = [json.loads(text)["result"] for text in records.column("record").to_pylist()]
    results = {m["metric"]: m for m in json.loads((tmp_path / "staged" / "results.json").read_text())}
    assert sum(scores) / N == pytest.approx(results["exact_match"]["score"]) and results["exact_match"]["n"] == N
    by_category = {c: [json.loads(t)["result"] for t, cat in zip(records.column("record").to_pylist(),
                                                                records.column("category").to_pylist()) if cat == c]
                   for c in ("c0", "c1", "c2")}
    assert {c: sum(v) / len(v) for c, v in by_category.items()} == pytest.approx(
        {c: row["score"] for c, row in results["exact_match"]["categories"].items()})
    # the store read as one dataset, as a month of nights would be: Hive partitions suite, job, entry
    import pyarrow.dataset as ds

    files = [str(f) for f in (store / "default").glob("suite=*/job=*/records/*/*.parquet")]
    night = ds.dataset(files, format="parquet", partitioning="hive", partition_base_dir=str(store / "default")).to_table()
    assert set(zip(night.column("suite").to_pylist(), night.column("job").to_pylist(),
                   night.column("entry").to_pylist())) == {("job", staged, "exact_match@0"), ("job", staged, "f1_score@1"),
                                                           ("job", staged, "bleu@2")}
    assert night.num_rows == 3 * N
    # ... and by DuckDB, as docs/how-to/cluster.md queries it: the typed columns, no json_extract (issue 74)
    import duckdb

    means = dict(duckdb.sql(f"""
        SELECT entry, avg(coalesce(score, TRY_CAST(json_extract(record, '$.result.f1') AS DOUBLE)))
        FROM read_parquet('{store}/default/suite=*/job=*/records/*/*.parquet', hive_partitioning = true)
        WHERE outcome = 'scored' GROUP BY entry""").fetchall())
    assert means == pytest.approx({f"{m['metric']}@{i}": m["score"]["f1"] if isinstance(m["score"], dict) else m["score"]
                                   for i, m in enumerate(json.loads((tmp_path / "staged" / "results.json").read_text()))})
    assert duckdb.sql(f"""SELECT count(*) FROM read_parquet('{store}/default/*/*/records/*/*.parquet')
                          WHERE score IS NULL""").fetchall() == [(N,)]  # f1_score's records: fields, read from record
    # evalq results says where they are
    shown = evalq("results", staged, "--broker", cluster, "--json")
    assert shown.returncode == 0, shown.stderr
    where = json.loads(shown.stdout)
    folder = str(folder_of(store, "default", staged).resolve())
    assert where["store"] == folder and where["out"] == str(tmp_path / "staged")
    assert where["records"]["exact_match@0"] == f"{folder}/records/entry=exact_match%400/chunk-*.parquet"
    listed = evalq("results", kept, "--broker", cluster)
    assert listed.returncode == 0 and "without a job store (EVALQ_STORE)" in listed.stdout, listed.stderr
    unknown = evalq("results", "0123456789abcdef", "--broker", cluster)
    assert unknown.returncode == 2 and "not known to this broker" in unknown.stderr
    # its folder removed (as evalq gc removes it): no globs of parts that are gone (issue 74)
    import shutil

    shutil.rmtree(folder)
    gone = evalq("results", staged, "--broker", cluster)
    assert gone.returncode == 0 and f"store:     {folder} (removed: evalq gc" in gone.stdout, gone.stdout
    assert "records:" not in gone.stdout and "duckdb" not in gone.stdout, gone.stdout
    assert json.loads(evalq("results", staged, "--broker", cluster, "--json").stdout)["removed"] is True


def test_instances_staged_in_s3_score_as_those_kept_in_redis(cluster, tmp_path, night_bucket, monkeypatch):
    from evalq.shared.job.stored import load_job
    from evalq.shared.store import ledger

    url, client = night_bucket
    job = qa_job(tmp_path)
    run(job, tmp_path / "kept", cluster)
    env = {**AWS, "EVALQ_STORE": "s3://night/evalq", "EVALQ_STORE_ENDPOINT_URL": url,
           "EVALQ_STORE_PART_BYTES": "3000"}
    staged = run(job, tmp_path / "staged", cluster, env=env)
    same_outputs(tmp_path / "kept", tmp_path / "staged")
    # the job itself beside its parts, no marker left once it ended, each chunk's rows from its footer
    for name, value in AWS.items():
        monkeypatch.setenv(name, value)
    stored = load_job(redis.Redis.from_url(cluster), staged)
    assert ledger.document(stored.place) == json.loads(stored.to_json())
    assert list(ledger.running_jobs(Place("s3://night/evalq", url))) == []
    assert [sum(done.rows for done in ledger.chunks_done(stored.place, key).values())
            for key in stored.metrics] == [N] * 3
    listed = client.list_objects_v2(Bucket="night", Prefix=f"evalq/default/suite=job/job={staged}/instances/")
    names = sorted(o["Key"] for o in listed["Contents"])
    assert len(names) > 3 and names[0].endswith("part-00000.parquet")
    assert not redis.Redis.from_url(cluster).exists(keys.instances(staged))
    # evalq results asks S3 whether the parts are still there (HEAD), and says when they are not
    there = json.loads(evalq("results", staged, "--broker", cluster, "--json", env=env).stdout)
    assert "removed" not in there and there["store"].startswith("s3://night/evalq/"), there
    client.delete_object(Bucket="night", Key=names[0])
    assert json.loads(evalq("results", staged, "--broker", cluster, "--json", env=env).stdout)["removed"] is True


def test_a_store_that_refuses_fails_the_submission_with_one_line_and_leaves_nothing(cluster, tmp_path):
    (tmp_path / "file").write_text("a file where the store's folder would be")
    job = qa_job(tmp_path)
    r = redis.Redis.from_url(cluster)
    before, specs = r.zcard(keys.JOBS), set(r.scan_iter("evalq:{*}:spec"))
    done = evalq("submit", str(job), "--out", str(tmp_path / "out"), "--broker", cluster,
                 env={"EVALQ_STORE": str(tmp_path / "file" / "store")})
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "cannot write to the job store" in done.stderr and str(tmp_path / "file" / "store") in done.stderr
    assert r.zcard(keys.JOBS) == before  # nothing stored, nothing enqueued
    assert set(r.scan_iter("evalq:{*}:spec")) == specs
    assert not os.path.exists(tmp_path / "file" / "store")


def test_a_night_larger_than_the_brokers_memory_runs_beside_another_tenants_job(cluster, tmp_path):
    """15,000 instances of ~4 kB (60 MB of JSON Lines) on a Redis of 48 MB (noeviction, as Celery
    advises): kept in Redis, it cannot be stored; staged in the job store it runs, and a small job
    of another tenant submitted beside it runs too. (The ratio of a night to its broker, at a quarter
    of the size this test had until issue 76: 240 MB against 256 MB took 34 s of the suite.)"""
    r = redis.Redis.from_url(cluster)
    r.config_set("maxmemory", "48mb")
    r.config_set("maxmemory-policy", "noeviction")
    try:
        _night_beside_a_job(cluster, r, tmp_path)
    finally:  # the module's Redis, as the next test expects it
        r.config_set("maxmemory", "0")


def _night_beside_a_job(cluster, r, tmp_path):
    n = 15_000
    words = "the river crosses a valley where farmers grow wheat barley and grapes under a dry sun".split()
    data = tmp_path / "night.jsonl"
    with open(data, "w") as f:
        for i in range(n):
            context = " ".join(words[(i + k) % len(words)] for k in range(900))[:4400]
            f.write(json.dumps({"id": f"n{i}", "question": f"item {i}?", "context": [context],
                                "answer": f"the bridge {i % 7}", "ground_truth": f"the bridge {i % 5}"}) + "\n")
    night = tmp_path / "night.json"
    night.write_text(json.dumps({"dataset": {"uri": str(data)}, "metrics": [{"id": "exact_match"}]}))
    kept = evalq("submit", str(night), "--out", str(tmp_path / "kept"), "--broker", cluster)
    assert kept.returncode == 1 and "Traceback" not in kept.stderr, kept.stderr
    assert "Redis is full (its maxmemory)" in kept.stderr and "EVALQ_STORE" in kept.stderr, kept.stderr
    assert r.info("memory")["used_memory"] < 12 * 2**20  # what it had stored is gone again
    small = qa_job(tmp_path)
    env = {"EVALQ_STORE": str(tmp_path / "store")}
    big = evalq("submit", str(night), "--out", str(tmp_path / "night"), "--broker", cluster, "--tenant", "ads",
                env=env)
    assert big.returncode == 0, big.stderr
    other = evalq("submit", str(small), "--out", str(tmp_path / "small"), "--broker", cluster,
                  "--tenant", "search", env=env)
    assert other.returncode == 0, other.stderr
    for job_id in (other.stdout.strip(), big.stdout.strip()):
        done = evalq("wait", job_id, "--broker", cluster, timeout=400)
        assert done.returncode == 0, done.stderr
    results = json.loads((tmp_path / "night" / "results.json").read_text())
    assert results[0]["n"] == n and results[0]["score"] == pytest.approx(
        sum((i % 7) == (i % 5) for i in range(n)) / n)
    assert len(read_log(tmp_path / "small")) == 3 * N
    assert folder_of(tmp_path / "store", "ads", big.stdout.strip()) and \
        folder_of(tmp_path / "store", "search", other.stdout.strip())  # each tenant's in its part of the store
    assert r.info("memory")["used_memory"] < 12 * 2**20


def test_chunks_ride_out_a_store_that_is_away_for_a_moment(private_redis, tmp_path):
    """The store's folder gone while the cpu worker starts on the job: its chunks are retried with
    backoff, as on a Redis error, and score every item once the folder is back."""
    import time

    from tests.conftest import stop_worker, start_worker, wait_for_worker

    jobs = running_worker(private_redis, "evalq.jobs", tmp_path, "jobs")
    next(jobs)
    try:
        job = qa_job(tmp_path)
        store = tmp_path / "store"
        submitted = evalq("submit", str(job), "--out", str(tmp_path / "out"), "--broker", private_redis,
                          "--chunk-size", "60", env={"EVALQ_STORE": str(store)})
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted.stdout.strip()
        (store / "default").rename(tmp_path / "away")
        cpu = start_worker(private_redis, "cpu", tmp_path, name="cpuaway")
        try:
            wait_for_worker(private_redis, "cpuaway")
            log = cpu.log_path
            deadline = time.monotonic() + 60
            while b"cannot read from the job store" not in log.read_bytes():
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.1)
            (tmp_path / "away").rename(store / "default")
            done = evalq("wait", job_id, "--broker", private_redis, timeout=120)
            assert done.returncode == 0, done.stderr
        finally:
            stop_worker(cpu)
    finally:
        jobs.close()
    lines = read_log(tmp_path / "out")
    assert len(lines) == 3 * N and not [line for line in lines if "error" in line]


def test_gc_removes_ended_jobs_parts_past_the_cutoff_and_never_a_running_ones(private_redis, tmp_path):
    """Retention is the store's: `evalq gc` removes the folders of jobs that ended (or whose keys
    expired) and whose parts are older than --older-than, and keeps a running job's and newer ones."""
    import time

    r = redis.Redis.from_url(private_redis)
    store = tmp_path / "store"
    old = time.time() - 3 * 86400
    for tenant, job_id, status, when in (("ads", "ended0000000001", "done", old), ("ads", "running000000001", "running", old),
                                          ("search", "expired00000001", None, old), ("ads", "recent000000001", "done", None)):
        folder = store / tenant / "suite=nightly" / f"job={job_id}" / "instances"
        folder.mkdir(parents=True)
        part = folder / "part-00000.parquet"
        part.write_bytes(b"x" * 1024)
        if when is not None:
            os.utime(part, (when, when))
        if status is not None:
            r.set(keys.status(job_id), status)
    env = {"EVALQ_STORE": str(store)}
    dry = evalq("gc", "--older-than", "1", "--dry-run", "--broker", private_redis, env=env)
    assert dry.returncode == 0, dry.stderr
    assert "would remove 2 job folder(s)" in dry.stderr and len(list(store.glob("*/*/job=*"))) == 4
    done = evalq("gc", "--older-than", "1", "--broker", private_redis, env=env)
    assert done.returncode == 0 and "removed 2 job folder(s), 2 KiB; kept 2" in done.stderr, done.stderr
    assert sorted(p.name for p in store.glob("*/*/job=*")) == ["job=recent000000001", "job=running000000001"]
    assert "job expired from Redis" in done.stdout and "job done" in done.stdout
    # the suite folder its last job left empty goes too (issue 74), the tenant's folder stays
    assert not (store / "search" / "suite=nightly").exists() and (store / "search").is_dir()
    assert (store / "ads" / "suite=nightly").is_dir()
    none = evalq("gc", "--broker", private_redis)
    assert none.returncode == 2 and "no job store is named (EVALQ_STORE)" in none.stderr


def test_gc_on_an_s3_store(private_redis, tmp_path, night_bucket):
    url, client = night_bucket
    for job_id in ("ended0000000002", "running000000002"):
        for name in ("instances/part-00000.parquet", "records/entry=bleu%400/chunk-000000000.parquet"):
            client.put_object(Bucket="night", Key=f"evalq/ads/suite=n/job={job_id}/{name}", Body=b"y" * 10)
    redis.Redis.from_url(private_redis).set(keys.status("running000000002"), "running")
    env = {**AWS, "EVALQ_STORE": "s3://night/evalq", "EVALQ_STORE_ENDPOINT_URL": url}
    done = evalq("gc", "--older-than", "0", "--broker", private_redis, env=env)
    assert done.returncode == 0 and "removed 1 job folder(s)" in done.stderr, done.stderr
    left = sorted(o["Key"] for o in client.list_objects_v2(Bucket="night")["Contents"])
    assert left and all("job=running000000002/" in k for k in left) and len(left) == 2
