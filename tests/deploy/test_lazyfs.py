"""lazyfs (clusters/deploy/lazyfs.py) on a real FUSE mount: what survives a `crash` is exactly what
was fsync'ed, as seen through the mount by ordinary file calls; and the bookie's journal replays
what it had synced."""
from __future__ import annotations

import asyncio
import errno
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from clusters.deploy import lazyfs, procs
from clusters.deploy.backend import Unsupported
from clusters.deploy.netns import NetnsCluster
from clusters.deploy.spec import ROOT
from tests.deploy.conftest import unique_name

pytestmark = pytest.mark.integration      # needs root and /dev/fuse


@pytest.fixture
def fs(tmp_path):
    """A lazyfs mount: (mount point, control socket, backing dir)."""
    if not os.path.exists("/dev/fuse"):
        pytest.skip("no /dev/fuse")
    backing, mnt = tmp_path / "disk", tmp_path / "mnt"
    backing.mkdir()
    mnt.mkdir()
    sock = tmp_path / "lazyfs.sock"
    log = open(tmp_path / "lazyfs.log", "wb")
    proc = subprocess.Popen(lazyfs.command(backing, mnt, sock, fsname="pctest-lazyfs"), stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        lazyfs.wait_ready(mnt, sock, timeout=30, alive=lambda: proc.poll() is None)
        yield mnt, sock, backing
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        lazyfs.unmount(mnt)
        log.close()
        assert not lazyfs.is_mounted(mnt)


def crash(sock) -> dict:
    return lazyfs.control(sock, "crash")


def fsync_path(p: Path) -> None:
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def test_write_and_fsync_survives_a_crash(fs):
    mnt, sock, backing = fs
    with open(mnt / "a", "wb") as f:
        f.write(b"durable")
        f.flush()
        os.fsync(f.fileno())
    fsync_path(mnt)
    out = crash(sock)
    assert out["dropped_bytes"] == 0 and out["removed_files"] == 0
    assert (mnt / "a").read_bytes() == b"durable"
    assert (backing / "a").read_bytes() == b"durable"


def test_write_without_fsync_is_dropped(fs):
    mnt, sock, backing = fs
    p = mnt / "a"
    with open(p, "wb") as f:
        f.write(b"0123456789")
        f.flush()
        os.fsync(f.fileno())
    with open(p, "r+b") as f:
        f.seek(3)
        f.write(b"XYZ")                       # overwrite, never synced
    with open(p, "ab") as f:
        f.write(b"tail")                      # append, never synced
    assert p.read_bytes() == b"012XYZ6789tail"        # visible before the crash (page cache)
    assert (backing / "a").read_bytes() == b"0123456789"   # not on the disk yet
    out = crash(sock)
    assert out["dropped_bytes"] == 7 and out["dropped_files"] == 1
    assert p.read_bytes() == b"0123456789"
    assert p.stat().st_size == 10


def test_partial_fsync_keeps_what_the_last_fsync_covered(fs):
    mnt, sock, _ = fs
    p = mnt / "log"
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, b"A" * 5000)
        os.fdatasync(fd)
        os.write(fd, b"B" * 3000)
        os.fsync(fd)
        os.write(fd, b"C" * 7000)             # crosses page boundaries, never synced
    finally:
        os.close(fd)
    fsync_path(mnt)
    assert p.stat().st_size == 15000
    out = crash(sock)
    assert out["dropped_bytes"] == 7000
    assert p.read_bytes() == b"A" * 5000 + b"B" * 3000


