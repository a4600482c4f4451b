"""Reading datasets and writing outputs, on local paths or ``s3://`` URIs.

S3 goes through boto3's standard credential chain (environment, shared config,
instance or pod role); ``endpoint_url`` points at MinIO or another S3-compatible
store. boto3 is imported only when an ``s3://`` URI is used. Gzip is detected
by its magic bytes, so ``.jsonl.gz`` (or a gzipped file of any name) reads
transparently. Every failure becomes a message naming the URI: a missing object
or bucket and refused credentials are ``JobError`` (the job names something it
cannot read), an unreachable endpoint is ``InfraError``.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import tempfile
from pathlib import Path
from typing import IO, Iterator

from evalq.shared.core.errors import InfraError, JobError

GZIP_MAGIC = b"\x1f\x8b"
READ_BUFFER = 1 << 20


def is_s3(uri: str) -> bool:
    return uri.startswith("s3://")


def split_s3(uri: str) -> tuple[str, str]:
    bucket, _, key = uri[len("s3://"):].partition("/")
    if not bucket:
        raise JobError(f"{uri}: expected s3://bucket/key")
    return bucket, key


def s3_client(uri: str, endpoint_url: str | None = None):
    """A client for reaching ``uri``; refused (JobError) unless the operator's lists
    allow that place and endpoint (``evalq.shared.policy.egress``): nothing is signed or sent."""
    import boto3
    from botocore.config import Config

    from evalq.shared.policy.egress import check_s3

    check_s3(uri, endpoint_url)

    config = Config(connect_timeout=10, read_timeout=60, retries={"max_attempts": 3, "mode": "standard"})
    return boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=config)


@contextlib.contextmanager
def s3_errors(uri: str, not_found: str = "no such object") -> Iterator[None]:
    """Turn botocore's exceptions into one line naming the URI (a bare 404
    means ``not_found``: HEAD requests carry no error code)."""
    from botocore.exceptions import (BotoCoreError, ClientError, EndpointConnectionError,
                                     NoCredentialsError)

    try:
        yield
    except ClientError as exc:
        err = exc.response.get("Error", {})
        code, status = str(err.get("Code", "")), exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        reason = {
            "NoSuchKey": "no such object", "404": not_found, "NoSuchBucket": "no such bucket",
            "AccessDenied": "access denied", "403": "access denied",
            "InvalidAccessKeyId": "access denied: the access key id is not known to the store",
            "SignatureDoesNotMatch": "access denied: the secret key does not match the access key id",
            "ExpiredToken": "access denied: the credentials have expired",
        }.get(code)
        if reason is None and status in (401, 403):
            reason = f"access denied ({code})"
        if reason is not None:
            raise JobError(f"{uri}: {reason}") from None
        raise InfraError(f"{uri}: S3 error {code or status}: {err.get('Message', exc)}") from None
    except NoCredentialsError:
        raise JobError(f"{uri}: no AWS credentials found (environment, ~/.aws or an instance role)") from None
    except EndpointConnectionError as exc:
        raise InfraError(f"{uri}: cannot reach the S3 endpoint: {exc}") from None
    except BotoCoreError as exc:
        raise InfraError(f"{uri}: {exc}") from None


class _BodyReader(io.RawIOBase):
    """A raw stream over boto3's StreamingBody, so io and gzip can buffer it."""

    def __init__(self, body, uri: str):
        self.body = body
        self.uri = uri

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        with s3_errors(self.uri):
            data = self.body.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.body.close()
        super().close()


def open_binary(uri: str, endpoint_url: str | None = None, max_bytes: int | None = None,
                limit_name: str = "") -> IO[bytes]:
    """A buffered binary stream of the (decompressed) content at ``uri``. With
    ``max_bytes``, a stored object or file larger than that is refused before it is read."""
    from evalq.shared.core.limits import size

    stored = None
    if is_s3(uri):
        bucket, key = split_s3(uri)
        if not key:
            raise JobError(f"{uri}: expected s3://bucket/key, not a bucket")
        with s3_errors(uri):
            reply = s3_client(uri, endpoint_url).get_object(Bucket=bucket, Key=key)
        body, stored = reply["Body"], reply.get("ContentLength")
        if max_bytes is not None and stored is not None and stored > max_bytes:
            body.close()
            raise JobError(f"{uri}: larger than {size(max_bytes)} ({limit_name}); not read")
        raw: IO[bytes] = io.BufferedReader(_BodyReader(body, uri), READ_BUFFER)
    else:
        path = Path(uri).expanduser()
        try:
            if max_bytes is not None and path.is_file() and path.stat().st_size > max_bytes:
                raise JobError(f"{uri}: larger than {size(max_bytes)} ({limit_name}); not read")
            raw = open(path, "rb", buffering=READ_BUFFER)
        except FileNotFoundError:
            raise JobError(f"{uri}: no such file") from None
        except IsADirectoryError:
            raise JobError(f"{uri}: is a directory, expected a file") from None
        except PermissionError:
            raise JobError(f"{uri}: permission denied") from None
    if raw.peek(2)[:2] == GZIP_MAGIC:
        return io.BufferedReader(gzip.GzipFile(fileobj=raw, mode="rb"), READ_BUFFER)  # type: ignore[arg-type]
    return raw


