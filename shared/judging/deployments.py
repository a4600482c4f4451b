"""The operator's catalogue of deployments: what a shared deployment may take (TPM, RPM, window,
pacing), its Batch API quota and its price are the operator's, not the job's.

A job (untrusted input) names a catalogue deployment instead of declaring one::

    "deployments": [{"use": "gpt4o-sweden"}, {"use": "gpt4o-eastus2", "tpm": 20000}]

and may ask for *less* than it (a lower ``tpm``/``rpm``, kept on budget keys of its own), never
more, and never another endpoint, window, pacing, quota or price. The catalogue is a JSON file
named by ``EVALQ_CATALOGUE`` on every evalq process that has it (workers, the jobs role, a client
that validates), mounted from a ConfigMap in deploy/k8s::

    {"deployments": {"gpt4o-sweden": {"region": "swedencentral", "endpoint": "https://...",
                                      "deployment": "gpt-4o", "tpm": 450000, "rpm": 2700,
                                      "burst_seconds": 10, "price": {...}, "batch": {...}}},
     "inline": "deny"}

Where the job is validated, each ``use`` is filled in from the catalogue (so plans, queues and
outputs read as before). Where it runs, a worker takes every number from its own catalogue again,
never from the stored spec: the shared budget is ``catalogue-<name>``'s, with the catalogue's
limits, and a job's lower limit is a budget of its own beside it.

A deployment a job declares in full (inline) is what the operator's ``inline`` policy says
(``EVALQ_INLINE_DEPLOYMENTS`` overrides the file's): ``shared`` (the budget keys of the endpoint,
shared with every job that declares it: a single team's cluster, and embedded ``evalq run``, where
the user is the operator), ``own`` (keys of the job's own: its limits hold only itself) or
``deny`` (refused). Default: the catalogue's (``deny`` unless it says); without a catalogue ``own`` on
a cluster's workers and ``shared`` in a client and in embedded ``evalq run``.
"""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from evalq.shared.core.errors import JobError
from evalq.shared.judging.capacity import fill_capacity
from evalq.shared.core.strict import Strict

CATALOGUE_ENV = "EVALQ_CATALOGUE"
INLINE_ENV = "EVALQ_INLINE_DEPLOYMENTS"
INLINE_POLICIES = ("deny", "own", "shared")
WORKER_ENV = "EVALQ_CLUSTER_WORKER"  # set by `evalq worker`: this process is a cluster's worker
NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
USE_FIELDS = {"use", "tpm", "rpm"}  # what a job may write beside ``use``: its lower limits


class Catalogue(Strict):
    deployments: dict[str, Any] = Field(default_factory=dict, description="name -> a deployment, as a job "
                                        "declares one (region, tpm, rpm, endpoint/base_url, ...)")
    inline: Literal["deny", "own", "shared"] = Field(default="deny", description="what inline deployments get")


