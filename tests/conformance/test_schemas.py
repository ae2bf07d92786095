"""The schema registry through the official client, the admin API and the wire: versions stored and
checked as Pulsar's SchemaRegistryServiceImpl does, the namespace's compatibility strategy (FULL by
default), the version every message carries.

References: https://pulsar.apache.org/docs/schema-understand/ and schema-evolution-compatibility/
(strategies, FULL default), https://pulsar.apache.org/admin-rest-api/#tag/schemas (paths and
bodies), SchemaRegistryServiceImpl / AvroSchemaBasedCompatibilityCheck (the checks),
AbstractTopic.addSchema and PersistentTopic.addSchemaIfIdleOrCheckCompatible (producers, consumers).
"""
from __future__ import annotations

import json
import socket
import time
import uuid

import pulsar
import pytest
from pulsar.schema import Integer, JsonSchema, Record, String, StringSchema

from clusters.protocol import PulsarApi_pb2 as pb
from clusters.protocol import frames as f
from tests.conformance.conftest import rest_path


class V1(Record):
    _sorted_fields = True
    x = Integer()


class V2(Record):                       # V1 plus a field with a default: FULL-compatible
    _sorted_fields = True
    x = Integer()
    label = String(required_default=True)


class Clash(Record):                    # x changes type: neither can read the other
    _sorted_fields = True
    x = String()


def _same_name(cls, name="Rec"):
    """Avro matches records by name; the clients name the record after its class."""
    cls.__name__ = name
    return cls


for _c in (V1, V2, Clash):
    _same_name(_c)


def schema_path(topic: str) -> str:
    return "/admin/v2/schemas/" + topic.split("://", 1)[1]


def ns_topic(namespace: str) -> str:
    return f"persistent://{namespace}/s-{uuid.uuid4().hex[:8]}"


def test_incompatible_producer_refused_under_full_accepted_under_always_compatible(client, admin, namespace):
    """FULL (the default strategy): a producer whose JSON schema changes a field's type, or one of
    another schema type, is refused with IncompatibleSchema; the same producer is accepted once the
    namespace's strategy is ALWAYS_COMPATIBLE, as a new version."""
    topic = ns_topic(namespace)
    p1 = client.create_producer(topic, schema=JsonSchema(V1))
    p1.send(V1(x=1))
    with pytest.raises(pulsar.IncompatibleSchema):
        client.create_producer(topic, schema=JsonSchema(Clash))
    with pytest.raises(pulsar.IncompatibleSchema):
        client.create_producer(topic, schema=StringSchema())
    got = admin.ok("GET", schema_path(topic) + "/schema")
    assert got["version"] == 0 and got["type"] == "JSON", got
    assert json.loads(got["data"])["fields"][0]["name"] == "x"

    admin.ok("POST", f"/admin/v2/namespaces/{namespace}/schemaCompatibilityStrategy", "ALWAYS_COMPATIBLE")
    assert admin.ok("GET", f"/admin/v2/namespaces/{namespace}/schemaCompatibilityStrategy") == "ALWAYS_COMPATIBLE"
    p2 = client.create_producer(topic, schema=JsonSchema(Clash))
    p2.send(Clash(x="one"))
    got = admin.ok("GET", schema_path(topic) + "/schemas")["getSchemaResponses"]
    assert [(s["version"], s["type"]) for s in got] == [(0, "JSON"), (1, "JSON")]
    assert json.loads(got[1]["data"])["fields"][0]["type"] == ["null", "string"]
    p1.close()
    p2.close()