class LineError(str):
    """A line that could not be read as text (too long, not UTF-8): its record is bad."""


def read_lines(uri: str, endpoint_url: str | None = None) -> Iterator[tuple[int, str]]:
    """(line number, text or LineError) for every line, streamed: flat memory for
    any size. A line over ``EVALQ_MAX_RECORD_BYTES`` is skipped to its end (not
    held), and the whole file stops at ``EVALQ_MAX_DATASET_BYTES``."""
    from evalq.shared.core.limits import Limits, size

    limits = Limits.from_env()
    with open_binary(uri, endpoint_url) as stream:
        reader = LineReader(stream, limits.record_bytes, max_total=limits.dataset_bytes)
        lines = iter(reader)
        number = 0
        while True:
            try:
                text = next(lines, None)
            except (OSError, EOFError) as exc:  # a truncated or corrupt gzip stream
                raise JobError(f"{uri} line {number + 1}: cannot read: {exc}") from None
            if text is None:
                return
            number += 1
            if reader.total > limits.dataset_bytes:
                raise JobError(f"{uri} line {number}: stopped reading: the dataset is larger than "
                               f"{size(limits.dataset_bytes)} once decompressed (EVALQ_MAX_DATASET_BYTES)")
            yield number, text


class LineReader:
    """The lines of a binary stream as evalq reads every JSON Lines dataset: each line's text, or a
    LineError for a line over ``record_bytes`` (read past in bounded pieces, never held) or one that
    is not UTF-8. ``total`` counts the bytes read; the skip of a long line stops once it passes
    ``max_total``. With ``end``, reading stops at that offset (a part of a file read by one of several
    processes, which starts at a line's start: ``evalq.shared.data.parallel_read``)."""

    PIECE = 1 << 20

    def __init__(self, stream: IO[bytes], record_bytes: int, max_total: int | None = None, end: int | None = None):
        self.stream, self.record_bytes, self.max_total, self.end = stream, record_bytes, max_total, end
        self.total = 0

    def __iter__(self) -> Iterator[str]:
        from evalq.shared.core.limits import size

        stream, limit = self.stream, self.record_bytes
        while self.end is None or stream.tell() < self.end:
            raw = stream.readline(limit + 1)
            long_line = len(raw) > limit and not raw.endswith(b"\n")
            while long_line:  # read past the rest of it in bounded pieces
                rest = stream.readline(self.PIECE)
                self.total += len(rest)
                if not rest or rest.endswith(b"\n") or (self.max_total is not None and self.total > self.max_total):
                    break
            if not raw:
                return
            self.total += len(raw)
            if long_line:
                yield LineError(f"line longer than {size(limit)} (EVALQ_MAX_RECORD_BYTES)")
                continue
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield LineError(f"not UTF-8 ({exc.reason} at byte {exc.start})")


class Destination:
    """Where results go: a local directory or an ``s3://bucket/prefix/``."""

    def __init__(self, uri: str, endpoint_url: str | None = None):
        self.uri = uri
        self.endpoint_url = endpoint_url
        self.s3 = is_s3(uri)

    def __str__(self) -> str:
        return self.uri

    def path(self, name: str) -> str:
        return f"{self.uri.rstrip('/')}/{name}" if self.s3 else str(Path(self.uri) / name)

    def check(self) -> None:
        """Fail early, before the job runs, when the destination cannot be written."""
        if not self.s3:
            path = Path(self.uri)
            if path.exists() and not path.is_dir():
                raise JobError(f"{self.uri}: exists and is not a directory")
            try:
                path.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise JobError(f"{self.uri}: cannot create the output directory: {exc.strerror}") from None
            if not os.access(path, os.W_OK):
                raise JobError(f"{self.uri}: the output directory is not writable")
            return
        bucket, _ = split_s3(self.uri)
        with s3_errors(f"s3://{bucket}", not_found="no such bucket"):
            s3_client(self.uri, self.endpoint_url).head_bucket(Bucket=bucket)

    @contextlib.contextmanager
    def open_text(self, name: str) -> Iterator[IO[str]]:
        """A text file to write; it appears at its destination whole or not at all."""
        if not self.s3:
            final = Path(self.uri) / name
            tmp = final.with_name(final.name + ".tmp")
            try:
                Path(self.uri).mkdir(parents=True, exist_ok=True)
                with open(tmp, "w", encoding="utf-8") as f:
                    yield f
                os.replace(tmp, final)
            except OSError as exc:
                raise InfraError(f"{final}: cannot write: {exc.strerror or exc}") from None
            return
        with tempfile.NamedTemporaryFile("w+", encoding="utf-8", suffix="-" + name) as f:
            yield f
            f.flush()
            bucket, prefix = split_s3(self.uri)
            key = f"{prefix.rstrip('/')}/{name}" if prefix.strip("/") else name
            with s3_errors(self.path(name)):
                s3_client(self.path(name), self.endpoint_url).upload_file(f.name, bucket, key)
