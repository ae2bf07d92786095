"""The schema registry: every schema version of a topic, stored as Pulsar's BookkeeperSchemaStorage
keeps them, checked as SchemaRegistryServiceImpl checks them.

Storage. A topic's schemas (its *schema id* `tenant/namespace/topic`, partitions share their
partitioned topic's) are a list of versions 0, 1, 2... Each version is one BookKeeper ledger holding
one entry (the schema: type, definition, properties, timestamp, deleted flag; JSON here where Pulsar
writes a protobuf); the *locator* znode `/schemas/{tenant}/{namespace}/{topic}` indexes them
(`{"index": [{"version", "ledger", "entry", "hash"}...]}`). A new version is: read the locator,
decide (the same schema already there answers its version; else the compatibility check), write the
ledger, then compare-and-set the locator on the version read; a writer that loses the race deletes
its ledger and starts again from the new locator (Pulsar's BookkeeperSchemaStorage.putSchema). As in
Pulsar there is no lock beside it: two producers bringing new schemas to one owner at once, or two
brokers (an old and a new owner during a takeover), race through that compare-and-set, so they can
never give the same version number to two schemas. The bug knob `broker.schema_no_cas` writes the
locator without the version check.
Every read goes to ZooKeeper (the locator) and BookKeeper (cached per ledger: a version never
changes), so every broker answers the same versions.

Checks (SchemaRegistryServiceImpl.checkCompatible and the SchemaCompatibilityCheck classes):
- a schema equal to one after the last deletion gets that version back, no check;
- the namespace's strategy (FULL unless set): ALWAYS_COMPATIBLE accepts anything,
  ALWAYS_INCOMPATIBLE refuses every new version; otherwise a new version of another type is
  refused ("Incompatible schema: exists schema type JSON, new schema type STRING"); AVRO, JSON and
  PROTOBUF definitions are compared with Avro schema resolution (avro_compat.py): BACKWARD (the
  new can read the old), FORWARD (the old can read the new), FULL (both), against the latest
  version or, for the _TRANSITIVE forms, every version since the last deletion; other types of
  the same type are compatible;
- deleting (`DELETE .../schema`) adds a *deleted* version: the topic has no schema, and the next one
  is accepted without a check; `?force=true` removes the locator and every ledger.
"""
from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from clusters.broker import avro_compat
from clusters.broker.partitions import base_name
from clusters.broker.policies import SCHEMA_STRATEGIES
from clusters.bugs import Knobs
from clusters.bookkeeper.errors import BKNoSuchEntryError, BKNoSuchLedgerError
from clusters.metadata.store import BadVersion, NodeExists, NoNode

log = logging.getLogger(__name__)

SCHEMAS_ROOT = "/schemas"

# Java's SchemaType names by the wire enum (PulsarApi.proto Schema.Type); BYTES is -1 (never on the wire:
# a producer without a schema sends none)
TYPE_NAMES = {0: "NONE", 1: "STRING", 2: "JSON", 3: "PROTOBUF", 4: "AVRO", 5: "BOOLEAN", 6: "INT8",
              7: "INT16", 8: "INT32", 9: "INT64", 10: "FLOAT", 11: "DOUBLE", 12: "DATE", 13: "TIME",
              14: "TIMESTAMP", 15: "KEY_VALUE", 16: "INSTANT", 17: "LOCAL_DATE", 18: "LOCAL_TIME",
              19: "LOCAL_DATE_TIME", 20: "PROTOBUF_NATIVE", -1: "BYTES"}
TYPE_VALUES = {v: k for k, v in TYPE_NAMES.items()}
AVRO_BASED = {"AVRO", "JSON", "PROTOBUF"}

STRATEGIES = SCHEMA_STRATEGIES
DEFAULT_STRATEGY = "FULL"          # the broker's schemaCompatibilityStrategy default


class SchemaError(Exception):
    """Refused; `kind` says how the caller reports it."""
    kind = "incompatible"


class IncompatibleSchema(SchemaError):
    kind = "incompatible"


