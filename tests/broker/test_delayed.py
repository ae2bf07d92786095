"""Delayed delivery on a Shared subscription (clusters/broker/delayed.py) without a network, and its bug
knob `broker.delayed_index_in_memory`, read through the topic's knobs: a delayed entry stays outstanding
(the cursor's mark-delete position does not pass it) until it is delivered and acknowledged; with the
knob it counts as consumed for the cursor while it waits, which is what a crash then loses."""
from __future__ import annotations

import asyncio
import time

import pytest

from clusters.protocol import PulsarApi_pb2 as pb
from clusters.protocol import frames
from tests.broker.helpers import FakeCnx, run
from tests.broker.memory import MemoryBrokerService

SHARED = 1
DELAY_MS = 400


def _send(topic, producer, seq: int, deliver_at: int = 0) -> None:
    md = pb.MessageMetadata(producer_name=producer.name, sequence_id=seq, publish_time=int(time.time() * 1000))
    if deliver_at:
        md.deliver_at_time = deliver_at
    topic.publish(producer, seq, seq, frames.build_entry(md, b"payload"), md)


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def _scenario(bugs: dict) -> dict:
    svc = MemoryBrokerService()
    svc.config.bugs = bugs
    topic = await svc.get_topic("persistent://public/default/t")
    cnx = FakeCnx()
    p = await topic.add_producer(cnx, 0, "p")
    cmd = pb.CommandSubscribe(topic=topic.name, subscription="s", subType=SHARED, consumer_id=1, request_id=0,
                              initialPosition=pb.CommandSubscribe.Earliest)
    c = await topic.subscribe(cnx, cmd)
    c.sub.flow(c, 100)
    _send(topic, p, 0)
    _send(topic, p, 1, deliver_at=int(time.time() * 1000) + DELAY_MS)
    _send(topic, p, 2)
    await _settle()
    positions = [r[2] for r in cnx.receipts]
    out = {"knob": topic.knobs.on("broker.delayed_index_in_memory"),
           "at_once": [m[1] for m in cnx.messages]}
    c.sub.ack_individual(out["at_once"])
    out["mark_delete_while_waiting"] = c.sub.mark_delete
    for _ in range(40):                         # bounded: 2 s for a 0.4 s delay
        await asyncio.sleep(0.05)
        if len(cnx.messages) == 3:
            break
    out["later"] = [m[1] for m in cnx.messages[len(out["at_once"]):]]
    c.sub.ack_individual(out["later"])
    out["mark_delete_at_end"] = c.sub.mark_delete
    out["positions"] = positions
    await topic.close()
    return out


@pytest.mark.parametrize("knob", [False, True])
def test_a_delayed_entry_waits_and_only_the_knob_lets_the_cursor_pass_it(knob):
    got = run(_scenario({"broker.delayed_index_in_memory": True} if knob else {}))
    first, delayed, last = got["positions"]
    assert got["knob"] is knob
    assert got["at_once"] == [first, last]                # the delayed one is held back
    assert got["later"] == [delayed]                      # and delivered when its time comes
    # acknowledged 0 and 2 while 1 waits: the cursor keeps 1 unless the knob is on
    assert got["mark_delete_while_waiting"] == (last if knob else first)
    assert got["mark_delete_at_end"] == last
