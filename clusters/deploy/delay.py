"""Slow links without tc netem: a user-space delay daemon on an NFQUEUE, in pure Python.

The kernels we run on may lack `sch_netem` (this one does) but have NFQUEUE built in
(CONFIG_NETFILTER_NETLINK_QUEUE, CONFIG_NETFILTER_XT_TARGET_NFQUEUE). `slow(src, dst, D)` adds two
rules to chain `PCSLOW` in src's namespace (jumped from INPUT and OUTPUT after the `PCHAOS` chain
of partitions and flaky links, so dropped packets are dropped first):

    -A PCSLOW -s <dst>/32 -j NFQUEUE --queue-num Q --queue-bypass     (packets from dst)
    -A PCSLOW -d <dst>/32 -j NFQUEUE --queue-num Q --queue-bypass     (packets to dst)

and starts `python -m clusters.deploy.delay --queue Q --delay-ms D` in that namespace. The daemon
speaks nfnetlink_queue over a raw netlink socket (no libnetfilter_queue, no compiled extension):
it binds queue Q with metadata-only copies (the payload never crosses into user space; GSO packets
are taken whole), notes each packet's id and arrival time, and accepts it D ms later. Every packet
waits the same D, so the packets due are always the oldest ones and one batch verdict ("accept
every id up to N") releases them: one syscall per wake-up however many packets are due.

- Every packet on the link is held D ms in each direction (a round trip gains 2 D), established
  connections included: the kernel queues packets, not connections.
- The queue is bounded (`--maxlen`, 10000 packets, in the kernel and here): beyond it packets are
  dropped, as a full router queue would.
- `--queue-bypass`: while no daemon listens (not started yet, killed), packets pass undelayed,
  so a dead daemon never cuts a link. SIGTERM accepts everything held at once, then exits.
- The daemon exits by itself when its network namespace is deleted.
"""
from __future__ import annotations

import argparse
import collections
import errno
import os
import select
import signal
import socket
import struct
import sys
import time
from pathlib import Path
from typing import Any

CHAIN = "PCSLOW"
DEFAULT_MAXLEN = 10000
MAX_DELAY_MS = 60_000
READY_TIMEOUT = 15.0

# <linux/netlink.h>, <linux/netfilter/nfnetlink.h>, <linux/netfilter/nfnetlink_queue.h>
NETLINK_NETFILTER = 12
SOL_NETLINK = 270
NETLINK_NO_ENOBUFS = 5
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR, NLMSG_DONE = 2, 3
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG, NFQNL_MSG_VERDICT_BATCH = 0, 1, 2, 3
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN, NFQA_CFG_MASK, NFQA_CFG_FLAGS = 1, 2, 3, 4, 5
NFQNL_CFG_CMD_BIND, NFQNL_CFG_CMD_UNBIND = 1, 2
NFQNL_COPY_META = 1
NFQA_CFG_F_GSO = 1 << 2
NF_DROP, NF_ACCEPT = 0, 1
_NLMSGHDR = struct.Struct("=IHHII")
_NFGENMSG_LEN = 4


def check_delay(delay_ms: Any) -> float:
    """A delay in ms, validated: a number in (0, 60000]."""
    from clusters.deploy.backend import ClusterError
    try:
        d = float(delay_ms)
    except (TypeError, ValueError):
        raise ClusterError(f"delay {delay_ms!r} is not a number", "give milliseconds, e.g. 200") from None
    if not 0 < d <= MAX_DELAY_MS:
        raise ClusterError(f"delay {delay_ms!r} ms out of range", f"use 0 < delay_ms <= {MAX_DELAY_MS}")
    return d


def rules(ip: str, queue: int, op: str = "-A") -> list[str]:
    """The two iptables-restore lines that send a link's packets (both ways) to queue `queue`."""
    target = f"-j NFQUEUE --queue-num {queue} --queue-bypass"
    return [f"{op} {CHAIN} -s {ip}/32 {target}", f"{op} {CHAIN} -d {ip}/32 {target}"]


def ensure_chain(namespace: str) -> None:
    """Create chain PCSLOW in the namespace and jump to it from INPUT and OUTPUT (after PCHAOS)."""
    from clusters.deploy import hostnet
    base = ["ip", "netns", "exec", namespace, "iptables", "-w", "5"]
    if hostnet.run(base + ["-S", CHAIN], check=False).returncode != 0:
        hostnet.run(base + ["-N", CHAIN])
    for hook in ("INPUT", "OUTPUT"):
        if hostnet.run(base + ["-C", hook, "-j", CHAIN], check=False).returncode != 0:
            hostnet.run(base + ["-A", hook, "-j", CHAIN])


