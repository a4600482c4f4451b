"""Commands on a cluster's jobs: submit, wait, status, cancel, resume, results, gc, and Flower."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from evalq.cli import wait as waiting
from evalq.cli.common import broker_option, cli, scheduling_options, destination_for, need_broker, scheduled
from evalq.shared.core.errors import JobError

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
@scheduling_options
def submit(job_file: Path, out: str | None, request_id: str | None, reply_to: str | None,
           broker: str | None, chunk_size: int | None, suite: str | None, priority: str | None,
           tenant: str | None, weight: float | None) -> None:
    """Validate JOB_FILE and hand it to the cluster; prints the job id and returns at once."""
    from evalq.orchestrator import submit as submitting
    from evalq.shared.cluster import keys
    from evalq.shared.core.config import Settings
    from evalq.cli.common import read_job

    from evalq.orchestrator.service import reply_to_problem

    broker = need_broker(broker)
    job = read_job(job_file)
    scheduled(job, suite, priority, tenant, weight)
    if reply_to is not None and reply_to_problem(reply_to):
        raise JobError(reply_to_problem(reply_to).replace("request.reply_to", "--reply-to"))
    dest = destination_for(job, out, job_file)
    dest.check()
    r = waiting.connect(broker)
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
    from evalq.cli.outage import Outage
    from evalq.cli.run import finished

    from evalq.cli.progress import progress
    from evalq.shared.job.stored import stored_job

    broker = need_broker(broker)
    outage = Outage(broker, stall_timeout or 300)
    r = waiting.connect(broker, outage)
    try:
        spec = outage.call(stored_job, r, job_id)
        total = waiting.items_of(spec)
    except LookupError:  # not known (yet): wait says so
        total = 0
    with progress(total, label=f"job {job_id}") as shown:
        status = waiting.wait(r, broker, job_id, on_progress=shown, check=lambda: None,
                              stall_timeout=stall_timeout, outage=outage, on_eta=shown.eta)
    outage.call(finished, r, job_id, status)
    click.echo(f"job {job_id}: {status}", err=True)


@cli.command()
@click.argument("job_id")
@broker_option
def cancel(job_id: str, broker: str | None) -> None:
    """Cancel a job: its pending tasks are dropped unrun; partial outputs are written."""
    from evalq.orchestrator.jobs import cancel_job

    broker = need_broker(broker)
    click.echo(f"job {job_id}: {cancel_job(waiting.connect(broker), broker, job_id)}")


@cli.command()
@click.argument("job_id")
@broker_option
def resume(job_id: str, broker: str | None) -> None:
    """Re-send what a running job is missing (after a broker restart or a lost callback).

    Finished chunks are not sent again and recorded judge items are not re-paid."""
    from evalq.orchestrator.watch import resume_job

    broker = need_broker(broker)
    done = resume_job(waiting.connect(broker), broker, job_id)
    if done["stage"] is None:
        click.echo(f"job {job_id}: {done['status']}; nothing to resume")
    elif done.get("callback_running"):
        click.echo(f"job {job_id}: every chunk of the {done['stage']} stage has finished and its callback "
                   f"({done['callback']}) is running; nothing to resume")
    elif done["callback"]:
        click.echo(f"job {job_id}: every chunk of the {done['stage']} stage has finished; "
                   f"sent its callback ({done['callback']}) again")
    else:
        click.echo(f"job {job_id}: re-sent {done['sent']} unfinished chunk(s) of the {done['stage']} stage")


@cli.command()
@click.argument("job_id")
@broker_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def resend(job_id: str, broker: str | None, as_json: bool) -> None:
    """Send an ended job's scores that did not reach its sinks (Phoenix, MLflow, OTLP) again.

    Each score goes once, with the same identifiers: what a sink took before is not sent again.
    Run it where the operator's sinks are configured (EVALQ_SINKS, EVALQ_OTEL_EXPORTERS, OTEL_*), as
    a jobs worker is. Exit 1 while some are still not sent."""
    from evalq.orchestrator.jobs import resend_exports

    broker = need_broker(broker)
    got = resend_exports(waiting.connect(broker), job_id)
    if as_json:
        click.echo(json.dumps(got, indent=2))
    elif not got:
        click.echo(f"job {job_id}: its scores go to no sink")
    for name, sink in got.items():
        sent = sum(e["sent"] for e in sink["entries"].values())
        unsent = sum(e["unsent"] for e in sink["entries"].values())
        if not as_json:
            click.echo(f"job {job_id}: {name} ({sink['kind']}) has {sent} items' scores; {unsent} not sent"
                       + (f" ({sink['answer']})" if unsent and sink["answer"] else ""))
    if any(e["unsent"] for sink in got.values() for e in sink["entries"].values()):
        raise SystemExit(1)


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
    from evalq.cli.outage import Outage

    broker = need_broker(broker)
    outage = Outage(broker, stall_timeout)
    r = waiting.connect(broker, outage)
    info = outage.call(jobs.job_status, r, job_id) if job_id else outage.call(jobs.recent, r, limit)
    if as_json:
        click.echo(json.dumps(info, indent=2))
    else:
        from evalq.shared.core.display import printable

        # names and errors a job gave, one line each on the terminal, no control characters
        click.echo("\n".join(printable(line, 100_000) for line in jobs.render(info, one=bool(job_id)).splitlines()))


@cli.command()
@click.argument("job_id")
@broker_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def results(job_id: str, broker: str | None, as_json: bool) -> None:
    """Where a job's results are: its outputs, and its instance and record parts in the job store
    (Parquet, for DuckDB, Spark or Athena)."""
    from evalq.shared.job.stored import stored_job
    from evalq.shared.store.records import locations

    broker = need_broker(broker)
    try:
        job = stored_job(waiting.connect(broker), job_id)
    except LookupError:
        raise JobError(f"job {job_id}: not known to this broker (never submitted, or its keys expired)") from None
    where = {"job_id": job_id, "out": job.out, **locations(job.records)}
    if where["store"] is not None and not job.instances.still_there():
        where = {"job_id": job_id, "out": where["out"], "store": where["store"], "removed": True}
    if as_json:
        click.echo(json.dumps(where, indent=2))
        return
    click.echo(f"job {job_id}")
    click.echo(f"  outputs:   {where['out'] or '(none: the job names no out)'}")
    if where["store"] is None:
        click.echo("  parts:     none: the job was submitted without a job store (EVALQ_STORE); its instances and "
                   "item records are in Redis until its keys expire")
        return
    if where.get("removed"):
        click.echo(f"  store:     {where['store']} (removed: evalq gc, or by hand; the outputs above remain)")
        return
    click.echo(f"  store:     {where['store']}")
    click.echo(f"  instances: {where['instances']}")
    for glob in where["records"].values():
        click.echo(f"  records:   {glob}")
    first = next(iter(where["records"].values()), None)
    if first is not None:
        click.echo(f"\n  duckdb -c \"SELECT outcome, count(*) FROM '{first}' GROUP BY outcome\"")


@cli.command()
@broker_option
@click.option("--older-than", "days", type=click.FloatRange(min=0), default=None,
              help="Days since a job's last part was written [default: EVALQ_RESULT_TTL].")
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
def gc(broker: str | None, days: float | None, dry_run: bool) -> None:
    """Remove the job store's folders of jobs that ended (or whose keys expired) and are older than
    --older-than; a running job's parts are never removed. The store is EVALQ_STORE."""
    import time

    from evalq.shared.cluster import keys
    from evalq.shared.cluster.status import FINAL
    from evalq.shared.core.config import Settings
    from evalq.shared.core.limits import size
    from evalq.shared.store.place import job_folders, store_root

    root = store_root()
    if root is None:
        raise JobError("evalq gc: no job store is named (EVALQ_STORE)")
    broker = need_broker(broker)
    r = waiting.connect(broker)
    cutoff = time.time() - (days * 86400 if days is not None else Settings.from_env().result_ttl)
    removed = kept = freed = 0
    for place, job_id, newest, nbytes in job_folders(root):
        status = (r.get(keys.status(job_id)) or b"").decode()
        if newest > cutoff or (status and status not in FINAL):
            kept += 1
            continue
        click.echo(f"{'would remove' if dry_run else 'removed'} {place.uri} ({size(nbytes)}; job "
                   f"{status or 'expired from Redis'})")
        if not dry_run:
            place.delete()
            _drop_empty_suite(place)
        removed, freed = removed + 1, freed + nbytes
    click.echo(f"evalq gc: {'would remove' if dry_run else 'removed'} {removed} job folder(s), {size(freed)}; "
               f"kept {kept} (running, or newer than the cutoff)", err=True)


