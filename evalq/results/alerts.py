"""Regression alerts: one HTTP POST per run that regressed (or whose judge changed), to the operator's
``EVALQ_ALERT_WEBHOOK`` (never a URL from a job: a job file or request is untrusted).

The body is JSON ``{"suite", "job_id", "regressions", "text"}``; ``text`` has one
human-readable line per regression, so a Slack (or Teams, Mattermost) incoming webhook
shows it as it is, with every name a job gave escaped for the chat's markup. Sent once per run: the history store moves the run's alert from
``pending`` to ``sending`` for exactly one caller, then to ``sent`` or ``failed``.
Transient failures (connection errors, timeouts, 429, 5xx) are retried with back-off
(``EVALQ_ALERT_ATTEMPTS``, default 4); a webhook that still fails is logged, and the job
is never failed by it. The URL is never logged (a chat webhook's URL is its secret).
"""

from __future__ import annotations

import json
import logging
import os
import urllib.error
import urllib.request
from urllib.parse import urlsplit

from evalq.shared.core.config import env_number
from evalq.shared.core.display import chat_text

log = logging.getLogger("evalq.history")

WEBHOOK_ENV = "EVALQ_ALERT_WEBHOOK"
TIMEOUT = 10.0


class _Retryable(Exception):
    pass


def text_line(suite: str, job_id: str, found: dict) -> str:
    """One line a person reads in a chat channel; what the job named is escaped for the chat's
    markup and kept to one line (``evalq.shared.core.display.chat_text``)."""
    field = "" if found["field"] in ("mean",) else f" {chat_text(found['field'])}"
    test = "paired" if found.get("paired") else "unpaired"
    return (f"{chat_text(suite)}: {chat_text(found['name'])}{field} regressed to {found['value']:.4g} from {found['baseline']:.4g} "
            f"({found['delta']:+.4g}, p={found['p_value']:.3g}, {test}, n={found['n']}, "
            f"vs last {found['baseline_runs']} run(s)) in job {job_id}")


def judge_line(suite: str, job_id: str, change: dict) -> str:
    """A judge that changed since the suite's last run, in one line: a marked break, not a regression."""
    def who(identity: dict) -> str:
        versions = identity.get("versions") or []
        model = identity.get("model") or identity.get("id", "?")
        shown = f"{model} ({', '.join(versions)})" if versions and versions != [model] else model
        prompt = str(identity.get("prompt") or "")
        return f"{shown}, prompt {prompt.rpartition(':')[2][:8]}" if prompt else shown

    line = (f"{chat_text(suite)}: {chat_text(change['name'])} judge changed: {chat_text(who(change['before']))} -> "
            f"{chat_text(who(change['after']))} in job {job_id}; not compared with the runs before")
    if change.get("migration"):  # what evalq migrate-judge measured between the two
        from evalq.results.judge_breaks import migration_words

        line += f"; {chat_text(migration_words(change['migration']))}"
    return line


def payload(suite: str, job_id: str, regressions: list[dict], judge_changes: list[dict] | None = None) -> dict:
    lines = [text_line(suite, job_id, f) for f in regressions]
    lines += [judge_line(suite, job_id, c) for c in judge_changes or []]
    return {"suite": suite, "job_id": job_id, "regressions": regressions, "judge_changes": judge_changes or [],
            "text": "\n".join(lines)}


def where(url: str) -> str:
    """What a log may say of the webhook: its host, never its path or query."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or '?'}" + (f":{parts.port}" if parts.port else "")


def notify(store, suite: str, job_id: str, regressions: list[dict], judge_changes: list[dict] | None = None) -> bool:
    """Send the run's alert if it is this caller's to send; True when it was delivered."""
    url = os.environ.get(WEBHOOK_ENV, "").strip()
    if not url:
        store.set_alert(job_id, "none")
        log.info("job %s: %d regression(s) in suite %s; no %s to tell", job_id, len(regressions), suite, WEBHOOK_ENV)
        return False
    if urlsplit(url).scheme not in ("http", "https"):
        store.set_alert(job_id, "failed")
        log.error("job %s: %s must be an http(s) URL; the regression alert was not sent", job_id, WEBHOOK_ENV)
        return False
    if not store.claim_alert(job_id):
        return False  # sent (or being sent) by whoever recorded it first
    body = json.dumps(payload(suite, job_id, regressions, judge_changes), ensure_ascii=False).encode()
    try:
        post(url, body)
    except Exception as exc:  # noqa: BLE001  (nothing a webhook does may fail the job)
        store.set_alert(job_id, "failed")
        log.error("job %s: the regression alert to %s failed: %s", job_id, where(url), type(exc).__name__)
        return False
    store.set_alert(job_id, "sent")
    log.info("job %s: %d regression(s) in suite %s sent to %s", job_id, len(regressions), suite, where(url))
    return True


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # the operator named this URL: an answer elsewhere is not followed


def post(url: str, body: bytes) -> None:
    """POST ``body``, retrying transient failures. The standard library, not httpx: httpx logs
    every request's URL at INFO, and this URL is a secret."""
    from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

    attempts = max(1, int(env_number("EVALQ_ALERT_ATTEMPTS", 4)))
    opener = urllib.request.build_opener(_NoRedirect)
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json", "User-Agent": "evalq"})

    def once() -> None:
        try:
            with opener.open(request, timeout=TIMEOUT) as response:
                response.read()
        except urllib.error.HTTPError as exc:
            if exc.code == 429 or exc.code >= 500:
                raise _Retryable(f"HTTP {exc.code}") from None
            raise RuntimeError(f"HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise _Retryable(type(exc).__name__) from None

    for attempt in Retrying(stop=stop_after_attempt(attempts), retry=retry_if_exception_type(_Retryable),
                            wait=wait_exponential(multiplier=0.5, max=8), reraise=True):
        with attempt:
            once()
