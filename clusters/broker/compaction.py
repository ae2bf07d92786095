"""Topic compaction, as Pulsar's TwoPhaseCompactor: the latest value of every key, in a compacted
ledger that `read_compacted` readers (and table views) read instead of the topic up to the
compaction horizon.

A run reads the previous compacted view (the entries up to the previous horizon) and then the
topic's entries after that horizon, up to the last entry when it starts (the new horizon):
- phase one: the latest message of each key (MessageMetadata.partition_key; in a batch each
  message's SingleMessageMetadata.partition_key) is remembered by (position, batch index); a
  message with an empty payload is a *tombstone* and forgets its key;
- phase two: every entry that holds a latest message is written to a new BookKeeper ledger with its
  original position in front ([8 bytes ledger][8 bytes entry][the stored entry]); a batch keeps only
  its latest messages (Pulsar's RawBatchConverter.rebatchMessage keeps the others flagged
  `compacted_out`, which the C++ client does not skip; so here they are left out, and a retained
  message's batch index in the compacted view is its rank among the retained ones); messages
  without a key are dropped (Pulsar 3.2+'s default `topicCompactionRetainNullKey=false`).
Then, in this order: the ledger is closed, the znode `/compaction/{managed ledger}` is compare-and-set
to `{"ledger", "horizon", "entries"}` (where Pulsar puts the ledger id in the `__compaction`
cursor's properties; our cursors have none), the `__compaction` cursor's mark-delete moves to the
horizon (so retention may now trim what it compacted: until then the cursor holds it), and the
previous compacted ledger is deleted. A crash between any two steps leaves the previous view or the
new one whole. The new ledger is deleted only when the znode surely does not name it (a lost
compare-and-set: BadVersion, NodeExists, NoNode); after any other error (a ZooKeeper timeout may
come after the write was applied) the znode is read again and the ledger kept if it is named there,
or if the znode cannot be read (a leaked ledger at worst, never a znode naming a deleted one). A run
stops when its topic closes (Topic.close cancels it, and a run checks before the znode write), so a
run left over from an unload cannot swap the znode under the next owner. A compressed batch other than ZLIB cannot be rewritten here: the run fails with that
error (status ERROR) and the topic is left as it was.
"""
from __future__ import annotations

import bisect
import json
import logging
import struct
import time
import zlib
from typing import Any

from clusters.broker.managed_ledger import Position
from clusters.metadata.store import BadVersion, NodeExists, NoNode
from clusters.protocol import frames
from clusters.protocol import PulsarApi_pb2 as pb

log = logging.getLogger(__name__)

COMPACTION_CURSOR = "__compaction"
COMPACTION_ROOT = "/compaction"
_POS = struct.Struct(">qq")


class CompactionError(Exception):
    pass


def compaction_path(ml_name: str) -> str:
    return f"{COMPACTION_ROOT}/{ml_name}"


class CompactedView:
    """The compacted ledger in memory: (original position, entry) in position order, and the
    horizon (the last position the compaction read; entries at or before it are served from here)."""

    def __init__(self, ledger_id: int, horizon: Position, entries: list[tuple[Position, bytes]]):
        self.ledger_id = ledger_id
        self.horizon = horizon
        self.entries = entries
        self._keys = [(p.ledger_id, p.entry_id) for p, _ in entries]
        self._by_pos = dict(entries)

    def from_position(self, start: Position | None, n: int) -> list[tuple[Position, bytes]]:
        """Up to n entries at or after `start` (None: from the first)."""
        i = 0 if start is None else bisect.bisect_left(self._keys, (start.ledger_id, start.entry_id))
        return self.entries[i:i + n]

    def get(self, pos: Position) -> bytes | None:
        return self._by_pos.get(pos)

    def last(self) -> Position | None:
        return self.entries[-1][0] if self.entries else None

    def size(self) -> int:
        return sum(len(e) for _, e in self.entries)


async def load_view(store: Any, bk: Any, ml_name: str) -> CompactedView | None:
    """The topic's compacted view as the znode names it (None if it was never compacted)."""
    got = await store.get_or_none(compaction_path(ml_name))
    if got is None:
        return None
    raw = json.loads(got[0] or b"{}")
    lid = int(raw["ledger"])
    horizon = Position(*raw["horizon"])
    entries: list[tuple[Position, bytes]] = []
    n = int(raw.get("entries", 0))
    if n:
        rh = await bk.open_ledger(lid, recovery=False)
        first = 0
        while first < n:
            last = min(n - 1, first + 499)
            for data in await rh.read(first, last):
                l, e = _POS.unpack_from(data)
                entries.append((Position(l, e), bytes(data[_POS.size:])))
            first = last + 1
    return CompactedView(lid, horizon, entries)


