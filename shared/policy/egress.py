"""Where a job's files may be read and written: the operator's lists.

A job (a file, a queue message) is untrusted input, and the cluster reads and
writes with its own identity: its file system, its S3 role. So the cluster
touches only what the operator lists:

- ``EVALQ_S3_ENDPOINTS``: S3-compatible endpoints (MinIO, Ceph, ...) a job may
  name in an ``endpoint_url``, as URL patterns like ``EVALQ_ENDPOINTS``'s
  (``https://minio.internal:9000``, ``http://127.0.0.1:*``), separated by ``,``
  or ``;``. Unset on the cluster (an ``evalq worker``): none, so S3 is AWS's own
  endpoints only and a job's ``endpoint_url`` is refused before anything is
  signed or sent.
- ``EVALQ_S3_PREFIXES``: the ``s3://bucket/prefix`` places the cluster may read
  and write for a job (shell wildcards allowed: ``s3://eval-*/nightly/``).
  Unset on the cluster: none, so a queue request names no bucket at all, and a
  final callback writes no S3 output, unless the operator lists it.
- ``EVALQ_REQUEST_ROOTS``: the local directories (``:``-separated) a queue
  request may name files under; on the cluster, when set, outputs are written
  only under them too. Unset: a request names S3 only.

Once the operator lists tenants (``EVALQ_TENANTS``), every queue request is a
tenant's (``evalq.orchestrator.service``) and reaches only that tenant's part of
each place (``Reach``): ``<root>/<tenant>`` of every request root and
``s3://<prefix>/<tenant>/`` of every S3 prefix, or, where a root or prefix
names ``{tenant}``, that with the tenant put in. What every tenant may read but
none may write (shared datasets, models, baselines) the operator lists apart:
``EVALQ_SHARED_ROOTS`` and ``EVALQ_S3_SHARED_PREFIXES``.

The ``evalq`` command a person runs is the operator of its own process: unset
lists there allow what the job names (its reads use the person's credentials),
and embedded mode gives its private workers exactly the job's own endpoints and
places. Every S3 client is made through ``check_s3`` (``evalq.shared.data.storage``),
so a refused place is never contacted, whichever path asked.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from pathlib import Path

from pydantic_core import PydanticCustomError

from evalq.shared.policy.endpoints import URLPattern

S3_ENDPOINTS_ENV = "EVALQ_S3_ENDPOINTS"
S3_PREFIXES_ENV = "EVALQ_S3_PREFIXES"
ROOTS_ENV = "EVALQ_REQUEST_ROOTS"
SHARED_ROOTS_ENV = "EVALQ_SHARED_ROOTS"
S3_SHARED_PREFIXES_ENV = "EVALQ_S3_SHARED_PREFIXES"
TENANT_MARK = "{tenant}"

_cluster = False


def enforce_on_cluster() -> None:
    """This process is a cluster worker: unset lists allow nothing (called when a worker starts)."""
    global _cluster
    _cluster = True


def on_cluster() -> bool:
    return _cluster


def _split(text: str) -> list[str]:
    return [p.strip() for p in text.replace(";", ",").replace("\n", ",").split(",") if p.strip()]


@dataclass(frozen=True)
class S3Policy:
    endpoints: list[URLPattern] | None  # None: any (the evalq command with the list unset)
    prefixes: list[str] | None  # ``bucket/prefix`` patterns; None: any

    @classmethod
    def from_env(cls, environ=os.environ, cluster: bool | None = None) -> "S3Policy":
        cluster = on_cluster() if cluster is None else cluster
        endpoints = environ.get(S3_ENDPOINTS_ENV)
        prefixes = environ.get(S3_PREFIXES_ENV)
        try:
            parsed = [URLPattern.parse(p) for p in _split(endpoints)] if endpoints is not None else None
        except ValueError as exc:
            from evalq.shared.core.errors import JobError

            raise JobError(f"{S3_ENDPOINTS_ENV}: {exc}") from None
        if parsed is None and cluster:
            parsed = []
        places = [p.removeprefix("s3://") for p in _split(prefixes)] if prefixes is not None else None
        if places is None and cluster:
            places = []
        return cls(parsed, places)

    def for_tenant(self, tenant: str) -> "S3Policy":
        """The places of one tenant: its part of each prefix (``tenant_place``)."""
        if self.prefixes is None:  # the evalq command with the list unset: not a cluster
            return self
        return S3Policy(self.endpoints, [tenant_place(p, tenant) for p in self.prefixes])

    def endpoint_problem(self, endpoint_url: str | None) -> str | None:
        if endpoint_url is None or self.endpoints is None:
            return None
        if any(p.matches(endpoint_url) for p in self.endpoints):
            return None
        allowed = ", ".join(map(str, self.endpoints)) or "none: AWS's own endpoints only"
        return f"S3 endpoint {endpoint_url} is not one this cluster may use ({S3_ENDPOINTS_ENV}: {allowed})"

    def place_problem(self, uri: str) -> str | None:
        if self.prefixes is None:
            return None
        place = uri.removeprefix("s3://")
        bucket = place.partition("/")[0]
        for pattern in self.prefixes:
            pbucket, _, pprefix = pattern.partition("/")
            if fnmatch.fnmatchcase(bucket, pbucket) and _under(place.partition("/")[2], pprefix):
                return None
        allowed = ", ".join(f"s3://{p}" for p in self.prefixes) or "none"
        return f"{uri} is not a place this cluster may read or write ({S3_PREFIXES_ENV}: {allowed})"


def _under(key: str, prefix: str) -> bool:
    """A key within a prefix pattern: the pattern covers whole path segments (``a/b`` covers
    ``a/b`` and ``a/b/c``, not ``a/bc``), and its wildcards never reach across a ``/``."""
    if not prefix or prefix == "*":
        return True
    prefix = prefix.rstrip("/")
    parts, wanted = key.split("/"), prefix.split("/")
    if len(parts) < len(wanted) or ".." in parts:
        return False
    return all(fnmatch.fnmatchcase(part, pat) for part, pat in zip(parts, wanted))


def s3_problem(uri: str, endpoint_url: str | None, policy: S3Policy | None = None) -> str | None:
    """Why the cluster may not touch ``uri`` through ``endpoint_url``, or None."""
    policy = policy or S3Policy.from_env()
    return policy.endpoint_problem(endpoint_url) or policy.place_problem(uri)


def check_s3(uri: str, endpoint_url: str | None) -> None:
    """Raise JobError (naming the URI) unless the operator allows it: called before every S3 client is made."""
    problem = s3_problem(uri, endpoint_url)
    if problem:
        from evalq.shared.core.errors import JobError

        raise JobError(f"{uri}: not read or written: {problem}")


def request_roots(environ=os.environ, tenant: str | None = None) -> list[Path]:
    """Directories a request may name local files under (``EVALQ_REQUEST_ROOTS``,
    separated by ``:``); none by default: a request's files come from S3. With ``tenant``,
    that tenant's part of each (``tenant_place``)."""
    return [Path(tenant_place(p, tenant)).expanduser().resolve() for p in environ.get(ROOTS_ENV, "").split(":") if p]


