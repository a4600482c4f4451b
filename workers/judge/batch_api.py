"""The providers' Batch API as a judge path (issue #24): the calls; the orchestration is
``evalq.workers.judge.batches``.

One ``BatchClient`` per (judge, deployment that declares ``batch``) speaks the OpenAI
Batch API through the ``openai`` SDK, in OpenAI's form (``/v1/chat/completions``,
each line's ``body.model`` the judge's model) or Azure OpenAI's (``AzureOpenAI`` with
the judge's api-version, ``/chat/completions``, ``body.model`` the global-batch
deployment): upload a JSON Lines file (``files.create(purpose="batch")``), create the
batch, poll it, read its output and error files back as one outcome per line (a
``Reply`` exactly as a synchronous call gives it, or a ``LineError``), cancel it.
The SDK client is ``evalq.workers.judge.client.sdk_client``'s: the key is read only
for an endpoint the allow-list (``EVALQ_ENDPOINTS``) lets it go to, and a refused one
raises ``JudgeError`` before anything is sent.

Pure of Redis and Celery: what a batch holds, where it is stored and when it is
polled (``poll_delay``) is the caller's business. A line's ``custom_id``
(``custom_id``/``parse_custom_id``) names the (job, entry, item, call) it answers.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass, field
from typing import Callable, Iterable

import openai
from openai.types.chat import ChatCompletion

from evalq.shared.judging.judge_reply import Reply, reply_from_completion
from evalq.shared.judging.judges import Deployment, JudgeConfig
from evalq.shared.judging.tokens import estimate_request_tokens
from evalq.workers.judge.client import sdk_client

ENDPOINTS = {"openai": "/v1/chat/completions", "azure": "/chat/completions"}
STATES = ("validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled")
ENDED = frozenset({"completed", "failed", "expired", "cancelled"})
MAX_LINES = {"openai": 50_000, "azure": 100_000}   # requests per batch file
MAX_FILE_BYTES = 200 * 1024 * 1024                 # and its size (both providers)
MAX_METADATA = 16                                  # pairs; keys <= 64, values <= 512 characters
FILE_TIMEOUT = 600.0  # seconds for an upload or a download (a chat call's timeout is too short for 200 MB)
OUTPUT_MAX_ENV = "EVALQ_BATCH_OUTPUT_MAX_BYTES"  # the operator's bound on a batch's output files

# custom_id: "ev1-<job 10>-<entry 8>-<item>-<call 16>", at most 64 characters of [a-z0-9-]
# (OpenAI keeps 64; Anthropic's batches take ^[a-zA-Z0-9_-]{1,64}$). Job and entry are
# hashed (any job id, any entry key); the call is its request digest's first 64 bits.
CUSTOM_ID_VERSION = "ev1"
MAX_CUSTOM_ID = 64
_CUSTOM_ID = re.compile(r"^ev1-(?P<job>[0-9a-f]{10})-(?P<entry>[0-9a-f]{8})-(?P<item>\d{1,12})-(?P<call>[0-9a-f]{16})$")
_DIGEST = re.compile(r"^[0-9a-f]{16,}$")


class BatchApiError(Exception):
    """A Files or Batches call failed; ``retryable`` for 408/409/429/5xx, timeouts and
    lost connections (worth trying again later), not for a refused request."""

    def __init__(self, message: str, retryable: bool, status_code: int | None = None):
        super().__init__(message)
        self.retryable, self.status_code = retryable, status_code


class OutputTooLarge(BatchApiError):
    """A batch's output or error file larger than its lines can take (``output_limit``)."""


# -- custom_id --------------------------------------------------------------------------

def _tag(text: str, n: int) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:n]


@dataclass(frozen=True)
class CallRef:
    """What one batch line answers: a call (``digest``: the sha256 hex of its request,
    as the judge client keys its memo and cache) of item ``item`` of entry ``entry_key``
    (``MetricRun.key``) of job ``job_id``."""

    job_id: str
    entry_key: str
    item: int
    digest: str

    @property
    def custom_id(self) -> str:
        return custom_id(self.job_id, self.entry_key, self.item, self.digest)


