"""Where an API key may be sent: the operator's allow-list.

A job names both an endpoint and the environment variable whose key goes there,
and a job is untrusted input: without a check, any job (or a task written
straight into Redis) could send a worker's ``AZURE_OPENAI_API_KEY`` to any host.
Operators therefore give workers (and orchestrators) ``EVALQ_ENDPOINTS``: for
each key variable, the endpoints its key may be sent to::

    EVALQ_ENDPOINTS="AZURE_OPENAI_API_KEY=https://*.openai.azure.com;OPENAI_API_KEY=https://api.openai.com/v1"

Entries are separated by ``;`` or new lines, patterns of one variable by ``,``.
``*`` as the variable name applies to every variable the operator declared as
an API key (``EVALQ_KEY_VARIABLES``: names or shell patterns, default
``*_API_KEY``), and never to ``EVALQ_*`` or ``AWS_*`` variables: a job names
the variable, so a ``*`` that covered every variable would let it send the
broker URL or the cloud's secret key as a Bearer token. A pattern is a URL: the
scheme must be equal, the host matches with shell wildcards (hosts and paths
are compared apart, so a ``*`` in a host never reaches into a path), the port
must be equal (``*`` for any; omitted: the scheme's default),
and the URL's path must start with the pattern's path. Without the variable a
worker sends no key anywhere; embedded mode, whose user is the operator,
allows the job's own endpoints.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from urllib.parse import urlsplit

ENV = "EVALQ_ENDPOINTS"
KEY_VARIABLES_ENV = "EVALQ_KEY_VARIABLES"
DEFAULT_KEY_VARIABLES = "*_API_KEY"
# never a judge's key, whatever the operator's patterns say
NEVER_KEYS = ("EVALQ_*", "AWS_*")
DEFAULT_PORTS = {"https": "443", "http": "80"}


@dataclass(frozen=True)
class URLPattern:
    scheme: str
    host: str
    port: str
    path: str

    @classmethod
    def parse(cls, text: str) -> "URLPattern":
        parts = urlsplit(text.strip())
        if parts.scheme not in DEFAULT_PORTS or not parts.netloc:
            raise ValueError(f"{text!r} is not an http(s) URL pattern")
        host, _, port = parts.netloc.rpartition(":") if _has_port(parts.netloc) else (parts.netloc, "", "")
        return cls(parts.scheme, host.lower(), port or DEFAULT_PORTS[parts.scheme], parts.path.rstrip("/"))

    def __str__(self) -> str:
        return f"{self.scheme}://{self.host}" + (f":{self.port}" if self.port != DEFAULT_PORTS[self.scheme] else "") \
            + self.path

    def matches(self, url: str) -> bool:
        try:
            parts = urlsplit(url)
            port = str(parts.port) if parts.port else DEFAULT_PORTS.get(parts.scheme, "")
        except ValueError:
            return False
        host = (parts.hostname or "").lower()
        path = parts.path.rstrip("/")
        return (parts.scheme == self.scheme and bool(host) and "@" not in parts.netloc
                and fnmatch.fnmatchcase(host, self.host)
                and (self.port == "*" or port == self.port)
                and (path == self.path or path.startswith(self.path + "/") or not self.path))


def _has_port(netloc: str) -> bool:
    return ":" in netloc and not netloc.endswith("]")


class EndpointPolicy:
    """An allow-list: key variable -> URL patterns."""

    def __init__(self, rules: dict[str, list[URLPattern]], source: str = ENV, key_variables: str | None = None):
        self.rules = rules
        self.source = source
        self.key_variables = [p.strip() for p in (key_variables or DEFAULT_KEY_VARIABLES).split(",") if p.strip()]

    @classmethod
    def parse(cls, text: str, source: str = ENV, key_variables: str | None = None) -> "EndpointPolicy":
        rules: dict[str, list[URLPattern]] = {}
        for entry in text.replace("\n", ";").split(";"):
            entry = entry.strip()
            if not entry:
                continue
            var, eq, patterns = entry.partition("=")
            if not eq or not var.strip():
                raise ValueError(f"{source}: {entry!r}: expected VARIABLE=URL_PATTERN[,URL_PATTERN...]")
            rules.setdefault(var.strip(), []).extend(URLPattern.parse(p) for p in patterns.split(",") if p.strip())
        return cls(rules, source, key_variables)

    @classmethod
    def from_env(cls, environ=os.environ) -> "EndpointPolicy | None":
        """The operator's list, or None when ``EVALQ_ENDPOINTS`` is not set."""
        text = environ.get(ENV)
        return cls.parse(text, key_variables=environ.get(KEY_VARIABLES_ENV)) if text is not None else None

    def covered_by_star(self, variable: str) -> bool:
        """Whether a ``*`` entry applies to ``variable``: a declared key variable,
        never one of evalq's own settings or the cloud's credentials."""
        if any(fnmatch.fnmatchcase(variable, p) for p in NEVER_KEYS):
            return False
        return any(fnmatch.fnmatchcase(variable, p) for p in self.key_variables)

    def patterns(self, variable: str) -> list[URLPattern]:
        star = self.rules.get("*", []) if self.covered_by_star(variable) else []
        return self.rules.get(variable, []) + star

    def allows(self, variable: str, url: str) -> bool:
        return any(p.matches(url) for p in self.patterns(variable))

    def problem(self, variable: str, url: str) -> str | None:
        if self.allows(variable, url):
            return None
        allowed = ", ".join(map(str, self.patterns(variable)))
        why = ""
        if "*" in self.rules and not self.covered_by_star(variable):
            why = (f"; '*' does not cover {variable}: it covers only variables declared as API keys "
                   f"({KEY_VARIABLES_ENV}: {', '.join(self.key_variables)}), never EVALQ_* or AWS_*")
        return (f"{url} is not an endpoint {variable}'s key may be sent to (allowed by {self.source}: "
                f"{allowed or 'none'}{why})")


def endpoint_url(provider: str, deployment) -> str:
    """The URL a deployment's calls (and its key) go to."""
    return deployment.endpoint or deployment.base_url or "https://api.openai.com/v1"


def job_endpoints(configs) -> str:
    """An ``EVALQ_ENDPOINTS`` value allowing exactly the endpoints the given judge
    and model configurations name (embedded mode: the user is the operator)."""
    entries = []
    for cfg in configs:
        for d in cfg.deployments:
            url = endpoint_url(cfg.provider, d).rstrip("/")
            entries.append(f"{cfg.api_key_env}={url}")
    return ";".join(sorted(set(entries)))


def worker_policy() -> EndpointPolicy:
    """What a worker enforces: its ``EVALQ_ENDPOINTS``; without one, nothing is allowed."""
    return EndpointPolicy.from_env() or EndpointPolicy({}, source=f"{ENV} (not set on this worker)")
