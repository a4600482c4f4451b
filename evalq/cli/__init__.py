"""The ``evalq`` command. Heavy imports (Celery, metric libraries) are deferred so
``--help`` and ``validate`` are instant. Errors travel as exceptions to ``main``,
the one place that turns them into exit codes: 2 invalid job, 1 infrastructure."""

from __future__ import annotations

import sys

import click

from evalq.cli import cluster, history, labels, local, migrate  # noqa: F401  (their commands register on the group)
from evalq.cli.common import cli
from evalq.shared.core.errors import InfraError, JobError


def _gate_failed() -> type:
    from evalq.cli.compare import GateFailed

    return GateFailed


def _interrupted(exc: BaseException) -> int:
    from evalq.cli.interrupt import Terminated, announced

    cause = exc if isinstance(exc, KeyboardInterrupt) else exc.__cause__  # click's Abort wraps it
    if not announced():
        click.echo("interrupted", err=True)
    return cause.exit_code if isinstance(cause, Terminated) else 130


def invoke(argv: list[str] | None = None, prog_name: str | None = None) -> int:
    """The command ``argv`` names (default: this process's arguments), its errors turned into the
    exit code ``main`` exits with. Tests run the commands that start nothing (``validate``,
    ``metrics``, ``plan``) through it in their own process (tests/conftest.py ``evalq``)."""
    try:
        code = cli.main(args=argv, prog_name=prog_name, standalone_mode=False)
    except (click.exceptions.Abort, KeyboardInterrupt) as exc:
        return _interrupted(exc)
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except JobError as exc:
        for line in exc.problems:
            click.echo(f"error: {line}", err=True)
        return 2
    except _gate_failed() as exc:
        click.echo(f"evalq: {exc}", err=True)
        return 3
    except InfraError as exc:
        click.echo(f"evalq: {exc}", err=True)
        return 1
    except Exception as exc:
        from evalq.cli.outage import away

        if not away(exc):
            raise
        # a command that does not wait (submit, cancel, resume) met an unreachable Redis
        click.echo(f"evalq: Redis is unreachable: {exc}", err=True)
        return 1
    return code if isinstance(code, int) else 0


def main() -> None:
    from evalq.cli.interrupt import install

    install()  # Ctrl-C and SIGTERM stop any command, even where SIGINT was inherited ignored
    sys.exit(invoke())


if __name__ == "__main__":
    main()
