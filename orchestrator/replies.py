"""The answers to a job's requests (``evalq.submit_job``): the end document pushed on each request's
``reply_to``, exactly once per request whatever runs twice, and the lists it goes to, bounded.
The request handler (``evalq.orchestrator.service``) answers what ends before a job starts; the
final callback (``evalq.orchestrator.finalize``) what ends with it."""

from __future__ import annotations

import json

import redis

from evalq.shared.cluster import keys
from evalq.shared.cluster.status import Status
from evalq.shared.job.stored import StoredJob, default_retention, load_job


def reply(r: redis.Redis, job_id: str, spec: StoredJob, status: str, errors: list[str],
          results: list[dict] | None, request_id: str | None = None) -> int:
    """Push the end document to the ``reply_to`` of every request of the job (the
    first, whose list is in the spec, and each duplicate): exactly one per request,
    whatever runs twice (a re-run callback, a redelivered message). Two requests
    naming the same list get two documents. Returns how many were pushed."""
    targets = ([(FIRST_REQUEST, spec.reply_to)] if spec.reply_to else []) + \
        sorted(_reply_target(m) for m in r.smembers(keys.reply_targets(job_id)))
    if not targets:
        return 0
    first_id = spec.request_id if spec.request_id is not None else request_id
    doc = json.dumps(reply_document(first_id, job_id, status, spec.out,
                                    errors, results), ensure_ascii=False)
    pushed = 0
    for request, target in targets:
        if r.sadd(keys.replied(job_id), request):
            push_reply(r, target, doc, spec.ttl)
            pushed += 1
    r.expire(keys.replied(job_id), spec.ttl)
    return pushed


# What ``replied`` holds for the job's first request; a duplicate's is ``msg:<its message id>``.
FIRST_REQUEST = "first"


def _reply_target(member: bytes) -> tuple[str, str]:
    """(request, reply list) of a ``reply_targets`` member; a member written before
    requests were told apart is a bare list name, answered once as before."""
    text = member.decode()
    if text.startswith("["):
        message_id, target = json.loads(text)
        return request_key(message_id), target
    return text, text


def request_key(message_id: str) -> str:
    return f"msg:{message_id}"


def reply_targets_add(r: redis.Redis, job_id: str, message_id: str, target: str) -> None:
    """Answer the duplicate request carried by message ``message_id`` on ``target``
    when the job ends (a redelivery of that message adds nothing new)."""
    r.sadd(keys.reply_targets(job_id), json.dumps([message_id, target]))
    r.expire(keys.reply_targets(job_id), default_retention())  # this cluster's setting, as the request's


def replay(r: redis.Redis, job_id: str, request_id: str | None, status: str) -> int:
    """Answer reply lists added after the job ended (duplicate requests)."""
    spec = load_job(r, job_id) or StoredJob({}, job_id)
    raw_error = (r.get(keys.error(job_id)) or b"").decode()
    if status == Status.INVALID:
        errors = json.loads(raw_error) if raw_error else []
    else:
        errors = [raw_error] if raw_error else []
    summary = r.get(keys.summary(job_id))
    results = json.loads(summary) if summary and status in (Status.DONE, Status.CANCELLED) else None
    return reply(r, job_id, spec, status, errors, results, request_id)


REPLIES_KEPT = 100  # documents a reply list keeps (a pipeline pops each as it comes)


def push_reply(r: redis.Redis, target: str, doc: str, ttl: int | None = None) -> None:
    """Push one end document onto a reply list, which is then bounded by what the cluster writes
    there: its last ``REPLIES_KEPT`` documents, for ``ttl`` (the result TTL) after the last. A
    tenant's Redis user cannot write its reply lists (``evalq.shared.cluster.tenant_acl``, Redis 7);
    on an older Redis this still bounds what it pushed there, at the cluster's next answer."""
    pipe = r.pipeline(transaction=False)
    reply_ops(pipe, target, doc, ttl)
    pipe.execute()


def reply_ops(pipe, target: str, doc: str, ttl: int | None = None) -> None:
    """``push_reply``'s commands, added to ``pipe`` (a caller's transaction that marks the request
    answered in the same step)."""
    pipe.rpush(target, doc)
    pipe.ltrim(target, -REPLIES_KEPT, -1)
    pipe.expire(target, int(ttl) if ttl else default_retention())


def reply_document(request_id: str | None, job_id: str | None, status: str, out: str | None,
                   errors: list[str], results: list[dict] | None) -> dict:
    return {"request_id": request_id, "job_id": job_id, "status": status, "out": out, "errors": errors,
            "results": results}
