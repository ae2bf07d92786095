"""Shared by the broker's Topic-level tests: a recording stand-in for the connection, and `run`."""
from __future__ import annotations

import asyncio

from clusters.broker.managed_ledger import Position


class FakeCnx:
    """Records what the topic asks the connection to send."""

    def __init__(self) -> None:
        self.messages: list[tuple[int, Position, int]] = []
        self.ack_sets: dict[tuple[int, Position], list[int]] = {}
        self.active_changes: list[tuple[int, bool]] = []
        self.receipts: list[tuple[int, int, Position]] = []
        self.send_errors: list[tuple[int, int, int]] = []
        self.closed_producers: list[int] = []
        self.closed_consumers: list[int] = []
        self.consumers: dict = {}
        self.producers: dict = {}
        self.writable = True
        self.active = True
        self.pending = 0

    def send_message(self, consumer_id, ledger_id, entry_id, redelivery_count, entry, ack_set=None,
                     partition=-1):
        self.messages.append((consumer_id, Position(ledger_id, entry_id), redelivery_count))
        if ack_set:
            self.ack_sets[(consumer_id, Position(ledger_id, entry_id))] = list(ack_set)

    def send_receipt(self, producer_id, sequence_id, ledger_id, entry_id, highest):
        self.receipts.append((producer_id, sequence_id, Position(ledger_id, entry_id)))

    def send_send_error(self, producer_id, sequence_id, error, message):
        self.send_errors.append((producer_id, sequence_id, error))

    def add_pending_send(self, delta):
        self.pending += delta

    def broker_close_producer(self, p, url=None):
        self.closed_producers.append(p.producer_id)

    def forget_producer(self, p):
        pass

    def broker_close_consumer(self, c, url=None, *, notify=True):
        if notify:
            self.closed_consumers.append(c.consumer_id)

    def send_active_consumer_change(self, consumer_id, is_active):
        self.active_changes.append((consumer_id, is_active))

    async def check_liveness(self, timeout):
        return True

    def close(self, reason=""):
        self.active = False


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))