def test_truncate_without_fsync_is_undone_and_with_fsync_kept(fs):
    mnt, sock, backing = fs
    p = mnt / "t"
    data = bytes(range(256)) * 40             # 10240 bytes, 3 pages
    with open(p, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    fsync_path(mnt)
    os.truncate(p, 100)
    with open(p, "r+b") as f:                 # extend again: the cut part must read as zeros
        f.seek(8000)
        f.write(b"x")
    assert p.stat().st_size == 8001
    assert p.read_bytes() == data[:100] + bytes(7900) + b"x"
    out = crash(sock)
    assert out["dropped_truncates"] == 1
    assert p.read_bytes() == data
    # the same, fsync'ed: the backing file becomes exactly what the mount showed
    os.truncate(p, 100)
    with open(p, "r+b") as f:
        f.seek(8000)
        f.write(b"x")
        f.flush()
        os.fsync(f.fileno())
    crash(sock)
    assert p.read_bytes() == data[:100] + bytes(7900) + b"x" == (backing / "t").read_bytes()


def test_new_file_never_fsynced_is_removed(fs):
    mnt, sock, backing = fs
    (mnt / "d").mkdir()                       # mkdir is durable at once (not modelled)
    (mnt / "d" / "never").write_bytes(b"gone")
    (mnt / "d" / "dir-synced").write_bytes(b"content lost, name kept")
    fsync_path(mnt / "d")                     # makes both names durable: create the third after
    (mnt / "d" / "late").write_bytes(b"gone too")
    with open(mnt / "d" / "synced", "wb") as f:
        f.write(b"kept")
        f.flush()
        os.fsync(f.fileno())
    assert sorted(os.listdir(mnt / "d")) == ["dir-synced", "late", "never", "synced"]
    out = crash(sock)
    assert out["removed"] == ["/d/late"] and out["removed_files"] == 1
    assert sorted(os.listdir(mnt / "d")) == ["dir-synced", "never", "synced"]
    assert sorted(os.listdir(backing / "d")) == ["dir-synced", "never", "synced"]
    assert (mnt / "d" / "never").read_bytes() == b""
    assert (mnt / "d" / "dir-synced").read_bytes() == b""
    assert (mnt / "d" / "synced").read_bytes() == b"kept"
    assert not (mnt / "d" / "late").exists()


def test_append_after_fsync_and_after_a_crash(fs):
    mnt, sock, _ = fs
    p = mnt / "j"
    with open(p, "ab") as f:
        f.write(b"one.")
        f.flush()
        os.fsync(f.fileno())
        f.write(b"two.")
        f.flush()
        os.fsync(f.fileno())
        f.write(b"three.")
    assert p.read_bytes() == b"one.two.three."
    crash(sock)
    # a new O_APPEND open must append at the size after the crash (no stale cached size)
    with open(p, "ab") as f:
        f.write(b"four.")
    assert p.read_bytes() == b"one.two.four."
    assert p.stat().st_size == len(b"one.two.four.")


def test_handles_opened_before_a_crash_fail_and_frozen_writes_wait(fs):
    mnt, sock, _ = fs
    p = mnt / "h"
    fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
    os.write(fd, b"x")
    os.fsync(fd)
    lazyfs.control(sock, "freeze")
    result: list = []

    def writer():
        try:
            result.append(os.write(fd, b"late"))
        except OSError as e:
            result.append(e.errno)
    t = threading.Thread(target=writer)
    t.start()
    time.sleep(0.5)
    assert t.is_alive() and result == []      # held while frozen
    crash(sock)
    t.join(10)
    assert result == [errno.EIO]              # the held write failed, nothing landed
    assert lazyfs.control(sock, "stats")["mode"] == "fenced"
    with pytest.raises(OSError) as ei:        # fenced until thaw: no late operation lands
        (mnt / "late").write_bytes(b"late")
    assert ei.value.errno == errno.EIO
    lazyfs.control(sock, "thaw")
    with pytest.raises(OSError) as ei:
        os.write(fd, b"stale")                # the handle is from before the crash
    assert ei.value.errno == errno.EIO
    os.close(fd)
    assert p.read_bytes() == b"x"
    with open(p, "ab") as f:                  # a new handle works
        f.write(b"y")
    assert p.read_bytes() == b"xy"
    assert sorted(os.listdir(mnt)) == ["h"]
    assert lazyfs.control(sock, "stats")["mode"] == "open"


def test_rename_keeps_pending_writes_and_unlink_forgets_them(fs):
    mnt, sock, _ = fs
    with open(mnt / "tmp", "wb") as f:
        f.write(b"v1")
        f.flush()
        os.fsync(f.fileno())
    with open(mnt / "tmp", "ab") as f:
        f.write(b"+pending")
    os.rename(mnt / "tmp", mnt / "final")
    assert (mnt / "final").read_bytes() == b"v1+pending"
    (mnt / "other").write_bytes(b"zzz")
    os.unlink(mnt / "other")
    st = lazyfs.control(sock, "stats")
    assert st["dirty"] == ["/final"]
    crash(sock)
    assert (mnt / "final").read_bytes() == b"v1"
    assert sorted(os.listdir(mnt)) == ["final"]


def test_random_operations_match_a_model(fs):
    """Random writes, truncates, fsyncs and crashes on a few files; after each step the mount shows
    the model's page cache, after each crash the model's last fsync'ed contents."""
    mnt, sock, _ = fs
    rng = random.Random(7)
    names = ["f0", "f1", "f2"]
    for n in names:
        with open(mnt / n, "wb") as f:
            f.flush()
            os.fsync(f.fileno())
    fsync_path(mnt)
    cache = {n: b"" for n in names}
    disk = dict(cache)
    fds = {n: os.open(mnt / n, os.O_RDWR) for n in names}
    try:
        for step in range(400):
            n = rng.choice(names)
            r = rng.random()
            if r < 0.55:
                off = rng.randrange(0, len(cache[n]) + 6000)
                data = rng.randbytes(rng.randrange(1, 9000))
                os.pwrite(fds[n], data, off)
                cur = cache[n].ljust(off, b"\0")
                cache[n] = cur[:off] + data + cur[off + len(data):]
            elif r < 0.70:
                size = rng.randrange(0, len(cache[n]) + 5000)
                os.ftruncate(fds[n], size)
                cache[n] = cache[n][:size].ljust(size, b"\0")
            elif r < 0.92:
                (os.fdatasync if rng.random() < 0.5 else os.fsync)(fds[n])
                disk[n] = cache[n]
            else:
                crash(sock)
                for m in names:
                    os.close(fds[m])
                    fds[m] = os.open(mnt / m, os.O_RDWR)
                cache = dict(disk)
            got = os.pread(fds[n], len(cache[n]) + 10, 0)
            assert got == cache[n], f"step {step}: {n} differs"
            assert os.fstat(fds[n]).st_size == len(cache[n])
    finally:
        for fd in fds.values():
            os.close(fd)
    crash(sock)
    for n in names:
        assert (mnt / n).read_bytes() == disk[n]


def test_sqlite_wal_commits_survive_and_the_rest_is_dropped(fs):
    mnt, sock, _ = fs
    db = sqlite3.connect(mnt / "index.sqlite", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE t(a INTEGER)")
    db.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(100)])
    db.execute("PRAGMA synchronous=OFF")      # commits after this are written, not fsync'ed
    db.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(100, 150)])
    assert db.execute("SELECT count(*) FROM t").fetchone() == (150,)
    lazyfs.control(sock, "freeze")
    crash(sock)
    lazyfs.control(sock, "thaw")
    with pytest.raises(sqlite3.Error):        # its handles died with the crash
        db.execute("INSERT INTO t VALUES (-1)")
    db.close()
    db = sqlite3.connect(mnt / "index.sqlite", isolation_level=None)
    try:
        assert db.execute("SELECT count(*), max(a) FROM t").fetchone() == (100, 99)
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    finally:
        db.close()


