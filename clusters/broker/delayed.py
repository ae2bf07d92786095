"""Delayed delivery on Shared and Key_Shared subscriptions (Pulsar's InMemoryDelayedDeliveryTracker):
an entry read before its deliver_at_time waits in the subscription's delayed index, outstanding so that
the cursor keeps it, and joins the replay set when its time comes.

`DelayedDelivery` is a part of `Subscription` (clusters/broker/subscription.py): it reads and changes
the subscription's state (`outstanding`, `_heap`, the replay set, `read_position`) and calls its
dispatcher. The bug knob `broker.delayed_index_in_memory` makes a waiting entry count as consumed for
the cursor, so that only this in-memory index remembers it.
"""
from __future__ import annotations

import asyncio
import heapq
import time

from clusters.broker.managed_ledger import Position

_MISSING = object()


class DelayedDelivery:
    """The delayed index of a subscription (a mixin of `Subscription`)."""

    def _init_delayed(self, enabled: bool, in_memory: bool) -> None:
        # entries read whose deliver_at_time is still ahead, position -> that time (ms); they stay
        # outstanding (None), so the cursor keeps them
        self.delayed: dict[Position, int] = {}
        self._delayed_heap: list[tuple[int, int, int]] = []
        self._delay_timer: asyncio.TimerHandle | None = None
        self._delay_timer_at = 0
        self._delayed_enabled = enabled             # delayedDeliveryEnabled
        self._delayed_in_memory = in_memory         # the bug knob broker.delayed_index_in_memory

    # -- delayed delivery (Pulsar's DelayedDeliveryTracker, on Shared and Key_Shared) -------------
    def _dispatch_with_delayed(self, entries: list, now: float) -> bool:
        """A log read holding entries whose deliver_at_time is ahead: those wait in the delayed
        index (outstanding, so the cursor keeps them); the others are dispatched. Reading resumes
        after the last entry dealt with."""
        kept = [e for e in entries if e[2].deliver_at <= now]
        n = self.dispatcher.dispatch(kept, False) if kept else 0
        boundary = kept[n][0] if n < len(kept) else None      # the first entry not dealt with
        heap = self._heap
        for pos, _, _ in kept[:n]:
            heapq.heappush(heap, (pos.ledger_id, pos.entry_id))
        held = 0
        for pos, _, info in entries:
            if info.deliver_at <= now:
                continue
            if boundary is not None and pos > boundary:
                break
            self._delay(pos, info.deliver_at)
            heapq.heappush(heap, (pos.ledger_id, pos.entry_id))
            held += 1
        if n == 0 and held == 0:
            return False
        self.read_position = boundary if boundary is not None else self.topic.successor(entries[-1][0])
        if self._delayed_in_memory:
            self._update_mark_delete()
        return True

    def _hold_delayed_replay(self, entries: list) -> list:
        """Entries waiting for redelivery (after a restart, a consumer leaving) whose time has not
        come go back to the delayed index; the rest are returned."""
        now = time.time() * 1000.0
        out = []
        for e in entries:
            at = e[2].deliver_at
            if at > now:
                self._replay_discard(e[0])
                self._delay(e[0], at)
            else:
                out.append(e)
        return out

    def _delay(self, pos: Position, at: int) -> None:
        self.delayed[pos] = at
        heapq.heappush(self._delayed_heap, (at, pos.ledger_id, pos.entry_id))
        if self._delayed_in_memory:
            # the bug knob: to the cursor the message looks consumed; only this index remembers it
            self.outstanding.pop(pos, None)
        else:
            self.outstanding[pos] = None
        self._arm_delay_timer()

    def _arm_delay_timer(self) -> None:
        heap = self._delayed_heap
        if not heap or self.closed:
            return
        at = heap[0][0]
        if self._delay_timer is not None:
            if self._delay_timer_at <= at:
                return
            self._delay_timer.cancel()
        loop = asyncio.get_running_loop()
        self._delay_timer_at = at
        self._delay_timer = loop.call_later(max(0.0, (at - time.time() * 1000.0) / 1000.0) + 0.001,
                                            self._delayed_due)

    def _delayed_due(self) -> None:
        """Entries whose time has come join the replay set (delivered before new reads)."""
        self._delay_timer = None
        now = time.time() * 1000.0
        heap = self._delayed_heap
        woke = False
        while heap and heap[0][0] <= now:
            at, l, e = heapq.heappop(heap)
            pos = Position(l, e)
            if self.delayed.get(pos) != at:
                continue
            del self.delayed[pos]
            if self._delayed_in_memory:
                if pos in self.outstanding:
                    continue
                self.outstanding[pos] = None
                heapq.heappush(self._heap, (l, e))
            elif self.outstanding.get(pos, _MISSING) is not None:
                continue                 # acknowledged (or handed out) meanwhile
            self._replay_add(pos)
            woke = True
        if woke:
            self.wake()
        self._arm_delay_timer()
