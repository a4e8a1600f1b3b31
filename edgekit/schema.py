"""Build frozen dataclasses from TOML/JSON data, strictly.

The dataclass is the schema: its field names are the keys, its type hints the types.
Unknown keys are rejected and listed (never dropped silently), missing required keys are
named, and every error says where in the document it happened.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, TypeVar

from edgekit.errors import ProfileSchemaError, SchemaError

T = TypeVar("T")


def build(cls: type[T], data: Any, where: str, error: type[SchemaError] = ProfileSchemaError) -> T:
    """Instantiate dataclass ``cls`` from ``data``, validating keys and types.

    Raises:
        ``error`` (a SchemaError): unknown or missing keys, or a value of the wrong type.
    """
    if not isinstance(data, dict):
        raise error(f"{where}: expected a table, found {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise error(
            f"{where}: unknown key(s) {', '.join(unknown)}",
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
        values[name] = _convert(hints[name], data[name], f"{where}.{name}", error)
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
            raise error(f"{where}: {value!r} is not one of {', '.join(repr(a) for a in args)}")
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
            return float(value)
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is Any or isinstance(value, tp):
        return value
    raise error(
        f"{where}: expected {getattr(tp, '__name__', tp)}, found {type(value).__name__} {value!r}"
    )


def dataclass_json_schema(
    root: type, *, title: str, schema_id: str, consts: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A JSON Schema (draft 2020-12) derived from a tree of dataclasses: every dataclass a
    ``$defs`` entry with no additional properties; ``consts`` pins top-level values."""
    defs: dict[str, Any] = {}

    def of(tp: Any) -> dict[str, Any]:
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin in (typing.Union, types.UnionType):
            return {"anyOf": [of(a) for a in args]}
        if origin is typing.Literal:
            return {"enum": list(args)}
        if origin is tuple:
            return {"type": "array", "items": of(args[0])}
        if origin is dict:
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
                    "properties": {f.name: of(hints[f.name]) for f in fields},
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
        return {"type": simple[tp]} if tp in simple else {}

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
