"""Every Redis key evalq writes, built in one place.

All keys of one job share the prefix ``evalq:{<job>}:`` (the braces are a Redis
Cluster hash tag, so one job's keys live on one shard and Lua scripts may touch
several of them):

    evalq:{J}:spec           STRING  job spec as run (metrics, resolved parameters, counts)
    evalq:{J}:instances      LIST    one JSON instance per element, in job order
    evalq:{J}:res:{M}        HASH    instance index -> JSON item record, for metric key M (a job without a
                                     job store; with one, records are Parquet parts there:
                                     ``evalq.shared.store.records``)
    evalq:{J}:recorded:{M}   HASH    chunk start -> how many item records the chunk wrote
    evalq:{J}:nrec:{M}       STRING  the sum of ``recorded:{M}``: the run's items recorded so far
    evalq:{J}:time:{M}       HASH    chunk start -> seconds spent scoring that chunk
    evalq:{J}:part:{M}       HASH    chunk start -> JSON aggregate of the chunk's items (mergeable kinds)
    evalq:{J}:view:{M}       HASH    chunk start -> JSON of what report.html needs of the chunk (worst items, sample)
    evalq:{J}:kept:{M}       HASH    instance index -> JSON ``{"record": ...}`` of an item scored in a chunk that
                                     has not ended, or ``{"replies": {sha: reply}}`` of its calls answered so far
                                     (``evalq.workers.keeping``); the chunk's end moves records to ``res:{M}``
    evalq:{J}:summary        STRING  JSON list of aggregated metric results (results.json)
    evalq:{J}:stage:{S}      STRING  JSON summary of a stage that is not a metric (S = generate)
    evalq:{J}:status         STRING  running | generated | done | failed | cancelled
    evalq:{J}:plan           HASH    per stage S: S:total (chunks), S:sent (chunks sent so far), S:fired
    evalq:{J}:chunks:{S}     SET     chunks of stage S that are finished (``<metric key>:<start>``)
    evalq:{J}:error          STRING  why a job failed (its outputs could not be written, say)
    evalq:{J}:reply_targets  SET     JSON ``[message id, reply_to]`` of each duplicate request (its own document)
    evalq:{J}:replied        SET     requests already answered, one document each: ``first`` (the job's own
                                     ``reply_to``), ``msg:<message id>`` (a duplicate request)
    evalq:{J}:watch          HASH    what the lookers-after saw and did (evalq.orchestrator.watch)
    evalq:jobs               ZSET    job id -> submission time, for ``evalq status``
    evalq:request:{R}        STRING  job id of idempotency key R (a request id, else the message id)
    evalq:request:{R}:owner  STRING  the message that bound R (its redelivery is told from a second request)
    evalq:sweeper            STRING  held for one interval by the jobs worker that sweeps running jobs

The generation stage's item records (the model's outputs) live in
``evalq:{J}:res:generate`` like a metric's; ``generate`` is a reserved metric id.

Judge keys shared across jobs (see ``evalq.workers.judge.budget`` for the budget's):

    evalq:budget:{D}:<part>  budget state of deployment D (tokens, requests, pause, bias, failures)
    evalq:judgecache:<sha>   STRING cached judge reply for one canonical request
    evalq:{J}:acct:{M}       HASH   judge accounting of metric M: calls, cache_hits, tokens, 429s, cost_nano
    evalq:{J}:tokens         STRING tokens the job reserved (checked against its token cap)
    evalq:{J}:cost           STRING the job's cost in billionths of the prices' currency, paid plus held by
                                    calls in flight (checked against its cost cap; only with a cost cap)
    evalq:{J}:memo           HASH   request sha -> judge reply, for metrics of several calls per item
                                    (claims extracted once per job; a re-run item pays no call twice),
                                    and every reply a provider batch brought back

The Batch API path (``evalq.workers.judge.batches``):

    evalq:batch:jobs              SET    jobs with batch lines or batches not yet ended
    evalq:batch:lock:{R}          STRING held by the one batch manager of region R for a tick
    evalq:{J}:batch:line          HASH   request sha -> JSON line waiting for a reply (entry, item, body, tries)
    evalq:{J}:batch:queued:{R}    LIST   request shas waiting to go into a batch of region R
    evalq:{J}:batch:touched       HASH   region -> when a line last joined its queue
    evalq:{J}:batch:sync          HASH   request sha -> why it is sent synchronously instead
    evalq:{J}:batch:open          HASH   batch -> JSON record (provider id, state, lines, counts, expected end)
    evalq:{J}:batch:members:{B}   LIST   request shas of batch B
    evalq:{J}:parked              HASH   "<metric key>:<start>" -> JSON chunk waiting for batch replies

Item records (and chunk parts) are written with HSET on a field derived from
the instance's (chunk's) position, so a redelivered task overwrites instead of
adding: nothing is counted twice.
"""

