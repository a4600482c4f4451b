"""A JSON value a JSON Schema allows, made deterministically: what judge-sim answers a
structured request with, and what the capacity planner's stand-in judge answers
(``evalq plan``), so both exercise every metric's reply parsing without a real judge."""

from __future__ import annotations

import hashlib
import math
import uuid
from typing import Any


def hashed(digest: bytes, path: str) -> int:
    """A number drawn from ``digest`` for one place (``path``) of a reply: the same each time."""
    return int.from_bytes(hashlib.sha256(digest + path.encode("utf-8")).digest()[:8], "big")


class SchemaError(ValueError):
    pass


class SchemaValues:
    """Builds a JSON value valid for a JSON Schema, deterministically.

    Supported: type (or a list of types), const, enum, properties/required (all
    declared properties are produced, plus required ones not declared), local $ref
    (``#``, ``#/$defs/...``, ``#/definitions/...``), allOf (merged), anyOf/oneOf
    (first non-null option), integer/number bounds (minimum, maximum, exclusive
    forms, integer multipleOf), string minLength/maxLength/format (date-time, date,
    time, email, uri, uuid), array minItems/items/prefixItems (minimal: minItems
    elements). Not supported: pattern, uniqueItems with several items, contains,
    if/then/else, dependent*, minProperties.

    A property named ``score`` gets the score (clamped into its bounds; for an enum,
    the score if listed, else a member); other strings get the reason; booleans are
    ``score >= 3``; other integers/numbers are picked inside their bounds.

    Field markers override that: ``[[sim:severity=6]]`` sets every property named
    ``severity``, ``[[sim:violence.severity=6]]`` only the one at that path (the
    path wins); a value must suit the property (an integer in bounds, a member of an
    enum, ``true``/``false``), else it is ignored. An array of strings takes
    ``a;b;c``. ``[[sim:bool=true]]`` sets every boolean. A boolean marker that is
    not ``true``/``false`` is a list ``x;y``: true when one of its items appears in
    the request's text outside the markers (e.g. the claim being checked)."""

    MAX_DEPTH = 32

    def __init__(self, root: Any, digest: bytes, score: int, reason: str,
                 fields: dict[str, str] | None = None, plain: str = "") -> None:
        self.root, self.digest, self.score, self.reason = root, digest, score, reason
        self.fields, self.plain = fields or {}, plain

    def _marked(self, schema: dict, path: str, name: str | None) -> tuple[bool, Any]:
        """(True, value) when a field marker sets this property to a value that suits it."""
        if not self.fields:
            return False, None
        stype = _schema_type(schema)
        keys = [path[2:]] if path.startswith("$.") else []
        keys += [name] if name else []
        keys += ["bool"] if stype == "boolean" else []
        for key in keys:
            raw = self.fields.get(key)
            if raw is None:
                continue
            if isinstance(schema.get("enum"), list):
                if raw in schema["enum"]:
                    return True, raw
                continue
            if stype == "boolean":
                if raw.lower() in ("true", "false"):
                    return True, raw.lower() == "true"
                return True, any(item and item.replace("_", " ") in self.plain for item in raw.split(";"))
            if stype in ("integer", "number"):
                try:
                    value = int(raw) if stype == "integer" else float(raw)
                except ValueError:
                    continue
                lo, hi = _int_bounds(schema) if stype == "integer" else (schema.get("minimum"), schema.get("maximum"))
                if (lo is None or value >= lo) and (hi is None or value <= hi):
                    return True, value
                continue
            if stype == "array":
                return True, [item.replace("_", " ") for item in raw.split(";") if item]
            if stype == "string":
                return True, raw.replace("_", " ")
        return False, None

    def generate(self) -> Any:
        return self.value(self.root, "$", None, 0)

    def _resolve(self, schema: Any, depth: int) -> Any:
        seen = 0
        while isinstance(schema, dict) and isinstance(schema.get("$ref"), str):
            seen += 1
            if seen > self.MAX_DEPTH:
                raise SchemaError("$ref cycle")
            ref = schema["$ref"]
            if not ref.startswith("#"):
                target: Any = {}
            else:
                target = self.root
                for part in [p for p in ref[1:].split("/") if p]:
                    part = part.replace("~1", "/").replace("~0", "~")
                    if not isinstance(target, dict) or part not in target:
                        raise SchemaError(f"unresolvable $ref {ref!r}")
                    target = target[part]
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            schema = {**target, **rest} if isinstance(target, dict) else target
        return schema

    def _merge_all_of(self, schema: dict, depth: int) -> dict:
        merged = {k: v for k, v in schema.items() if k != "allOf"}
        for sub in schema["allOf"]:
            sub = self._resolve(sub, depth)
            if isinstance(sub, dict) and "allOf" in sub:
                sub = self._merge_all_of(sub, depth)
            if not isinstance(sub, dict):
                continue
            for key, val in sub.items():
                if key == "properties" and isinstance(val, dict):
                    merged["properties"] = {**merged.get("properties", {}), **val}
                elif key == "required" and isinstance(val, list):
                    merged["required"] = list(merged.get("required", [])) + val
                else:
                    merged.setdefault(key, val)
        return merged

    def value(self, schema: Any, path: str, name: str | None, depth: int) -> Any:
        if depth > self.MAX_DEPTH:
            raise SchemaError("schema too deep")
        schema = self._resolve(schema, depth)
        if schema is True or schema is None:
            schema = {}
        if schema is False:
            raise SchemaError(f"no value satisfies the schema at {path}")
        if not isinstance(schema, dict):
            raise SchemaError(f"bad schema at {path}")
        if "allOf" in schema:
            schema = self._merge_all_of(schema, depth)
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list) and schema[key]:
                options = [self._resolve(o, depth) for o in schema[key]]
                pick = next((o for o in options if not _is_null_schema(o)), options[0])
                base = {k: v for k, v in schema.items() if k not in ("anyOf", "oneOf")}
                merged = {**base, **pick} if isinstance(pick, dict) else pick
                return self.value(merged, path, name, depth + 1)
        marked, forced = self._marked(schema, path, name)
        if marked:
            return forced
        is_score = (name or "").lower() == "score"
        h = hashed(self.digest, path)
        if "const" in schema:
            return schema["const"]
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            enum = schema["enum"]
            if is_score:
                for candidate in (self.score, str(self.score)):
                    if candidate in enum:
                        return candidate
            return enum[h % len(enum)]
        stype = _schema_type(schema)
        if stype == "null":
            return None
        if stype == "boolean":
            return self.score >= 3
        if stype == "integer":
            return self._integer(schema, is_score, h)
        if stype == "number":
            return self._number(schema, is_score, h)
        if stype == "array":
            return self._array(schema, path, depth)
        if stype == "object":
            return self._object(schema, path, depth)
        if stype == "string":
            return self._string(schema, is_score, h)
        return self.score if is_score else self.reason  # {}: anything goes

    def _integer(self, schema: dict, is_score: bool, h: int) -> int:
        lo, hi = _int_bounds(schema)
        if not is_score and lo is not None and hi is not None and hi >= lo:
            value = lo + h % (hi - lo + 1)
        else:
            value = self.score
            if lo is not None:
                value = max(value, lo)
            if hi is not None:
                value = min(value, hi)
        return int(_multiple_of(value, schema.get("multipleOf"), lo, False, hi, False, True))

    def _number(self, schema: dict, is_score: bool, h: int) -> float:
        lo, lo_ex = _bound(schema, "minimum", "exclusiveMinimum")
        hi, hi_ex = _bound(schema, "maximum", "exclusiveMaximum")
        if not is_score and lo is not None and hi is not None:
            candidate = round(lo + (h % 997 + 1) / 999 * (hi - lo), 3)
        else:
            candidate = float(self.score)
        value = _clamp_number(candidate, lo, lo_ex, hi, hi_ex)
        return _multiple_of(value, schema.get("multipleOf"), lo, lo_ex, hi, hi_ex, False)

    def _string(self, schema: dict, is_score: bool, h: int) -> str:
        formats = {
            "date-time": "2024-01-01T00:00:00Z", "date": "2024-01-01", "time": "00:00:00Z",
            "email": "judge@example.com", "uri": "https://example.com/judge-sim",
            "url": "https://example.com/judge-sim",
            "uuid": str(uuid.UUID(int=h << 64 | h, version=4)),
        }
        fmt = schema.get("format")
        if fmt in formats:
            return formats[fmt]
        text = str(self.score) if is_score else self.reason
        min_len, max_len = schema.get("minLength"), schema.get("maxLength")
        if isinstance(max_len, int) and len(text) > max_len:
            text = text[:max_len]
        if isinstance(min_len, int) and len(text) < min_len:
            text = text + "." * (min_len - len(text))
        return text

    def _array(self, schema: dict, path: str, depth: int) -> list:
        count = schema.get("minItems", 0)
        count = count if isinstance(count, int) and count > 0 else 0
        prefix = schema.get("prefixItems") if isinstance(schema.get("prefixItems"), list) else []
        items = schema.get("items", {})
        if isinstance(items, list):  # draft-04 tuple form
            prefix, items = items, schema.get("additionalItems", {})
        out = []
        for i in range(count):
            sub = prefix[i] if i < len(prefix) else items
            out.append(self.value(sub, f"{path}[{i}]", None, depth + 1))
        return out

    def _object(self, schema: dict, path: str, depth: int) -> dict:
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        required = [r for r in schema.get("required", []) if isinstance(r, str)]
        out: dict[str, Any] = {}
        for key, sub in props.items():
            if sub is False or (key not in required and depth > 4):
                continue
            out[key] = self.value(sub, f"{path}.{key}", key, depth + 1)
        extra = schema.get("additionalProperties", {})
        for key in required:
            if key not in out:
                out[key] = self.value(extra if isinstance(extra, dict) else {},
                                      f"{path}.{key}", key, depth + 1)
        return out


