"""One region's Files and Batches: uploaded files, batches and their timeline.

A batch's life is computed from a clock, lazily, whenever it is looked at (no thread
runs it). With ``d`` = the region's ``batch_delay`` and ``p = min(0.1 d, 1 s)``:
``validating`` until ``p``, then ``in_progress``, ``finalizing`` from ``d - p``, and
``completed`` at ``d`` (seconds from creation). Its N lines are answered evenly while it
runs: ``floor(N (t - p) / (d - 2p))`` of them by time ``t`` (all N from ``d - p``). A
batch with ``d > batch_expire_after`` ends ``expired`` at ``batch_expire_after``; one
that fails validation ends ``failed`` at ``p``; a cancelled one is ``cancelling`` for
``p``, then ``cancelled``. Lines not answered by the end go to the error file with
``batch_expired`` / ``batch_cancelled``.

Each line is answered as the synchronous endpoint answers its body (:mod:`evalq.sim.chat`),
except that a batch line takes no TPM/RPM budget, no latency and no random fault: a
line fails (500) when ``sha256(f"{seed}:{custom_id}:{attempt}")``'s first 8 bytes, read
as a big-endian integer over 2**64, are below ``batch_fail_fraction`` (``attempt``: how
many earlier batches of this region carried that custom_id, from 0), and ``[[sim:...]]``
markers act as in a synchronous call (``timeout`` answers 500: nothing hangs).
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from evalq.sim.batch_input import line_error, read_input
from evalq.sim.chat import (ERROR500_MESSAGE, INJECTED_429_MESSAGE, completion, error_body,
                            estimated_tokens, read_chat)
from evalq.sim.regions import Region, RegionState
from evalq.sim.replies import BadRequest

TERMINAL = ("completed", "failed", "expired", "cancelled")
_COUNTERS = ("requests", "unauthorized", "bad_request", "files_uploaded", "batches_created",
             "batches_completed", "batches_failed", "batches_expired", "batches_cancelled",
             "lines_answered", "lines_failed", "lines_expired", "lines_cancelled", "prompt_tokens",
             "completion_tokens", "peak_enqueued_tokens")
_END_LINE = {"expired": ("batch_expired", "This request could not be executed before the "
                                          "completion window expired."),
             "cancelled": ("batch_cancelled", "This request was not executed because the batch "
                                              "was cancelled.")}


class ApiError(Exception):
    """An HTTP error answer: status and OpenAI-style error body."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.body = status, error_body(message, "invalid_request_error", code, param)


@dataclass
class StoredFile:
    id: str
    filename: str
    purpose: str
    data: bytes
    created_at: int

    def view(self) -> dict:
        return {"id": self.id, "object": "file", "bytes": len(self.data), "created_at": self.created_at,
                "filename": self.filename, "purpose": self.purpose, "status": "processed",
                "status_details": None, "expires_at": None}


@dataclass
class Batch:
    id: str
    input_file_id: str
    endpoint: str
    metadata: dict | None
    model: str | None
    lines: list[tuple[str, dict]]     # (custom_id, body), in file order
    attempts: list[int]
    tokens: int                       # estimated, for the enqueued-token count
    errors: list[dict] | None         # validation failed
    t0: float                         # clock at creation
    wall0: float                      # time.time() at creation
    delay: float
    expire_after: float
    cancel_at: float | None = None
    status: str = "validating"
    times: dict[str, int] = field(default_factory=dict)
    done: int = 0
    outputs: list[dict] = field(default_factory=list)
    failures: list[dict] = field(default_factory=list)
    completed: int = 0
    failed: int = 0
    usage: list[int] = field(default_factory=lambda: [0, 0])  # prompt, completion tokens
    output_file_id: str | None = None
    error_file_id: str | None = None

    @property
    def phase(self) -> float:
        return min(0.1 * self.delay, 1.0)

    def wall(self, at: float) -> int:
        return int(self.wall0 + (at - self.t0))

    def events(self) -> list[tuple[float, str]]:
        t0, d, p = self.t0, self.delay, self.phase
        if self.errors is not None:
            return [(t0 + p, "failed")]
        if self.cancel_at is not None:
            return [(self.cancel_at, "cancelling"), (self.cancel_at + p, "cancelled")]
        events = [(t0 + p, "in_progress"), (t0 + d - p, "finalizing"), (t0 + d, "completed")]
        if d > self.expire_after:
            end = t0 + self.expire_after
            events = [e for e in events if e[0] < end] + [(end, "expired")]
        return events

    def due(self, t: float) -> int:
        """How many lines are answered by clock time ``t``."""
        n, start, end = len(self.lines), self.t0 + self.phase, self.t0 + self.delay - self.phase
        if self.errors is not None or t < start:
            return 0
        if t >= end:
            return n
        return min(n, math.floor(n * (t - start) / (end - start)))

    def stop(self) -> float:
        """Clock time after which no line is answered."""
        if self.cancel_at is not None:
            return self.cancel_at
        if self.delay > self.expire_after:
            return self.t0 + self.expire_after
        return math.inf

    def view(self) -> dict:
        validated = self.errors is None and self.status != "validating"
        return {
            "id": self.id, "object": "batch", "endpoint": self.endpoint,
            "errors": None if self.errors is None or self.status != "failed"
            else {"object": "list", "data": self.errors},
            "input_file_id": self.input_file_id, "completion_window": "24h", "status": self.status,
            "output_file_id": self.output_file_id, "error_file_id": self.error_file_id,
            "created_at": self.wall(self.t0), "expires_at": self.wall(self.t0 + self.expire_after),
            **{f"{s}_at": self.times.get(s) for s in
               ("in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled")},
            "request_counts": {"total": len(self.lines) if validated or self.cancel_at is not None else 0,
                               "completed": self.completed, "failed": self.failed},
            "metadata": self.metadata, "model": self.model,
            "usage": {"input_tokens": self.usage[0], "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens": self.usage[1], "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": sum(self.usage)},
        }


