"""A batch input file, checked line by line as the Batch API checks it: JSON Lines of
``{"custom_id", "method": "POST", "url", "body"}``, custom_ids unique, one model. Any
error fails the whole batch, listing every bad line (1-based) with the API's codes:
``empty_file``, ``too_many_tasks``, ``invalid_json_line``, ``missing_required_parameter``,
``invalid_value``, ``url_mismatch``, ``model_mismatch``, ``duplicate_custom_id``."""

from __future__ import annotations

import json

MAX_LINES = {"openai": 50_000, "azure": 100_000}


def line_error(line: int | None, code: str, message: str, param: str | None = None) -> dict:
    return {"code": code, "message": message, "param": param, "line": line}


def read_input(data: bytes, endpoint: str, flavor: str) -> tuple[list[tuple[str, dict]], str | None, list[dict]]:
    """(lines, model, errors) of a batch input file, checked as the API checks it."""
    def norm(url: str) -> str:  # Azure takes /chat/completions and /v1/chat/completions alike
        return url.removeprefix("/v1") if flavor == "azure" else url

    lines: list[tuple[str, dict]] = []
    errors: list[dict] = []
    seen: set[str] = set()
    model = None
    raw = data.splitlines()
    if not any(r.strip() for r in raw):
        return [], None, [line_error(None, "empty_file", "The batch input file is empty.")]
    if len(raw) > MAX_LINES[flavor]:
        errors.append(line_error(None, "too_many_tasks", f"The batch input file has {len(raw)} "
                                  f"requests; at most {MAX_LINES[flavor]} are allowed."))
    for number, text in enumerate(raw, 1):
        try:
            obj = json.loads(text)
        except (ValueError, UnicodeDecodeError):
            obj = None
        if not isinstance(obj, dict):
            errors.append(line_error(number, "invalid_json_line", "This line is not parseable as valid JSON."))
            continue
        bad = len(errors)
        for name in ("custom_id", "method", "url", "body"):
            if name not in obj:
                errors.append(line_error(number, "missing_required_parameter",
                                          f"Missing required parameter: '{name}'.", name))
        custom_id, method, url, body = (obj.get(k) for k in ("custom_id", "method", "url", "body"))
        if "custom_id" in obj and (not isinstance(custom_id, str) or not custom_id):
            errors.append(line_error(number, "invalid_value", "'custom_id' must be a non-empty string.",
                                      "custom_id"))
        if "method" in obj and method != "POST":
            errors.append(line_error(number, "invalid_value", f"Invalid value: {method!r}. Supported "
                                      "values are: 'POST'.", "method"))
        if "url" in obj and (not isinstance(url, str) or norm(url) != norm(endpoint)):
            errors.append(line_error(number, "url_mismatch", f"The provided URL {url!r} does not match "
                                      f"the batch endpoint {endpoint!r}.", "url"))
        if "body" in obj and not isinstance(body, dict):
            errors.append(line_error(number, "invalid_value", "'body' must be a JSON object.", "body"))
        elif isinstance(body, dict):
            line_model = body.get("model")
            if not isinstance(line_model, str) or not line_model:
                errors.append(line_error(number, "missing_required_parameter",
                                          "Missing required parameter: 'body.model'.", "body.model"))
            elif model is None:
                model = line_model
            elif line_model != model:
                errors.append(line_error(number, "model_mismatch", f"The provided model {line_model!r} "
                                          f"does not match the model {model!r} of the other requests in "
                                          "the batch.", "body.model"))
        if isinstance(custom_id, str) and custom_id:
            if custom_id in seen:
                errors.append(line_error(number, "duplicate_custom_id", "The custom_id for this request "
                                          "is a duplicate of another request. The custom_id parameter "
                                          "must be unique for each request in a batch.", "custom_id"))
            seen.add(custom_id)
        if len(errors) == bad:
            lines.append((custom_id, body))
    return lines, model, errors
