from __future__ import annotations

import uuid

import pytest

from tests.broker.memory import BrokerThread


@pytest.fixture
def broker():
    b = BrokerThread().start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def client(broker):
    import pulsar
    c = pulsar.Client(broker.url, operation_timeout_seconds=15,
                      logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def topic():
    return f"persistent://public/default/t-{uuid.uuid4().hex[:10]}"