def fails(seed: int, custom_id: str, attempt: int, fraction: float) -> bool:
    digest = hashlib.sha256(f"{seed}:{custom_id}:{attempt}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2 ** 64 < fraction


class BatchEngine:
    """One region's stored files and batches, and their counters (``snapshot``)."""

    def __init__(self, region: Region, state: RegionState, *, seed: int, default_max_tokens: int,
                 per_request: bool, first_time: Callable[[str], bool], clock: Callable[[], float]) -> None:
        self.region, self.state, self.seed = region, state, seed
        self.default_max_tokens, self.per_request = default_max_tokens, per_request
        self.first_time, self.clock = first_time, clock
        self.lock = threading.RLock()
        self.files: dict[str, StoredFile] = {}
        self.batches: dict[str, Batch] = {}
        self.attempts: Counter[str] = Counter()
        self.counts = dict.fromkeys(_COUNTERS, 0)

    def add(self, **deltas: int) -> None:
        with self.lock:
            for key, delta in deltas.items():
                self.counts[key] += delta

    # -- files
    def store(self, filename: str, purpose: str, data: bytes) -> StoredFile:
        with self.lock:
            stored = StoredFile("file-" + uuid.uuid4().hex[:24], filename, purpose, data, int(time.time()))
            self.files[stored.id] = stored
            if purpose == "batch":
                self.counts["files_uploaded"] += 1
            return stored

    def file(self, file_id: str) -> StoredFile:
        with self.lock:
            self.advance_all()  # a batch's output file exists once the clock says it ended
            if file_id not in self.files:
                raise ApiError(404, f"No such File object: {file_id}", "id")
            return self.files[file_id]

    def delete(self, file_id: str) -> None:
        with self.lock:
            self.file(file_id)
            del self.files[file_id]

    def list_files(self, purpose: str | None) -> list[StoredFile]:
        with self.lock:
            self.advance_all()
            return [f for f in self.files.values() if purpose is None or f.purpose == purpose]

    # -- batches
    def enqueued(self, model: str | None = None) -> int:
        return sum(b.tokens for b in self.batches.values() if b.errors is None
                   and b.status not in TERMINAL and (model is None or b.model == model))

    def create(self, input_file_id: str, endpoint: str, metadata: dict | None, flavor: str) -> dict:
        with self.lock:
            self.advance_all()
            stored = self.files.get(input_file_id)
            if stored is None:
                raise ApiError(400, f"Invalid 'input_file_id': {input_file_id!r}. No such File object.",
                               "input_file_id", "invalid_value")
            if stored.purpose != "batch":
                raise ApiError(400, f"File {input_file_id} has purpose {stored.purpose!r}; a batch "
                               "needs a file uploaded with purpose 'batch'.", "input_file_id", "invalid_value")
            lines, model, errors = read_input(stored.data, endpoint, flavor)
            tokens = sum(estimated_tokens(body, self.default_max_tokens) for _, body in lines)
            limit = self.region.enqueued_tokens
            if not errors and limit and self.enqueued(model) + tokens > limit:
                errors = [line_error(None, "token_limit_exceeded", (
                    f"The number of enqueued tokens has surpassed the configured limit of {limit} for the "
                    f"deployment {model!r} (enqueued {self.enqueued(model)}, this batch {tokens}). Please "
                    "either increase the limit or try again once the current jobs have finished."))]
            attempts = []
            if not errors:
                for custom_id, _ in lines:
                    attempts.append(self.attempts[custom_id])
                    self.attempts[custom_id] += 1
            batch = Batch("batch_" + uuid.uuid4().hex[:24], input_file_id, endpoint, metadata, model,
                          lines, attempts, tokens, errors or None, self.clock(), time.time(),
                          float(self.region.batch_delay), float(self.region.batch_expire_after))
            self.batches[batch.id] = batch
            self.counts["batches_created"] += 1
            self.counts["peak_enqueued_tokens"] = max(self.counts["peak_enqueued_tokens"], self.enqueued())
            return batch.view()  # as the API answers a create: "validating", whatever comes next

    def batch(self, batch_id: str) -> dict:
        with self.lock:
            return self.advance(self.get(batch_id)).view()

    def get(self, batch_id: str) -> Batch:
        if batch_id not in self.batches:
            raise ApiError(404, f"No batch found with id {batch_id!r}.", "batch_id")
        return self.batches[batch_id]

    def list_batches(self) -> list[dict]:
        with self.lock:
            self.advance_all()
            return [b.view() for b in reversed(self.batches.values())]  # newest first

    def cancel(self, batch_id: str) -> dict:
        with self.lock:
            batch = self.advance(self.get(batch_id))
            if batch.status in ("cancelling", "cancelled"):
                return batch.view()
            if batch.status in TERMINAL:
                raise ApiError(400, f"Cannot cancel a batch with status {batch.status!r}.", "batch_id")
            batch.cancel_at = self.clock()
            return self.advance(batch).view()

    # -- the timeline
    def advance_all(self) -> None:
        for batch in list(self.batches.values()):
            self.advance(batch)

    def advance(self, batch: Batch) -> Batch:
        if batch.status in TERMINAL:
            return batch
        now = self.clock()
        due = batch.due(min(now, batch.stop()))
        for i in range(batch.done, due):
            self.answer(batch, i)
        batch.done = max(batch.done, due)
        for at, status in batch.events():  # in time order
            if now < at:
                break
            if status in batch.times:
                continue
            batch.status, batch.times[status] = status, batch.wall(at)
            if status in TERMINAL:
                self.finish(batch)
                break
        return batch

    def answer(self, batch: Batch, i: int) -> None:
        custom_id, body = batch.lines[i]
        status, reply, key = self.reply(custom_id, body, batch.attempts[i])
        line = {"id": "batch_req_" + uuid.uuid4().hex[:24], "custom_id": custom_id,
                "response": {"status_code": status, "request_id": uuid.uuid4().hex, "body": reply},
                "error": None}
        if status == 200:
            batch.outputs.append(line)
            batch.completed += 1
            usage = reply["usage"]
            batch.usage[0] += usage["prompt_tokens"]
            batch.usage[1] += usage["completion_tokens"]
            self.add(lines_answered=1, prompt_tokens=usage["prompt_tokens"],
                     completion_tokens=usage["completion_tokens"])
            if self.per_request:
                self.state.answer(key)
        else:
            batch.failures.append(line)
            batch.failed += 1
            self.add(lines_failed=1)

    def reply(self, custom_id: str, body: dict, attempt: int) -> tuple[int, dict, str]:
        """(status, body, request key) for one line, as the synchronous endpoint answers it."""
        try:
            request = read_chat(body)
        except BadRequest as exc:
            return 400, error_body(str(exc), "invalid_request_error", exc.code, exc.param), ""
        if fails(self.seed, custom_id, attempt, self.region.batch_fail_fraction):
            return 500, error_body("The server had an error while processing your request. "
                                   "(judge-sim batch_fail_fraction)", "server_error"), request.key
        faults = request.markers.faults

        def fires(kind: str) -> bool:
            return kind in faults and (not faults[kind] or self.first_time(f"{kind}:{request.key}"))

        if fires("429"):
            return 429, error_body(INJECTED_429_MESSAGE, "requests", "rate_limit_exceeded"), request.key
        fault = next((kind for kind in ("500", "timeout", "malformed") if fires(kind)), None)
        if fault == "500":
            return 500, error_body(ERROR500_MESSAGE, "server_error"), request.key
        if fault == "timeout":
            return 500, error_body("The request timed out. (judge-sim injected)", "server_error"), request.key
        reply = request.malformed_reply() if fault == "malformed" else request.reply
        return 200, completion(request, reply), request.key

    def finish(self, batch: Batch) -> None:
        if batch.status in _END_LINE:
            code, message = _END_LINE[batch.status]
            for custom_id, _ in batch.lines[batch.done:]:
                batch.failures.append({"id": "batch_req_" + uuid.uuid4().hex[:24], "custom_id": custom_id,
                                       "response": None, "error": {"code": code, "message": message}})
                batch.failed += 1
            self.add(**{f"lines_{batch.status}": len(batch.lines) - batch.done})
        # the API does not keep the input order: match lines by custom_id
        for lines, kind in ((batch.outputs, "output"), (batch.failures, "error")):
            if lines:
                lines.sort(key=lambda line: hashlib.sha256(line["custom_id"].encode("utf-8")).digest())
                data = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)
                stored = self.store(f"{batch.id}_{kind}.jsonl", "batch_output", data.encode("utf-8"))
                setattr(batch, f"{kind}_file_id", stored.id)
        self.add(**{f"batches_{batch.status}": 1})

    def snapshot(self) -> dict:
        with self.lock:
            self.advance_all()
            unfinished = sum(1 for b in self.batches.values() if b.status not in TERMINAL)
            return {**self.counts, "enqueued_tokens": self.enqueued(), "batches_unfinished": unfinished}

    def reset(self, clear_limits: bool) -> None:
        with self.lock:
            self.advance_all()
            self.counts = dict.fromkeys(_COUNTERS, 0)
            self.counts["peak_enqueued_tokens"] = self.enqueued()
            if clear_limits:
                self.attempts.clear()
