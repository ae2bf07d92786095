"""What the deploy backends share: their state.json (read, written atomically, locked), the last line
of a node's log, and the inventory answers every backend gives from its state's nodes."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from clusters.deploy.backend import ClusterError


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@contextlib.contextmanager
def flock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2))   # insertion order: nodes in start order
    os.replace(tmp, path)


def read_state(path: Path, fix: str) -> dict[str, Any] | None:
    """A state.json's contents, None if absent; a corrupt one is a ClusterError with `fix`."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError as ex:
        raise ClusterError(f"{path} is corrupt: {ex}", fix) from None


def last_line(path: Path | str | None, limit: int = 200) -> str:
    """The last non-empty line of a log (usually the error that ended the process)."""
    try:
        with open(path, "rb") as f:  # type: ignore[arg-type]
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except (OSError, TypeError):
        return ""
    return lines[-1][:limit] if lines else ""


def count_drops(state: dict[str, Any], edges: list[tuple[str, str]], delta: int,
                kind: str = "drops") -> list[tuple[str, str]]:
    """Count each drop edge once more (delta +1, a partition) or once less (-1, its undo) in the state's
    `<kind>_counts` (`drop_counts` for `drops`), so that undoing one of two overlapping partitions keeps
    the links the other still cuts; set `state[kind]` to the edges counted above zero. Returns the edges
    whose rules must change: newly cut (+1) or no longer cut by anyone (-1; an edge healed meanwhile is
    skipped). `kind` is `drops` (both ways) or `inbound` (one way: a drops what b sends it)."""
    counts: dict[str, int] = state.setdefault("drop_counts" if kind == "drops" else f"{kind}_counts", {})
    for a, b in {tuple(e) for e in state.get(kind, [])}:         # a state written before counting
        counts.setdefault(f"{a}>{b}", 1)
    changed = []
    for a, b in edges:
        key = f"{a}>{b}"
        have = counts.get(key, 0)
        if delta > 0:
            if have == 0:
                changed.append((a, b))
            counts[key] = have + 1
        elif have > 0:                    # else healed meanwhile (heal() clears every count)
            if have == 1:
                del counts[key]
                changed.append((a, b))
            else:
                counts[key] = have - 1
    state[kind] = sorted([k.split(">", 1) for k, v in counts.items() if v > 0])
    return changed


def wipe_data_dir(n: dict[str, Any]) -> dict[str, Any]:
    """Delete what a stopped node wrote into its data dir, keeping its identity (ZooKeeper's zoo.cfg and
    myid, and config.json when it lives there); stamps `wiped_at`. Returns {data_dir, files, bytes,
    removed, kept}."""
    data = Path(n["data_dir"])
    keep = {"zoo.cfg", "myid"} if n["role"] == "zookeeper" else set()
    if n.get("config") and Path(n["config"]).parent == data:
        keep.add(Path(n["config"]).name)
    files = size = 0
    removed, kept = [], []
    for entry in sorted(data.iterdir()) if data.is_dir() else []:
        if entry.name in keep:
            kept.append(entry.name)
            continue
        if entry.is_dir() and not entry.is_symlink():
            for root, _dirs, names in os.walk(entry):
                for f in names:
                    files += 1
                    with contextlib.suppress(OSError):
                        size += os.lstat(os.path.join(root, f)).st_size
            shutil.rmtree(entry)
        else:
            files += 1
            size += entry.lstat().st_size
            entry.unlink()
        removed.append(entry.name)
    n["wiped_at"] = now()
    return {"data_dir": str(data), "files": files, "bytes": size, "removed": removed, "kept": kept}


class StateInventory:
    """Node lookups and URLs from a backend's state (`_state()`: {"nodes": {name: entry}, "host_address"})."""

    def _state(self) -> dict[str, Any]:
        raise NotImplementedError

    def _entry(self, state: dict[str, Any], name: str) -> dict[str, Any]:
        if name not in state["nodes"]:
            raise ClusterError(f"no node named {name!r}", "use one of: " + ", ".join(state["nodes"]))
        return state["nodes"][name]

    def _addresses(self, role: str, port_name: str, state: dict[str, Any] | None = None) -> list[str]:
        state = state or self._state()
        return [f"{n['host']}:{n['ports'][port_name]}" for n in state["nodes"].values() if n["role"] == role]

    @property
    def service_url(self) -> str:
        addrs = self._addresses("broker", "pulsar")
        return "pulsar://" + ",".join(addrs) if addrs else ""

    @property
    def admin_urls(self) -> list[str]:
        return [f"http://{a}" for a in self._addresses("broker", "http")]

    @property
    def zk_connect(self) -> str:
        return ",".join(self._addresses("zookeeper", "client"))

    @property
    def host_address(self) -> str:
        """The harness host's address on the cluster network (what nodes see clients on the host as)."""
        return self._state()["host_address"]
