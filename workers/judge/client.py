"""``JudgeClient.complete``: one chat completion, the way a cluster should make it.

Order of business for every request:
1. the Redis cache (identical model + messages + parameters -> no call at all);
2. the job's token cap (reached -> ``Skipped``) and cost cap (reached ->
   ``CostCapReached``, an item error; ``evalq.workers.judge.cost``);
3. a budget reservation on the preferred deployment, else on the judge's
   other healthy deployments with spare budget (short waits are slept, long
   ones raise ``Deferred`` so the task re-schedules instead of holding a thread);
4. the HTTP call through the ``openai`` SDK with its own retries off; 429 with
   Retry-After pauses the deployment for every worker; 408/409/5xx, timeouts
   and connection errors retry with backoff (tenacity), bounded by the judge's
   ``max_retries``; exhausted retries raise ``JudgeError`` (an item error).
Every call, cache hit and 429 is counted per (job, metric), and with a price
what the call cost (``cost_nano``, billionths of the price's currency). Run by a chunk,
the client keeps each reply as ``evalq.workers.keeping`` says (an item's
answered calls are never paid again) and its counters ride the keeper's round
trips instead of one of their own per call.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import time
from typing import Any

import openai
import redis
from tenacity import Retrying, retry_if_exception, stop_after_attempt

from evalq.shared.cluster import keys, telemetry
from evalq.shared.job.stored import default_retention
from evalq.shared.core.errors import Deferred, Pending
from evalq.shared.judging.judge_reply import Reply, reply_from_json
from evalq.shared.judging.judges import Deployment, JudgeConfig, JudgingOptions, deployment_id, model_identity
from evalq.workers.judge.budget import Budget, Reservation, budget_of, settled_tokens
from evalq.workers.judge.concurrency import Lease, gates_of, load_said
from evalq.workers.judge.cost import Caps, CostWait, Hold
from evalq.workers.judge.dialects import Dialects, refused_as_invalid
from evalq.workers.judge.standing import Standing
from evalq.workers.judge.requests import (JudgeError, RateLimited, chat_request, retry_after, retryable,  # noqa: F401
                                          sdk_client)
from evalq.shared.judging.tokens import estimate_request_tokens, limiter_count, prompt_token_bound
from evalq.workers.keeping import DOWN, WRITE_BEHIND, ItemKeeper, Op, execute

log = logging.getLogger("evalq.judge")

SLEEP_MAX = 2.0      # budget waits up to this are slept in the worker
RETRY_SLEEP_MAX = 5.0  # a Retry-After up to this is slept; longer ones re-schedule
SAFETY = 0.99        # reserve at most this share of a deployment's TPM/RPM
SLOT_POLL = 0.05     # an adaptive deployment's limit of calls in flight reached: look again this often ...
SLOT_PATIENCE = 30.0  # ... for up to this long before the chunk re-schedules


class JudgeClient:
    """Judge calls for one (job, metric) with one judge configuration."""

    def __init__(self, r: redis.Redis, job_id: str, metric_key: str, name: str, judge: JudgeConfig,
                 options: JudgingOptions, preferred: str | None = None, memo: bool = False,
                 keeper: ItemKeeper | None = None, tenant: str | None = None, ttl: int | None = None):
        self.r = r
        self.ttl = ttl or default_retention()  # the job's retention (its chunk's)
        self.batch: Any = None  # a BatchLines in batch mode: unanswered calls wait for a provider batch
        self.memo = memo
        self.keeper = keeper
        self.job_id = job_id
        self.metric_key = metric_key
        self.name = name
        self.judge = judge
        self.options = options
        self.deployments = list(judge.deployments)
        if preferred:  # the deployment whose queue this task came from goes first
            self.deployments.sort(key=lambda d: d.region != preferred)
        self._last_failed: str | None = None  # a retry prefers another deployment
        telemetry.deployment_limits((d.region, d.tpm, d.rpm) for d in self.deployments)
        self.budgets = {d.region: budget_of(r, deployment_id(judge, d), d, SAFETY, tenant) for d in self.deployments}
        self.standing = Standing(self.budgets)  # their biases and failure streaks, read 4x a second
        if keeper is not None:  # the prompt counts its replies reported, folded in when the chunk ends
            keeper.on_close(self.standing.fold)
            keeper.carrying = True  # items' records ride the admissions of the calls after them
        self.gates = gates_of(r, judge, self.deployments, tenant)  # adaptive deployments' limits of calls in flight
        self.caps = Caps(r, job_id, options.cost_cap, options.token_cap, tenant)
        self.dialects, self.identity = Dialects(r), model_identity(judge)
        self._versions: set[str] = set()  # the versions this client has told the entry's judge identity

    # -- public -----------------------------------------------------------------
    def complete(self, messages: list[dict], schema: dict | None = None, schema_name: str = "rating",
                 sample: int = 0) -> Reply:
        """``sample`` > 0: the same request as a call of its own (a repeat that must not be the cached reply).
        The model the provider says answered (a version behind an alias), paid now, kept or cached, is
        told the entry's judge identity (``keys.judge_seen``) once per client and version."""
        reply = self._complete_any(messages, schema, schema_name, sample)
        if reply.model and reply.model not in self._versions and not self.metric_key.startswith("generate"):
            self._versions.add(reply.model)
            self._write([("hset", (keys.judge_seen(self.job_id, self.metric_key), f"model:{self.name}|{reply.model}", 1))])
        return reply

    def _complete_any(self, messages: list[dict], schema: dict | None, schema_name: str, sample: int) -> Reply:
        request = chat_request(self.judge, messages, schema, schema_name)
        digest = request_digest(request, f"{self.identity}#{sample}" if sample else self.identity)
        kept = self.keeper.reply(digest) if self.keeper is not None else None
        if kept is None and self.batch is not None:
            answered = self._from_batch(digest, request)
            if answered is not None:
                return answered
        if kept is None and self.memo:
            kept = self._memo_or_claim(digest)
        if kept is not None:
            self._count(None, reused=1)
            return _reply(kept)
        try:
            return self._complete(request, messages, digest)
        finally:
            if self.memo:
                self.r.delete(keys.judge_memo_claim(self.job_id, digest))

    def _from_batch(self, digest: str, request: dict) -> Reply | None:
        """Batch mode: the reply a provider batch brought back, else the cache's (a cached
        request is never put in a batch); otherwise the call becomes a batch line and the
        item waits (``Pending``). None: the call goes synchronously (it failed in two
        batches, ``auto`` passed its deadline, ...)."""
        kept = self.batch.reply(digest)
        if kept is None and self.batch.sync_reason(digest) is None:
            cached = self._cached(digest)
            if cached is not None:
                return cached
            if self._wait_for_batch(digest, request):
                raise Pending(digest)
            kept = self.batch.reply(digest)  # answered while this thread looked (else: gone synchronous)
        if kept is None:
            return None
        self._keep(digest, kept, memo=False)
        return _reply(kept)

    def _wait_for_batch(self, digest: str, request: dict) -> bool:
        """The call becomes a batch line (``evalq.workers.judge.batch_lines``), holding the
        job's caps as a call would, at the batch price: True when the item is to wait for
        it, False when it was answered (or went synchronous) since this thread looked."""
        estimate = estimate_request_tokens(request)
        tokens = self.judge.max_tokens + estimate
        price = self.judge.price_of(self.batch.deployment)
        try:
            held = self.caps.take(tokens, price.batch() if price is not None else None, prompt_token_bound(request),
                                  self.judge.max_tokens, lapse=self.batch.hold_lapse())
        except CostWait as exc:  # the calls in flight may leave room: the chunk tries again shortly
            raise Deferred(exc.wait, reason=f"waiting for calls in flight: {exc}") from None
        if self.keeper is not None:
            self.keeper.before_call()
        item = self.keeper.position if self.keeper is not None and self.keeper.position is not None else 0
        counted = tokens if self.caps.tokens.counters else 0
        registered = self.batch.register(digest, request, item, held, counted)
        if registered != 1:  # the line's holds are taken already, or it needs none any more
            self.caps.give_back(tokens, held)
        return registered >= 0

    def _memo_or_claim(self, digest: str) -> bytes | None:
        """The job's kept reply for this request, or None once this thread may make
        the call: while another thread or worker is making it, wait for its reply
        rather than pay for the same call (claims shared by concurrent metrics)."""
        memo, claim = keys.judge_memo(self.job_id), keys.judge_memo_claim(self.job_id, digest)
        held = WRITE_BEHIND.held(memo, [digest])  # kept by this process while Redis was away
        if held:
            return held[digest]
        hold = int(self.judge.timeout * (self.judge.max_retries + 1)) + 30
        deadline = time.monotonic() + hold
        while True:
            kept = self.r.hget(memo, digest)
            if kept is not None:
                return kept
            if self.r.set(claim, "1", nx=True, ex=hold):
                kept = self.r.hget(memo, digest)  # answered between the two reads
                if kept is not None:
                    self.r.delete(claim)
                return kept
            if time.monotonic() > deadline:
                return None  # the holder is stuck; make the call
            time.sleep(0.05)

    def _cached(self, digest: str) -> Reply | None:
        """The cross-run cache's reply (kept for the job), or None."""
        if not self.options.cache:
            return None
        hit = self.r.get(keys.judge_cache(digest))
        if hit is None:
            return None
        self._count(None, cache_hits=1)
        self._keep(digest, hit)
        return _reply(hit)

    def _complete(self, request: dict, messages: list[dict], digest: str) -> Reply:
        cached = self._cached(digest)
        if cached is not None:
            return cached
        estimate = estimate_request_tokens(request)
        if self.keeper is not None:  # (its answered calls kept in the admission's round trip)
            self.keeper.before_call(carry=True)
        reply = self._call_with_retries(request, (estimate, prompt_token_bound(request), limiter_count(request)))
        raw = json.dumps({"content": reply.content, "tool_arguments": reply.tool_arguments, "usage": reply.usage,
                          "model": reply.model})
        self._keep(digest, raw)
        if self.options.cache:  # a round trip of its own (as ever): the cache lives outside the job's hash slot
            WRITE_BEHIND.write(self.r, [("set", (keys.judge_cache(digest), raw, self.options.cache_ttl))])
        return reply

    def _keep(self, digest: str, raw: str | bytes, memo: bool = True) -> None:
        if self.memo and memo:  # at once: other threads and workers may be waiting for this reply
            memo = keys.judge_memo(self.job_id)
            self._write([("hset", (memo, digest, raw)), ("expire", (memo, self.ttl))],
                        now=True)
        elif self.keeper is not None:
            self.keeper.answered(digest, raw if isinstance(raw, str) else raw.decode())

    def _write(self, ops: list[Op], now: bool = False) -> None:
        """With a keeper, ``ops`` join its next round trip (``now``: this one, or are
        held while Redis is away); without one they are written at once."""
        if self.keeper is None:
            execute(self.r, ops)
        elif now:
            self.keeper.flush(*ops)
        else:
            self.keeper.add(ops)

    # -- internals --------------------------------------------------------------
    def _call_with_retries(self, request: dict, estimate: tuple[int, int, int]) -> Reply:  # (estimate, bound, floor)
        retrying = Retrying(stop=stop_after_attempt(self.judge.max_retries + 1),
                            retry=retry_if_exception(retryable), wait=self._backoff, reraise=True)
        try:
            return retrying(self._attempt, request, estimate)
        except RateLimited as exc:
            raise JudgeError(f"rate limited (429) on every attempt; last Retry-After {exc.retry_after:.1f} s") from None
        except (openai.APITimeoutError, openai.APIConnectionError) as exc:
            raise JudgeError(f"{type(exc).__name__} after {self.judge.max_retries + 1} attempts: {exc}") from None
        except openai.APIStatusError as exc:
            raise JudgeError(f"HTTP {exc.status_code} from the judge: {_short(exc.message)}") from None

    @staticmethod
    def _backoff(retry_state) -> float:
        exc = retry_state.outcome.exception()
        if isinstance(exc, RateLimited):
            return exc.retry_after  # the deployment is paused for everyone; this wait is short
        return min(8.0, 0.5 * 2 ** (retry_state.attempt_number - 1)) * (0.5 + random.random())

    def _attempt(self, request: dict, estimates: tuple[int, int, int]) -> Reply:
        estimate, bound, floor = estimates
        deployment, budget, reservation, held, lease = self._admit(estimate, bound, floor)
        started = time.monotonic()
        try:
            response = self._send(request, deployment, budget, reservation, floor)
        except BaseException as exc:  # the reply (or error) is back: the budget counts the call from now
            _bookkeeping(budget.settle, reservation)
            _bookkeeping(self.caps.cost.release, held)
            if lease is not None:
                _bookkeeping(self.gates[deployment.region].release, lease, 0.0, load_said(exc))
            raise
        if lease is not None:
            _bookkeeping(self.gates[deployment.region].release, lease, time.monotonic() - started, "ok")
        self._last_failed = None
        reply = reply_from_json(response)
        usage = reply.usage
        # ... as the server counted it (its prompt count and max_tokens up front), never below what its
        # limiter counts the request's characters as: more or less than was reserved
        counted = settled_tokens(usage, self.judge.max_tokens, floor)
        if self.keeper is not None:  # with the item's record: one round trip
            self.keeper.add(budget.settle_ops(reservation, counted))
        else:
            _bookkeeping(budget.settle, reservation, counted)
        _bookkeeping(self.standing.succeeded, deployment.region)
        if usage.get("prompt_tokens"):
            _bookkeeping(self.standing.observe, deployment.region, estimate, usage["prompt_tokens"])
        prompt, completion = usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0
        price = self.judge.price_of(deployment)
        cost = price.cost_nano(prompt, completion) if price is not None else 0
        _bookkeeping(self.caps.cost.settle, held, cost)
        self._count(deployment.region, calls=1, prompt_tokens=prompt, completion_tokens=completion,
                    reserved_tokens=reservation.tokens, cost_nano=cost)
        return reply

    def _send(self, request: dict, deployment: Deployment, budget: Budget, reservation: Reservation, floor: int = 0):
        """The HTTP call on an admitted deployment; a 429 pauses it for every worker."""
        try:
            response, headers = self.dialects.create(
                sdk_client(self.judge, deployment), request, budget.dep_id, deployment.region,
                auto=getattr(self.judge, "output", None) == "auto",  # (a model under test has none)
                model=deployment.deployment if self.judge.provider == "azure" else None)
        except openai.RateLimitError as exc:
            wait = retry_after(exc)
            budget.pause(wait)
            self._count(deployment.region, rate_limited=1)
            if budget.learner is not None:
                _bookkeeping(budget.learner.observe, exc.response.headers if exc.response is not None else {}, True,
                             None, reservation.tokens)
                # a deployment still finding its limit: the call waits for the budget, its item loses
                # nothing, and the judge's retries are not spent on what the controller causes (issue 77)
                raise Deferred(max(wait, 0.05), region=deployment.region,
                               reason=f"429 from {deployment.region} while its limit is learned; Retry-After "
                                      f"{wait:.1f} s") from None
            if wait > RETRY_SLEEP_MAX:
                raise Deferred(wait, reason=f"429 from {deployment.region}; Retry-After {wait:.1f} s") from None
            raise RateLimited(wait) from None
        except (openai.APITimeoutError, openai.APIConnectionError, openai.InternalServerError):
            self._failed(deployment, budget)
            raise
        except openai.APIStatusError as exc:
            if (exc.status_code in (408, 409) or exc.status_code >= 500) and not refused_as_invalid(exc):
                self._failed(deployment, budget)
            raise
        if budget.learner is not None:
            prompt = (response.get("usage") or {}).get("prompt_tokens")
            # what the provider counted of what the cluster's window holds for the call once settled
            settled = settled_tokens({"prompt_tokens": prompt}, self.judge.max_tokens, floor)
            share = (prompt + self.judge.max_tokens) / settled if prompt and settled else None
            _bookkeeping(budget.learner.observe, headers, False, share)
        return response

    def _admit(self, estimate: int, bound: int, floor: int) -> tuple[Deployment, Budget, Reservation, Hold | None,
                                                                     Lease | None]:
        """Reserve budget somewhere, sleeping through short waits; also what the call holds of the
        cost caps: its worst case, ``bound`` prompt tokens and ``max_tokens`` of completion, and
        on an adaptive deployment a place in flight (waited for up to ``SLOT_PATIENCE``)."""
        began = time.monotonic()
        deadline = began + SLEEP_MAX * 4
        while True:
            healthy = [d for d in self.deployments if self.standing.healthy(d.region)] or self.deployments
            healthy.sort(key=lambda d: d.region == self._last_failed)
            # own: what holds the best wait back is the job's or its tenant's own limit (its share, its
            # caps), not the deployment's: then the chunk gives its slot on the queue away while it waits
            best_wait, best, own, too_large, slots_only = float("inf"), healthy[0], False, [], True
            for d in healthy:
                budget, gate = self.budgets[d.region], self.gates.get(d.region)
                lease, share_full = gate.acquire_or_why() if gate is not None else (None, False)
                if gate is not None and lease is None:  # the limit of calls in flight is reached
                    if SLOT_POLL < best_wait:
                        best_wait, best, own = SLOT_POLL * (0.5 + random.random()), d, share_full
                    continue
                tokens = self.standing.admission_tokens(d.region, estimate, self.judge.max_tokens, floor=floor)
                try:
                    held = self.caps.take(tokens, self.judge.price_of(d), bound, self.judge.max_tokens)
                except CostWait as exc:  # a cap has room only once the calls in flight settle
                    if lease is not None:
                        gate.release(lease, 0.0, "none")
                    slots_only = False
                    if exc.wait < best_wait:
                        best_wait, best, own = exc.wait, d, True
                    continue
                carry = self.keeper.carried() if self.keeper is not None else []
                try:  # what the chunk's items kept rides the reservation's round trip
                    res = budget.reserve(tokens, carry)
                except DOWN:
                    if carry:
                        self.keeper.hold(carry)
                    raise
                if res.admitted:
                    telemetry.budget_admitted(d.region, tokens)
                    return d, budget, res, held, lease
                self.caps.give_back(tokens, held)
                if lease is not None:
                    gate.release(lease, 0.0, "none")
                if res.impossible:
                    too_large.append(f"{d.region}: {res.refused_by or 'its TPM'}")
                    continue
                if budget.learner is not None and not res.paused and not res.own:
                    _bookkeeping(budget.learner.pressed)
                slots_only = False
                if res.wait < best_wait:
                    best_wait, best, own = res.wait, d, res.own
            # a place in flight the deployment lacks is waited for up to SLOT_PATIENCE; one the tenant's
            # share lacks, as briefly as a budget's wait: the tenant's other calls hold its places
            patience = SLEEP_MAX if own else SLOT_PATIENCE
            if slots_only and best_wait < float("inf") and time.monotonic() - began < patience:
                time.sleep(best_wait)
                continue
            if best_wait == float("inf"):
                raise JudgeError(f"a request of ~{estimate} prompt + {self.judge.max_tokens} completion "
                                 f"tokens is larger than any deployment of judge {self.name!r} admits in a "
                                 f"minute ({'; '.join(too_large)})")
            if slots_only:
                whose = "the tenant's share of " if own else ""
                raise Deferred(1.0, region=best.region, own=own, reason=f"{best.region}: {whose}its limit of calls "
                               f"in flight is reached for {patience:g} s")
            if best_wait > SLEEP_MAX or time.monotonic() + best_wait > deadline:
                whose = "the job's or its tenant's own limit on " if own else ""
                raise Deferred(best_wait, region=best.region, own=own,
                               reason=f"{whose}budget of judge {self.name!r} spent for {best_wait:.1f} s")
            time.sleep(best_wait)

    def _failed(self, deployment: Deployment, budget: Budget) -> None:
        self.standing.failed(deployment.region)
        self._last_failed = deployment.region
        self._count(deployment.region, failed_calls=1)

    def _count(self, region: str | None, **fields: int) -> None:
        """Add to the job's accounting of this metric entry: totals, and per region
        (fields ``<region>/<name>``) for what a deployment answered."""
        self._write(accounting_ops(self.job_id, self.metric_key, region, fields))
        telemetry.judge_counted(region, fields)