class InvalidSchemaData(SchemaError):
    kind = "invalid"


class SchemaStorageError(SchemaError):
    kind = "storage"


def schema_id(topic: str) -> str:
    """`persistent://t/ns/x-partition-3` -> `t/ns/x` (Pulsar's TopicName.getSchemaName)."""
    name = base_name(topic)
    return name.split("://", 1)[-1]


def locator_path(sid: str) -> str:
    return f"{SCHEMAS_ROOT}/{sid}"


def version_bytes(v: int) -> bytes:
    return int(v).to_bytes(8, "big", signed=True)


def version_from_bytes(b: bytes) -> int:
    if len(b) != 8:
        raise ValueError(f"a schema version is 8 bytes, got {len(b)}")
    return int.from_bytes(b, "big", signed=True)


@dataclass
class SchemaData:
    type: str                                # a TYPE_NAMES value
    data: bytes = b""
    props: dict[str, str] = field(default_factory=dict)
    timestamp: int = 0
    deleted: bool = False
    user: str = ""

    def hash(self) -> str:
        """SchemaHash: SHA-256 of the type and the definition."""
        return hashlib.sha256(self.type.encode() + b"\0" + self.data).hexdigest()

    def same_as(self, other: "SchemaData") -> bool:
        """Pulsar's getSchemaVersionBySchemaData: Avro-parsed types compare as parsed schemas
        (whitespace and key order do not matter), others by hash."""
        if self.type != other.type:
            return False
        if self.type in AVRO_BASED:
            try:
                return json.loads(self.data) == json.loads(other.data)
            except ValueError:
                pass
        return self.data == other.data

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "data": base64.b64encode(self.data).decode(), "props": self.props,
                "timestamp": self.timestamp, "deleted": self.deleted, "user": self.user}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> "SchemaData":
        return cls(raw["type"], base64.b64decode(raw.get("data", "")), dict(raw.get("props") or {}),
                   int(raw.get("timestamp", 0)), bool(raw.get("deleted", False)), str(raw.get("user", "")))


@dataclass
class StoredSchema:
    version: int
    schema: SchemaData


def validate(schema: SchemaData) -> None:
    """StructSchemaDataValidator: an AVRO/JSON/PROTOBUF definition must be an Avro schema."""
    if schema.type in AVRO_BASED:
        try:
            avro_compat.parse(schema.data)
        except avro_compat.SchemaParseError as e:
            raise InvalidSchemaData(f"Invalid schema definition data for {schema.type} schema: {e}") from None
    elif schema.type not in TYPE_VALUES:
        raise InvalidSchemaData(f"unknown schema type {schema.type}")


def check_compatible(existing: list[SchemaData], new: SchemaData, strategy: str) -> None:
    """Raise IncompatibleSchema unless `new` may follow `existing` (oldest first, after the last
    deletion: the latest alone for the non-transitive strategies) under `strategy`."""
    if not existing or strategy == "ALWAYS_COMPATIBLE":
        return
    if strategy == "ALWAYS_INCOMPATIBLE":
        raise IncompatibleSchema("Schema compatibility strategy is ALWAYS_INCOMPATIBLE: "
                                 "no new schema version is accepted")
    transitive = strategy.endswith("_TRANSITIVE")
    against = existing if transitive else existing[-1:]
    base = strategy.replace("_TRANSITIVE", "")
    for old in against:
        if old.type != new.type:
            raise IncompatibleSchema(f"Incompatible schema: exists schema type {old.type}, "
                                     f"new schema type {new.type}")
        if old.hash() == new.hash() or new.type not in AVRO_BASED:
            continue
        try:
            old_s, new_s = avro_compat.parse(old.data), avro_compat.parse(new.data)
        except avro_compat.SchemaParseError as e:
            raise IncompatibleSchema(f"Incompatible schema: {e}") from None
        if base in ("BACKWARD", "FULL"):
            err = avro_compat.reader_writer_error(new_s, old_s)
            if err:
                raise IncompatibleSchema(f"Incompatible schema: the new schema cannot read data written "
                                         f"with an existing one ({base} check): {err}")
        if base in ("FORWARD", "FULL"):
            err = avro_compat.reader_writer_error(old_s, new_s)
            if err:
                raise IncompatibleSchema(f"Incompatible schema: an existing schema cannot read data "
                                         f"written with the new one ({base} check): {err}")