def tenant_place(place: str, tenant: str | None) -> str:
    """A tenant's part of a root or S3 prefix the operator lists: ``{tenant}`` in it replaced,
    else ``<place>/<tenant>``; without a tenant (nobody listed) the place itself."""
    if tenant is None:
        return place.replace(TENANT_MARK, "default")
    if TENANT_MARK in place:
        return place.replace(TENANT_MARK, tenant)
    return place.rstrip("/") + "/" + tenant


@dataclass(frozen=True)
class Reach:
    """What one queue request may read and write: local roots and S3 places. ``tenant`` None: the
    cluster lists no tenants, and a request reaches every root and prefix the operator lists."""
    tenant: str | None
    read_roots: list[Path]
    write_roots: list[Path]
    s3_read: S3Policy
    s3_write: S3Policy

    @classmethod
    def of(cls, tenant: str | None, environ=os.environ) -> "Reach":
        write = request_roots(environ, tenant)
        shared = [Path(p).expanduser().resolve() for p in environ.get(SHARED_ROOTS_ENV, "").split(":") if p]
        policy = S3Policy.from_env(environ)
        s3_write = policy.for_tenant(tenant) if tenant is not None else policy
        shared_s3 = [p.removeprefix("s3://") for p in _split(environ.get(S3_SHARED_PREFIXES_ENV, ""))]
        s3_read = s3_write if not shared_s3 else S3Policy(
            s3_write.endpoints, (s3_write.prefixes or []) + shared_s3 if s3_write.prefixes is not None else None)
        return cls(tenant, write + [r for r in shared if r not in write], write, s3_read, s3_write)

    def read_problem(self, uri: str, endpoint_url: str | None = None) -> str | None:
        if uri.startswith("s3://"):
            return s3_problem(uri, endpoint_url, self.s3_read)
        return self._local(uri, self.read_roots, "reads")

    def write_problem(self, uri: str, endpoint_url: str | None = None) -> str | None:
        if uri.startswith("s3://"):
            return s3_problem(uri, endpoint_url, self.s3_write)
        return self._local(uri, self.write_roots, "writes")

    def _local(self, uri: str, roots: list[Path], verb: str) -> str | None:
        if not outside_roots(uri, roots):
            return None
        whose = f" for tenant {self.tenant!r}" if self.tenant is not None else ""
        return (f"{uri} is outside the directories this cluster {verb}{whose} "
                f"({', '.join(map(str, roots)) or 'none'}; from {ROOTS_ENV}"
                f"{' and ' + SHARED_ROOTS_ENV if verb == 'reads' and os.environ.get(SHARED_ROOTS_ENV) else ''}); "
                "use S3")