def argv(queue: int, delay_ms: float, namespace: str, ready: Path, maxlen: int = DEFAULT_MAXLEN) -> list[str]:
    return [sys.executable, "-m", "clusters.deploy.delay", "--queue", str(queue), "--delay-ms", f"{delay_ms:g}",
            "--maxlen", str(maxlen), "--netns", namespace, "--ready", str(ready)]


def wait_ready(pid_alive: Any, ready: Path, log: Path, timeout: float = READY_TIMEOUT) -> None:
    """Wait until the daemon has bound its queue (it writes `ready`); ClusterError if it exits first."""
    from clusters.deploy.backend import ClusterError
    deadline = time.monotonic() + timeout
    while not ready.exists():
        if not pid_alive():
            last = ""
            try:
                lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
                last = lines[-1][:200] if lines else ""
            except OSError:
                pass
            raise ClusterError("the delay daemon exited while binding its NFQUEUE" + (f": {last}" if last else ""),
                               f"read {log}; the kernel needs NFQUEUE (CONFIG_NETFILTER_NETLINK_QUEUE)")
        if time.monotonic() > deadline:
            raise ClusterError(f"the delay daemon did not bind its NFQUEUE within {timeout:.0f}s", f"read {log}")
        time.sleep(0.02)


# ------------------------------------------------------------------------------ the daemon

def _attr(kind: int, payload: bytes) -> bytes:
    n = 4 + len(payload)
    return struct.pack("=HH", n, kind) + payload + b"\0" * ((4 - n % 4) % 4)


def _attrs(buf: bytes, off: int, end: int) -> dict[int, bytes]:
    out = {}
    while off + 4 <= end:
        n, kind = struct.unpack_from("=HH", buf, off)
        if n < 4:
            break
        out[kind & 0x3FFF] = buf[off + 4:off + n]
        off += (n + 3) & ~3
    return out