def accounting_ops(job_id: str, metric_key: str, region: str | None, fields: dict[str, int]) -> list[Op]:
    """What adds ``fields`` to an entry's accounting: the totals, and (``region`` given) the
    deployment's ``<region>/<name>`` counts. The judge client's and the batch manager's."""
    key = keys.accounting(job_id, metric_key)
    ops: list[Op] = []
    for name, value in fields.items():
        if value:
            ops.append(("hincrby", (key, name, int(value))))
            if region is not None:
                ops.append(("hincrby", (key, f"{region}/{name}", int(value))))
    return ops


def request_digest(request: dict, identity: str) -> str:
    """A call's key in the job's memo, the cache and a batch line: sha256 of who answers (identity), and what."""
    return hashlib.sha256(f"{identity}\n{json.dumps(request, sort_keys=True)}".encode()).hexdigest()


def _reply(raw: str | bytes) -> Reply:
    data = json.loads(raw)
    return Reply(data["content"], data["tool_arguments"], data.get("usage", {}), cached=True, model=data.get("model"))


def _bookkeeping(step, *args) -> None:
    """A budget update after a call: skipped while Redis is away, so that the reply
    paid for is kept (held until Redis is back) rather than lost with the error."""
    try:
        step(*args)
    except DOWN as exc:
        log.info("budget bookkeeping skipped, Redis is unreachable: %s", exc)


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