def since_last_delete(stored: list[StoredSchema]) -> list[StoredSchema]:
    """trimDeletedSchemaAndGetList: the versions after the last deletion ([] if the latest is one)."""
    for i in range(len(stored) - 1, -1, -1):
        if stored[i].schema.deleted:
            return stored[i + 1:]
    return stored


class SchemaRegistry:
    """One broker's view of the registry (ZooKeeper `store`, BookKeeper `bk`)."""

    def __init__(self, store: Any, bk: Any, *, persistence: Any = None, knobs: Knobs | None = None):
        self.store = store
        self.bk = bk
        self.persistence = persistence or (lambda sid: (2, 2, 2))
        # the broker's bug knobs (clusters/bugs.py); None: all safe
        self.knobs = knobs if knobs is not None else Knobs.defaults("broker")
        self.cas = not self.knobs.on("broker.schema_no_cas")
        self._data: dict[int, SchemaData] = {}            # ledger id -> its schema (immutable), a cache
        self._lids: dict[str, set[int]] = {}              # schema id -> its ledgers in _data

    # -- reading ----------------------------------------------------------------------
    async def _locator(self, sid: str) -> tuple[list[dict[str, Any]], int | None]:
        got = await self.store.get_or_none(locator_path(sid))
        if got is None:
            return [], None
        try:
            raw = json.loads(got[0] or b"{}")
        except ValueError:
            raw = {}
        return list(raw.get("index") or []), got[1]

    async def _read(self, item: dict[str, Any], sid: str = "") -> SchemaData:
        lid = int(item["ledger"])
        hit = self._data.get(lid)
        if hit is not None:
            return hit
        rh = await self.bk.open_ledger(lid, recovery=False)
        entries = await rh.read(int(item.get("entry", 0)), int(item.get("entry", 0)))
        sd = SchemaData.from_json(json.loads(entries[0]))
        self._cache(sid, lid, sd)
        return sd

    def _cache(self, sid: str, lid: int, sd: SchemaData) -> None:
        self._data[lid] = sd
        self._lids.setdefault(sid, set()).add(lid)

    def forget(self, sid: str) -> None:
        """Drop the cached schemas of `sid` (its topic unloaded, or its schema deleted): the cache
        holds only what this broker serves; a later read opens the ledgers again."""
        for lid in self._lids.pop(sid, ()):
            self._data.pop(lid, None)

    async def get_all(self, sid: str) -> list[StoredSchema]:
        index, _ = await self._locator(sid)
        return [StoredSchema(int(i["version"]), await self._read(i, sid)) for i in index]

    async def get(self, sid: str, version: int | None = None) -> StoredSchema | None:
        """The latest version (None if there is none or it is a deletion), or the given version
        (None if it does not exist or is at or before the last deletion)."""
        stored = await self.get_all(sid)
        if version is None:
            if not stored or stored[-1].schema.deleted:
                return None
            return stored[-1]
        for s in since_last_delete(stored):
            if s.version == version:
                return s
        return None

    async def has_schema(self, sid: str) -> bool:
        return await self.get(sid) is not None

    async def find_version(self, sid: str, schema: SchemaData) -> int | None:
        for s in since_last_delete(await self.get_all(sid)):
            if s.schema.same_as(schema):
                return s.version
        return None

    # -- checking ---------------------------------------------------------------------
    async def check_compatible(self, sid: str, schema: SchemaData, strategy: str) -> None:
        validate(schema)
        live = [s.schema for s in since_last_delete(await self.get_all(sid))]
        if any(s.same_as(schema) for s in live):
            return
        check_compatible(live, schema, strategy)

    async def check_consumer_compatibility(self, sid: str, schema: SchemaData, strategy: str) -> None:
        """checkConsumerCompatibility: a consumer's schema must read the latest (BACKWARD) under the
        non-transitive strategies, or every version under the others."""
        validate(schema)
        if strategy == "ALWAYS_COMPATIBLE":
            return
        live = [s.schema for s in since_last_delete(await self.get_all(sid))]
        if not live:
            raise IncompatibleSchema("Topic does not have schema to check")
        if any(s.same_as(schema) for s in live):
            return
        if strategy in ("BACKWARD", "FORWARD", "FORWARD_TRANSITIVE", "FULL"):
            check_compatible(live[-1:], schema, "BACKWARD")
        else:
            check_compatible(live, schema, strategy)

    # -- writing ----------------------------------------------------------------------
    async def put_if_absent(self, sid: str, schema: SchemaData, strategy: str, *,
                            allow_auto_update: bool = True) -> int:
        """The version of `schema`: an existing equal one, else a new one if compatible."""
        validate(schema)
        for _ in range(20):
            index, zversion = await self._locator(sid)
            try:
                stored = [StoredSchema(int(i["version"]), await self._read(i, sid)) for i in index]
            except (BKNoSuchLedgerError, BKNoSuchEntryError):
                if (await self._locator(sid))[1] == zversion:
                    raise                   # the locator names a ledger that is gone: not a race
                continue                    # a force delete removed them meanwhile: start again
            live = since_last_delete(stored)
            for s in live:
                if s.schema.same_as(schema):
                    return s.version
            if not allow_auto_update:
                raise IncompatibleSchema("Schema not found and schema auto updating is disabled.")
            check_compatible([s.schema for s in live], schema, strategy)
            schema.timestamp = int(time.time() * 1000)
            new = await self._append(sid, index, zversion, schema)
            if new is not None:
                return new
        raise SchemaStorageError(f"could not store a schema for {sid}: too many concurrent writers")

    async def delete(self, sid: str, *, force: bool = False, user: str = "") -> int | None:
        """Delete the schema: a deleted version (its number returned), or with `force` the whole
        storage (None). Returns None also when there was nothing to delete."""
        if force:
            for _ in range(20):
                index, zversion = await self._locator(sid)
                if zversion is None:
                    return None
                try:
                    await self.store.delete(locator_path(sid), version=zversion if self.cas else -1)
                except NoNode:
                    return None
                except BadVersion:
                    continue                    # a version added meanwhile: its ledger goes too
                self.forget(sid)
                for i in index:
                    try:
                        await self.bk.delete_ledger(int(i["ledger"]))
                    except Exception as e:  # noqa: BLE001 - a leaked ledger, not a lost schema
                        log.warning("schema %s: deleting ledger %s: %s", sid, i["ledger"], e)
                return None
            raise SchemaStorageError(f"could not delete the schema of {sid}: too many concurrent writers")
        for _ in range(20):
            index, zversion = await self._locator(sid)
            if not index:
                return None
            new = await self._append(sid, index, zversion,
                                     SchemaData("NONE", b"", {}, int(time.time() * 1000), True, user))
            if new is not None:
                return new
        raise SchemaStorageError(f"could not delete the schema of {sid}: too many concurrent writers")

    async def _append(self, sid: str, index: list[dict[str, Any]], zversion: int | None,
                      schema: SchemaData) -> int | None:
        """Write `schema` as the version after `index`; None when the locator changed meanwhile."""
        version = (int(index[-1]["version"]) + 1) if index else 0
        e, w, a = self.persistence(sid)
        lh = await self.bk.create_ledger(e, w, a, custom={"application": "pulsar", "component": "schema",
                                                        "pulsar/schemaId": sid})
        try:
            await lh.add_entry(json.dumps({"schema_id": sid, "version": version,
                                           **schema.to_json()}).encode())
            await lh.close()
        except Exception as e:
            await self._drop_ledger(lh.ledger_id)
            raise SchemaStorageError(f"writing schema version {version} of {sid}: {e}") from e
        lid = lh.ledger_id
        item = {"version": version, "ledger": lid, "entry": 0, "hash": schema.hash()}
        data = json.dumps({"index": index + [item]}).encode()
        path = locator_path(sid)
        try:
            if zversion is None:
                if self.cas:
                    await self.store.create(path, data, makepath=True)
                else:
                    try:
                        await self.store.create(path, data, makepath=True)
                    except NodeExists:
                        await self.store.set(path, data)
            else:
                await self.store.set(path, data, version=zversion if self.cas else -1)
        except (BadVersion, NodeExists, NoNode):
            log.info("schema %s: the locator changed while writing version %d; retrying", sid, version)
            await self._drop_ledger(lid)
            return None
        except Exception as e:
            # the outcome is unknown: the ledger stays (a leak at worst), the caller fails
            raise SchemaStorageError(f"storing schema version {version} of {sid}: {e}") from e
        self._cache(sid, lid, schema)
        log.info("schema %s: version %d (%s) stored in ledger %d", sid, version, schema.type, lid)
        return version

    async def _drop_ledger(self, lid: int) -> None:
        try:
            await self.bk.delete_ledger(lid)
        except Exception as e:  # noqa: BLE001
            log.warning("deleting schema ledger %d: %s", lid, e)


