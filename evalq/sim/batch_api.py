"""The Files and Batches endpoints over HTTP: paths, request bodies (JSON and
multipart/form-data) and list pages, answered from a region's
:class:`~evalq.sim.batches.BatchEngine`. The handler checks the key first."""

from __future__ import annotations

import email.parser
import email.policy
import json
import re
from typing import Any

from evalq.sim.batches import ApiError, BatchEngine

# prefix -> flavor; "/openai" (Azure, dated api-version) needs ?api-version=
_PREFIX = re.compile(r"^(?P<prefix>/openai/v1|/openai|/v1)(?P<rest>/(?:files|batches)(?:/.*)?)$")
_ENDPOINTS = {"openai": ("/v1/chat/completions",), "azure": ("/chat/completions", "/v1/chat/completions")}
_PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")

Reply = tuple[int, Any]  # (status, JSON-able body, or bytes for file content)


def is_batch_path(path: str) -> bool:
    return _PREFIX.match(path) is not None


def handle(engine: BatchEngine, method: str, path: str, query: dict[str, list[str]], body: bytes,
           content_type: str) -> Reply:
    """Answer one request to a Files or Batches path (``is_batch_path``)."""
    engine.add(requests=1)
    try:
        return _route(engine, method, path, query, body, content_type)
    except ApiError as exc:
        if exc.status == 400:
            engine.add(bad_request=1)
        return exc.status, exc.body


def _route(engine: BatchEngine, method: str, path: str, query: dict[str, list[str]], body: bytes,
           content_type: str) -> Reply:
    match = _PREFIX.match(path)
    if match is None:
        raise ApiError(404, f"Unknown path {path!r}", code="not_found")
    prefix, parts = match["prefix"], match["rest"].strip("/").split("/")
    flavor = "openai" if prefix == "/v1" else "azure"
    if prefix == "/openai" and not query.get("api-version"):
        raise ApiError(400, "Missing required query parameter 'api-version'.", "api-version")
    resource, rest = parts[0], parts[1:]
    if resource == "files":
        if not rest and method == "POST":
            return 200, _upload(engine, body, content_type).view()
        if not rest and method == "GET":
            files = engine.list_files(_one(query, "purpose"))
            files.sort(key=lambda f: f.created_at, reverse=_one(query, "order") != "asc")
            return 200, _page([f.view() for f in files], query, default_limit=10_000)
        if len(rest) == 1 and method == "GET":
            return 200, engine.file(rest[0]).view()
        if len(rest) == 1 and method == "DELETE":
            engine.delete(rest[0])
            return 200, {"id": rest[0], "object": "file", "deleted": True}
        if len(rest) == 2 and rest[1] == "content" and method == "GET":
            return 200, engine.file(rest[0]).data
    else:
        if not rest and method == "POST":
            return 200, _create(engine, body, flavor)
        if not rest and method == "GET":
            return 200, _page(engine.list_batches(), query, default_limit=20)
        if len(rest) == 1 and method == "GET":
            return 200, engine.batch(rest[0])
        if len(rest) == 2 and rest[1] == "cancel" and method == "POST":
            return 200, engine.cancel(rest[0])
    raise ApiError(404, f"Unknown path {method} {path!r}", code="not_found")


def _one(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[-1] if values else None


def _page(items: list[dict], query: dict[str, list[str]], default_limit: int) -> dict:
    """A cursor page, as ``SyncCursorPage`` reads it (``after`` = the last id seen)."""
    limit_text = _one(query, "limit")
    try:
        limit = default_limit if limit_text is None else int(limit_text)
    except ValueError:
        raise ApiError(400, f"Invalid 'limit': {limit_text!r}.", "limit", "invalid_value") from None
    if not 1 <= limit <= max(default_limit, 100):
        raise ApiError(400, f"Invalid 'limit': {limit}; expected 1 to {max(default_limit, 100)}.",
                       "limit", "invalid_value")
    after = _one(query, "after")
    if after is not None:
        ids = [item["id"] for item in items]
        items = items[ids.index(after) + 1:] if after in ids else []
    page = items[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit}


def _multipart(body: bytes, content_type: str) -> dict[str, tuple[str | None, bytes]]:
    """multipart/form-data fields: name -> (filename, bytes)."""
    if not content_type.lower().startswith("multipart/form-data") or "boundary=" not in content_type:
        raise ApiError(400, "Expected a multipart/form-data body with fields 'purpose' and 'file'.")
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode("latin-1")
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    fields: dict[str, tuple[str | None, bytes]] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if name:
            fields[str(name)] = (part.get_filename(), part.get_payload(decode=True) or b"")
    return fields


def _upload(engine: BatchEngine, body: bytes, content_type: str):  # noqa: ANN202
    fields = _multipart(body, content_type)
    if "purpose" not in fields:
        raise ApiError(400, "Missing required parameter: 'purpose'.", "purpose", "missing_required_parameter")
    if "file" not in fields:
        raise ApiError(400, "Missing required parameter: 'file'.", "file", "missing_required_parameter")
    purpose = fields["purpose"][1].decode("utf-8", "replace")
    if purpose not in _PURPOSES:
        raise ApiError(400, f"Invalid value for 'purpose': {purpose!r}.", "purpose", "invalid_value")
    filename, data = fields["file"]
    filename = filename or "upload"
    if purpose == "batch" and not filename.endswith(".jsonl"):
        raise ApiError(400, "Invalid file format for Batch API. Must be .jsonl", "file")
    return engine.store(filename, purpose, data)


def _create(engine: BatchEngine, raw: bytes, flavor: str) -> dict:
    try:
        body = json.loads(raw or b"null")
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "We could not parse the JSON body of your request.") from None
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.")
    for name in ("input_file_id", "endpoint", "completion_window"):
        if not isinstance(body.get(name), str) or not body[name]:
            raise ApiError(400, f"Missing required parameter: '{name}'.", name, "missing_required_parameter")
    if body["endpoint"] not in _ENDPOINTS[flavor]:
        raise ApiError(400, f"Invalid value for 'endpoint': {body['endpoint']!r}; judge-sim serves "
                            f"{' and '.join(map(repr, _ENDPOINTS[flavor]))}.", "endpoint", "invalid_value")
    if body["completion_window"] != "24h":
        raise ApiError(400, f"Invalid value for 'completion_window': {body['completion_window']!r}. "
                            "Supported values are: '24h'.", "completion_window", "invalid_value")
    metadata = body.get("metadata")
    if metadata is not None and not (
            isinstance(metadata, dict) and len(metadata) <= 16 and all(
                isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512
                for k, v in metadata.items())):
        raise ApiError(400, "'metadata' must map at most 16 keys (up to 64 characters) to strings "
                            "(up to 512 characters).", "metadata", "invalid_value")
    return engine.create(body["input_file_id"], body["endpoint"], metadata, flavor)
