"""Cluster-wide TPM/RPM budgets per deployment, held in Redis.

Check-and-reserve is one Lua script, so any number of workers on any number of
machines never over-commit a deployment. Time is Redis server time (``TIME``),
so workers' clocks do not matter. Two limits hold together:

- the provider's: usage over a sliding window (a minute), kept in
  tenth-of-a-second buckets;
- pacing: calls are spaced evenly at the TPM/RPM rate (GCRA), with bursts of
  up to ``burst`` seconds' worth (a sixth of the window by default, as Azure
  OpenAI checks its limits over 10 s slices). Without it the whole window's
  budget goes in a burst each time it frees, which Azure answers with 429s
  and which only a worker pool as fast as the burst can keep full.

Keys (``D`` is ``evalq.shared.judging.judges.deployment_id``), built by ``evalq.shared.cluster.keys``:

    evalq:budget:{D}:tok     HASH   bucket (0.1 s) -> tokens reserved in it
    evalq:budget:{D}:req     HASH   bucket (0.1 s) -> requests reserved in it
    evalq:budget:{D}:win     HASH   tok_sum, req_sum: what the buckets from tok_from, req_from on hold
                                    (the window's running sums: an admission reads them, not every
                                    bucket), tok_built, req_built (when last summed from the buckets)
    evalq:budget:{D}:pause   STRING server time (float s) before which nothing is sent (429 Retry-After)
    evalq:budget:{D}:pace    STRING server time (float s) the admitted calls reach when spaced at the
                                    TPM/RPM rate (GCRA's theoretical arrival time)
    evalq:budget:{D}:bias    HASH   server_tokens, estimated_tokens (estimator correction), of a cluster
                                    that lists no tenants; ``{D}:bias:<tenant>`` each tenant's own, so
                                    that no tenant's text moves another's reservations
    evalq:budget:{D}:fail    STRING consecutive failures (expires); a deployment above the
                                    threshold is drained to the judge's other deployments
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import redis

from evalq.shared.cluster import keys
from evalq.workers.judge.budget_lua import FOLD_LUA, PAUSE_LUA, RELEASE_LUA, RESERVE_LUA, SETTLE_LUA
from evalq.workers.keeping import run_after

BUCKET = 0.1        # seconds per usage bucket: the slack a reservation may hold past its window
MARGIN = 0.25       # seconds a request may take to reach the provider
FAIL_THRESHOLD = 5  # consecutive failures before a deployment is drained
FAIL_MEMORY = 60    # seconds a failure streak is remembered
BIAS_DECAY = 0.98   # weight of history in the estimator's bias
BIAS_PRIOR = 1.1    # until a server count is seen, reserve 10% above the estimate


@dataclass(frozen=True)
class Reservation:
    admitted: bool
    wait: float          # seconds until it could be admitted (0 when admitted)
    impossible: bool = False
    bucket: int = 0      # where an admitted call's tokens were booked (see settle)
    tokens: int = 0
    # what the limits inside a shared budget admitted beside it (``Within``: the job's own
    # limit, its tenant's share), in their order
    inner: tuple = ()
    refused_by: str = ""  # which limit an impossible call is too large for (``Within``)
    paused: bool = False  # held back by a 429's pause, not by the limits
    own: bool = False     # held back by a limit of the job's or its tenant's own (``Within``), not the deployment's


class Budget:
    """One deployment's budget. Scripts are registered once per process."""

    _scripts: dict[int, tuple] = {}

    def __init__(self, r: redis.Redis, dep_id: str, tpm: int, rpm: int, window: int = 60,
                 safety: float = 1.0, burst: float | None = None, learner=None, share: float = 1.0):
        self.r = r
        self.dep_id = dep_id
        self.tpm = max(1, int(tpm * safety))
        self.rpm = max(1, int(rpm * safety))
        # an ``auto`` deployment's limits are learned (``evalq.workers.judge.learning``): what is in
        # force now, times ``share`` (a tenant's) and the safety margin
        self.learner, self.share, self.safety = learner, share, safety
        self.window = window
        # seconds' worth of calls that may go at once; a whole window turns pacing off
        self.burst = window / 6 if burst is None else burst
        if id(r) not in self._scripts:
            self._scripts[id(r)] = (r.register_script(RESERVE_LUA), r.register_script(PAUSE_LUA),
                                    r.register_script(SETTLE_LUA))
        self._reserve, self._pause, self._settle = self._scripts[id(r)]

    def limits(self) -> tuple[int, int]:
        """(tpm, rpm) this budget admits by now (learned ones as last read)."""
        if self.learner is None:
            return self.tpm, self.rpm
        tpm, rpm = self.learner.limits()
        return (max(1, int(tpm * self.share * self.safety)), max(1, int(rpm * self.share * self.safety)))

    def reserve(self, tokens: int, carry: list = ()) -> Reservation:
        """``carry``: writes to make ahead of the reservation, in its round trip (``ItemKeeper.carried``)."""
        tpm, rpm = self.limits()
        script_keys = [keys.budget(self.dep_id, "tok"), keys.budget(self.dep_id, "req"),
                       keys.budget(self.dep_id, "pause"), keys.budget(self.dep_id, "pace"),
                       keys.budget(self.dep_id, "win")]
        args = [int(tokens), tpm, rpm, self.window, MARGIN, BUCKET, self.burst]
        if carry:
            admitted, wait, used, _, bucket = run_after(self.r, list(carry), self._reserve, script_keys, args)
        else:
            admitted, wait, used, _, bucket = self._reserve(keys=script_keys, args=args)
        if admitted == -1:
            return Reservation(False, 0.0, impossible=True)
        return Reservation(bool(admitted == 1), float(wait), bucket=int(bucket), tokens=int(tokens),
                           paused=admitted == 0 and int(used) == -1)

    def settle(self, reservation: Reservation, counted: int | None = None) -> None:
        """The call's reply is back: count it from now (see SETTLE_LUA), as many tokens as the
        provider ``counted`` (its prompt count and ``max_tokens``, never below what its limiter
        counts the request's characters as: the caller's), more or fewer than were reserved: the
        budget is spent in the provider's units, so a told or learned TPM is used whole whatever
        evalq's estimate made of the prompt (issue 70)."""
        for _, (script, script_keys, args) in self.settle_ops(reservation, counted):
            script(keys=script_keys, args=args)

    def settle_ops(self, reservation: Reservation, counted: int | None = None) -> list:
        """``settle`` as ops for a pipeline (``evalq.workers.keeping``): ``("script", (script, keys,
        args))`` each, so that a judge call's settling rides the round trip that keeps its item."""
        delta = counted - reservation.tokens if counted else 0
        return [("script", (self._settle, [keys.budget(self.dep_id, "tok"), keys.budget(self.dep_id, "req"),
                                           keys.budget(self.dep_id, "pace"), keys.budget(self.dep_id, "win")],
                            [reservation.bucket, reservation.tokens, self.window, BUCKET, delta, self.limits()[0]]))]

    def pause(self, seconds: float) -> None:
        """Hold every worker off this deployment (a 429 with Retry-After)."""
        self._pause(keys=[keys.budget(self.dep_id, "pause")], args=[max(0.0, float(seconds))])

    # -- estimator bias ---------------------------------------------------------
    # learnt from the calls of whoever's text it scales: one tenant's alone (``budget_of``)
    bias_key: str | None = None

    def bias_at(self) -> str:
        return self.bias_key or keys.budget(self.dep_id, "bias")

    def bias(self) -> float:
        raw = self.r.hmget(self.bias_at(), ["server", "estimate"])
        server, estimate = (float(x) if x else 0.0 for x in raw)
        if server <= 0 or estimate <= 0:
            return BIAS_PRIOR
        return min(3.0, max(0.33, server / estimate))

    def observe(self, estimated_prompt: int, server_prompt: int) -> None:
        """Fold one response's reported prompt tokens into the estimator's bias."""
        if estimated_prompt <= 0 or server_prompt <= 0:
            return
        key = self.bias_at()
        raw = self.r.hmget(key, ["server", "estimate"])
        server, estimate = (float(x) if x else 0.0 for x in raw)
        self.r.hset(key, mapping={"server": server * BIAS_DECAY + server_prompt,
                                  "estimate": estimate * BIAS_DECAY + estimated_prompt})

    def observe_many(self, pairs: list[tuple[int, int]]) -> None:
        """``observe`` of several responses (estimated, server prompt tokens), in one script."""
        pairs = [(e, s) for e, s in pairs if e > 0 and s > 0]
        if pairs:
            self.r.eval(FOLD_LUA, 1, self.bias_at(), BIAS_DECAY, *[v for pair in pairs for v in pair])

    def admission_tokens(self, estimated_prompt: int, max_tokens: int, floor: int = 0,
                         bias: float | None = None) -> int:
        """What a call reserves: its prompt estimate scaled by the bias (``bias``: as the caller last
        read it), never below ``floor`` (what the provider's limiter counts its characters as:
        ``limiter_count``), and its ``max_tokens``."""
        bias = self.bias() if bias is None else bias
        return max(int(math.ceil(round(estimated_prompt * bias, 6))), floor) + max_tokens

    # -- health -------------------------------------------------------------------
    def failed(self) -> None:
        key = keys.budget(self.dep_id, "fail")
        pipe = self.r.pipeline()
        pipe.incr(key)
        pipe.expire(key, FAIL_MEMORY)
        pipe.execute()

    def succeeded(self) -> None:
        self.r.delete(keys.budget(self.dep_id, "fail"))

    def healthy(self) -> bool:
        return self.streak() < FAIL_THRESHOLD

    def streak(self) -> int:
        """The deployment's consecutive failures (remembered ``FAIL_MEMORY`` seconds)."""
        return int(self.r.get(keys.budget(self.dep_id, "fail")) or 0)


