"""Bookie cookies (clusters/bookie/cookie.py) and formatting: the decision on the files and a real
ZooKeeper, then real bookie processes refusing a wiped disk, formatted, and in limbo.

BookKeeper's behaviour: https://bookkeeper.apache.org/docs/latest/api/javadoc/org/apache/bookkeeper/bookie/Cookie.html,
apache/bookkeeper#544 (PR #712: empty directories while the registration holds a cookie are an
InvalidCookieException), BP-46 (PR #2936: limbo ledgers never answer an explicit negative).
"""
from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusters.bookie import cookie as C
from clusters.bookie import protocol as P
from clusters.metadata.store import MetadataStore
from tests.bookie.cluster import REPO
from tests.bookie.test_bookie import RawClient

pytestmark = pytest.mark.timeout(90)
HOW = "the format command"


def want(data: Path, bookie="127.0.0.1:3181", instance="inst-1") -> C.Cookie:
    return C.expected(bookie, data, instance)


def dirs_of(data: Path) -> dict[str, C.Cookie | None]:
    journal, ledgers = C.bookie_dirs(data)
    return {str(d): C.read_dir_cookie(d) for d in [journal, *ledgers]}


def stamp_dirs(data: Path, cookie: C.Cookie) -> None:
    journal, ledgers = C.bookie_dirs(data)
    for d in [journal, *ledgers]:
        C.write_dir_cookie(d, cookie)


# ------------------------------------------------------------------------------ the decision

def test_cookie_round_trip_and_new_then_same_bookie(tmp_path):
    w = want(tmp_path)
    assert C.Cookie.parse(w.serialize(), "x") == w
    assert w.serialize().startswith(b"5\nbookieHost: \"127.0.0.1:3181\"\n")
    assert C.decide(w, None, dirs_of(tmp_path), HOW) == "new"       # nothing anywhere
    stamp_dirs(tmp_path, w)
    assert (tmp_path / "current" / "VERSION").is_file() and (tmp_path / "journal/current/VERSION").is_file()
    assert C.decide(w, w, dirs_of(tmp_path), HOW) == "ok"


def test_missing_directory_cookie_refuses_and_names_the_fix(tmp_path):
    w = want(tmp_path)
    stamp_dirs(tmp_path, w)
    shutil.rmtree(tmp_path / "journal")                   # the journal disk replaced
    with pytest.raises(C.CookieError) as e:
        C.decide(w, w, dirs_of(tmp_path), HOW)
    msg = str(e.value)
    assert msg.startswith("bookie 127.0.0.1:3181: cookie is missing on disk (wiped or replaced) while the metadata "
                          "store holds one; format it as a new bookie (the format command)")
    assert "missing: " in msg and "journal/current/VERSION" in msg
    assert "\n" not in msg and HOW in msg
    shutil.rmtree(tmp_path / "current")                   # every disk wiped: still refused
    with pytest.raises(C.CookieError, match="cookie is missing on disk .*missing: .*current/VERSION"):
        C.decide(w, w, dirs_of(tmp_path), HOW)


def test_mismatched_instance_and_bookie_id_refuse(tmp_path):
    w = want(tmp_path)
    stamp_dirs(tmp_path, want(tmp_path, instance="inst-OTHER"))       # a disk of another cluster
    with pytest.raises(C.CookieError, match=r"does not match the metadata store's \(instanceId 'inst-OTHER' != 'inst-1'\)"):
        C.decide(w, w, dirs_of(tmp_path), HOW)
    stamp_dirs(tmp_path, want(tmp_path, bookie="10.0.0.9:3181"))     # another bookie's disk
    with pytest.raises(C.CookieError, match="bookieHost '10.0.0.9:3181' != '127.0.0.1:3181'.*another bookie"):
        C.decide(w, w, dirs_of(tmp_path), HOW)
    # the metadata's own cookie from another instance (the cluster's metadata was re-created)
    with pytest.raises(C.CookieError, match="metadata store's cookie does not match"):
        C.decide(w, want(tmp_path, instance="inst-0"), dirs_of(tmp_path), HOW)
    # directory cookies but none in the metadata store
    stamp_dirs(tmp_path, w)
    with pytest.raises(C.CookieError, match="but not in the metadata store"):
        C.decide(w, None, dirs_of(tmp_path), HOW)