def test_compatible_evolution_and_the_version_on_every_message(client, admin, topic):
    """Under FULL a version that adds a field with a default is accepted; each producer's messages
    carry its schema's version (8 bytes, big-endian, as LongSchemaVersion), the same schema again
    gets its existing version back, and a producer without a schema is accepted (schema validation
    is not enforced by default)."""
    c = client.subscribe(topic, "sub", schema=JsonSchema(V1))
    p1 = client.create_producer(topic, schema=JsonSchema(V1))
    p2 = client.create_producer(topic, schema=JsonSchema(V2))
    p3 = client.create_producer(topic, schema=JsonSchema(V1))          # an existing version
    raw = client.create_producer(topic)                                  # BYTES: no schema
    p1.send(V1(x=1))
    p2.send(V2(x=2, label="b"))
    p3.send(V1(x=3))
    versions = []
    for want in (1, 2, 3):
        m = c.receive(10000)
        assert m.value().x == want
        v = m.schema_version()                  # the client hands the bytes back as a str
        versions.append(v.encode("latin-1") if isinstance(v, str) else v)
        c.acknowledge(m)
    assert versions == [(0).to_bytes(8, "big"), (1).to_bytes(8, "big"), (0).to_bytes(8, "big")], versions
    listed = admin.ok("GET", schema_path(topic) + "/schemas")["getSchemaResponses"]
    assert [s["version"] for s in listed] == [0, 1]
    assert admin.ok("GET", schema_path(topic) + "/schema/1")["version"] == 1
    for p in (p1, p2, p3, raw):
        p.close()
    c.close()


def test_schema_validation_enforced_refuses_a_producer_without_schema(client, admin, namespace):
    """schemaValidationEnforced: a producer without a schema is refused on a topic that has one
    (AbstractTopic: "Producers cannot connect or send message without a schema ..."); off, it is
    accepted."""
    topic = ns_topic(namespace)
    client.create_producer(topic, schema=JsonSchema(V1)).close()
    client.create_producer(topic).close()                   # not enforced: accepted
    admin.ok("POST", f"/admin/v2/namespaces/{namespace}/schemaValidationEnforced", True)
    with pytest.raises(pulsar.IncompatibleSchema):
        client.create_producer(topic)


def test_consumer_schema_checked_against_the_stored_one(client, topic):
    """A consumer's schema must read the latest version (checkConsumerCompatibility: BACKWARD under
    FULL); on an idle topic without a schema it becomes the first version."""
    c1 = client.subscribe(topic, "a", schema=JsonSchema(V1))      # idle topic: stores version 0
    with pytest.raises(pulsar.IncompatibleSchema):
        client.subscribe(topic, "b", schema=JsonSchema(Clash))
    c2 = client.subscribe(topic, "c", schema=JsonSchema(V2))      # reads V1's data (default)
    p = client.create_producer(topic, schema=JsonSchema(V1))       # matches version 0
    p.send(V1(x=7))
    assert c2.receive(10000).value().x == 7
    for x in (c1, c2, p):
        x.close()


def test_admin_schema_paths(admin, namespace):
    """/admin/v2/schemas/{t}/{ns}/{topic}/...: 404 before any schema; POST stores a version (409 if
    incompatible, 422 if the definition is not a schema); /compatibility tests without storing;
    /version finds a schema's version; DELETE writes a deleted version, after which the topic has
    no schema and any new one is accepted as the next version."""
    topic = ns_topic(namespace)
    base = schema_path(topic)
    status, body = admin.get(base + "/schema")
    assert status == 404 and "Schema not found" in body["reason"]
    v1 = {"type": "JSON", "schema": JsonSchema(V1).schema_info().schema(), "properties": {"k": "v"}}
    clash = {"type": "JSON", "schema": JsonSchema(Clash).schema_info().schema(), "properties": {}}
    assert admin.ok("POST", base + "/schema", v1) == {"version": {"version": 0}}
    assert admin.ok("POST", base + "/schema", v1) == {"version": {"version": 0}}      # already there
    got = admin.ok("GET", base + "/schema")
    assert got["properties"] == {"k": "v"} and got["version"] == 0
    status, body = admin.post(base + "/schema", clash)
    assert status == 409 and "Incompatible schema" in body["reason"], body
    status, body = admin.post(base + "/schema", {"type": "AVRO", "schema": "{not a schema", "properties": {}})
    assert status == 422 and "Invalid schema definition" in body["reason"], body
    status, body = admin.post(base + "/schema", {"type": "NOPE", "schema": ""})
    assert status == 400 and "unknown schema type" in body["reason"]
    assert admin.ok("POST", base + "/compatibility", clash) == {
        "isCompatibility": False, "schemaCompatibilityStrategy": "FULL"}
    v2 = {"type": "JSON", "schema": JsonSchema(V2).schema_info().schema(), "properties": {}}
    assert admin.ok("POST", base + "/compatibility", v2)["isCompatibility"] is True
    assert admin.ok("POST", base + "/version", v1) == {"version": 0}
    assert admin.ok("POST", base + "/version", v2) == {"version": -1}
    status, body = admin.get(base + "/schema/7")
    assert status == 404
    status, body = admin.get(base + "/schema/x")
    assert status == 400
    assert admin.ok("DELETE", base + "/schema") == {"version": 1}
    assert admin.get(base + "/schema")[0] == 404
    assert admin.ok("POST", base + "/schema", clash) == {"version": {"version": 2}}   # no check after a delete
    assert admin.ok("GET", base + "/schema", broker=1)["version"] == 2                 # every broker agrees
    admin.ok("DELETE", base + "/schema?force=true")
    assert admin.get(base + "/schema")[0] == 404
    assert admin.ok("GET", base + "/schemas")["getSchemaResponses"] == []
    status, body = admin.post(f"/admin/v2/namespaces/{namespace}/schemaCompatibilityStrategy", "SOMETIMES")
    assert status == 400 and "schema_compatibility_strategy" in body["reason"]


