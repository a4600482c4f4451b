"""HTTP request handling: one threading server per region; routes, keys,
admission, faults, latency and the chat-completions reply. Files and Batches
paths go, once the key is checked, to :mod:`evalq.sim.batch_api`."""

from __future__ import annotations

import contextlib
import hmac
import json
import math
import re
import socket
import socketserver
import sys
import threading
import time
import traceback
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from evalq.sim.batch_api import handle as handle_batch_api, is_batch_path
from evalq.sim.chat import ERROR500_MESSAGE, INJECTED_429_MESSAGE, completion, read_chat
from evalq.sim.faults import INJECTED_RETRY_AFTER_S
from evalq.sim.regions import RegionState
from evalq.sim.replies import BadRequest

HOST = "127.0.0.1"


_AZURE_PATH = re.compile(r"^/openai/deployments/([^/]+)/chat/completions$")


class RegionServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256
    allow_reuse_address = True

    def __init__(self, sim: Any, state: RegionState) -> None:
        # sim: the JudgeSim serving this region (evalq.sim.server, which imports this module)
        self.sim, self.state = sim, state
        self.conns: set[socket.socket] = set()
        self.handler_threads: set[threading.Thread] = set()
        self.conn_lock = threading.Lock()
        super().__init__((HOST, state.region.port), Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind would call socket.getfqdn(): a DNS lookup, needless here
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = HOST, self.server_address[1]

    def process_request_thread(self, request, client_address):  # noqa: ANN001
        me = threading.current_thread()
        with self.conn_lock:
            self.conns.add(request)
            self.handler_threads.add(me)
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.conn_lock:
                self.conns.discard(request)
                self.handler_threads.discard(me)

    def handle_error(self, request, client_address) -> None:  # noqa: ANN001
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):  # a client went away, or stop() closed the socket
            return
        super().handle_error(request, client_address)

    def close_connections(self) -> None:
        with self.conn_lock:
            conns = list(self.conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def join_handlers(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.conn_lock:
            threads = list(self.handler_threads)
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))