def _batch_messages(md: pb.MessageMetadata, payload: bytes) -> list[tuple[pb.SingleMessageMetadata, bytes]]:
    if md.compression == pb.ZLIB:
        payload = zlib.decompress(payload)
    elif md.compression != pb.NONE:
        raise CompactionError(f"cannot rewrite a batch compressed with {pb.CompressionType.Name(md.compression)}: "
                              "this broker only decompresses ZLIB")
    return frames.split_batch(payload, md.num_messages_in_batch)


def _split(entry: bytes) -> tuple[pb.MessageMetadata, bytes]:
    _, _, mstart, mend = frames._metadata_span(entry)
    md = frames.entry_metadata(entry)
    return md, entry[mend:]


def _messages(entry: bytes) -> list[tuple[int, str | None, int]]:
    """(batch index or -1, key or None, payload size) of each live message of an entry."""
    md, payload = _split(entry)
    if not md.HasField("num_messages_in_batch"):
        key = md.partition_key if md.HasField("partition_key") else None
        size = md.uncompressed_size if md.HasField("uncompressed_size") and md.compression != pb.NONE \
            else len(payload)
        if md.null_value:
            size = 0
        return [(-1, key, size)]
    out = []
    for i, (smm, data) in enumerate(_batch_messages(md, payload)):
        if smm.compacted_out:
            continue
        key = smm.partition_key if smm.HasField("partition_key") else None
        out.append((i, key, 0 if smm.null_value else len(data)))
    return out


def _rebatch(entry: bytes, keep: set[int]) -> bytes:
    """The batch entry with only the messages of `keep` (by index), uncompressed. Pulsar keeps the
    others in the batch flagged `compacted_out` (batch indexes unchanged); the C++ client behind the
    Python one delivers such messages (empty), so they are left out here: a retained message's
    batch index in the compacted view is its rank among the retained ones."""
    md, payload = _split(entry)
    msgs = _batch_messages(md, payload)
    out = [(smm, data) for i, (smm, data) in enumerate(msgs) if i in keep]
    new_payload = frames.build_batch_payload(out)
    md.compression = pb.NONE
    md.uncompressed_size = len(new_payload)
    md.num_messages_in_batch = len(out)
    return frames.build_entry(md, new_payload)


def compact(inputs: list[tuple[Position, bytes]]) -> list[tuple[Position, bytes]]:
    """Both phases over `inputs` (position order): the entries of the compacted view."""
    latest: dict[str, tuple[Position, int]] = {}
    parsed = []
    for pos, entry in inputs:
        try:
            msgs = _messages(entry)
        except frames.ProtocolError as e:
            raise CompactionError(f"entry {pos} is unreadable: {e}") from None
        parsed.append((pos, entry, msgs))
        for idx, key, size in msgs:
            if key is None:
                continue
            if size > 0:
                latest[key] = (pos, idx)
            else:
                latest.pop(key, None)            # a tombstone
    out = []
    for pos, entry, msgs in parsed:
        keep = {idx for idx, key, _ in msgs if key is not None and latest.get(key) == (pos, idx)}
        if not keep:
            continue
        if -1 in keep:
            out.append((pos, entry))
        elif len(keep) == len(msgs) and all(i == n for n, (i, _, _) in enumerate(msgs)):
            out.append((pos, entry))                     # the whole batch is still current
        else:
            out.append((pos, _rebatch(entry, keep)))
    return out


