"""A subscription as the broker serves it: a cursor plus the consumers attached to it, with the
per-entry state (outstanding, waiting for redelivery, delayed) from which the mark-delete position is
derived and persisted through the cursor. Dispatch policies are in clusters/broker/dispatchers.py,
delayed delivery in clusters/broker/delayed.py; the topic (clusters/broker/topic.py) creates them.
"""
from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from typing import Any, Iterable

from clusters.broker.delayed import DelayedDelivery
from clusters.broker.dispatchers import (_POSITION_KEY, _U64, DISPATCHERS, EXCLUSIVE, KEY_SHARED, SUB_TYPE_NAMES,
                                         Consumer, Dispatcher, EntryInfo)
from clusters.broker.errors import ConsumerBusy, not_served
from clusters.broker.managed_ledger import ManagedLedgerError, ManagedLedgerFenced, Position
from clusters.protocol import PulsarApi_pb2 as pb

log = logging.getLogger(__name__)

MAX_READ_ENTRIES = 100             # entries per dispatch round
CLOSE_DRAIN_TIMEOUT = 5.0          # how long close() waits for in-flight work before giving up
LIVENESS_CHECK_TIMEOUT = 5.0       # probe of the previous holder of an exclusive subscription
NON_DURABLE_GRACE = 30.0           # a reader's subscription outlives a seek's disconnect this long


class NonDurableCursor:
    """The in-memory cursor of a reader's (non-durable) subscription; same surface as ManagedCursor."""

    def __init__(self, name: str, mark_delete: Position | None):
        self.name = name
        self.mark_delete_position = mark_delete

    async def mark_delete(self, pos: Position) -> None:
        if self.mark_delete_position is None or pos > self.mark_delete_position:
            self.mark_delete_position = pos

    async def reset(self, pos: Position | None) -> None:
        self.mark_delete_position = None if pos is None else Position(pos.ledger_id, pos.entry_id - 1)

    async def flush(self) -> None:
        return None


