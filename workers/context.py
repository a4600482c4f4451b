"""What a chunk needs of its job, read once: ``ChunkContext``.

A chunk of one metric entry reads its job's stored spec, the entry, the metric and its validated
parameters, the name its human grades go by, whether its instances wait on the generation stage's
outputs or on the variants the model answered, and (for an entry that calls a judge or the model)
the endpoint the operator's catalogue governs. Every step of the chunk path takes this one object
instead of going back to the spec on its own. A process keeps the context of the chunks it ran
lately: the next chunk of the same entry reads nothing again.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any

import redis

import evalq.shared.job.catalogue  # noqa: F401  (registers every metric a job may name)
from evalq.shared.cluster.spec import entry_of, is_model_run, is_variants, retention, span, stored_spec
from evalq.shared.metrics.registry import REGISTRY, MetricSpec
from evalq.shared.model.runners import GENERATE, GENERATE_SPEC


@dataclass
class ChunkContext:
    r: redis.Redis
    job_id: str
    key: str              # the entry's run key: a metric entry, ``generate``, or an entry's variants run
    spec: dict            # the job's stored spec
    entry: dict           # the run's entry in it
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
        return not self.model_run and GENERATE in self.spec

    @property
    def needs_variants(self) -> bool:
        """Its items read what the model answered to their variants."""
        return not self.model_run and bool(self.metric.variants)

    @property
    def human(self) -> str | None:
        """The name human grades use for this entry (its ``name``, else its metric id)."""
        return None if self.model_run else self.entry.get("name") or self.entry["id"]

    @property
    def ttl(self) -> int:
        return retention(self.spec)

    @property
    def span(self) -> int:
        """The instances the entry runs over."""
        return span(self.spec, self.entry)

    @property
    def tenant(self) -> str | None:
        return (self.spec.get("scheduling") or {}).get("tenant")

    @property
    def endpoint_name(self) -> str:
        """The judge the entry calls, or ``generate`` for the model under test."""
        return GENERATE if self.model_run else self.params.judge

    @cached_property
    def records(self) -> Any:
        """Where the job's item records are kept (``evalq.shared.store.records``), chosen once."""
        from evalq.shared.store.records import records_of

        return records_of(self.spec, self.job_id)

    @cached_property
    def endpoint(self) -> tuple[Any, Any]:
        """(configuration, judging options) of the judge or model the entry calls, governed by this
        worker's catalogue and inline policy (ValueError saying why it may not run here)."""
        from evalq.shared.judging.judges import JudgingOptions
        from evalq.shared.model.runners import endpoint_config

        options = JudgingOptions.model_validate(self.spec["judging"])
        config = endpoint_config(self.spec, self.endpoint_name, self.job_id)
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
        return bool(self.spec.get("variants")) if self.model_run else self.metric.memo


@lru_cache(maxsize=256)
def _read(r: redis.Redis, job_id: str, key: str) -> ChunkContext:
    spec = stored_spec(r, job_id)
    entry = entry_of(spec, key)
    if key == GENERATE:
        metric = GENERATE_SPEC
    elif is_variants(key):
        metric = REGISTRY.get(entry["id"]).variants_spec()
    else:
        metric = REGISTRY.get(entry["id"])
    return ChunkContext(r, job_id, key, spec, entry, metric, metric.params.model_validate(entry["parameters"]),
                        entry.get("prepared"))