def outside_roots(uri: str, roots: list[Path]) -> bool:
    """A local path (resolved, links followed) that is not under any of ``roots``."""
    if uri.startswith("s3://"):
        return False
    path = Path(uri).expanduser().resolve()
    return not any(path == root or root in path.parents for root in roots)


def roots_problem(uri: str, roots: list[Path]) -> str | None:
    if not outside_roots(uri, roots):
        return None
    return (f"{uri} is outside the directories this cluster reads and writes "
            f"({ROOTS_ENV}: {', '.join(map(str, roots)) or 'none'}); use S3")


def destination_problem(uri: str, endpoint_url: str | None, where: str = "out",
                        tenant: str | None = None) -> str | None:
    """Re-checked by the final callback before it writes (the stored spec is not trusted):
    S3 against the S3 lists, a local directory against ``EVALQ_REQUEST_ROOTS`` when set; with
    ``tenant`` (a queue request's, on a cluster that lists tenants), that tenant's part of them."""
    if uri.startswith("s3://"):
        policy = S3Policy.from_env()
        problem = s3_problem(uri, endpoint_url, policy.for_tenant(tenant) if tenant is not None else policy)
        return f"{where}: {problem}" if problem else None
    if os.environ.get(ROOTS_ENV):
        problem = roots_problem(uri, request_roots(tenant=tenant))
        return f"{where}: {problem}" if problem else None
    return None


def fallback_dir(job_id: str) -> str:
    """Where a final callback puts outputs its destination refused or failed: the operator's
    place, never the job's (under the first request root when roots are set, else ``out/``)."""
    roots = request_roots()
    base = roots[0] / "evalq-fallback" if roots else Path("out")
    return str(base / job_id)


def job_places(job, out: str | None = None) -> dict[str, str]:
    """``EVALQ_S3_ENDPOINTS`` / ``EVALQ_S3_PREFIXES`` values allowing exactly the S3
    endpoints and objects a job names (embedded mode: the user is the operator)."""
    specs = [s for s in (job.dataset, job.output, getattr(job.jailbreak, "dataset", None)) if s is not None]
    endpoints = sorted({s.endpoint_url.rstrip("/") for s in specs if getattr(s, "endpoint_url", None)})
    uris = [s.uri for s in specs] + ([out] if out else [])
    places = sorted({u.removeprefix("s3://").rstrip("/") for u in uris if u and u.startswith("s3://")})
    return {S3_ENDPOINTS_ENV: ",".join(endpoints), S3_PREFIXES_ENV: ",".join(f"s3://{p}" for p in places)}


# --- a path a job's parameter names (pydantic validators) -----------------------------

def local_path(value: str | None, info, kind: str = "file") -> str | None:
    """A parameter naming a local ``file`` or ``directory``: it must exist, and in a queue request
    lie under ``EVALQ_REQUEST_ROOTS`` (never looked at outside them)."""
    import os

    if value is None:
        return value
    roots = request_roots_of(info)
    if roots is not None and outside_roots(value, roots):
        raise PydanticCustomError("local_path", "{path}: a {kind} in a queue request must lie under the "
                                  "directories its tenant may read ({roots}; EVALQ_REQUEST_ROOTS, "
                                  "EVALQ_SHARED_ROOTS)",
                                  {"path": value, "kind": kind, "roots": ", ".join(map(str, roots)) or "none"})
    exists = os.path.isdir if kind == "directory" else os.path.isfile
    if not exists(os.path.expanduser(value)):
        raise PydanticCustomError("local_path", "no such {kind}: {path}", {"path": value, "kind": kind})
    return value


def request_roots_of(info) -> list | None:
    """The request roots a queue request's parameters are validated under (None: a job
    file the operator runs), passed as pydantic's validation context by the job parser."""
    return (info.context or {}).get("roots")
