"""lazyfs: a FUSE filesystem whose un-fsync'ed writes live in memory and vanish on `crash`.

Jepsen's LazyFS idea, in Python over libfuse2 (fusepy). The mount passes every operation through
to a backing directory, except file contents: what a process writes is kept in an in-memory page
cache of its own (4 KiB pages per file, plus the file's logical size) and reaches the backing file
only on fsync/fdatasync of that file. `crash` (on the control socket) drops every page cache, so
the mount then shows exactly what had been fsync'ed: a power loss for the processes using it.

What a crash drops (modelled):

- every write(2) to a file since that file's last fsync/fdatasync (a partial fsync history keeps
  what the last fsync covered and loses what came after it);
- every truncate/ftruncate since the file's last fsync (the size and content at the last fsync
  come back);
- a regular file created (create/mknod) through the mount whose own fsync never happened and
  whose parent directory was never fsync'ed since its creation: it is removed. A file whose
  directory was fsync'ed but not the file itself stays, with its content at its last fsync (empty
  if never). fsync of a file also makes its directory entry durable (as ext4's journal does in
  practice, and as POSIX does not promise).

What is not modelled (these take effect on the backing directory at once, so a crash keeps them):

- rename, unlink, rmdir, mkdir, link, symlink, chmod, chown, utimens and xattrs: durable as if
  followed by an fsync of their directories (directory fsync only matters for new files, above);
  a rename keeps a file's pending writes with it;
- the order of writes within one file between two fsyncs (a crash never keeps a later un-fsync'ed
  write and drops an earlier one: it drops all of them), and torn writes within a page;
- mtime of pending writes is kept in memory, ctime/atime are the backing file's.

The kernel cannot serve dropped data after a crash: files are opened with direct_io (every read
and write reaches this process) and attribute/entry caching is off (attr_timeout=0,
entry_timeout=0, negative_timeout=0), except files named `*-shm`: SQLite maps its WAL index with
MAP_SHARED, which FUSE refuses for direct_io files; that file is only a cache SQLite rebuilds
(truncating it) when the first connection opens after a crash, and the kernel drops a file's
cached pages on every open of a non-direct_io FUSE file (no keep_cache).

A power loss must not let a dying process complete a write after the crash, so the control socket
also has `freeze`: from then on every mutating operation (write, truncate, fsync, create, unlink,
rename, ...) waits. The deploy backend sends `freeze`, SIGKILLs the node's processes, sends
`crash`, waits until they are dead, then sends `thaw`. A `crash` while frozen fails the waiting
operations with EIO and leaves the mount *fenced* (every mutating operation fails with EIO at once)
until `thaw`, so no operation of a dying process lands after the crash; a `crash` while not frozen
leaves the mount open. Either way file handles opened before a crash fail with EIO from then on
(reads too); new opens work as usual. A freeze or fence with no `thaw` ends by itself after
`HOLD_MAX_S`, so a controller that died cannot leave the mount stuck.

Control: a Unix stream socket taking one command per line and answering one JSON line:
`ping`, `stats`, `freeze`, `thaw`, `crash` (answers {"dropped_bytes", "dropped_files",
"removed_files", "dropped_truncates", ...}). `dropped_bytes` counts the bytes passed to write(2)
since each file's last fsync (a byte written twice counts twice).

CLI: `python -m clusters.deploy.lazyfs BACKING MOUNTPOINT --control SOCK [--fsname NAME]` mounts in
the foreground until SIGTERM/SIGINT (then unmounts). Needs /dev/fuse, Debian's libfuse2 and root
(or fusermount).
"""
from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import socket
import stat as statmod
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("lazyfs")

PAGE = 4096
HOLD_MAX_S = 30.0          # a freeze or fence ends by itself after this
SUBTYPE = "lazyfs"              # mounts show as fstype fuse.lazyfs in /proc/self/mountinfo


class LazyFSError(RuntimeError):
    pass


def _eio() -> OSError:
    return OSError(errno.EIO, "lazyfs: crashed since this operation began")