def test_corrupt_cookie_file_is_a_clear_error(tmp_path):
    w = want(tmp_path)
    stamp_dirs(tmp_path, w)
    (tmp_path / "current" / "VERSION").write_bytes(b"5\nbookieHost: \"127.0.0.1:3181\"\ngarbage\n")
    with pytest.raises(C.CookieError, match=r"cookie .*/current/VERSION is corrupt \(unexpected line 'garbage'\)"):
        dirs_of(tmp_path)
    (tmp_path / "current" / "VERSION").write_bytes(b"\xff\xfe")
    with pytest.raises(C.CookieError, match="is corrupt"):
        dirs_of(tmp_path)
    (tmp_path / "current" / "VERSION").write_bytes(w.serialize().replace(b'instanceId: "inst-1"\n', b""))
    with pytest.raises(C.CookieError, match=r"is corrupt \(no instanceId\)"):
        dirs_of(tmp_path)


def test_check_stamp_and_format_on_zookeeper(zk, tmp_path):
    async def scenario():
        store = await MetadataStore(zk).start()
        try:
            state, cookie = await C.check(store, "127.0.0.1:1", tmp_path, HOW)
            assert state == "new"
            inst = (await store.get(C.INSTANCE_ID))[0].decode()
            assert cookie.instance_id == inst and len(inst) == 36            # created once, kept
            await C.stamp(store, cookie)
            assert (await C.check(store, "127.0.0.1:1", tmp_path, HOW))[0] == "ok"
            assert C.Cookie.parse((await store.get("/ledgers/cookies/127.0.0.1:1"))[0], "zk") == cookie
            # a second bookie at another address has its own cookie under the same instance
            other = tmp_path / "other"
            st2, c2 = await C.check(store, "127.0.0.1:2", other, HOW)
            assert st2 == "new" and c2.instance_id == inst
            with pytest.raises(C.CookieError, match="another bookie wrote a cookie"):
                await C.write_metadata_cookie(store, cookie)
            # format: the metadata cookie and the local data go; then it is new again
            (tmp_path / "entrylogs").mkdir()
            (tmp_path / "config.json").write_text("{}")
            out = await C.format_bookie(store, "127.0.0.1:1", tmp_path)
            assert out["cookie_deleted"] is True and sorted(out["removed"]) == ["current", "entrylogs", "journal"]
            assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]
            assert (await C.check(store, "127.0.0.1:1", tmp_path, HOW))[0] == "new"
        finally:
            await store.close()
    asyncio.run(scenario())


# ------------------------------------------------------------------------------ real bookies

def wipe(data: Path) -> None:
    for p in data.iterdir():
        shutil.rmtree(p) if p.is_dir() else p.unlink()


