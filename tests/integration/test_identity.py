"""A tenant is established by the cluster, not claimed in the request (issue 31): each tenant the
operator lists writes its requests to a queue of its own, evalq.jobs.<tenant>, which Redis 6 ACL
users (made by `evalq tenants acl --apply`) can write only for themselves; the jobs role reads the
tenant off the queue. Real Redis with real ACL users, a real jobs worker, plain Celery clients as a
pipeline in any language would be."""

from __future__ import annotations

import json
import time
import uuid

import pytest
import redis
from celery import Celery

from evalq.shared.cluster import keys
from tests.conftest import evalq, start_worker, stop_worker, wait_for_worker

pytestmark = pytest.mark.integration

TENANTS = ("search=2,ads=1;ads.max_priority=normal;ads.suites=ads-*;ads.job_cost=2.5;ads.job_tokens=50000;"
           "ads.job_staged=4000")
JOB = {"instances": [{"id": f"i{k}", "actual-output": "a", "expected-output": ["a"]} for k in range(4)],
       "metrics": [{"id": "exact_match"}]}


def client(url: str, user: str | None = None, password: str | None = None) -> Celery:
    if user:
        url = url.replace("redis://", f"redis://{user}:{password}@")
    app = Celery(broker=url)
    app.conf.update(task_serializer="json", accept_content=["json"], broker_connection_retry_on_startup=False,
                    broker_connection_max_retries=0)
    return app