@dataclass(frozen=True)
class ParsedId:
    """A custom_id read back: the hashed job and entry, the item, the call's digest prefix."""

    job_tag: str
    entry_tag: str
    item: int
    call: str

    def matches(self, ref: CallRef) -> bool:
        return (self.job_tag, self.entry_tag, self.item, self.call) == \
            (_tag(ref.job_id, 10), _tag(ref.entry_key, 8), ref.item, ref.digest[:16])


def custom_id(job_id: str, entry_key: str, item: int, digest: str) -> str:
    """The custom_id of a call: safe characters only, at most 64 of them."""
    if not isinstance(item, int) or isinstance(item, bool) or not 0 <= item < 10**12:
        raise ValueError(f"item position must be an integer in [0, 10**12), got {item!r}")
    if not _DIGEST.match(digest):
        raise ValueError("digest must be a lower-case hex sha256 (at least 16 characters)")
    return f"{CUSTOM_ID_VERSION}-{_tag(job_id, 10)}-{_tag(entry_key, 8)}-{item}-{digest[:16]}"


def parse_custom_id(text: str) -> ParsedId:
    """ValueError for a custom_id evalq did not write."""
    match = _CUSTOM_ID.match(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"not an evalq batch custom_id: {str(text)[:80]!r}")
    return ParsedId(match["job"], match["entry"], int(match["item"]), match["call"])


def index_calls(refs: Iterable[CallRef]) -> dict[str, CallRef]:
    """custom_id -> the call it names, for reading a batch's outcomes back; a
    custom_id given twice (the same call of one item twice) is a ValueError: a batch
    refuses duplicates, and one answer serves both."""
    index: dict[str, CallRef] = {}
    for ref in refs:
        cid = ref.custom_id
        if cid in index:
            raise ValueError(f"two lines with custom_id {cid} ({ref.entry_key}, item {ref.item}): send the call once")
        index[cid] = ref
    return index


# -- input file ---------------------------------------------------------------------------

def batch_model(judge: JudgeConfig, d: Deployment) -> str:
    """What each line's ``body.model`` names: the judge's model (OpenAI) or the
    global-batch deployment (Azure: ``batch.deployment``, else the deployment's own)."""
    if judge.provider == "azure":
        return (d.batch.deployment if d.batch is not None and d.batch.deployment else None) or d.deployment
    return judge.model


def request_line(judge: JudgeConfig, d: Deployment, cid: str, body: dict) -> dict:
    """One line of a batch input file: the chat request ``body`` (as the synchronous
    path sends it) with its ``model`` set for the provider's batch."""
    return {"custom_id": cid, "method": "POST", "url": ENDPOINTS[judge.provider],
            "body": {**body, "model": batch_model(judge, d)}}


def input_file(judge: JudgeConfig, d: Deployment, lines: Iterable[tuple[str, dict]]) -> bytes:
    """The JSON Lines input file of (custom_id, chat request body) pairs, checked as
    the provider checks it (unique custom_ids of at most 64 characters, a bounded
    number of lines and bytes): ValueError otherwise."""
    out, seen = [], set()
    for cid, body in lines:
        if not isinstance(cid, str) or not 0 < len(cid) <= MAX_CUSTOM_ID:
            raise ValueError(f"custom_id must be 1 to {MAX_CUSTOM_ID} characters: {str(cid)[:80]!r}")
        if cid in seen:
            raise ValueError(f"custom_id {cid!r} given twice")
        seen.add(cid)
        out.append(json.dumps(request_line(judge, d, cid, body), ensure_ascii=False, separators=(",", ":")))
    if not out:
        raise ValueError("a batch needs at least one line")
    if len(out) > MAX_LINES[judge.provider]:
        raise ValueError(f"{len(out)} lines: a {judge.provider} batch takes at most {MAX_LINES[judge.provider]}")
    data = ("\n".join(out) + "\n").encode("utf-8")
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"{len(data):,} bytes: a batch file takes at most {MAX_FILE_BYTES:,}")
    return data


