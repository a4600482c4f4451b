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
``x-ratelimit-{limit,remaining}-{requests,tokens}`` headers.

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
  the schema (see :func:`evalq.shared.schema_values.schema_value`; a property named ``score`` gets the score,
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

Latency: every admitted request waits ``latency + U[0, jitter)`` (plus any
``delay=`` marker) before it is answered, 500s included. Random faults (``Faults``)
and the jitter come from a per-region ``random.Random`` seeded from ``seed`` and the
region name, two draws per admitted request in admission order, so a serial client
sees the same sequence on every run.

Stats (``GET /stats`` on a region's port, ``JudgeSim.stats()``) count chat-completion
requests only: ``requests``, ``ok``, ``rate_limited`` (429s, of which
``rate_limited_injected`` by marker), ``errors`` (``error500``, ``timeout``,
``malformed``, ``total``), ``unauthorized``, ``bad_request``, ``prompt_tokens`` and
``completion_tokens`` (of the replies sent), ``admitted_requests``/``admitted_tokens``
(admission costs), ``window_requests``/``window_tokens`` (now in the window),
``peak_window_requests``/``peak_window_tokens``, ``in_flight``/``peak_in_flight``.
Once nothing is in flight, ``requests`` is the sum of ok, rate_limited,
errors.total, unauthorized and bad_request. ``POST /stats/reset`` zeroes them;
``?limits=1`` also empties the rate-limit window and forgets ``-once`` requests.
``JudgeSim(per_request=True).answered()`` counts the replies each distinct request
got (by the sha256 of its model and body), so a client that pays twice for one
request shows.

Authentication: a key must be sent (``Authorization: Bearer ...`` or ``api-key``);
any key is accepted unless the sim was given ``api_key``, then others get 401
(``/stats`` needs no key). The key is never logged.

The package, by concern: ``regions`` (regions, their sliding windows and
counters), ``handler`` (HTTP request handling: routes, auth, admission, the
chat endpoint), ``replies`` (deterministic reply content, JSON Schema values),
``faults`` (fault rates and ``[[sim:...]]`` markers), ``tokens`` (the token
count), ``server`` (:class:`JudgeSim`, one server per region) and ``cli``
(``evalq judge-sim`` / ``python -m evalq.sim``).
"""

from evalq.sim.faults import Faults
from evalq.sim.regions import Region, parse_region
from evalq.shared.schema_values import schema_value
from evalq.sim.server import DEFAULT_MAX_TOKENS, DEFAULT_MODEL, HOST, JudgeSim
from evalq.sim.tokens import count_prompt_tokens, count_tokens


def __getattr__(name: str):
    # the CLI imports click; load it only when asked for
    if name in ("judge_sim_command", "main"):
        from evalq.sim import cli
        return getattr(cli, name)
    raise AttributeError(name)


__all__ = [
    "DEFAULT_MAX_TOKENS", "DEFAULT_MODEL", "HOST", "Faults", "JudgeSim", "Region", "count_prompt_tokens",
    "count_tokens", "judge_sim_command", "main", "parse_region", "schema_value",
]