class Limit(Budget):
    """A limit inside a shared budget, on budget keys of its own, without pacing (the shared
    budget paces the deployment): ``what`` names it in errors. A reservation the shared budget
    then refuses is given back (``release``), so it holds only calls that were sent."""

    def __init__(self, r: redis.Redis, dep_id: str, tpm: int, rpm: int, window: int, safety: float, what: str,
                 learner=None, share: float = 1.0):
        super().__init__(r, dep_id, tpm, rpm, window, safety=safety, burst=window, learner=learner, share=share)
        self.what = what
        self._release = r.register_script(RELEASE_LUA)

    def release(self, reservation: Reservation) -> None:
        self._release(keys=[keys.budget(self.dep_id, "tok"), keys.budget(self.dep_id, "req"),
                            keys.budget(self.dep_id, "win")],
                      args=[reservation.bucket, reservation.tokens])


class Within(Budget):
    """A deployment's shared budget, and the limits that hold part of it (``Limit``): a job's own
    lower TPM/RPM on a catalogue deployment, the share of it the operator gives the job's tenant
    (``<tenant>.max_share``). A call is admitted by every limit, then the shared budget; a call
    too large for a limit is impossible there (an error on its item, never a stall), and what the
    limits held for a call the shared budget refused is given back. What a job's or a tenant's
    limit holds never touches what others get."""

    def __init__(self, r: redis.Redis, dep_id: str, tpm: int, rpm: int, window: int, safety: float,
                 burst: float | None, inner: list[Limit], learner=None):
        super().__init__(r, dep_id, tpm, rpm, window, safety=safety, burst=burst, learner=learner)
        self.inner = inner

    def reserve(self, tokens: int, carry: list = ()) -> Reservation:
        held: list[Reservation] = []
        for limit in self.inner:
            mine, carry = limit.reserve(tokens, carry), ()
            if not mine.admitted:
                self._give_back(held)
                return Reservation(False, mine.wait, mine.impossible, refused_by=limit.what if mine.impossible else "",
                                   own=True)
            held.append(mine)
        shared = super().reserve(tokens, carry)
        if not shared.admitted:
            self._give_back(held)
            return shared
        return Reservation(True, 0.0, False, shared.bucket, shared.tokens, tuple(held))

    def _give_back(self, held: list[Reservation]) -> None:
        for limit, reservation in zip(self.inner, held):
            limit.release(reservation)

    def settle_ops(self, reservation: Reservation, counted: int | None = None) -> list:
        """The shared budget and every limit inside it count the call from now, as the server
        counted it (``settle`` runs these): what it counted beyond the reservation is held by the
        job's and its tenant's limits as by the deployment's (the tenant whose text cost more waits
        for it, within its own share), and what it counted below is given back to each alike."""
        ops = super().settle_ops(reservation, counted)
        for limit, mine in zip(self.inner, reservation.inner):
            ops += limit.settle_ops(mine, counted)
        return ops


