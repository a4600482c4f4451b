"""A large local JSON Lines dataset read, mapped and checked by several processes at once.

Validation reads every record before anything is enqueued (nothing is ever half-enqueued), so on a
big dataset it is the one serial part of a run: 100,000 agent runs take 17 s in one process. Here
the file is cut into byte ranges at line starts; forked processes count their lines, then read,
map and check their range exactly as ``evalq.shared.data.instances.load_dataset`` does record by record
(the same functions), each writing its instances to a part file. The parent puts the parts
together in file order: the instances, their source lines, the problems (the first
``max_problems`` in line order, then the same stop), the bad records, the checker's counts and
the id hashes the duplicate check reads. The result is the one-process result (a dataset with
more problems than are shown stops at the same problem; the instances read before it, never used
by a job that fails, are then not put together).

Used where it is safe and worth it: ``READ_PROCESSES`` above 1 (the evalq command sets it to the
machine's cores for the commands that read datasets; a cluster's jobs role, a pool process, reads
with one), a process with a single thread (fork copies only the calling thread), a local
uncompressed file of at least ``MIN_BYTES``, no ``limit``, and the ``fork`` start method.
"""

from __future__ import annotations

import multiprocessing
import tempfile
import threading
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from evalq.shared.core.limits import Limits

READ_PROCESSES = 1
MIN_BYTES = 8 << 20

_job: dict[str, Any] = {}  # what the forked readers see: set by the parent just before it forks