def reply(r: redis.Redis, reply_to: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while (got := r.blpop([reply_to], timeout=2)) is None:
        assert time.monotonic() < deadline, f"no reply on {reply_to}"
    return json.loads(got[1])


@pytest.fixture(scope="module")
def cluster(module_redis, tmp_path_factory):
    """One cluster for the module (its tests' requests have reply lists, folders and request ids of
    their own: issue 76 shares it instead of starting one a test)."""
    yield from _cluster(module_redis, tmp_path_factory.mktemp("identity"))


def _cluster(private_redis: str, tmp_path):
    r = redis.Redis.from_url(private_redis)
    # the tenants' ACL users, as the operator makes them (compose's and k8s's tenant-acl run the same)
    env = {"EVALQ_TENANTS": TENANTS, "EVALQ_TENANT_PASSWORD_ADS": "ads-secret",
           "EVALQ_TENANT_PASSWORD_SEARCH": "search-secret"}
    shown = evalq("tenants", "acl", env=env)
    assert shown.returncode == 0 and "user ads reset on >*** ~evalq.jobs.ads" in shown.stdout, shown.stderr
    assert "ads-secret" not in shown.stdout
    made = evalq("tenants", "acl", "--apply", "--broker", private_redis, env=env)
    assert made.returncode == 0, made.stderr
    missing = evalq("tenants", "acl", env={"EVALQ_TENANTS": TENANTS})
    assert missing.returncode == 2 and "EVALQ_TENANT_PASSWORD_ADS: not set" in missing.stderr
    logs = tmp_path / "logs"
    logs.mkdir()
    worker = start_worker(private_redis, "evalq.jobs,cpu", logs, concurrency=1, name="jobs",
                          env={"EVALQ_TENANTS": TENANTS, "EVALQ_REQUEST_ROOTS": str(tmp_path)})
    try:
        wait_for_worker(private_redis, "jobs")
        yield {"url": private_redis, "r": r, "tmp": tmp_path}
    finally:
        stop_worker(worker)


def ask(cluster, app: Celery, queue: str, whose: str, **request) -> dict:
    """A request on ``queue`` answered on the tenant's own reply list, writing into its own part
    of the request root (each tenant reaches only <root>/<tenant>: test_tenant_attacks)."""
    reply_to = f"replies:{whose}:{uuid.uuid4().hex}"
    app.send_task("evalq.submit_job", queue=queue, kwargs={
        "job": JOB, "out": str(cluster["tmp"] / whose / uuid.uuid4().hex), "reply_to": reply_to, **request})
    return reply(cluster["r"], reply_to)


def tenant_of(cluster, job_id: str) -> str:
    return json.loads(cluster["r"].get(keys.spec(job_id)))["scheduling"]["tenant"]


def test_a_tenant_writes_only_its_own_queue_and_is_that_tenant(cluster):
    ads = client(cluster["url"], "ads", "ads-secret")
    done = ask(cluster, ads, "evalq.jobs.ads", "ads", suite="ads-nightly")
    assert done["status"] == "done" and tenant_of(cluster, done["job_id"]) == "ads"
    # claiming another tenant on its own queue is refused, saying whose queue it is
    claimed = ask(cluster, ads, "evalq.jobs.ads", "ads", tenant="search")
    assert claimed["status"] == "invalid" and "the queue of tenant 'ads'" in claimed["errors"][0], claimed
    # Redis itself refuses it another tenant's queue, and another tenant's replies
    with pytest.raises(Exception, match="no permissions"):
        ads.send_task("evalq.submit_job", queue="evalq.jobs.search", kwargs={"job": JOB})
    assert cluster["r"].llen("evalq.jobs.search") == 0
    as_ads = redis.Redis.from_url(cluster["url"].replace("redis://", "redis://ads:ads-secret@"))
    with pytest.raises(redis.exceptions.NoPermissionError):
        as_ads.lpop("replies:search:anything")
    with pytest.raises(redis.exceptions.NoPermissionError):
        as_ads.get(keys.spec(done["job_id"]))
    # nor another database (where its own queue's name is anyone's), nor what every tenant does
    # (INFO's key counts and clients), nor the connections' names
    for command in (("SELECT", 5), ("INFO",), ("INFO", "keyspace"), ("CLIENT", "SETNAME", "search"),
                    ("CLIENT", "LIST"), ("DBSIZE",), ("KEYS", "*")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            as_ads.execute_command(*command)
    other_db = redis.Redis.from_url(cluster["url"].replace("redis://", "redis://ads:ads-secret@")[:-1] + "5")
    with pytest.raises(redis.exceptions.RedisError, match="(?i)permission"):  # redis-py SELECTs it first
        other_db.lpush("evalq.jobs.ads", "x")


def test_the_shared_queue_is_the_default_tenants(cluster):
    """Before: a message on evalq.jobs could call itself any tenant ('ads' capped at 5% escaped as
    'ads-2'). Once the operator lists tenants, a request there is the default tenant's."""
    shared = client(cluster["url"])
    for claim, said in (("ads", "tenant 'ads' submits on its own queue evalq.jobs.ads"),
                        ("ads-2", "'ads-2' is not a tenant the operator lists")):
        doc = ask(cluster, shared, "evalq.jobs", "default", tenant=claim)
        assert doc["status"] == "invalid" and said in doc["errors"][0], doc
    doc = ask(cluster, shared, "evalq.jobs", "default")
    assert doc["status"] == "done" and tenant_of(cluster, doc["job_id"]) == "default"


def test_priority_is_capped_by_the_tenant_and_request_ids_are_the_tenants(cluster):
    ads, search = client(cluster["url"], "ads", "ads-secret"), client(cluster["url"], "search", "search-secret")
    high = ask(cluster, ads, "evalq.jobs.ads", "ads", priority="high")
    assert high["status"] == "invalid" and "tenant 'ads' may use at most 'normal'" in high["errors"][0], high
    assert ask(cluster, search, "evalq.jobs.search", "search", priority="high")["status"] == "done"
    # the same request_id in two tenants: two requests, two jobs, neither answered with the other's
    one = ask(cluster, ads, "evalq.jobs.ads", "ads", request_id="nightly-2026-11-25", suite="ads-nightly")
    two = ask(cluster, search, "evalq.jobs.search", "search", request_id="nightly-2026-11-25")
    assert one["status"] == two["status"] == "done" and one["job_id"] != two["job_id"]
    assert (tenant_of(cluster, one["job_id"]), tenant_of(cluster, two["job_id"])) == ("ads", "search")


def test_a_tenant_writes_only_its_suites_and_spends_at_most_its_per_job_limits(cluster):
    """Before: any message wrote into any suite (one forged run alerted another team), and cost caps
    were the job's alone. A tenant's suites are the patterns the operator gives it, and its jobs'
    cost and token caps are at most the operator's (a job's own only tighten them)."""
    ads = client(cluster["url"], "ads", "ads-secret")
    other = ask(cluster, ads, "evalq.jobs.ads", "ads", suite="rag-nightly")
    assert other["status"] == "invalid" and "tenant 'ads' writes only into ads-*" in other["errors"][0], other
    own = ask(cluster, ads, "evalq.jobs.ads", "ads", suite="ads-nightly")
    assert own["status"] == "done"
    judging = json.loads(cluster["r"].get(keys.spec(own["job_id"])))["judging"]
    assert (judging["cost_cap"], judging["token_cap"]) == (2.5, 50000)
    tighter = ask(cluster, ads, "evalq.jobs.ads", "ads", suite="ads-x",
                  job={**JOB, "judging": {"token_cap": 100}})
    judging = json.loads(cluster["r"].get(keys.spec(tighter["job_id"])))["judging"]
    assert (judging["cost_cap"], judging["token_cap"]) == (2.5, 100)
    search = client(cluster["url"], "search", "search-secret")  # no policy of its own: none applies
    free = ask(cluster, search, "evalq.jobs.search", "search", suite="rag-nightly")
    assert free["status"] == "done"
    assert json.loads(cluster["r"].get(keys.spec(free["job_id"])))["judging"]["cost_cap"] is None


def test_a_tenant_stores_at_most_its_per_job_size(cluster):
    """Issue 59: no tenant fills the broker (or the job store) with one job. A job whose instances
    are more than the tenant's job_staged is answered invalid, saying how big it is and the limit,
    before anything of it is stored; a tenant without that limit stores it."""
    big = {**JOB, "instances": [{"id": f"i{k}", "actual-output": "a" * 40, "expected-output": ["a"]}
                                for k in range(80)]}
    ads = client(cluster["url"], "ads", "ads-secret")
    over = ask(cluster, ads, "evalq.jobs.ads", "ads", suite="ads-big", job=big)
    assert over["status"] == "invalid", over
    said = over["errors"][0]
    assert said.startswith("request.job.instances: 80 instances are ") and "tenant 'ads' may store at most " \
        in said and "ads.job_staged in EVALQ_TENANTS" in said, said
    assert not cluster["r"].exists(keys.instances(over["job_id"])) and not cluster["r"].exists(keys.spec(over["job_id"]))
    assert ask(cluster, ads, "evalq.jobs.ads", "ads", suite="ads-small")["status"] == "done"
    search = client(cluster["url"], "search", "search-secret")
    assert ask(cluster, search, "evalq.jobs.search", "search", job=big)["status"] == "done"
