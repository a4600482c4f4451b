"""The stored job: what a job keeps from its submission to its end, as one typed object.

``evalq.orchestrator.submit.job_spec`` builds its document once, at submission; Redis holds it as
JSON under ``keys.spec`` for the job's retention. Every process reads it through ``load_job`` (the
document as Redis holds it now, None where it has none) or ``stored_job`` (the same, kept for the
process: a stored job never changes), and from then on asks the ``StoredJob``: its retention,
tenant, suite, judges, model, destination, and where its instances and records are kept (one
store each, chosen here, once). No module outside this one reads the document by key or loads it
raw (``tests/unit/test_stored_job.py`` holds the rooms to that); the run plan's reading of its
entries (``evalq.shared.cluster.spec``: runs, spans, chunks, queues) takes a ``StoredJob`` as the
mapping it is.

Versions: 1 is every document an evalq before this module stored (no ``version``); 2 adds
``version``. Both read the same: a field an older document lacks reads as its default here
(retention: the process's ``EVALQ_RESULT_TTL``; scheduling: normal priority, the default tenant).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timezone
from functools import cached_property, lru_cache
from typing import Any

from evalq.shared.cluster import keys
from evalq.shared.cluster.spec import GENERATE, variants_key
from evalq.shared.job.nightly import Regression, Review, suite_of
from evalq.shared.job.run_entry import Document, RunEntry  # noqa: F401  (RunEntry: importable here too)

VERSION = 2  # the document ``job_spec`` writes now
RUNS = ("metrics", GENERATE, "variants")  # the document's runs, read as ``RunEntry``s
DEFAULT_SCHEDULING = {"priority": "normal", "tenant": "default", "weight": 1.0}


def default_retention() -> int:
    """Seconds a job's keys live in Redis where nothing stamped them: this process's
    ``EVALQ_RESULT_TTL`` (``evalq.shared.core.config.RESULT_TTL`` unset)."""
    from evalq.shared.core.config import Settings

    return int(Settings.from_env().result_ttl)


class StoredJob(Document):
    """One job's stored document, typed."""

    def __init__(self, doc: Mapping | None, job_id: str | None = None):
        self._doc = dict(doc._doc if isinstance(doc, StoredJob) else doc or {})
        self.job_id = job_id if job_id is not None else getattr(doc, "job_id", None)

    # -- the mapping the run plan reads (its runs as ``RunEntry``s)
    def __getitem__(self, key: str) -> Any:
        if key in RUNS:
            return self._runs[key]
        return self._doc[key]

    @cached_property
    def _runs(self) -> dict:
        doc = self._doc
        runs: dict = {"metrics": {k: RunEntry(k, e) for k, e in (doc.get("metrics") or {}).items()},
                      "variants": {k: RunEntry(variants_key(k), e) for k, e in (doc.get("variants") or {}).items()}}
        if doc.get(GENERATE) is not None:
            runs[GENERATE] = RunEntry(GENERATE, doc[GENERATE])
        return {k: v for k, v in runs.items() if k in doc}

    def __repr__(self) -> str:
        return f"StoredJob({self.job_id!r}, version {self.version})"

    def to_json(self) -> str:
        """The document as Redis keeps it."""
        return json.dumps(self._doc)

    # -- what the job is
    @property
    def version(self) -> int:
        return int(self._doc.get("version") or 1)

    @property
    def source(self) -> str | None:
        """The job file (or request) it came from."""
        return self._doc.get("source")

    @property
    def n_instances(self) -> int:
        return int(self._doc.get("n_instances") or 0)

    @property
    def submitted_at(self) -> str | None:
        """When it was submitted (ISO 8601, UTC), as its outputs show it."""
        return self._doc.get("submitted_at")

    @property
    def submitted_epoch(self) -> float | None:
        """The same, in Unix time (a time without a zone read as UTC)."""
        if not self.submitted_at:
            return None
        at = datetime.fromisoformat(self.submitted_at.replace("Z", "+00:00"))
        return (at if at.tzinfo else at.replace(tzinfo=timezone.utc)).timestamp()

    @property
    def ttl(self) -> int:
        """Seconds the job's keys live in Redis: what it was stamped with at submission (the
        cluster's ``EVALQ_RESULT_TTL`` then), else this process's setting. The one rule every
        writer of a job's keys follows."""
        stamped = self._doc.get("ttl")
        return int(stamped) if stamped else default_retention()

    @property
    def scheduling(self) -> dict:
        """Priority, tenant and weight (the defaults for a document without them)."""
        return self._doc.get("scheduling") or dict(DEFAULT_SCHEDULING)

    @property
    def tenant(self) -> str | None:
        """The tenant the job names (None in a document without scheduling)."""
        return (self._doc.get("scheduling") or {}).get("tenant")

    @property
    def namespace(self) -> str | None:
        """The tenant of the request queue it came through: the only one whose places its outputs
        may go to (None for a job submitted otherwise)."""
        return self._doc.get("namespace")

    @property
    def store_tenant(self) -> str | None:
        """The tenant whose part of the job store holds it: the request queue's, else the job's."""
        return self.namespace or self.tenant

    @property
    def suite(self) -> str | None:
        """The suite it names (None: the history store names it from the source)."""
        return self._doc.get("suite")

    @property
    def series(self) -> str:
        """The history store's series: its suite, else its file's name."""
        return self.suite or suite_of(self.source or "")

    @property
    def regression(self):
        """How its entries are judged against the suite's earlier runs, resolved (``Regression``)."""
        return Regression.model_validate(self._doc.get("regression") or {}).resolved()

    @property
    def categories(self) -> dict | None:
        return self._doc.get("categories") or None

    @property
    def dataset(self) -> dict | None:
        """The dataset it read (uri, format, mapping, bad records, spans)."""
        return self._doc.get("dataset") or None

    @property
    def review(self):
        """Which of its judged items are chosen for a person's review, resolved (``Review``)."""
        return Review.model_validate(self._doc.get("review") or {}).resolved()

    @property
    def dataset_version(self) -> dict | None:
        """Its instances' version (``evalq.shared.data.versions``: digest, n, rate, ``table`` "store" or "redis")."""
        return self._doc.get("dataset_version") or None

    @property
    def jailbreak(self) -> dict | None:
        return self._doc.get("jailbreak") or None

    # -- where its outputs and replies go
    @property
    def out(self) -> str | None:
        return self._doc.get("out")

    @property
    def destination(self):
        """Where its outputs go (``Destination``), None where it names nowhere."""
        from evalq.shared.data.storage import Destination

        return Destination(self.out, self._doc.get("out_endpoint_url")) if self.out else None

    @property
    def request_id(self) -> Any:
        return self._doc.get("request_id")

    @property
    def reply_to(self) -> str | None:
        return self._doc.get("reply_to")

    @property
    def message_id(self) -> str | None:
        """The id of the queue message that submitted it (``evalq.submit_job``)."""
        return self._doc.get("message_id")

    @property
    def request_fingerprint(self) -> str | None:
        """What its queue request asked, digested (a request id sent again with another job is refused)."""
        return self._doc.get("request_fingerprint")

    @property
    def binding(self) -> str | None:
        """The key binding its queue request to it (None for a job submitted otherwise)."""
        return keys.request_binding(self.namespace, self.request_id, self.message_id) if self.message_id else None

    @property
    def log_parameters(self) -> bool:
        """Whether log.jsonl lines carry their entry's parameters."""
        return self._doc.get("log_parameters", True) is not False

    @property
    def otel_export(self) -> bool | str | None:
        """The job's ``output.otel``: None, False, or an exporter's name."""
        return self._doc.get("otel_export")

    @property
    def sinks(self) -> list[str]:
        """The operator's score sinks it exports to, by name."""
        return list(self._doc.get("sinks") or ())

    # -- its runs
    @property
    def metrics(self) -> "dict[str, RunEntry]":
        """Metric key -> entry, in job order."""
        return self._runs.get("metrics") or {}

    @property
    def generate(self) -> "RunEntry | None":
        """The generation stage's entry, where the model under test answers."""
        return self._runs.get(GENERATE)

    @property
    def variants(self) -> "dict[str, RunEntry]":
        """Metric key -> its variants run's entry."""
        return self._runs.get("variants") or {}

    def entry(self, key: str) -> "RunEntry":
        """Any run's entry by its key (KeyError where the job has no such run)."""
        from evalq.shared.cluster.spec import entry_of

        return entry_of(self, key)

    # -- who it calls
    @property
    def judges(self) -> dict[str, dict]:
        """Judge name -> configuration as stored (naming its key's environment variable, never the key)."""
        return self._doc.get("judges") or {}

    @cached_property
    def judging(self):
        """Its ``JudgingOptions``."""
        from evalq.shared.judging.judges import JudgingOptions

        return JudgingOptions.model_validate(self._doc.get("judging") or {})

    def judge(self, name: str):
        """Judge ``name``'s configuration (``JudgeConfig``; KeyError where the job has none)."""
        return _judge(json.dumps(self.judges[name], sort_keys=True))

    @property
    def model(self) -> dict | None:
        """The model under test's configuration as stored, where the job calls it."""
        return self._doc.get("model")

    def endpoint(self, name: str, governed_for: str | None = None):
        """What judge ``name`` is, or the model under test (``generate``); with the ``governed_for``
        job id of a worker that calls it, as the operator's catalogue and inline policy govern it
        (``evalq.shared.judging.deployments.govern``: ValueError when it may not run here)."""
        from evalq.shared.model.runners import PythonModel, parse_model_config

        config = parse_model_config(self.model) if name == GENERATE else self.judge(name)
        if governed_for is None or isinstance(config, PythonModel):
            return config
        from evalq.shared.judging.deployments import govern

        return govern(config, governed_for)

    def priced(self, key: str, entry: Mapping) -> bool:
        """Whether the endpoint a run calls (its judge or panel, or the model under test) has a price."""
        from evalq.shared.cluster.spec import is_model_run
        from evalq.shared.model.runners import parse_model_config

        if is_model_run(key):
            return bool(getattr(parse_model_config(self.model), "priced", False)) if self.model else False
        params = entry.get("parameters") or {}
        names = params.get("panel") or [params.get("judge")]  # a panel: any member's
        return any(n in self.judges and self.judge(n).priced for n in names)

    @property
    def auto_deadline(self) -> float:
        """When its ``auto`` judge calls go synchronously (Unix time): ``judging.deadline`` from
        its submission (0.0, at once, for a document without a submission time)."""
        if not self.submitted_at:
            return 0.0
        return self.judging.deadline_at(datetime.fromisoformat(self.submitted_at)).timestamp()

    # -- where its bulk lives
    @property
    def staged(self) -> dict | None:
        """Where the job store holds its instances (``evalq.shared.store.instances.stage``), None
        where they are in Redis."""
        return self._doc.get("instances") or None

    @property
    def place(self):
        """Its folder in the job store (``Place``), None where it was not staged there."""
        from evalq.shared.store.place import Place

        return Place.from_json(self.staged) if self.staged else None

    @property
    def running(self) -> dict | None:
        """Where the store keeps the marker that it runs (``evalq.shared.store.ledger``), None for a
        job outside the store."""
        return self._doc.get("running") or None

    @cached_property
    def instances(self):
        """Its instances' store (``evalq.shared.store.instances``), chosen once."""
        from evalq.shared.store.instances import instances_of

        return instances_of(self.staged, self.job_id)

    @cached_property
    def records(self):
        """Its item records' store (``evalq.shared.store.records``), chosen once."""
        from evalq.shared.cluster.spec import runs, span
        from evalq.shared.store.records import PARTS, records_of

        if self._doc.get("records") != PARTS or self.staged is None:
            return records_of(self.job_id, None, {})
        return records_of(self.job_id, self.staged, {key: (entry["chunk_size"], entry.get("part_size"),
                                                           span(self, entry)) for key, entry in runs(self)})