def processes_for(spec: Any) -> int:
    """How many processes read this dataset (1: the one-process path)."""
    from evalq.shared.data.storage import GZIP_MAGIC, is_s3

    if READ_PROCESSES < 2 or spec.format != "jsonl" or spec.limit is not None or is_s3(spec.uri):
        return 1
    # fork copies one thread: in a process with others (a server, a pool, a test runner) a lock one of
    # them held would stay held in the child for ever
    if multiprocessing.current_process().daemon or threading.active_count() > 1 or \
            "fork" not in multiprocessing.get_all_start_methods():
        return 1
    path = Path(spec.uri).expanduser()
    try:
        size = path.stat().st_size if path.is_file() else 0
        with open(path, "rb") as f:
            if f.read(2) == GZIP_MAGIC:
                return 1
    except OSError:
        return 1
    if size < MIN_BYTES or size > Limits.from_env().dataset_bytes:
        return 1
    return max(1, min(READ_PROCESSES, size // (MIN_BYTES // 2)))


def ranges(path: Path, n: int) -> list[tuple[int, int]]:
    """``n`` byte ranges (fewer where lines are long) that each start at a line's start."""
    from evalq.shared.data.storage import LineReader

    size = path.stat().st_size
    bounds = [0]
    with open(path, "rb") as f:
        for k in range(1, n):
            f.seek(max(size * k // n, bounds[-1]))
            while True:  # to the end of the line the offset falls in, in bounded pieces
                piece = f.readline(LineReader.PIECE)
                if not piece or piece.endswith(b"\n"):
                    break
            if f.tell() > bounds[-1]:
                bounds.append(f.tell())
    bounds.append(size)
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def _range_lines(path: Path, start: int, end: int, record_bytes: int):
    """(local line number, text or LineError) of the range, read as ``read_lines`` reads a file."""
    from evalq.shared.data.storage import LineReader

    with open(path, "rb") as f:
        f.seek(start)
        yield from enumerate(LineReader(f, record_bytes, end=end), 1)


def _count(part: tuple[int, int]) -> int:
    return sum(1 for _ in _range_lines(_job["path"], *part, _job["limits"].record_bytes))


@dataclass
class Part:
    n_kept: int = 0
    lines: array = field(default_factory=lambda: array("q"))
    rejected: list[tuple[int, list[str]]] = field(default_factory=list)  # in order, bounded
    n_rejected: int = 0
    n_to_generate: int = 0
    categories: set[str] = field(default_factory=set)
    hashes: array = field(default_factory=lambda: array("q"))
    versions: tuple = field(default_factory=lambda: (array("Q"), array("Q")))  # (id hashes, content hashes): evalq.shared.data.versions
    shared: dict[str, str] = field(default_factory=dict)


def _read(task: tuple[int, int, int, str]) -> Part:
    import json

    examine, parsed, share = _job["examine"], _job["parsed"], _job["share"]
    start, end, base, out = task
    # a pool process may read several parts: each part counts its own instances
    spec, checker, mapper, limits = _job["spec"], _job["checker"].apart(), _job["mapper"], _job["limits"]
    keep_rejected = _job["keep_rejected"]
    part = Part()
    with open(out, "w", encoding="utf-8") as f:
        for local, text in _range_lines(_job["path"], start, end, limits.record_bytes):
            record = parsed(text, limits)
            if record is None:  # a blank line
                continue
            number = base + local
            inst, found = examine(mapper, checker, record, number)
            if not found:
                f.write(json.dumps(share(inst, part.shared), ensure_ascii=False) + "\n")
                part.n_kept += 1
                part.lines.append(number)
                continue
            part.n_rejected += 1
            if len(part.rejected) < keep_rejected:  # each has a problem or more: enough for the parent's stop
                part.rejected.append((number, found))
            elif spec.on_bad_record != "skip":
                break  # past what the parent can show: the rest of the range is not read
    part.n_to_generate, part.categories, part.hashes = checker.n_to_generate, checker.categories, checker.hashes()
    part.versions = (checker.versions.ids, checker.versions.contents)
    return part


@dataclass(frozen=True)
class Steps:
    """What ``evalq.shared.data.instances`` does to each line, the same functions in every process:
    ``parsed(text, limits)``, ``examine(mapper, checker, record, number)``, ``share(instance,
    shared)`` and ``place(spec, number)``."""

    parsed: Callable
    examine: Callable
    share: Callable
    place: Callable


def read_parallel(spec: Any, checker: Any, mapper: Any, processes: int, steps: Steps, spool: Any, lines: array,
                  bad: Any, add_problem: Callable[[str, str], None], max_problems: int, keep_shown: int) -> int:
    """Read the dataset in ``processes`` processes into ``spool``/``lines``/``bad``/``checker``;
    returns the number of problems added (``add_problem`` in line order, the first ``max_problems``)."""
    record_place = steps.place
    path = Path(spec.uri).expanduser()
    parts = ranges(path, processes)
    _job.update(path=path, spec=spec, checker=checker, mapper=mapper, limits=Limits.from_env(),
                keep_rejected=max(max_problems, keep_shown), examine=steps.examine, parsed=steps.parsed,
                share=steps.share)
    with tempfile.TemporaryDirectory(prefix="evalq-read-") as tmp:
        try:
            with multiprocessing.get_context("fork").Pool(len(parts)) as pool:
                counts = pool.map(_count, parts)
                bases = [sum(counts[:k]) for k in range(len(parts))]
                read = pool.map(_read, [(a, b, base, f"{tmp}/{k}.jsonl")
                                        for k, ((a, b), base) in enumerate(zip(parts, bases))])
        finally:
            _job.clear()
        n_problems = 0
        for k, part in enumerate(read):
            for number, found in part.rejected:
                where = record_place(spec, number)
                if spec.on_bad_record == "skip":
                    bad.add(where, found)
                    continue
                for p in found:
                    add_problem(where, p)
                n_problems += len(found)
                if n_problems >= max_problems - 1:
                    add_problem(where, "stopped reading here: fix the problems above first")
                    return n_problems
            bad.count += part.n_rejected - len(part.rejected) if spec.on_bad_record == "skip" else 0
            spool.extend_from(f"{tmp}/{k}.jsonl", part.n_kept, part.shared)
            lines.extend(part.lines)
            checker.merge(part.n_to_generate, part.categories, part.hashes, part.versions)
    return n_problems
