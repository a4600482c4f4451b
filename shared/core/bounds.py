"""Bounded work per item: a job's parameters and its instance text come from someone
else, so what one item may cost a worker is bounded, in three ways.

- Parameter sizes, checked at validation (exit 2, naming the entry and the
  parameter): the constants below, used by the parameter models
  (``evalq.shared.metrics.params``, ``evalq.shared.judging.judges``). A list or string a metric
  repeats for every item (BLEU weights, a rubric's criteria and examples) cannot
  make each item cost more than a few such entries.
- Tokens per text for metrics quadratic in them (ROUGE-L and ROUGE-Lsum: a
  longest common subsequence is tokens x tokens): ``EVALQ_MAX_ROUGE_L_TOKENS``
  (default 2,000; measured about 0.75 s per answer and reference pair at that
  length on one core). A longer text is an error on that item, saying so.
- A time budget per item, ``EVALQ_ITEM_TIMEOUT`` (seconds, default 30) for
  metrics computed in the worker's own process (cpu metrics, plugins), enforced
  with a timer signal (``evalq.workers.item_budget``). Metrics that call a model
  (judges, the model under test) are bounded by their endpoint's ``timeout`` and
  ``max_retries`` instead; batch metrics (bertscore) by their chunk.

0 turns either setting off. Both are read where items are scored (cpu workers)
and checked up front by every ``evalq`` command, like every ``EVALQ_*`` number.
"""

from __future__ import annotations

from evalq.shared.core.config import env_number

# --- parameter sizes (validation) -------------------------------------------------
MAX_BLEU_ORDER = 10          # BLEU weights: one per n-gram order, orders 1 to 10
MAX_NAME_CHARS = 128         # a judge's name as a metric parameter names it
MAX_CRITERIA_CHARS = 10_000  # a rubric's criteria, sent with every item
MAX_EXAMPLES = 22            # a rubric's few-shot examples: two per point of the largest (11-point) scale
MAX_EXAMPLE_CHARS = 4_000    # each text of an example (output, input, reason), sent with every item
MAX_PATH_CHARS = 4_096       # a model folder or baseline file (Linux PATH_MAX)
MAX_LANG_CHARS = 35          # a language tag (BCP 47 tags are at most 35 characters)
MAX_DEVICE_CHARS = 16        # cpu, cuda:N, mps
MAX_BATCH_SIZE = 4_096       # bertscore sentences per forward pass
MAX_THREADS = 256            # bertscore's (unused) nthreads
MAX_DELIMITER_CHARS = 64     # fmeval's target_output_delimiter
MAX_LABELS = 1_000           # classification_accuracy's valid_labels
MAX_LABEL_CHARS = 200        # each of them
MAX_PERTURBATIONS = 20       # semantic_robustness: perturbed inputs per item, each a model call
MAX_BASELINE_SAMPLES = 10    # semantic_robustness: answers to the same input, each a model call
MAX_NEW_TOKENS = 4_096       # a local model runner's generated tokens per prompt (a worker's CPU or GPU time)

# --- rates and durations an endpoint may declare (validation) -------------------------
# Generous for any real deployment, finite for every one: a budget's window, burst and rates
# shape when every job on a shared deployment may call it.
MAX_TPM = 200_000_000        # tokens per minute (the largest provider tiers are tens of millions)
MAX_RPM = 1_000_000          # requests per minute
MAX_WINDOW_SECONDS = 3_600   # a budget's sliding window (providers enforce 60 s)
MAX_MAX_TOKENS = 131_072     # completion tokens per call (the longest outputs models offer)
MAX_TIMEOUT = 600.0          # seconds per HTTP call
MAX_RETRIES = 10             # retries after 429, 408, 5xx and timeouts
MAX_CACHE_TTL = 365 * 86400  # seconds a cached judge reply lives
CACHE_TTL = 30 * 86400  # ... unless a job says (judging.cache_ttl)
MAX_ENQUEUED_TOKENS = 10_000_000_000  # a deployment's Batch API quota (Azure's largest is 5 billion)

# --- runtime (workers) ---------------------------------------------------------------
ITEM_TIMEOUT_ENV, ITEM_TIMEOUT_DEFAULT = "EVALQ_ITEM_TIMEOUT", 30.0
ROUGE_L_TOKENS_ENV, ROUGE_L_TOKENS_DEFAULT = "EVALQ_MAX_ROUGE_L_TOKENS", 2_000
# an agent run: messages and tool calls per instance (a judge metric sends the whole transcript;
# tool_call_accuracy makes a call per tool call)
MESSAGES_ENV, MESSAGES_DEFAULT = "EVALQ_MAX_MESSAGES", 500
TOOL_CALLS_ENV, TOOL_CALLS_DEFAULT = "EVALQ_MAX_TOOL_CALLS", 200
# ... and its total size: the UTF-8 bytes of every message's text, call arguments and tool results
# (a judge metric sends all of it in one prompt; a judge's context is ~128k tokens, ~0.5 MB)
RUN_BYTES_ENV, RUN_BYTES_DEFAULT = "EVALQ_MAX_RUN_BYTES", 1_048_576
# a trace dataset: the GenAI spans one agent run or one conversation is made from, all in memory
# together while it is made (where the job is validated)
TRACE_SPANS_ENV, TRACE_SPANS_DEFAULT = "EVALQ_MAX_TRACE_SPANS", 10_000


def item_timeout() -> float:
    """Seconds one item of an in-process metric may take (0: no budget)."""
    return env_number(ITEM_TIMEOUT_ENV, ITEM_TIMEOUT_DEFAULT)


def rouge_l_max_tokens() -> int:
    """Tokens (rouge-score's) a text may have for ROUGE-L/Lsum (0: no limit)."""
    return env_number(ROUGE_L_TOKENS_ENV, ROUGE_L_TOKENS_DEFAULT)


def trace_spans_limit() -> int:
    """GenAI spans one agent run or conversation of a trace dataset may be made from (0: no limit)."""
    return env_number(TRACE_SPANS_ENV, TRACE_SPANS_DEFAULT)


def check_env() -> None:
    """Read every setting here once: a bad value is a JobError before anything starts."""
    item_timeout()
    rouge_l_max_tokens()
    trace_spans_limit()