def estimate_tokens(bodies: Iterable[dict], default_max_tokens: int) -> int:
    """A batch's enqueued tokens as its deployment's quota counts them: per line the
    prompt estimate (messages, schema, tools) plus ``max_tokens`` per choice."""
    total = 0
    for body in bodies:
        limit = body.get("max_completion_tokens") or body.get("max_tokens") or default_max_tokens
        total += estimate_request_tokens(body) + int(limit) * int(body.get("n") or 1)
    return total


def poll_delay(attempt: int, first: float = 5.0, cap: float = 300.0, jitter: float = 0.2,
               rand: Callable[[], float] = random.random) -> float:
    """Seconds before poll number ``attempt`` (0 first): ``first`` doubling up to ``cap``,
    each spread by +-``jitter`` (a share) so that many batches do not poll in step."""
    base = min(cap, first * 2 ** min(max(attempt, 0), 64))
    return max(0.0, base * (1 + jitter * (2 * rand() - 1)))


# -- status and outcomes ----------------------------------------------------------------------

@dataclass(frozen=True)
class BatchStatus:
    """A batch as one poll saw it. Times are Unix seconds (the provider's clock)."""

    id: str
    state: str                      # one of STATES
    total: int = 0                  # lines (0 while validating)
    completed: int = 0
    failed: int = 0
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int | None = None
    in_progress_at: int | None = None
    expires_at: int | None = None   # end of the completion window
    errors: tuple[str, ...] = ()    # why the whole batch failed (validation, enqueued-token limit)
    error_codes: tuple[str, ...] = ()
    metadata: dict = field(default_factory=dict)

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    def expected_end(self, now: float) -> float | None:
        """When it should be done: extrapolated from the lines answered so far, else
        the end of its window (None once it ended)."""
        if self.ended:
            return None
        done = self.completed + self.failed
        if self.state == "in_progress" and self.in_progress_at and self.total and 0 < done < self.total:
            estimate = self.in_progress_at + (now - self.in_progress_at) * self.total / done
            return min(estimate, self.expires_at) if self.expires_at else estimate
        return float(self.expires_at) if self.expires_at else None


def status_of(batch) -> BatchStatus:
    """The SDK's ``Batch`` as a BatchStatus."""
    counts = batch.request_counts
    errors = (batch.errors.data or []) if batch.errors is not None else []
    return BatchStatus(
        id=batch.id, state=batch.status, total=getattr(counts, "total", 0) or 0,
        completed=getattr(counts, "completed", 0) or 0, failed=getattr(counts, "failed", 0) or 0,
        output_file_id=batch.output_file_id, error_file_id=batch.error_file_id, created_at=batch.created_at,
        in_progress_at=batch.in_progress_at, expires_at=batch.expires_at,
        errors=tuple(f"{e.code}: {e.message}" + (f" (line {e.line})" if e.line else "") for e in errors),
        error_codes=tuple(str(e.code) for e in errors), metadata=dict(batch.metadata or {}))


@dataclass(frozen=True)
class LineError:
    """A line without a reply. ``kind``: ``failed`` (the provider answered an error, or
    the whole batch failed), ``expired`` (not done in the window), ``cancelled``, or
    ``missing`` (in neither file)."""

    kind: str
    code: str
    message: str
    status_code: int | None = None

    @property
    def retryable(self) -> bool:
        """Whether sending it again may succeed (in the next batch, or synchronously)."""
        if self.kind != "failed" or self.status_code is None:
            return True
        return self.status_code in (408, 409, 429) or self.status_code >= 500


_KINDS = {"batch_expired": "expired", "batch_cancelled": "cancelled"}