def load(path: str | Path) -> Catalogue:
    """The catalogue at ``path``, every deployment validated; JobError naming the file and field."""
    from evalq.shared.judging.judges import Deployment
    from evalq.shared.core.problems import Problems, parse_section

    source = str(path)
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise JobError(f"{CATALOGUE_ENV}={source}: cannot be read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise JobError(f"{CATALOGUE_ENV}={source}: not JSON: {exc}") from None
    problems = Problems(source)
    catalogue = parse_section(Catalogue, raw, "catalogue", problems)
    if catalogue is not None:
        for name, entry in catalogue.deployments.items():
            if not NAME.match(name):
                problems.add(f"deployments.{name[:80]}", "a name is 1 to 64 letters, digits and _ . -")
            elif isinstance(entry, dict) and "use" in entry:
                problems.add(f"deployments.{name}.use", "a catalogue deployment names no other")
            else:
                parse_section(Deployment, entry, f"deployments.{name}", problems)
    problems.raise_if_any()
    return catalogue


@functools.lru_cache(maxsize=4)
def _cached(path: str, mtime: float) -> Catalogue:
    return load(path)


def operator_catalogue() -> Catalogue | None:
    """This process's catalogue (``EVALQ_CATALOGUE``), re-read when the file changes; None when unset."""
    path = os.environ.get(CATALOGUE_ENV, "").strip()
    if not path:
        return None
    try:
        mtime = os.stat(path).st_mtime
    except OSError as exc:
        raise JobError(f"{CATALOGUE_ENV}={path}: cannot be read: {exc.strerror or exc}") from None
    return _cached(path, mtime)


def inline_policy(catalogue: Catalogue | None = None) -> str:
    """What a deployment a job declares in full gets here: deny, own or shared. Unset: the
    catalogue's ``inline`` (deny by default); without a catalogue, ``own`` in a cluster's worker
    (a job's declarations hold only itself) and ``shared`` elsewhere (a client, whose checks the
    workers make again; embedded ``evalq run`` gives its workers ``shared``: the user is the operator)."""
    value = os.environ.get(INLINE_ENV, "").strip()
    if value:
        if value not in INLINE_POLICIES:
            raise JobError(f"{INLINE_ENV}: {value!r}: expected one of {', '.join(INLINE_POLICIES)}")
        return value
    catalogue = catalogue if catalogue is not None else operator_catalogue()
    if catalogue is not None:
        return catalogue.inline
    return "own" if os.environ.get(WORKER_ENV) else "shared"


def cluster_inline_policy() -> str:
    """What a cluster's workers (``evalq worker``) give a deployment a job declares in full, with
    this process's settings: ``EVALQ_INLINE_DEPLOYMENTS``, else the catalogue's ``inline``, else ``own``."""
    value = os.environ.get(INLINE_ENV, "").strip()
    if value in INLINE_POLICIES:
        return value
    catalogue = operator_catalogue()
    return catalogue.inline if catalogue is not None else "own"


NO_CATALOGUE = ("no catalogue of deployments is loaded (EVALQ_CATALOGUE is unset): a deployment a job declares "
                "itself runs on budget keys of that job's own (EVALQ_INLINE_DEPLOYMENTS=own), so jobs that declare "
                "the same endpoint do not share its TPM and RPM, and together can exceed them (429s, retries, "
                "waits). List the shared deployments in a catalogue (docs/how-to/catalogue.md), or set "
                "EVALQ_INLINE_DEPLOYMENTS=shared on a single team's cluster.")


def no_catalogue_notice() -> str | None:
    """What a cluster's worker says once at start when it has no catalogue and jobs' own
    deployments get keys of their own; None when that is not so."""
    if operator_catalogue() is not None or inline_policy() != "own":
        return None
    return NO_CATALOGUE


def own_keys(job) -> list[dict]:
    """The deployments a job declares in full and what a cluster's workers give them
    (``cluster_inline_policy``): ``own`` (budget keys of this job's own: not shared with other jobs
    on the same endpoint) or ``deny`` (refused); none where they are ``shared``."""
    policy = cluster_inline_policy()
    if policy == "shared":
        return []
    found = []
    endpoints = [(f"judges.{name}", judge) for name, judge in sorted(job.judges.items())
                 if any(m.judge is judge for m in job.metrics)]
    if getattr(job.model, "deployments", None):
        endpoints.append(("model", job.model))
    for where, config in endpoints:
        for i, d in enumerate(config.deployments):
            if d.use is None:
                found.append({"where": f"{where}.deployments[{i}]", "region": d.region, "policy": policy,
                              "endpoint": d.base_url or d.endpoint})
    return found


def check_env() -> None:
    """Read the catalogue and the inline policy once: a bad one stops any evalq command (exit 2)."""
    inline_policy(operator_catalogue())


def resolve(raw: Any, where: str, problems) -> Any:
    """A job's deployment entry as it runs: ``{"use": name, "tpm"?: n, "rpm"?: n}`` filled in from
    this process's catalogue (its lower limits kept, never higher ones); an inline one as it is,
    unless the inline policy here is ``deny``. Problems are added to ``problems``."""
    if not isinstance(raw, dict):
        return raw
    if "use" not in raw:
        if inline_policy() == "deny":
            problems.add(where, f"deployments declared by a job are not allowed here ({INLINE_ENV}=deny): name one "
                         f"of the operator's catalogue with {{\"use\": NAME}}{_known()}")
        return raw
    name = raw.get("use")
    catalogue = operator_catalogue()
    if catalogue is None:
        problems.add(f"{where}.use", f"no catalogue of deployments here ({CATALOGUE_ENV} is not set)")
        return raw
    if not isinstance(name, str) or name not in catalogue.deployments:
        from evalq.shared.core.problems import did_you_mean

        hint = did_you_mean(str(name), catalogue.deployments) if isinstance(name, str) else ""
        problems.add(f"{where}.use", f"no deployment {str(name)[:80]!r} in the operator's catalogue{hint}{_known()}")
        return raw
    entry = catalogue.deployments[name]
    for key in sorted(set(raw) - USE_FIELDS):
        problems.add(f"{where}.{key}", f"set by the operator's catalogue for {name!r}; a job may only lower "
                     "'tpm' and 'rpm'")
    resolved = {**fill_capacity(entry), "use": name}  # the catalogue's mode, whatever the job lowers
    for key in ("tpm", "rpm"):
        if key in raw:
            asked, allowed = raw[key], _most(entry, key)
            if not isinstance(asked, int) or isinstance(asked, bool) or asked <= 0:
                problems.add(f"{where}.{key}", "expected a whole number > 0 (a job may only lower the operator's "
                             "limit)")
            elif allowed is not None and asked > allowed:
                problems.add(f"{where}.{key}", f"{asked} is more than the {allowed} the operator's catalogue gives "
                             f"{name!r}; a job may only ask for less")
            else:
                resolved[key] = asked
                resolved.pop(f"{key}_floor", None)  # the job's number is a limit of its own, not learned
                resolved.pop(f"{key}_ceiling", None)
    return resolved


def _most(entry: dict, key: str) -> int | None:
    """The most a catalogue entry gives on ``key`` (tpm/rpm): its number, an ``auto`` one's ceiling,
    or None (no limit stated)."""
    value = entry.get(key)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return entry.get(f"{key}_ceiling") if value == "auto" else None


def resolve_endpoint(raw: Any, where: str, problems) -> Any:
    """A judge's or model's section with each of its deployments resolved (``resolve``)."""
    if not isinstance(raw, dict) or not isinstance(raw.get("deployments"), list):
        return raw
    return {**raw, "deployments": [resolve(d, f"{where}.deployments[{i}]", problems)
                                   for i, d in enumerate(raw["deployments"])]}


def _known() -> str:
    catalogue = operator_catalogue()
    names = sorted(catalogue.deployments) if catalogue is not None else []
    return f" (catalogue: {', '.join(names[:20])})" if names else ""


def inline_scope(job_id: str, policy: str | None = None) -> str | None:
    """The scope of the budget keys of a deployment a job declares in full: the job's own under the
    ``own`` inline policy (default: this process's), else none (the endpoint's, shared)."""
    return f"job-{job_id}" if (policy or inline_policy()) == "own" else None


def _lower(asked, most: int) -> int | None:
    """A job's number where it is below what the catalogue allows (its own limit), else None."""
    return asked if isinstance(asked, int) and asked < most else None


def govern(config, job_id: str):
    """The endpoint configuration a worker runs a stored spec's ``config`` with: every ``use``
    deployment taken again from this worker's catalogue (the spec is not trusted: its endpoint,
    window, pacing, quota and price are the catalogue's; its tpm/rpm, when lower, the job's own
    limit), and every inline one as the inline policy says. ValueError saying why it cannot run."""
    catalogue = operator_catalogue()
    policy = inline_policy(catalogue)
    governed = []
    for d in config.deployments:
        if d.use is None:
            if policy == "deny":
                raise ValueError(f"deployment {d.region}: declared by the job, and this worker allows none "
                                 f"({INLINE_ENV}=deny)")
            governed.append(d.with_scope(inline_scope(job_id, policy)))
            continue
        if catalogue is None or d.use not in catalogue.deployments:
            raise ValueError(f"deployment {d.use!r}: not in this worker's catalogue ({CATALOGUE_ENV})")
        entry = type(d).model_validate({**catalogue.deployments[d.use], "use": d.use})
        if entry.region != d.region:
            raise ValueError(f"deployment {d.use!r}: the catalogue puts it in region {entry.region!r}, the job "
                             f"was planned on {d.region!r}; submit it again")
        own = (_lower(d.tpm, entry.tpm_most), _lower(d.rpm, entry.rpm_most))
        governed.append(entry.with_scope(None, (own[0] or entry.tpm_most, own[1] or entry.rpm_most)
                                         if own != (None, None) else None, job_id))
    return config.model_copy(update={"deployments": governed})
