"""The jobs service: ``evalq.submit_job`` requests on the ``evalq.jobs`` queue.

A pipeline in any language starts a job with one Celery message (task
``evalq.submit_job``, JSON kwargs ``job`` or ``job_uri``, ``out``,
``request_id``, ``reply_to``) and waits on its ``reply_to`` Redis list. The
worker that takes the message validates the job as ``evalq validate`` would,
stores it and sends its first stage; the cluster does the rest.

Crash safety: the message is acknowledged late. Its idempotency key (the
``request_id``, else the message's task id, which a redelivery keeps) is
bound to a job id before anything is stored, so a worker killed while
storing or sending is redelivered onto the same job: what was half-stored
is replaced, what was half-sent continues from its checkpoint.
"""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Any

import redis

from evalq.shared.cluster import keys
from evalq.shared.core.config import CONTROL_QUEUE, JOBS_QUEUE, TENANT_QUEUE_PREFIX, Settings, tenant_of_queue
from evalq.shared.policy.egress import Reach
from evalq.shared.core.errors import InfraError, JobError
from evalq.shared.job.stored import load_job
from evalq.shared.cluster.status import FINAL, Status
from evalq.orchestrator.tenancy import tenant_policy

log = logging.getLogger("evalq.jobs")

REQUEST_FIELDS = ("job", "job_uri", "out", "request_id", "reply_to", "chunk_size", "priority", "tenant", "weight",
                  "suite")
_LIST_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,200}$")
# Keys a reply must never be pushed onto: evalq's own state, kombu's, and the task queues
# (a JSON document on a queue list would be read as a task message).
_RESERVED_PREFIXES = (f"{keys.PREFIX}:", "_kombu.", "unacked", "celery-task-meta-", "judge.", "generate.",
                      TENANT_QUEUE_PREFIX)
_RESERVED_NAMES = {"cpu", "gpu", "celery", JOBS_QUEUE, CONTROL_QUEUE}


REPLIES = "replies"  # a tenant's reply lists: replies:<tenant>:..., which its Redis ACL user may read


def reply_to_problem(name, tenant: str | None = None) -> str | None:
    """Why ``name`` cannot be a reply list, or None. A request (untrusted input)
    picks the list, so it may not be one of the cluster's own keys or queues; and a
    request of ``tenant`` (the cluster lists tenants) only one of that tenant's own,
    ``replies:<tenant>:...``, so it can never push onto another tenant's."""
    if not isinstance(name, str) or not _LIST_NAME.match(name):
        return "request.reply_to: expected a Redis list name of 1 to 200 letters, digits and _ . : -"
    if name in _RESERVED_NAMES or name.startswith(_RESERVED_PREFIXES):
        return f"request.reply_to: {name!r} is one of the cluster's own keys or queues; use a list of your own"
    own = f"{REPLIES}:{tenant}:"
    if tenant is not None and (not name.startswith(own) or len(name) == len(own)):
        return (f"request.reply_to: {name!r} is not a list of tenant {tenant!r}; a request of {tenant!r} is "
                f"answered only on {own}<name>")
    return None


def request_identity(queue: str | None, tenants) -> tuple[str | None, str | None]:
    """(tenant, problem) of a request taken from ``queue``, the queue the worker really consumed
    it from (``evalq.orchestrator.app.stamp_consumed_queue``; None where that is not known). The
    tenant is the queue's: ``evalq.jobs.<tenant>``, or on the shared ``evalq.jobs`` the default
    tenant once the operator lists tenants (None: no tenants, a single team's cluster). Nothing
    the message says of itself (routing key, headers, body) is evidence."""
    if queue is None:
        return None, ("request: this worker does not know which queue the request came on, so it cannot tell "
                      "whose it is; requests are taken only by `evalq worker`")
    if queue != JOBS_QUEUE and not queue.startswith(TENANT_QUEUE_PREFIX):
        return None, f"request: came on {queue!r}; evalq.submit_job is taken only from {JOBS_QUEUE} and " \
                     f"{TENANT_QUEUE_PREFIX}<tenant>"
    tenant = tenant_of_queue(queue)
    if tenant is not None and tenants.names and tenant not in tenants.names:
        return None, f"request: came on {queue!r}, the queue of {tenant!r}, which is not a tenant the operator lists"
    if tenant is None and tenants.names:
        tenant = "default"
    return tenant, None