class NfQueue:
    """One NFQUEUE bound over a raw nfnetlink socket, metadata-only copies."""

    def __init__(self, queue: int, maxlen: int = DEFAULT_MAXLEN):
        self.queue = queue
        self.seq = 0
        self.backlog: list[int] = []      # packet ids read while waiting for an acknowledgement
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self.sock.bind((0, 0))
        for opt in (getattr(socket, "SO_RCVBUFFORCE", 33), socket.SO_RCVBUF):
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, opt, 8 << 20)
                break
            except OSError:
                continue
        try:
            self.sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
        except OSError:
            pass
        self._config(_attr(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_BIND, socket.AF_INET)))
        self._config(_attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META))
                     + _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", maxlen)))
        try:      # take GSO packets whole (nothing here looks at the payload); optional
            self._config(_attr(NFQA_CFG_MASK, struct.pack("!I", NFQA_CFG_F_GSO))
                         + _attr(NFQA_CFG_FLAGS, struct.pack("!I", NFQA_CFG_F_GSO)))
        except OSError:
            pass

    def _message(self, msg: int, body: bytes, flags: int = NLM_F_REQUEST) -> tuple[bytes, int]:
        self.seq += 1
        payload = struct.pack("=BB", socket.AF_UNSPEC, 0) + struct.pack("!H", self.queue) + body
        head = _NLMSGHDR.pack(_NLMSGHDR.size + len(payload), (NFNL_SUBSYS_QUEUE << 8) | msg, flags, self.seq, 0)
        return head + payload, self.seq

    def _config(self, body: bytes) -> None:
        data, seq = self._message(NFQNL_MSG_CONFIG, body, NLM_F_REQUEST | NLM_F_ACK)
        self.sock.send(data)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            r, _, _ = select.select([self.sock], [], [], 0.5)
            if not r:
                continue
            buf = self.sock.recv(1 << 16)
            for kind, mseq, off, end in self._split(buf):
                if kind == NLMSG_ERROR and mseq == seq:
                    (err,) = struct.unpack_from("=i", buf, off)
                    if err:
                        raise OSError(-err, f"nfqueue config: {os.strerror(-err)}")
                    return
                if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                    self.backlog.extend(self._packet_ids(buf, off, end))
        raise OSError(errno.ETIMEDOUT, "nfqueue config: no answer from the kernel")

    @staticmethod
    def _split(buf: bytes):
        off = 0
        while off + _NLMSGHDR.size <= len(buf):
            n, kind, _flags, seq, _pid = _NLMSGHDR.unpack_from(buf, off)
            if n < _NLMSGHDR.size:
                break
            yield kind, seq, off + _NLMSGHDR.size, off + n
            off += (n + 3) & ~3

    @staticmethod
    def _packet_ids(buf: bytes, off: int, end: int) -> list[int]:
        hdr = _attrs(buf, off + _NFGENMSG_LEN, end).get(NFQA_PACKET_HDR)
        return [struct.unpack_from("!I", hdr)[0]] if hdr and len(hdr) >= 4 else []

    def read(self) -> list[int]:
        """The ids of every packet queued so far (non-blocking)."""
        ids, self.backlog = self.backlog, []
        for _ in range(256):          # bounded: verdicts must not starve
            try:
                buf = self.sock.recv(1 << 18, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno == errno.ENOBUFS:  # overrun: those packets were dropped by the kernel
                    continue
                raise
            for kind, _seq, off, end in self._split(buf):
                if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                    ids.extend(self._packet_ids(buf, off, end))
        return ids

    def verdict(self, packet_id: int, verdict: int, batch: bool = False) -> None:
        """Set the verdict of one packet (or, batch, of every queued packet with an id <= packet_id)."""
        data, _ = self._message(NFQNL_MSG_VERDICT_BATCH if batch else NFQNL_MSG_VERDICT,
                                _attr(NFQA_VERDICT_HDR, struct.pack("!II", verdict, packet_id)))
        self.sock.send(data)

    def fileno(self) -> int:
        return self.sock.fileno()


def _netns_gone(namespace: str | None) -> bool:
    if not namespace:
        return False
    try:
        return os.stat(f"/run/netns/{namespace}").st_ino != os.stat("/proc/self/ns/net").st_ino
    except OSError:
        return True


def serve(queue: int, delay_ms: float, maxlen: int, namespace: str | None, ready: Path | None) -> dict[str, int]:
    q = NfQueue(queue, maxlen)
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.append(1))
    if ready is not None:
        tmp = ready.with_name(ready.name + ".tmp")
        tmp.write_text(f"{os.getpid()}\n")
        os.replace(tmp, ready)
    print(f"delay: queue {queue} bound, holding each packet {delay_ms:g} ms (at most {maxlen} held)", flush=True)
    delay = delay_ms / 1000.0
    held: collections.deque[tuple[float, int]] = collections.deque()
    stats = {"accepted": 0, "dropped": 0}
    next_check = time.monotonic() + 2.0
    while not stop:
        now = time.monotonic()
        timeout = min(max(0.0, held[0][0] - now), 1.0) if held else 1.0
        try:
            readable, _, _ = select.select([q], [], [], timeout)
        except InterruptedError:
            continue
        now = time.monotonic()
        if readable or q.backlog:
            for pid in q.read():
                if len(held) >= maxlen:
                    q.verdict(pid, NF_DROP)
                    stats["dropped"] += 1
                else:
                    held.append((now + delay, pid))
        last = None
        while held and held[0][0] <= now:
            last = held.popleft()[1]
            stats["accepted"] += 1
        if last is not None:
            q.verdict(last, NF_ACCEPT, batch=True)
        if now >= next_check:
            next_check = now + 2.0
            if _netns_gone(namespace):
                print("delay: the network namespace is gone; exiting", flush=True)
                break
    if held:                                # let everything held go at once
        q.verdict(held[-1][1], NF_ACCEPT, batch=True)
        stats["accepted"] += len(held)
    print(f"delay: queue {queue} done: {stats['accepted']} packets delayed, {stats['dropped']} dropped "
          f"(queue full)", flush=True)
    return stats


def main(args: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m clusters.deploy.delay",
                                description="Hold every packet of an NFQUEUE for a fixed delay.")
    p.add_argument("--queue", type=int, required=True)
    p.add_argument("--delay-ms", type=float, required=True)
    p.add_argument("--maxlen", type=int, default=DEFAULT_MAXLEN)
    p.add_argument("--netns", help="exit once this network namespace (ip netns name) is gone")
    p.add_argument("--ready", type=Path, help="file written once the queue is bound")
    a = p.parse_args(args)
    if not 0 <= a.queue <= 65535 or not 0 < a.delay_ms <= MAX_DELAY_MS or a.maxlen < 1:
        p.error("need 0 <= queue <= 65535, 0 < delay-ms <= 60000, maxlen >= 1")
    try:
        serve(a.queue, a.delay_ms, a.maxlen, a.netns, a.ready)
    except OSError as e:
        print(f"delay: error: {e} (the kernel needs NFQUEUE support, and root)", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
