"""What a chunk needs of its job, read once: ``ChunkContext``.

A chunk of one metric entry reads its stored job (``evalq.shared.job.stored.StoredJob``, which
carries where its instances and records are kept), the entry, the metric and its validated
parameters, the name its human grades go by, whether its instances wait on the generation stage's
outputs or on the variants the model answered, and (for an entry that calls a judge or the model)
the endpoint the operator's catalogue governs. Every step of the chunk path takes this one object
instead of going back to the job on its own. A process keeps the context of the chunks it ran
lately: the next chunk of the same entry reads nothing again.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any

import redis

import evalq.shared.job.catalogue  # noqa: F401  (registers every metric a job may name)
from evalq.shared.cluster.spec import is_model_run, is_variants, span
from evalq.shared.job.stored import RunEntry, StoredJob, stored_job
from evalq.shared.metrics.registry import REGISTRY, MetricSpec
from evalq.shared.model.runners import GENERATE, GENERATE_SPEC


@dataclass
class ChunkContext:
    r: redis.Redis
    job_id: str
    key: str              # the entry's run key: a metric entry, ``generate``, or an entry's variants run
    job: StoredJob        # the stored job
    entry: RunEntry       # the run's entry in it
    metric: MetricSpec
    params: Any           # the entry's parameters, validated
    prepared: Any         # what the orchestrator prepared for the whole entry (bertscore's idf, ...)

    @classmethod
    def read(cls, r: redis.Redis, job_id: str, key: str) -> "ChunkContext":
        return _read(r, job_id, key)

    @property
    def model_run(self) -> bool:
        """The model under test answering (generation, or an entry's variants)."""
        return is_model_run(self.key)

    @property
    def variants_run(self) -> bool:
        return is_variants(self.key)

    @property
    def needs_generated(self) -> bool:
        """Its instances may lack an output the generation stage recorded for them."""
        return not self.model_run and self.job.generate is not None

    @property
    def needs_variants(self) -> bool:
        """Its items read what the model answered to their variants."""
        return not self.model_run and bool(self.metric.variants)

    @property
    def human(self) -> str | None:
        """The name human grades use for this entry (its ``name``, else its metric id)."""
        return None if self.model_run else self.entry.human

    @property
    def ttl(self) -> int:
        return self.job.ttl

    @property
    def span(self) -> int:
        """The instances the entry runs over."""
        return span(self.job, self.entry)

    @property
    def tenant(self) -> str | None:
        return self.job.tenant

    @property
    def endpoint_name(self) -> str:
        """The judge the entry calls, or ``generate`` for the model under test."""
        return GENERATE if self.model_run else self.params.judge

    @property
    def records(self) -> Any:
        """Where the job's item records are kept (``evalq.shared.store.records``), chosen once by the job."""
        return self.job.records

    @property
    def instances(self) -> Any:
        """Where the job's instances are kept (``evalq.shared.store.instances``), chosen once by the job."""
        return self.job.instances

    @cached_property
    def endpoint(self) -> tuple[Any, Any]:
        """(configuration, judging options) of the judge or model the entry calls, governed by this
        worker's catalogue and inline policy (ValueError saying why it may not run here)."""
        options = self.job.judging
        config = self.job.endpoint(self.endpoint_name, self.job_id)
        if self.endpoint_name == GENERATE:
            # the token cap bounds judge spend (the cost cap, money, bounds both); generation follows
            # the model's own cache setting
            return config, options.model_copy(update={"cache": getattr(config, "cache", False), "token_cap": None})
        return config, options

    @property
    def memo(self) -> bool:
        """Whether the entry's calls share the job's memo: the model's runs do when there are
        variants (a variants run asks the unperturbed prompt the generation run asks too, in the
        same stage: the first asks, the other waits for it), a metric when its registry entry says."""
        return bool(self.job.variants) if self.model_run else self.metric.memo


@lru_cache(maxsize=256)
def _read(r: redis.Redis, job_id: str, key: str) -> ChunkContext:
    job = stored_job(r, job_id)
    entry = job.entry(key)
    if key == GENERATE:
        metric = GENERATE_SPEC
    elif is_variants(key):
        metric = REGISTRY.get(entry.id).variants_spec()
    else:
        metric = REGISTRY.get(entry.id)
    return ChunkContext(r, job_id, key, job, entry, metric, metric.params.model_validate(entry.parameters),
                        entry.prepared)