def test_bookie_journal_replays_what_it_synced(fs):
    """The bookie's journal (clusters/bookie/journal.py) on lazyfs: with journal_sync_data every
    acknowledged add is replayed after a crash; with ack_before_fsync (fsync only every 60 s here)
    acknowledged adds are lost, and replay stops cleanly at the last synced record."""
    from clusters.bookie.journal import T_ADD, Journal

    mnt, sock, _ = fs

    async def write(directory: Path, n: int, **kw) -> list[int]:
        j = Journal(directory, **kw)
        j.replay(0, lambda rec: None)
        await j.start()
        acked: list[int] = []
        futs = []
        loop = asyncio.get_running_loop()
        for e in range(n):
            fut = loop.create_future()
            futs.append(fut)

            def cb(exc, e=e, fut=fut):
                if exc is None:
                    acked.append(e)
                fut.set_result(None)
            j.log_add(1, e, e - 1, e, 0, f"entry-{e}".encode(), cb)
            if e % 10 == 9:
                await asyncio.sleep(0.01)
        await asyncio.gather(*futs)
        # crash now, with the journal still open (its process dies: no close, no final fsync)
        lazyfs.control(sock, "freeze")
        out = crash(sock)
        lazyfs.control(sock, "thaw")
        j._closing = True
        j._wake.set()
        if j._flusher:
            j._flusher.cancel()
        j._exec.shutdown(wait=False)
        assert out["dropped_files"] >= 0
        return acked

    def replayed(directory: Path) -> list[int]:
        got: list[int] = []
        Journal(directory).replay(0, lambda rec: got.append(rec[3]) if rec[0] == T_ADD else None)
        return got

    safe = mnt / "safe"
    acked = asyncio.run(write(safe, 200))
    assert acked == list(range(200))
    assert replayed(safe) == list(range(200))

    unsafe = mnt / "unsafe"
    acked = asyncio.run(write(unsafe, 200, ack_before_fsync=True, page_cache_flush_ms=60000))
    assert acked == list(range(200))
    assert replayed(unsafe) == []            # acknowledged, never synced: all lost
    # a synced prefix then an unsynced tail: replay returns exactly the prefix
    mixed = mnt / "mixed"

    async def mixed_run() -> None:
        j = Journal(mixed, ack_before_fsync=True, page_cache_flush_ms=60000)
        j.replay(0, lambda rec: None)
        await j.start()
        loop = asyncio.get_running_loop()
        for e in range(50):
            fut = loop.create_future()
            j.log_add(1, e, e - 1, e, 0, b"p", lambda exc, fut=fut: fut.set_result(exc))
            await fut
        await loop.run_in_executor(j._exec, j._sync)        # the periodic fsync
        for e in range(50, 80):
            fut = loop.create_future()
            j.log_add(1, e, e - 1, e, 0, b"p", lambda exc, fut=fut: fut.set_result(exc))
            await fut
        lazyfs.control(sock, "freeze")
        crash(sock)
        lazyfs.control(sock, "thaw")
        j._exec.shutdown(wait=False)
    asyncio.run(mixed_run())
    assert replayed(mixed) == list(range(50))


