"""Issue 37: a tenant is who the cluster says it is, all the way down. Each attack is made as the
`ads` team would make it, holding only its own Redis ACL user (made by `evalq tenants acl
--apply`), against a real jobs worker; each test asserts what the victim, `search`, sees.

The attacker writes raw kombu messages onto the one queue it may write, `evalq.jobs.ads`, with
whatever properties, headers and body it likes: that is what a Redis LPUSH permits."""

from __future__ import annotations

import base64
import json
import time
import uuid

import pytest
import redis

from evalq.shared.cluster import keys
from tests.conftest import evalq, start_worker, stop_worker, wait_for_worker
from tests.integration.test_identity import JOB, client, reply

pytestmark = pytest.mark.integration

TENANTS = "search=2,ads=1;ads.max_priority=normal;ads.suites=ads-*"


def raw_request(kwargs: dict, task: str = "evalq.submit_job", routing_key: str = "evalq.jobs.search",
                headers: dict | None = None, args: list | None = None) -> str:
    """A Celery protocol 2 message as kombu's Redis transport stores it, written by hand: its
    delivery_info, delivery tag and headers are whatever the sender says."""
    tid = str(uuid.uuid4())
    body = json.dumps([args or [], kwargs, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}])
    return json.dumps({
        "body": base64.b64encode(body.encode()).decode(), "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {"lang": "py", "task": task, "id": tid, "root_id": tid, "parent_id": None, "group": None,
                    "argsrepr": repr(args or []), "kwargsrepr": "{}", "origin": "search@cluster", "retries": 0,
                    "eta": None, "expires": None, "timelimit": [None, None], "shadow": None, **(headers or {})},
        "properties": {"correlation_id": tid, "reply_to": "", "delivery_mode": 2, "priority": 0,
                       "delivery_info": {"exchange": routing_key, "routing_key": routing_key},
                       "body_encoding": "base64", "delivery_tag": str(uuid.uuid4())}})


@pytest.fixture(scope="module")
def cluster(module_redis, tmp_path_factory):
    """One cluster for the module (its tests' requests have reply lists, folders and request ids of
    their own: issue 76 shares it instead of starting one a test)."""
    yield from _cluster(module_redis, tmp_path_factory.mktemp("attacks"))


def _cluster(private_redis: str, tmp_path):
    r = redis.Redis.from_url(private_redis)
    env = {"EVALQ_TENANTS": TENANTS, "EVALQ_TENANT_PASSWORD_ADS": "ads-secret",
           "EVALQ_TENANT_PASSWORD_SEARCH": "search-secret"}
    made = evalq("tenants", "acl", "--apply", "--broker", private_redis, env=env)
    assert made.returncode == 0, made.stderr
    roots = tmp_path / "roots"
    for tenant in ("ads", "search", "default"):
        (roots / tenant).mkdir(parents=True)
    logs = tmp_path / "logs"
    logs.mkdir()
    worker = start_worker(private_redis, "evalq.jobs,cpu", logs, concurrency=1, name="jobs",
                          env={"EVALQ_TENANTS": TENANTS, "EVALQ_REQUEST_ROOTS": str(roots)})
    try:
        wait_for_worker(private_redis, "jobs")
        yield {"url": private_redis, "r": r, "roots": roots, "worker": worker,
               "ads": redis.Redis.from_url(private_redis.replace("redis://", "redis://ads:ads-secret@")),
               "search": client(private_redis, "search", "search-secret")}
    finally:
        stop_worker(worker)


def spec_of(r: redis.Redis, job_id: str) -> dict:
    return json.loads(r.get(keys.spec(job_id)))


def jobs_with(r: redis.Redis, since: float) -> list[tuple[str, str, list]]:
    """(job id, status, errors) of every job the cluster took after ``since``."""
    found = []
    for job_id, _ in r.zrangebyscore(keys.JOBS, since, "+inf", withscores=True):
        job_id = job_id.decode()
        errors = r.get(keys.error(job_id))
        found.append((job_id, (r.get(keys.status(job_id)) or b"").decode(), json.loads(errors) if errors else []))
    return found