class _Drop(Exception):
    """Close the connection without answering."""


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "judge-sim"
    sys_version = ""
    timeout = 120  # idle keep-alive connections are closed after this
    disable_nagle_algorithm = True  # else headers then body cost a 40 ms delayed-ACK stall
    server: RegionServer

    # -- plumbing
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # never the default (it would write to stderr); see _log

    def _log(self, status: int | str) -> None:
        stream = self.server.sim.log
        if stream is None:
            return
        path = urlsplit(self.path).path  # no query string, no headers: never a key
        with contextlib.suppress(Exception):
            stream.write(f"judge-sim {self.server.state.region.name} {self.command} {path} {status}\n")
            stream.flush()

    def _send_json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        self._send_bytes(status, json.dumps(obj, ensure_ascii=False).encode("utf-8"), "application/json",
                         headers)

    def _send_bytes(self, status: int, data: bytes, content_type: str,
                    headers: dict[str, str] | None = None) -> None:
        self._responded = True
        self._leave()  # before the reply goes out: a client's next /stats must not see this one in flight
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("x-request-id", uuid.uuid4().hex)
        self.send_header("x-judge-sim-region", self.server.state.region.name)
        for key, val in (headers or {}).items():
            self.send_header(key, val)
        self.end_headers()
        self.wfile.write(data)
        self._log(status)

    def _error(self, status: int, message: str, etype: str, code: str | None = None,
               param: str | None = None, headers: dict[str, str] | None = None) -> None:
        self._send_json(status, {"error": {"message": message, "type": etype, "param": param,
                                           "code": code}}, headers)

    def _read_body(self) -> bytes | None:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            self.close_connection = True
            return None
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            self.close_connection = True
            return None
        return self.rfile.read(length) if length > 0 else b""

    def _sleep(self, seconds: float) -> None:
        if seconds > 0 and self.server.sim._stopping.wait(seconds):
            raise _Drop()

    def _serve(self, seconds: float) -> None:
        """A call's service time, in one of the region's slots (``JudgeSim(slots=N)``): beyond N at
        once, calls wait for a slot, as a self-hosted server queues them."""
        slots = self.server.state.slots
        if slots is None:
            return self._sleep(seconds)
        while not slots.acquire(timeout=0.05):
            if self.server.sim._stopping.is_set():
                raise _Drop()
        try:
            self._sleep(seconds)
        finally:
            slots.release()

    def _presented_key(self) -> str | None:
        auth = self.headers.get("Authorization", "")
        if auth[:7].lower() == "bearer " and auth[7:].strip():
            return auth[7:].strip()
        key = self.headers.get("api-key", "").strip()
        return key or None

    def _authorized(self) -> bool:
        key = self._presented_key()
        expected = self.server.sim.api_key
        if key is None:
            return False
        return expected is None or hmac.compare_digest(key.encode(), expected.encode())

    def _unauthorized(self) -> None:
        self._error(401, "Incorrect API key provided (judge-sim).", "invalid_request_error",
                    "invalid_api_key")

    # -- routes
    def do_GET(self) -> None:  # noqa: N802
        path = urlsplit(self.path).path.rstrip("/")
        if path == "/stats":
            self._send_json(200, self.server.sim.stats(self.server.state.region.name))
        elif is_batch_path(path):
            self._batch_api(b"")
        elif path in ("/v1/models", "/openai/models", "/openai/v1/models"):
            if not self._authorized():
                return self._unauthorized()
            said = dict(self.server.sim.shutdown)
            azure = path.startswith("/openai")  # Azure OpenAI's list says a retirement its own way
            self._send_json(200, {"object": "list", "data": [
                {"id": m, "object": "model", "created": 0, "owned_by": "judge-sim",
                 **(({"deprecation": {"inference": said[m]}} if azure else {"shutdown_date": said[m]})
                    if m in said else {})}
                for m in dict.fromkeys([*self.server.sim.models, *said])]})
        else:
            self._error(404, f"Unknown path {path!r}", "invalid_request_error", "not_found")

    def do_POST(self) -> None:  # noqa: N802
        body = self._read_body()
        split = urlsplit(self.path)
        path = split.path.rstrip("/")
        if body is None:
            return self._error(400, "a Content-Length body is required", "invalid_request_error")
        if path == "/stats/reset":
            flag = parse_qs(split.query).get("limits", ["0"])[-1].lower()
            self.server.sim.reset_stats(self.server.state.region.name,
                                        clear_limits=flag in ("1", "true", "yes"))
            return self._send_json(200, self.server.sim.stats(self.server.state.region.name))
        if path == "/limits":  # JudgeSim.set_limits for this region, over HTTP: ?tpm=N&rpm=N
            query, name = parse_qs(split.query), self.server.state.region.name
            asked = {k: query[k][-1] for k in ("tpm", "rpm") if k in query}
            if not asked or not all(v.isdigit() for v in asked.values()):
                return self._error(400, "expected ?tpm=N and/or &rpm=N (whole numbers)", "invalid_request_error")
            self.server.sim.set_limits(name, **{k: int(v) for k, v in asked.items()})
            return self._send_json(200, self.server.sim.stats(name))
        if path in ("/hold", "/release"):  # JudgeSim.hold / release for this region, over HTTP
            name = self.server.state.region.name
            if path == "/release":
                self.server.sim.release(name)
            else:
                after = parse_qs(split.query).get("after", ["0"])[-1]
                if not after.isdigit():
                    return self._error(400, "after: expected a whole number >= 0", "invalid_request_error")
                self.server.sim.hold(name, after=int(after))
            return self._send_json(200, self.server.sim.stats(name))
        if is_batch_path(path):
            return self._batch_api(body)
        azure = _AZURE_PATH.match(path)
        if azure is None and path not in ("/v1/chat/completions", "/openai/v1/chat/completions"):
            return self._error(404, f"Unknown path {path!r}", "invalid_request_error", "not_found")
        state = self.server.state
        state.enter()
        self._responded = False
        self._in_flight = True
        try:
            self._chat(body, azure.group(1) if azure else None, parse_qs(split.query))
        except _Drop:
            self.close_connection = True
            self._log("dropped")
        except OSError:
            self.close_connection = True
        except Exception:  # a judge-sim bug: say so rather than hang up
            self.close_connection = True
            traceback.print_exc()
            if not self._responded:
                with contextlib.suppress(OSError):
                    self._error(500, "judge-sim internal error (see its stderr)", "server_error")
        finally:
            self._leave()

    def do_DELETE(self) -> None:  # noqa: N802
        body = self._read_body()
        path = urlsplit(self.path).path.rstrip("/")
        if body is None:
            return self._error(400, "a Content-Length body is required", "invalid_request_error")
        if not is_batch_path(path):
            return self._error(404, f"Unknown path {path!r}", "invalid_request_error", "not_found")
        self._batch_api(body)

    def _batch_api(self, body: bytes) -> None:
        """Files and Batches (evalq.sim.batch_api): no admission, no latency, no faults."""
        split = urlsplit(self.path)
        engine = self.server.sim.batch_engine(self.server.state.region.name)
        if not self._authorized():
            engine.add(requests=1, unauthorized=1)
            return self._unauthorized()
        try:
            status, payload = handle_batch_api(engine, self.command, split.path.rstrip("/"),
                                               parse_qs(split.query), body,
                                               self.headers.get("Content-Type", ""))
        except Exception:  # a judge-sim bug: say so rather than hang up
            self.close_connection = True
            traceback.print_exc()
            return self._error(500, "judge-sim internal error (see its stderr)", "server_error")
        if isinstance(payload, bytes):
            return self._send_bytes(status, payload, "application/octet-stream")
        self._send_json(status, payload)

    def _leave(self) -> None:
        if getattr(self, "_in_flight", False):
            self._in_flight = False
            self.server.state.leave()

    def _chat(self, raw: bytes, deployment: str | None, query: dict) -> None:
        sim, state = self.server.sim, self.server.state
        if not self._authorized():
            state.add(unauthorized=1)
            return self._unauthorized()

        def bad(message: str, param: str | None = None, code: str | None = None) -> None:
            state.add(bad_request=1)
            self._error(400, message, "invalid_request_error", code, param)

        if deployment is not None and not query.get("api-version"):
            return bad("Missing required query parameter 'api-version'.", "api-version")
        try:
            body = json.loads(raw or b"null")
        except (ValueError, UnicodeDecodeError):
            return bad("We could not parse the JSON body of your request.")
        try:
            request = read_chat(body, deployment, sim.judged)
        except BadRequest as exc:
            return bad(str(exc), exc.param, exc.code)
        markers, reply, req_key = request.markers, request.reply, request.key

        # "-once" faults fire the first time the sim sees this exact request
        def fires(kind: str) -> bool:
            return kind in markers.faults and (
                not markers.faults[kind] or sim._first_time(f"{kind}:{req_key}"))

        if fires("429"):
            state.add(rate_limited=1, rate_limited_injected=1)
            return self._error(
                429, INJECTED_429_MESSAGE, "requests", "rate_limit_exceeded",
                headers={"Retry-After": str(INJECTED_RETRY_AFTER_S),
                         "retry-after-ms": str(INJECTED_RETRY_AFTER_S * 1000)})

        cost = request.cost(sim.default_max_tokens)
        adm = state.admit(cost)
        if not adm.admitted:
            state.add(rate_limited=1)
            region = state.region
            headers = {"Retry-After": str(max(1, math.ceil(adm.wait))),
                       "retry-after-ms": str(max(1, math.ceil(adm.wait * 1000))),
                       **refused_headers(sim.rate_headers, state, adm.kind)}
            if adm.too_large:
                headers["x-should-retry"] = "false"
                msg = (f"Request too large for region {region.name}: limit {region.tpm} tokens per "
                       f"{sim.window_seconds:g} s, requested {cost}.")
            elif adm.kind == "requests":
                msg = (f"Rate limit reached for requests in region {region.name}: limit {region.rpm} "
                       f"per {sim.window_seconds:g} s. Please retry after {headers['Retry-After']} "
                       f"seconds.")
            else:
                msg = (f"Rate limit reached for tokens in region {region.name}: limit {region.tpm} "
                       f"per {sim.window_seconds:g} s, requested {cost}. Please retry after "
                       f"{headers['Retry-After']} seconds.")
            return self._error(429, msg, adm.kind, "rate_limit_exceeded", headers=headers)
        sim.record(state.region.name, cost, request.messages)
        if state.stopped_at_gate():  # JudgeSim.hold: answered once released (dropped at stop)
            try:
                while not state.gate.wait(0.05):
                    if sim._stopping.is_set():
                        raise _Drop()
            finally:
                state.passed_gate()

        faults = sim.faults
        fault = None
        for kind in ("500", "timeout", "malformed"):
            if fires(kind):
                fault = kind
                break
        if fault is None:
            u = adm.fault_draw
            if u < faults.error500:
                fault = "500"
            elif u < faults.error500 + faults.timeout:
                fault = "timeout"
            elif u < faults.error500 + faults.timeout + faults.malformed:
                fault = "malformed"
        delay = sim.latency + sim.jitter * adm.jitter_draw + markers.delay

        if fault == "500":
            state.add(error500=1)
            self._serve(delay)
            return self._error(500, ERROR500_MESSAGE, "server_error")
        if fault == "malformed":
            reply = request.malformed_reply()
        if fault == "timeout":
            state.add(timeout=1)
            self._sleep(faults.timeout_seconds)
            if faults.timeout_action == "drop":
                raise _Drop()
        else:
            self._serve(delay)
            state.add(**({"malformed": 1} if fault == "malformed" else {"ok": 1}))
            if sim.per_request:
                state.answer(req_key)
        answer = completion(request, reply)
        answer["model"] = sim.versions.get(request.model, request.model)
        state.add(prompt_tokens=answer["usage"]["prompt_tokens"],
                  completion_tokens=answer["usage"]["completion_tokens"])
        self._send_json(200, answer, limit_headers(sim.rate_headers, state, adm))


