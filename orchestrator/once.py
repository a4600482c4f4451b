"""Each span scored once per suite: nightly runs over overlapping windows of an application's
traces (``dataset.traces.once``, on by default) leave out the spans an earlier run of the same
suite took.

At submission, before the job is stored, each instance's span is claimed in Redis for the job's
suite (a hash per suite and day of the span's start, ``evalq:spans:<tenant/>suite:<day>``, field:
the span id, value: the job id that took it), a thousand at a time in one script: a span nobody
holds is taken, a span this very job holds (a request delivered again) is kept, and any other is
left out and counted (``dataset.spans.already_scored``). Days are remembered for
``EVALQ_TRACE_MEMORY_DAYS`` (30) after their last claim. A job whose every span was taken is an
error that says so.
"""

from __future__ import annotations

from datetime import datetime, timezone

import redis

from evalq.shared.cluster import keys
from evalq.shared.core.config import env_number
from evalq.shared.core.errors import JobError
from evalq.shared.data.instances import SpooledInstances

BATCH = 1000

# KEYS: each span's day hash; ARGV[1]: job id, ARGV[2]: seconds to remember, ARGV[3..]: span ids.
# Returns 1 (this job scores it) or 0 (an earlier run took it) per span.
_CLAIM = """
local out = {}
for i, key in ipairs(KEYS) do
  local span = ARGV[i + 2]
  local holder = redis.call('HGET', key, span)
  if not holder then
    redis.call('HSET', key, span, ARGV[1])
    redis.call('EXPIRE', key, ARGV[2])
    out[i] = 1
  elseif holder == ARGV[1] then
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
"""


def _day(start_ns: int) -> str:
    return datetime.fromtimestamp(start_ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%d")


def only_unscored(r: redis.Redis, job, job_id: str, tenant: str | None = None) -> None:
    """Leave out of ``job`` the spans an earlier run of its suite took (trace datasets with
    ``traces.once``); the others are claimed for ``job_id``."""
    dataset = job.dataset
    if dataset is None or dataset.format != "otlp" or not dataset.traces.once:
        return
    memory = int(env_number("EVALQ_TRACE_MEMORY_DAYS", 30) * 86400)
    scope = f"{tenant}/" if tenant else ""
    claim = r.register_script(_CLAIM)
    kept, taken, batch = SpooledInstances(), 0, []

    def flush() -> None:
        nonlocal taken
        spans = [inst["otel"]["span_id"] for inst in batch]
        days = [keys.scored_spans(f"{scope}{job.suite}", _day(inst["otel"]["start_ns"])) for inst in batch]
        for inst, fresh in zip(batch, claim(keys=days, args=[job_id, memory, *spans])):
            if fresh:
                kept.append(inst)
            else:
                taken += 1
        batch.clear()

    for inst in job.instances:
        batch.append(inst)
        if len(batch) >= BATCH:
            flush()
    if batch:
        flush()
    job.spans["already_scored"] = taken
    if not len(kept):
        raise JobError([f"{dataset.uri}: every span it selects ({taken:,}) was scored by an earlier run of suite "
                        f"{job.suite!r}; nothing new to score (traces.once: false scores them again)"])
    job.instances = kept