def format_cli(cfg_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clusters.bookie.cookie", "format", str(cfg_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def wait_exit(b, timeout=30.0) -> int:
    b.proc.wait(timeout)
    return b.proc.returncode


def test_wiped_bookie_refuses_until_formatted_then_limbo(bookies, zk):
    """A bookie that held a ledger is wiped: it exits with code 3 and one line naming the fix; the
    format command deletes its cookie; started again it is new, the ledger is in limbo: entries it
    lost are answered ERROR, never NO_SUCH_ENTRY, and the ledger is marked under-replicated."""
    from clusters.autorecovery.urmanager import UnderreplicationManager
    from clusters.bookkeeper.client import BookKeeper
    (b,) = bookies.start(1, autorecovery_enabled=False)
    data = Path(b.cfg.data_dir)

    async def write():
        store = await MetadataStore(zk).start()
        bk = await BookKeeper(store).start()
        try:
            lh = await bk.create_ledger(1, 1, 1)
            for i in range(3):
                await lh.add_entry(f"e{i}".encode())
            return lh.ledger_id, C.Cookie.parse((await store.get(f"/ledgers/cookies/{b.addr}"))[0], "zk")
        finally:
            await bk.close()
            await store.close()
    ledger, meta = asyncio.run(write())
    assert meta.bookie_id == b.addr and C.read_dir_cookie(data) == meta == C.read_dir_cookie(data / "journal")

    b.kill9()
    wipe(data)
    b.start(wait=False)
    assert wait_exit(b) == 3
    refusal = [ln for ln in b.log_tail(200).splitlines() if "cookie is missing" in ln]
    assert len(refusal) == 1 and "format it as a new bookie" in refusal[0], b.log_tail()
    assert "Traceback" not in b.log_tail(200)

    bad = format_cli(Path(b.dir) / "nope.json")
    assert bad.returncode == 254 and bad.stderr.count("\n") == 1 and bad.stderr.startswith("error: ")
    r = format_cli(b.cfg_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["cookie_deleted"] is True

    b.start()

    async def after():
        store = await MetadataStore(zk).start()
        c = await RawClient(b.cfg.port).connect()
        try:
            for e in range(3):
                assert (await c.read(ledger, e))[0] == P.ERROR          # limbo: unknown, not "absent"
            assert (await c.read(ledger + 1000, 0))[0] == P.NO_SUCH_LEDGER   # a ledger it never had
            assert (await c.add(ledger, 3, b"late"))[1] == P.FENCED      # fenced in limbo
            urm = UnderreplicationManager(store, lambda fn, *a, **kw: fn(*a, **kw))
            rec, _ = await urm.get(ledger)
            assert rec["replicas"] == [b.addr] and rec["formatted"] == [b.addr]
            new = C.Cookie.parse((await store.get(f"/ledgers/cookies/{b.addr}"))[0], "zk")
            assert new == meta      # same id, dirs and instance: a new bookie with the same cookie fields
        finally:
            await c.close()
            await store.close()
    asyncio.run(after())
    # limbo survives a restart (it is written before the cookies)
    assert b.stop() == 0
    b.start()

    async def again():
        c = await RawClient(b.cfg.port).connect()
        try:
            assert (await c.read(ledger, 0))[0] == P.ERROR
        finally:
            await c.close()
    asyncio.run(again())


def test_no_cookie_knob_rejoins_a_wiped_bookie_under_its_identity(bookies, zk):
    """bookie.no_cookie: no cookie written or checked; wiped, it starts at once and answers
    NO_SUCH_LEDGER for a ledger it had acknowledged."""
    (b,) = bookies.start(1, autorecovery_enabled=False, bugs={"bookie.no_cookie": True})
    data = Path(b.cfg.data_dir)

    async def add():
        c = await RawClient(b.cfg.port).connect()
        try:
            assert (await c.add(7, 0, b"acked"))[1] == P.OK
            store = await MetadataStore(zk).start()
            try:
                assert await store.get_or_none(f"/ledgers/cookies/{b.addr}") is None
            finally:
                await store.close()
        finally:
            await c.close()
    asyncio.run(add())
    assert not (data / "current").exists()
    b.kill9()
    wipe(data)
    t0 = time.monotonic()
    b.start()

    async def read():
        c = await RawClient(b.cfg.port).connect()
        try:
            return (await c.read(7, 0))[0]
        finally:
            await c.close()
    assert asyncio.run(read()) == P.NO_SUCH_LEDGER and time.monotonic() - t0 < 20


def test_no_limbo_knob_trusts_a_formatted_bookie_and_recovery_truncates(bookies, zk):
    """bookie.no_limbo (apache/bookkeeper#2612): the cookies still refuse the wiped disk, but once
    formatted the bookie rejoins trusted: 'no such ledger' for the entries it acknowledged (not ERROR),
    nothing fenced or marked under-replicated, and ledger recovery (E = Qw = Qa = 1) takes that answer
    for the truth and closes the ledger empty. In limbo (the knob off, the test above) it answers ERROR,
    which a recovery read counts as unknown: the recovery fails rather than truncate."""
    from clusters.autorecovery.urmanager import UnderreplicationManager
    from clusters.bookkeeper.client import BookKeeper
    (b,) = bookies.start(1, autorecovery_enabled=False, bugs={"bookie.no_limbo": True})
    data = Path(b.cfg.data_dir)

    async def write() -> int:
        store = await MetadataStore(zk).start()
        bk = await BookKeeper(store).start()
        try:
            lh = await bk.create_ledger(1, 1, 1)
            for i in range(3):
                await lh.add_entry(f"e{i}".encode())
            return lh.ledger_id
        finally:
            await bk.close()
            await store.close()
    ledger = asyncio.run(write())
    b.kill9()
    wipe(data)
    b.start(wait=False)
    assert wait_exit(b) == 3                    # the cookies still refuse the wiped disk
    assert format_cli(b.cfg_path).returncode == 0
    b.start()

    async def after() -> int:
        store = await MetadataStore(zk).start()
        c = await RawClient(b.cfg.port).connect()
        bk = await BookKeeper(store).start()
        try:
            assert (await c.read(ledger, 0))[0] in (P.NO_SUCH_LEDGER, P.NO_SUCH_ENTRY)   # trusted "absent"
            urm = UnderreplicationManager(store, lambda fn, *a, **kw: fn(*a, **kw))
            assert await urm.get(ledger) is None                                         # nothing marked
            rh = await bk.open_ledger(ledger, recovery=True)
            return rh.last_entry_id
        finally:
            await bk.close()
            await c.close()
            await store.close()
    assert asyncio.run(after()) == -1           # three acknowledged entries truncated away
