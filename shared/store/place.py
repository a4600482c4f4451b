"""A job's folder in the operator's store: a local (or shared) filesystem path, or an ``s3://`` prefix.

The store is the operator's (``EVALQ_STORE``, with ``EVALQ_STORE_ENDPOINT_URL`` for an
S3-compatible endpoint such as MinIO), never a job's: a job cannot name it, so it is not
subject to the egress lists that bound what a job may read and write. Each tenant has its part
of it (``<store>/<tenant>``, or ``{tenant}`` in the value replaced, as the operator's other
places: ``evalq.shared.policy.egress.tenant_place``), and each job a folder there:
``<store>/<tenant>/suite=<suite>/job=<job id>/``. What is written there is written whole or not at all
(a local file is renamed into place; an S3 object appears when its PUT ends).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from evalq.shared.core.errors import InfraError

class StoreUnavailable(InfraError):
    """The store did not take a write or give a read (a full disk, an S3 endpoint away): a chunk
    task rides it out as it rides out a Redis error (retried with backoff), a submission fails."""


STORE_ENV = "EVALQ_STORE"
STORE_ENDPOINT_ENV = "EVALQ_STORE_ENDPOINT_URL"


class StoreRefused(StoreUnavailable):
    """A local place reached through a link (a tenant may write its own part of a shared store, and
    make links there): nothing is read, written or removed through it."""


@dataclass(frozen=True)
class Place:
    """A folder of the store: ``uri`` (a path or ``s3://bucket/prefix``), reached through ``endpoint_url``.
    ``bound``: a local place's tenant folder (resolved), below which no path is followed through a
    link: where a team may write its own ``<store>/<tenant>`` (a shared mount it reads with DuckDB),
    a link it made there never carries its job's parts into another tenant's folder (issue 70)."""

    uri: str
    endpoint_url: str | None = None
    bound: str | None = None

    def child(self, name: str) -> "Place":
        return Place(f"{self.uri.rstrip('/')}/{name}", self.endpoint_url, self.bound)

    def path_of(self, name: str) -> str:
        return f"{self.uri.rstrip('/')}/{name}"

    @property
    def is_s3(self) -> bool:
        return self.uri.startswith("s3://")

    def put(self, name: str, data: bytes) -> None:
        """Write ``data`` as ``name`` under this folder, whole (a redelivered write of the same
        name replaces it). InfraError naming the place when the store refuses."""
        target = self.path_of(name)
        if self.is_s3:
            bucket, key = _split(target)
            with _s3_errors(target):
                self._s3().put_object(Bucket=bucket, Key=key, Body=data)
            return
        path = Path(target)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            self._folders(path.parent, make=True)
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            # O_NOFOLLOW | O_EXCL: a link planted where the temporary file goes is never written through
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)  # a link at ``path`` itself is replaced, never followed
        except StoreRefused:
            raise
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise StoreUnavailable(f"{target}: cannot write to the job store: {exc.strerror or exc}") from None

    def _folders(self, folder: Path, make: bool = False) -> None:
        """Check (and with ``make`` create) ``folder`` below the place's bound one level at a time:
        no level may be a link. StoreRefused otherwise. A place without a bound (an embedded run's
        own store) is the operator's alone: nothing to check."""
        if self.bound is None:
            if make:
                folder.mkdir(parents=True, exist_ok=True)
            return
        bound = Path(self.bound)
        try:
            rel = folder.relative_to(bound)
        except ValueError:
            raise StoreRefused(f"{folder}: outside its tenant's part of the job store ({bound})") from None
        if make:
            bound.mkdir(parents=True, exist_ok=True)
        here = bound
        for part in rel.parts:
            here = here / part
            if here.is_symlink():
                raise StoreRefused(f"{here}: a link in a tenant's part of the job store; nothing is written or "
                                   "read through it")
            if make and not here.exists():
                with contextlib.suppress(FileExistsError):
                    here.mkdir()
                if here.is_symlink():  # made a link between the look and the mkdir
                    raise StoreRefused(f"{here}: a link in a tenant's part of the job store")

    def get(self, name: str, missing_ok: bool = False, last: int | None = None) -> bytes | None:
        """``name``'s bytes (``last``: only its last bytes, all of it where it is shorter: a Parquet
        file's footer without reading the file); with ``missing_ok``, None where nothing was written
        under it."""
        target = self.path_of(name)
        if self.is_s3:
            bucket, key = _split(target)
            ranged = {"Range": f"bytes=-{last}"} if last is not None else {}
            with _s3_errors(target):
                try:
                    return self._s3().get_object(Bucket=bucket, Key=key, **ranged)["Body"].read()
                except self._s3().exceptions.NoSuchKey:
                    if missing_ok:
                        return None
                    raise
        try:
            self._folders(Path(target).parent)
            fd = os.open(target, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            with os.fdopen(fd, "rb") as f:
                if last is not None:
                    f.seek(max(0, os.fstat(f.fileno()).st_size - last))
                return f.read()
        except StoreRefused:
            raise
        except OSError as exc:
            if missing_ok and isinstance(exc, FileNotFoundError):
                return None
            raise StoreUnavailable(f"{target}: cannot read from the job store: {exc.strerror or exc}") from None

    def exists(self, name: str) -> bool:
        """Whether something is written under ``name`` (without reading it)."""
        target = self.path_of(name)
        if self.is_s3:
            from botocore.exceptions import ClientError

            bucket, key = _split(target)
            with _s3_errors(target):
                try:
                    self._s3().head_object(Bucket=bucket, Key=key)
                    return True
                except ClientError as exc:
                    if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                        return False
                    raise
        self._folders(Path(target).parent)
        return os.path.lexists(target)

    def names(self, folder: str = "") -> list[str]:
        """The names of the files directly in ``folder`` (below this place), sorted; none where there
        is no such folder."""
        target = self.path_of(folder).rstrip("/") if folder else self.uri.rstrip("/")
        if self.is_s3:
            bucket, prefix = _split(target + "/")
            found: list[str] = []
            with _s3_errors(target):
                for page in self._s3().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix,
                                                                                  Delimiter="/"):
                    found += [o["Key"][len(prefix):] for o in page.get("Contents", [])]
            return sorted(found)
        try:
            self._folders(Path(target))
            return sorted(e.name for e in os.scandir(target) if e.is_file(follow_symlinks=False)
                          and not e.name.startswith("."))
        except FileNotFoundError:
            return []
        except StoreRefused:
            raise
        except OSError as exc:
            raise StoreUnavailable(f"{target}: cannot list the job store: {exc.strerror or exc}") from None

    def remove(self, name: str) -> None:
        """Remove the file ``name`` (nothing there is no error)."""
        target = self.path_of(name)
        if self.is_s3:
            bucket, key = _split(target)
            with _s3_errors(target):
                self._s3().delete_object(Bucket=bucket, Key=key)
            return
        try:
            self._folders(Path(target).parent)
            os.unlink(target)  # a link is removed, never followed
        except FileNotFoundError:
            pass
        except StoreRefused:
            raise
        except OSError as exc:
            raise StoreUnavailable(f"{target}: cannot remove from the job store: {exc.strerror or exc}") from None

    def delete(self) -> None:
        """Remove everything under this folder (nothing there is no error)."""
        if self.is_s3:
            bucket, prefix = _split(self.uri.rstrip("/") + "/")
            client = self._s3()
            with _s3_errors(self.uri):
                for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
                    objects = [{"Key": o["Key"]} for o in page.get("Contents", [])]
                    if objects:
                        client.delete_objects(Bucket=bucket, Delete={"Objects": objects, "Quiet": True})
            return
        folder = Path(self.uri)
        if folder.is_symlink():
            with contextlib.suppress(OSError):
                folder.unlink()  # the link, never what it leads to
            return
        try:
            self._folders(folder)
        except StoreRefused:
            return  # nothing removed through a link
        shutil.rmtree(self.uri, ignore_errors=True)

    def _s3(self):
        return _client(self.endpoint_url)

    def as_json(self) -> dict:
        return {"uri": self.uri, **({"endpoint_url": self.endpoint_url} if self.endpoint_url else {}),
                **({"bound": self.bound} if self.bound else {})}

    @classmethod
    def from_json(cls, data: dict) -> "Place":
        return cls(data["uri"], data.get("endpoint_url"), data.get("bound"))


def store_root(environ=os.environ) -> Place | None:
    """The operator's store (``EVALQ_STORE``), or None: then a job's instances stay in Redis."""
    uri = (environ.get(STORE_ENV) or "").strip()
    if not uri:
        return None
    if not uri.startswith("s3://"):
        uri = str(Path(uri).expanduser().resolve())
    return Place(uri, (environ.get(STORE_ENDPOINT_ENV) or "").strip() or None)


def job_place(root: Place, job_id: str, tenant: str | None, suite: str | None = None) -> Place:
    """Job ``job_id``'s folder: inside its tenant's part of the store (``default`` for a job of
    none), partitioned as Hive names it, ``suite=<suite>/job=<job id>`` (a suite's ``/`` and other
    characters a path keeps apart are %-escaped, as Hive partitioning decodes them), so DuckDB,
    Spark, Athena or pyarrow read a month of a suite's nights as one dataset with those columns."""
    from evalq.shared.policy.egress import tenant_place

    folder, bound = tenant_place(root.uri, tenant or "default"), None
    if not root.is_s3:  # a local tenant folder as the operator made it (resolved now): no link below it
        folder = bound = str(Path(folder).resolve())
    return Place(folder, root.endpoint_url, bound).child(f"{suite_folder(suite or 'default')}/job={job_id}")


NAME_MAX = 255  # bytes in a folder's name (ext4, XFS, and most others)


def suite_folder(suite: str) -> str:
    """``suite=<suite>``, %-escaped as Hive partitioning decodes it; a suite whose escaped name
    passes the filesystem's limit of a name (128 characters of ``/`` escape to 384) is cut, with a
    digest of the whole suite so that two never share a folder. (An S3 key has no such limit; the
    same folder name is used for both, so a store moves between them unchanged.)"""
    import hashlib
    from urllib.parse import quote

    name = f"suite={quote(suite, safe='')}"
    if len(name.encode()) <= NAME_MAX:
        return name
    digest = hashlib.sha256(suite.encode("utf-8")).hexdigest()[:16]
    cut = name[:NAME_MAX - 18]
    escape = cut.rfind("%", len(cut) - 2)
    return f"{cut[:escape] if escape >= 0 else cut}~{digest}"


def job_folders(root: Place) -> Iterator[tuple[Place, str, float, int]]:
    """Every job folder in the store (``<root>/<tenant>/suite=<suite>/job=<job id>/``): (its place,
    the job id, when its newest file was written (seconds since the epoch), its bytes)."""
    if root.is_s3:
        bucket, prefix = _split(root.uri.rstrip("/") + "/")
        client, seen = _client(root.endpoint_url), {}  # folder -> (job id, newest, bytes)
        with _s3_errors(root.uri):
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
                for obj in page.get("Contents", []):
                    found = _JOB.match(obj["Key"][len(prefix):])
                    if found:
                        folder = f"s3://{bucket}/{prefix}{found.group(1)}"
                        _, newest, size = seen.get(folder, (None, 0.0, 0))
                        seen[folder] = (found.group(2), max(newest, obj["LastModified"].timestamp()), size + obj["Size"])
        for folder, (job_id, newest, size) in sorted(seen.items()):
            yield Place(folder, root.endpoint_url), job_id, newest, size
        return
    base = Path(root.uri)
    for folder in sorted(base.glob("*/suite=*/job=*")):
        if folder.resolve() != folder.absolute():  # reached through a link (a tenant's): not the store's
            continue
        files = [f for f in folder.rglob("*") if f.is_file()]
        yield (Place(str(folder)), folder.name[len("job="):], max((f.stat().st_mtime for f in files), default=0.0),
               sum(f.stat().st_size for f in files))


_JOB = re.compile(r"^([^/]+/suite=[^/]+/job=([^/]+))/")
_CLIENTS: dict = {}


def _client(endpoint_url: str | None):
    """One client per endpoint and process (boto3's clients are thread-safe; making one costs ~50 ms)."""
    client = _CLIENTS.get(endpoint_url)
    if client is None:
        import boto3
        from botocore.config import Config

        config = Config(connect_timeout=10, read_timeout=60, retries={"max_attempts": 5, "mode": "standard"})
        client = _CLIENTS[endpoint_url] = boto3.session.Session().client("s3", endpoint_url=endpoint_url,
                                                                         config=config)
    return client


def _split(uri: str) -> tuple[str, str]:
    bucket, _, key = uri[len("s3://"):].partition("/")
    return bucket, key


@contextlib.contextmanager
def _s3_errors(uri: str) -> Iterator[None]:
    """The store's failures are the cluster's (StoreUnavailable), not a job's: the job named nothing."""
    from evalq.shared.core.errors import JobError
    from evalq.shared.data.storage import s3_errors

    try:
        with s3_errors(uri):
            yield
    except (JobError, InfraError) as exc:
        raise StoreUnavailable(f"the job store: {exc}") from None