def line_outcome(record: dict) -> tuple[str, Reply | LineError]:
    """(custom_id, outcome) of one line of an output or error file."""
    cid = str(record.get("custom_id"))
    response, error = record.get("response"), record.get("error")
    if isinstance(response, dict) and response.get("status_code") == 200 and isinstance(response.get("body"), dict):
        try:
            return cid, reply_from_completion(ChatCompletion.construct(**response["body"]))
        except (AttributeError, IndexError, KeyError, TypeError) as exc:
            return cid, LineError("failed", "invalid_response", f"unreadable chat completion: {exc}", 200)
    if isinstance(error, dict) and error.get("code"):
        code = str(error["code"])
        return cid, LineError(_KINDS.get(code, "failed"), code, str(error.get("message") or ""))
    status = response.get("status_code") if isinstance(response, dict) else None
    body = response.get("body") if isinstance(response, dict) else None
    detail = body.get("error") if isinstance(body, dict) and isinstance(body.get("error"), dict) else {}
    code = str(detail.get("code") or (f"http_{status}" if status else "no_response"))
    return cid, LineError("failed", code, str(detail.get("message") or "no reply"),
                          status if isinstance(status, int) else None)


def read_outcomes(data: bytes | str, expected: set[str] | None = None,
                  max_line: int | None = None) -> dict[str, Reply | LineError]:
    """An output or error file's lines by custom_id (a line that is not JSON, or longer than
    ``max_line`` characters, is skipped: it reads as ``missing``). With ``expected``, a line
    for any other custom_id is passed over before its reply is read."""
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    outcomes: dict[str, Reply | LineError] = {}
    for line in text.splitlines():
        if max_line is not None and len(line) > max_line:
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(record, dict) and (expected is None or record.get("custom_id") in expected):
            cid, outcome = line_outcome(record)
            outcomes[cid] = outcome
    return outcomes


def line_bound(judge: JudgeConfig) -> int:
    """The most characters an answered line of this judge's can take: its completion (at most
    ``max_tokens``, a token is rarely over 16 bytes as JSON), the envelope and some slack."""
    return judge.max_tokens * 16 + 16_384


def output_limit(judge: JudgeConfig, lines: int | None) -> int:
    """The most bytes of a batch's output and error files evalq reads: its lines' bound, within
    the operator's ``EVALQ_BATCH_OUTPUT_MAX_BYTES`` (1 GiB)."""
    from evalq.shared.core.config import env_number

    cap = int(env_number(OUTPUT_MAX_ENV, 2**30))
    return min(cap, (lines if lines is not None else MAX_LINES[judge.provider]) * line_bound(judge))


# -- the provider's API -------------------------------------------------------------------------