def as_stored(doc: Mapping | None, job_id: str | None = None) -> StoredJob:
    """``doc`` as a ``StoredJob`` (itself where it is one): for what takes a stored job and is also
    given a document built by hand (a test's, an outline's)."""
    return doc if isinstance(doc, StoredJob) else StoredJob(doc, job_id)


@lru_cache(maxsize=64)
def _judge(raw: str):
    from evalq.shared.judging.judges import JudgeConfig

    return JudgeConfig.model_validate(json.loads(raw))


def load_job(r, job_id: str, get=None) -> StoredJob | None:
    """The job as Redis holds it now, None where it has none (expired, never submitted, or not
    stored yet): the one way its document is read (``get``: how to GET its key, ``r.get`` unless
    the caller rides out an outage). ``stored_job`` keeps what it read for the process."""
    raw = (get or r.get)(keys.spec(job_id))
    return StoredJob(json.loads(raw), job_id) if raw is not None else None


def is_stored(r, job_id: str) -> bool:
    """Whether Redis holds the job's document now (without reading it)."""
    return bool(r.exists(keys.spec(job_id)))


@lru_cache(maxsize=64)
def stored_job(r, job_id: str) -> StoredJob:
    """The job from Redis, kept per process (a stored job never changes); LookupError where Redis
    has none."""
    job = load_job(r, job_id)
    if job is None:
        raise LookupError(f"job {job_id} has no spec in Redis (expired or never submitted)")
    return job


def store(pipe, job_id: str, doc: Mapping, ttl: int) -> None:
    """Queue on ``pipe`` the job's document under its key, for ``ttl`` seconds."""
    pipe.set(keys.spec(job_id), StoredJob(doc).to_json(), ex=ttl)