def _drop_empty_suite(place) -> None:
    """A local store's ``suite=`` folder that its last job's removal left empty goes too (never the
    tenant's folder above it, which may be a mount of the tenant's own)."""
    from pathlib import Path

    if place.is_s3:  # S3 has no folders: nothing is left behind
        return
    suite = Path(place.uri).parent
    if suite.name.startswith("suite=") and not suite.is_symlink():
        try:
            suite.rmdir()  # only when empty
        except OSError:
            pass


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
    broker = need_broker(broker)
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
    argv = [sys.executable, "-m", "celery", "-A", "evalq.orchestrator.app:app", "flower",
            f"--address={address}", f"--port={port}"]
    if url_prefix:
        argv.append(f"--url_prefix={url_prefix}")
    os.execvpe(argv[0], argv, env)




@cli.group()
def tenants() -> None:
    """Tenants' identities on a shared cluster (EVALQ_TENANTS)."""


@tenants.command("acl")
@broker_option
@click.option("--apply", "apply_", is_flag=True, help="Create or update the users on the broker (ACL SETUSER).")
@click.option("--show-passwords", is_flag=True, help="Print the passwords in the lines (for an ACL file).")
def tenants_acl(broker: str | None, apply_: bool, show_passwords: bool) -> None:
    """The Redis ACL user of each listed tenant: it writes only evalq.jobs.<tenant> and reads only
    replies:<tenant>:*. Passwords come from EVALQ_TENANT_PASSWORD_<TENANT>. Without --apply the
    ACL file lines are printed (passwords hidden unless --show-passwords)."""
    from evalq.shared.cluster.scheduling import Tenants
    from evalq.shared.cluster.tenant_acl import acl_line, has_selectors, tenant_users

    r, selectors = None, True
    if apply_:
        r = waiting.connect(need_broker(broker))
        version = r.info("server").get("redis_version", "")
        selectors = has_selectors(version)
        if not selectors:
            click.echo(f"evalq: Redis {version} has no ACL selectors (Redis 7 has): each tenant's user can also push "
                       "onto its own reply lists, which the cluster trims and expires only when it next answers "
                       "there; upgrade to Redis 7 to close that", err=True)
    users, missing = tenant_users(Tenants.from_env().names, selectors=selectors)
    if missing:
        raise JobError([f"{name}: not set (the password of a tenant EVALQ_TENANTS lists)" for name in missing])
    if not users:
        raise JobError("EVALQ_TENANTS lists no tenant: nothing to do")
    if apply_:
        for tenant, rules in users.items():
            r.execute_command("ACL", "SETUSER", tenant, *rules)
            click.echo(f"tenant {tenant}: user {tenant} may write evalq.jobs.{tenant} and read replies:{tenant}:*")
        return
    for tenant, rules in users.items():
        click.echo(acl_line(tenant, rules, hide=not show_passwords))
