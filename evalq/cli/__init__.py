"""The ``evalq`` command. Heavy imports (Celery, metric libraries) are deferred so
``--help`` and ``validate`` are instant. Errors travel as exceptions to ``main``,
the one place that turns them into exit codes: 2 invalid job, 1 infrastructure."""

from __future__ import annotations

import sys

import click

from evalq.cli import cluster, history, local  # noqa: F401  (their commands register on the group)
from evalq.cli.common import cli
from evalq.shared.core.errors import InfraError, JobError


def _gate_failed() -> type:
    from evalq.cli.compare import GateFailed

    return GateFailed


def _interrupted(exc: BaseException) -> None:
    from evalq.cli.interrupt import Terminated, announced

    cause = exc if isinstance(exc, KeyboardInterrupt) else exc.__cause__  # click's Abort wraps it
    if not announced():
        click.echo("interrupted", err=True)
    sys.exit(cause.exit_code if isinstance(cause, Terminated) else 130)


def main() -> None:
    from evalq.cli.interrupt import install

    install()  # Ctrl-C and SIGTERM stop any command, even where SIGINT was inherited ignored
    try:
        code = cli.main(standalone_mode=False)
    except (click.exceptions.Abort, KeyboardInterrupt) as exc:
        _interrupted(exc)
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
        from evalq.cli.outage import away

        if not away(exc):
            raise
        # a command that does not wait (submit, cancel, resume) met an unreachable Redis
        click.echo(f"evalq: Redis is unreachable: {exc}", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
