"""Bundle hashing and lookups against a real ZooKeeper (no brokers needed)."""
import asyncio
import collections

import pytest

from clusters.loadbalancer.bundles import bundle_of, topic_namespace
from clusters.loadbalancer.zk_ownership import ZkOwnership as Ownership
from clusters.loadbalancer.bundles import FULL_UPPER
from clusters.config import BrokerConfig
from clusters.metadata.store import MetadataStore


def test_bundles_cover_the_hash_range_and_spread_topics():
    counts = collections.Counter(bundle_of(f"persistent://public/default/t{i}", 4) for i in range(4000))
    assert len(counts) == 4
    bounds = sorted((b.lower, b.upper) for b in counts)
    assert bounds[0][0] == 0 and bounds[-1][1] == FULL_UPPER
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    assert min(counts.values()) > 700            # crc32 spreads names roughly evenly
    assert bundle_of("persistent://public/default/x", 4) == bundle_of("persistent://public/default/x", 4)


def test_topic_names_are_validated():
    assert topic_namespace("persistent://public/default/a/b") == ("public/default", "a/b")
    with pytest.raises(ValueError):
        topic_namespace("persistent://public")


def test_one_owner_per_bundle_and_redirects(zk):
    async def scenario():
        stores = [await MetadataStore(zk, name=f"b{i}").start() for i in range(2)]
        cfgs = [BrokerConfig(name=f"broker-{i}", host=f"127.0.0.{i + 1}", zk=zk, data_dir="/tmp") for i in range(2)]
        owners = [Ownership(s, c) for s, c in zip(stores, cfgs)]
        try:
            for o in owners:
                await o.start()
            topic = "persistent://public/default/topic-a"
            # Both brokers race to own the bundle authoritatively: exactly one wins, both agree.
            r = await asyncio.gather(*(o.lookup(topic, authoritative=True) for o in owners))
            assert r[0].kind == r[1].kind == "connect"
            assert r[0].url == r[1].url
            assert sum(o.owns(topic) for o in owners) == 1
            # The loser answers with the winner's address.
            winner = next(o for o in owners if o.owns(topic))
            loser = next(o for o in owners if o is not winner)
            assert (await loser.lookup(topic, authoritative=False)).url == f"pulsar://{winner.me}"
            # Without a load manager's choice, a lookup of an unowned bundle takes it here (the load
            # manager's redirects are tested in tests/loadbalancer/).
            other = next(f"persistent://public/default/t{i}" for i in range(100)
                         if owners[0].bundle(f"persistent://public/default/t{i}") != owners[0].bundle(topic))
            res = await owners[0].lookup(other, authoritative=False)
            assert res.kind == "connect" and owners[0].owns(other) and not owners[1].owns(other)
        finally:
            for s in stores:
                await s.close()
        # Sessions closed: ownership znodes are gone, a new broker can take the bundles.
        s = await MetadataStore(zk).start()
        try:
            o = Ownership(s, BrokerConfig(name="broker-9", host="127.0.0.9", zk=zk, data_dir="/tmp"))
            await o.start()
            assert (await o.lookup(topic, authoritative=True)).url == "pulsar://127.0.0.9:6650"
        finally:
            await s.close()
    asyncio.run(scenario())


def test_a_restarted_broker_retakes_its_previous_sessions_lock_instead_of_adopting_it(zk):
    """A broker restarted before its old ZooKeeper session expired finds the bundle lock naming itself
    but held by that session. It must re-create the lock under its new session: adopting it as it is
    let the old session's expiry delete it, another broker take the bundle, and both serve it."""
    async def scenario():
        cfg = BrokerConfig(name="broker-1", host="127.0.0.1", zk=zk, data_dir="/tmp")
        topic = "persistent://public/default/restarted"
        old_store = await MetadataStore(zk, name="old").start()
        old = Ownership(old_store, cfg)
        await old.start()
        assert (await old.lookup(topic, authoritative=True)).kind == "connect"
        bundle = old.bundle(topic)
        new_store = await MetadataStore(zk, name="new").start()        # the restarted process
        other_store = await MetadataStore(zk, name="other").start()
        try:
            new = Ownership(new_store, cfg)
            await new.start()
            assert (await new.lookup(topic, authoritative=True)).kind == "connect" and new.owns(topic)
            assert await new_store.owner_session(bundle.path) == new_store.session_id
            await old_store.close()                                      # the old session ends
            other = Ownership(other_store, BrokerConfig(name="broker-2", host="127.0.0.2", zk=zk, data_dir="/tmp"))
            await other.start()
            assert await other.acquire(bundle) == new.me and not other.owns(topic)
        finally:
            await new_store.close()
            await other_store.close()
    asyncio.run(scenario())


@pytest.mark.parametrize("knob", [False, True])
def test_bug_knob_release_reacquired_lock_gives_a_bundle_two_owners(zk, knob):
    """broker.release_reacquired_lock (apache/pulsar#26197): broker 1's session expires (its bundle lock
    with it) and comes back. With the knob the expired lock starts a background unload; a lookup on
    broker 1 meanwhile acquires the bundle again, and the unload, when its topics are closed, deletes
    that new lock while broker 1 keeps serving: broker 2 acquires the bundle too. Without it broker 1
    re-claims its lock on the new session and broker 2 is redirected to it."""
    async def scenario():
        topic = "persistent://public/default/expired-lock"
        stores = [await MetadataStore(zk, name=f"s{i}").start() for i in range(2)]
        bugs = {"broker.release_reacquired_lock": True} if knob else {}
        cfgs = [BrokerConfig(name=f"broker-{i + 1}", host=f"127.0.0.{i + 1}", zk=zk, data_dir="/tmp", bugs=bugs)
                for i in range(2)]
        unloaded = asyncio.Event()

        async def unload_topics(bundle):                # closing the bundle's topics takes a while
            await asyncio.sleep(0.3)
            unloaded.set()
        one = Ownership(stores[0], cfgs[0], on_lost=unload_topics)
        two = Ownership(stores[1], cfgs[1])
        try:
            for o in (one, two):
                await o.start()
            assert (await one.lookup(topic, authoritative=True)).kind == "connect"
            bundle = one.bundle(topic)
            await stores[1].delete(bundle.path)         # the session expired: its ephemeral lock is gone
            one._on_session("LOST")
            one._on_session("CONNECTED")                # the new session
            await asyncio.sleep(0.05)
            res = await one.lookup(topic, authoritative=True)      # a client looks the topic up again
            assert res.kind == "connect" and res.url == one.cfg.service_url
            if knob:
                await asyncio.wait_for(unloaded.wait(), 5)
            await asyncio.sleep(0.3)
            await two.lookup(topic, authoritative=True)
            owners = [o.cfg.name for o in (one, two) if o.owns(topic)]
            assert owners == (["broker-1", "broker-2"] if knob else ["broker-1"]), owners
        finally:
            for s in stores:
                await s.close()
    asyncio.run(scenario())
