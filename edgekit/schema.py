"""Build frozen dataclasses from TOML/JSON data, strictly.

The dataclass is the schema: its field names are the keys, its type hints the types.
Unknown keys are rejected and listed (never dropped silently), missing required keys are
named, and every error says where in the document it happened.

Numbers are checked too: a float must be finite (TOML writes ``inf`` and ``nan``, JSON
reaches infinity with ``1e999``), and a field's ``metadata=bounds(...)`` bounds it (every
number of a tuple or table field). The bounds are written into the JSON Schema generated
from the same dataclasses (``minimum``, ``exclusiveMinimum``, ``maximum``,
``exclusiveMaximum``), so the published schema and the reader cannot disagree.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from edgekit.errors import ProfileSchemaError, SchemaError

T = TypeVar("T")

# Field-metadata keys, named as JSON Schema names them.
_BOUND_KEYS = ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum")


def bounds(
    *,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
) -> dict[str, float]:
    """Field metadata that bounds a number (or every number of a tuple or table field):
    ``field(metadata=bounds(gt=0))``. ``build`` enforces it; the JSON Schema carries it."""
    out: dict[str, float] = {}
    if ge is not None:
        out["minimum"] = ge
    if gt is not None:
        out["exclusiveMinimum"] = gt
    if le is not None:
        out["maximum"] = le
    if lt is not None:
        out["exclusiveMaximum"] = lt
    return out


def _limits(metadata: Mapping[str, Any]) -> dict[str, float]:
    return {k: metadata[k] for k in _BOUND_KEYS if k in metadata}


def build(cls: type[T], data: Any, where: str, error: type[SchemaError] = ProfileSchemaError) -> T:
    """Instantiate dataclass ``cls`` from ``data``, validating keys, types and bounds.

    Raises:
        ``error`` (a SchemaError): unknown or missing keys, a value of the wrong type, a
            float that is not finite, or a number outside its field's bounds.
    """
    if not isinstance(data, dict):
        raise error(f"{where}: expected a table, found {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        shown = ", ".join(str(k)[:60] for k in unknown[:20])
        more = f" and {len(unknown) - 20} more" if len(unknown) > 20 else ""
        raise error(
            f"{where}: unknown key(s) {shown}{more}",
            hint=f"allowed keys: {', '.join(sorted(fields))}",
        )
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for name, f in fields.items():
        if name not in data:
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            if required:
                raise error(f"{where}: missing required key {name!r}")
            continue
        value = _convert(hints[name], data[name], f"{where}.{name}", error)
        _check_bounds(value, _limits(f.metadata), f"{where}.{name}", error)
        values[name] = value
    return cls(**values)


def _convert(tp: Any, value: Any, where: str, error: type[SchemaError]) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, where, error)
            except SchemaError as exc:
                errors.append(exc.message)
        raise error(errors[0] if len(errors) == 1 else f"{where}: wrong type")
    if origin is typing.Literal:
        if value not in args:
            raise error(
                f"{where}: {_shown(value)} is not one of {', '.join(repr(a) for a in args)}"
            )
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise error(f"{where}: expected a list, found {type(value).__name__}")
        item = args[0]
        return tuple(_convert(item, v, f"{where}[{i}]", error) for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise error(f"{where}: expected a table, found {type(value).__name__}")
        return {str(k): _convert(args[1], v, f"{where}.{k}", error) for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return build(tp, value, where, error)  # type: ignore[arg-type]
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            try:
                number = float(value)
            except OverflowError:
                number = math.inf
            if not math.isfinite(number):
                raise error(f"{where}: {_shown(value)} is not a finite number")
            return number
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is Any or isinstance(value, tp):
        return value
    raise error(
        f"{where}: expected {getattr(tp, '__name__', tp)}, found {type(value).__name__} "
        f"{_shown(value)}"
    )


def _shown(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return f"(an integer of {value.bit_length()} bits)"
    if isinstance(value, list | dict | tuple) and len(value) > 8:
        return f"(a {type(value).__name__} of {len(value)} items)"
    text = repr(value)
    return text if len(text) <= 80 else text[:79] + "…"


def _check_bounds(
    value: Any, limits: dict[str, float], where: str, error: type[SchemaError]
) -> None:
    """Every number in ``value`` (itself, or the items of a tuple or table) within
    ``limits``."""
    if not limits or value is None or isinstance(value, bool):
        return
    if isinstance(value, tuple):
        for i, v in enumerate(value):
            _check_bounds(v, limits, f"{where}[{i}]", error)
        return
    if isinstance(value, dict):
        for k, v in value.items():
            _check_bounds(v, limits, f"{where}.{k}", error)
        return
    if not isinstance(value, int | float):
        return
    ok = (
        ("minimum" not in limits or value >= limits["minimum"])
        and ("exclusiveMinimum" not in limits or value > limits["exclusiveMinimum"])
        and ("maximum" not in limits or value <= limits["maximum"])
        and ("exclusiveMaximum" not in limits or value < limits["exclusiveMaximum"])
    )
    if not ok:
        raise error(f"{where}: {_shown(value)} is out of range (must be {_describe(limits)})")


def _describe(limits: dict[str, float]) -> str:
    ops = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}
    return " and ".join(f"{ops[k]} {limits[k]:g}" for k in _BOUND_KEYS if k in limits)


def dataclass_json_schema(
    root: type, *, title: str, schema_id: str, consts: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A JSON Schema (draft 2020-12) derived from a tree of dataclasses: every dataclass a
    ``$defs`` entry with no additional properties; ``consts`` pins top-level values;
    fields with ``bounds`` metadata carry them on their numbers."""
    defs: dict[str, Any] = {}

    def of(tp: Any, limits: dict[str, float] | None = None) -> dict[str, Any]:
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin in (typing.Union, types.UnionType):
            return {"anyOf": [of(a, limits) for a in args]}
        if origin is typing.Literal:
            return {"enum": list(args)}
        if origin is tuple:
            return {"type": "array", "items": of(args[0], limits)}
        if origin is dict:
            if limits:
                return {"type": "object", "additionalProperties": of(args[1], limits)}
            return {"type": "object"}
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            name = tp.__name__
            if name not in defs:
                defs[name] = {}  # placeholder against recursion
                hints = typing.get_type_hints(tp)
                fields = dataclasses.fields(tp)
                defs[name] = {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {f.name: of(hints[f.name], _limits(f.metadata)) for f in fields},
                    "required": [
                        f.name
                        for f in fields
                        if f.default is dataclasses.MISSING
                        and f.default_factory is dataclasses.MISSING
                    ],
                }
            return {"$ref": f"#/$defs/{name}"}
        simple = {
            int: "integer",
            float: "number",
            str: "string",
            bool: "boolean",
            type(None): "null",
        }
        if tp not in simple:
            return {}
        schema: dict[str, Any] = {"type": simple[tp]}
        if limits and tp in (int, float):
            schema.update(limits)
        return schema

    top = of(root)
    for key, value in (consts or {}).items():
        defs[root.__name__]["properties"][key] = {"const": value}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": schema_id,
        "title": title,
        **top,
        "$defs": defs,
    }
