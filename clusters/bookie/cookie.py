"""Bookie cookies (BookKeeper's Cookie and its legacy cookie validation), and formatting a bookie.

A cookie names what a bookie's disks belong to: the bookie id (host:port), its journal directory,
its ledger directories and the cluster's instance id (`/ledgers/INSTANCEID`, created by whoever
formats the cluster: here the first bookie that starts when it is missing). At its first start a
bookie writes the same cookie into every one of its directories (`<dir>/current/VERSION`) and to
the metadata store (`/ledgers/cookies/<bookie id>`, a versioned znode). At every start they are
compared (`decide`):

  - nothing anywhere: a new bookie; it writes them (directories first, then the metadata store);
  - the metadata cookie present and every directory's cookie equal to it: the same bookie;
  - the metadata cookie present and a directory's cookie missing: the disk was wiped or replaced.
    The bookie refuses to start (BookKeeper's InvalidCookieException, "Cookie ... is missing");
  - a directory's cookie that differs from the metadata cookie (another bookie's disk, another
    cluster instance), a directory cookie without a metadata cookie, or an unreadable cookie: the
    bookie refuses to start.

Every refusal is one `CookieError` line that names the fix: format the bookie as a new bookie
(`python -m clusters.bookie.cookie format CONFIG.json`, or `Cluster.format(name)`), which deletes
its metadata cookie and its local data, as BookKeeper's `bookkeeper shell bookieformat -deleteCookie`
does. Formatted, it starts as a new bookie under the same id, and the ledgers it held are put in
limbo (server.py) and re-replicated by auto-recovery.

The file format is ours (BookKeeper writes a protobuf text format): a layout-version line, then one
`key: "value"` line per field.
"""
from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import shutil
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from clusters.metadata.store import BadVersion, MetadataStore, NodeExists, NoNode

COOKIES = "/ledgers/cookies"
INSTANCE_ID = "/ledgers/INSTANCEID"
LAYOUT_VERSION = 5
FIELDS = ("bookieHost", "journalDir", "ledgerDirs", "instanceId")
FORMAT_HINT = "format it as a new bookie ({how}); auto-recovery then re-replicates what it held"


class CookieError(Exception):
    """The bookie must not start on these disks (BookKeeper's InvalidCookieException)."""


@dataclass(frozen=True)
class Cookie:
    bookie_id: str
    journal_dir: str
    ledger_dirs: tuple[str, ...]
    instance_id: str

    def serialize(self) -> bytes:
        vals = (self.bookie_id, self.journal_dir, ",".join(self.ledger_dirs), self.instance_id)
        lines = [str(LAYOUT_VERSION)] + [f"{k}: {json.dumps(v)}" for k, v in zip(FIELDS, vals)]
        return ("\n".join(lines) + "\n").encode()

    @classmethod
    def parse(cls, data: bytes, where: str) -> "Cookie":
        """The cookie in `data`; CookieError naming `where` if it is not one."""
        try:
            lines = data.decode().splitlines()
            if not lines or lines[0].strip() != str(LAYOUT_VERSION):
                raise ValueError(f"layout version line {lines[0] if lines else ''!r}, expected "
                                 f"{LAYOUT_VERSION}")
            vals: dict[str, str] = {}
            for line in lines[1:]:
                if not line.strip():
                    continue
                k, sep, v = line.partition(":")
                if not sep or k.strip() not in FIELDS:
                    raise ValueError(f"unexpected line {line!r}")
                vals[k.strip()] = json.loads(v)
                if not isinstance(vals[k.strip()], str):
                    raise ValueError(f"{k.strip()} is not a string")
            missing = [k for k in FIELDS if k not in vals]
            if missing:
                raise ValueError(f"no {', '.join(missing)}")
        except (UnicodeDecodeError, ValueError) as e:
            raise CookieError(f"cookie {where} is corrupt ({e})") from None
        return cls(vals["bookieHost"], vals["journalDir"], tuple(vals["ledgerDirs"].split(",")),
                   vals["instanceId"])

    def differences(self, other: "Cookie") -> list[str]:
        names = {"bookie_id": "bookieHost", "journal_dir": "journalDir",
                 "ledger_dirs": "ledgerDirs", "instance_id": "instanceId"}
        return [f"{n} {getattr(self, f)!r} != {getattr(other, f)!r}" for f, n in names.items()
                if getattr(self, f) != getattr(other, f)]


