"""The schema registry's rules without a cluster: Avro schema resolution (the compatibility checks
of AVRO and JSON schemas), each strategy both ways, versions after a deletion, and the
compare-and-set on the locator (two registries racing for the same version)."""
from __future__ import annotations

import asyncio
import json

import pytest

from clusters.bugs import Knobs

from clusters.bookkeeper.errors import BKNoSuchLedgerError
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


class _Store:
    """ZooKeeper's part for the registry: get_or_none / create / set / delete with versions checked
    as ZooKeeper checks them; each call yields first, so concurrent writers interleave."""

    def __init__(self):
        self.nodes = {}

    async def get_or_none(self, path):
        await asyncio.sleep(0)
        return self.nodes.get(path)

    async def create(self, path, data, makepath=False):
        await asyncio.sleep(0)
        if path in self.nodes:
            raise S.NodeExists(path)
        self.nodes[path] = (data, 0)

    async def set(self, path, data, version=-1):
        await asyncio.sleep(0)
        if path not in self.nodes:
            raise S.NoNode(path)
        if version != -1 and version != self.nodes[path][1]:
            raise S.BadVersion(path)
        self.nodes[path] = (data, self.nodes[path][1] + 1)

    async def delete(self, path, version=-1):
        await asyncio.sleep(0)
        if path not in self.nodes:
            raise S.NoNode(path)
        if version != -1 and version != self.nodes[path][1]:
            raise S.BadVersion(path)
        del self.nodes[path]


class _Ledger:
    def __init__(self, lid):
        self.ledger_id, self.entries = lid, []

    async def add_entry(self, data):
        self.entries.append(data)

    async def close(self):
        pass

    async def read(self, first, last):
        return self.entries[first:last + 1]


class _BK:
    def __init__(self):
        self.ledgers, self.next = {}, 10

    async def create_ledger(self, e, w, a, custom=None):
        self.next += 1
        lh = self.ledgers[self.next] = _Ledger(self.next)
        return lh

    async def open_ledger(self, lid, recovery=True):
        await asyncio.sleep(0)
        if lid not in self.ledgers:
            raise BKNoSuchLedgerError(f"ledger {lid} does not exist")
        return self.ledgers[lid]

    async def delete_ledger(self, lid):
        self.ledgers.pop(lid, None)


def test_the_cache_holds_only_what_is_in_use():
    """_data (a cache of immutable schemas) drops a schema id's entries when it is forgotten (its
    topic unloaded) or force-deleted."""
    async def main():
        reg = S.SchemaRegistry(_Store(), _BK())
        await reg.put_if_absent("t/n/a", sd(rec(INT_X)), "FULL")
        await asyncio.gather(reg.put_if_absent("t/n/a", sd(rec(INT_X, Y_DEFAULT)), "FULL"),
                             reg.put_if_absent("t/n/b", sd(rec(INT_X)), "FULL"))
        assert len(reg._data) == 3
        reg.forget("t/n/a")
        assert len(reg._data) == 1
        assert [s.version for s in await reg.get_all("t/n/a")] == [0, 1]     # read again from the ledgers
        assert len(reg._data) == 3
        await reg.delete("t/n/b", force=True)
        assert len(reg._data) == 2
    asyncio.run(main())


# three compatible evolutions of one schema (each adds an optional field)
EVOLVED = [rec(INT_X), rec(INT_X, Y_DEFAULT), rec(INT_X, Y_DEFAULT, {"name": "z", "type": ["null", "int"], "default": None})]


