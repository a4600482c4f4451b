"""Commands that run on the user's machine: run a job (embedded or on a cluster), validate
it, list metrics, plan capacity, build a report, compare runs, start a worker."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from evalq.cli.common import broker_option, cli, run_broker_option, scheduling_options, describe, destination_for, scheduled
from evalq.shared.core.errors import InfraError, JobError

@cli.command()
@click.argument("job_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--out", default=None, metavar="DIR|s3://BUCKET/PREFIX/",
              help="Where results.json, log.jsonl, run.json and report.html go [default: the job's "
                   "output.uri, else out/<job name>].")
@run_broker_option
@click.option("--chunk-size", type=click.IntRange(min=1), default=None, envvar="EVALQ_CHUNK_SIZE",
              help="Items per task [default: per metric; cpu: 250 to 1,000 by the entry's items].")
@click.option("--concurrency", type=click.IntRange(min=1), default=None,
              help="Embedded mode: processes per cpu worker [default: CPU count].")
@click.option("--gpu-processes", type=click.IntRange(min=1), default=None, envvar="EVALQ_GPU_PROCESSES",
              show_envvar=True,
              help="Embedded mode: gpu worker processes, each with its own model "
                   "[default: 2; 1 on one CPU or for one gpu chunk].")
@click.option("--stall-timeout", type=float, default=900.0, show_default=True,
              help="Give up (exit 1) when no item finishes for this many seconds.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
@scheduling_options
def run(job_file: Path, out: str | None, broker: str | None, chunk_size: int | None,
        concurrency: int | None, gpu_processes: int | None, stall_timeout: float, quiet: bool, suite: str | None,
        priority: str | None, tenant: str | None, weight: float | None) -> None:
    """Validate JOB_FILE, run it, write results.json, log.jsonl, run.json and report.html."""
    from evalq.cli.run import run_job
    from evalq.cli.common import read_job

    job = read_job(job_file)
    scheduled(job, suite, priority, tenant, weight)
    dest = destination_for(job, out, job_file)
    if not quiet:
        describe(job, job_file)
    summary = run_job(job, dest, broker=broker, chunk_size=chunk_size, concurrency=concurrency,
                      stall_timeout=stall_timeout, progress=not quiet, gpu_processes=gpu_processes)
    errors = sum(m["n_errors"] for m in summary)
    click.echo(f"wrote {dest.path('results.json')}, log.jsonl, run.json and report.html"
               + (f" ({errors} item(s) failed; see 'error' in the log)" if errors else ""), err=True)


@cli.command()
@click.argument("job_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--offline", is_flag=True,
              help="Read no secret: the judges' and the model's key variables must be named, not set here.")
@click.option("--ask-providers", is_flag=True,
              help="Ask each judge's provider for its model list: warn of a judge whose model retires within "
                   "EVALQ_RETIRE_WARN_DAYS days (30).")
def validate(job_file: Path, offline: bool, ask_providers: bool) -> None:
    """Check JOB_FILE (and its dataset) without running it."""
    from collections import Counter

    from evalq.cli.capacity import key_variables, render_keys
    from evalq.orchestrator.submit import chunks_of, outline
    from evalq.cli.common import read_job
    from evalq.shared.cluster.spec import METRICS_STAGE, stage_runs

    job = read_job(job_file, keys_needed=not offline)
    describe(job, job_file, err=False)
    repeated = {m.id for m in job.metrics if sum(o.id == m.id for o in job.metrics) > 1}
    metrics = ", ".join(f"{m.label} (metrics[{m.position}], {m.kind})" if m.id in repeated
                        else f"{m.label} ({m.kind})" for m in job.metrics)
    spec = outline(job, runs=job.runs)
    per_queue = Counter(chunk.queue for chunk in chunks_of(spec))
    tasks = ", ".join(f"{n} on {q}" for q, n in sorted(per_queue.items()))
    labels = {m.key: m.label for m in job.metrics}
    together = "".join(f"; scored together: {', '.join(labels[k] for k in [key, *entry['companions']])}"
                       for key, entry in stage_runs(spec, METRICS_STAGE) if entry.get("companions"))
    click.echo(f"{job_file}: valid: {len(job.instances)} instances; metrics: {metrics}; tasks: {tasks}{together}")
    if offline:
        for line in render_keys(key_variables(job)):
            click.echo(line)
    elif ask_providers:
        _ask_providers(job)


def _ask_providers(job) -> None:
    """``validate --ask-providers``: a line per judge deployment whose model retires soon (or that
    could not be asked). The keys go where the operator's EVALQ_ENDPOINTS lets them, else (the user
    is the operator of their own machine) to the endpoints the job names."""
    from evalq.shared.judging.deployments import govern
    from evalq.shared.judging.retirement import listing, retiring, said, shutdown_of, warn_days
    from evalq.shared.policy.endpoints import EndpointPolicy, endpoint_url, job_endpoints

    judges, unread = [], []
    for name, judge in sorted(job.judges.items()):
        try:  # a catalogue deployment's endpoint, as the operator's catalogue says it
            judges.append((name, govern(judge, "validate") if any(d.use for d in judge.deployments) else judge))
        except ValueError as exc:
            unread.append(f"judge {name}: not asked ({exc})")
    policy = EndpointPolicy.from_env() or EndpointPolicy.parse(job_endpoints([j for _, j in judges]))

    def shutdown(judge, d):
        try:
            return shutdown_of(listing(judge, d, endpoint_url(judge.provider, d), policy), judge.model)
        except Exception as exc:  # noqa: BLE001  (a provider without a model list, unreachable: said, not fatal)
            unread.append(f"judge {judge.model} region {d.region}: its model list was not read "
                          f"({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''})")
            return None

    found = retiring(judges, shutdown)
    for f in found:
        click.echo(f"warning: {said(f)}: switch judges before then", err=True)
    for line in unread:
        click.echo(f"note: {line}", err=True)
    if not found:
        click.echo(f"no judge retires within {warn_days()} days by what its provider says"
                   + (f" ({len(unread)} deployment(s) not asked)" if unread else ""))


@cli.command()
@click.argument("names", nargs=-1, metavar="[METRIC ...]")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def metrics(names: tuple[str, ...], as_json: bool) -> None:
    """List metric ids, their parameters (types, defaults) and queue: all, or those named (an id,
    or a part of ids: `evalq metrics rouge`)."""
    import evalq.shared.job.catalogue  # noqa: F401
    from evalq.shared.metrics.registry import REGISTRY

    rows = []
    for spec in _named(REGISTRY.all(), names):
        params = []
        for name, field in spec.params.model_fields.items():
            entry = {"name": name, "type": _type_name(field.annotation),
                     "required": field.is_required(), "description": field.description or ""}
            if not field.is_required():
                default = field.get_default(call_default_factory=True)
                entry["default"] = default.model_dump(mode="json") if hasattr(default, "model_dump") else default
            longest = next((m.max_length for m in field.metadata if getattr(m, "max_length", None)), None)
            if longest is not None:  # items of a list, characters of a string (evalq.shared.core.bounds)
                entry["max_length"] = longest
            params.append(entry)
        rows.append({"id": spec.id, "queue": spec.queue, "aggregation": spec.aggregation,
                     "requires": list(spec.requires), "description": spec.description,
                     "parameters": params})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        click.echo(f"{row['id']}  [queue: {row['queue']}; needs: {', '.join(row['requires'])}]")
        click.echo(f"    {row['description']}")
        for p in row["parameters"]:
            value = "(required)" if p["required"] else f"= {json.dumps(p['default'])}"
            longest = f" (at most {p['max_length']})" if "max_length" in p else ""
            click.echo(f"    - {p['name']}: {p['type']}{longest} {value}  {p['description']}")
        if not row["parameters"]:
            click.echo("    (no parameters)")


def _named(specs: list, names: tuple[str, ...]) -> list:
    """The metrics ``names`` pick: each an id, else every id it is part of; one that picks none
    is exit 2, with the ids it is closest to."""
    import difflib

    from evalq.shared.core.errors import JobError

    if not names:
        return specs
    ids = [spec.id for spec in specs]
    picked, problems = set(), []
    for name in names:
        found = {name} if name in ids else {i for i in ids if name.lower() in i.lower()}
        if not found:
            close = difflib.get_close_matches(name, ids, n=3, cutoff=0.5)
            problems.append(f"no metric {name!r}" + (f"; did you mean {', '.join(close)}?" if close else
                                                    "; `evalq metrics` lists them all"))
        picked |= found
    if problems:
        raise JobError(problems)
    return [spec for spec in specs if spec.id in picked]


def _type_name(annotation) -> str:
    text = getattr(annotation, "__name__", None) if not getattr(annotation, "__args__", None) else None
    return text or str(annotation).replace("typing.", "")


@cli.command()
@click.option("--queues", "-Q", required=True,
              help="Comma-separated queues to consume: cpu, gpu, judge.<region>.")
@broker_option
@click.option("--concurrency", "-c", type=click.IntRange(min=1), default=None,
              help="Processes (or threads) [default: CPU count; a gpu worker: see --gpu-processes].")
@click.option("--gpu-processes", type=click.IntRange(min=1), default=1, show_default=True,
              envvar="EVALQ_GPU_PROCESSES", show_envvar=True,
              help="A gpu worker's processes, each with its own model on the same device (2: one keeps "
                   "the device busy while the other does its host-side work).")
@click.option("--pool", type=click.Choice(["prefork", "solo", "threads"]), default=None,
              help="Celery pool [default: prefork for cpu, solo for gpu (prefork with --gpu-processes 2+)].")
@click.option("--hostname", "-n", default=None,
              help="Worker node name (Celery's -n) [default: evalq-<queue kinds>-<pid>@<host>, unique on its host].")
@click.option("--loglevel", "-l", default="INFO", show_default=True)
@click.option("--no-control", is_flag=True,
              help="Do not consume the control queue (job aggregation callbacks).")
def worker(queues: str, broker: str | None, concurrency: int | None, gpu_processes: int, pool: str | None,
           hostname: str | None, loglevel: str, no_control: bool) -> None:
    """Start a worker for some queues (wraps `celery worker`)."""
    if not broker:
        raise InfraError("evalq worker needs --broker or EVALQ_BROKER_URL")
    from evalq.cli.nodemetrics import prepare_node
    from evalq.cli.workerargs import gpu_environment, node_name, worker_argv

    os.environ["EVALQ_BROKER_URL"] = broker
    from evalq.shared.judging.deployments import WORKER_ENV

    os.environ[WORKER_ENV] = "1"  # a cluster's worker: jobs' own deployments default to keys of their own
    from evalq.shared.judging.deployments import no_catalogue_notice

    notice = no_catalogue_notice()
    if notice:  # once, at start: the operator of a shared endpoint should know
        click.echo(f"evalq worker: {notice}", err=True)
    consumed = [q.strip() for q in queues.split(",") if q.strip()]
    prepare_node(consumed, broker)  # EVALQ_METRICS_PORT: before any import of prometheus_client
    from evalq.orchestrator.app import app
    from evalq.shared.job.preload import ENV as PRELOAD_ENV, parse as parse_preload

    parse_preload(os.environ.get(PRELOAD_ENV, ""))  # a bad setting: exit 2 now, not a warning in a log later

    argv = worker_argv(consumed, concurrency=concurrency, pool=pool, hostname=hostname or node_name(consumed),
                       loglevel=loglevel,
                       control=not no_control, gpu_processes=gpu_processes)
    if "gpu" in {q.split(".", 1)[0] for q in consumed}:  # inherited by the pool's processes
        processes = int(argv[argv.index("-c") + 1]) if argv[argv.index("-P") + 1] == "prefork" else 1
        os.environ.update(gpu_environment(processes))
    # `celery worker` itself, without the `celery` command group around it: the group imports
    # every celery subcommand and plugin (amqp's shell with prompt_toolkit, flower's tornado app),
    # about 0.2 s of a worker's start spent on commands a worker never runs. The group's one job
    # for a worker, the context holding the app, is done here.
    from celery.bin.base import CLIContext
    from celery.bin.worker import worker as celery_worker

    celery_worker.main(args=argv[1:], prog_name="celery worker", standalone_mode=False,
                       obj=CLIContext(app=app, no_color=bool(os.environ.get("NO_COLOR")), workdir=None))


def _duration(text: str) -> float:
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not m:
        raise JobError(f"--window {text!r}: expected a duration such as 6h, 90m, 3600s or 3600")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


@cli.command("plan")
@click.argument("job_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--window", default="6h", show_default=True, help="Time the job must finish in: 6h, 90m, 3600s.")
@click.option("--cpu-items-per-s", type=float, default=7250.0, show_default=True,
              help="Items one cpu worker scores per second (BENCHMARKS.md: 2 processes, lexical metrics).")
@click.option("--gpu-pairs-per-s", type=float, default=180.0, show_default=True,
              help="BERTScore pairs one gpu worker scores per second (the default is a CPU figure: measure yours).")
@click.option("--call-seconds", type=click.FloatRange(min=0.001), default=1.0, show_default=True,
              help="Seconds one judge call takes: the threads a judge queue needs, and the pace of a self-hosted "
                   "server without a quota (with --broker: the least latency the cluster saw, where it has one).")
@click.option("--broker", default=None, metavar="URL",
              help="A cluster's Redis URL: its judges' deployments that learn their limits are planned at what "
                   "the cluster learned, not at where they start.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def plan_command(job_file: Path, window: str, cpu_items_per_s: float, gpu_pairs_per_s: float, call_seconds: float,
                 broker: str | None, as_json: bool) -> None:
    """Capacity plan for JOB_FILE: time per queue, the binding constraint, workers to fit --window."""
    from evalq.cli.capacity import cluster_learned, plan_job, render
    from evalq.cli.common import read_job

    window_s = _duration(window)
    learned = None
    if broker:
        from evalq.cli import wait as waiting

        learned = cluster_learned(waiting.connect(broker))
    # a plan reads no secret: the key variables are named, and those not set here are said so
    result = plan_job(read_job(job_file, keys_needed=False), window_s, cpu_items_per_s, gpu_pairs_per_s,
                      call_seconds, learned=learned)
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        for line in render(result):
            click.echo(line)


@cli.command()
@click.argument("out")
@click.option("--html", "html", type=click.Path(dir_okay=False), default=None,
              help="Where to write it [default: report.html in OUT, for a local OUT].")
def report(out: str, html: str | None) -> None:
    """Write the HTML report of a run from its outputs (a directory or s3:// prefix)."""
    from evalq.shared.data.storage import Destination
    from evalq.results.report import report_from_outputs

    page = report_from_outputs(out)
    dest = Destination(out)
    if html is None and dest.s3:
        with dest.open_text("report.html") as f:
            f.write(page)
        click.echo(dest.path("report.html"))
        return
    target = Path(html) if html else Path(out) / "report.html"
    target.write_text(page, encoding="utf-8")
    click.echo(str(target))


@cli.command()
@click.argument("base")
@click.argument("new")
@click.option("--gate", "gates", multiple=True, metavar="EXPR",
              help='Quality gate, repeatable: "NAME.FIELD OP NUMBER" on NEW, "delta(NAME.FIELD) OP NUMBER" on '
                   "NEW - BASE (OP: >= <= > < ==). Exit 3 when one fails.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--html", "html", type=click.Path(dir_okay=False), default=None, help="Also write an HTML comparison.")
def compare(base: str, new: str, gates: tuple[str, ...], as_json: bool, html: str | None) -> None:
    """Compare two runs' outputs (directories or s3:// prefixes), paired by instance id.

    Exit codes: 0 every gate passed, 3 a gate failed, 2 bad input (a gate on a
    metric a run lacks), 1 infrastructure."""
    from evalq.cli import compare as comparing

    parsed = [comparing.parse_gate(g) for g in gates]
    base_run, new_run = comparing.load_run(base), comparing.load_run(new)
    outcome = comparing.evaluate_gates(parsed, base_run, new_run)
    report = comparing.compare(base_run, new_run)
    report["gates"] = outcome
    if html:
        from evalq.results.report import compare_html

        Path(html).write_text(compare_html(report), encoding="utf-8")
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        from evalq.shared.core.display import printable

        for line in comparing.render(report, outcome):
            click.echo(printable(line, 100_000))  # names and instance ids a job gave: no control characters
    failed = [g["gate"] for g in outcome if not g["passed"]]
    if failed:
        raise comparing.GateFailed(f"{len(failed)} gate(s) failed: {'; '.join(failed)}")


