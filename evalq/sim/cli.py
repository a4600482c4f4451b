"""``evalq judge-sim`` and ``python -m evalq.sim``: serve simulated regions until stopped."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Any, Sequence

import click

from evalq.sim.faults import Faults
from evalq.sim.regions import BATCH_WINDOW_SECONDS, parse_region
from evalq.sim.server import DEFAULT_MAX_TOKENS, DEFAULT_MODEL, JudgeSim


def _region_param(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
    try:  # checked here; read in the command, where the --batch-* defaults are known
        for v in values:
            parse_region(v)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return values


def _shutdown_param(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    """``--shutdown MODEL=DATE`` values as ``JudgeSim``'s ``shutdown``."""
    import datetime

    found = {}
    for value in values:
        model, eq, day = value.partition("=")
        try:
            found[model.strip()] = datetime.date.fromisoformat(day.strip()).isoformat()
        except ValueError:
            raise click.BadParameter(f"{value!r}: expected MODEL=YYYY-MM-DD") from None
        if not eq or not model.strip():
            raise click.BadParameter(f"{value!r}: expected MODEL=YYYY-MM-DD")
    return found


def _bias_param(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> Any:
    """``--bias`` values as ``JudgeSim``'s ``biases``: one ``Biases`` for every model, or one per model."""
    from evalq.sim.pairwise import Biases

    kinds = {"first": float, "longer": float, "noise": float, "leniency": int}
    found: dict[str | None, Biases] = {}
    for value in values:
        model, _, text = value.rpartition(":") if ":" in value.split("=", 1)[0] else ("", "", value)
        fields = {}
        for pair in text.split(","):
            key, eq, number = pair.partition("=")
            if not eq or key.strip() not in kinds:
                raise click.BadParameter(f"{pair!r}: expected KEY=VALUE with KEY one of {', '.join(kinds)}")
            try:
                fields[key.strip()] = kinds[key.strip()](number)
            except ValueError:
                raise click.BadParameter(f"{pair!r}: {key.strip()} takes a number") from None
        try:
            found[model or None] = Biases(**fields)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
    if not found:
        return None
    if set(found) == {None}:
        return found[None]
    if None in found:
        raise click.BadParameter("give every --bias a MODEL:, or none of them")
    return found


@click.command("judge-sim", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--region", "regions", multiple=True, default=("lab:20000:120",), show_default=True,
              callback=_region_param, metavar="NAME:TPM:RPM[:PORT][:KEY=VALUE...]",
              help="A simulated region (repeatable); 0 disables a limit; no PORT: a free one. KEY "
                   "(batch_delay, batch_fail_fraction, batch_expire_after, enqueued_tokens) "
                   "overrides a --batch-* / --enqueued-tokens option for this region.")
@click.option("--latency", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Base latency per request, seconds.")
@click.option("--jitter", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Extra uniform random latency in [0, JITTER) seconds (seeded).")
@click.option("--fail-rate", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="Probability of a 500.")
@click.option("--timeout-rate", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="Probability of a timeout (hang --timeout-seconds).")
@click.option("--malformed-rate", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="Probability of a reply with no valid score.")
@click.option("--timeout-seconds", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="How long a timeout fault hangs.")
@click.option("--timeout-action", type=click.Choice(["drop", "late"]), default="drop",
              show_default=True, help="After hanging: close the connection, or answer late.")
@click.option("--window", type=click.FloatRange(min=0, min_open=True), default=60.0,
              show_default=True, help="Sliding rate-limit window, seconds.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for faults and jitter.")
@click.option("--model", "models", multiple=True, default=(DEFAULT_MODEL,), show_default=True,
              help="Model name listed by /v1/models (repeatable; any model is accepted).")
@click.option("--max-tokens-default", type=click.IntRange(min=1), default=DEFAULT_MAX_TOKENS,
              show_default=True, help="max_tokens assumed at admission when a request has none.")
@click.option("--api-key", envvar="EVALQ_JUDGE_SIM_API_KEY", default=None, metavar="KEY",
              help="Accept only this key (env EVALQ_JUDGE_SIM_API_KEY); default: any key.")
@click.option("--batch-delay", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="Seconds from a batch's creation to 'completed'.")
@click.option("--batch-fail-fraction", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="Fraction of batch lines answered 500 (chosen by a hash of custom_id and attempt).")
@click.option("--batch-expire-after", type=click.FloatRange(min=0, min_open=True),
              default=BATCH_WINDOW_SECONDS, show_default=True,
              help="A batch whose delay exceeds this many seconds ends 'expired' at this time.")
@click.option("--enqueued-tokens", type=click.IntRange(min=0), default=0, show_default=True,
              help="Enqueued-token limit per model of unfinished batches (0: none).")
@click.option("--rate-headers", type=click.Choice(["openai", "azure", "none"]), default="openai", show_default=True,
              help="What replies say of the limits: x-ratelimit limit/remaining/reset (openai), remaining "
              "only (azure), or nothing.")
@click.option("--slots", type=click.IntRange(min=1), default=None,
              help="Serve at most this many calls of a region at once, the rest waiting (a self-hosted "
                   "server's queue) [default: no limit].")
@click.option("--bias", "biases", multiple=True, callback=_bias_param, metavar="[MODEL:]KEY=VALUE[,KEY=VALUE...]",
              help="A judge's biases (repeatable; without MODEL: every model): first and longer (P of the "
                   "first seat / the longer answer winning a pairwise call), noise (P of the worse answer "
                   "winning; of a rating a point off), leniency (points added to a rating carrying "
                   "[[sim:score=N]]).")
@click.option("--shutdown", "shutdown", multiple=True, callback=_shutdown_param, metavar="MODEL=DATE",
              help="A model that retires on DATE (YYYY-MM-DD), as /v1/models says it (repeatable).")
@click.option("-v", "--verbose", is_flag=True, help="Log one line per request to stderr.")
def judge_sim_command(regions: tuple[str, ...], latency: float, jitter: float, fail_rate: float,
                      timeout_rate: float, malformed_rate: float, timeout_seconds: float,
                      timeout_action: str, window: float, seed: int, models: tuple[str, ...],
                      max_tokens_default: int, api_key: str | None, batch_delay: float,
                      batch_fail_fraction: float, batch_expire_after: float, enqueued_tokens: int,
                      rate_headers: str, slots: int | None, biases: Any, shutdown: dict[str, str],
                      verbose: bool) -> None:
    """Serve simulated OpenAI / Azure OpenAI chat, Files and Batches endpoints on loopback,
    one port per region, until SIGINT or SIGTERM. Prints `NAME BASE_URL` per region."""
    batch = {"batch_delay": batch_delay, "batch_fail_fraction": batch_fail_fraction,
             "batch_expire_after": batch_expire_after, "enqueued_tokens": enqueued_tokens or None}
    try:
        parsed = [parse_region(spec, batch) for spec in regions]
        faults = Faults(error500=fail_rate, timeout=timeout_rate, malformed=malformed_rate,
                        timeout_seconds=timeout_seconds, timeout_action=timeout_action)
        sim = JudgeSim(parsed, latency=latency, jitter=jitter, fault_rates=faults,
                       window_seconds=window, seed=seed, api_key=api_key, models=models,
                       default_max_tokens=max_tokens_default, log=sys.stderr if verbose else None,
                       rate_headers=rate_headers, slots=slots, biases=biases, shutdown=shutdown)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    try:
        sim.start()
    except OSError as exc:
        raise click.ClickException(f"cannot bind: {exc}") from None
    done = threading.Event()
    previous: dict[int, Any] = {}
    try:
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError):  # not the main thread: rely on Ctrl-C
                previous[signum] = signal.signal(signum, lambda *_: done.set())
        for region in sim.regions:
            click.echo(f"{region.name} {sim.base_url(region.name)}")
        sys.stdout.flush()
        click.echo(f"judge-sim: {len(sim.regions)} region(s), window {window:g} s; "
                   "SIGINT/SIGTERM to stop", err=True)
        while not done.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        sim.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m evalq.sim [options]``; returns the exit code."""
    try:
        judge_sim_command.main(args=list(argv) if argv is not None else None,
                               prog_name="evalq judge-sim", standalone_mode=False)
    except click.exceptions.Abort:
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    return 0

