"""What the operator's tenants (``EVALQ_TENANTS``) make of a request's job, where a request is
taken (``evalq.orchestrator.service``): whose it is, the scheduling it may have, the suites it may
write into, its caps, what it may stage, and the deployments it may spend on."""

from __future__ import annotations

from evalq.shared.core.config import JOBS_QUEUE, tenant_queue
from evalq.shared.core.errors import JobError


def tenant_policy(job, identity: str | None, tenants=None) -> None:
    """The operator's policy for the job's tenant (``tenant_scheduling``), applied to ``job``: its
    suite must be one the tenant may write into, and its cost and token caps are at most the
    tenant's per-job limits (a job's own caps only tighten them)."""
    from evalq.shared.cluster.scheduling import Tenants

    tenants = tenants or Tenants.from_env()
    job.scheduling = tenant_scheduling(job.scheduling, identity, tenants)
    tenant = job.scheduling.tenant
    problem = tenants.suite_problem(tenant, job.suite)
    if problem:
        raise JobError(f"request.suite: {problem}")
    if job.output is not None and isinstance(job.output.otel, str):
        from evalq.shared.core.config import exporter_problem

        problem = exporter_problem(job.output.otel, tenant if tenants.names else None)
        if problem:
            raise JobError(problem)
    for name in job.output.sinks if job.output is not None else ():
        from evalq.shared.core.config import exporter_problem

        problem = exporter_problem(name, tenant if tenants.names else None, "output.sinks", "EVALQ_SINKS")
        if problem:
            raise JobError(problem)
    if tenants.policy(tenants.job_cost, tenant) is not None or tenants.policy(tenants.daily_cost, tenant) is not None:
        unpriced = sorted({d.use for e in _endpoints(job) for d in e.deployments
                           if d.use is not None and d.price is None})
        if unpriced:
            raise JobError(f"request: tenant {tenant!r} has a cost limit (EVALQ_TENANTS), and the operator's "
                           f"catalogue gives no price for {', '.join(map(repr, unpriced))}: its calls could not be "
                           "counted against it (the operator prices them; a job's own price never counts)")
    staged = tenants.policy(tenants.job_staged, tenant)
    if staged is not None:
        problem = staged_problem(job, tenant, staged)
        if problem:
            raise JobError(problem)
    caps = {}
    for field, limit in (("cost_cap", tenants.policy(tenants.job_cost, tenant)),
                         ("token_cap", tenants.policy(tenants.job_tokens, tenant))):
        own = getattr(job.judging, field)
        if limit is not None and (own is None or own > limit):
            caps[field] = limit
    if caps:
        job.judging = job.judging.model_copy(update=caps)


def staged_problem(job, tenant: str, limit: int) -> str | None:
    """Why the job's instances are more than ``tenant`` may store for one job (``job_staged``:
    in the job store, or in the broker's Redis without one), or None. Found before anything is
    stored: its instances as they would be stored, counted from the validated spool."""
    from evalq.shared.core.limits import size
    from evalq.shared.store.instances import staged_bytes

    n = staged_bytes(job.instances)
    if n <= limit:
        return None
    where = f"dataset {job.dataset.uri}" if job.dataset is not None else "request.job.instances"
    return (f"{where}: {len(job.instances)} instances are {size(n)} stored; tenant {tenant!r} may store at most "
            f"{size(limit)} for one job ({tenant}.job_staged in EVALQ_TENANTS): split the dataset or ask the operator")


def _endpoints(job) -> list:
    """The judges the job's entries use, every member of a panel included, and its endpoint model:
    what its calls go to."""
    found = []
    for run in job.metrics:
        if getattr(run, "judge", None) is None:
            continue
        found.append(run.judge)
        found += [job.judges[m] for m in getattr(run.params, "panel", None) or () if m in (job.judges or {})]
    if hasattr(job.model, "deployments"):
        found.append(job.model)
    return found


def tenant_scheduling(fields, identity: str | None, tenants=None):
    """The job's scheduling under its tenant's policy. On a tenant's own queue (``identity``) the
    tenant is that one: a request claiming another is invalid. On the shared evalq.jobs, once the
    operator lists tenants (EVALQ_TENANTS), a request is the default tenant's: it may not claim a
    listed tenant (each writes only its own queue) nor invent one (to escape its caps). A priority
    above the tenant's ``max_priority`` is invalid."""
    from evalq.shared.cluster.scheduling import Tenants

    tenants = tenants or Tenants.from_env()
    claimed = fields.tenant
    if identity is not None:
        if claimed not in (identity, "default"):
            raise JobError(f"request.tenant: {claimed!r}: this request came on {tenant_queue(identity)}, the queue "
                           f"of tenant {identity!r}; a tenant is the queue's, not the request's")
        fields = fields.model_copy(update={"tenant": identity})
    elif tenants.names and claimed != "default":
        where = (f"tenant {claimed!r} submits on its own queue {tenant_queue(claimed)}" if claimed in tenants.names
                 else f"{claimed!r} is not a tenant the operator lists")
        raise JobError(f"request.tenant: {where}; a request on {JOBS_QUEUE} is the default tenant's")
    problem = tenants.priority_problem(fields.tenant, fields.priority)
    if problem:
        raise JobError(f"request.priority: {problem}")
    return fields