def limit_headers(form: str, state, adm) -> dict[str, str]:
    """What a reply says of its region's limits: OpenAI's ``x-ratelimit-{limit,remaining,reset}-*``,
    Azure OpenAI's remaining counts alone, or nothing (``JudgeSim(rate_headers=...)``)."""
    headers: dict[str, str] = {}
    if form == "none":
        return headers
    region = state.region
    reset = f"{state.reset_after(state.clock()):.3f}s"
    for kind, limit, remaining in (("requests", region.rpm, adm.remaining_requests),
                                   ("tokens", region.tpm, adm.remaining_tokens)):
        if remaining is None:
            continue
        headers[f"x-ratelimit-remaining-{kind}"] = str(remaining)
        if form == "openai":
            headers[f"x-ratelimit-limit-{kind}"] = str(limit)
            headers[f"x-ratelimit-reset-{kind}"] = reset
    return headers


def refused_headers(form: str, state, kind: str) -> dict[str, str]:
    """What a 429 says of the limits, as OpenAI's do: the limits, and none of the refused kind left
    (Azure's form: only that none is left)."""
    if form == "none":
        return {}
    region = state.region
    headers = {f"x-ratelimit-remaining-{kind}": "0"}
    if form == "openai":
        for name, limit in (("requests", region.rpm), ("tokens", region.tpm)):
            if limit:
                headers[f"x-ratelimit-limit-{name}"] = str(limit)
    return headers


# ---------------------------------------------------------------- public API
