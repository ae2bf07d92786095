"""Avro schema resolution, as far as Pulsar's schema compatibility checks need it.

Pulsar checks AVRO and JSON schemas (the JSON schema of the clients is an Avro record definition)
with Avro's SchemaValidator: BACKWARD = the new schema can read what the existing one wrote
(`canReadStrategy`), FORWARD = the existing can read what the new one writes (`canBeReadStrategy`),
FULL = both (`mutualReadStrategy`); AvroSchemaBasedCompatibilityCheck. The rules here are Avro's
SchemaCompatibility.checkReaderWriterCompatibility (the Avro 1.11 specification, "Schema
Resolution"): records match by name (or the reader's aliases), a reader field missing from the
writer needs a default, writer fields the reader lacks are skipped, numeric promotion
int -> long -> float -> double, string <-> bytes, enums need the writer's symbols (unless the reader
has a default), unions resolve branch by branch, arrays/maps by their items/values, fixed by name
and size. Written for this project from the specification.

`reader_writer_error(reader, writer)` returns None when `reader` can read data written with
`writer`, else a sentence saying why. `parse(text)` raises SchemaParseError on what is not an Avro
schema.
"""
from __future__ import annotations

import json
from typing import Any

PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
_PROMOTIONS = {"int": {"long", "float", "double"}, "long": {"float", "double"}, "float": {"double"},
               "string": {"bytes"}, "bytes": {"string"}}


class SchemaParseError(ValueError):
    pass


def parse(text: str | bytes) -> Any:
    """The schema as a resolved tree: named types referenced by name are replaced by their definition."""
    try:
        raw = json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise SchemaParseError(f"not a JSON schema definition: {e}") from None
    names: dict[str, Any] = {}
    return _resolve(raw, names, None)


def _fullname(name: str, namespace: str | None) -> str:
    if "." in name or not namespace:
        return name
    return f"{namespace}.{name}"


def _resolve(s: Any, names: dict[str, Any], namespace: str | None) -> Any:
    if isinstance(s, str):
        if s in PRIMITIVES:
            return {"type": s}
        full = _fullname(s, namespace)
        for key in (full, s):
            if key in names:
                return names[key]
        raise SchemaParseError(f"undefined name: {s}")
    if isinstance(s, list):
        return {"type": "union", "branches": [_resolve(b, names, namespace) for b in s]}
    if not isinstance(s, dict) or "type" not in s:
        raise SchemaParseError(f"not a schema: {json.dumps(s)[:80]}")
    t = s["type"]
    if isinstance(t, (dict, list)):
        return _resolve(t, names, namespace)
    if t in PRIMITIVES:
        return {"type": t}
    if t in ("record", "error", "enum", "fixed"):
        name = s.get("name")
        if not isinstance(name, str) or not name:
            raise SchemaParseError(f"a {t} needs a name")
        ns = s.get("namespace", namespace) if "." not in name else name.rsplit(".", 1)[0]
        full = _fullname(name, ns)
        node: dict[str, Any] = {"type": "record" if t == "error" else t, "name": full.rsplit(".", 1)[-1],
                                "fullname": full, "aliases": list(s.get("aliases") or [])}
        names[full] = node
        if t in ("record", "error"):
            fields = s.get("fields")
            if not isinstance(fields, list):
                raise SchemaParseError(f"record {full} needs a list of fields")
            node["fields"] = []
            for f in fields:
                if not isinstance(f, dict) or not isinstance(f.get("name"), str) or "type" not in f:
                    raise SchemaParseError(f"record {full}: malformed field {json.dumps(f)[:80]}")
                node["fields"].append({"name": f["name"], "aliases": list(f.get("aliases") or []),
                                       "has_default": "default" in f,
                                       "type": _resolve(f["type"], names, ns)})
        elif t == "enum":
            symbols = s.get("symbols")
            if not isinstance(symbols, list):
                raise SchemaParseError(f"enum {full} needs symbols")
            node["symbols"] = list(symbols)
            node["has_default"] = "default" in s
        else:
            if not isinstance(s.get("size"), int):
                raise SchemaParseError(f"fixed {full} needs a size")
            node["size"] = s["size"]
        return node
    if t == "array":
        if "items" not in s:
            raise SchemaParseError("array needs items")
        return {"type": "array", "items": _resolve(s["items"], names, namespace)}
    if t == "map":
        if "values" not in s:
            raise SchemaParseError("map needs values")
        return {"type": "map", "values": _resolve(s["values"], names, namespace)}
    if isinstance(t, str):
        return _resolve(t, names, namespace)
    raise SchemaParseError(f"unknown type {json.dumps(t)[:60]}")


def _describe(s: Any) -> str:
    t = s["type"]
    return s.get("fullname", t) if t in ("record", "enum", "fixed") else t


def reader_writer_error(reader: Any, writer: Any, path: str = "", _seen: set | None = None) -> str | None:
    """None if data written with `writer` can be read with `reader`, else why not."""
    seen = _seen if _seen is not None else set()
    key = (id(reader), id(writer))
    if key in seen:                     # recursive types: assume compatible on the second visit
        return None
    seen.add(key)
    rt, wt = reader["type"], writer["type"]
    where = path or "/"
    if wt == "union":
        for i, b in enumerate(writer["branches"]):
            err = reader_writer_error(reader, b, f"{path}/{i}", seen)
            if err:
                return err
        return None
    if rt == "union":
        for b in reader["branches"]:
            if reader_writer_error(b, writer, path, set(seen)) is None:
                return None
        return f"{where}: reader union lacks writer type {_describe(writer)}"
    if rt in PRIMITIVES:
        if rt == wt or rt in _PROMOTIONS.get(wt, ()):
            return None
        return f"{where}: reader type {rt} cannot read writer type {_describe(writer)}"
    if rt != wt:
        return f"{where}: reader type {_describe(reader)} does not match writer type {_describe(writer)}"
    if rt in ("record", "enum", "fixed"):
        if reader["name"] != writer["name"] and writer["fullname"] not in reader["aliases"] \
                and writer["name"] not in reader["aliases"]:
            return f"{where}: expected name {reader['fullname']}, found {writer['fullname']}"
    if rt == "fixed":
        if reader["size"] != writer["size"]:
            return f"{where}: fixed size {reader['size']} expected, found {writer['size']}"
        return None
    if rt == "enum":
        missing = [s for s in writer["symbols"] if s not in reader["symbols"]]
        if missing and not reader.get("has_default"):
            return f"{where}: reader enum lacks symbols {missing}"
        return None
    if rt == "array":
        return reader_writer_error(reader["items"], writer["items"], f"{path}/items", seen)
    if rt == "map":
        return reader_writer_error(reader["values"], writer["values"], f"{path}/values", seen)
    # record
    wfields = {f["name"]: f for f in writer["fields"]}
    for f in reader["fields"]:
        wf = wfields.get(f["name"])
        if wf is None:
            for alias in f["aliases"]:
                wf = wfields.get(alias)
                if wf is not None:
                    break
        if wf is None:
            if not f["has_default"]:
                return f"{path}/fields/{f['name']}: reader field {f['name']!r} has no default value " \
                       f"and is missing from the writer schema"
            continue
        err = reader_writer_error(f["type"], wf["type"], f"{path}/fields/{f['name']}", seen)
        if err:
            return err
    return None