# Bind an idempotency key to a job id, to the message that bound it and to what that request
# asked (its fingerprint), at once: a second request with the key is told from this message
# redelivered while its job is being stored, and a different job sent with the key is told apart.
_BIND = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[3]) then
  redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[3])
  redis.call('SET', KEYS[3], ARGV[4], 'EX', ARGV[3])
  return 1
end
return 0
"""


def request_id_problem(value) -> str | None:
    if value is None or (isinstance(value, (str, int)) and not isinstance(value, bool) and 0 < len(str(value)) <= 200):
        return None
    return "request.request_id: expected a string (or whole number) of 1 to 200 characters"


def handle_request(app, r: redis.Redis, message_id: str, broker_url: str, queue: str | None = None,
                   **request: Any) -> dict:
    """``queue``: the one the request came on (evalq.jobs.<tenant> establishes its tenant)."""
    from evalq.orchestrator import submit
    from evalq.shared.cluster.scheduling import Tenants
    from evalq.shared.store.place import StoreUnavailable

    ttl = Settings.from_env().result_ttl
    tenants = Tenants.from_env()
    tenant, bad_queue = request_identity(queue, tenants)
    identity = tenant_of_queue(queue) if not bad_queue else None  # a tenant's own queue
    request_id = request.get("request_id")
    reply_to = request.get("reply_to")
    bad_reply_to = reply_to_problem(reply_to, tenant) if reply_to is not None else None
    if bad_reply_to or bad_queue:
        reply_to = None  # nothing is pushed to it, not even the answer "invalid"
    bad_request_id = request_id_problem(request_id)
    if bad_request_id:
        request_id = None  # not an idempotency key: the message id is
    # a request_id (and a message id) is its tenant's: two tenants' "nightly-2026-11-25" are two
    # requests, and one tenant's message can never be taken for another's redelivered
    idem = keys.request_binding(tenant, request_id, message_id)
    job_id = submit.new_job_id()
    fingerprint = request_fingerprint(request)
    fresh = r.eval(_BIND, 3, idem, f"{idem}:owner", f"{idem}:fingerprint", job_id, message_id, ttl, fingerprint)
    if fresh:  # unknown to Redis: a job store may know it (Redis lost the job, not yet rebuilt)
        from evalq.orchestrator.rebuild import rebound

        earlier = rebound(r, broker_url, idem)
        if earlier is not None:
            return _answer_rebound(r, earlier, idem, message_id, fingerprint, ttl, {**request, "reply_to": reply_to})
    else:
        job_id = r.get(idem).decode()
        owner = r.get(f"{idem}:owner")
        bound = r.get(f"{idem}:fingerprint")
        if request_id is not None and owner is not None and owner.decode() != message_id and \
                bound is not None and bound.decode() != fingerprint:
            return _answer_conflict(r, idem, message_id, request_id, reply_to, ttl)
        spec = load_job(r, job_id)
        status = (r.get(keys.status(job_id)) or b"").decode()
        if status == Status.INVALID or (owner is not None and owner.decode() != message_id):
            # another request with the same id (the first may still be storing its job):
            # answered with the first job when it ends, never started again
            return _answer_duplicate(r, job_id, message_id, {**request, "reply_to": reply_to})
        if spec is not None:
            if request_id is not None and spec.message_id != message_id:
                # another request with the same id: answered with the first job, not started again
                return _answer_duplicate(r, job_id, message_id, {**request, "reply_to": reply_to})
            # this very message, redelivered: carry on where the first delivery stopped
            log.info("job %s: request redelivered; continuing its submission", job_id)
            submit.start(r, broker_url, job_id, spec)
            return {"job_id": job_id, "status": status or Status.RUNNING}
        log.info("job %s: request redelivered before the job was stored; storing it again", job_id)
    try:
        if bad_queue or bad_reply_to or bad_request_id:
            raise JobError([p for p in (bad_queue, bad_reply_to, bad_request_id) if p])
        job, out = _readable(parse_request, request, Reach.of(tenant))
        tenant_policy(job, identity, tenants)
        from evalq.orchestrator.once import only_unscored

        only_unscored(r, job, job_id, tenant)  # a trace dataset: the spans no earlier run of the suite took
        # namespace: the final callback writes only into this tenant's places
        spec = _readable(submit.job_spec, job, request.get("chunk_size"), out, request_id, reply_to, tenant, message_id,
                         fingerprint)
    except JobError as exc:
        errors = list(exc.problems)
        _answer_ended(r, job_id, message_id, request_id, reply_to, request.get("out"), Status.INVALID, errors, ttl)
        log.warning("request %s: invalid job: %s", request_id or message_id, "; ".join(errors[:3]))
        return {"job_id": job_id, "status": Status.INVALID, "errors": errors}
    try:
        submit.store_job(r, job, spec, job_id=job_id)
    except StoreUnavailable as exc:
        # the job store refused it (a full disk, an S3 endpoint away, a link in a tenant's folder): the
        # request is answered, never left waiting for a job that does not exist. (Redis away is an
        # InfraError of its own: the message is redelivered, acknowledged late, and answered then.)
        errors = [f"request: the job could not be stored: {exc}"]
        _answer_ended(r, job_id, message_id, request_id, reply_to, request.get("out"), Status.FAILED, errors, ttl)
        log.warning("request %s: not stored: %s", request_id or message_id, exc)
        return {"job_id": job_id, "status": Status.FAILED, "errors": errors}
    submit.start(r, broker_url, job_id, spec)
    log.info("job %s: submitted (%d instances, %d metric entries)", job_id, len(job.instances), len(job.metrics))
    return {"job_id": job_id, "status": Status.RUNNING}


def _answer_rebound(r: redis.Redis, job, idem: str, message_id: str, fingerprint: str, ttl: int,
                    request: dict) -> dict:
    """A request whose job the store knew (rebuilt just now): the same message is the job's own,
    another with its request id a duplicate (or a conflict), as if Redis had never lost it."""
    if job.message_id != message_id:
        if job.request_fingerprint is not None and job.request_fingerprint != fingerprint:
            return _answer_conflict(r, idem, message_id, request.get("request_id"), request.get("reply_to"), ttl)
        return _answer_duplicate(r, job.job_id, message_id, request)
    return {"job_id": job.job_id, "status": (r.get(keys.status(job.job_id)) or b"").decode() or Status.RUNNING}


def _answer_ended(r: redis.Redis, job_id: str, message_id: str, request_id, reply_to: str | None, out,
                  status: str, errors: list[str], ttl: int) -> None:
    """A request that ended before its job started (``invalid``, or ``failed`` to be stored): its
    status and reasons, and its answer on ``reply_to``, marked so that a redelivery of the message
    gets nothing more."""
    from evalq.orchestrator.replies import reply_document, reply_ops, request_key

    # one transaction: a reader never sees the status without its reasons
    pipe = r.pipeline(transaction=True)
    pipe.set(keys.error(job_id), json.dumps(errors), ex=ttl)
    pipe.set(keys.status(job_id), status, ex=ttl)
    pipe.zadd(keys.JOBS, {job_id: time.time()})
    pipe.execute()
    if reply_to:  # answered and marked at once: a redelivery of this message gets nothing more
        pipe = r.pipeline(transaction=True)
        reply_ops(pipe, reply_to, json.dumps(reply_document(request_id, job_id, status, out, errors, None)), ttl)
        pipe.sadd(keys.replied(job_id), request_key(message_id))
        pipe.expire(keys.replied(job_id), ttl)
        pipe.execute()


# The fields of a request that say which job it asks for: a repeat of a request_id must ask for the
# same (``out`` and ``reply_to`` may differ, as ever: a repeat is answered with the first job's document).
FINGERPRINT_FIELDS = ("job", "job_uri", "chunk_size", "priority", "tenant", "weight", "suite")
CONFLICT = "conflict"  # the answer to a request_id already bound to a different request


def request_fingerprint(request: dict) -> str:
    import hashlib

    asked = {k: request.get(k) for k in FINGERPRINT_FIELDS}
    text = json.dumps(asked, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=repr)
    return hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()


def _answer_conflict(r: redis.Redis, idem: str, message_id: str, request_id, reply_to: str | None, ttl: int) -> dict:
    """A request whose request_id is bound to a different request (another job, suite,
    scheduling): nothing starts, and its reply_to is answered ``conflict``, once, with nothing
    of the other job (neither its id nor its results)."""
    from evalq.orchestrator.replies import push_reply, reply_document

    error = (f"request.request_id: {str(request_id)[:200]!r} is already bound to a different request (another "
             "job, suite or scheduling was sent with it first); nothing was started for this one: use a new "
             "request_id, or send the same request again")
    if reply_to and r.set(f"{idem}:conflict:{message_id}", 1, nx=True, ex=ttl):
        push_reply(r, reply_to, json.dumps(reply_document(request_id, None, CONFLICT, None, [error], None)), ttl)
    log.warning("request %s: conflicts with the request that first used its id; not started", request_id)
    return {"job_id": None, "status": CONFLICT, "errors": [error]}


def _readable(step, *args):
    """Run a step of reading a request; whatever it raises that is not a located
    problem (RecursionError, a library's ValueError, ...) still answers the request
    ``invalid`` with the reason, so no request is left without a reply or a status."""
    try:
        return step(*args)
    except JobError:
        raise
    except InfraError as exc:  # S3 unreachable, say: the pipeline is told, not left waiting
        raise JobError(f"request: could not be read: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - untrusted input: any failure is the request's
        log.warning("request could not be read", exc_info=True)
        raise JobError(f"request: could not be read: {type(exc).__name__}: {str(exc)[:200]}") from None


def _answer_duplicate(r: redis.Redis, job_id: str, message_id: str, request: dict) -> dict:
    """A second request with a known ``request_id``: no new job. Its ``reply_to``
    (whichever list, the first's too) gets the end document: now if the job has
    ended, else when it ends; a redelivery of this message gets nothing more."""
    from evalq.orchestrator.replies import reply_targets_add, replay

    reply_to = request.get("reply_to")
    if reply_to:
        reply_targets_add(r, job_id, message_id, reply_to)
    # read after adding: a job that ended meanwhile has answered it, or is answered here
    status = (r.get(keys.status(job_id)) or b"").decode()
    if reply_to and status in FINAL:
        replay(r, job_id, request.get("request_id"), status)
    log.info("request %s: already job %s (%s); not started again", request.get("request_id"), job_id, status)
    return {"job_id": job_id, "status": status, "duplicate": True}


MAX_CHUNK_SIZE = 10_000  # items per task: a bigger chunk holds a worker past any sane visibility timeout


def parse_request(request: dict, reach: Reach | None = None):
    """The request's job and destination, validated; JobError lists every problem.

    Everything a request names is checked before it is opened, against what its tenant may
    reach (``reach``: ``evalq.shared.policy.egress.Reach``): local files under its part of
    ``EVALQ_REQUEST_ROOTS`` (to read, ``EVALQ_SHARED_ROOTS`` too), S3 places and endpoints
    against its part of the operator's lists, and the job document itself by the one bounded
    reader. Outputs go only where the tenant may write.
    """
    from evalq.orchestrator.submit import destination
    from evalq.shared.job.schema import parse_job
    from evalq.shared.data.documents import check_inline, read_document

    reach = reach or Reach.of(None)
    roots = reach.read_roots

    def check_place(uri: str, endpoint_url: str | None, where: str, write: bool = False) -> None:
        problem = reach.write_problem(uri, endpoint_url) if write else reach.read_problem(uri, endpoint_url)
        if problem:
            raise JobError(f"{where}: {problem}")

    unknown = sorted(set(request) - set(REQUEST_FIELDS))
    if unknown:
        raise JobError([f"request: unknown field {str(k)[:80]!r} (fields: {', '.join(REQUEST_FIELDS)})"
                        for k in unknown[:10]])
    chunk_size = request.get("chunk_size")
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int)
                                   or not 1 <= chunk_size <= MAX_CHUNK_SIZE):
        raise JobError(f"request.chunk_size: expected a whole number from 1 to {MAX_CHUNK_SIZE}, "
                       f"got {json.dumps(chunk_size)[:80]}")
    has_job, has_uri = request.get("job") is not None, request.get("job_uri") is not None
    if has_job == has_uri:
        raise JobError("request: give exactly one of 'job' (the job object) or 'job_uri' (a path or s3:// URI)")
    if has_job:
        check_inline(request["job"], "request.job")
        job = parse_job(request["job"], source="request.job", roots=roots, s3=reach.s3_read)
    else:
        uri = request["job_uri"]
        if not isinstance(uri, str) or not uri or len(uri) > 1024:
            raise JobError("request.job_uri: expected a path or an s3:// URI")
        check_place(uri, None, "request.job_uri")
        job = parse_job(read_document(uri), source=uri, roots=roots, s3=reach.s3_read)
    out = request.get("out")
    if out is not None and (not isinstance(out, str) or not out or len(out) > 1024):
        raise JobError("request.out: expected a directory or an s3://bucket/prefix/")
    dest = destination(job, out)
    if dest is None:
        raise JobError("request.out: missing, and the job has no output.uri; say where the outputs go")
    check_place(dest.uri, dest.endpoint_url, "request.out" if out is not None else "output.uri", write=True)
    job.scheduling = _scheduling(job.scheduling, request)
    if request.get("suite") is not None:
        from evalq.shared.job.nightly import suite_problem

        problem = suite_problem(request["suite"])
        if problem:
            raise JobError(f"request.suite: {problem}")
        job.suite = request["suite"]
    dest.check()
    return job, dest


def _scheduling(fields, request: dict):
    """The job's ``scheduling``, with the request's ``priority``/``tenant``/``weight`` over it."""
    from pydantic import ValidationError

    try:
        return fields.with_overrides(request.get("priority"), request.get("tenant"), request.get("weight"))
    except ValidationError as exc:
        raise JobError([f"request.{'.'.join(map(str, e['loc']))}: {e['msg']} (got {json.dumps(e.get('input'))[:80]})"
                        for e in exc.errors()]) from None


def answer_refused(r: redis.Redis, refused, queue: str) -> None:
    """A message on request queue ``queue`` that is not a request (``evalq.orchestrator.intake``'s
    ``Refused``): logged, counted, and answered ``invalid`` on its ``reply_to`` where that is a list
    its tenant may be answered on (nothing else is)."""
    from evalq.orchestrator.replies import push_reply, reply_document
    from evalq.shared.cluster import telemetry
    from evalq.shared.cluster.scheduling import Tenants

    log.warning("refused a message on request queue %s (%s): %s", queue, refused.reason, refused.message)
    telemetry.request_refused(queue, refused.reason)
    reply_to = refused.kwargs.get("reply_to")
    tenant, bad_queue = request_identity(queue, Tenants.from_env())
    if reply_to is None or bad_queue or reply_to_problem(reply_to, tenant):
        return
    request_id = refused.kwargs.get("request_id")
    request_id = None if request_id_problem(request_id) else request_id
    push_reply(r, reply_to, json.dumps(reply_document(request_id, None, Status.INVALID, None, [refused.message], None)))
