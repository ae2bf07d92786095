"""The bookie process: durability across kill -9, persistent fences, robustness to bad frames."""
from __future__ import annotations

import asyncio
import json
import socket
import time

import crc32c
import pytest

from clusters.bookie import protocol as P
from clusters.bookie.journal import parse_records, _record, T_ADD, ADD_FIELDS
from clusters.metadata.store import MetadataStore

pytestmark = pytest.mark.timeout(60)


class RawClient:
    """A minimal pipelined protocol client for talking to one bookie."""

    def __init__(self, port: int):
        self.port = port
        self.rid = 0
        self.futs: dict[int, asyncio.Future] = {}
        self.reader_task = None

    async def connect(self) -> "RawClient":
        self.r, self.w = await asyncio.open_connection("127.0.0.1", self.port)
        self.reader_task = asyncio.get_running_loop().create_task(self._read())
        return self

    async def _read(self) -> None:
        fr = P.FrameReader()
        try:
            while True:
                data = await self.r.read(65536)
                if not data:
                    break
                for op, status, _v, rid, ledger, entry, body in fr.feed(data):
                    fut = self.futs.pop(rid, None)
                    if fut is not None and not fut.done():
                        fut.set_result((op, status, ledger, entry, body))
        finally:
            for f in self.futs.values():
                if not f.done():
                    f.set_exception(ConnectionError("closed"))

    def send(self, op: int, ledger: int, entry: int, body: bytes = b"", flags: int = 0,
             rid: int | None = None) -> asyncio.Future:
        if rid is None:
            self.rid += 1
            rid = self.rid
        fut = asyncio.get_running_loop().create_future()
        self.futs[rid] = fut
        self.w.write(P.encode_request(op, flags, rid, ledger, entry, body))
        return fut

    def add(self, ledger: int, entry: int, payload: bytes, lac: int = -1, length: int = 0,
            flags: int = 0) -> asyncio.Future:
        body = P.ADD_BODY.pack(lac, length, crc32c.crc32c(payload)) + payload
        return self.send(P.ADD, ledger, entry, body, flags)

    async def read(self, ledger: int, entry: int, flags: int = 0):
        op, status, _l, _e, body = await self.send(P.READ, ledger, entry, flags=flags)
        if status != P.OK:
            return status, None
        return status, P.decode_read_body(body)

    async def close(self) -> None:
        self.w.close()
        try:
            await self.w.wait_closed()
        except Exception:
            pass
        if self.reader_task:
            self.reader_task.cancel()


def payload(ledger: int, entry: int) -> bytes:
    return f"ledger {ledger} entry {entry} ".encode() * 3


def test_journal_record_format_and_torn_tail():
    recs = b"PCJRNL01" + b"".join(
        _record(T_ADD, i + 1, ADD_FIELDS.pack(5, i, i - 1, 0, 0), b"x" * i) for i in range(5))
    out, valid, torn = parse_records(recs)
    assert [r[3] for r in out] == [0, 1, 2, 3, 4] and not torn and valid == len(recs)
    out, valid, torn = parse_records(recs[:-3])           # torn tail: last record dropped
    assert [r[3] for r in out] == [0, 1, 2, 3] and torn
    bad = bytearray(recs)
    bad[-1] ^= 0xFF                                      # corrupt tail: crc mismatch
    out, _, torn = parse_records(bytes(bad))
    assert len(out) == 4 and torn


