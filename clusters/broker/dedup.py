"""Broker-side message deduplication, as Pulsar's MessageDeduplication.

Per topic, two maps from producer name to sequence id:

- `pushed`: the highest sequence id handed to the managed ledger (updated before the add), and
- `persisted`: the highest one the managed ledger acknowledged (updated in add order).

A message whose sequence id is <= `pushed[producer]` is not written again: if it is also
<= `persisted[producer]` it is a duplicate (Dup: answered at once with message id (-1, -1)); otherwise
its original is still in flight and nobody knows yet whether it will persist (Unknown: a SendError,
after which the client reconnects and resends). After a failed add, `pushed` falls back to
`persisted` (Pulsar's resetHighestSequenceIdPushed), so the retried message is written. The bug knob
`broker.dedup_pushed_only` restores what Pulsar did before that fix (apache/pulsar#5218): any
sequence id <= `pushed` is a duplicate, and `pushed` stays where it was after a failed add.

The state survives an ownership change: every `interval` persisted entries (Pulsar's
brokerDeduplicationEntriesInterval, 1000) the `persisted` map is snapshotted with the position of
the entry that completed it, and the special cursor `pulsar.dedup` is moved (mark-delete) to that
position, so the ledgers after it are kept. A broker loading the topic reads the snapshot, then
replays every entry after it, taking each entry's MessageMetadata (producer_name,
max(sequence_id, highest_sequence_id)), before the topic accepts producers.

Pulsar keeps the snapshot in the cursor's mark-delete properties; our ManagedCursor has no
properties, so the map lives in a znode of its own, `/dedup-snapshots/<managed ledger name>`,
written before the cursor moves (the cursor is never ahead of the snapshot, so the replay always
finds its entries). A stale write by a deposed owner can only move the snapshot back, which the
replay makes good.

The bug knob `broker.dedup_recovery_race` restores the recovery race of apache/pulsar#25954 (fixed by
#25953): a check of the status neither waits for a recovery under way nor is kept out of it. The
enable path opens the dedup cursor and only then marks the status Recovering, a check that finds it
Recovering treats the recovery as done (the topic load goes on and exposes the topic to producers
while the replay still runs, and until it ends every message is taken as new), and a check that
comes before Recovering starts a second replay over the same cursor. The replays read through the
cursor's one read position and write the live maps entry by entry, as Pulsar's replay did. A topic
load makes two such checks when the topic has topic-level policies (the policy path's and the load
chain's own: clusters/broker/service.py), so producers resending after an owner change get messages
stored twice although deduplication is on.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from clusters.broker.managed_ledger import Position
from clusters.bugs import Knobs
from clusters.metadata.store import NodeExists, NoNode
from clusters.protocol import frames

log = logging.getLogger(__name__)

DEDUP_CURSOR = "pulsar.dedup"          # PersistentTopic.DEDUPLICATION_CURSOR_NAME
SNAPSHOT_ROOT = "/dedup-snapshots"
SNAPSHOT_INTERVAL = 1000               # brokerDeduplicationEntriesInterval
SNAPSHOT_INTERVAL_S = 120.0            # brokerDeduplicationSnapshotIntervalSeconds (checked on persist)
MAX_PRODUCERS = 10000                  # brokerDeduplicationMaxNumberOfProducers (in a snapshot)
REPLAY_BATCH = 100

NOT_DUP, DUP, UNKNOWN = 0, 1, 2

DISABLED, RECOVERING, ENABLED, REMOVING, FAILED = "Disabled", "Recovering", "Enabled", "Removing", "Failed"


class ZkSnapshots:
    """The snapshot of one topic in ZooKeeper: `{"position": [ledger, entry], "producers": {name: seq}}`."""

    def __init__(self, store: Any, ml_name: str):
        self.store = store
        self.path = f"{SNAPSHOT_ROOT}/{ml_name}"

    async def load(self) -> tuple[Position, dict[str, int]] | None:
        got = await self.store.get_or_none(self.path)
        if got is None:
            return None
        return decode_snapshot(got[0])

    async def save(self, pos: Position, producers: dict[str, int]) -> None:
        data = encode_snapshot(pos, producers)
        try:
            await self.store.set(self.path, data)
        except NoNode:
            try:
                await self.store.create(self.path, data, makepath=True)
            except NodeExists:
                await self.store.set(self.path, data)

    async def delete(self) -> None:
        try:
            await self.store.delete(self.path)
        except NoNode:
            pass


class MemorySnapshots:
    """The same interface over a dict (unit tests; the dict outlives topics like ZooKeeper does)."""

    def __init__(self, saved: dict[str, bytes] | None = None, key: str = "t"):
        self.saved = saved if saved is not None else {}
        self.key = key

    async def load(self) -> tuple[Position, dict[str, int]] | None:
        data = self.saved.get(self.key)
        return decode_snapshot(data) if data is not None else None

    async def save(self, pos: Position, producers: dict[str, int]) -> None:
        self.saved[self.key] = encode_snapshot(pos, producers)

    async def delete(self) -> None:
        self.saved.pop(self.key, None)


def encode_snapshot(pos: Position, producers: dict[str, int]) -> bytes:
    return json.dumps({"position": [pos.ledger_id, pos.entry_id], "producers": producers},
                      sort_keys=True).encode()


def decode_snapshot(data: bytes) -> tuple[Position, dict[str, int]] | None:
    try:
        raw = json.loads(data)
        pos = Position(int(raw["position"][0]), int(raw["position"][1]))
        producers = {str(k): int(v) for k, v in raw.get("producers", {}).items()}
    except (ValueError, KeyError, TypeError, IndexError):
        log.warning("unreadable deduplication snapshot; replaying from the dedup cursor")
        return None
    return pos, producers


def entry_highest_sequence_id(md: Any) -> int:
    """The highest sequence id an entry carries: highest_sequence_id when the producer set it, else
    for a batch of N the first id + N - 1 (the C++ client numbers a batch's messages consecutively and
    does not set highest_sequence_id; the broker answers the SEND with the same figure)."""
    seq = frames.to_signed64(md.sequence_id)
    highest = frames.to_signed64(md.highest_sequence_id)
    if not highest and md.HasField("num_messages_in_batch") and md.num_messages_in_batch > 1:
        highest = seq + md.num_messages_in_batch - 1
    return max(seq, highest)


class MessageDeduplication:
    """The deduplication state of one topic over its managed ledger `ml`."""

    def __init__(self, topic: str, ml: Any, snapshots: Any, *, interval: int = SNAPSHOT_INTERVAL,
                 interval_s: float = SNAPSHOT_INTERVAL_S, max_producers: int = MAX_PRODUCERS,
                 knobs: Knobs | None = None):
        self.topic = topic
        # the broker's bug knobs (clusters/bugs.py); None: all safe
        self.knobs = knobs if knobs is not None else Knobs.defaults("broker")
        self.pushed_only = self.knobs.on("broker.dedup_pushed_only")
        self.recovery_race = self.knobs.on("broker.dedup_recovery_race")
        self.ml = ml
        self.snapshots = snapshots
        self.interval = max(1, interval)
        self.interval_s = interval_s
        self.max_producers = max_producers
        self.status = DISABLED
        self.pushed: dict[str, int] = {}
        self.persisted: dict[str, int] = {}
        self.cursor: Any = None
        self.snapshot_position: Position | None = None
        self.replayed_entries = 0
        self.duplicates = 0                 # messages answered as duplicates (Dup)
        self._live: dict[str, int] | None = None     # persisted while recovering
        self._counter = 0
        self._last_snapshot = time.monotonic()
        self._lock = asyncio.Lock()
        self._snap_pending: tuple[Position, dict[str, int]] | None = None
        self._snap_task: asyncio.Task | None = None
        self._read_position: Position | None = None   # the dedup cursor's (broker.dedup_recovery_race)

    def __repr__(self) -> str:
        return f"MessageDeduplication({self.topic}, {self.status})"

    @property
    def enabled(self) -> bool:
        return self.status == ENABLED

    # -- enabling and disabling (Pulsar's checkStatus) ----------------------------------------
    async def apply(self, should_enable: bool) -> None:
        """Bring the state in line with the policy: enabling recovers the maps from the snapshot and
        the entries after it; disabling deletes the cursor and the snapshot. Raises if recovery fails
        (the status is then Failed and messages are not deduplicated). Concurrent calls are serialised:
        one that comes while a recovery runs waits for it (the fix of apache/pulsar#25954)."""
        if self.recovery_race:
            await self._apply_racing(should_enable)
            return
        async with self._lock:
            if should_enable and self.status != ENABLED:
                await self._enable()
            elif not should_enable and (self.status in (ENABLED, FAILED)
                                        or DEDUP_CURSOR in self.ml.cursors):
                await self._disable()

    async def _enable(self) -> None:
        self.status = RECOVERING
        self._live = {}
        try:
            cursor = self.ml.cursors.get(DEDUP_CURSOR)
            if cursor is None:
                # as Pulsar, a new dedup cursor starts at the end: earlier entries were written
                # without deduplication and are not replayed
                cursor = await self.ml.open_cursor(DEDUP_CURSOR, "latest")
            snap = await self.snapshots.load()
            seqs: dict[str, int] = {}
            if snap is not None:
                start, seqs = snap
                self.snapshot_position = start
            else:
                start = cursor.mark_delete_position
            await self._replay(start, seqs)
            seqs.update(self._live)          # entries persisted while we replayed are newer
            self.pushed = dict(seqs)
            self.persisted = dict(seqs)
            self.cursor = cursor
            self._counter = 0
            self._last_snapshot = time.monotonic()
            self.status = ENABLED
            log.info("%s: deduplication enabled (%d producers, %d entries replayed)", self.topic,
                     len(seqs), self.replayed_entries)
        except BaseException:
            self.status = FAILED
            raise
        finally:
            self._live = None

    # -- bug knob broker.dedup_recovery_race: Pulsar's checkStatus before apache/pulsar#25953 -----------
    async def _apply_racing(self, should_enable: bool) -> None:
        if self.status in (RECOVERING, REMOVING):
            return                       # a transition is under way: taken as done, nobody waits for it
        if should_enable and self.status != ENABLED:
            try:
                cursor = await self._open_cursor()
                # Recovering only now, once the cursor is open: a check meanwhile starts a replay of its
                # own, and a check from now on takes the recovery as done
                self.status = RECOVERING
                snap = await self.snapshots.load()
                if snap is not None:
                    start, seqs = snap
                    self.snapshot_position = start
                    for name, seq in seqs.items():
                        self.pushed[name] = self.persisted[name] = seq
                else:
                    start = cursor.mark_delete_position
                if self._read_position is None:
                    self._read_position = self.ml.next_position(start) if start is not None \
                        else self.ml.first_position()
                await self._replay_through_cursor()
                self.cursor = cursor
                self._counter = 0
                self._last_snapshot = time.monotonic()
                self.status = ENABLED
                log.info("%s: deduplication enabled (%d producers, %d entries replayed; bug knob "
                         "broker.dedup_recovery_race)", self.topic, len(self.persisted), self.replayed_entries)
            except BaseException:
                self.status = FAILED
                raise
        elif not should_enable and (self.status in (ENABLED, FAILED) or DEDUP_CURSOR in self.ml.cursors):
            await self._disable()

    async def _open_cursor(self) -> Any:
        cursor = self.ml.cursors.get(DEDUP_CURSOR)
        if cursor is None:
            cursor = await self.ml.open_cursor(DEDUP_CURSOR, "latest")
        return cursor

    async def _replay_through_cursor(self) -> None:
        """Read the entries from the dedup cursor's read position, which every replay of this topic
        shares and moves, writing each entry's sequence id into the live maps (Pulsar's replay)."""
        ml = self.ml
        while self._read_position is not None:
            pos = self._read_position
            lc = ml.last_confirmed
            if lc is None or pos > lc:
                break
            batch = await ml.read_entries(pos, REPLAY_BATCH)
            if not batch:
                break
            for _, entry in batch:
                try:
                    md = frames.entry_metadata(entry)
                except frames.ProtocolError:
                    continue
                seq = entry_highest_sequence_id(md)
                self.pushed[md.producer_name] = seq
                self.persisted[md.producer_name] = seq
                self.replayed_entries += 1
            nxt = ml.next_position(batch[-1][0])
            if self._read_position is None or nxt > self._read_position:
                self._read_position = nxt

    async def _replay(self, after: Position | None, seqs: dict[str, int]) -> None:
        ml = self.ml
        pos = ml.next_position(after) if after is not None else ml.first_position()
        n = 0
        while pos is not None:
            lc = ml.last_confirmed
            if lc is None or pos > lc:
                break
            batch = await ml.read_entries(pos, REPLAY_BATCH)
            if not batch:
                break
            for _, entry in batch:
                try:
                    md = frames.entry_metadata(entry)
                except frames.ProtocolError:
                    continue
                seqs[md.producer_name] = entry_highest_sequence_id(md)
                n += 1
            pos = ml.next_position(batch[-1][0])
        self.replayed_entries = n

    async def _disable(self) -> None:
        self.status = REMOVING
        try:
            await self.ml.delete_cursor(DEDUP_CURSOR)
            await self.snapshots.delete()
        except BaseException:
            self.status = FAILED
            raise
        self.cursor = None
        self.pushed.clear()
        self.persisted.clear()
        self.snapshot_position = None
        self.status = DISABLED
        log.info("%s: deduplication disabled", self.topic)

    # -- the publish path ------------------------------------------------------------------
    def check(self, producer: str, sequence_id: int, highest_sequence_id: int) -> int:
        """NOT_DUP (and the message counts as pushed), DUP or UNKNOWN (Pulsar's isDuplicate)."""
        if self.status != ENABLED:
            return NOT_DUP
        last = self.pushed.get(producer)
        if last is not None and sequence_id <= last:
            persisted = self.persisted.get(producer)
            if self.pushed_only or (persisted is not None and sequence_id <= persisted):
                self.duplicates += 1
                return DUP
            return UNKNOWN
        self.pushed[producer] = max(highest_sequence_id, sequence_id)
        return NOT_DUP

    def record_persisted(self, producer: str, sequence_id: int, highest_sequence_id: int,
                         pos: Position) -> None:
        """An add completed at `pos` (called in add order); maybe take a snapshot."""
        status = self.status
        if status != ENABLED:
            if status == RECOVERING and self._live is not None:
                self._live[producer] = max(highest_sequence_id, sequence_id)
            return
        seq = max(highest_sequence_id, sequence_id)
        self.persisted[producer] = seq
        if self.pushed.get(producer, -1) < seq:
            self.pushed[producer] = seq
        self._counter += 1
        if self._counter >= self.interval or time.monotonic() - self._last_snapshot >= self.interval_s:
            self._counter = 0
            self.take_snapshot(pos)

    def reset_pushed(self) -> None:
        """After a failed add: what was pushed but not persisted may be resent and must be written."""
        if self.status == ENABLED and not self.pushed_only:
            self.pushed = dict(self.persisted)

    def last_sequence_id(self, producer: str) -> int:
        """CommandProducerSuccess.last_sequence_id: where a reconnecting producer resumes."""
        if self.status != ENABLED:
            return -1
        return self.pushed.get(producer, -1)

    # -- snapshots -----------------------------------------------------------------------
    def take_snapshot(self, pos: Position) -> None:
        seqs: dict[str, int] = {}
        for name, seq in self.persisted.items():
            if len(seqs) >= self.max_producers:
                break
            seqs[name] = seq
        self._last_snapshot = time.monotonic()
        self._snap_pending = (pos, seqs)
        if self._snap_task is None or self._snap_task.done():
            self._snap_task = asyncio.get_running_loop().create_task(self._snapshot_loop())

    async def _snapshot_loop(self) -> None:
        while self._snap_pending is not None and self.status == ENABLED:
            pos, seqs = self._snap_pending
            self._snap_pending = None
            try:
                await self.snapshots.save(pos, seqs)
                self.snapshot_position = pos
                if self.cursor is not None:
                    await self.cursor.mark_delete(pos)
            except Exception as e:  # noqa: BLE001 - the next snapshot tries again; replay covers it
                log.warning("%s: storing the deduplication snapshot at %s: %s", self.topic, pos, e)

    async def flush(self) -> None:
        task = self._snap_task
        if task is not None and not task.done():
            try:
                await asyncio.wait_for(asyncio.shield(task), 5.0)
            except (asyncio.TimeoutError, Exception):  # noqa: BLE001
                pass

    def stats(self) -> dict[str, Any]:
        return {"status": self.status, "producers": len(self.persisted),
                "snapshotPosition": str(self.snapshot_position) if self.snapshot_position else None,
                "replayedEntries": self.replayed_entries, "duplicates": self.duplicates}
