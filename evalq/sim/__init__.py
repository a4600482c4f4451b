"""evalq.sim (judge-sim): an OpenAI-compatible HTTP server that *simulates* LLM endpoints.

It is not a judge of quality. It exists so that evalq's judge layer can be tested,
demonstrated and capacity-planned against real HTTP with the real ``openai`` SDK,
with per-region rate limits, latency and faults, and without any network or model.

Standard library only (``http.server.ThreadingHTTPServer``): one server per
simulated region, each on its own loopback port and thread.

Endpoints (on every region's port)
----------------------------------
``POST /v1/chat/completions``                                    OpenAI
``POST /openai/deployments/{deployment}/chat/completions?api-version=...``  Azure OpenAI
``POST /openai/v1/chat/completions``                              Azure OpenAI "v1" API
``GET  /v1/models``                                               configured model names
``GET  /stats``  / ``POST /stats/reset[?limits=1]``                this region's counters
``POST /hold[?after=N]`` / ``POST /release``                      hold chat calls / answer them
``POST /v1/files``, ``GET /v1/files[/{id}[/content]]``, ``DELETE /v1/files/{id}``   Files
``POST /v1/batches``, ``GET /v1/batches[/{id}]``, ``POST /v1/batches/{id}/cancel``   Batches
(the Files and Batches paths also under ``/openai/...?api-version=...`` and ``/openai/v1/...``
for Azure OpenAI; see "Files and Batches" below)

Rate limits
-----------
Each region admits at most ``rpm`` requests and ``tpm`` tokens per sliding window of
``window_seconds`` (60 by default: the window replaces the minute, so with a 5 s
window the budgets apply per 5 s). A limit of 0 (or None) is disabled. The
admission cost of a request, as Azure OpenAI counts it, is
``prompt_tokens + max_tokens * n`` where ``max_tokens`` is ``max_completion_tokens``
or ``max_tokens`` from the request, else ``default_max_tokens`` (256). A request
over a budget is answered 429 with ``Retry-After`` (whole seconds, at least 1) and
``retry-after-ms`` (the exact wait until the window has room) and an OpenAI-style
error body (``code: rate_limit_exceeded``, ``type: requests|tokens``); it consumes
nothing. A request whose cost exceeds ``tpm`` on its own can never be admitted: 429
with ``x-should-retry: false``. Successful replies carry
``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` headers as OpenAI sends them
(``rate_headers="openai"``, the default), only ``x-ratelimit-remaining-*`` as Azure OpenAI
does (``"azure"``), or none (``"none"``); a 429 says the limits and that none of the refused kind
remains, in the same form. ``set_limits(region, tpm=, rpm=)`` (over HTTP:
``POST /limits?tpm=N&rpm=N`` on the region's port) changes a region's limits while it runs.

Token counting (deterministic; no tiktoken)
-------------------------------------------
``tokens(text) = ceil(len(text.encode("utf-8")) / 4)``.
``prompt_tokens = sum over messages of (4 + tokens(text of the message))`` where the
text of a message is its string content, or the concatenated ``text`` of its content
parts, followed by the ``arguments`` of any ``tool_calls`` it carries. Tool
definitions and response formats are not counted. ``completion_tokens`` is
``tokens(content)`` (for a tool call: ``tokens(arguments)``) summed over the ``n``
choices. If the request sets ``max_tokens``/``max_completion_tokens`` and the reply is
longer, it is cut to ``4 * max_tokens`` bytes with ``finish_reason: "length"``.

Replies
-------
Deterministic: a reply depends only on the model (for Azure: the deployment) and
the messages, via ``digest = sha256(model + messages)``; ``score = 1 + digest % 5``
and a one-line reason without digits. Formats:

* no ``response_format``/``tools``: ``"Reason: <reason>\\nScore: <score>"``;
* ``{"type": "json_object"}``: ``{"score": <score>, "reason": "<reason>"}`` (like the
  real API, some message must mention "json", else 400);
* ``{"type": "json_schema", "json_schema": {"schema": ...}}``: a JSON value valid for
  the schema (see :func:`evalq.shared.judging.schema_values.schema_value`; a property named ``score`` gets the score,
  clamped into its bounds);
* ``tools`` (unless ``tool_choice`` is ``"none"``): one ``tool_calls`` entry for the
  function named by ``tool_choice``, else the first function; its ``arguments`` are
  valid for the function's ``parameters``; ``finish_reason: "tool_calls"``.

Markers (anywhere in any message's text, except ``score=``)
-----------------------------------------------------------
``[[sim:score=N]]``     in the *last user message*: the score is the integer N
``[[sim:429]]``         answer 429 with ``Retry-After: 1`` (consumes no quota)
``[[sim:500]]``         answer 500 (after admission: the quota is consumed)
``[[sim:timeout]]``     hang ``Faults.timeout_seconds`` then drop the connection (or
                        answer late with ``timeout_action="late"``)
``[[sim:malformed]]``   200 whose content has no valid score: prose without digits
                        (plain), or truncated JSON (json modes, tool arguments)
``[[sim:KIND-once]]``   KIND in 500/429/timeout/malformed: the fault happens only the
                        first time the sim sees that exact request (same model and
                        body, any region; for 500/timeout/malformed: the first time
                        it is admitted), so a retry succeeds
``[[sim:delay=S]]``     add S seconds of latency to this request
If several fault markers are present: 429, then 500, timeout, malformed.

Slots: ``JudgeSim(slots=N)`` serves at most N calls of a region at once, each for its latency;
the rest wait for a slot (a self-hosted server's queue): throughput grows with concurrency up to
N, and past it only latency grows.

Latency: every admitted request waits ``latency + U[0, jitter)`` (plus any
``delay=`` marker) before it is answered, 500s included. Random faults (``Faults``)
and the jitter come from a per-region ``random.Random`` seeded from ``seed`` and the
region name, two draws per admitted request in admission order, so a serial client
sees the same sequence on every run.

Stats (``GET /stats`` on a region's port, ``JudgeSim.stats()``) count chat-completion
requests only (batch work is under the ``"batch"`` key, below): ``requests``, ``ok``, ``rate_limited`` (429s, of which
``rate_limited_injected`` by marker), ``errors`` (``error500``, ``timeout``,
``malformed``, ``total``), ``unauthorized``, ``bad_request``, ``prompt_tokens`` and
``completion_tokens`` (of the replies sent), ``admitted_requests``/``admitted_tokens``
(admission costs), ``window_requests``/``window_tokens`` (now in the window),
``peak_window_requests``/``peak_window_tokens``, ``in_flight``/``peak_in_flight``,
``held`` (calls waiting at a shut gate: ``JudgeSim.hold``).
Once nothing is in flight, ``requests`` is the sum of ok, rate_limited,
errors.total, unauthorized and bad_request. ``POST /stats/reset`` zeroes them;
``?limits=1`` also empties the rate-limit window and forgets ``-once`` requests.
``JudgeSim(per_request=True).answered()`` counts the replies each distinct request
got (by the sha256 of its model and body), so a client that pays twice for one
request shows.

Files and Batches
-----------------
The OpenAI Batch API as the ``openai`` SDK calls it (``files.create(purpose="batch")``,
``batches.create/retrieve/cancel/list``, ``files.content/retrieve/delete/list``), per
region, with the same key check as chat completions. Uploads are multipart/form-data
(``purpose``, ``file``); a ``batch`` file must be named ``*.jsonl``. A batch takes
``{input_file_id, endpoint, completion_window: "24h", metadata?}``; ``endpoint`` is
``/v1/chat/completions`` (OpenAI paths) or ``/chat/completions`` / ``/v1/chat/completions``
(Azure paths, where each line's ``body.model`` is the batch deployment). Each input line
is ``{"custom_id", "method": "POST", "url": <the endpoint>, "body"}``; a bad file makes
the batch ``failed`` with ``errors.data`` listing every bad line (codes ``empty_file``,
``too_many_tasks``, ``invalid_json_line``, ``missing_required_parameter``,
``invalid_value``, ``url_mismatch``, ``model_mismatch``, ``duplicate_custom_id``).

Per :class:`Region` (``NAME:TPM:RPM[:PORT][:KEY=VALUE...]``, or ``--batch-*`` options):
``batch_delay`` (default 1 s) from creation to ``completed``: ``validating`` for
``p = min(0.1 * delay, 1 s)``, ``in_progress`` with ``floor(N (t - p) / (delay - 2p))``
of the N lines answered by time t, ``finalizing`` for the last ``p``.
``batch_expire_after`` (default 86400, the 24 h window): a batch with a longer delay ends
``expired`` then. ``batch_fail_fraction``: a line fails (500) when the first 8 bytes
of ``sha256(f"{seed}:{custom_id}:{attempt}")``, big-endian, over ``2**64`` are below it
(``attempt``: earlier batches of the region with that custom_id, from 0). ``enqueued_tokens``
(0/None: none): the estimated tokens (the admission cost above, ``prompt + max_tokens
* n``, per line) of a model's unfinished batches; a batch that would pass it ends
``failed`` with ``token_limit_exceeded``. A cancelled batch is ``cancelling`` for ``p``,
then ``cancelled``. Times come from ``JudgeSim(clock=...)`` (default ``time.monotonic``).

Each line is answered as the synchronous endpoint answers its body (same ``choices``
and ``usage``, markers included; ``[[sim:timeout]]`` answers 500, ``delay=`` is ignored)
but takes no TPM/RPM, latency or random fault. The output file holds
``{"id", "custom_id", "response": {"status_code": 200, "request_id", "body"}, "error": null}``
per answered line; the error file the 4xx/5xx lines (``"body": {"error": ...}``) and, with
``"response": null``, the lines a batch ended without: ``error.code`` ``batch_expired`` or
``batch_cancelled``. Neither file keeps the input order (match by ``custom_id``); a file
exists only when it has a line. ``request_counts.failed`` counts the error file's lines.
``/stats``' ``"batch"`` counts these endpoints apart from chat completions:
``requests``, ``unauthorized``, ``bad_request``, ``files_uploaded``,
``batches_{created,completed,failed,expired,cancelled}``, ``batches_unfinished``,
``lines_{answered,failed,expired,cancelled}``, ``prompt_tokens``/``completion_tokens``
(answered lines), ``enqueued_tokens``, ``peak_enqueued_tokens``; ``answered()`` counts
batch replies too. ``POST /stats/reset?limits=1`` also forgets the custom_id attempts.

Authentication: a key must be sent (``Authorization: Bearer ...`` or ``api-key``);
any key is accepted unless the sim was given ``api_key``, then others get 401
(``/stats`` needs no key). The key is never logged.

The package, by concern: ``regions`` (regions, their sliding windows and
counters), ``handler`` (HTTP request handling: routes, auth, admission, the
chat endpoint), ``chat`` (a chat request read, and its completion, for both
paths), ``batches`` (files, batches and their timeline), ``batch_input`` (input
file checks), ``batch_api`` (the Files and Batches routes),
``replies`` (deterministic reply content, JSON Schema values),
``faults`` (fault rates and ``[[sim:...]]`` markers), ``tokens`` (the token
count), ``server`` (:class:`JudgeSim`, one server per region) and ``cli``
(``evalq judge-sim`` / ``python -m evalq.sim``).
"""

from evalq.sim.faults import Faults
from evalq.sim.pairwise import Biases
from evalq.sim.regions import Region, parse_region
from evalq.shared.judging.schema_values import schema_value
from evalq.sim.server import DEFAULT_MAX_TOKENS, DEFAULT_MODEL, HOST, JudgeSim
from evalq.sim.tokens import count_prompt_tokens, count_tokens


def __getattr__(name: str):
    # the CLI imports click; load it only when asked for
    if name in ("judge_sim_command", "main"):
        from evalq.sim import cli
        return getattr(cli, name)
    raise AttributeError(name)


__all__ = [
    "Biases", "DEFAULT_MAX_TOKENS", "DEFAULT_MODEL", "HOST", "Faults", "JudgeSim", "Region", "count_prompt_tokens",
    "count_tokens", "judge_sim_command", "main", "parse_region", "schema_value",
]
