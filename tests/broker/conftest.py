from __future__ import annotations

import uuid

import pytest

from tests.broker.memory import BrokerThread
from tests.netns import pulsar_client


@pytest.fixture
def broker():
    b = BrokerThread().start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def client(broker):
    with pulsar_client(broker.url, operation_timeout_seconds=15) as c:
        yield c


@pytest.fixture
def topic():
    return f"persistent://public/default/t-{uuid.uuid4().hex[:10]}"
