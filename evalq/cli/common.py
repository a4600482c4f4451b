"""What every ``evalq`` command shares: the command group (which reads every
``EVALQ_*`` number up front), the ``--broker`` option, and how a job and its
destination are shown."""

from __future__ import annotations

from pathlib import Path

import click

from evalq.shared.core.errors import InfraError

# the schemes both redis-py and Celery's Redis transport (kombu) read: kombu has no ``unix://``
# (a socket path redis-py would take), so it would pass here and fail later, at Celery's first send
BROKER_SCHEMES = ("redis://", "rediss://", "sentinel://")


def _broker_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A broker that is not a Redis URL (``http://...``, a host without a scheme) is one line and
    exit 1, as every other unreachable broker, not redis-py's traceback at the first connection."""
    if value is None:
        return value
    if not value.lower().startswith(BROKER_SCHEMES):
        wrong = f"expected one starting with {', '.join(BROKER_SCHEMES[:-1])} or {BROKER_SCHEMES[-1]}"
    else:
        wrong = _bad_port(value)
    if wrong:
        from evalq.shared.core.config import safe_url

        from_env = ctx.get_parameter_source(param.name) == click.core.ParameterSource.ENVIRONMENT
        source = "EVALQ_BROKER_URL" if from_env else "--broker"
        raise InfraError(f"{source} {safe_url(value)!r} is not a Redis URL: {wrong}")
    return value


def _bad_port(url: str) -> str | None:
    """What is wrong with a port of the URL (each ``;``-separated host of a sentinel URL), or None."""
    from urllib.parse import urlsplit

    for part in url.split(";"):
        try:
            port = urlsplit(part.strip()).port
        except ValueError:
            port = -1
        if port == -1 or port == 0:
            host = part.split("://", 1)[-1].rsplit("@", 1)[-1].split("/", 1)[0]
            return f"the port of {host!r} is not a number from 1 to 65535"
    return None


def _broker_option(help_text: str):
    return click.option("--broker", envvar="EVALQ_BROKER_URL", default=None, metavar="URL", callback=_broker_url,
                        help=help_text)


broker_option = _broker_option("Redis URL of the cluster (env EVALQ_BROKER_URL).")
# `run`'s: the one command that needs no cluster
run_broker_option = _broker_option("Redis URL of a running cluster (env EVALQ_BROKER_URL). Without it, `run` "
                                   "starts an embedded Redis and local workers.")


class Commands(click.Group):
    """The command group, where a command whose module is heavy to import and rarely run
    (judge-sim's server and simulator) loads only when it is called or listed: every other
    command, the workers' `evalq worker` above all, starts without it."""

    LAZY = {"judge-sim": "evalq.sim.cli:judge_sim_command"}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.LAZY})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.LAZY and name not in self.commands:
            import importlib

            module, attr = self.LAZY[name].split(":")
            self.add_command(getattr(importlib.import_module(module), attr), name)
        return super().get_command(ctx, name)


@click.group(cls=Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="evalq", prog_name="evalq", message="%(prog)s %(version)s")
def cli() -> None:
    """evalq: distributed evaluation of LLM applications."""
    from evalq.shared.core import bounds
    from evalq.shared.judging import deployments
    from evalq.shared.cluster import scheduling
    from evalq.shared.core.config import Settings
    from evalq.shared.core.limits import Limits

    # every EVALQ_* setting is read up front: a bad one is reported before anything starts
    Settings.from_env()
    Limits.from_env()
    bounds.check_env()
    scheduling.check_env()
    deployments.check_env()  # the operator's catalogue of deployments, validated whole


def need_broker(broker: str | None) -> str:
    if not broker:
        raise InfraError("this command needs a cluster: --broker URL or EVALQ_BROKER_URL")
    return broker


def destination_for(job, out: str | None, job_file: Path):
    from evalq.orchestrator.submit import destination

    return destination(job, out) or destination(job, str(Path("out") / job_file.stem))


def describe(job, job_file: Path, err: bool = True) -> None:
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




def scheduling_options(command):
    """``--priority``, ``--tenant``, ``--weight`` (a job's ``scheduling``) and ``--suite`` (its series
    in the history store), overridden per submission."""
    options = [
        click.option("--suite", default=None,
                     help="Series the run is recorded under in the history store [default: the job's "
                          "'suite', else the job file's name]."),
        click.option("--priority", type=click.Choice(["high", "normal", "low"]), default=None,
                     help="Scheduling class: chunks of a higher class go first [default: the job's, else normal]."),
        click.option("--tenant", default=None,
                     help="Team the job is counted to when queues are shared [default: the job's]."),
        click.option("--weight", type=click.FloatRange(min=0, min_open=True, max=1000), default=None,
                     help="The job's share among its tenant's jobs [default: the job's, else 1]."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def scheduled(job, suite: str | None, priority: str | None, tenant: str | None, weight: float | None) -> None:
    """Give ``job`` what the command line overrides of its ``scheduling`` and ``suite`` (a bad
    tenant or suite name: exit 2)."""
    from pydantic import ValidationError

    from evalq.shared.core.errors import JobError
    from evalq.shared.job.nightly import suite_problem

    if suite is not None:
        if suite_problem(suite):
            raise JobError(f"--suite: {suite_problem(suite)}")
        job.suite = suite
    try:
        job.scheduling = job.scheduling.with_overrides(priority, tenant, weight)
    except ValidationError as exc:
        raise JobError([f"--{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]) from None


def read_job(job_file, keys_needed: bool = True):
    """A job file and its dataset read and validated here, a large local dataset with every core
    (``evalq.shared.data.parallel_read``; ``EVALQ_READ_PROCESSES`` sets how many, 1: one process)."""
    import os

    from evalq.shared.data import parallel_read
    from evalq.shared.core.config import env_number
    from evalq.shared.job.schema import load_job

    parallel_read.READ_PROCESSES = int(env_number("EVALQ_READ_PROCESSES", os.cpu_count() or 1))
    return load_job(job_file, keys_needed=keys_needed)