def test_acked_entries_survive_kill9_and_fence_persists(bookies, zk):
    (b,) = bookies.start(1, flush_interval_ms=300)

    async def phase1():
        c = await RawClient(b.cfg.port).connect()
        # batch A, then let a checkpoint move it to the entry log + index
        res = await asyncio.gather(*[c.add(1, e, payload(1, e), lac=e - 1) for e in range(300)])
        assert all(r[1] == P.OK for r in res)
        await asyncio.sleep(1.0)
        # batch B on two ledgers: acknowledged from the journal only (kill -9 right after)
        res = await asyncio.gather(
            *[c.add(1, e, payload(1, e), lac=e - 1) for e in range(300, 600)],
            *[c.add(2, e, payload(2, e), lac=e - 1) for e in range(200)])
        assert all(r[1] == P.OK for r in res)
        # fence a ledger this bookie has never seen, and ledger 2
        for lid in (77, 2):
            op, status, _, _, body = await c.send(P.FENCE, lid, -1)
            assert status == P.OK
        _, _, _, max_lac, last, _ = P.decode_read_body(body)
        assert (max_lac, last) == (198, 199)
        op, status, *_ = await c.add(2, 200, b"late")
        assert status == P.FENCED
        op, status, *_ = await c.add(77, 0, b"late")
        assert status == P.FENCED
        await c.close()
    asyncio.run(phase1())
    b.kill9()
    b.start()

    async def phase2():
        c = await RawClient(b.cfg.port).connect()
        for lid, n in ((1, 600), (2, 200)):
            for e in range(n):
                status, rb = await c.read(lid, e)
                assert status == P.OK, (lid, e, P.STATUS[status])
                assert rb[5] == payload(lid, e)
                assert rb[0] == e - 1
            status, _ = await c.read(lid, n)
            assert status == P.NO_SUCH_ENTRY
        status, rb = await c.read(1, -1)       # entry -1 = LAC read
        assert status == P.OK and rb[3:5] == (598, 599)
        status, _ = await c.read(12345, 0)
        assert status == P.NO_SUCH_LEDGER
        # fences survived the crash: normal adds refused, recovery adds accepted
        for lid, e in ((2, 200), (77, 0)):
            assert (await c.add(lid, e, b"x"))[1] == P.FENCED
            assert (await c.add(lid, e, b"rec", flags=P.FLAG_RECOVERY_ADD))[1] == P.OK
            status, rb = await c.read(lid, e)
            assert status == P.OK and rb[5] == b"rec"
        assert (await c.add(1, 600, b"more"))[1] == P.OK   # ledger 1 was never fenced
        await c.close()
    asyncio.run(phase2())
    # a clean stop (SIGTERM) checkpoints and exits 0; the data is still there after
    assert b.stop() == 0
    b.start()

    async def phase3():
        c = await RawClient(b.cfg.port).connect()
        status, rb = await c.read(1, 600)
        assert status == P.OK and rb[5] == b"more"
        status, rb = await c.read(1, 17)
        assert status == P.OK and rb[5] == payload(1, 17)
        assert (await c.add(2, 201, b"x"))[1] == P.FENCED
        await c.close()
    asyncio.run(phase3())


def test_malformed_frames_do_not_crash_the_bookie(bookies):
    (b,) = bookies.start(1)
    port = b.cfg.port

    def raw_garbage(data: bytes) -> bytes:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            out = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    return out
                out += chunk
        except (ConnectionResetError, socket.timeout):
            return b""
        finally:
            s.close()

    raw_garbage(b"\xff\xff\xff\xffGARBAGEGARBAGE" * 10)         # oversized length
    raw_garbage((2 ** 30).to_bytes(4, "big") + b"x" * 100)      # big but "plausible" length
    raw_garbage(b"\x00\x00\x00\x03abc")                         # shorter than a header
    raw_garbage(bytes(range(256)) * 4)

    async def scenario():
        c = await RawClient(port).connect()
        # well-framed but meaningless requests get BAD_REQUEST and the connection stays up
        _, status, *_ = await c.send(99, 1, 0)
        assert status == P.BAD_REQUEST
        _, status, *_ = await c.send(P.ADD, 1, 0, b"short")
        assert status == P.BAD_REQUEST
        body = P.ADD_BODY.pack(-1, 0, 12345) + b"payload with a wrong checksum"
        _, status, *_ = await c.send(P.ADD, 1, 0, body)
        assert status == P.BAD_REQUEST
        assert (await c.add(1, 0, b"ok"))[1] == P.OK
        # a half-sent frame from another client does not block anybody
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(P.encode_request(P.ADD, 0, 1, 1, 1, b"x" * 100)[:40])
        c2 = await RawClient(port).connect()
        assert (await c2.add(1, 1, b"ok2"))[1] == P.OK
        status, rb = await c2.read(1, 1)
        assert status == P.OK and rb[5] == b"ok2"
        s.close()
        await c.close()
        await c2.close()
    asyncio.run(scenario())
    assert b.alive()


def test_registration_and_pipelined_out_of_order_responses(bookies, zk):
    (b,) = bookies.start(1, journal_max_group_wait_ms=5.0)

    async def scenario():
        store = await MetadataStore(zk).start()
        try:
            for _ in range(100):
                if await store.exists(f"/ledgers/available/{b.addr}"):
                    break
                await asyncio.sleep(0.1)
            data, _ = await store.get(f"/ledgers/available/{b.addr}")
            assert json.loads(data)["port"] == b.cfg.port
        finally:
            await store.close()
        c = await RawClient(b.cfg.port).connect()
        t0 = time.monotonic()
        futs = [c.add(9, e, b"p" * 100, lac=e - 1) for e in range(3000)]
        futs.append(c.send(P.READ_LAC, 9, -1))
        res = await asyncio.gather(*futs)
        assert all(r[1] == P.OK for r in res)
        assert time.monotonic() - t0 < 20
        await c.close()
    asyncio.run(scenario())