from __future__ import annotations

PREFIX = "evalq"


def job_prefix(job_id: str) -> str:
    return f"{PREFIX}:{{{job_id}}}"


def spec(job_id: str) -> str:
    return f"{job_prefix(job_id)}:spec"


def instances(job_id: str) -> str:
    return f"{job_prefix(job_id)}:instances"


def compared(job_id: str) -> str:
    """String: how the ended job compares with its suite's baseline (run.json's ``regressions``)."""
    return f"{job_prefix(job_id)}:compared"


def dataset_version(job_id: str) -> str:
    """String: the instances' version table (``evalq.shared.data.versions``) of a job kept outside the store."""
    return f"{job_prefix(job_id)}:version"


def shared_values(job_id: str) -> str:
    """Hash: digest -> JSON of a value many instances share, stored once (tool definitions)."""
    return f"{job_prefix(job_id)}:shared"


def results(job_id: str, metric_key: str) -> str:
    return f"{job_prefix(job_id)}:res:{metric_key}"


def recorded(job_id: str, metric_key: str) -> str:
    """Hash: chunk start -> how many item records the chunk wrote (``evalq.shared.store.records``)."""
    return f"{job_prefix(job_id)}:recorded:{metric_key}"


def recorded_total(job_id: str, metric_key: str) -> str:
    """String: the sum of ``recorded``'s counts (the run's items recorded so far)."""
    return f"{job_prefix(job_id)}:nrec:{metric_key}"


def kept(job_id: str, metric_key: str) -> str:
    return f"{job_prefix(job_id)}:kept:{metric_key}"


def parts(job_id: str, metric_key: str) -> str:
    return f"{job_prefix(job_id)}:part:{metric_key}"


def gathering(job_id: str, metric_key: str) -> str:
    """Hash: chunk start -> 1, a chunk whose pending record part is in the store, until the part of its
    group of chunks is written (``evalq.shared.store.groups``)."""
    return f"{job_prefix(job_id)}:gathering:{metric_key}"


def gathering_claim(job_id: str, metric_key: str, start: int) -> str:
    """String: which chunk writes the record part of the group of chunks from ``start``, while it does."""
    return f"{job_prefix(job_id)}:gathering:{metric_key}:{start}"


def views(job_id: str, metric_key: str) -> str:
    return f"{job_prefix(job_id)}:view:{metric_key}"


def values(job_id: str, metric_key: str) -> str:
    """Per chunk, its items' values by field (``evalq.results.recording.chunk_values``)."""
    return f"{job_prefix(job_id)}:values:{metric_key}"


def timings(job_id: str, metric_key: str) -> str:
    """Per chunk (its start), the seconds its runs took; for a chunk whose items wait on calls (a
    judge's, a model's), also ``cpu:<start>``, the CPU seconds of those runs (``timing_sums``)."""
    return f"{job_prefix(job_id)}:time:{metric_key}"


COMPUTE = "cpu:"  # a timings field of a chunk's CPU seconds


def timing_sums(fields: dict) -> tuple[float, float]:
    """(seconds, compute seconds) of a run's chunks from its ``timings`` hash: a chunk that measured
    no CPU seconds (its items call nothing: all of its time is work) computed for all of its time."""
    text = {(k.decode() if isinstance(k, bytes) else k): float(v) for k, v in fields.items()}
    wall = {k: v for k, v in text.items() if not k.startswith(COMPUTE)}
    return sum(wall.values()), sum(min(text.get(COMPUTE + k, v), v) for k, v in wall.items())


def scored_spans(suite: str, day: str) -> str:
    """The spans of ``day`` (UTC, of their start) that runs of ``suite`` (``tenant/suite``) took:
    span id -> job id (``evalq.orchestrator.once``). One hash slot per suite."""
    return f"{PREFIX}:spans:{{{suite}}}:{day}"


def sink(job_id: str, name: str) -> str:
    """Hash: what sink ``name`` (``otlp``, or a sink of the operator's ``EVALQ_SINKS``) refused of a
    job's scores: ``refused`` (evaluations), ``answer`` (its last word), ``cannot`` (it takes none)."""
    return f"{job_prefix(job_id)}:sink:{name}"


def exported(job_id: str, metric_key: str, name: str = "otlp") -> str:
    """The positions sink ``name`` took (or had nothing to take of: ``sink_none``) of an entry
    (``evalq.results.sinks``)."""
    if name == "otlp":
        return f"{job_prefix(job_id)}:otel:{metric_key}"
    return f"{job_prefix(job_id)}:sink:{name}:sent:{metric_key}"


