"""B5 (apache/bookkeeper#2908, PR #2909): a bookie's entry log damaged under its index (the
`disk-corrupt` / `disk-truncate` faults, clusters/bookie/corrupt.py). A read of a damaged entry is an
I/O error (ERROR: "unknown" to a recovery), never "no such entry"; the knob
`bk.corrupt_log_says_nosuchentry` answers NO_SUCH_ENTRY, and ledger recovery then closes the ledger
before an acknowledged entry the other bookie still holds.

The first tests use the storage and the bookie's read path in this process (no ZooKeeper); the last one
real bookie processes and the BookKeeper client."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from clusters import config as node_config
from clusters.bookie import corrupt
from clusters.bookie import protocol as P
from clusters.bookie.server import Bookie
from clusters.bookie.storage import CorruptEntry, LedgerStorage
from clusters.config import BookieConfig
from tests.bookkeeper.test_bug_knobs import client

KNOB = "bk.corrupt_log_says_nosuchentry"
LEDGER = 7


def _payload(i: int) -> bytes:
    return b"entry-%04d-" % i + b"x" * 200


async def _fill(d: Path, n: int) -> None:
    """n entries of LEDGER written and checkpointed into d's entry log."""
    import crc32c
    s = LedgerStorage(d)
    s.open()
    for i in range(n):
        p = _payload(i)
        s.add_entry(LEDGER, i, i - 1, 0, crc32c.crc32c(p), p)
    assert await s.checkpoint(1)
    await s.close()


async def _read_all(d: Path, n: int) -> tuple[dict[int, bytes], dict[int, str]]:
    """Each entry's payload, or the CorruptEntry its read raised, from a fresh storage over d."""
    s = LedgerStorage(d)
    s.open()
    good, bad = {}, {}
    try:
        assert s.ledgers[LEDGER].last_entry == n - 1          # the index still lists every entry
        for i in range(n):
            try:
                e = await s.read(LEDGER, i)
                assert e is not None
                good[i] = e[3]
            except CorruptEntry as ex:
                bad[i] = str(ex)
    finally:
        await s.close()
    return good, bad


@pytest.mark.parametrize("mode", corrupt.MODES)
def test_a_damaged_entry_log_fails_the_reads_of_its_tail_only(tmp_path, mode):
    n = 40
    asyncio.run(_fill(tmp_path, n))
    out = corrupt.corrupt_entry_log(tmp_path, mode, [0.1, 0.3, 0.5, 0.7, 0.9, 0.2, 0.4, 0.6], flips=8)
    assert out["mode"] == mode and out["file"].endswith(".log")
    if mode == "truncate":
        assert out["size_after"] == out["offsets"][0] < out["size_before"]
    else:
        assert out["size_after"] == out["size_before"] and len(out["offsets"]) == 8
    good, bad = asyncio.run(_read_all(tmp_path, n))
    assert bad, "no read failed"
    assert min(bad) >= n * 3 // 4 - 2, bad          # the damage lies in the last quarter
    assert all(good[i] == _payload(i) for i in good)
    if mode == "truncate":
        assert max(bad) == n - 1 and all(i in bad for i in range(min(bad), n))


def test_nothing_to_corrupt_and_an_unknown_mode_are_refused(tmp_path):
    with pytest.raises(corrupt.CorruptError, match="no entry log with records"):
        corrupt.corrupt_entry_log(tmp_path, "truncate", [0.5])
    asyncio.run(_fill(tmp_path, 3))
    with pytest.raises(corrupt.CorruptError, match="use one of bitflip, truncate"):
        corrupt.corrupt_entry_log(tmp_path, "shred", [0.5])


class _Capture:
    """A connection that keeps what the bookie sends (the read path's only output)."""

    def __init__(self):
        self.sent: list[bytes] = []

    def send(self, data: bytes) -> None:
        self.sent.append(bytes(data))


def _status_of_reading(tmp_path: Path, knob: bool) -> list[int]:
    """The bookie's answer (status) to reads of the last entry, and of one below the damage."""
    d = tmp_path / ("on" if knob else "off")
    asyncio.run(_fill(d, 20))
    corrupt.corrupt_entry_log(d, "truncate", [0.5])

    async def go() -> list[int]:
        b = Bookie(BookieConfig(name="b", host="127.0.0.1", zk="", data_dir=str(d),
                                bugs={KNOB: True} if knob else {}))
        b.loop = asyncio.get_running_loop()
        b.storage.open()
        conn = _Capture()
        try:
            for rid, entry in enumerate((19, 2)):
                await b._read_slow(conn, rid, LEDGER, entry)        # type: ignore[arg-type]
        finally:
            await b.storage.close()
        return [P.FRAME_HEADER.unpack_from(f, 0)[2] for f in conn.sent]
    return asyncio.run(go())


def test_a_damaged_entry_is_an_error_and_with_the_knob_no_such_entry(tmp_path):
    assert _status_of_reading(tmp_path, knob=False) == [P.ERROR, P.OK]
    assert _status_of_reading(tmp_path, knob=True) == [P.NO_SUCH_ENTRY, P.OK]


@pytest.mark.timeout(90)
def test_recovery_truncates_at_a_damaged_entry_only_with_the_knob(bookies, zk):
    """E = Qw = Qa = 2. Entries 0-9 acknowledged on bookies A and B (their LAC 8), checkpointed into the
    entry logs; A killed, its newest log truncated (entry 9 lost from it, its index unchanged), started
    again; the recoverer's reads to B 0.4 s late. Without the knob A answers ERROR for entry 9, B's late
    OK makes it positive, and the ledger closes at 9; with it A's NO_SUCH_ENTRY alone (Qw - Qa + 1 = 1)
    decides entry 9 absent: closed at 8, the acknowledged entry 9 truncated."""

    a, b = bookies.start(2, flush_interval_ms=100)

    async def once(knob: bool) -> int:
        async with client(zk, 2, "w") as w:
            lh = await w.create_ledger(2, 2, 2)
            assert set(lh.ensemble) == {a.addr, b.addr}
            for i in range(10):
                await lh.add_entry(b"e%d" % i)
            await asyncio.sleep(0.6)                                  # checkpointed: the tail is in the log
        a.kill9()
        out = corrupt.corrupt_entry_log(Path(a.cfg.data_dir), "truncate", [0.99])
        assert out["size_after"] < out["size_before"]
        a.cfg.bugs = {KNOB: True} if knob else {}
        node_config.write(a.cfg, a.cfg_path)
        a.start()
        async with client(zk, 2, "r") as r:
            r.pool.fault = lambda addr, op, flags, ledger, entry: (
                0.4 if op == P.READ and entry != P.INVALID_ENTRY and addr == b.addr else None)
            rh = await r.open_ledger(lh.ledger_id, recovery=True)
        return rh.last_entry_id

    t = time.monotonic()
    assert asyncio.run(once(knob=False)) == 9
    assert asyncio.run(once(knob=True)) == 8          # acknowledged entry 9 truncated
    assert time.monotonic() - t < 60
