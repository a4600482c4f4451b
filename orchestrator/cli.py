"""The ``evalq`` command. Heavy imports (Celery, metric libraries) are deferred so
``--help`` and ``validate`` are instant. Errors travel as exceptions to ``main``,
the one place that turns them into exit codes: 2 invalid job, 1 infrastructure."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from evalq.shared.errors import InfraError, JobError

broker_option = click.option(
    "--broker", envvar="EVALQ_BROKER_URL", default=None, metavar="URL",
    help="Redis URL of a running cluster (env EVALQ_BROKER_URL). Without it, `run` starts "
         "an embedded Redis and local workers.")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """evalq: distributed evaluation of LLM applications."""
    from evalq.shared import bounds
    from evalq.shared.config import Settings
    from evalq.shared.limits import Limits

    # every EVALQ_* number is read up front: a bad one is reported before anything starts
    Settings.from_env()
    Limits.from_env()
    bounds.check_env()


@cli.command()
@click.argument("job_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--out", default=None, metavar="DIR|s3://BUCKET/PREFIX/",
              help="Where results.json, log.jsonl and run.json go [default: the job's output.uri, "
                   "else out/<job name>].")
@broker_option
@click.option("--chunk-size", type=click.IntRange(min=1), default=None, envvar="EVALQ_CHUNK_SIZE",
              help="Items per task [default: per metric; cpu: 250 to 1,000 by the entry's items].")
@click.option("--concurrency", type=click.IntRange(min=1), default=None,
              help="Embedded mode: processes per cpu worker [default: CPU count].")
@click.option("--stall-timeout", type=float, default=900.0, show_default=True,
              help="Give up (exit 1) when no item finishes for this many seconds.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def run(job_file: Path, out: str | None, broker: str | None, chunk_size: int | None,
        concurrency: int | None, stall_timeout: float, quiet: bool) -> None:
    """Validate JOB_FILE, run it, write results.json, log.jsonl and run.json."""
    from evalq.orchestrator.runner import run_job
    from evalq.shared.job import load_job

    job = load_job(job_file)
    dest = _destination(job, out, job_file)
    if not quiet:
        _describe(job, job_file)
    summary = run_job(job, dest, broker=broker, chunk_size=chunk_size, concurrency=concurrency,
                      stall_timeout=stall_timeout, progress=not quiet)
    errors = sum(m["n_errors"] for m in summary)
    click.echo(f"wrote {dest.path('results.json')}, log.jsonl and run.json"
               + (f" ({errors} item(s) failed; see 'error' in the log)" if errors else ""), err=True)


def _destination(job, out: str | None, job_file: Path):
    from evalq.orchestrator.submit import destination

    return destination(job, out) or destination(job, str(Path("out") / job_file.stem))


def _describe(job, job_file: Path, err: bool = True) -> None:
    """What validation found, beyond 'valid': where instances came from, what is skipped."""
    if job.dataset is not None:
        click.echo(f"{job_file}: dataset {job.dataset.uri} ({job.dataset.format}; {job.mapping})", err=err)
    if job.bad_records.count:
        shown = job.bad_records.shown[0]
        click.echo(f"{job_file}: skipped {job.bad_records.count} bad record(s) (on_bad_record: skip), "
                   f"e.g. {shown['where']}: {'; '.join(shown['errors'])}", err=err)
    if job.n_to_generate:
        click.echo(f"{job_file}: the model generates {job.n_to_generate} missing output(s) first", err=err)
    if job.categories:
        shown = ", ".join(job.categories[:10]) + (", ..." if len(job.categories) > 10 else "")
        click.echo(f"{job_file}: {len(job.categories)} categories: {shown}", err=err)


@cli.command()
@click.argument("job_file", type=click.Path(dir_okay=False, path_type=Path))
def validate(job_file: Path) -> None:
    """Check JOB_FILE (and its dataset) without running it."""
    from collections import Counter

    from evalq.orchestrator.submit import plan
    from evalq.shared.job import load_job

    job = load_job(job_file)
    _describe(job, job_file, err=False)
    repeated = {m.id for m in job.metrics if sum(o.id == m.id for o in job.metrics) > 1}
    metrics = ", ".join(f"{m.label} (metrics[{m.position}], {m.spec.queue})" if m.id in repeated
                        else f"{m.label} ({m.spec.queue})" for m in job.metrics)
    per_queue = Counter(chunk.queue for chunk in plan(job, runs=job.runs))
    tasks = ", ".join(f"{n} on {q}" for q, n in sorted(per_queue.items()))
    click.echo(f"{job_file}: valid: {len(job.instances)} instances; metrics: {metrics}; tasks: {tasks}")


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def metrics(as_json: bool) -> None:
    """List metric ids, their parameters (types, defaults) and queue."""
    import evalq.shared.metrics  # noqa: F401
    from evalq.shared.registry import REGISTRY

    rows = []
    for spec in REGISTRY.all():
        params = []
        for name, field in spec.params.model_fields.items():
            entry = {"name": name, "type": _type_name(field.annotation),
                     "required": field.is_required(), "description": field.description or ""}
            if not field.is_required():
                default = field.get_default(call_default_factory=True)
                entry["default"] = default.model_dump(mode="json") if hasattr(default, "model_dump") else default
            longest = next((m.max_length for m in field.metadata if getattr(m, "max_length", None)), None)
            if longest is not None:  # items of a list, characters of a string (evalq.shared.bounds)
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


def _type_name(annotation) -> str:
    text = getattr(annotation, "__name__", None) if not getattr(annotation, "__args__", None) else None
    return text or str(annotation).replace("typing.", "")


@cli.command()
@click.option("--queues", "-Q", required=True,
              help="Comma-separated queues to consume: cpu, gpu, judge.<region>.")
@broker_option
@click.option("--concurrency", "-c", type=click.IntRange(min=1), default=None,
              help="Processes (or threads) [default: CPU count; the gpu solo pool always runs 1].")
@click.option("--pool", type=click.Choice(["prefork", "solo", "threads"]), default=None,
              help="Celery pool [default: prefork for cpu, solo for gpu].")
@click.option("--hostname", "-n", default=None, help="Worker node name (Celery's -n).")
@click.option("--loglevel", "-l", default="INFO", show_default=True)
@click.option("--no-control", is_flag=True,
              help="Do not consume the control queue (job aggregation callbacks).")
def worker(queues: str, broker: str | None, concurrency: int | None, pool: str | None,
           hostname: str | None, loglevel: str, no_control: bool) -> None:
    """Start a worker for some queues (wraps `celery worker`)."""
    if not broker:
        raise InfraError("evalq worker needs --broker or EVALQ_BROKER_URL")
    from evalq.orchestrator.workerargs import worker_argv

    os.environ["EVALQ_BROKER_URL"] = broker
    from evalq.workers.app import app

    argv = worker_argv([q.strip() for q in queues.split(",") if q.strip()], concurrency=concurrency,
                       pool=pool, hostname=hostname, loglevel=loglevel, control=not no_control)
    app.worker_main(argv)


def _need_broker(broker: str | None) -> str:
    if not broker:
        raise InfraError("this command needs a cluster: --broker URL or EVALQ_BROKER_URL")
    return broker


@cli.command()
@click.argument("job_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--out", default=None, metavar="DIR|s3://BUCKET/PREFIX/",
              help="Where the cluster writes the outputs [default: the job's output.uri, else "
                   "out/<job name>, absolute, on the callback worker's file system].")
@click.option("--request-id", default=None, help="Idempotency key: the same id never starts a second job.")
@click.option("--reply-to", default=None, metavar="LIST", help="Redis list that gets the end document.")
@broker_option
@click.option("--chunk-size", type=click.IntRange(min=1), default=None, envvar="EVALQ_CHUNK_SIZE",
              help="Items per task [default: per metric].")
def submit(job_file: Path, out: str | None, request_id: str | None, reply_to: str | None,
           broker: str | None, chunk_size: int | None) -> None:
    """Validate JOB_FILE and hand it to the cluster; prints the job id and returns at once."""
    from evalq.orchestrator import submit as submitting
    from evalq.shared import keys
    from evalq.shared.config import Settings
    from evalq.shared.job import load_job

    from evalq.orchestrator.service import reply_to_problem

    broker = _need_broker(broker)
    job = load_job(job_file)
    if reply_to is not None and reply_to_problem(reply_to):
        raise JobError(reply_to_problem(reply_to).replace("request.reply_to", "--reply-to"))
    dest = _destination(job, out, job_file)
    dest.check()
    r = submitting.connect(broker)
    job_id = submitting.new_job_id()
    if request_id is not None and not r.set(keys.request(request_id), job_id, nx=True,
                                            ex=Settings.from_env().result_ttl):
        known = r.get(keys.request(request_id)).decode()
        click.echo(known)
        click.echo(f"request {request_id} is already job {known}; not started again", err=True)
        return
    submitting.submit(r, broker, job, chunk_size, out=dest, request_id=request_id, reply_to=reply_to,
                      job_id=job_id)
    click.echo(job_id)


@cli.command()
@click.argument("job_id")
@broker_option
@click.option("--stall-timeout", type=float, default=None, help="Give up after this long without progress.")
def wait(job_id: str, broker: str | None, stall_timeout: float | None) -> None:
    """Wait for a job to end; exit code as `run`'s (0 done, 1 failed or cancelled).

    Rides out Redis restarts (up to the stall timeout, else 300 s)."""
    from evalq.orchestrator import submit as submitting
    from evalq.orchestrator.outage import Outage
    from evalq.orchestrator.runner import finished

    broker = _need_broker(broker)
    outage = Outage(broker, stall_timeout or 300)
    r = submitting.connect(broker, outage)
    status = submitting.wait(r, broker, job_id, on_progress=lambda n: None, check=lambda: None,
                             stall_timeout=stall_timeout, outage=outage)
    outage.call(finished, r, job_id, status)
    click.echo(f"job {job_id}: {status}", err=True)


@cli.command()
@click.argument("job_id")
@broker_option
def cancel(job_id: str, broker: str | None) -> None:
    """Cancel a job: its pending tasks are dropped unrun; partial outputs are written."""
    from evalq.orchestrator import submit as submitting
    from evalq.orchestrator.jobs import cancel_job

    broker = _need_broker(broker)
    click.echo(f"job {job_id}: {cancel_job(submitting.connect(broker), broker, job_id)}")


@cli.command()
@click.argument("job_id")
@broker_option
def resume(job_id: str, broker: str | None) -> None:
    """Re-send what a running job is missing (after a broker restart or a lost callback).

    Finished chunks are not sent again and recorded judge items are not re-paid."""
    from evalq.orchestrator import submit as submitting
    from evalq.orchestrator.jobs import resume_job

    broker = _need_broker(broker)
    done = resume_job(submitting.connect(broker), broker, job_id)
    if done["stage"] is None:
        click.echo(f"job {job_id}: {done['status']}; nothing to resume")
    elif done["callback"]:
        click.echo(f"job {job_id}: every chunk of the {done['stage']} stage has finished; "
                   f"sent its callback ({done['callback']}) again")
    else:
        click.echo(f"job {job_id}: re-sent {done['sent']} unfinished chunk(s) of the {done['stage']} stage")


@cli.command()
@click.argument("job_id", required=False)
@broker_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True,
              help="Without JOB: how many recent jobs.")
@click.option("--stall-timeout", type=float, default=60.0, show_default=True,
              help="Give up (exit 1) when Redis stays unreachable this long.")
def status(job_id: str | None, broker: str | None, as_json: bool, limit: int, stall_timeout: float) -> None:
    """Running and recent jobs, or one job in detail."""
    from evalq.orchestrator import jobs
    from evalq.orchestrator import submit as submitting
    from evalq.orchestrator.outage import Outage

    broker = _need_broker(broker)
    outage = Outage(broker, stall_timeout)
    r = submitting.connect(broker, outage)
    info = outage.call(jobs.job_status, r, job_id) if job_id else outage.call(jobs.recent, r, limit)
    if as_json:
        click.echo(json.dumps(info, indent=2))
    else:
        click.echo(jobs.render(info, one=bool(job_id)))


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
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def plan_command(job_file: Path, window: str, cpu_items_per_s: float, gpu_pairs_per_s: float, as_json: bool) -> None:
    """Capacity plan for JOB_FILE: time per queue, the binding constraint, workers to fit --window."""
    from evalq.orchestrator.capacity import plan_job, render
    from evalq.shared.job import load_job

    window_s = _duration(window)
    result = plan_job(load_job(job_file), window_s, cpu_items_per_s, gpu_pairs_per_s)
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
    from evalq.shared.storage import Destination
    from evalq.workers.report import report_from_outputs

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
    from evalq.orchestrator import compare as comparing

    parsed = [comparing.parse_gate(g) for g in gates]
    base_run, new_run = comparing.load_run(base), comparing.load_run(new)
    outcome = comparing.evaluate_gates(parsed, base_run, new_run)
    report = comparing.compare(base_run, new_run)
    report["gates"] = outcome
    if html:
        from evalq.workers.report import compare_html

        Path(html).write_text(compare_html(report), encoding="utf-8")
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        for line in comparing.render(report, outcome):
            click.echo(line)
    failed = [g["gate"] for g in outcome if not g["passed"]]
    if failed:
        raise comparing.GateFailed(f"{len(failed)} gate(s) failed: {'; '.join(failed)}")


LOOPBACK = ("127.0.0.1", "::1", "localhost")


@cli.command()
@broker_option
@click.option("--address", default="127.0.0.1", show_default=True, help="Interface Flower listens on.")
@click.option("--port", type=click.IntRange(1, 65535), default=5555, show_default=True)
@click.option("--basic-auth", envvar="EVALQ_FLOWER_BASIC_AUTH", default=None, metavar="USER:PASSWORD[,...]",
              help="Required credentials (env EVALQ_FLOWER_BASIC_AUTH; prefer the variable: a command "
                   "line is visible to every user of the machine).")
@click.option("--no-auth", is_flag=True, help="No credentials: allowed only on a loopback address.")
@click.option("--url-prefix", default=None, help="Serve under this path (behind a reverse proxy).")
def flower(broker: str | None, address: str, port: int, basic_auth: str | None, no_auth: bool,
           url_prefix: str | None) -> None:
    """Start Flower on the cluster's broker, behind basic auth.

    Flower shows every task as it is sent, runs and ends; a chunk task's
    arguments are its job id, metric entry and instance range."""
    broker = _need_broker(broker)
    env = {**os.environ, "EVALQ_BROKER_URL": broker}
    for name in [k for k in env if k.startswith("FLOWER_")]:
        del env[name]  # evalq's options decide, not stray Flower settings
    if basic_auth and no_auth:
        raise click.UsageError("--no-auth and --basic-auth (or EVALQ_FLOWER_BASIC_AUTH) exclude each other")
    if basic_auth:
        pairs = basic_auth.split(",")
        if not all(":" in p and all(p.split(":", 1)) for p in pairs):
            raise click.UsageError("--basic-auth / EVALQ_FLOWER_BASIC_AUTH: expected USER:PASSWORD, several "
                                   "separated by commas (a password may not contain a comma)")
        env["FLOWER_BASIC_AUTH"] = basic_auth  # by environment: never on a command line
    elif no_auth:
        if address not in LOOPBACK:
            raise click.UsageError(f"--no-auth is allowed only on a loopback address ({', '.join(LOOPBACK)}), "
                                   f"not {address!r}: anyone who reaches Flower can revoke tasks")
        env["FLOWER_UNAUTHENTICATED_API"] = "true"
    else:
        raise click.UsageError("Flower needs credentials: set EVALQ_FLOWER_BASIC_AUTH=USER:PASSWORD (or "
                               "--basic-auth); --no-auth is allowed on a loopback address only")
    argv = [sys.executable, "-m", "celery", "-A", "evalq.workers.app:app", "flower",
            f"--address={address}", f"--port={port}"]
    if url_prefix:
        argv.append(f"--url_prefix={url_prefix}")
    os.execvpe(argv[0], argv, env)


def _register_judge_sim() -> None:
    from evalq.sim import judge_sim_command

    cli.add_command(judge_sim_command)


_register_judge_sim()


def _gate_failed() -> type:
    from evalq.orchestrator.compare import GateFailed

    return GateFailed


def main() -> None:
    try:
        code = cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except JobError as exc:
        for line in exc.problems:
            click.echo(f"error: {line}", err=True)
        sys.exit(2)
    except _gate_failed() as exc:
        click.echo(f"evalq: {exc}", err=True)
        sys.exit(3)
    except InfraError as exc:
        click.echo(f"evalq: {exc}", err=True)
        sys.exit(1)
    except Exception as exc:
        from evalq.orchestrator.outage import away

        if not away(exc):
            raise
        # a command that does not wait (submit, cancel, resume) met an unreachable Redis
        click.echo(f"evalq: Redis is unreachable: {exc}", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