def wait_for_jobs(r: redis.Redis, since: float, n: int, timeout: float = 60) -> list[tuple[str, str, list]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [j for j in jobs_with(r, since) if j[1] in ("done", "invalid", "failed")]
        if len(found) >= n:
            return found
        time.sleep(0.2)
    raise AssertionError(f"fewer than {n} jobs ended: {jobs_with(r, since)}")


def test_a_message_on_ads_queue_is_ads_whatever_it_says(cluster, tmp_path):
    """Before: the jobs role took the tenant from the message's delivery_info.routing_key, which
    the sender writes; `ads` pushed onto its own queue a message saying evalq.jobs.search and was
    taken for `search`: it bound search's request id first (search's real request was then
    answered `conflict` and never ran), wrote into search's suite and jumped the line at `high`."""
    r, ads = cluster["r"], cluster["ads"]
    since = time.time()
    out = cluster["roots"] / "ads" / "forged"
    # routing key, exchange, headers all say search; the body claims nothing
    ads.lpush("evalq.jobs.ads", raw_request({"job": JOB, "out": str(out), "request_id": "nightly-7",
                                             "suite": "ads-nightly"},
                                            headers={"tenant": "search", "origin": "search@pipeline"}))
    # the same, claiming search's suite and a priority ads may not use, and search itself in the body
    for extra in ({"suite": "rag-nightly"}, {"priority": "high"}, {"tenant": "search"}):
        ads.lpush("evalq.jobs.ads", raw_request({"job": JOB, "out": str(out), "suite": "ads-nightly", **extra}))
    ended = wait_for_jobs(r, since, 4)
    by_status = {}
    for job_id, status, errors in ended:
        by_status.setdefault(status, []).append((job_id, errors))
    assert len(by_status.get("done", [])) == 1, ended
    assert spec_of(r, by_status["done"][0][0])["scheduling"]["tenant"] == "ads"
    refusals = " | ".join(e for _, errors in by_status["invalid"] for e in errors)
    assert "tenant 'ads' writes only into ads-*" in refusals
    assert "tenant 'ads' may use at most 'normal'" in refusals
    assert "the queue of tenant 'ads'" in refusals
    # search's own request with the same request id is search's: it runs
    reply_to = f"replies:search:{uuid.uuid4().hex}"
    cluster["search"].send_task("evalq.submit_job", queue="evalq.jobs.search", kwargs={
        "job": JOB, "out": str(cluster["roots"] / "search" / "nightly"), "request_id": "nightly-7",
        "reply_to": reply_to, "suite": "rag-nightly"})
    mine = reply(r, reply_to)
    assert mine["status"] == "done", mine
    assert spec_of(r, mine["job_id"])["scheduling"]["tenant"] == "search"
    assert r.llen("evalq.jobs.search") == 0


def test_a_request_queue_runs_no_other_task(cluster, tmp_path):
    """A tenant may write its queue, so any task there would run with the cluster's rights: a
    stage callback naming search's job (finalize: written early, with what it has), a chunk, or
    Celery's own canvas tasks. The jobs role takes only evalq.submit_job from a request queue."""
    r, ads = cluster["r"], cluster["ads"]
    seen = len(cluster["worker"].log_path.read_text())  # the module's worker: what it logged before this test
    victim = "0123456789abcdef"
    r.set(keys.status(victim), "running")
    for task, args in (("evalq.finalize", [victim]), ("evalq.generated", [victim]),
                       ("evalq.score_chunk", [victim, "0", 0, 1]), ("celery.group", [])):
        ads.lpush("evalq.jobs.ads", raw_request({}, task=task, args=args, routing_key="evalq.jobs.ads"))
    # a real request after them: once it is answered, the ones before it were taken
    ads.lpush("evalq.jobs.ads", raw_request({"job": JOB, "out": str(cluster["roots"] / "ads" / "after"),
                                             "reply_to": "replies:ads:after", "suite": "ads-x"},
                                            routing_key="evalq.jobs.ads"))
    assert reply(r, "replies:ads:after")["status"] == "done"
    assert r.get(keys.status(victim)) == b"running"
    log = cluster["worker"].log_path.read_text()[seen:]
    assert log.count("a request queue carries only evalq.submit_job") == 4, log[-3000:]
    assert "evalq.finalize" in log and "Received task: evalq.finalize" not in log


SEARCH_REQUEST = {"task": "evalq.submit_job", "args": [], "subtask_type": None, "immutable": False,
                  "options": {"queue": "evalq.jobs.search"},
                  "kwargs": {"job": JOB, "out": "/forged/search", "request_id": "nightly-1", "suite": "rag-nightly",
                             "reply_to": "replies:search:nightly"}}


def protocol1_request(kwargs: dict, **fields) -> str:
    """A Celery protocol 1 message (celery-node's TASK_PROTOCOL 1): the task's fields in the body."""
    tid = str(uuid.uuid4())
    body = json.dumps({"task": "evalq.submit_job", "id": tid, "args": [], "kwargs": kwargs, **fields})
    return json.dumps({"body": base64.b64encode(body.encode()).decode(), "content-encoding": "utf-8",
                       "content-type": "application/json", "headers": {},
                       "properties": {"correlationId": tid, "replyTo": "", "body_encoding": "base64",
                                      "delivery_mode": 2, "delivery_tag": tid,
                                      "delivery_info": {"exchange": "", "routing_key": "evalq.jobs.ads"}}})


def test_a_request_runs_nothing_but_itself(cluster, tmp_path):
    """Before: `ads` pushed onto its own queue a request whose embed carried a chain (or callbacks)
    holding an evalq.submit_job signature for evalq.jobs.search; Celery's tracer published it after
    the request returned, with the jobs worker's connection, and it was search's request in every
    respect (its namespace, its suite, its request id bound first). Now a request message is data:
    each canvas form, in both protocols and from Celery's own client, is refused before Celery
    sees it and answered on ads's own list; search sees nothing."""
    from celery import chain, signature

    r, ads = cluster["r"], cluster["ads"]
    seen = len(cluster["worker"].log_path.read_text())  # the module's worker: what it logged before this test
    since = time.time()
    mine = {"job": JOB, "out": str(cluster["roots"] / "ads" / "c"), "suite": "ads-c"}
    forms = {"chain": {"chain": [SEARCH_REQUEST]}, "callbacks": {"callbacks": [SEARCH_REQUEST]},
             "errbacks": {"errbacks": [SEARCH_REQUEST]},
             "chord": {"chord": {**SEARCH_REQUEST, "options": {"queue": "evalq.jobs.eng"}}}}
    for form, embed in forms.items():
        message = json.loads(raw_request({**mine, "reply_to": f"replies:ads:{form}"}, routing_key="evalq.jobs.ads"))
        body = json.loads(base64.b64decode(message["body"]))
        body[2].update(embed)
        message["body"] = base64.b64encode(json.dumps(body).encode()).decode()
        ads.lpush("evalq.jobs.ads", json.dumps(message))
    for form in ("callbacks", "errbacks", "chord"):  # protocol 1's forms
        value = SEARCH_REQUEST if form == "chord" else [SEARCH_REQUEST]
        ads.lpush("evalq.jobs.ads", protocol1_request({**mine, "reply_to": f"replies:ads:p1-{form}"}, **{form: value}))
    # Celery's own client, as a pipeline would write them: link= and a chain
    app = client(cluster["url"], "ads", "ads-secret")
    app.send_task("evalq.submit_job", queue="evalq.jobs.ads", kwargs={**mine, "reply_to": "replies:ads:link"},
                  link=signature("evalq.submit_job", kwargs=SEARCH_REQUEST["kwargs"], queue="evalq.jobs.search"))
    chain(signature("evalq.submit_job", kwargs={**mine, "reply_to": "replies:ads:chained"}, queue="evalq.jobs.ads",
                    app=app),
          signature("evalq.submit_job", kwargs=SEARCH_REQUEST["kwargs"], queue="evalq.jobs.search", app=app,
                    immutable=True)).apply_async()
    # a plain request after them: once it is answered, every one before it was taken
    ads.lpush("evalq.jobs.ads", raw_request({**mine, "reply_to": "replies:ads:after"}, routing_key="evalq.jobs.ads"))
    assert reply(r, "replies:ads:after")["status"] == "done"
    for name in [*forms, "p1-callbacks", "p1-errbacks", "p1-chord", "link", "chained"]:
        doc = reply(r, f"replies:ads:{name}")
        assert doc["status"] == "invalid" and doc["job_id"] is None, (name, doc)
        assert "a request is data: it runs nothing but itself" in doc["errors"][0], (name, doc)
    # what search sees: no job, nothing on its queue or its lists; only ads's one request ran
    ran = jobs_with(r, since)
    assert len(ran) == 1 and spec_of(r, ran[0][0])["scheduling"]["tenant"] == "ads", ran
    assert r.llen("evalq.jobs.search") == 0 and r.llen("replies:search:nightly") == 0
    assert not r.exists(keys.request("search/nightly-1"))
    assert not (tmp_path / "forged").exists()
    log = cluster["worker"].log_path.read_text()[seen:]
    assert log.count("(canvas)") == 9, log[-3000:]


def test_a_request_may_name_only_its_own_reply_lists(cluster):
    """Before: `ads` sent search's request_id with reply_to replies:search:b3, and search's
    pipeline popped the squatter's `done, exact_match 1.0` before its own reply came."""
    r, ads = cluster["r"], cluster["ads"]
    since = time.time()
    ads.lpush("evalq.jobs.ads", raw_request({"job": JOB, "out": str(cluster["roots"] / "ads" / "x"),
                                             "request_id": "b3", "reply_to": "replies:search:b3"}))
    ads.lpush("evalq.jobs.ads", raw_request({"job": JOB, "out": str(cluster["roots"] / "ads" / "y"),
                                             "reply_to": "replies:searchx"}))
    ended = wait_for_jobs(r, since, 2)
    assert all(status == "invalid" for _, status, _ in ended), ended
    errors = " | ".join(e for _, _, errs in ended for e in errs)
    assert "is not a list of tenant 'ads'" in errors and "replies:ads:<name>" in errors
    time.sleep(1)
    assert r.llen("replies:search:b3") == 0 and r.llen("replies:searchx") == 0
    # search's own request with that id and list gets its own answer, the only one there
    cluster["search"].send_task("evalq.submit_job", queue="evalq.jobs.search", kwargs={
        "job": JOB, "out": str(cluster["roots"] / "search" / "b3"), "request_id": "b3",
        "reply_to": "replies:search:b3"})
    got = reply(r, "replies:search:b3")
    assert got["status"] == "done" and got["request_id"] == "b3"
    assert spec_of(r, got["job_id"])["scheduling"]["tenant"] == "search"
    assert r.llen("replies:search:b3") == 0


def test_a_request_writes_and_reads_only_its_tenants_places(cluster):
    """Before: `out` naming search's folder under the shared request roots rewrote search's
    results.json (0.5 -> 1.0). Each tenant's requests now reach <root>/<tenant> only."""
    r, ads, roots = cluster["r"], cluster["ads"], cluster["roots"]
    search_out = roots / "search" / "rag"
    cluster["search"].send_task("evalq.submit_job", queue="evalq.jobs.search", kwargs={
        "job": {**JOB, "instances": [{"id": "a", "actual-output": "x", "expected-output": ["x"]},
                                     {"id": "b", "actual-output": "x", "expected-output": ["y"]}]},
        "out": str(search_out), "reply_to": "replies:search:rag"})
    assert reply(r, "replies:search:rag")["status"] == "done"
    before = (search_out / "results.json").read_bytes()
    (roots / "search" / "data.jsonl").write_text('{"id": "s", "actual-output": "secret", "expected-output": ["s"]}\n')
    since = time.time()
    attempts = [{"job": JOB, "out": str(search_out)},                       # search's folder
                {"job": JOB, "out": str(roots / "ads" / ".." / "search" / "rag")},  # by way of ..
                {"job": JOB, "out": str(roots / "elsewhere")},               # the root itself, not ads's part
                {"job": {**{k: v for k, v in JOB.items() if k != "instances"},  # search's dataset
                         "dataset": {"uri": str(roots / "search" / "data.jsonl")}},
                 "out": str(roots / "ads" / "z")},
                {"job_uri": str(roots / "search" / "data.jsonl"), "out": str(roots / "ads" / "z")}]
    for n, kwargs in enumerate(attempts):
        ads.lpush("evalq.jobs.ads", raw_request({**kwargs, "reply_to": f"replies:ads:{n}"}))
    for n in range(len(attempts)):
        doc = reply(r, f"replies:ads:{n}")
        assert doc["status"] == "invalid", (n, doc)
        said = " ".join(doc["errors"])
        assert "outside the directories this cluster" in said and str(roots / "ads") in said, (n, doc)
        assert str(roots / "search") + ")" not in said and str(roots) + ")" not in said
        assert "secret" not in json.dumps(doc)
    assert (search_out / "results.json").read_bytes() == before
    # its own part of the root is its to write
    ads.lpush("evalq.jobs.ads", raw_request({"job": JOB, "out": str(roots / "ads" / "mine"),
                                             "reply_to": "replies:ads:mine", "suite": "ads-mine"}))
    assert reply(r, "replies:ads:mine")["status"] == "done"
    assert (roots / "ads" / "mine" / "results.json").exists()


def test_a_link_in_a_tenants_own_folder_reads_nothing_outside_it(cluster, tmp_path):
    """Before: an OTLP dataset that was ads's own folder (or a glob in it, or {t,u} alternatives)
    holding x.jsonl -> ../search/traces/secret.jsonl was read and scored; aimed at an operator file
    outside every root, the answer "y.jsonl line 2: not JSON" told its structure. Each file a
    folder walk, glob or alternative finds is now resolved inside the tenant's roots first; one
    outside is refused unread, and the answer names the link, nothing of what it leads to."""
    r, ads, roots = cluster["r"], cluster["ads"], cluster["roots"]
    (roots / "search" / "traces").mkdir()
    (roots / "search" / "traces" / "secret.jsonl").write_text('{"resourceSpans": [{"secret": "search-only"}]}\n')
    operator = tmp_path / "operator.conf"  # outside every root
    operator.write_text("password = hunter2\nnot json at all\n")
    folder = roots / "ads" / "traces"
    (folder / "t").mkdir(parents=True)
    (folder / "u").mkdir()
    (folder / "t" / "x.jsonl").symlink_to(roots / "search" / "traces" / "secret.jsonl")
    (folder / "u" / "y.jsonl").symlink_to(operator)
    metrics = [{"id": "exact_match"}]
    for n, uri in enumerate([str(folder), str(folder / "*" / "*.jsonl"), str(folder / "{t,u}"),
                             str(folder / "u")]):
        ads.lpush("evalq.jobs.ads", raw_request({
            "job": {"dataset": {"uri": uri, "format": "otlp"}, "metrics": metrics},
            "out": str(roots / "ads" / f"o{n}"), "reply_to": f"replies:ads:link{n}"}))
    for n in range(4):
        doc = reply(r, f"replies:ads:link{n}")
        said = json.dumps(doc)
        assert doc["status"] == "invalid" and "is a link to a place outside the directories" in said, (n, doc)
        assert "search-only" not in said and "hunter2" not in said and "not JSON" not in said, (n, doc)
        assert str(roots / "search") not in said and str(operator) not in said, (n, doc)
    # the control: a file of its own that is not OTLP is read, and the answer says how it is wrong
    (folder / "v").mkdir()
    (folder / "v" / "z.jsonl").write_text("not json at all\n")
    ads.lpush("evalq.jobs.ads", raw_request({"job": {"dataset": {"uri": str(folder / "v"), "format": "otlp"},
                                                     "metrics": metrics},
                                             "out": str(roots / "ads" / "ov"), "reply_to": "replies:ads:own"}))
    doc = reply(r, "replies:ads:own")
    assert doc["status"] == "invalid" and "z.jsonl line 1" in json.dumps(doc), doc


def test_a_message_put_back_after_its_worker_died_goes_back_where_it_came_from(private_redis, tmp_path):
    """kombu puts an unacknowledged message back on the queue its routing key names: a forged key
    would move ads's message onto search's queue when the worker taking it died, and it would
    then be search's. The worker records the queue it really took it from. The jobs worker here is
    SIGKILLed while it reads the request's job file (a FIFO that blocks until written)."""
    import os
    import signal

    env = {"EVALQ_TENANTS": TENANTS, "EVALQ_TENANT_PASSWORD_ADS": "ads-secret",
           "EVALQ_TENANT_PASSWORD_SEARCH": "search-secret"}
    assert evalq("tenants", "acl", "--apply", "--broker", private_redis, env=env).returncode == 0
    roots = tmp_path / "roots"
    (roots / "ads").mkdir(parents=True)
    fifo = roots / "ads" / "job.json"
    os.mkfifo(fifo)
    r = redis.Redis.from_url(private_redis)
    ads = redis.Redis.from_url(private_redis.replace("redis://", "redis://ads:ads-secret@"))
    logs = tmp_path / "logs"
    logs.mkdir()
    wenv = {"EVALQ_TENANTS": TENANTS, "EVALQ_REQUEST_ROOTS": str(roots), "EVALQ_VISIBILITY_TIMEOUT": "3"}
    first = start_worker(private_redis, "evalq.jobs,cpu", logs, concurrency=1, name="jobs1", env=wenv)
    workers = [first]
    try:
        wait_for_worker(private_redis, "jobs1")
        ads.lpush("evalq.jobs.ads", raw_request({"job_uri": str(fifo), "out": str(roots / "ads" / "out"),
                                                 "reply_to": "replies:ads:fifo", "suite": "ads-x"}))
        deadline = time.monotonic() + 30
        while not r.hlen("unacked"):
            assert time.monotonic() < deadline, "the jobs worker never took the request"
            time.sleep(0.05)
        entry = json.loads(next(iter(r.hvals("unacked"))))
        assert entry[1:] == ["", "evalq.jobs.ads"]  # what kombu restores by: the queue it came from
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(10)
        workers.append(start_worker(private_redis, "evalq.jobs,cpu", logs, concurrency=1, name="jobs2", env=wenv))
        deadline = time.monotonic() + 60
        while r.hlen("unacked") == 0 or r.llen("evalq.jobs.search"):
            assert r.llen("evalq.jobs.search") == 0, "the message was put back on search's queue"
            assert time.monotonic() < deadline, "the request was never taken again"
            time.sleep(0.05)
        with open(fifo, "w") as pipe:  # the second worker reads the job now
            pipe.write(json.dumps(JOB))
        doc = reply(r, "replies:ads:fifo")
        assert doc["status"] == "done", doc
        assert spec_of(r, doc["job_id"])["scheduling"]["tenant"] == "ads"
        assert r.llen("evalq.jobs.search") == 0
    finally:
        for w in workers:
            stop_worker(w, signal.SIGKILL)


def test_a_model_runners_parameters_are_typed_bounded_and_in_the_tenants_roots(tmp_path):
    """Suspected, and so: HFCausalLM's model_name and max_new_tokens were checked against neither
    the request roots nor a bound, so a request could have a worker load any model on its disk and
    generate without end. A runner declares its parameters (HFCausalLMParams); a queue request's are
    validated under its tenant's roots, as the jobs role does (``parse_request`` with its Reach)."""
    import evalq.workers.runners.hf  # noqa: F401 - the operator's EVALQ_PLUGINS loads it on the cluster
    from evalq.orchestrator.service import parse_request
    from evalq.shared.policy.egress import Reach
    from evalq.shared.core.errors import JobError

    roots = tmp_path / "roots"
    for where in ("ads/model", "search/model", "shared/model"):
        (roots / where).mkdir(parents=True)
    env = {"EVALQ_REQUEST_ROOTS": str(roots), "EVALQ_SHARED_ROOTS": str(roots / "shared")}
    reach = Reach.of("ads", env)

    def request(**parameters) -> dict:
        return {"job": {"instances": [{"id": "a", "input": "q", "expected-output": ["x"]}],
                        "model": {"runner": "evalq.workers.runners.hf:HFCausalLM", "parameters": parameters},
                        "metrics": [{"id": "exact_match"}]}, "out": str(roots / "ads" / "out")}

    for parameters, said in (
            ({"model_name": str(roots / "search" / "model")}, "must lie under the directories its tenant may read"),
            ({"model_name": "/"}, "must lie under the directories its tenant may read"),
            ({"model_name": str(roots / "ads" / "model"), "max_new_tokens": 10**7}, "max_new_tokens: Input should "
             "be less than or equal to 4096"),
            ({"model_name": str(roots / "ads" / "model"), "gguf_file": "../../search/model/m.gguf"}, "gguf_file"),
            ({"model_name": str(roots / "ads" / "model"), "device": "cuda:0; rm"}, "device"),
            ({"model_name": str(roots / "ads" / "model"), "trust_remote_code": True}, "trust_remote_code")):
        with pytest.raises(JobError) as raised:
            parse_request(request(**parameters), reach)
        assert "model.parameters" in str(raised.value) and said in str(raised.value), str(raised.value)
    for own in (roots / "ads" / "model", roots / "shared" / "model"):  # its own, and the operator's shared models
        job, _ = parse_request(request(model_name=str(own), max_new_tokens=32), reach)
        assert job.model.parameters["model_name"] == str(own) and job.model.parameters["max_new_tokens"] == 32


def redis7() -> str | None:
    """A redis-server of version 7 or later on this machine (ACL selectors), or None."""
    import shutil
    import subprocess

    found = shutil.which("redis-server")
    if not found:
        return None
    out = subprocess.run([found, "--version"], capture_output=True, text=True).stdout
    version = out.split("v=", 1)[1].split()[0] if "v=" in out else "0"
    return found if int(version.split(".")[0]) >= 7 else None


@pytest.mark.skipif(redis7() is None, reason="needs a redis-server 7 or later on PATH (Debian's redis-server)")
def test_a_tenants_user_pops_its_replies_and_cannot_push_onto_them(tmp_path, monkeypatch):
    """Issue 70, item 4b. The ACL user's one flat set of rules let the LPUSH a request needs land on
    its reply lists too: `ads` pushed 32 MiB onto replies:ads:* in 0.4 s, kept for ever, and with
    noeviction a full Redis stops every tenant. On Redis 7 the reply lists are a selector of their
    own: popped, never pushed; what the cluster writes there is trimmed and expires."""
    from evalq.cli.embedded import EmbeddedRedis
    from evalq.orchestrator.replies import REPLIES_KEPT, push_reply

    monkeypatch.setenv("EVALQ_REDIS_SERVER", redis7())
    server = EmbeddedRedis(tmp_path)
    server.start()
    try:
        env = {"EVALQ_TENANTS": TENANTS, "EVALQ_TENANT_PASSWORD_ADS": "ads-secret",
               "EVALQ_TENANT_PASSWORD_SEARCH": "search-secret"}
        made = evalq("tenants", "acl", "--apply", "--broker", server.url, env=env)
        assert made.returncode == 0 and "no ACL selectors" not in made.stderr, made.stderr
        r = redis.Redis.from_url(server.url)
        ads = redis.Redis.from_url(server.url.replace("redis://", "redis://ads:ads-secret@"))
        with pytest.raises(redis.exceptions.NoPermissionError):
            ads.lpush("replies:ads:mine", "x" * 1000)
        with pytest.raises(redis.exceptions.NoPermissionError):
            ads.rpush("replies:ads:mine", "x")
        assert ads.lpush("evalq.jobs.ads", "a request") == 1  # its queue, as before
        with pytest.raises(redis.exceptions.NoPermissionError):
            ads.lpush("evalq.jobs.search", "x")
        for k in range(REPLIES_KEPT + 5):  # what the cluster answers there, bounded and expiring
            push_reply(r, "replies:ads:mine", json.dumps({"k": k}), ttl=600)
        assert r.llen("replies:ads:mine") == REPLIES_KEPT and 0 < r.ttl("replies:ads:mine") <= 600
        assert json.loads(ads.blpop(["replies:ads:mine"], timeout=2)[1]) == {"k": 5}
        assert ads.llen("replies:ads:mine") == REPLIES_KEPT - 1
    finally:
        server.stop()
