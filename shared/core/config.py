"""Runtime settings, read from ``EVALQ_*`` environment variables.

One place for every knob so the CLI, the workers and the tests agree.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

CONTROL_QUEUE = "evalq.control"  # stage callbacks
JOBS_QUEUE = "evalq.jobs"  # job requests (evalq.submit_job): the orchestrator role
# A tenant's own request queue: evalq.jobs.<tenant>, which Redis ACLs let only that tenant write
TENANT_QUEUE_PREFIX = JOBS_QUEUE + "."
# processes of a gpu worker, each holding its own model (``evalq worker --gpu-processes``)
GPU_PROCESSES_ENV = "EVALQ_GPU_PROCESSES"
GPU_CPUS_ENV = "EVALQ_GPU_CPUS"  # the CPUs a gpu worker's processes share, where evalq split them


def tenant_queue(tenant: str) -> str:
    return TENANT_QUEUE_PREFIX + tenant


def tenant_of_queue(queue: str | None) -> str | None:
    """The tenant whose request queue ``queue`` is; None for the shared evalq.jobs (or anything else)."""
    return queue[len(TENANT_QUEUE_PREFIX):] if queue and queue.startswith(TENANT_QUEUE_PREFIX) else None


def is_request_queue(queue: str) -> bool:
    return queue == JOBS_QUEUE or queue.startswith(TENANT_QUEUE_PREFIX)


def env_number(name: str, default: int | float) -> int | float:
    """The number in environment variable ``name`` (of ``default``'s type, at least 0),
    or ``default`` when unset; anything else is a JobError naming the variable."""
    raw = os.environ.get(name)
    if not raw:
        return default
    kind = type(default)
    try:
        value = kind(raw)
    except ValueError:
        value = -1
    if not value >= 0:  # negative, or NaN
        from evalq.shared.core.errors import JobError

        raise JobError(f"{name}: expected {'a whole number' if kind is int else 'a number'} >= 0, got {raw!r}")
    return value


RESULT_TTL = 7 * 24 * 3600  # EVALQ_RESULT_TTL unset: seconds an ended job's keys stay in Redis


@dataclass(frozen=True)
class Settings:
    broker_url: str | None
    # Seconds a reserved-but-unacknowledged message stays invisible before Redis
    # redelivers it. Must exceed the longest task, or tasks run twice.
    visibility_timeout: int
    # Seconds job keys live in Redis after the outputs are written.
    result_ttl: int
    # Looking after running jobs (evalq.orchestrator.watch): how often a worker of the
    # evalq.jobs queue sweeps them (0: never), how long a complete stage may wait for its
    # callback, and how long a job may make no progress, with nothing of it queued or
    # running, before its unfinished chunks are sent again.
    sweep_interval: float = 5.0
    callback_grace: float = 10.0
    resume_after: float = 15.0
    # Seconds a stage callback's lease lasts unrenewed: a running callback renews it every
    # third of that, so one that died is known as such (and sent again) this long after.
    callback_lease: float = 30.0
    # Whether a job's cpu/gpu entries over the same instances are scored in one chunk
    # (evalq.orchestrator.submit.group_entries): instances read and decoded once for all of them.
    group_entries: bool = True

    @classmethod
    def from_env(cls) -> "Settings":
        return cls(
            broker_url=os.environ.get("EVALQ_BROKER_URL") or None,
            visibility_timeout=env_number("EVALQ_VISIBILITY_TIMEOUT", 3600),
            result_ttl=env_number("EVALQ_RESULT_TTL", RESULT_TTL),
            sweep_interval=env_number("EVALQ_SWEEP_INTERVAL", 5.0),
            callback_grace=env_number("EVALQ_CALLBACK_GRACE", 10.0),
            resume_after=env_number("EVALQ_RESUME_AFTER", 15.0),
            callback_lease=env_number("EVALQ_CALLBACK_LEASE", 30.0),
            group_entries=bool(env_number("EVALQ_GROUP_ENTRIES", 1)),
        )


def otel_exporters() -> dict[str, str]:
    """The OTLP/HTTP logs endpoints the operator names (``EVALQ_OTEL_EXPORTERS``:
    ``prod=https://otel.acme:4318/v1/logs;lab=http://127.0.0.1:4318/v1/logs``): the only places, with
    the standard ``OTEL_EXPORTER_OTLP_*`` default, that a job's scores may be exported to. A name
    ``<tenant>:<name>`` (``search:prod=...``) is that tenant's alone (``exporter_problem``)."""
    out = {}
    for part in (os.environ.get("EVALQ_OTEL_EXPORTERS") or "").split(";"):
        name, _, url = part.strip().partition("=")
        if name.strip() and url.strip():
            out[name.strip()] = url.strip()
    return out


def exporter_problem(name: str, tenant: str | None, field: str = "output.otel",
                     listing: str = "EVALQ_OTEL_EXPORTERS") -> str | None:
    """Why a job of ``tenant`` may not send its scores to the operator's exporter or sink ``name``,
    or None: one named ``<tenant>:<name>`` is that tenant's alone; one without a tenant is any job's
    (on a cluster that lists no tenants, ``tenant`` None, every one is)."""
    owner, sep, _ = name.partition(":")
    if sep and tenant is not None and owner != tenant:
        return (f"{field}: {name!r} is tenant {owner!r}'s; a job of {tenant!r} may name its own "
                f"({tenant}:<name>) or the operator's shared ones ({listing})")
    return None


# What each kind of score sink needs of an item: Phoenix annotates a span, MLflow a trace (the
# production span or trace the item judged, which only a trace dataset's instances carry).
SINK_KINDS = {"phoenix": "span", "mlflow": "trace"}


def score_sinks() -> dict[str, tuple[str, str]]:
    """The backends the operator lets jobs write scores into besides OTLP (``EVALQ_SINKS``:
    ``phx=phoenix+http://phoenix:6006;ml=mlflow+https://mlflow.acme``): name -> (kind, base URL).
    A name ``<tenant>:<name>`` is that tenant's alone, as an exporter's is. Credentials never appear
    here: ``EVALQ_SINK_<NAME>_HEADERS`` (``sink_headers``)."""
    out = {}
    for part in (os.environ.get("EVALQ_SINKS") or "").split(";"):
        name, _, target = part.strip().partition("=")
        kind, plus, url = target.strip().partition("+")
        if name.strip() and plus and url.strip():
            out[name.strip()] = (kind.strip().lower(), url.strip().rstrip("/"))
    return out


def sink_problem(name: str) -> str | None:
    """Why ``name`` in ``EVALQ_SINKS`` cannot be used (an unknown kind), or None."""
    kind, _ = score_sinks()[name]
    if kind not in SINK_KINDS:
        return f"EVALQ_SINKS: sink {name!r} is of kind {kind!r}; the kinds are {', '.join(sorted(SINK_KINDS))}"
    return None


def sink_headers(name: str) -> dict[str, str]:
    """The headers the operator gives sink ``name`` (its credentials: ``authorization=Bearer ...``),
    from ``EVALQ_SINK_<NAME>_HEADERS`` (the name upper-cased, other than letters and digits as
    ``_``), in ``OTEL_EXPORTER_OTLP_HEADERS``' form: ``key=value`` pairs, comma-separated,
    values URL-encoded."""
    import re
    from urllib.parse import unquote

    raw = os.environ.get(f"EVALQ_SINK_{re.sub(r'[^A-Za-z0-9]', '_', name).upper()}_HEADERS") or ""
    out = {}
    for pair in raw.split(","):
        key, eq, value = pair.partition("=")
        if eq and key.strip():
            out[key.strip().lower()] = unquote(value.strip())
    return out


def cache_dir():
    """Where evalq keeps what outlives a run on this machine (embedded Redis's judge cache, the
    default history store): ``EVALQ_CACHE_DIR``, else ``~/.cache/evalq``."""
    from pathlib import Path

    return Path(os.environ.get("EVALQ_CACHE_DIR") or Path.home() / ".cache" / "evalq")


def redis_tls(url: str | None) -> dict | None:
    """TLS options for a ``rediss://`` URL, or a ``sentinel://`` one with ``EVALQ_SENTINEL_TLS=1``
    (None for plain ``redis://``): the server's certificate is always verified, against
    ``EVALQ_REDIS_CA_FILE`` when set (a private CA), else the system's trust store;
    ``EVALQ_REDIS_CERT_FILE`` and ``EVALQ_REDIS_KEY_FILE`` give a client certificate when the server
    asks for one. Behind sentinels, the sentinels and the primary are spoken to alike."""
    if not url or not (url.startswith("rediss://") or (is_sentinel(url) and sentinel_tls())):
        return None
    import ssl

    options: dict = {"ssl_cert_reqs": ssl.CERT_REQUIRED}
    for key, env in (("ssl_ca_certs", "EVALQ_REDIS_CA_FILE"), ("ssl_certfile", "EVALQ_REDIS_CERT_FILE"),
                     ("ssl_keyfile", "EVALQ_REDIS_KEY_FILE")):
        if os.environ.get(env):
            options[key] = os.environ[env]
    return options


SENTINEL_SCHEME = "sentinel://"
SENTINEL_MASTER_ENV = "EVALQ_SENTINEL_MASTER"  # the monitored primary's name (Celery's ``master_name``)
DEFAULT_SENTINEL_MASTER = "mymaster"


def is_sentinel(url: str | None) -> bool:
    """A Sentinel-managed Redis: ``sentinel://[[user]:password@]host:port[/db];sentinel://host:port;...``
    (the form Celery and kombu document), the primary named by ``EVALQ_SENTINEL_MASTER``."""
    return bool(url) and url.lower().startswith(SENTINEL_SCHEME)


def sentinel_master() -> str:
    return os.environ.get(SENTINEL_MASTER_ENV) or DEFAULT_SENTINEL_MASTER


SENTINEL_TLS_ENV = "EVALQ_SENTINEL_TLS"  # 1: the sentinels and the primary speak TLS (as rediss://)


def sentinel_tls() -> bool:
    return (os.environ.get(SENTINEL_TLS_ENV) or "").strip().lower() in ("1", "true", "yes", "on")


def sentinel_kwargs(url: str | None) -> dict:
    """How the sentinels themselves are spoken to: with TLS where the primary is (``redis_tls``)."""
    tls = redis_tls(url) if is_sentinel(url) else None
    return {"ssl": True, **tls} if tls else {}


def sentinel_parts(url: str) -> tuple[list[tuple[str, int]], str | None, str | None, int]:
    """(sentinels' host and port, the primary's user and password, its database) of a Sentinel URL:
    the credentials and database are the first part's (or any part's that names them)."""
    from urllib.parse import unquote, urlsplit

    hosts, username, password, db = [], None, None, 0
    for part in url.split(";"):
        if not part.strip():
            continue
        split = urlsplit(part.strip())
        hosts.append((split.hostname or "127.0.0.1", split.port or 26379))
        username = username or (unquote(split.username) if split.username else None)
        password = password or (unquote(split.password) if split.password else None)
        if split.path.strip("/").isdigit():
            db = int(split.path.strip("/"))
    return hosts, username, password, db


def redis_client(url: str, **kwargs):
    """A redis-py client for ``url`` (``redis://`` or ``rediss://``, with AUTH in the URL; or a
    Sentinel URL: a client of the current primary, which finds the new one after a failover and
    never writes on a demoted one: a READONLY reply drops the connection and asks the sentinels)."""
    import redis

    if is_sentinel(url):
        from redis.sentinel import Sentinel

        hosts, username, password, db = sentinel_parts(url)
        timeouts = {k: kwargs[k] for k in ("socket_timeout", "socket_connect_timeout") if k in kwargs}
        sentinel = Sentinel(hosts, sentinel_kwargs={"socket_timeout": 5, "socket_connect_timeout": 5, **timeouts,
                                                    **sentinel_kwargs(url)})
        tls = redis_tls(url)
        return sentinel.master_for(sentinel_master(), redis_class=redis.Redis, username=username, password=password,
                                   db=db, **kwargs, **({"ssl": True, **tls} if tls else {}))
    return redis.Redis.from_url(url, **kwargs, **(redis_tls(url) or {}))


def safe_url(url: str | None) -> str:
    """A Redis URL fit to print: the password (or user:password) replaced by ***, and so is
    any secret in the query string (redis-py also reads ``?password=``)."""
    if not url:
        return ""
    from urllib.parse import parse_qsl, urlencode

    head, sep, query = url.partition("?")
    if sep:
        pairs = [(k, "***" if k.lower() in ("password", "username", "ssl_password") else v)
                 for k, v in parse_qsl(query, keep_blank_values=True)]
        url = head + "?" + urlencode(pairs, safe="*/:")
    if "@" not in head:
        return url
    scheme, _, rest = url.partition("://")
    return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"