class Compactor:
    """A topic's compaction runs (one at a time) and their status (LongRunningProcessStatus)."""

    def __init__(self, topic: Any):
        self.topic = topic
        self.status = "NOT_RUN"
        self.last_error = ""
        self.task: Any = None
        self.runs = 0

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    def status_json(self) -> dict[str, Any]:
        return {"status": "RUNNING" if self.running else self.status, "lastError": self.last_error}

    def trigger(self) -> bool:
        """Start a run; False if one is running."""
        import asyncio
        if self.running or self.topic.closed:
            return False
        self.task = asyncio.get_running_loop().create_task(self._run())
        return True

    async def stop(self) -> None:
        """The topic closes: end a run under way (Topic.close). Cancelled while the znode write is
        out, the write may still apply (before this broker lets the topic go, so the next owner
        reads it): the new ledger is kept, the previous one leaks at worst."""
        import asyncio
        task = self.task
        if task is None or task.done():
            return
        task.cancel()
        await asyncio.wait({task})          # its outcome is its own; a cancel of ours still propagates

    async def _run(self) -> None:
        import asyncio
        try:
            await self.run()
            self.status, self.last_error = "SUCCESS", ""
        except asyncio.CancelledError:
            self.status, self.last_error = "ERROR", "the topic closed during the run"
            raise
        except Exception as e:  # noqa: BLE001 - reported by the status endpoint
            log.warning("%s: compaction failed: %s", self.topic, e)
            self.status, self.last_error = "ERROR", f"{type(e).__name__}: {e}"

    async def run(self) -> None:
        t = self.topic
        ml, svc = t.ml, t.service
        store, bk = svc.store, svc.bk
        started = time.monotonic()
        horizon = ml.last_confirmed
        if horizon is None:
            return
        old = t.compacted
        if old is not None and horizon <= old.horizon:
            return                                          # nothing new
        inputs: list[tuple[Position, bytes]] = list(old.entries) if old is not None else []
        start = ml.next_position(old.horizon) if old is not None else ml.first_position()
        while start is not None and start <= horizon:
            batch = await ml.read_entries(start, 500)
            batch = [(p, e) for p, e in batch if p <= horizon]
            if not batch:
                break
            inputs.extend(batch)
            start = ml.next_position(batch[-1][0])
        entries = compact(inputs)
        e, w, a = ml.persistence()
        lh = await bk.create_ledger(e, w, a, custom={"application": "pulsar", "component": "compacted-ledger",
                                                    "pulsar/compactedTopic": t.name})
        try:
            for pos, entry in entries:
                await lh.add_entry(_POS.pack(pos.ledger_id, pos.entry_id) + entry)
            await lh.close()
        except BaseException:
            await _drop(bk, lh.ledger_id)               # nothing names it yet
            raise
        path = compaction_path(ml.name)
        data = json.dumps({"ledger": lh.ledger_id, "horizon": [horizon.ledger_id, horizon.entry_id],
                           "entries": len(entries)}).encode()
        try:
            got = await store.get_or_none(path)
            current = json.loads(got[0] or b"{}") if got else None
            if (current or {}).get("ledger") != (old.ledger_id if old is not None else None):
                raise CompactionError("the compacted ledger changed meanwhile (another broker compacted)")
            if t.closed:
                # a run left over from an unload must not swap the znode under the next owner
                raise CompactionError("the topic closed during the run")
            if got is None:
                await store.create(path, data, makepath=True)
            else:
                await store.set(path, data, version=got[1])
        except (BadVersion, NodeExists, NoNode, CompactionError) as err:
            # the znode was not written: nothing names the new ledger
            await _drop(bk, lh.ledger_id)
            if isinstance(err, CompactionError):
                raise
            raise CompactionError(f"the compaction znode changed meanwhile: {type(err).__name__}") from None
        except Exception as err:
            # the outcome is unknown (a ZooKeeper timeout can come after the write was applied):
            # the ledger is deleted only if the znode, read again, does not name it
            named = await _names(store, path, lh.ledger_id)
            if named is False:
                await _drop(bk, lh.ledger_id)
            if not named:
                raise CompactionError(f"writing the compaction znode: {type(err).__name__}: {err}"
                                      + ("" if named is False else
                                         f" (outcome unknown: ledger {lh.ledger_id} kept)")) from err
            log.info("%s: the compaction znode write answered %s but was applied", t, type(err).__name__)
        t.compacted = CompactedView(lh.ledger_id, horizon, entries)
        cursor = ml.cursors.get(COMPACTION_CURSOR)
        if cursor is None:
            cursor = await ml.open_cursor(COMPACTION_CURSOR, "earliest")
        await cursor.mark_delete(horizon)
        if old is not None:
            await _drop(bk, old.ledger_id)
        self.runs += 1
        log.info("%s: compacted %d entries up to %s into %d in ledger %d (%.2f s)", t, len(inputs), horizon,
                 len(entries), lh.ledger_id, time.monotonic() - started)


async def _names(store: Any, path: str, lid: int) -> bool | None:
    """Whether the compaction znode names ledger `lid` now (None: it cannot be read)."""
    try:
        got = await store.get_or_none(path)
    except Exception as e:  # noqa: BLE001 - unknown: the caller keeps the ledger
        log.warning("reading %s again: %s", path, e)
        return None
    return got is not None and json.loads(got[0] or b"{}").get("ledger") == lid


async def _drop(bk: Any, lid: int) -> None:
    try:
        await bk.delete_ledger(lid)
    except Exception as e:  # noqa: BLE001 - a leaked ledger
        log.warning("deleting compacted ledger %d: %s", lid, e)