@pytest.mark.parametrize("sync_data,ack_before_fsync,fsync_before_ack", [
    (True, False, True),      # the default: ack only after the group is fsynced
    (True, True, False),      # bug knob bookie.ack_before_fsync
    (False, False, False),    # journal_sync_data=false (BookKeeper semantics)
])
def test_journal_ack_timing(tmp_path, monkeypatch, sync_data, ack_before_fsync, fsync_before_ack):
    from clusters.bookie import journal as J
    events: list[str] = []
    real = J.os.fdatasync

    def fdatasync(fd):
        events.append("fsync")
        real(fd)
    monkeypatch.setattr(J.os, "fdatasync", fdatasync)

    async def scenario():
        j = J.Journal(tmp_path / "j", sync_data=sync_data, ack_before_fsync=ack_before_fsync,
                      page_cache_flush_ms=60000)
        j.replay(0, lambda rec: None)
        await j.start()
        done = asyncio.get_running_loop().create_future()
        j.log_add(1, 0, -1, 3, crc32c.crc32c(b"abc"), b"abc",
                  lambda exc: (events.append("ack"), done.set_result(exc)))
        assert await done is None
        acked_after = list(events)
        fence = asyncio.get_running_loop().create_future()
        j.log_fence(1, lambda exc: (events.append("fence-ack"), fence.set_result(exc)))
        await fence
        await j.close()
        return acked_after
    acked_after = asyncio.run(scenario())
    assert (acked_after == ["fsync", "ack"]) is fsync_before_ack, acked_after
    if not fsync_before_ack:
        assert acked_after == ["ack"]
    # a fence is always durable before it is acknowledged, whatever the ack mode
    assert events[events.index("ack") + 1:] == ["fsync", "fence-ack"]
    records = []
    j2 = J.Journal(tmp_path / "j")
    j2.replay(0, records.append)
    assert [(r[0], r[2]) for r in records] == [(J.T_ADD, 1), (J.T_FENCE, 1)]


def test_reregisters_after_znode_loss_and_restart(bookies, zk):
    (b,) = bookies.start(1)
    path = f"/ledgers/available/{b.addr}"

    async def wait_owner(store, not_owner=None, timeout=10.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            owner = await store.owner_session(path)
            if owner is not None and owner != not_owner:
                return owner
            await asyncio.sleep(0.05)
        raise AssertionError(f"{path} not registered")

    async def scenario():
        store = await MetadataStore(zk).start()
        try:
            first = await wait_owner(store)
            await store.delete(path)                 # lost registration is re-created
            assert await wait_owner(store) == first
            b.kill9()
            b.start()
            # the new process takes over at once, without waiting for the old session to expire
            t0 = time.monotonic()
            second = await wait_owner(store, not_owner=first)
            assert second != first and time.monotonic() - t0 < 5
        finally:
            await store.close()
    asyncio.run(scenario())


def test_bookie_http_metrics_and_state(bookies):
    """The bookie's HTTP port: Prometheus metrics that move with traffic, state, 404 with a hint."""
    import urllib.error
    import urllib.request

    from clusters.metrics import parse
    (b,) = bookies.start(1)
    base = f"http://127.0.0.1:{b.cfg.http_port}"

    def get(path):
        try:
            with urllib.request.urlopen(base + path, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
    deadline = time.monotonic() + 30
    while True:
        try:
            status, text = get("/heartbeat")
            break
        except OSError:
            assert time.monotonic() < deadline, "bookie HTTP port never answered"
            time.sleep(0.2)
    assert (status, text.strip()) == (200, "OK")
    before = parse(get("/metrics")[1])
    assert "bookie_journal_sync_seconds_count" in before

    async def adds():
        c = await RawClient(b.cfg.port).connect()
        for i in range(5):
            assert (await c.add(7, i, b"x%d" % i))[1] == P.OK
        await c.close()
    asyncio.run(adds())
    after = parse(get("/metrics")[1])
    assert after["bookie_adds_total"] == before["bookie_adds_total"] + 5
    assert after["bookie_journal_sync_seconds_count"] > before["bookie_journal_sync_seconds_count"]
    assert after["bookie_ledgers"] >= 1
    status, text = get("/api/v1/bookie/state")
    assert status == 200 and json.loads(text)["bookieId"] == b.addr
    status, text = get("/nope")
    assert status == 404 and "/metrics" in json.loads(text)["reason"]
