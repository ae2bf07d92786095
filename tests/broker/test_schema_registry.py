"""The schema registry's rules without a cluster: Avro schema resolution (the compatibility checks
of AVRO and JSON schemas), each strategy both ways, versions after a deletion, and the
compare-and-set on the locator (two registries racing for the same version)."""
from __future__ import annotations

import asyncio
import json

import pytest

from clusters.broker import avro_compat
from clusters.broker import schema as S


def rec(*fields, name="R"):
    return {"type": "record", "name": name, "fields": list(fields)}


def sd(schema, t="JSON"):
    return S.SchemaData(t, json.dumps(schema).encode())


INT_X = {"name": "x", "type": "int"}
LONG_X = {"name": "x", "type": "long"}
STR_X = {"name": "x", "type": "string"}
Y_DEFAULT = {"name": "y", "type": ["null", "string"], "default": None}
Y_NO_DEFAULT = {"name": "y", "type": "string"}


@pytest.mark.parametrize("reader,writer,ok", [
    (rec(INT_X), rec(INT_X), True),
    (rec(LONG_X), rec(INT_X), True),                  # promotion int -> long
    (rec(INT_X), rec(LONG_X), False),
    (rec(STR_X), rec(INT_X), False),
    (rec(INT_X, Y_DEFAULT), rec(INT_X), True),         # a new field with a default
    (rec(INT_X, Y_NO_DEFAULT), rec(INT_X), False),     # ... without one
    (rec(INT_X), rec(INT_X, Y_NO_DEFAULT), True),      # writer's extra field skipped
    (rec(INT_X, name="A"), rec(INT_X, name="B"), False),
    ({"type": "enum", "name": "E", "symbols": ["a", "b"]}, {"type": "enum", "name": "E", "symbols": ["a"]}, True),
    ({"type": "enum", "name": "E", "symbols": ["a"]}, {"type": "enum", "name": "E", "symbols": ["a", "b"]}, False),
    (["null", "int"], "int", True),
    ("int", ["null", "int"], False),
    ({"type": "array", "items": "long"}, {"type": "array", "items": "int"}, True),
    ({"type": "map", "values": "int"}, {"type": "map", "values": "string"}, False),
])
def test_avro_resolution(reader, writer, ok):
    err = avro_compat.reader_writer_error(avro_compat.parse(json.dumps(reader)), avro_compat.parse(json.dumps(writer)))
    assert (err is None) == ok, err


@pytest.mark.parametrize("strategy,old,new,ok", [
    ("FULL", rec(INT_X), rec(INT_X, Y_DEFAULT), True),
    ("FULL", rec(INT_X), rec(LONG_X), False),             # backward yes, forward no
    ("BACKWARD", rec(INT_X), rec(LONG_X), True),
    ("FORWARD", rec(INT_X), rec(LONG_X), False),
    ("FORWARD", rec(LONG_X), rec(INT_X), True),
    ("BACKWARD", rec(INT_X), rec(INT_X, Y_NO_DEFAULT), False),
    ("FORWARD", rec(INT_X), rec(INT_X, Y_NO_DEFAULT), True),
    ("ALWAYS_COMPATIBLE", rec(INT_X), rec(STR_X), True),
    ("ALWAYS_INCOMPATIBLE", rec(INT_X), rec(INT_X, Y_DEFAULT), False),
])
def test_strategies(strategy, old, new, ok):
    try:
        S.check_compatible([sd(old)], sd(new), strategy)
        assert ok
    except S.IncompatibleSchema:
        assert not ok


def test_transitive_checks_every_version_the_plain_form_only_the_latest():
    """v2 needs a field y that v1 wrote but v0 did not: BACKWARD (against the latest, v1) accepts
    it, BACKWARD_TRANSITIVE (against v0 too) refuses it."""
    v0 = sd(rec(INT_X))
    v1 = sd(rec(INT_X, {"name": "y", "type": "string", "default": ""}))
    v2 = sd(rec(INT_X, {"name": "y", "type": "string"}))       # needs y in the writer: v1 has it, v0 not
    S.check_compatible([v0, v1], v2, "BACKWARD")
    with pytest.raises(S.IncompatibleSchema):
        S.check_compatible([v0, v1], v2, "BACKWARD_TRANSITIVE")


def test_another_type_is_incompatible_unless_always_compatible():
    with pytest.raises(S.IncompatibleSchema, match="exists schema type JSON, new schema type STRING"):
        S.check_compatible([sd(rec(INT_X))], S.SchemaData("STRING"), "FULL")
    S.check_compatible([sd(rec(INT_X))], S.SchemaData("STRING"), "ALWAYS_COMPATIBLE")


def test_versions_deletion_and_compare_and_set():
    async def main():
        reg = S.MemorySchemaRegistry()
        assert await reg.put_if_absent("t/n/a", sd(rec(INT_X)), "FULL") == 0
        assert await reg.put_if_absent("t/n/a", sd(rec(INT_X)), "FULL") == 0
        with pytest.raises(S.IncompatibleSchema):
            await reg.put_if_absent("t/n/a", sd(rec(STR_X)), "FULL")
        assert await reg.delete("t/n/a") == 1
        assert await reg.get("t/n/a") is None
        assert await reg.put_if_absent("t/n/a", sd(rec(STR_X)), "FULL") == 2       # no check after a delete
        assert (await reg.get("t/n/a", 0)) is None                                # before the deletion
        # a writer that read the locator before another one wrote loses the compare-and-set
        index, zv = await reg._locator("t/n/a")
        assert await reg._append("t/n/a", index, zv, sd(rec(STR_X, Y_DEFAULT))) == 3
        assert await reg._append("t/n/a", index, zv, sd(rec(LONG_X))) is None
    asyncio.run(main())


def test_schema_id_is_the_partitioned_topics():
    assert S.schema_id("persistent://t/n/x-partition-3") == "t/n/x"
    assert S.version_from_bytes(S.version_bytes(5)) == 5