class MemorySchemaRegistry(SchemaRegistry):
    """The same registry over a dict (the in-memory test broker has no ZooKeeper or BookKeeper)."""

    def __init__(self) -> None:
        super().__init__(None, None)
        self._index: dict[str, tuple[list[dict[str, Any]], int]] = {}
        self._next = 1

    async def _locator(self, sid: str) -> tuple[list[dict[str, Any]], int | None]:
        got = self._index.get(sid)
        return (list(got[0]), got[1]) if got else ([], None)

    async def _read(self, item: dict[str, Any], sid: str = "") -> SchemaData:
        return self._data[int(item["ledger"])]

    def forget(self, sid: str) -> None:
        pass                                              # _data is the storage here, not a cache

    async def _append(self, sid, index, zversion, schema) -> int | None:
        cur = self._index.get(sid)
        if (cur[1] if cur else None) != zversion:
            return None
        version = (int(index[-1]["version"]) + 1) if index else 0
        lid = self._next
        self._next += 1
        self._data[lid] = schema
        self._index[sid] = (index + [{"version": version, "ledger": lid, "entry": 0}],
                            (zversion or 0) + 1)
        return version

    async def delete(self, sid: str, *, force: bool = False, user: str = "") -> int | None:
        if force:
            self._index.pop(sid, None)
            return None
        index, zversion = await self._locator(sid)
        if not index:
            return None
        return await self._append(sid, index, zversion, SchemaData("NONE", b"", {}, 0, True, user))


def schema_from_proto(s: Any) -> SchemaData:
    """A wire `Schema` (PulsarApi.proto) as SchemaData."""
    return SchemaData(TYPE_NAMES.get(int(s.type), "NONE"), bytes(s.schema_data),
                      {kv.key: kv.value for kv in s.properties})


def fill_proto(out: Any, sid: str, schema: SchemaData) -> None:
    """Fill a wire `Schema` from SchemaData (the name is the topic's local name, as Pulsar's)."""
    out.name = sid.rsplit("/", 1)[-1]
    out.schema_data = schema.data
    out.type = max(TYPE_VALUES.get(schema.type, 0), 0)
    for k, v in sorted(schema.props.items()):
        kv = out.properties.add()
        kv.key = k
        kv.value = v


def schema_response_json(stored: StoredSchema) -> dict[str, Any]:
    """Pulsar's GetSchemaResponse."""
    s = stored.schema
    try:
        data = s.data.decode()
    except UnicodeDecodeError:
        data = base64.b64encode(s.data).decode()
    return {"version": stored.version, "type": s.type, "timestamp": s.timestamp, "data": data,
            "properties": s.props}
