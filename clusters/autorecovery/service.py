"""AutoRecovery: the auditor election, the auditor and the replication worker of one bookie process
(BookKeeper's AutoRecoveryMain with `autoRecoveryDaemonEnabled`).

It has its own ZooKeeper session and BookKeeper client and reaches the bookies over the network
like any client, so it suffers the faults of the bookie process it runs in (a killed or paused
bookie also loses its auditor and worker; its ephemeral vote and locks go with its session).

Election: every candidate creates an ephemeral sequential znode
/ledgers/underreplication/auditorelection/V_<seq> holding {"bookie": id}; the lowest sequence
number is the auditor; every candidate watches the votes and re-checks when they change (and every
few seconds anyway; with a few dozen bookies at most, the herd of one watch each costs nothing).  A candidate whose session is lost stops auditing at once and
enters again with a new znode.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time

from clusters.bookkeeper.client import BookKeeper
from clusters.bugs import Knobs
from clusters.bookkeeper.metadata import AVAILABLE
from clusters.config import BookieConfig
from clusters.metadata.store import MetadataStore, NoNode

from . import stats
from .auditor import Auditor
from .urmanager import ELECTION, UnderreplicationManager
from .worker import ReplicationWorker

log = logging.getLogger(__name__)

VOTE_PREFIX = "V_"
ELECTION_RECHECK_S = 5.0


def _seq(name: str) -> int:
    try:
        return int(name[len(VOTE_PREFIX):])
    except ValueError:
        return 1 << 62


class AutoRecovery:
    def __init__(self, zk: str, bookie_id: str, *, lost_bookie_recovery_delay_s: float = 5.0,
                 audit_interval_s: float = 300.0, open_ledger_rereplication_grace_s: float = 30.0,
                 rereplication_backoff_s: float = 1.0, session_timeout: float = 6.0,
                 name: str = "", auditor: bool = True, worker: bool = True, knobs: Knobs | None = None):
        self.zk_hosts = zk
        # the bookie's bug knobs, handed to this process's BookKeeper client (None: all safe)
        self.knobs = knobs if knobs is not None else Knobs.defaults("bookie")
        self.bookie_id = bookie_id
        self.lost_bookie_recovery_delay_s = lost_bookie_recovery_delay_s
        self.audit_interval_s = audit_interval_s
        self.grace_s = open_ledger_rereplication_grace_s
        self.backoff_s = rereplication_backoff_s
        self.session_timeout = session_timeout
        self.name = name or f"autorecovery-{bookie_id}"
        self.enable_auditor = auditor
        self.enable_worker = worker
        self.store: MetadataStore | None = None
        self.bk: BookKeeper | None = None
        self.urm: UnderreplicationManager | None = None
        self.worker: ReplicationWorker | None = None
        self.auditor: Auditor | None = None
        self.live: set[str] = set()
        self.vote: str | None = None
        self._auditor_task: asyncio.Task | None = None
        self._tasks: list[asyncio.Task] = []
        self._main: asyncio.Task | None = None
        self._elect_wake = asyncio.Event()
        self._ready = asyncio.Event()
        self._watching = False              # the children watch on the election votes is set
        self._stopping = False

    @classmethod
    def from_config(cls, cfg: BookieConfig, knobs: Knobs | None = None) -> "AutoRecovery":
        return cls(cfg.zk, cfg.bookie_id,
                   lost_bookie_recovery_delay_s=cfg.lost_bookie_recovery_delay_s,
                   audit_interval_s=cfg.audit_interval_s,
                   open_ledger_rereplication_grace_s=cfg.open_ledger_rereplication_grace_s,
                   rereplication_backoff_s=cfg.rereplication_backoff_s,
                   session_timeout=cfg.zk_session_timeout, name=f"{cfg.name}-autorecovery",
                   knobs=knobs if knobs is not None else Knobs(cfg.bugs, "bookie"))

    @property
    def is_auditor(self) -> bool:
        return self._auditor_task is not None and not self._auditor_task.done()

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> "AutoRecovery":
        """Returns at once; connecting (and retrying while ZooKeeper is unreachable) goes on in
        the background.  `await ready()` to wait for it."""
        self._main = asyncio.get_running_loop().create_task(self._run(), name="autorecovery")
        return self

    async def ready(self, timeout: float = 30.0) -> "AutoRecovery":
        await asyncio.wait_for(self._ready.wait(), timeout)
        return self

    async def _connect(self) -> None:
        while True:
            store = MetadataStore(self.zk_hosts, session_timeout=self.session_timeout,
                                  name=self.name)
            try:
                await store.start(timeout=15)
                bk = await BookKeeper(store, name=self.name, knobs=self.knobs).start()
            except asyncio.CancelledError:
                await asyncio.shield(store.close())
                raise
            except Exception as e:
                log.warning("%s: ZooKeeper not reachable yet: %r", self.name, e)
                try:
                    await store.close()
                except Exception:
                    pass
                await asyncio.sleep(1)
                continue
            self.store, self.bk = store, bk
            return

    async def _run(self) -> None:
        await self._connect()
        self.urm = UnderreplicationManager(self.store, self.bk._zk)
        while True:
            try:
                await self.urm.ensure_paths()
                break
            except Exception as e:
                log.warning("%s: creating %s: %r", self.name, ELECTION, e)
                await asyncio.sleep(1)
        self.worker = ReplicationWorker(self.bk, self.urm, self.bookie_id, grace_s=self.grace_s,
                                        backoff_s=self.backoff_s)
        self.store.add_listener(self._on_session)
        self.store.watch_children(AVAILABLE, self._on_bookies)
        loop = asyncio.get_running_loop()
        if self.enable_auditor:
            self._tasks.append(loop.create_task(self._election(), name="auditor-election"))
        if self.enable_worker:
            self._tasks.append(loop.create_task(self.worker.run(), name="replication-worker"))
        log.info("%s: started (auditor candidate: %s, replication worker: %s; lost bookie delay "
                 "%.1fs, audit every %.0fs, open ledger grace %.1fs)", self.name,
                 self.enable_auditor, self.enable_worker, self.lost_bookie_recovery_delay_s,
                 self.audit_interval_s, self.grace_s)
        self._ready.set()
        await asyncio.gather(*self._tasks)

    async def stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        self._stop_auditor("stopping")
        tasks = [t for t in [self._main, *self._tasks] if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            try:
                await asyncio.wait_for(t, 10)
            except (asyncio.CancelledError, asyncio.TimeoutError, Exception):
                pass
        if self.bk is not None:
            await self.bk.close()
        if self.store is not None:
            await self.store.close()     # the vote and any lock go with the session
        log.info("%s: stopped", self.name)

    # -- bookies and session --------------------------------------------------------------
    def _on_bookies(self, children: list[str]) -> None:
        live = {c for c in children if ":" in c}
        removed, added = self.live - live, live - self.live
        self.live = live
        if self.auditor is not None and self.is_auditor:
            self.auditor.bookies_changed(live, removed)
        if added and self.worker is not None:
            self.worker.reset_backoff()

    def _on_session(self, state: str) -> None:
        if state == "LOST":
            self._stop_auditor("ZooKeeper session lost")
        self._elect_wake.set()

    def wake_worker(self) -> None:
        if self.worker is not None:
            self.worker.wake.set()

    # -- election -------------------------------------------------------------------------
    def _start_auditor(self) -> None:
        if self.is_auditor:
            return
        self.auditor = Auditor(self)
        self.auditor.bookies_changed(self.live, set())
        self._auditor_task = asyncio.get_running_loop().create_task(self.auditor.run(),
                                                                    name="auditor")
        stats.AUDITOR.set(1)
        log.info("%s: elected auditor (%s); first audit in %.1fs", self.name, self.vote,
                 self.lost_bookie_recovery_delay_s)

    def _stop_auditor(self, why: str) -> None:
        t, self._auditor_task = self._auditor_task, None
        if t is not None and not t.done():
            t.cancel()
            stats.AUDITOR.set(0)
            log.info("%s: no longer the auditor: %s", self.name, why)

    async def _ensure_vote(self) -> str:
        store = self.store
        if self.vote is not None:
            owner = await self.bk._zk(store.owner_session, self.vote)
            if owner is not None and owner == store.session_id:
                return self.vote
            self._stop_auditor(f"our vote {self.vote} is gone")
            self.vote = None
        data = json.dumps({"bookie": self.bookie_id, "at": int(time.time() * 1000)}).encode()
        self.vote = await self.bk._zk(store.create, f"{ELECTION}/{VOTE_PREFIX}", data,
                                      ephemeral=True, sequence=True, makepath=True)
        return self.vote

    async def _election(self) -> None:
        while True:
            self._elect_wake.clear()
            try:
                if self.store.connected:
                    await self._elect_once()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("%s: auditor election: %r", self.name, e)
            try:
                await asyncio.wait_for(self._elect_wake.wait(), ELECTION_RECHECK_S)
            except asyncio.TimeoutError:
                pass

    async def _votes(self) -> list[str]:
        return sorted((c for c in await self.bk._zk(self.store.children, ELECTION)
                       if c.startswith(VOTE_PREFIX)), key=_seq)

    async def _elect_once(self) -> None:
        vote = await self._ensure_vote()
        mine = vote.rsplit("/", 1)[1]
        if not self._watching:          # one watch on the votes: any change re-runs the election
            self._watching = True
            self.store.watch_children(ELECTION, lambda _children: self._elect_wake.set())
        votes = await self._votes()
        if mine not in votes:
            self.vote = None
            self._elect_wake.set()
            return
        if votes[0] == mine:
            self._start_auditor()
            return
        self._stop_auditor(f"{votes[0]} is ahead of {mine}")

    async def auditor_of(self) -> str | None:
        """The bookie id of the current auditor (the lowest vote), from ZooKeeper."""
        for v in await self._votes():
            try:
                data, _ = await self.store.get(f"{ELECTION}/{v}")
                return json.loads(data).get("bookie")
            except (NoNode, ValueError):
                continue
        return None


async def start_in_bookie(cfg: BookieConfig, knobs: Knobs | None = None) -> AutoRecovery | None:
    """The bookie process's hook: start auto-recovery unless `autorecovery_enabled` is off; its
    BookKeeper client gets the bookie's bug knobs (`knobs`)."""
    if not cfg.autorecovery_enabled:
        return None
    return await AutoRecovery.from_config(cfg, knobs).start()
