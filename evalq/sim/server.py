"""JudgeSim: the simulator as a whole, one HTTP server per region on loopback."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Callable, Sequence, TextIO

from evalq.sim.batches import BatchEngine
from evalq.sim.faults import Faults
from evalq.sim.handler import HOST, RegionServer
from evalq.sim.pairwise import Biases
from evalq.sim.regions import RATE_HEADERS, Region, RegionState

DEFAULT_MODEL = "judge-sim"
DEFAULT_MAX_TOKENS = 256


class JudgeSim:
    """Simulated LLM regions on loopback. ``start()`` (or ``with``) binds one port per
    region; ``stop()`` shuts everything down, waking any request still sleeping.
    ``clock`` (seconds, default ``time.monotonic``) times the rate-limit windows and the
    batches' lives; a test may pass its own to move them on without waiting."""

    def __init__(self, regions: Sequence[Region] | None = None, *, latency: float = 0.0,
                 jitter: float = 0.0, fault_rates: Faults | None = None,
                 window_seconds: float = 60.0, seed: int = 0, api_key: str | None = None,
                 models: Sequence[str] = (DEFAULT_MODEL,),
                 default_max_tokens: int = DEFAULT_MAX_TOKENS, log: TextIO | None = None,
                 per_request: bool = False, clock: Callable[[], float] | None = None,
                 record_calls: bool = False, biases: Biases | dict[str, Biases] | None = None,
                 rate_headers: str = "openai", slots: int | None = None,
                 shutdown: dict[str, str] | None = None) -> None:
        regions = list(regions) if regions else [Region("local")]
        names = [r.name for r in regions]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate region names: {names}")
        if latency < 0 or jitter < 0:
            raise ValueError("latency and jitter must be >= 0")
        if window_seconds <= 0:
            raise ValueError("window_seconds must be > 0")
        if default_max_tokens < 1:
            raise ValueError("default_max_tokens must be >= 1")
        if rate_headers not in RATE_HEADERS:
            raise ValueError(f"rate_headers must be one of {', '.join(RATE_HEADERS)}")
        self.regions = regions
        # what replies say of the limits: "openai" (limit, remaining, reset), "azure" (remaining only),
        # "none"; settable while the sim runs
        self.rate_headers = rate_headers
        self.latency, self.jitter = float(latency), float(jitter)
        self.faults = fault_rates or Faults()
        self.window_seconds = float(window_seconds)
        self.seed = seed
        self.api_key = api_key or None
        self.models = list(models) or [DEFAULT_MODEL]
        self.default_max_tokens = default_max_tokens
        self.log = log
        self.per_request = per_request
        # the model a reply says answered, per model asked (a dated version behind an alias, as OpenAI's
        # "gpt-4o" answers as "gpt-4o-2024-08-06"); settable while the sim runs: a provider's silent update
        self.versions: dict[str, str] = {}
        # when a model stops answering, as its provider's model list says it (an ISO date; OpenAI's
        # GET /v1/models ``shutdown_date``, Azure's ``deprecation.inference``): settable while it runs
        self.shutdown: dict[str, str] = dict(shutdown or {})
        # a judge's biases (evalq.sim.pairwise), for every model or per model asked: seeded by ``seed``
        self.biases = biases
        # every admitted chat call as (monotonic time, tokens counted against the region's TPM,
        # the text of its messages): a test can tell whose load the region carried when
        self.record_calls = record_calls
        self._calls: list[tuple[str, float, int, str]] = []
        self._calls_lock = threading.Lock()
        self.clock = clock or time.monotonic
        self._states = {r.name: RegionState(r, self.window_seconds, seed, self.clock) for r in regions}
        if slots is not None:  # a self-hosted server's parallel slots: calls beyond them queue
            if slots < 1:
                raise ValueError("slots must be >= 1")
            for state in self._states.values():
                state.slots = threading.Semaphore(slots)
        self._servers: dict[str, RegionServer] = {}
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._seen: set[str] = set()
        self._seen_lock = threading.Lock()
        self._batches = {r.name: BatchEngine(r, self._states[r.name], seed=seed,
                                             default_max_tokens=default_max_tokens,
                                             per_request=per_request, first_time=self._first_time,
                                             clock=self.clock) for r in regions}

    def judged(self, model: str) -> tuple[Biases | None, int]:
        """The biases the sim answers ``model``'s requests with, and its seed."""
        found = self.biases.get(model) if isinstance(self.biases, dict) else self.biases
        return found, self.seed

    def __repr__(self) -> str:  # never shows the key
        return f"JudgeSim(regions={[r.name for r in self.regions]}, running={self.running})"

    @property
    def running(self) -> bool:
        return bool(self._servers) and not self._stopping.is_set()

    def start(self) -> JudgeSim:
        if self._servers:
            raise RuntimeError("judge-sim already started")
        self._stopping.clear()
        try:
            for region in self.regions:
                self._servers[region.name] = RegionServer(self, self._states[region.name])
        except OSError:
            for server in self._servers.values():
                server.server_close()
            self._servers.clear()
            raise
        for name, server in self._servers.items():
            t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                                 name=f"judge-sim-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        if not self._servers:
            return
        self._stopping.set()
        servers = list(self._servers.values())
        for server in servers:
            server.shutdown()
            server.server_close()
            server.close_connections()
        for server in servers:
            server.join_handlers(timeout)
        for t in self._threads:
            t.join(timeout)
        self._servers.clear()
        self._threads.clear()

    def __enter__(self) -> JudgeSim:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _server(self, region: str) -> RegionServer:
        if region not in self._states:
            raise KeyError(f"unknown region {region!r}; have {list(self._states)}")
        if region not in self._servers:
            raise RuntimeError("judge-sim is not running")
        return self._servers[region]

    def port(self, region: str) -> int:
        return self._server(region).server_address[1]

    def azure_endpoint(self, region: str) -> str:
        """For ``openai.AzureOpenAI(azure_endpoint=...)``: ``http://127.0.0.1:PORT``."""
        return f"http://{HOST}:{self.port(region)}"

    def base_url(self, region: str) -> str:
        """For ``openai.OpenAI(base_url=...)``: ``http://127.0.0.1:PORT/v1``."""
        return self.azure_endpoint(region) + "/v1"

    def batch_engine(self, region: str) -> BatchEngine:
        """The region's Files and Batches (:mod:`evalq.sim.batches`)."""
        if region not in self._batches:
            raise KeyError(f"unknown region {region!r}; have {list(self._batches)}")
        return self._batches[region]

    def stats(self, region: str | None = None) -> dict:
        """One region's counters, or ``{name: counters}`` for all; ``"batch"`` holds the
        Files and Batches counters, apart from the chat-completion ones."""
        def one(name: str) -> dict:
            server = self._servers.get(name)
            return {**self._states[name].snapshot(server.server_address[1] if server else 0),
                    "batch": self._batches[name].snapshot()}
        if region is not None:
            if region not in self._states:
                raise KeyError(f"unknown region {region!r}")
            return one(region)
        return {name: one(name) for name in self._states}

    def set_limits(self, region: str | None = None, *, tpm: int | None = None, rpm: int | None = None) -> None:
        """Change one region's (or every region's) TPM and/or RPM while the sim runs (a provider's
        quota changed): what is in the window stays counted against the new limits."""
        for name in ([region] if region is not None else list(self._states)):
            self._states[name].set_limits(tpm, rpm)

    def hold(self, region: str | None = None, *, after: int = 0) -> None:
        """Shut the gate of one region (or all): chat calls admitted from now on, all but the next
        ``after`` of them, wait unanswered (counted in ``stats()["held"]``) until ``release()``;
        ``stop()`` drops them. A test holds a job open at a known point with it (the calls of the
        chunks that are running are held, none of their items ends) instead of racing the job."""
        if after < 0:
            raise ValueError("after must be >= 0")
        for name in ([region] if region is not None else list(self._states)):
            self._states[name].hold(after)

    def release(self, region: str | None = None) -> None:
        """Open the gate again: the held calls are answered, later ones as usual."""
        for name in ([region] if region is not None else list(self._states)):
            self._states[name].release()

    def answered(self, region: str | None = None) -> dict[str, int]:
        """With ``per_request=True``: how many replies (200s) each distinct request got,
        by its sha256, in one region or all, synchronous calls and batch lines alike; a
        request answered twice was paid twice."""
        total: Counter[str] = Counter()
        for name in ([region] if region is not None else list(self._states)):
            with self._states[name].lock:
                total.update(self._states[name].answered)
        return dict(total)

    def record(self, region: str, cost: int, messages: list) -> None:
        if not self.record_calls:
            return
        text = "\n".join(str(m.get("content")) for m in messages if isinstance(m, dict))
        with self._calls_lock:
            self._calls.append((region, self.clock(), cost, text))

    def calls(self, region: str | None = None) -> list[tuple[float, int, str]]:
        """With ``record_calls=True``: each admitted chat call (the clock's time when it was admitted,
        tokens counted against the region's TPM, its messages' text), in order."""
        with self._calls_lock:
            return [(t, cost, text) for name, t, cost, text in self._calls if region in (None, name)]

    def reset_stats(self, region: str | None = None, *, clear_limits: bool = False) -> None:
        """Zero the counters (and peaks) of one region or all. ``clear_limits`` also
        empties the rate-limit windows and forgets which ``-once`` requests were seen and
        how often each batch custom_id was tried (batches themselves are kept)."""
        for name in ([region] if region is not None else list(self._states)):
            self._states[name].reset(clear_limits)
            self._batches[name].reset(clear_limits)
        if clear_limits:
            with self._seen_lock:
                self._seen.clear()

    def _first_time(self, key: str) -> bool:
        with self._seen_lock:
            if key in self._seen:
                return False
            self._seen.add(key)
            return True