def cookie_path(directory: str | Path) -> Path:
    return Path(directory) / "current" / "VERSION"


def metadata_path(bookie_id: str) -> str:
    return f"{COOKIES}/{bookie_id}"


def bookie_dirs(data_dir: str | Path) -> tuple[Path, list[Path]]:
    """Our bookie's journal directory and ledger directories (one: the data dir)."""
    data = Path(data_dir)
    return data / "journal", [data]


def expected(bookie_id: str, data_dir: str | Path, instance_id: str) -> Cookie:
    journal, ledgers = bookie_dirs(data_dir)
    return Cookie(bookie_id, str(journal), tuple(str(p) for p in ledgers), instance_id)


def read_dir_cookie(directory: str | Path) -> Cookie | None:
    p = cookie_path(directory)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise CookieError(f"cookie {p} cannot be read ({e})") from None
    return Cookie.parse(data, str(p))


def write_dir_cookie(directory: str | Path, cookie: Cookie) -> None:
    """Write <dir>/current/VERSION durably (temp file, fsync, rename, fsync the directory)."""
    p = cookie_path(directory)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(cookie.serialize())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, p)
    for d in (p.parent, p.parent.parent, p.parent.parent.parent):   # current/, its entry, the dir's
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def decide(want: Cookie, meta: Cookie | None, dirs: dict[str, Cookie | None], how: str) -> str:
    """"new" (no cookie anywhere: write them) or "ok" (every cookie matches); CookieError else.
    `want` is the cookie this configuration would write, `meta` the metadata store's, `dirs` each
    directory's (None: missing); `how` names the format command in the error."""
    fix = FORMAT_HINT.format(how=how)
    present = {d: c for d, c in dirs.items() if c is not None}
    missing = sorted(d for d, c in dirs.items() if c is None)
    if meta is None:
        if not present:
            return "new"
        raise CookieError(
            f"bookie {want.bookie_id}: cookie present in {', '.join(sorted(present))} but not in the "
            f"metadata store ({metadata_path(want.bookie_id)}): these disks belong to another "
            f"cluster, or the cluster's metadata was reset; {fix}")
    if meta.bookie_id != want.bookie_id or meta.instance_id != want.instance_id:
        raise CookieError(
            f"bookie {want.bookie_id}: the metadata store's cookie does not match this bookie "
            f"({'; '.join(meta.differences(want))}); {fix}")
    if missing:
        raise CookieError(
            f"bookie {want.bookie_id}: cookie is missing on disk (wiped or replaced) while the "
            f"metadata store holds one; {fix}; missing: "
            f"{', '.join(cookie_path(d).as_posix() for d in missing)}; held: "
            f"{metadata_path(want.bookie_id)} (started, it would answer 'no such entry' for "
            f"entries it had acknowledged)")
    for d, c in sorted(present.items()):
        diff = c.differences(meta)
        if diff:
            raise CookieError(
                f"bookie {want.bookie_id}: cookie in {cookie_path(d)} does not match the metadata "
                f"store's ({'; '.join(diff)}): the disk belongs to another bookie or cluster; {fix}")
    if meta != want:
        raise CookieError(
            f"bookie {want.bookie_id}: its directories changed since the cookie was written "
            f"({'; '.join(meta.differences(want))}); {fix}")
    return "ok"


# ------------------------------------------------------------------------ metadata store

async def instance_id(store: MetadataStore) -> str:
    """The cluster's instance id, created if missing (a new uuid; the first writer wins)."""
    got = await store.get_or_none(INSTANCE_ID)
    if got is None:
        try:
            await store.create(INSTANCE_ID, str(uuid.uuid4()).encode(), makepath=True)
        except NodeExists:
            pass
        got = await store.get(INSTANCE_ID)
    return got[0].decode().strip()


async def read_metadata_cookie(store: MetadataStore, bookie_id: str) -> tuple[Cookie, int] | None:
    got = await store.get_or_none(metadata_path(bookie_id))
    if got is None:
        return None
    return Cookie.parse(got[0], metadata_path(bookie_id)), got[1]


async def write_metadata_cookie(store: MetadataStore, cookie: Cookie) -> None:
    try:
        await store.create(metadata_path(cookie.bookie_id), cookie.serialize(), makepath=True)
    except NodeExists:
        raise CookieError(f"bookie {cookie.bookie_id}: another bookie wrote a cookie to "
                          f"{metadata_path(cookie.bookie_id)} while this one was starting; is a "
                          f"second bookie configured with this address?") from None