def budget_of(r: redis.Redis, dep_id: str, d, safety: float, tenant: str | None = None) -> Budget:
    """The budget a deployment's calls are admitted by (``d``, as ``evalq.shared.judging.deployments.govern``
    gives it): its own, inside it for a catalogue deployment a job asked less of the job's limit,
    and the share of it the operator gives the job's ``tenant`` (``EVALQ_TENANTS``
    ``<tenant>.max_share``), across all the tenant's jobs (``evalq:budget:{D}:tenant-<tenant>:*``)."""
    from evalq.shared.cluster.scheduling import Tenants

    from evalq.shared.judging.capacity import AUTO
    from evalq.workers.judge.learning import Learner

    share = Tenants.from_env().max_share.get(tenant) if tenant is not None else None
    learner = Learner(r, dep_id, d, d.region, BUCKET, MARGIN) if AUTO in (d.tpm, d.rpm) else None
    inner: list[Limit] = []
    if d.own_limit is not None:
        job_id, tpm, rpm = d.own_limit
        inner.append(Limit(r, f"{dep_id}:job-{job_id}", tpm, rpm, d.window_seconds, safety,
                           f"the job's own limit of {tpm:,} tokens a minute"))
    if share is not None and share < 1:
        tpm, rpm = max(1, int(d.tpm_start * share)), max(1, int(d.rpm_start * share))
        of = "what it has learned" if learner is not None else f"{d.tpm_start:,} tokens a minute"
        inner.append(Limit(r, f"{dep_id}:tenant-{tenant}", tpm, rpm, d.window_seconds, safety,
                           f"tenant {tenant!r}'s share of it ({share:g} of {of}: "
                           f"{int(tpm * safety):,}; EVALQ_TENANTS {tenant}.max_share)", learner, share))
    if not inner:
        budget = Budget(r, dep_id, d.tpm_start, d.rpm_start, d.window_seconds, safety=safety, burst=d.burst_seconds,
                        learner=learner)
    else:
        budget = Within(r, dep_id, d.tpm_start, d.rpm_start, d.window_seconds, safety, d.burst_seconds, inner,
                        learner)
    if tenant is not None:  # its calls teach the estimator about its own text only
        budget.bias_key = keys.budget(dep_id, f"bias:{tenant}")
    return budget


def settled_tokens(usage: dict, max_tokens: int, floor: int) -> int | None:
    """What a budget holds for an answered call: the provider's count (``usage`` prompt tokens and
    ``max_tokens``, which providers count up front), never below what its limiter counts the
    request's characters as (``floor``: ``limiter_count``); None when the reply counted nothing."""
    prompt = usage.get("prompt_tokens")
    return max(prompt, floor) + max_tokens if prompt else None