def schema_value(schema: Any, score: int = 3, reason: str = "stand-in", fields: dict[str, str] | None = None,
                 seed: bytes = b"evalq") -> Any:
    """A JSON value valid for ``schema``, made as judge-sim makes its structured replies
    (deterministic for the same arguments; ``fields`` are field markers, e.g.
    ``{"claims": "a;b;c"}``). Raises ValueError for a schema it cannot satisfy."""
    return SchemaValues(schema, seed, score, reason, fields).generate()


def _is_null_schema(schema: Any) -> bool:
    return isinstance(schema, dict) and (schema.get("type") == "null" or schema.get("type") == ["null"])


def _schema_type(schema: dict) -> str | None:
    stype = schema.get("type")
    if isinstance(stype, list):
        non_null = [t for t in stype if t != "null"]
        stype = non_null[0] if non_null else ("null" if stype else None)
    if isinstance(stype, str):
        return stype
    if any(k in schema for k in ("properties", "required", "additionalProperties")):
        return "object"
    if any(k in schema for k in ("items", "prefixItems", "minItems")):
        return "array"
    if any(k in schema for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")):
        return "number"
    if any(k in schema for k in ("minLength", "maxLength", "format", "pattern")):
        return "string"
    return None


def _bound(schema: dict, inclusive: str, exclusive: str) -> tuple[float | None, bool]:
    ex = schema.get(exclusive)
    val = schema.get(inclusive)
    if isinstance(ex, bool):  # draft-04: boolean flag on minimum/maximum
        return (val, ex) if isinstance(val, (int, float)) else (None, False)
    if isinstance(ex, (int, float)):
        if isinstance(val, (int, float)) and val != ex:
            # both given: the tighter one applies
            tighter_ex = ex >= val if inclusive == "minimum" else ex <= val
            return (ex, True) if tighter_ex else (val, False)
        return ex, True
    return (val, False) if isinstance(val, (int, float)) and not isinstance(val, bool) else (None, False)


def _int_bounds(schema: dict) -> tuple[int | None, int | None]:
    lo, lo_ex = _bound(schema, "minimum", "exclusiveMinimum")
    hi, hi_ex = _bound(schema, "maximum", "exclusiveMaximum")
    if lo is not None:
        lo = math.floor(lo) + 1 if lo_ex else math.ceil(lo)
    if hi is not None:
        hi = math.ceil(hi) - 1 if hi_ex else math.floor(hi)
    return lo, hi


def _clamp_number(v: float, lo: float | None, lo_ex: bool, hi: float | None, hi_ex: bool) -> float:
    def ok(x: float) -> bool:
        return ((lo is None or (x > lo if lo_ex else x >= lo))
                and (hi is None or (x < hi if hi_ex else x <= hi)))
    if ok(v):
        return v
    below = lo is not None and (v < lo or (lo_ex and v <= lo))
    edge = lo if below else hi
    if edge is not None and ok(float(edge)):
        return float(edge)
    if lo is not None and hi is not None:
        return (lo + hi) / 2
    if lo is not None:
        return float(lo) + 1.0
    return float(hi) - 1.0  # type: ignore[arg-type]


def _multiple_of(value: float, mult: Any, lo: float | None, lo_ex: bool, hi: float | None,
                 hi_ex: bool, integer: bool) -> float:
    """A multiple of ``mult`` inside the bounds, near ``value`` (best effort for floats)."""
    if not isinstance(mult, (int, float)) or isinstance(mult, bool) or mult <= 0:
        return value

    def ok(x: float) -> bool:
        return ((lo is None or (x > lo if lo_ex else x >= lo))
                and (hi is None or (x < hi if hi_ex else x <= hi)))

    ks = [round(value / mult)]
    if lo is not None:
        ks += [math.ceil(lo / mult) + i for i in range(3)]
    if hi is not None:
        ks += [math.floor(hi / mult) - i for i in range(3)]
    for k in ks:
        for x in (k * mult, round(k * mult, 12)):
            if integer:
                if float(x) != int(x):
                    continue
                x = int(x)
            if ok(x) and float(x / mult).is_integer():
                return x
    return value