def judge_seen(job_id: str, metric_key: str) -> str:
    """Hash: what a judge entry's calls said of who answered: ``model:<judge>|<model>`` (the provider's
    version behind an alias, per judge of a panel), ``prompt`` -> the digest of the messages its metric builds
    (``evalq.workers.judge.identity``): the entry's judge identity, with the spec's judge."""
    return f"{job_prefix(job_id)}:judge:{metric_key}"


def sink_none(job_id: str, metric_key: str, name: str) -> str:
    """The positions among ``exported``'s that gave sink ``name`` nothing to send (an error, an
    item without the span or trace the sink attaches scores to)."""
    return f"{job_prefix(job_id)}:sink:{name}:none:{metric_key}"


def sink_pending(job_id: str, metric_key: str, name: str) -> str:
    """HASH position -> claim: the positions a sink that keeps every write (MLflow's assessments) is
    or was being sent by some process, claimed before the request (``<server time it lapses>:<who>``,
    ``0`` once given back): a live claim is another process's to finish; a lapsed or given-back one
    not yet in ``exported`` may have been taken, so it is looked up first."""
    return f"{job_prefix(job_id)}:sink:{name}:claims:{metric_key}"


def summary(job_id: str) -> str:
    return f"{job_prefix(job_id)}:summary"


def stage_summary(job_id: str, stage: str) -> str:
    return f"{job_prefix(job_id)}:stage:{stage}"


def status(job_id: str) -> str:
    return f"{job_prefix(job_id)}:status"


def ended(job_id: str) -> str:
    """A list that gets the job's final status as it is set: a waiting client blocks on it
    (``BLMOVE`` onto itself, which leaves it for the next) instead of sleeping between looks."""
    return f"{job_prefix(job_id)}:ended"


def plan(job_id: str) -> str:
    return f"{job_prefix(job_id)}:plan"


def callback_lease(job_id: str, stage: str) -> str:
    """Held by the stage's callback while it runs (``evalq.shared.cluster.leases``)."""
    return f"{job_prefix(job_id)}:callback:{stage}"


def chunks_done(job_id: str, stage: str) -> str:
    return f"{job_prefix(job_id)}:chunks:{stage}"


def error(job_id: str) -> str:
    return f"{job_prefix(job_id)}:error"


def replied(job_id: str) -> str:
    return f"{job_prefix(job_id)}:replied"


def reply_targets(job_id: str) -> str:
    return f"{job_prefix(job_id)}:reply_targets"


JOBS = f"{PREFIX}:jobs"
SWEEP_LOCK = f"{PREFIX}:sweeper"


def watch(job_id: str) -> str:
    return f"{job_prefix(job_id)}:watch"


def rebuild_lock(job_id: str) -> str:
    """Held by the jobs worker rebuilding the job from the store (``evalq.orchestrator.rebuild``)."""
    return f"{job_prefix(job_id)}:rebuilding"


def request(request_id: str) -> str:
    return f"{PREFIX}:request:{request_id}"


def request_binding(tenant: str | None, request_id, message_id: str | None) -> str:
    """The key binding a queue request to its job: its tenant's request id, else its message id (a
    request id is its tenant's: two tenants' "nightly-2026-11-25" are two requests)."""
    scope = f"{tenant}/" if tenant else ""
    return request(f"{scope}{request_id}" if request_id is not None else f"message:{scope}{message_id}")


# What outlives a job (and an embedded Redis, which saves only these).
PERSISTENT_PREFIXES = (f"{PREFIX}:judgecache:", f"{PREFIX}:budget:", f"{PREFIX}:dialect:")


def tenant_spend(tenant: str, kind: str, day: str) -> str:
    """What a tenant's jobs spent (``kind``: cost in billionths, or tokens) on a UTC day."""
    return f"{PREFIX}:tenant:{tenant}:{kind}:{day}"


TENANT_SPEND_TTL = 3 * 86400  # seconds a tenant's counter of a day lives


def dialect(dep_id: str) -> str:
    """How a deployment is asked for structured output (``evalq.workers.judge.dialects``)."""
    return f"{PREFIX}:dialect:{dep_id}"


def budget(dep_id: str, part: str) -> str:
    return f"{PREFIX}:budget:{{{dep_id}}}:{part}"


def judge_cache(digest: str) -> str:
    return f"{PREFIX}:judgecache:{digest}"


def retires(provider: str, url: str, model: str) -> str:
    """What a provider's model list said of when ``model`` retires, as a worker last asked it
    (``evalq.workers.judge.retiring``): one key per (provider, endpoint, model), for every job."""
    import hashlib

    raw = "|".join((provider, url.rstrip("/"), model))
    return f"{PREFIX}:retires:{hashlib.sha256(raw.encode()).hexdigest()[:16]}"


def accounting(job_id: str, metric_key: str) -> str:
    return f"{job_prefix(job_id)}:acct:{metric_key}"


