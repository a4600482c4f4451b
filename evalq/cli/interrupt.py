"""Ctrl-C and SIGTERM for the ``evalq`` command.

A process inherits an *ignored* SIGINT from whoever started it where that one ignored it: a
script's background job (``evalq run job.json &`` in a shell without job control), a CI runner, a
test harness started so. Python then leaves SIGINT ignored and never raises KeyboardInterrupt, so
``evalq run`` went on waiting for its job whatever signal it was sent, with its workers and Redis
still running. Here the command takes both signals itself, whatever it inherited:

- the first SIGINT (SIGTERM) raises ``KeyboardInterrupt`` (``Terminated``) in the main thread: the
  normal way out, where ``evalq run`` SIGKILLs its local workers (it never waits for a chunk's
  items to end) and stops its private Redis, keeping the judge cache;
- a second one, while that is under way, SIGKILLs every process group still registered here (the
  local workers, the private Redis) and exits at once, 130 (143): a stop that does not depend on
  anything answering.
"""

from __future__ import annotations

import contextlib
import os
import signal

_groups: set[int] = set()  # process groups (each child leads its own session) to kill on a second signal
_signalled = False
_announced = False  # the first signal's handler said what happens next


class Terminated(KeyboardInterrupt):
    """SIGTERM: stop as for Ctrl-C, but exit 143."""

    exit_code = 128 + signal.SIGTERM


def track(pid: int) -> None:
    """``pid`` leads a process group of this command's own children (``start_new_session``)."""
    _groups.add(pid)


def untrack(pid: int) -> None:
    _groups.discard(pid)


def kill_tracked() -> None:
    """SIGKILL every registered group at once (nothing is waited for)."""
    for pgid in list(_groups):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


def announced() -> bool:
    """Whether the first signal's handler said already that the command is stopping."""
    return _announced


def _handler(signum: int, frame) -> None:  # noqa: ANN001
    global _signalled, _announced
    if _signalled:  # the second: everything now, nothing waited on
        kill_tracked()
        os._exit(128 + signum)
    _signalled = True
    if _groups:  # os.write: a signal handler may come while sys.stderr is in the middle of a write
        with contextlib.suppress(OSError):
            os.write(2, b"\nevalq: interrupted; stopping the local workers and Redis "
                        b"(again to stop at once)\n")
            _announced = True
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


_previous: dict[int, object] = {}


def _as_before() -> None:
    """In a child forked from this process (a pool of ``evalq validate``'s parallel reader): the
    signals as they were before ``install``. A pool's workers are ended with SIGTERM, which must
    end them quietly, not raise ``Terminated`` in the middle of their loop."""
    for signum, handler in _previous.items():
        with contextlib.suppress(ValueError, OSError, TypeError):
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
    _groups.clear()


def install() -> None:
    """Take SIGINT and SIGTERM in this process, even where SIGINT was inherited ignored. Commands
    that install their own (``evalq worker`` through Celery, ``evalq judge-sim``) replace these;
    children forked from it (not exec'd: those start with the default) get the previous ones back."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(ValueError, OSError):  # not the main thread (an embedding program)
            previous = signal.signal(signum, _handler)
            _previous.setdefault(signum, previous)
    if _previous and not getattr(install, "forks_restore", False):
        os.register_at_fork(after_in_child=_as_before)
        install.forks_restore = True