# ------------------------------------------------------------------ the netns backend's lazy disks

WRITER = """
import os, sys
from clusters.deploy import placeholder
d = sys.argv[1]
fd = os.open(os.path.join(d, "log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
os.write(fd, b"durable;")
os.fsync(fd)
os.write(fd, b"volatile;")
dfd = os.open(d, os.O_RDONLY)
os.fsync(dfd)
sys.exit(placeholder.main(sys.argv[2:]))
"""


def _writer(node):
    return [sys.executable, "-c", WRITER, str(node.data_dir), f"{node.host}:{node.ports['bookie']}"]


def _lazy_entry(cluster, name):
    return json.loads(cluster.state_path.read_text())["nodes"][name].get("lazyfs")


def test_netns_lazy_disk_power_loss_restart_and_down(make_cluster):
    from tests.deploy.conftest import PLACEHOLDERS
    c = make_cluster(lazy_disks=["bookie"], commands={**PLACEHOLDERS, "bookie": _writer})
    bookie = c.node("bookie-1")
    entry = _lazy_entry(c, "bookie-1")
    assert _lazy_entry(c, "broker-1") is None and _lazy_entry(c, "zk-1") is None
    assert entry["mountpoint"] == str(bookie.data_dir) and lazyfs.is_mounted(bookie.data_dir)
    assert procs.alive(entry["pid"], entry["pid_start"])
    backing = Path(entry["backing"])
    assert wait_for(lambda: (bookie.data_dir / "log").exists(), 10)
    assert (bookie.data_dir / "log").read_bytes() == b"durable;volatile;"
    assert (backing / "log").read_bytes() == b"durable;"

    out = c.power_loss(["bookie-1"])
    assert out == {"bookie-1": {"dropped_bytes": len(b"volatile;"), "dropped_files": 1, "removed_files": 0,
                                "pid": bookie.pid}}
    assert not c.node("bookie-1").alive
    assert (bookie.data_dir / "log").read_bytes() == b"durable;"
    with pytest.raises(Unsupported) as ei:           # brokers are on plain disks here
        c.power_loss(["broker-1", "bookie-1"])
    assert "lazy_disks=['broker']" in str(ei.value)
    assert c.node("broker-1").alive

    c.start("bookie-1")                              # the same data, through the same mount
    assert wait_for(lambda: (bookie.data_dir / "log").read_bytes() == b"durable;durable;volatile;", 10)
    c.down()
    assert not lazyfs.is_mounted(bookie.data_dir)
    assert wait_for(lambda: not procs.alive(entry["pid"], entry["pid_start"]), 10)
    assert (backing / "log").read_bytes() == b"durable;durable;"    # never synced: gone with the mount


def test_cleanup_after_a_killed_run_unmounts_lazy_disks():
    name = unique_name("l")
    script = textwrap.dedent(f"""
        import os, signal
        from clusters.deploy.netns import NetnsCluster
        from clusters.deploy.spec import ClusterSpec
        from tests.deploy.conftest import PLACEHOLDERS
        NetnsCluster(ClusterSpec(name={name!r}, bookies=2, brokers=0, ensemble=1, write_quorum=1,
                                 ack_quorum=1, lazy_disks=["bookie"]), commands=PLACEHOLDERS).up()
        print("up", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)      # no down(), no atexit: a killed run
    """)
    try:
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=90,
                             cwd=str(Path(__file__).resolve().parents[2]))
        assert out.returncode == -9 and "up" in out.stdout, out.stderr
        c = NetnsCluster.attach(name)
        daemons = {n: _lazy_entry(c, n) for n in ("bookie-1", "bookie-2")}
        assert all(procs.alive(d["pid"], d["pid_start"]) and lazyfs.is_mounted(d["mountpoint"])
                   for d in daemons.values())                # the orphans still run
        # bookie-2's daemon as if its record was never written (a runner killed in between):
        # only the sweep, by the mount's name, can find it
        with c._txn() as state:
            del state["nodes"]["bookie-2"]["lazyfs"]
        NetnsCluster.cleanup_all(force=True, names=[name])
        for d in daemons.values():
            assert not lazyfs.is_mounted(d["mountpoint"])
            assert wait_for(lambda d=d: not procs.alive(d["pid"], d["pid_start"]), 15)
    finally:
        NetnsCluster.cleanup_all(force=True, names=[name])
        shutil.rmtree(ROOT / name, ignore_errors=True)


def wait_for(pred, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return bool(pred())