def accounted(job_id: str, metric_key: str) -> str:
    """The chunk runs whose calls ``accounting`` counts (run id -> 1): their kept items are not
    counted again (``evalq.workers.keeping``)."""
    return f"{job_prefix(job_id)}:acctd:{metric_key}"


def job_tokens(job_id: str) -> str:
    return f"{job_prefix(job_id)}:tokens"


def job_cost(job_id: str) -> str:
    return f"{job_prefix(job_id)}:cost"


def cost_held(counter: str) -> str:
    """The holds of the calls in flight on a cost counter (``job_cost``, ``tenant_spend``): a hash,
    hold id -> ``<amount>:<server time it lapses>`` (``evalq.workers.judge.cost``)."""
    return f"{counter}:held"


def judge_memo(job_id: str) -> str:
    return f"{job_prefix(job_id)}:memo"


def judge_memo_claim(job_id: str, digest: str) -> str:
    """Held (briefly) by the one thread making a memoized call."""
    return f"{job_prefix(job_id)}:memo:claim:{digest}"


BATCH_JOBS = f"{PREFIX}:batch:jobs"


def batch_lock(region: str) -> str:
    return f"{PREFIX}:batch:lock:{region}"


def batch(job_id: str, part: str) -> str:
    """``part`` of job J's Batch API state: line, queued:<region>, touched, sync, open, members:<batch>."""
    return f"{job_prefix(job_id)}:batch:{part}"


def parked(job_id: str) -> str:
    return f"{job_prefix(job_id)}:parked"


# --- sharing queues between jobs (evalq.orchestrator.dispatch) --------------------------------
#   evalq:{J}:pending:{Q}       LIST   chunks of job J waiting in line for a slot on queue Q (JSON descriptors)
#   evalq:sched:{Q}:jobs        SET    jobs with chunks in line on Q
#   evalq:sched:{Q}:out         STRING chunks sent on Q and not finished (re-counted by every sweep)
#   evalq:sched:{Q}:vt          HASH   tenant -> virtual time on Q; "job:<id>" -> the job's
#   evalq:sched:{Q}:log         ZSET   "<job>|<tenant>|<cost>|<nonce>" -> time sent (the last minute's shares)
#   evalq:sched:{Q}:slots       HASH   worker -> "<slots> <time>" (what it runs at once on Q)
#   evalq:sched:{Q}:lock        STRING held by the one dispatcher filling Q ("again": a caller found it held)
#   evalq:sched:queues          SET    queues with jobs in line
#   evalq:backlog:{Q}           STRING chunks planned and not finished on Q (for autoscaling)

SCHED_QUEUES = f"{PREFIX}:sched:queues"
# queue|job -> when a job held off its queue may be sent again (``evalq.orchestrator.holding``)
SCHED_HOLDS = f"{PREFIX}:sched:holds"


def pending(job_id: str, queue: str) -> str:
    return f"{job_prefix(job_id)}:pending:{queue}"


def sched(queue: str, part: str) -> str:
    """``part`` of queue Q's dispatch state: jobs, out, vt, log, slots, lock, hold."""
    return f"{PREFIX}:sched:{{{queue}}}:{part}"


def backlog(queue: str) -> str:
    return f"{PREFIX}:backlog:{queue}"


def all_job_keys(job_id: str, metric_keys: list[str], sinks: list[str] = ()) -> list[str]:
    """Every key of a job; ``metric_keys`` includes ``generate`` when the job had that stage,
    ``sinks`` names the job's sinks besides ``otlp`` (the spec's ``sinks``)."""
    keys = [spec(job_id), instances(job_id), shared_values(job_id), dataset_version(job_id), compared(job_id), summary(job_id), status(job_id), ended(job_id),
            job_tokens(job_id), job_cost(job_id), cost_held(job_cost(job_id)), stage_summary(job_id, "generate"), plan(job_id), error(job_id),
            replied(job_id), reply_targets(job_id), judge_memo(job_id), watch(job_id),
            chunks_done(job_id, "generate"), chunks_done(job_id, "metrics"), parked(job_id),
            batch(job_id, "line"), batch(job_id, "touched"), batch(job_id, "sync"), batch(job_id, "open"),
            sink(job_id, "otlp")]
    for m in metric_keys:
        keys += [results(job_id, m), kept(job_id, m), timings(job_id, m), parts(job_id, m), gathering(job_id, m), views(job_id, m),
                 values(job_id, m), accounting(job_id, m), accounted(job_id, m), recorded(job_id, m), judge_seen(job_id, m),
                 recorded_total(job_id, m)]
        keys += [key(job_id, m, name) for name in ("otlp", *sinks) for key in (exported, sink_none, sink_pending)]
    keys += [sink(job_id, name) for name in sinks]
    return keys