async def check(store: MetadataStore, bookie_id: str, data_dir: str | Path, how: str
                ) -> tuple[str, Cookie]:
    """Compare the cookies; ("new" | "ok", the cookie). Raises CookieError."""
    want = expected(bookie_id, data_dir, await instance_id(store))
    got = await read_metadata_cookie(store, bookie_id)
    journal, ledgers = bookie_dirs(data_dir)
    dirs = {str(d): read_dir_cookie(d) for d in [journal, *ledgers]}
    return decide(want, got[0] if got else None, dirs, how), want


async def stamp(store: MetadataStore, cookie: Cookie) -> None:
    """Write a new bookie's cookies: its directories, then the metadata store."""
    for d in [Path(cookie.journal_dir), *(Path(p) for p in cookie.ledger_dirs)]:
        await asyncio.to_thread(write_dir_cookie, d, cookie)
    await write_metadata_cookie(store, cookie)


# ------------------------------------------------------------------------ format

BOOKIE_DATA = ("journal", "entrylogs", "current", "index.sqlite", "index.sqlite-wal",
               "index.sqlite-shm")


def delete_local_data(data_dir: str | Path) -> list[str]:
    """Delete the bookie's journal, ledger storage and cookies under its data dir (what
    BookKeeper's format deletes); other files (its config, its log) stay. Returns the names."""
    data = Path(data_dir)
    removed = []
    for name in BOOKIE_DATA:
        p = data / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()
        else:
            continue
        removed.append(name)
    return removed


async def format_bookie(store: MetadataStore, bookie_id: str, data_dir: str | Path
                        ) -> dict[str, object]:
    """BookKeeper's formatBookie with deleteCookie: the metadata cookie (at the version read) and
    the local data go; the next start is a new bookie's. The bookie must not be running."""
    got = await store.get_or_none(metadata_path(bookie_id))
    deleted = False
    if got is not None:
        try:
            await store.delete(metadata_path(bookie_id), got[1])
            deleted = True
        except NoNode:
            pass
        except BadVersion:
            raise CookieError(f"bookie {bookie_id}: its cookie changed while formatting; is the "
                              f"bookie running? stop it and format again") from None
    removed = await asyncio.to_thread(delete_local_data, data_dir)
    return {"bookie": bookie_id, "cookie_deleted": deleted, "removed": removed}


def format_bookie_blocking(zk: str, bookie_id: str, data_dir: str | Path, timeout: float = 30.0
                           ) -> dict[str, object]:
    """format_bookie for synchronous callers (the deployment layer): its own ZooKeeper session and
    event loop, in a worker thread. CookieError if ZooKeeper cannot be reached."""
    async def go() -> dict[str, object]:
        store = MetadataStore(zk, name=f"format-{bookie_id}")
        try:
            await store.start(timeout=timeout)
        except Exception as e:  # noqa: BLE001 - one line for the operator
            await store.close()
            raise CookieError(f"cannot reach ZooKeeper at {zk} ({e!r})") from None
        try:
            return await asyncio.wait_for(format_bookie(store, bookie_id, data_dir), timeout)
        finally:
            await store.close()
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="format") as ex:
        return ex.submit(asyncio.run, go()).result()


async def _format_main(config_path: str) -> dict[str, object]:
    from clusters import config as node_config
    cfg = node_config.load(config_path)
    if cfg.role != "bookie":
        raise CookieError(f"{config_path} is a {cfg.role}'s config, not a bookie's; give the "
                          f"bookie's config.json")
    store = MetadataStore(cfg.zk, session_timeout=cfg.zk_session_timeout,
                          name=f"format-{cfg.name}")
    try:
        await store.start(timeout=20)
    except Exception as e:  # noqa: BLE001 - one line for the operator
        await store.close()
        raise CookieError(f"cannot reach ZooKeeper at {cfg.zk} ({e!r}); start ZooKeeper first") from None
    try:
        return await format_bookie(store, cfg.bookie_id, cfg.data_dir)
    finally:
        await store.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m clusters.bookie.cookie",
                                description="Format a stopped bookie as a new bookie: delete its "
                                            "cookie in the metadata store and its local data.")
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("format", help="format the bookie of this config.json")
    f.add_argument("config")
    args = p.parse_args(argv)
    try:
        out = asyncio.run(_format_main(args.config))
    except (OSError, ValueError, CookieError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 254
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