@dataclass
class FileState:
    """The page cache of one backing inode: what differs from the backing file until fsync."""
    key: tuple[int, int]                 # backing (st_dev, st_ino)
    path: str | None                     # path under the mount (for new-file removal, renames)
    size: int                            # logical size (what stat shows)
    floor: int                           # backing bytes at >= floor are invisible (an un-fsync'ed truncate)
    backing_size: int                    # the backing file's size (changes only at fsync)
    pages: dict[int, bytearray] = field(default_factory=dict)
    pending_bytes: int = 0               # bytes written since the last fsync
    truncated: bool = False              # a truncate since the last fsync
    new: bool = False                    # created through the mount, neither it nor its dir fsync'ed
    handles: int = 0
    mtime_ns: int | None = None          # of the last pending write

    @property
    def dirty(self) -> bool:
        return bool(self.pages) or self.truncated or self.size != self.backing_size or self.pending_bytes > 0


@dataclass
class Handle:
    fd: int
    state: FileState
    epoch: int
    writable: bool


def _lazy_operations():
    from fuse import FuseOSError, Operations   # imported late: the module also serves as a client

    class LazyOps(Operations):
        use_ns = True

        def __init__(self, backing: str, control: str | None):
            self.root = os.path.realpath(backing)
            self.control_path = control
            self._mu = threading.Condition(threading.RLock())
            self.states: dict[tuple[int, int], FileState] = {}
            self.handles: dict[int, Handle] = {}
            self.next_fh = 1
            self.epoch = 0
            self.mode = "open"            # open | frozen (mutations wait) | fenced (mutations fail)
            self.hold_until = 0.0         # when a freeze or fence ends by itself
            self.crashes = 0
            self.totals = {"dropped_bytes": 0, "dropped_files": 0, "removed_files": 0, "fsyncs": 0,
                           "synced_bytes": 0}
            self._server: socket.socket | None = None

        # ---------------------------------------------------------------- helpers
        def _full(self, path: str) -> str:
            return os.path.join(self.root, path.lstrip("/"))

        def _gate(self, handle: Handle | None = None) -> None:
            """Called with the lock held by every mutating operation: wait while frozen, fail if a
            crash happened since the operation began or since its handle was opened."""
            entered = self.epoch
            while self.mode != "open":
                left = self.hold_until - time.monotonic()
                if left <= 0:
                    log.warning("%s for %.0fs without a thaw: open again", self.mode, HOLD_MAX_S)
                    self._set_mode("open")
                    break
                if self.mode == "fenced":
                    raise _eio()
                self._mu.wait(left)
            if self.epoch != entered or (handle is not None and handle.epoch != self.epoch):
                raise _eio()

        def _set_mode(self, mode: str) -> None:
            self.mode = mode
            self.hold_until = time.monotonic() + HOLD_MAX_S
            self._mu.notify_all()

        def _handle(self, fi: Any) -> Handle:
            h = self.handles.get(fi.fh if fi is not None else 0)
            if h is None:
                raise FuseOSError(errno.EBADF)
            return h

        def _state_for(self, st: os.stat_result, path: str | None) -> FileState:
            key = (st.st_dev, st.st_ino)
            s = self.states.get(key)
            if s is None:
                s = FileState(key=key, path=path, size=st.st_size, floor=st.st_size,
                              backing_size=st.st_size)
                self.states[key] = s
            elif path is not None and s.path is None:
                s.path = path
            return s

        def _maybe_forget(self, s: FileState) -> None:
            if s.handles <= 0 and not s.dirty and not s.new and self.states.get(s.key) is s:
                del self.states[s.key]

        def _existing_state(self, path: str) -> tuple[os.stat_result, FileState | None]:
            st = os.lstat(self._full(path))
            return st, self.states.get((st.st_dev, st.st_ino))

        def _any_fd(self, s: FileState, writable: bool) -> tuple[int, bool]:
            """A backing fd for s: one of its handles' (writable if asked), else opened by path
            (the bool says whether the caller must close it)."""
            for h in self.handles.values():
                if h.state is s and (h.writable or not writable):
                    return h.fd, False
            if s.path is None:
                raise FuseOSError(errno.EIO)
            fd = os.open(self._full(s.path), os.O_RDWR if writable else os.O_RDONLY)
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != s.key:
                os.close(fd)
                raise FuseOSError(errno.EIO)
            return fd, True

        def _visible(self, fd: int, s: FileState, start: int, end: int) -> bytearray:
            """Bytes [start, end) as the page cache shows them (pages, else backing below floor, else 0)."""
            buf = bytearray(end - start)
            n = min(end, s.floor) - start
            if n > 0:
                data = os.pread(fd, n, start)
                buf[:len(data)] = data
            if s.pages:
                for p in range(start // PAGE, (end - 1) // PAGE + 1):
                    pg = s.pages.get(p)
                    if pg is None:
                        continue
                    ps = p * PAGE
                    lo, hi = max(start, ps), min(end, ps + PAGE)
                    buf[lo - start:hi - start] = pg[lo - ps:hi - ps]
            return buf

        # ---------------------------------------------------------------- metadata
        def getattr(self, path, fi=None):
            with self._mu:
                if fi is not None and fi.fh in self.handles:
                    h = self.handles[fi.fh]
                    st, s = os.fstat(h.fd), h.state
                else:
                    st, s = self._existing_state(path)
                d = {k: getattr(st, k) for k in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size",
                                                 "st_ino", "st_atime_ns", "st_mtime_ns", "st_ctime_ns")}
                if s is not None:
                    d["st_size"] = s.size
                    if s.mtime_ns is not None:
                        d["st_mtime_ns"] = s.mtime_ns
            out = {k: v for k, v in d.items() if not k.endswith("_ns")}
            for k in ("st_atime", "st_mtime", "st_ctime"):
                out[k] = d[k + "_ns"]
            return out

        def access(self, path, amode):
            if not os.access(self._full(path), amode):
                raise FuseOSError(errno.EACCES)
            return 0

        def readlink(self, path):
            return os.readlink(self._full(path))

        def readdir(self, path, fh):
            return [".", ".."] + os.listdir(self._full(path))

        def statfs(self, path):
            sv = os.statvfs(self._full(path))
            return {k: getattr(sv, k) for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail",
                                                "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")}

        def chmod(self, path, mode):
            with self._mu:
                self._gate()
                os.chmod(self._full(path), mode)

        def chown(self, path, uid, gid):
            with self._mu:
                self._gate()
                os.lchown(self._full(path), uid, gid)

        def utimens(self, path, times=None):
            with self._mu:
                self._gate()
                if times:
                    os.utime(self._full(path), ns=tuple(int(t) for t in times), follow_symlinks=False)
                else:
                    os.utime(self._full(path), follow_symlinks=False)
                try:
                    _, s = self._existing_state(path)
                except OSError:
                    s = None
                if s is not None:
                    s.mtime_ns = None

        def mkdir(self, path, mode):
            with self._mu:
                self._gate()
                os.mkdir(self._full(path), mode)

        def rmdir(self, path):
            with self._mu:
                self._gate()
                os.rmdir(self._full(path))

        def symlink(self, target, source):
            with self._mu:
                self._gate()
                os.symlink(source, self._full(target))

        def link(self, target, source):
            with self._mu:
                self._gate()
                os.link(self._full(source), self._full(target))

        def mknod(self, path, mode, dev):
            with self._mu:
                self._gate()
                os.mknod(self._full(path), mode, dev)
                if statmod.S_ISREG(mode):
                    st = os.lstat(self._full(path))
                    s = self._state_for(st, path)
                    s.new = True

        def _unlinked(self, st: os.stat_result) -> None:
            """The backing inode of st lost a name: forget its state once it has no name and no handle."""
            s = self.states.get((st.st_dev, st.st_ino))
            if s is not None and st.st_nlink <= 1:
                s.new = False
                s.path = None
                s.pages.clear()
                s.pending_bytes = 0
                s.truncated = False
                s.size = s.floor = s.backing_size
                if s.handles <= 0:
                    del self.states[s.key]

        def unlink(self, path):
            with self._mu:
                self._gate()
                full = self._full(path)
                st = os.lstat(full)
                os.unlink(full)
                self._unlinked(st)

        def rename(self, old, new):
            with self._mu:
                self._gate()
                fo, fn = self._full(old), self._full(new)
                try:
                    target = os.lstat(fn)
                except FileNotFoundError:
                    target = None
                src = os.lstat(fo)
                os.rename(fo, fn)
                if target is not None and (target.st_dev, target.st_ino) != (src.st_dev, src.st_ino):
                    self._unlinked(target)
                s = self.states.get((src.st_dev, src.st_ino))
                if s is not None:
                    s.path = new
                if statmod.S_ISDIR(src.st_mode):
                    prefix = old.rstrip("/") + "/"
                    for s in self.states.values():
                        if s.path and s.path.startswith(prefix):
                            s.path = new.rstrip("/") + "/" + s.path[len(prefix):]

        # ---------------------------------------------------------------- open / close
        def _open(self, path: str, fi: Any, fd: int, new: bool) -> int:
            st = os.fstat(fd)
            s = self._state_for(st, path)
            if new:
                s.new = True
            acc = fi.flags & os.O_ACCMODE
            writable = acc != os.O_RDONLY
            fh = self.next_fh
            self.next_fh += 1
            self.handles[fh] = Handle(fd=fd, state=s, epoch=self.epoch, writable=writable)
            s.handles += 1
            fi.fh = fh
            fi.direct_io = 0 if path.endswith("-shm") else 1
            fi.keep_cache = 0
            if fi.flags & os.O_TRUNC and s.size:
                self._truncate(s, 0)
            return 0

        @staticmethod
        def _backing_flags(flags: int) -> int:
            acc = flags & os.O_ACCMODE
            # always readable (pages are filled from the backing file); appends and truncates are
            # the page cache's business
            keep = flags & (os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_DIRECTORY)
            return keep | (os.O_RDWR if acc != os.O_RDONLY else os.O_RDONLY)

        def open(self, path, fi):
            with self._mu:
                if fi.flags & (os.O_TRUNC | os.O_CREAT) or (fi.flags & os.O_ACCMODE) != os.O_RDONLY:
                    self._gate()
                fd = os.open(self._full(path), self._backing_flags(fi.flags) & ~(os.O_CREAT | os.O_EXCL))
                return self._open(path, fi, fd, new=False)

        def create(self, path, mode, fi):
            with self._mu:
                self._gate()
                full = self._full(path)
                existed = os.path.lexists(full)
                fd = os.open(full, self._backing_flags(fi.flags) | os.O_CREAT, mode)
                return self._open(path, fi, fd, new=not existed)

        def flush(self, path, fi):
            return 0

        def release(self, path, fi):
            with self._mu:
                h = self.handles.pop(fi.fh, None)
                if h is None:
                    return 0
                os.close(h.fd)
                h.state.handles -= 1
                self._maybe_forget(h.state)
            return 0

        def opendir(self, path):
            return 0

        def releasedir(self, path, fh):
            return 0

        # ---------------------------------------------------------------- data
        def read(self, path, size, offset, fi):
            with self._mu:
                h = self._handle(fi)
                s = h.state
                if h.epoch != self.epoch:
                    raise _eio()
                end = min(offset + size, s.size)
                if end <= offset:
                    return b""
                return bytes(self._visible(h.fd, s, offset, end))

        def write(self, path, data, offset, fi):
            with self._mu:
                h = self._handle(fi)
                self._gate(h)
                s = h.state
                if not data:
                    return 0
                end = offset + len(data)
                for p in range(offset // PAGE, (end - 1) // PAGE + 1):
                    ps = p * PAGE
                    pg = s.pages.get(p)
                    if pg is None:
                        pg = self._visible(h.fd, s, ps, ps + PAGE) if ps < s.size else bytearray(PAGE)
                        if ps + PAGE > s.size:      # nothing visible past the logical end
                            cut = max(0, s.size - ps)
                            pg[cut:] = bytes(PAGE - cut)
                        s.pages[p] = pg
                    lo, hi = max(offset, ps), min(end, ps + PAGE)
                    pg[lo - ps:hi - ps] = data[lo - offset:hi - offset]
                s.size = max(s.size, end)
                s.pending_bytes += len(data)
                s.mtime_ns = time.time_ns()
                return len(data)

        def _truncate(self, s: FileState, length: int) -> None:
            if length < s.size:
                for p in [p for p in s.pages if p * PAGE >= length]:
                    del s.pages[p]
                p = length // PAGE
                pg = s.pages.get(p)
                if pg is not None:
                    cut = length - p * PAGE
                    pg[cut:] = bytes(PAGE - cut)
                s.floor = min(s.floor, length)
            s.size = length
            s.truncated = True
            s.mtime_ns = time.time_ns()

        def truncate(self, path, length, fi=None):
            with self._mu:
                if fi is not None and fi.fh in self.handles:
                    h = self.handles[fi.fh]
                    self._gate(h)
                    s = h.state
                else:
                    self._gate()
                    st = os.lstat(self._full(path))
                    s = self._state_for(st, path)
                self._truncate(s, length)
                self._maybe_forget(s)
            return 0

        def _sync(self, s: FileState, fd: int) -> None:
            if s.floor < s.backing_size:
                os.ftruncate(fd, s.floor)
            n = 0
            for p in sorted(s.pages):
                ps = p * PAGE
                k = min(PAGE, s.size - ps)
                if k > 0:
                    os.pwrite(fd, bytes(s.pages[p][:k]), ps)
                    n += k
            if os.fstat(fd).st_size != s.size:
                os.ftruncate(fd, s.size)
            os.fsync(fd)
            s.pages.clear()
            s.backing_size = s.floor = s.size
            s.pending_bytes = 0
            s.truncated = False
            s.new = False
            self.totals["fsyncs"] += 1
            self.totals["synced_bytes"] += n

        def fsync(self, path, datasync, fi):
            with self._mu:
                h = self._handle(fi)
                self._gate(h)
                fd, close = (h.fd, False) if h.writable else self._any_fd(h.state, True)
                try:
                    self._sync(h.state, fd)
                finally:
                    if close:
                        os.close(fd)
            return 0

        def fsyncdir(self, path, datasync, fh):
            with self._mu:
                self._gate()
                d = "/" + path.strip("/")
                for s in self.states.values():
                    if s.new and s.path is not None and os.path.dirname("/" + s.path.lstrip("/")) == d:
                        s.new = False
                fd = os.open(self._full(path), os.O_RDONLY | os.O_DIRECTORY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                for s in list(self.states.values()):
                    self._maybe_forget(s)
            return 0

        # ---------------------------------------------------------------- control
        def crash(self) -> dict[str, Any]:
            with self._mu:
                out = {"dropped_bytes": 0, "dropped_files": 0, "removed_files": 0, "dropped_truncates": 0,
                       "dropped": [], "removed": []}
                for s in list(self.states.values()):
                    if s.new and s.path is not None:
                        full = self._full(s.path)
                        try:
                            st = os.lstat(full)
                            if (st.st_dev, st.st_ino) == s.key:
                                os.unlink(full)
                                out["removed_files"] += 1
                                out["removed"].append(s.path)
                        except FileNotFoundError:
                            pass
                    if s.dirty or s.new:
                        out["dropped_files"] += 1
                        out["dropped_bytes"] += s.pending_bytes
                        out["dropped_truncates"] += int(s.truncated)
                        if len(out["dropped"]) < 50:
                            out["dropped"].append(s.path)
                    s.pages.clear()
                    s.pending_bytes = 0
                    s.truncated = False
                    s.new = False
                    s.mtime_ns = None
                    s.size = s.floor = s.backing_size
                    if s.handles <= 0:
                        del self.states[s.key]
                self.epoch += 1                     # every open handle is stale from now on
                if self.mode != "open":
                    self._set_mode("fenced")         # the dying processes' operations fail
                self.crashes += 1
                self._mu.notify_all()
                for k in ("dropped_bytes", "dropped_files", "removed_files"):
                    self.totals[k] += out[k]
                out["epoch"] = self.epoch
                log.info("crash %d: dropped %d bytes in %d files, removed %d new files", self.crashes,
                         out["dropped_bytes"], out["dropped_files"], out["removed_files"])
                return out

        def stats(self) -> dict[str, Any]:
            with self._mu:
                dirty = [s for s in self.states.values() if s.dirty or s.new]
                return {"backing": self.root, "files": len(self.states), "dirty_files": len(dirty),
                        "pending_bytes": sum(s.pending_bytes for s in dirty),
                        "pending_pages": sum(len(s.pages) for s in dirty),
                        "new_files": sum(1 for s in dirty if s.new),
                        "open_handles": len(self.handles), "epoch": self.epoch, "crashes": self.crashes,
                        "mode": self.mode, "totals": dict(self.totals),
                        "dirty": sorted(str(s.path) for s in dirty)[:50]}

        def command(self, line: str) -> dict[str, Any]:
            cmd = line.strip()
            if cmd == "ping":
                return {"ok": True, "pid": os.getpid()}
            if cmd == "stats":
                return {"ok": True, **self.stats()}
            if cmd == "freeze":
                with self._mu:
                    self._set_mode("frozen")
                return {"ok": True, "mode": "frozen"}
            if cmd == "thaw":
                with self._mu:
                    self._set_mode("open")
                return {"ok": True, "mode": "open"}
            if cmd == "crash":
                return {"ok": True, **self.crash()}
            return {"ok": False, "error": f"unknown command {cmd!r}; use ping, stats, freeze, thaw or crash"}

        def init(self, path):
            if self.control_path:
                self._server = serve_control(self.control_path, self.command)

        def destroy(self, path):
            if self._server is not None:
                try:
                    self._server.close()
                finally:
                    try:
                        os.unlink(self.control_path)
                    except OSError:
                        pass

    return LazyOps


# -------------------------------------------------------------------- control socket

def serve_control(path: str, handler) -> socket.socket:
    """Listen on a Unix socket at `path`: one command per line in, one JSON line out."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    os.chmod(path, 0o600)
    srv.listen(16)

    def client(conn: socket.socket) -> None:
        with conn, conn.makefile("rwb") as f:
            for raw in f:
                try:
                    answer = handler(raw.decode(errors="replace"))
                except Exception as e:  # noqa: BLE001 - answered, not fatal
                    log.exception("control command failed")
                    answer = {"ok": False, "error": f"{type(e).__name__}: {e}"}
                f.write((json.dumps(answer) + "\n").encode())
                f.flush()

    def accept() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=client, args=(conn,), daemon=True, name="lazyfs-control").start()

    threading.Thread(target=accept, daemon=True, name="lazyfs-accept").start()
    return srv


def control(sock_path: str | os.PathLike, command: str, timeout: float = 30.0) -> dict[str, Any]:
    """Send one command to a lazyfs daemon's control socket; its JSON answer. Raises LazyFSError."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(str(sock_path))
            s.sendall(command.encode() + b"\n")
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                buf += chunk
    except OSError as e:
        raise LazyFSError(f"lazyfs control socket {sock_path}: {e}") from None
    try:
        answer = json.loads(buf)
    except ValueError:
        raise LazyFSError(f"lazyfs control socket {sock_path}: bad answer {buf[:200]!r}") from None
    if not answer.get("ok"):
        raise LazyFSError(f"lazyfs {command!r}: {answer.get('error')}")
    return answer


# -------------------------------------------------------------------- mounts

def _unescape(s: str) -> str:
    return s.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def mounts() -> list[dict[str, str]]:
    """lazyfs mounts of this mount namespace: [{"mountpoint", "source"}] from /proc/self/mountinfo."""
    out = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        left, _, right = line.partition(" - ")
        f, r = left.split(), right.split()
        if len(f) >= 5 and len(r) >= 2 and r[0] == f"fuse.{SUBTYPE}":
            out.append({"mountpoint": _unescape(f[4]), "source": _unescape(r[1])})
    return out


def is_mounted(mountpoint: str | os.PathLike) -> bool:
    mp = os.path.realpath(mountpoint)
    return any(m["mountpoint"] == mp for m in mounts())


def unmount(mountpoint: str | os.PathLike) -> bool:
    """Detach a lazyfs mount (lazily, so a busy one goes too); True if it was mounted."""
    mp = os.path.realpath(mountpoint)
    if not is_mounted(mp):
        return False
    for argv in (["umount", "-l", mp], ["fusermount3", "-u", "-z", mp], ["fusermount", "-u", "-z", mp]):
        try:
            subprocess.run(argv, capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if not is_mounted(mp):
            break
    return True


def command(backing: str | os.PathLike, mountpoint: str | os.PathLike, control_sock: str | os.PathLike,
            fsname: str = "lazyfs") -> list[str]:
    """The argv that mounts lazyfs in the foreground (what the deploy backend runs)."""
    return [sys.executable, "-m", "clusters.deploy.lazyfs", str(backing), str(mountpoint),
            "--control", str(control_sock), "--fsname", fsname]


def wait_ready(mountpoint: str | os.PathLike, control_sock: str | os.PathLike, timeout: float = 20.0,
               alive=None) -> None:
    """Wait until the mount is in place and the control socket answers; LazyFSError otherwise.
    `alive()` (optional) says whether the daemon still runs."""
    deadline = time.monotonic() + timeout
    last = "not mounted yet"
    while time.monotonic() < deadline:
        if alive is not None and not alive():
            raise LazyFSError(f"lazyfs for {mountpoint} exited while mounting")
        if is_mounted(mountpoint):
            try:
                control(control_sock, "ping", timeout=2.0)
                return
            except LazyFSError as e:
                last = str(e)
        time.sleep(0.05)
    raise LazyFSError(f"lazyfs not ready at {mountpoint} within {timeout:.0f}s: {last}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m clusters.deploy.lazyfs",
                                 description="Mount BACKING at MOUNTPOINT; un-fsync'ed writes stay in memory "
                                             "until fsync and are dropped by `crash` on the control socket.")
    ap.add_argument("backing")
    ap.add_argument("mountpoint")
    ap.add_argument("--control", required=True, help="Unix socket path for ping/stats/freeze/thaw/crash")
    ap.add_argument("--fsname", default="lazyfs", help="the mount's source name (shown in mountinfo)")
    ap.add_argument("--debug", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.INFO,
                        format="%(asctime)s lazyfs %(levelname)s %(message)s")
    for what, p in (("backing directory", args.backing), ("mount point", args.mountpoint)):
        if not os.path.isdir(p):
            print(f"lazyfs: {what} {p} is not a directory (fix: create it first)", file=sys.stderr)
            return 2
    if not os.path.exists("/dev/fuse"):
        print("lazyfs: /dev/fuse is missing (fix: load the fuse module, or run where FUSE is available)",
              file=sys.stderr)
        return 2
    try:
        from fuse import FUSE
    except (ImportError, OSError, EnvironmentError) as e:
        print(f"lazyfs: cannot load fusepy/libfuse2: {e} (fix: pip install fusepy; apt-get install libfuse2)",
              file=sys.stderr)
        return 2
    ops = _lazy_operations()(args.backing, args.control)
    FUSE(ops, os.path.realpath(args.mountpoint), foreground=True, nothreads=False, raw_fi=True,
         fsname=args.fsname, subtype=SUBTYPE, attr_timeout=0, entry_timeout=0, negative_timeout=0,
         use_ino=True, big_writes=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
