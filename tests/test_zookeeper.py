"""The ZooKeeper launcher and the asyncio metadata store against a real ZooKeeper."""
import asyncio

import pytest

from clusters import zookeeper
from clusters.metadata.store import BadVersion, MetadataStore, NodeExists, NoNode


def test_zookeeper_answers(zk_server):
    assert zookeeper.mode(zk_server.node.host, zk_server.node.client_port) == "standalone"


def test_metadata_store_cas_and_ephemerals(zk):
    async def scenario():
        a = await MetadataStore(zk, name="a").start()
        b = await MetadataStore(zk, name="b").start()
        try:
            await a.create("/x/y", b"1")
            data, ver = await a.get("/x/y")
            assert data == b"1"
            v2 = await a.set("/x/y", b"2", ver)
            with pytest.raises(BadVersion):
                await b.set("/x/y", b"3", ver)          # stale version loses the race
            assert (await b.get("/x/y")) == (b"2", v2)
            with pytest.raises(NodeExists):
                await b.create("/x/y", b"")
            await a.create("/owners/t", b"a", ephemeral=True)
            assert await b.owner_session("/owners/t") == a.session_id
            seq = await a.create("/ids/id-", sequence=True)
            assert seq.startswith("/ids/id-")
        finally:
            await a.close()
        # a's session closed: its ephemeral node is gone, persistent ones stay
        try:
            with pytest.raises(NoNode):
                await b.get("/owners/t")
            assert await b.exists("/x/y")
        finally:
            await b.close()
    asyncio.run(scenario())