class _Raw:
    """A bare protocol connection to a broker (for the commands the Python client does not expose)."""

    def __init__(self, url: str):
        host, port = url.split("://", 1)[1].rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.dec = f.FrameDecoder()
        self.queue: list = []
        c = pb.BaseCommand(type=pb.BaseCommand.CONNECT)
        c.connect.client_version = "raw-test"
        c.connect.protocol_version = 19
        self.call(c, pb.BaseCommand.CONNECTED)

    def call(self, cmd, want):
        self.sock.sendall(f.encode_command(cmd))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            while self.queue:
                got, _ = self.queue.pop(0)
                if got.type == want:
                    return got
            self.queue.extend(self.dec.feed(self.sock.recv(1 << 16)))
        raise TimeoutError(want)

    def close(self):
        self.sock.close()


def test_get_schema_and_get_or_create_schema_on_the_wire(client, admin, topic):
    """GET_SCHEMA answers the latest (or the asked) version, TopicNotFound "Topic not found or
    no-schema" without one; GET_OR_CREATE_SCHEMA adds a version as a producer would, refusing an
    incompatible one with IncompatibleSchema (ServerCnx.handleGetSchema / handleGetOrCreateSchema)."""
    T = pb.BaseCommand
    client.create_producer(topic).close()              # the topic exists, without a schema
    owner = admin.ok("GET", f"/lookup/v2/topic/{rest_path(topic)}")["brokerUrl"]
    raw = _Raw(owner)
    try:
        g = T(type=T.GET_SCHEMA)
        g.getSchema.request_id = 1
        g.getSchema.topic = topic
        r = raw.call(g, T.GET_SCHEMA_RESPONSE).getSchemaResponse
        assert r.error_code == pb.TopicNotFound and "no-schema" in r.error_message
        c = T(type=T.GET_OR_CREATE_SCHEMA)
        c.getOrCreateSchema.request_id = 2
        c.getOrCreateSchema.topic = topic
        c.getOrCreateSchema.schema.name = "x"
        c.getOrCreateSchema.schema.type = pb.Schema.Json
        c.getOrCreateSchema.schema.schema_data = JsonSchema(V1).schema_info().schema().encode()
        r = raw.call(c, T.GET_OR_CREATE_SCHEMA_RESPONSE).getOrCreateSchemaResponse
        assert not r.HasField("error_code") and r.schema_version == (0).to_bytes(8, "big")
        c.getOrCreateSchema.request_id = 3
        c.getOrCreateSchema.schema.schema_data = JsonSchema(Clash).schema_info().schema().encode()
        r = raw.call(c, T.GET_OR_CREATE_SCHEMA_RESPONSE).getOrCreateSchemaResponse
        assert r.error_code == pb.IncompatibleSchema and "Incompatible schema" in r.error_message
        g.getSchema.request_id = 4
        r = raw.call(g, T.GET_SCHEMA_RESPONSE).getSchemaResponse
        assert r.schema.type == pb.Schema.Json and r.schema_version == (0).to_bytes(8, "big")
        g.getSchema.request_id = 5
        g.getSchema.schema_version = (3).to_bytes(8, "big")
        r = raw.call(g, T.GET_SCHEMA_RESPONSE).getSchemaResponse
        assert r.error_code == pb.TopicNotFound
    finally:
        raw.close()
