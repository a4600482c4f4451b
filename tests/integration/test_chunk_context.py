"""Issue 39: a chunk reads its job's context once. Following one chunk from evalq.score_chunk to
its records, every step used to go back to the stored spec on its own (9 places in the chunk path);
the chunk now reads one ChunkContext (spec, entry, metric and parameters, endpoint, whether its
instances wait on generated outputs or variants) and passes it. Real Redis, the chunk path run
in this process as a worker runs it."""

from __future__ import annotations

import json

import pytest
import redis

from evalq.orchestrator import submit
from evalq.shared.cluster import keys
from evalq.shared.job.schema import parse_job
from evalq.workers import chunk, context

pytestmark = pytest.mark.integration


def test_a_chunk_reads_its_jobs_context_once(redis_url, monkeypatch):
    monkeypatch.setenv("EVALQ_GROUP_ENTRIES", "0")  # each entry's chunk on its own (test_together: grouped)
    r = redis.Redis.from_url(redis_url)
    job = parse_job({"instances": [{"id": f"i{k}", "actual-output": "a b", "expected-output": ["a b", "c"],
                                    "human": {"bleu": 1}} for k in range(8)],
                     "metrics": [{"id": "bleu"}, {"id": "exact_match", "name": "em"}]})
    job_id = submit.store_job(r, job, submit.job_spec(job))
    reads = []
    real = context.stored_job
    monkeypatch.setattr(context, "stored_job", lambda *a: reads.append(a) or real(*a))
    context._read.cache_clear()
    for key in ("bleu@0", "exact_match@1"):
        out = chunk.run_chunk(r, job_id, key, 0, 4)
        assert out == {"metric": key, "start": 0, "n": 4}
    assert len(reads) == 2  # once per entry, for the chunk's whole path
    chunk.run_chunk(r, job_id, "bleu@0", 4, 8)  # the next chunk of the entry: read already
    assert len(reads) == 2
    records = {k: json.loads(v) for k, v in r.hgetall(keys.results(job_id, "bleu@0")).items()}
    assert len(records) == 8 and all(rec["human"] == 1 for rec in records.values())  # the entry's human grades
    ctx = context.ChunkContext.read(r, job_id, "exact_match@1")
    assert (ctx.human, ctx.needs_generated, ctx.needs_variants, ctx.model_run) == ("em", False, False, False)