class Subscription(DelayedDelivery):
    """A cursor plus the consumers attached to it.

    State (per entry): `outstanding` maps every delivered-but-unacked position to the consumer
    holding it (None: waiting in `replay` for redelivery); `redeliveries` counts how often each was
    handed back; `read_position` is the next entry never read (None: the first entry of the topic).
    The mark-delete position is the one right before min(outstanding, read_position): everything
    that exists before it was read and acknowledged.
    """

    def __init__(self, topic: "Topic", name: str, cursor: Any, sub_type: int, durable: bool):
        self.topic = topic
        self.ml = topic.ml
        self.name = name
        self.cursor = cursor
        self.durable = durable
        self.sub_type = sub_type
        self.consumers: list[Consumer] = []
        self.mark_delete: Position | None = cursor.mark_delete_position
        self.read_position: Position | None = (
            self.ml.next_position(self.mark_delete) if self.mark_delete is not None else None)
        self.outstanding: dict[Position, Consumer | None] = {}
        self._heap: list[tuple[int, int]] = []          # outstanding positions (lazy deletion)
        self.replay: set[Position] = set()
        self._replay_heap: list[tuple[int, int]] = []
        self.redeliveries: dict[Position, int] = {}
        self.batch_acks: dict[Position, list[int]] = {}   # partly acknowledged batches: their ack_set
        # delayed delivery (Shared/Key_Shared, clusters/broker/delayed.py)
        svc_cfg = getattr(topic.service, "config", None)
        self.knobs = topic.knobs                        # the broker's bug knobs (clusters/bugs.py)
        self._init_delayed(bool(getattr(svc_cfg, "delayed_delivery_enabled", True)),
                           self.knobs.on("broker.delayed_index_in_memory"))
        self.dispatcher: Dispatcher = DISPATCHERS[sub_type](self)
        self.epoch = 0                  # bumped whenever positions change under an in-flight read
        self.closed = False
        self._paused = 0
        self._wake = asyncio.Event()
        self._persist_task: asyncio.Task | None = None
        self._persist_again = False
        self._restore_from_cursor()
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"dispatch {topic.name}/{name}")

    def __repr__(self) -> str:
        return f"Subscription({self.topic.name}/{self.name}, {SUB_TYPE_NAMES.get(self.sub_type)})"

    # -- consumers ---------------------------------------------------------------
    async def add_consumer(self, cnx: Any, cmd: pb.CommandSubscribe) -> Consumer:
        sub_type = cmd.subType
        if self.consumers and sub_type != self.sub_type:
            raise ConsumerBusy("Subscription is of different type. Active subscription type of "
                               f"'{SUB_TYPE_NAMES.get(self.sub_type)}' is different than the connecting "
                               f"consumer's type '{SUB_TYPE_NAMES.get(sub_type)}'.")
        if sub_type == EXCLUSIVE and self.consumers:
            await self._evict_dead(self.consumers[0], cnx)
            if self.consumers:
                raise ConsumerBusy("Exclusive consumer is already connected")
        if self.closed or self.topic.closed:
            raise not_served(self.topic.name, "closing")
        if sub_type != self.sub_type:
            self.sub_type = sub_type
            self.dispatcher = DISPATCHERS[sub_type](self)
        ranges = None
        if sub_type == KEY_SHARED and cmd.HasField("keySharedMeta") and \
                cmd.keySharedMeta.keySharedMode == pb.STICKY:
            ranges = [(r.start, r.end) for r in cmd.keySharedMeta.hashRanges]
        c = Consumer(self, cnx, cmd.consumer_id, cmd.consumer_name or f"consumer-{cmd.consumer_id}",
                     cmd.priority_level, sub_type, ranges)
        c.read_compacted = bool(cmd.read_compacted)
        self.dispatcher.add(c, cmd)            # may refuse it (Key_Shared mode or ranges)
        self.consumers.append(c)
        self.dispatcher.consumers_changed(c)
        self.wake()
        return c

    async def _evict_dead(self, holder: Consumer, cnx: Any) -> None:
        """Before refusing with ConsumerBusy, make sure the holder's connection is alive (a client that
        reconnected after a network fault finds its old, half-open connection still registered)."""
        old = holder.cnx
        if old is cnx:
            return
        alive = await old.check_liveness(LIVENESS_CHECK_TIMEOUT)
        if not alive:
            log.info("%s: connection %s of %s is dead; closing it", self, old, holder)
            old.close("did not answer the liveness check")

    def remove_consumer(self, c: Consumer, *, redeliver: bool = True, keep: bool = False) -> None:
        """Detach `c`; what it had not acknowledged goes to the others (`redeliver`), with its
        redelivery count unchanged, as Pulsar does on a consumer's close or disconnect."""
        if c.closed:
            return
        c.closed = True
        try:
            self.consumers.remove(c)
        except ValueError:
            pass
        if redeliver:
            self._to_replay(c, list(c.pending), bump=False)
        c.pending.clear()
        if c.key_hashes:
            c.key_hashes.clear()
        self.dispatcher.removed(c)
        if not self.consumers and self.dispatcher.individual_ack:
            self.redeliveries.clear()       # Pulsar's redelivery tracker forgets when the last one leaves
        if not self.consumers and not self.durable and not self.closed:
            if keep:
                # a reader seeking: it comes back to this position; drop the subscription if not
                asyncio.get_running_loop().call_later(NON_DURABLE_GRACE, self._drop_if_abandoned)
            else:
                self._drop()
        self.wake()

    def _drop(self) -> None:
        self.topic._drop_subscription(self)
        self._stop()

    def _drop_if_abandoned(self) -> None:
        if not self.consumers and not self.closed:
            self._drop()

    def rewind_consumer(self, c: Consumer) -> None:
        """Hand everything `c` holds back for redelivery (Failover switch, Exclusive redeliver-all)."""
        self._to_replay(c, list(c.pending), bump=False)

    def _to_replay(self, c: Consumer, positions: Iterable[Position], *, bump: bool) -> None:
        """Positions `c` holds go back for redelivery; `bump` counts a redelivery (Shared/Key_Shared
        only: Pulsar's single-active dispatchers have no redelivery tracker)."""
        moved = False
        count = bump and self.dispatcher.individual_ack
        for pos in positions:
            if pos not in c.pending:
                continue
            self._unpend(c, pos)
            if self.outstanding.get(pos) is c:
                self.outstanding[pos] = None
                self._replay_add(pos)
                if count:
                    self.redeliveries[pos] = self.redeliveries.get(pos, 0) + 1
                c.redelivered += 1
                moved = True
        if moved:
            self.wake()

    def _unpend(self, holder: Consumer, pos: Position) -> None:
        if holder.pending.pop(pos, None) is not None:
            self.dispatcher.unpend(holder, pos)

    def _replay_add(self, pos: Position) -> None:
        self.replay.add(pos)
        heapq.heappush(self._replay_heap, (pos.ledger_id, pos.entry_id))
        self.dispatcher.replayed(pos)

    def _replay_discard(self, pos: Position) -> None:
        if pos in self.replay:
            self.replay.discard(pos)
            self.dispatcher.unreplayed(pos)

    def defer(self, pos: Position) -> None:
        """A just-read entry nobody may take now (Key_Shared): it waits in the replay set."""
        self.outstanding[pos] = None
        self._replay_add(pos)

    def redeliver(self, c: Consumer, ids: list[Position] | None) -> None:
        """REDELIVER_UNACKNOWLEDGED_MESSAGES, as ServerCnx and the dispatchers handle it: Shared and
        Key_Shared hand back the listed positions `c` holds (all of them for an empty list) with the
        redelivery count raised; Exclusive/Failover rewind the active consumer (counts stay 0)."""
        d = self.dispatcher
        if d.single_active:
            if c is d.active:
                self._to_replay(c, list(c.pending), bump=False)
            return
        self._to_replay(c, ids if ids else list(c.pending), bump=True)

    def flow(self, c: Consumer, permits: int) -> None:
        c.permits += permits
        if c.permits > 0:
            self.wake()

    # -- acknowledgements --------------------------------------------------------
    def ack_individual(self, positions: Iterable[Position]) -> None:
        md = self.mark_delete
        outstanding = self.outstanding
        d = self.dispatcher
        batch_acks = self.batch_acks
        for pos in positions:
            if md is not None and pos <= md:
                continue
            holder = outstanding.pop(pos, _MISSING)
            if holder is _MISSING:
                continue
            if holder is None:
                self._replay_discard(pos)
                if self.delayed:
                    self.delayed.pop(pos, None)
            else:
                self._unpend(holder, pos)
            d.forget(pos)
            self.redeliveries.pop(pos, None)
            if batch_acks:
                batch_acks.pop(pos, None)
        self._update_mark_delete()
        if self.replay and d.looks_ahead:
            self.wake()                 # a draining key may be free now

    def ack_batch_index(self, pos: Position, ack_set: list[int]) -> None:
        """A partial acknowledgement of a batch entry (Pulsar's batch-index acknowledgement):
        `ack_set` has a bit set for every message of the batch still unacknowledged. The bits add up
        (AND) with earlier ones; the entry is acknowledged once none is left. Ignored unless the
        broker enables it (acknowledgmentAtBatchIndexLevelEnabled), as in Pulsar."""
        if not self.batch_index_acks:
            return
        md = self.mark_delete
        if (md is not None and pos <= md) or pos not in self.outstanding:
            return
        old = self.batch_acks.get(pos)
        words = [w & _U64 for w in ack_set]
        if old is not None:
            words = [a & b for a, b in itertools.zip_longest(old, words, fillvalue=0)]
        if not any(words):
            self.ack_individual([pos])
            return
        self.batch_acks[pos] = [w - (1 << 64) if w >> 63 else w for w in words]   # int64, as on the wire

    @property
    def batch_index_acks(self) -> bool:
        cfg = getattr(self.topic.service, "config", None)
        return bool(getattr(cfg, "acknowledgment_at_batch_index_level_enabled", False))

    def ack_cumulative(self, pos: Position, ack_set: list[int] | None = None) -> None:
        """Everything up to `pos` is acknowledged. With an `ack_set` (some messages of the batch at
        `pos` still unacknowledged) only what precedes `pos`, plus those batch indexes.
        (The connection refuses cumulative acks from Shared and Key_Shared consumers, as Pulsar's
        Consumer.messageAcked does; message expiry uses this on any subscription.)"""
        if ack_set is not None and any(ack_set):
            self.ack_cumulative(self.ml.previous_position(pos))
            self.ack_batch_index(pos, ack_set)
            return
        md = self.mark_delete
        if md is not None and pos <= md:
            return
        lc = self.ml.last_confirmed
        if lc is None:
            return
        if pos > lc:
            pos = lc
        heap = self._heap
        key = (pos.ledger_id, pos.entry_id)
        d = self.dispatcher
        batch_acks = self.batch_acks
        while heap and heap[0] <= key:
            p = Position(*heapq.heappop(heap))
            holder = self.outstanding.pop(p, _MISSING)
            if holder is None:
                self._replay_discard(p)
                if self.delayed:
                    self.delayed.pop(p, None)
            elif holder is not _MISSING:
                self._unpend(holder, p)
            d.forget(p)
            self.redeliveries.pop(p, None)
            if batch_acks:
                batch_acks.pop(p, None)
        rp = self.read_position
        if rp is None or rp <= pos:
            # acked past what we read (a client that knows more than we do, e.g. after a seek)
            self.read_position = self.ml.next_position(pos)
            self.epoch += 1
        self._set_mark_delete(pos)
        self._update_mark_delete()

    def _update_mark_delete(self) -> None:
        heap = self._heap
        outstanding = self.outstanding
        while heap:
            top = heap[0]
            if Position(top[0], top[1]) in outstanding:
                break
            heapq.heappop(heap)
        rp = self.read_position
        if heap:
            lo = heap[0]
            if rp is not None and (rp.ledger_id, rp.entry_id) < lo:
                lo = (rp.ledger_id, rp.entry_id)
        elif rp is not None:
            lo = (rp.ledger_id, rp.entry_id)
        else:
            return
        md = Position(lo[0], lo[1] - 1)
        if self.mark_delete is None or md > self.mark_delete:
            self._set_mark_delete(md)
        elif self.durable:
            self._persist()             # an individual ack above the mark-delete: ranges changed

    def _set_mark_delete(self, pos: Position) -> None:
        if self.mark_delete is not None and pos <= self.mark_delete:
            return
        self.mark_delete = pos
        self._persist()

    def _persist(self) -> None:
        """Hand the state to the cursor. A ManagedCursor (durable) takes it without waiting and
        writes it itself, rate-limited (cursor_mark_delete_rate), reading the individually acked
        ranges from `_individually_deleted` at write time; other cursors get a task."""
        update = getattr(self.cursor, "update", None)
        if update is not None:
            update(self.mark_delete)
            return
        if self._persist_task is not None and not self._persist_task.done():
            self._persist_again = True
            return
        self._persist_task = asyncio.get_running_loop().create_task(self._persist_loop())

    async def _persist_loop(self) -> None:
        while True:
            self._persist_again = False
            md = self.mark_delete
            if md is not None:
                try:
                    await self.cursor.mark_delete(md)
                except ManagedLedgerFenced as e:
                    self.topic._on_fenced(e)
                    return
                except Exception as e:  # noqa: BLE001 - the position stays in memory; retried on next ack
                    log.warning("%s: persisting mark-delete %s: %s", self, md, e)
            if not self._persist_again:
                return

    def _individually_deleted(self, limit: int = 10000) -> list[tuple[Position, Position]]:
        """Acknowledged ranges above the mark-delete position, (start, end] open-closed as Pulsar's
        individuallyDeletedMessages, the lowest `limit` of them: every position read (before
        read_position) and not outstanding was acknowledged."""
        rp = self.read_position
        if rp is None:
            return []
        md = self.mark_delete
        lo = md if md is not None else Position(-1, -1)
        out: list[tuple[Position, Position]] = []
        holes = sorted((p for p in self.outstanding if md is None or p > md), key=_POSITION_KEY)
        holes.append(rp)
        for hole in holes:
            if len(out) >= limit:
                break
            hi = self.ml.previous_position(hole)
            if hi > lo:
                out.append((lo, hi))
            if hole > lo:
                lo = hole
        return out

    def _restore_from_cursor(self) -> None:
        """A durable subscription starts from its cursor's persisted state: entries at or before the
        mark-delete position and in its individually deleted ranges are consumed; every other entry
        up to the last range is queued for redelivery (first), and reading resumes after it."""
        cursor = self.cursor
        attach = getattr(cursor, "attach", None)
        if not self.durable or attach is None:
            return
        md = cursor.mark_delete_position
        self.mark_delete = md
        self.read_position = self.ml.next_position(md) if md is not None else None
        ranges = cursor.individually_deleted_ranges()
        if ranges:
            end = ranges[-1][1]
            k = 0
            for p in self.ml.positions_in(md, end):
                while k < len(ranges) and ranges[k][1] < p:
                    k += 1
                if k < len(ranges) and ranges[k][0] < p <= ranges[k][1]:
                    continue                           # acknowledged before the restart
                self.outstanding[p] = None
                self.replay.add(p)
                heapq.heappush(self._heap, (p.ledger_id, p.entry_id))
                heapq.heappush(self._replay_heap, (p.ledger_id, p.entry_id))
            self.read_position = self.ml.next_position(end)
            log.info("%s: restored mark-delete %s, %d acknowledged ranges, %d entries to redeliver "
                     "before reading from %s", self, md, len(ranges), len(self.replay), self.read_position)
        attach(ranges_fn=self._individually_deleted, on_expire=self.expire_to,
               on_fenced=self.topic._on_fenced)

    def expire_to(self, pos: Position) -> None:
        """Message TTL (the managed ledger's expiry check): everything up to `pos` is consumed, as a
        cumulative acknowledgement would make it."""
        self.ack_cumulative(pos)

    # -- seek --------------------------------------------------------------------
    async def reset(self, target: Position | None) -> None:
        """Seek, as PersistentSubscription.resetCursor: disconnect the consumers (Exclusive/Failover:
        the active one), forget every acknowledgement and redelivery above `target`, and make it
        (None: the first entry) the next read."""
        self._paused += 1
        self.epoch += 1
        try:
            d = self.dispatcher
            victims = list(self.consumers)
            if d.single_active:
                victims = [c for c in victims if c is d.active]
            for c in victims:
                c.cnx.broker_close_consumer(c)
                self.remove_consumer(c, redeliver=False, keep=True)
            for c in self.consumers:
                c.pending.clear()
            self.outstanding.clear()
            self._heap.clear()
            self.replay.clear()
            self._replay_heap.clear()
            self.redeliveries.clear()
            self.batch_acks.clear()
            self.delayed.clear()
            self._delayed_heap.clear()
            self.dispatcher.cleared()
            try:
                await self.cursor.reset(target)     # raises when the position is not durable
            finally:
                # in memory the reset holds either way (the seek's error says it may be lost)
                self.mark_delete = self.cursor.mark_delete_position
                self.read_position = target
        finally:
            self._paused -= 1
            self.epoch += 1
            self.wake()

    # -- lifecycle ---------------------------------------------------------------
    def wake(self) -> None:
        self._wake.set()

    def _stop(self) -> None:
        self.closed = True
        if self._delay_timer is not None:
            self._delay_timer.cancel()
            self._delay_timer = None
        self._task.cancel()
        self._wake.set()

    async def close(self, *, notify: bool = True, assigned_broker_url: str | None = None) -> None:
        """Stop dispatching, disconnect consumers (CLOSE_CONSUMER when `notify`), flush the position."""
        self._stop()
        for c in list(self.consumers):
            c.cnx.broker_close_consumer(c, assigned_broker_url, notify=notify)
            self.remove_consumer(c, redeliver=False)
        if self._persist_task is not None and not self._persist_task.done():
            try:
                await asyncio.wait_for(asyncio.shield(self._persist_task), CLOSE_DRAIN_TIMEOUT)
            except (asyncio.TimeoutError, Exception):  # noqa: BLE001
                pass

    # -- the dispatch loop -------------------------------------------------------
    async def _run(self) -> None:
        backoff = 0.05
        while not self.closed:
            # clear first: a wake-up that arrives while this round awaits a read is not lost
            self._wake.clear()
            try:
                did = await self._dispatch_once()
                backoff = 0.05
            except asyncio.CancelledError:
                raise
            except ManagedLedgerError as e:
                log.warning("%s: read failed: %s", self, e)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            except Exception:  # noqa: BLE001 - never let a subscription stop silently
                log.exception("%s: dispatch error", self)
                await asyncio.sleep(1.0)
                continue
            if did:
                await asyncio.sleep(0)      # let the connections breathe between rounds
            else:
                await self._wake.wait()     # new entries, permits, consumers, writability, seek

    async def _dispatch_once(self) -> bool:
        """One round; False when there was nothing to do (the loop then waits for a wake-up)."""
        if self._paused or not self.consumers:
            return False
        d = self.dispatcher
        permits = d.permits()
        if permits <= 0:
            return False
        avg = self.topic.avg_messages_per_entry
        max_entries = max(1, min(MAX_READ_ENTRIES, int(permits / avg) if avg > 1 else permits))
        epoch = self.epoch
        if self.replay:
            entries = await self._read_replay(max_entries)
            if epoch != self.epoch or self.closed:
                return True
            entries = [e for e in entries if e[0] in self.replay]
            if entries and d.individual_ack and self._delayed_enabled:
                before = len(entries)
                entries = self._hold_delayed_replay(entries)
                if not entries and before:
                    return True             # all of them wait for their time now; go on
            if entries:
                d.dispatch(entries, True)
                sent = 0
                for pos, _, _ in entries:
                    if self.outstanding.get(pos) is not None:
                        self._replay_discard(pos)
                        sent += 1
                if sent:
                    return True
            if self.replay:
                # what waits cannot go out now; only Key_Shared reads on, for other keys
                if not (d.looks_ahead and d.lookahead_ok() and len(self.replay) < d.lookahead_limit()
                        and d.permits() > 0):
                    return False
        view = self.topic.compacted
        if view is not None and self.reads_compacted() and (
                self.read_position is None or self.read_position <= view.horizon):
            return self._dispatch_compacted(view, max_entries)
        start = self.read_position if self.read_position is not None else self.ml.first_position()
        lc = self.ml.last_confirmed
        if start is None or lc is None or start > lc:
            return False
        entries = self.topic.cached_run(start, max_entries)
        if not entries:
            raw = await self.ml.read_entries(start, max_entries)
            if epoch != self.epoch or self.closed:
                return True
            if not raw:
                return False
            entries = [(p, e, self.topic.entry_info(p, e)) for p, e in raw]
        md = self.mark_delete
        if md is not None and entries[0][0] <= md:
            entries = [e for e in entries if e[0] > md]
            if not entries:
                self.read_position = self.ml.next_position(md)
                return True
        if d.individual_ack and self._delayed_enabled:
            now = time.time() * 1000.0
            for _, _, info in entries:
                if info.deliver_at > now:
                    return self._dispatch_with_delayed(entries, now)
        n = d.dispatch(entries, False)
        if n == 0:
            return False
        heap = self._heap
        for pos, _, _ in entries[:n]:
            heapq.heappush(heap, (pos.ledger_id, pos.entry_id))
        last = entries[n - 1][0]
        self.read_position = self.topic.successor(last)
        return True

    # -- reading the compacted view (Pulsar's CompactedTopicImpl.asyncReadEntriesOrWait) ---------
    def reads_compacted(self) -> bool:
        a = self.dispatcher.active
        return a is not None and a.read_compacted

    def _dispatch_compacted(self, view: Any, max_entries: int) -> bool:
        """The read position is at or before the compaction horizon: serve the compacted entries
        from it on (with their original ids), then continue in the topic after the horizon."""
        md = self.mark_delete
        start = self.read_position
        if md is not None and (start is None or start <= md):
            # from the mark-delete's successor on (not from the view's first entry, or a read of
            # max_entries all acknowledged would end the view and skip its later entries)
            start = Position(md.ledger_id, md.entry_id + 1)
        entries = [(p, e, EntryInfo.from_entry(e)) for p, e in view.from_position(start, max_entries)]
        if md is not None:
            entries = [x for x in entries if x[0] > md]
        if not entries:
            self.read_position = self.ml.next_position(view.horizon)
            self.epoch += 1
            return True
        n = self.dispatcher.dispatch(entries, False)
        if n == 0:
            return False
        for pos, _, _ in entries[:n]:
            heapq.heappush(self._heap, (pos.ledger_id, pos.entry_id))
        last = entries[n - 1][0]
        self.read_position = self.ml.next_position(last)
        return True

    async def _read_replay(self, max_entries: int) -> list[tuple[Position, bytes, EntryInfo]]:
        positions: list[Position] = []
        d = self.dispatcher
        heap = self._replay_heap
        if len(heap) > 2 * len(self.replay) + 64:           # drop stale heap items now and then
            heap[:] = [(p.ledger_id, p.entry_id) for p in self.replay]
            heapq.heapify(heap)
        if d.looks_ahead:
            # Key_Shared: the lowest waiting entries that could go out now (their consumer has
            # permits and the key is not draining elsewhere); sorted on (ledger, entry) tuples,
            # which compare in C (Position's generated ordering runs in Python)
            ok_by_hash: dict[int, bool] = {}
            for p in sorted(self.replay, key=_POSITION_KEY):
                if d.replay_ok(p, ok_by_hash):
                    positions.append(p)
                    if len(positions) >= max_entries:
                        break
        else:
            seen = set()
            while heap and len(positions) < max_entries:
                l, e = heapq.heappop(heap)
                p = Position(l, e)
                if p in self.replay and p not in seen:
                    positions.append(p)
                    seen.add(p)
            # popped positions not dispatched this round are pushed back by the caller's next round
            for p in positions:
                heapq.heappush(heap, (p.ledger_id, p.entry_id))
        out: dict[Position, tuple[Position, bytes, EntryInfo]] = {}
        missing: list[Position] = []
        view = self.topic.compacted if self.reads_compacted() else None
        for p in positions:
            if view is not None and p <= view.horizon:
                data = view.get(p)
                if data is not None:
                    out[p] = (p, data, EntryInfo.from_entry(data))
                else:
                    self._replay_discard(p)        # compacted away meanwhile
                    self.outstanding.pop(p, None)
                    d.forget(p)
                continue
            hit = self.topic.cached(p)
            if hit is not None:
                out[p] = (p, hit.entry, hit.info)
            else:
                missing.append(p)
        i = 0
        while i < len(missing):
            p0 = missing[i]
            j = i
            while (j + 1 < len(missing) and missing[j + 1].ledger_id == p0.ledger_id
                   and missing[j + 1].entry_id - p0.entry_id < 4 * MAX_READ_ENTRIES):
                j += 1
            span = missing[j].entry_id - p0.entry_id + 1
            wanted = set(missing[i:j + 1])
            for pos, data in await self.ml.read_entries(p0, span):
                if pos in wanted:
                    out[pos] = (pos, data, self.topic.entry_info(pos, data))
            for p in wanted:
                if p not in out:     # gone from storage: nothing left to redeliver
                    log.warning("%s: entry %s to redeliver no longer exists", self, p)
                    self._replay_discard(p)
                    self.outstanding.pop(p, None)
                    d.forget(p)
            i = j + 1
        return [out[p] for p in positions if p in out]

    # -- introspection -----------------------------------------------------------
    def unacked(self) -> int:
        return sum(len(c.pending) for c in self.consumers)


_MISSING = object()
