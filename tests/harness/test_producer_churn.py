"""Producer churn in the workloads: replaced in the background after their lifetime (sends go on
through the old one meanwhile), old ones closed only later."""
import time

from workloads import log


class FakeProducer:
    def __init__(self, name):
        self.name, self.closed = name, False

    def close(self):
        self.closed = True


class FakeClient:
    def __init__(self):
        self.made = []

    def create_producer(self, topic, **kw):
        p = FakeProducer(kw["producer_name"])
        self.made.append(p)
        return p


def session(lifetime):
    s = log.Session("pulsar://127.0.0.1:1", "t", producer_lifetime=lifetime)   # connects lazily: never here
    s.client = FakeClient()
    return s


def test_producers_are_replaced_after_their_lifetime_and_closed_later():
    s = session(0.05)
    first = s.producer("persistent://public/default/x-0", False)
    assert s.producer("persistent://public/default/x-0", False) is first       # young: reused
    time.sleep(0.1)
    assert s.producer("persistent://public/default/x-0", False) is first        # the replacement is under way
    second = _wait_for_another(s, first)
    assert second.name != first.name
    assert not first.closed, "the old producer's sends must be allowed to finish"
    assert s.producer("persistent://public/default/x-0", False) is second


def _wait_for_another(s, first, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        p = s._producers.get(("persistent://public/default/x-0", False))
        if p is not first:
            return p
        time.sleep(0.01)
    raise AssertionError("the producer was not replaced")


def test_a_hanging_replacement_does_not_stall_sends():
    import threading
    s = session(0.01)
    first = s.producer("persistent://public/default/x-0", False)
    time.sleep(0.05)
    release, finished = threading.Event(), threading.Event()
    make = s.client.create_producer

    def slow(topic, **kw):
        release.wait(5)
        finished.set()
        return make(topic, **kw)
    s.client.create_producer = slow
    for _ in range(5):
        assert s.producer("persistent://public/default/x-0", False) is first
    assert not finished.is_set()          # the calls returned while the creation still hung
    release.set()
    assert _wait_for_another(s, first) is not first


def test_lifetime_zero_keeps_producers():
    s = session(0.0)
    first = s.producer("persistent://public/default/x-0", True)
    time.sleep(0.05)
    assert s.producer("persistent://public/default/x-0", True) is first
    assert len(s.client.made) == 1


def test_a_failed_replacement_keeps_the_old_producer():
    s = session(0.01)
    first = s.producer("persistent://public/default/x-0", False)
    time.sleep(0.05)

    def boom(topic, **kw):
        raise RuntimeError("lookup timed out")
    s.client.create_producer = boom
    assert s.producer("persistent://public/default/x-0", False) is first
    time.sleep(0.1)                                         # the background attempt failed ...
    assert s.producer("persistent://public/default/x-0", False) is first   # ... and the old one stays