class BatchClient:
    """The Files and Batches API of one batch-capable deployment of a judge. Made
    only for an endpoint the allow-list permits (``policy``: an ``EndpointPolicy``;
    default this worker's ``EVALQ_ENDPOINTS``): otherwise ``JudgeError``, nothing sent."""

    def __init__(self, judge: JudgeConfig, deployment: Deployment, policy=None):
        if deployment.batch is None:
            raise ValueError(f"deployment {deployment.region!r} declares no 'batch'")
        self.judge, self.deployment = judge, deployment
        self.sdk = sdk_client(judge, deployment, policy)

    @property
    def endpoint(self) -> str:
        return ENDPOINTS[self.judge.provider]

    def _call(self, what: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (openai.APITimeoutError, openai.APIConnectionError) as exc:
            raise BatchApiError(f"{what}: {type(exc).__name__}: {exc}", retryable=True) from None
        except openai.APIStatusError as exc:
            code = exc.status_code
            raise BatchApiError(f"{what}: HTTP {code}: {str(exc.message)[:200]}",
                                retryable=code in (408, 409, 429) or code >= 500, status_code=code) from None

    def upload(self, data: bytes, name: str = "evalq-batch.jsonl") -> str:
        """Upload an input file (``input_file``); its file id."""
        created = self._call("upload", self.sdk.files.create, file=(name, data, "application/jsonl"),
                             purpose="batch", timeout=max(FILE_TIMEOUT, self.judge.timeout))
        return created.id

    def create(self, input_file_id: str, metadata: dict[str, str] | None = None) -> BatchStatus:
        """Start a batch on an uploaded file; ``metadata`` (at most 16 string pairs) is
        kept with it by the provider (e.g. the job id, to find it again)."""
        metadata = dict(metadata or {})
        if len(metadata) > MAX_METADATA or any(not isinstance(k, str) or not isinstance(v, str) or len(k) > 64
                                               or len(v) > 512 for k, v in metadata.items()):
            raise ValueError("metadata: at most 16 pairs of strings, keys <= 64 and values <= 512 characters")
        batch = self._call("create batch", self.sdk.batches.create, input_file_id=input_file_id,
                           endpoint=self.endpoint, completion_window=self.deployment.batch.completion_window,
                           metadata=metadata or None)
        return status_of(batch)

    def submit(self, lines: Iterable[tuple[str, dict]], metadata: dict[str, str] | None = None) -> BatchStatus:
        """``input_file``, ``upload`` and ``create`` in one."""
        return self.create(self.upload(input_file(self.judge, self.deployment, lines)), metadata)

    def find(self, key: str, value: str, newer_than: float = 0.0, limit: int = 2000) -> BatchStatus | None:
        """The batch created with ``metadata[key] == value`` (``batches.list``, newest first,
        back to ``newer_than``): how a batch whose creation was cut short is found again
        rather than created twice."""
        seen = 0
        for batch in self._call("list batches", self.sdk.batches.list, limit=100):
            if (batch.metadata or {}).get(key) == value:
                return status_of(batch)
            seen += 1
            if seen >= limit or (batch.created_at or 0) < newer_than:
                return None
        return None

    def status(self, batch_id: str) -> BatchStatus:
        """One poll (``batches.retrieve``)."""
        return status_of(self._call("poll", self.sdk.batches.retrieve, batch_id))

    def cancel(self, batch_id: str) -> BatchStatus:
        """Ask the provider to stop (``cancelling``, then ``cancelled``); lines already
        answered stay in its output file."""
        return status_of(self._call("cancel", self.sdk.batches.cancel, batch_id))

    def file_content(self, file_id: str, limit: int | None = None) -> bytes:
        """A file's bytes, streamed; more than ``limit`` of them is a ``BatchApiError`` (its
        lines then count as failed, and go into another batch or synchronously)."""
        def read() -> bytes:
            with self.sdk.files.with_streaming_response.content(
                    file_id, timeout=max(FILE_TIMEOUT, self.judge.timeout)) as response:
                data = bytearray()
                for chunk in response.iter_bytes(1 << 16):
                    data += chunk
                    if limit is not None and len(data) > limit:
                        raise OutputTooLarge(f"read file: {file_id} is larger than {limit:,} bytes, the most "
                                             f"its lines can take ({OUTPUT_MAX_ENV} bounds it)", retryable=False)
                return bytes(data)

        return self._call("read file", read)

    def results(self, status: BatchStatus, expected: Iterable[str] | None = None) -> dict[str, Reply | LineError]:
        """The outcome of each line of an ended batch, read from its output and error
        files. With ``expected`` (the custom_ids sent), exactly those: a line in neither
        file is ``missing``, and a batch that failed as a whole (validation, the
        enqueued-token limit) gives each the batch's error."""
        if not status.ended:
            raise ValueError(f"batch {status.id} is {status.state}: read its results once it ended")
        wanted = set(expected) if expected is not None else None
        limit = output_limit(self.judge, len(wanted) if wanted is not None else None)
        outcomes: dict[str, Reply | LineError] = {}
        for file_id in (status.error_file_id, status.output_file_id):  # an answer wins over an error
            if file_id:
                try:
                    data = self.file_content(file_id, limit)
                except OutputTooLarge as exc:  # none of it is read: every line failed, and is sent again
                    return {cid: LineError("failed", "output_too_large", str(exc)) for cid in wanted or ()}
                outcomes.update(read_outcomes(data, wanted, line_bound(self.judge)))
        if expected is None:
            return outcomes
        if status.state == "failed":
            why = LineError("failed", status.error_codes[0] if status.error_codes else "batch_failed",
                            "; ".join(status.errors) or "the batch failed")
        else:
            why = LineError(_KINDS.get(f"batch_{status.state}", "missing"), "missing",
                            f"in neither file of batch {status.id} ({status.state})")
        return {cid: outcomes.get(cid, why) for cid in expected}