@pytest.mark.parametrize("cas", [True, False])
def test_concurrent_writers_on_one_registry_race_through_the_compare_and_set(cas):
    """No lock orders writers (Pulsar has none): three new schemas brought to one broker at once each
    get their own version with the compare-and-set; without it (broker.schema_no_cas) two get the
    same version number and the locator keeps only one of them."""
    async def main():
        store, bk = _Store(), _BK()
        reg = S.SchemaRegistry(store, bk, knobs=Knobs({} if cas else {"broker.schema_no_cas": True}, "broker"))
        got = await asyncio.gather(*(reg.put_if_absent("t/n/a", sd(s), "ALWAYS_COMPATIBLE") for s in EVOLVED))
        index = [(s.version, json.loads(s.schema.data)) for s in await S.SchemaRegistry(store, bk).get_all("t/n/a")]
        return got, index
    got, index = asyncio.run(main())
    if cas:
        assert sorted(got) == [0, 1, 2]
        assert sorted(v for v, _ in index) == [0, 1, 2]
        assert all(dict(index)[v] == EVOLVED[i] for i, v in enumerate(got))     # each writer's own schema
    else:
        assert len(set(got)) < 3                      # one version number given to two schemas
        stored = [schema for _, schema in index]
        assert any(s not in stored for s in EVOLVED)  # and one of them is lost


def test_unloading_a_topic_forgets_its_cached_schemas_unless_a_partition_is_still_loaded():
    from types import SimpleNamespace

    from clusters.broker.service import BrokerService

    class _T:
        async def close(self, reason=""):
            pass
    forgotten = []
    svc = SimpleNamespace(topics={"persistent://t/n/x-partition-0": _T(), "persistent://t/n/x-partition-1": _T(),
                                  "persistent://t/n/y": _T()},
                          schemas=SimpleNamespace(forget=forgotten.append))
    svc._forget_schema = lambda topic: BrokerService._forget_schema(svc, topic)
    asyncio.run(BrokerService._unload_topic(svc, "persistent://t/n/y"))
    asyncio.run(BrokerService._unload_topic(svc, "persistent://t/n/x-partition-0"))
    assert forgotten == ["t/n/y"]
    asyncio.run(BrokerService._unload_topic(svc, "persistent://t/n/x-partition-1"))
    assert forgotten == ["t/n/y", "t/n/x"]


def test_a_writer_meeting_a_force_delete_starts_again_and_a_missing_ledger_is_an_error():
    """Without a lock a writer can read the locator just before a force delete removes it and its
    ledgers: the writer's read of a ledger then fails, the locator has changed, and it starts again
    (the topic has no schema any more: the new one is version 0). A locator whose ledger is gone with
    no change to the locator is a real error, not retried."""
    class _Racing(_BK):
        """The force delete runs while the writer opens the first version's ledger."""
        raced = False

        async def open_ledger(self, lid, recovery=True):
            if not self.raced:
                self.raced = True
                await reg.delete("t/n/a", force=True)
            return await super().open_ledger(lid, recovery)

    store, bk = _Store(), _Racing()
    reg = S.SchemaRegistry(store, bk)

    async def main():
        bk.raced = True
        await reg.put_if_absent("t/n/a", sd(rec(INT_X)), "FULL")
        reg.forget("t/n/a")                                     # the writer reads the ledger from BookKeeper
        bk.raced = False
        assert await reg.put_if_absent("t/n/a", sd(rec(STR_X)), "FULL") == 0
        assert bk.raced and [s.version for s in await reg.get_all("t/n/a")] == [0]
        reg.forget("t/n/a")
        bk.ledgers.clear()
        with pytest.raises(BKNoSuchLedgerError):
            await reg.put_if_absent("t/n/a", sd(rec(LONG_X)), "ALWAYS_COMPATIBLE")
    asyncio.run(main())


def test_a_force_delete_that_meets_a_new_version_deletes_that_one_too():
    class _Racing(_Store):
        """A writer adds a version between the delete's read of the locator and its delete."""
        raced = False

        async def delete(self, path, version=-1):
            if not self.raced:
                self.raced = True
                await reg.put_if_absent("t/n/a", sd(rec(INT_X, Y_DEFAULT)), "FULL")
            await super().delete(path, version)

    store, bk = _Racing(), _BK()
    reg = S.SchemaRegistry(store, bk)

    async def main():
        await reg.put_if_absent("t/n/a", sd(rec(INT_X)), "FULL")
        assert len(bk.ledgers) == 1
        assert await reg.delete("t/n/a", force=True) is None
        assert store.raced and store.nodes == {} and bk.ledgers == {}     # both versions' ledgers gone
    asyncio.run(main())
