"""The ledger workload: the BookKeeper client driven directly, to check the storage layer's fencing claim.

One writer appends unique ints to a ledger (several logical processes pipelining adds on one
LedgerHandle, as a broker does); another process, at seeded random times, opens the writer's
current ledger with recovery (which fences it on the bookies and closes it); the writer, fenced or
broken, creates a new ledger and goes on. At the end every ledger the run used is opened with
recovery and read entirely. The `fencing` checker then verifies that every acknowledged add is in
its closed ledger (lost-entry, beyond-close) and that no add was acknowledged beyond a completed
recovery's last entry (ack-after-fence).

Everything goes through our BookKeeper client (`clusters/bookkeeper/client.py`) as a user library,
over the network: ZooKeeper at cluster.json's `zk_connect`, the bookies it lists there. The ledgers
the writer uses are registered as children of a run-specific znode (`registry_path`), which is how
the recoverer (another worker process) and the final step find them; `keys()` is [] because they
are not known in advance.

History (key = the ledger id as a string):
  add      invoke value = the int; ok with message_id {ledger_id, entry_id, partition -1, batch_index -1};
           fail when certainly not written (no ledger to write to, or the handle refused it before
           sending); info otherwise (a fenced or failed add may still be on a bookie)
  recover  ok value {"last_entry": L}; fail if the ledger does not exist; info otherwise (value
           {"invalid_fragment": why} when it asked for a fragment below the ledger's last one)
  read     (final, process >= FINAL_PROCESS) ok value [{"entry_id", "value", "message_id"}...]; an
           entry that every bookie of its write set says it does not have is left out (lost), and
           listed in "missing"; an entry no bookie answered for makes the read info

The BookKeeper clients here are the system under test (the writer and the recoverer stand for two
brokers), so they receive the run's bookkeeper-client bug knobs (`--bug bk....`); the final reads'
client gets them too (its recoveries are the system's).

Targeted faults (options, off by default): one request type to one bookie lost, late or refused, between
the client and the bookie (clusters/bookkeeper/channel.py `RequestFault`), the way a one-way network fault
of one connection (or a bookie refusing one client's adds) would do it. "The ledger's target bookie" is the one at index (ledger id mod E) of
its ensemble (so that it is the first in some ledgers and the last in others):
  lost_fence          the recoverer's fencing LAC read to the ledger's target bookie is lost (it never
                      arrives; coverage is reached without it)
  slow_adds_ms        the writer's adds to the ledger's target bookie arrive this much later
  lost_adds_from      the writer's adds of entry ids >= this are lost (to every bookie): the writer
                      replaces its whole ensemble, and the new last fragment stays empty
  lost_recovery_adds  the recoverer's recovery write-backs are lost
  slow_metadata_ms    the writer's ledger metadata writes (an ensemble change's compare-and-set) reach
                      ZooKeeper this much later
  refused_adds_every  N: the bookies of each ledger's first ensemble refuse the writer's adds one after
                      another, as a bookie turned read-only does: the one at index i answers an error to
                      entries from (i + 1) * N on, REFUSE_LATE_S late (after the others' acknowledgements,
                      so each failure comes after the entry reached Qa when Qw > Qa)
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from core.history import FAIL, INFO, INVOKE, OK, MessageId, Op
from core.spec import TestSpec
from workloads import base
from workloads.base import MAX_WORKERS, Context, Planned

DESCRIPTION = ("BookKeeper directly: one writer appends ints to ledgers while another process recovers "
               "(fences) them, and every acknowledged entry must be in its closed ledger")
OPTIONS: dict[str, tuple[Any, str]] = {
    "recover_interval": (3.0, "mean seconds between the recoverer's recoveries of the writer's current "
                              "ledger (each wait is uniform in [0.5, 1.5] times this)"),
    "ledger_max_entries": (1000, "the writer closes its ledger and starts a new one after this many "
                                 "entries (0: only when fenced or broken)"),
    "lost_fence": (False, "the recoverer's fencing LAC read to the ledger's target bookie (index ledger id "
                          "mod E of the ensemble) is lost"),
    "slow_adds_ms": (0, "the writer's adds to the ledger's target bookie are this many ms late"),
    "lost_adds_from": (0, "the writer's adds of entry ids >= this are lost (0: none)"),
    "lost_recovery_adds": (False, "the recoverer's recovery write-backs are lost"),
    "slow_metadata_ms": (0, "the writer's ledger metadata writes reach ZooKeeper this many ms late"),
    "refused_adds_every": (0, "N: the bookie at index i of each ledger's first ensemble refuses the writer's "
                              "adds of entries from (i + 1) * N on, with an error 200 ms late (0: none)"),
}
REFUSE_LATE_S = 0.2               # refused_adds_every: the refusal's delay
VALUE_STRIDE = 10_000_000         # value = (adder + 1) * VALUE_STRIDE + n: unique across the run
ROOT = "/pulsar-chaos/ledger"     # the registry znodes live under ROOT/<test name>-<run id>
ADD_WAIT_S = 30.0                 # an add still unanswered after this is info (the client's own add
                                  # timeout, 5 s, normally answers first)
RECOVER_WAIT_S = 30.0
ZK_SESSION_S = 10.0
CREATE_BACKOFF_S = (0.5, 4.0)     # a new ledger after a broken one: first wait, doubling up to the max


def registry_path(spec: TestSpec, run_id: str) -> str:
    return f"{ROOT}/{spec.test_name}-{run_id}"


def keys(spec: TestSpec, run_id: str) -> list[str]:
    return []          # the ledgers are created during the run; topic-targeted faults pick random targets


def worker_count(spec: TestSpec) -> int:
    return max(1, min(MAX_WORKERS, 2))       # the writer in worker 0, the recoverer in worker 1


def adders(spec: TestSpec) -> int:
    """Logical processes adding to the writer's ledger (0..n-1); the recoverer is process n."""
    return max(1, spec.concurrency - 1)


def recoverer_process(spec: TestSpec) -> int:
    return adders(spec)


def recoverer_worker(spec: TestSpec, workers: int) -> int:
    return min(1, workers - 1)


def generator(spec: TestSpec, adder: int) -> Iterator[Planned]:
    """The adder's values and pauses, a pure function of (seed, adder); the key (the ledger) is decided
    when the add is performed, so Planned.key is empty."""
    rng = random.Random(f"{spec.seed}:ledger:{adder}")
    delays = base.paced(rng, spec.rate / adders(spec))
    n = 0
    while True:
        n += 1
        yield Planned("add", "", (adder + 1) * VALUE_STRIDE + n, next(delays))


def recover_delays(spec: TestSpec) -> Iterator[float]:
    rng = random.Random(f"{spec.seed}:ledger:recover")
    mean = float(spec.options.get("recover_interval", OPTIONS["recover_interval"][0]))
    while True:
        yield rng.uniform(0.5 * mean, 1.5 * mean)


def message_id(ledger: int, entry: int) -> MessageId:
    return MessageId(ledger, entry, -1, -1)


decode = base.decode_value


# ------------------------------------------------------------------------------------ the client

class Client:
    """A BookKeeper client on its own event loop thread (one per worker process)."""

    def __init__(self, zk_connect: str, name: str, out: Any = None, bugs: dict[str, Any] | None = None,
                 fault: Any = None):
        self.bugs = dict(bugs or {})
        self.fault = fault            # a RequestFault for the client's channel pool (targeted faults)
        self.metadata_delay = 0.0     # seconds each metadata compare-and-set waits first (targeted fault)
        self.out = out or sys.stdout
        self.name = name
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=f"bk-{name}", daemon=True)
        self._thread.start()
        self.store: Any = None
        self.bk: Any = None
        self.zk_connect = zk_connect
        self.writer: Any = None        # the Writer, in the writer's worker (for its targeted faults)
        self._started = False
        self._start_lock = threading.Lock()

    def log(self, text: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {self.name}: {text}", file=self.out, flush=True)

    def call(self, coro: Any, timeout: float) -> Any:
        """Run a coroutine on the loop; raises its exception, or concurrent.futures.TimeoutError."""
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise

    def ensure_started(self, timeout: float = 30.0) -> None:
        """Open the ZooKeeper session and the BookKeeper client (retried by later calls on failure)."""
        with self._start_lock:
            if self._started:
                return
            self.call(self._start(timeout), timeout + 5)
            self._started = True

    async def _start(self, timeout: float) -> None:
        from clusters.bookkeeper.client import BookKeeper
        from clusters.metadata.store import MetadataStore
        if self.store is None:
            store = MetadataStore(self.zk_connect, session_timeout=ZK_SESSION_S, name=self.name)
            await store.start(timeout)          # raises on a timeout: a new session next time
            if self.metadata_delay > 0:
                store.set = _late(store.set, self.metadata_delay)     # type: ignore[method-assign]
            self.store = store
        if self.bk is None:
            from clusters.bugs import Knobs
            self.bk = await BookKeeper(self.store, name=self.name,
                                       knobs=Knobs(self.bugs, "bookkeeper-client")).start()
            self.bk.pool.fault = self.fault

    def close(self, timeout: float = 5.0) -> None:
        async def shut() -> None:
            if self.bk is not None:
                await self.bk.close()
            if self.store is not None:
                await self.store.close()
        try:
            self.call(shut(), timeout)
        except Exception:
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)

    # -- the registry of the run's ledgers
    async def register(self, root: str, ledger: int) -> None:
        from clusters.metadata.store import NodeExists
        try:
            await self.store.create(f"{root}/{ledger:012d}", b"", makepath=True)
        except NodeExists:
            pass

    async def registered(self, root: str) -> list[int]:
        names = await self.store.children(root)
        return sorted(int(n) for n in names if n.isdigit())

    @property
    def writer_handle(self) -> Any:
        return self.writer.lh if self.writer is not None else None

    # -- recovery and reads
    async def recover(self, ledger: int) -> int:
        rh = await self.bk.open_ledger(ledger, recovery=True)
        return rh.last_entry_id

    async def recover_and_read(self, ledger: int) -> list[dict[str, Any]]:
        rh = await self.bk.open_ledger(ledger, recovery=True)
        last = rh.last_entry_id
        if last < 0:
            return []
        from clusters.bookkeeper.errors import BKNoSuchEntryError
        out = []
        missing: list[int] = []
        step = 1000

        def keep(e: int, p: bytes) -> None:
            out.append({"entry_id": e, "value": decode(p),
                        "message_id": {"ledger_id": ledger, "entry_id": e, "partition": -1,
                                       "batch_index": -1}})
        for first in range(0, last + 1, step):
            hi = min(last, first + step - 1)
            try:
                payloads = await rh.read(first, hi)
            except BKNoSuchEntryError:
                # one by one: an entry every bookie of its write set says it lacks is lost (a
                # definite answer); any other error still fails the read
                for e in range(first, hi + 1):
                    try:
                        keep(e, (await rh.read(e, e))[0])
                    except BKNoSuchEntryError:
                        missing.append(e)
                continue
            for i, p in enumerate(payloads):
                keep(first + i, p)
        if missing:
            self.log(f"ledger {ledger}: no bookie has entries {missing[:20]} (closed at {last})")
        return out


class Writer:
    """The one writer: a current LedgerHandle shared by the adders, replaced when fenced, broken or full.
    Everything runs on the client's loop."""

    def __init__(self, client: Client, spec: TestSpec, root: str):
        self.client = client
        self.spec = spec
        self.root = root
        self.max_entries = int(spec.options.get("ledger_max_entries", OPTIONS["ledger_max_entries"][0]))
        self.lh: Any = None
        self._lock: asyncio.Lock | None = None
        self.ledgers: list[int] = []
        self.first_ensembles: dict[int, list[str]] = {}   # ledger -> its ensemble at creation
        # after a ledger broke for another reason than a fence (a bookie down, no spare bookie), the
        # next one is created only after a backoff, so that a dead bookie does not make a ledger per add
        self.backoff = CREATE_BACKOFF_S[0]
        self.retry_at = 0.0

    def _usable(self, lh: Any) -> bool:
        return (lh is not None and lh is self.lh
                and (self.max_entries <= 0 or lh.last_add_pushed + 1 < self.max_entries))

    async def handle(self) -> Any:
        lh = self.lh
        if self._usable(lh):
            return lh
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            lh = self.lh
            if self._usable(lh):
                return lh
            if lh is not None:             # full: close it at its last acknowledged entry
                self.lh = None
                self.client.loop.create_task(self._close(lh))
            wait = self.retry_at - time.monotonic()
            if wait > 0:
                raise RuntimeError("backing off after the last ledger broke")
            spec = self.spec
            try:
                new = await self.client.bk.create_ledger(spec.ensemble, spec.write_quorum, spec.ack_quorum)
                await self.client.register(self.root, new.ledger_id)
            except Exception:
                self.retry_at = time.monotonic() + self.backoff
                self.backoff = min(self.backoff * 2, CREATE_BACKOFF_S[1])
                raise
            self.lh = new
            self.ledgers.append(new.ledger_id)
            self.first_ensembles[new.ledger_id] = list(new.ensemble)
            self.client.log(f"writing ledger {new.ledger_id} on {new.ensemble}")
            return new

    async def _close(self, lh: Any) -> None:
        try:
            await lh.close()
            self.client.log(f"closed ledger {lh.ledger_id} at entry {lh.last_add_confirmed}")
        except Exception as e:
            self.client.log(f"closing ledger {lh.ledger_id}: {type(e).__name__}: {e}")

    def broken(self, lh: Any, e: BaseException | str) -> None:
        from clusters.bookkeeper.errors import BKLedgerFencedError
        if self.lh is lh:
            self.lh = None
            why = e if isinstance(e, str) else f"{type(e).__name__}: {e}"
            if isinstance(e, BKLedgerFencedError):       # recovered by someone: a new ledger at once
                self.client.log(f"ledger {lh.ledger_id} abandoned: {why}")
                return
            self.retry_at = time.monotonic() + self.backoff
            self.client.log(f"ledger {lh.ledger_id} abandoned: {why}; the next in {self.backoff:g}s")
            self.backoff = min(self.backoff * 2, CREATE_BACKOFF_S[1])

    def succeeded(self) -> None:
        self.backoff = CREATE_BACKOFF_S[0]

    async def add(self, lh: Any, value: int) -> tuple[str, dict[str, Any]]:
        """(type, changes) of one add of `value` to the handle `lh` (from `handle()`)."""
        fut = lh.add_entry_async(str(value).encode())
        if fut.done() and fut.exception() is not None:        # refused before anything was sent
            e = fut.exception()
            self.broken(lh, e)
            return FAIL, {"error": f"not sent: {type(e).__name__}: {e}"}
        try:
            entry = await asyncio.wait_for(asyncio.shield(fut), ADD_WAIT_S)
        except asyncio.TimeoutError:
            self.broken(lh, f"an add unanswered after {ADD_WAIT_S:.0f}s")
            return INFO, {"error": f"no answer after {ADD_WAIT_S:.0f}s"}
        except Exception as e:
            self.broken(lh, e)
            return INFO, {"error": f"{type(e).__name__}: {e}"}
        self.succeeded()
        return OK, {"message_id": message_id(lh.ledger_id, entry)}


def _log_bookkeeper() -> None:
    """The BookKeeper client's own log (ensemble changes, recoveries) into the worker's stdout (its
    log file), once per process."""
    import logging

    class Stdout(logging.StreamHandler):
        def emit(self, record: logging.LogRecord) -> None:
            self.stream = sys.stdout           # whatever stdout is now
            super().emit(record)
    lg = logging.getLogger("clusters.bookkeeper")
    if not any(getattr(h, "_ledger_workload", False) for h in lg.handlers):
        h = Stdout(sys.stdout)
        h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
        h._ledger_workload = True          # type: ignore[attr-defined]
        lg.addHandler(h)
        lg.setLevel(logging.INFO)


def _failed_recovery(e: BaseException) -> dict[str, Any]:
    """An info op's fields for a recovery that raised `e`; value {"invalid_fragment": why} when it failed
    because it asked for a fragment keyed below the ledger's last one (the `fencing` checker's
    invalid-fragment: such a recovery fails every time, and the ledger cannot be closed)."""
    from clusters.bookkeeper.errors import BKInvalidEnsembleError
    out: dict[str, Any] = {"error": _error(e)}
    if isinstance(e, BKInvalidEnsembleError):
        out["value"] = {"invalid_fragment": str(e)}
    return out


def _error(e: BaseException) -> str:
    if isinstance(e, concurrent.futures.TimeoutError):
        return "timed out"
    return f"{type(e).__name__}: {e}"


def client_for(ctx: Context, role: str = "final") -> Client:
    """The worker's BookKeeper client; `role` ("writer", "recoverer", both when one worker runs them,
    or "final") decides which targeted faults its requests suffer."""
    _log_bookkeeper()
    c = Client(ctx.cluster.get("zk_connect", ""), ctx.name, ctx.out, bugs=ctx.spec.bugs)
    c.fault = request_fault(ctx.spec, role, c)
    if "writer" in role:
        c.metadata_delay = float(ctx.spec.options.get("slow_metadata_ms", 0) or 0) / 1000.0
    ctx.cleanups.append(c.close)
    return c


def _late(fn: Callable[..., Any], delay: float) -> Callable[..., Any]:
    """`fn` (a coroutine function) reaching its server `delay` seconds late."""
    async def late(*args: Any, **kw: Any) -> Any:
        await asyncio.sleep(delay)
        return await fn(*args, **kw)
    return late


def request_fault(spec: TestSpec, role: str, client: Client) -> Any:
    """The RequestFault of the options' targeted faults for a client in `role`, or None."""
    from clusters.bookie import protocol as P
    from clusters.bookkeeper.channel import DROP, Answer
    opts = spec.options
    lost_fence = "recoverer" in role and bool(opts.get("lost_fence", False))
    lost_recovery_adds = "recoverer" in role and bool(opts.get("lost_recovery_adds", False))
    slow = float(opts.get("slow_adds_ms", 0) or 0) / 1000.0 if "writer" in role else 0.0
    lost_from = int(opts.get("lost_adds_from", 0) or 0) if "writer" in role else 0
    refuse_every = int(opts.get("refused_adds_every", 0) or 0) if "writer" in role else 0
    if not (lost_fence or lost_recovery_adds or slow or lost_from or refuse_every):
        return None
    refused = Answer(P.ERROR, REFUSE_LATE_S)
    fences: dict[int, int] = {}      # ledger -> fencing LAC reads sent (in ensemble order)
    size = max(1, spec.ensemble)

    def fault(addr: str, op: int, flags: int, ledger: int, entry: int) -> Any:
        if op == P.ADD:
            if flags & P.FLAG_RECOVERY_ADD:
                return DROP if lost_recovery_adds else None
            if lost_from and entry >= lost_from:
                return DROP
            if refuse_every and client.writer is not None:
                first = client.writer.first_ensembles.get(ledger)
                if first is not None and addr in first and entry >= (first.index(addr) + 1) * refuse_every:
                    return refused
            if slow:
                lh = client.writer_handle
                if lh is not None and lh.ledger_id == ledger and lh.ensemble[ledger % len(lh.ensemble)] == addr:
                    return slow
            return None
        if lost_fence and op == P.READ and flags & P.FLAG_DO_FENCING and entry == P.INVALID_ENTRY:
            n = fences[ledger] = fences.get(ledger, 0) + 1    # sent in ensemble order: index n - 1
            if (n - 1) % size == ledger % size:
                return DROP
        return None
    return fault


# ------------------------------------------------------------------------------------ threads

def run_adder(ctx: Context, client: Client, writer: Writer, adder: int) -> None:
    """Like base.drive, but the key (the ledger) is known only once the add has a handle: the invoke
    is journaled after the handle is chosen and before the entry is sent."""
    assert ctx.journal is not None
    spec = ctx.spec
    process = adder
    step = adders(spec) + 1
    next_start = time.monotonic()
    try:
        for planned in generator(spec, adder):
            next_start = max(next_start + planned.delay, time.monotonic())
            if next_start >= ctx.deadline or ctx.stop.wait(max(0.0, next_start - time.monotonic())):
                return
            type_, changes = _add(ctx, client, writer, process, planned.value)
            if type_ == INFO:
                process += step
    except base.Retired:
        return


def _add(ctx: Context, client: Client, writer: Writer, process: int, value: int) -> tuple[str, dict[str, Any]]:
    """One add, journaled: the invoke (keyed by the ledger the writer holds now) is written on the
    loop right before the entry id is assigned and sent; fail when there is no ledger to write to."""
    journal = ctx.journal
    assert journal is not None
    invoked: list[Op] = []

    def invoke(key: str) -> Op:
        inv = base.append(journal, Op(process=process, type=INVOKE, f="add", key=key, value=value))
        invoked.append(inv)
        return inv

    async def go() -> tuple[str, dict[str, Any]]:
        try:
            lh = await writer.handle()
        except Exception as e:
            invoke("")
            return FAIL, {"error": f"no ledger to write to: {type(e).__name__}: {e}"}
        invoke(str(lh.ledger_id))
        return await writer.add(lh, value)

    try:
        client.ensure_started()
        type_, changes = client.call(go(), ADD_WAIT_S + 30)
    except base.Retired:
        raise
    except Exception as e:
        if not invoked:          # nothing was sent: no BookKeeper client (ZooKeeper unreachable)
            invoke("")
            type_, changes = FAIL, {"error": f"no BookKeeper client: {_error(e)}"}
        else:
            type_, changes = INFO, {"error": _error(e)}
    base.append(journal, invoked[0].complete(type_, **changes))
    return type_, changes


def run_recoverer(ctx: Context, client: Client, process: int, step: int) -> None:
    """At seeded random times, open the writer's current ledger (the newest registered) with recovery."""
    assert ctx.journal is not None
    root = registry_path(ctx.spec, ctx.run_dir.name)
    next_start = time.monotonic()
    try:
        for delay in recover_delays(ctx.spec):
            next_start = max(next_start + delay, time.monotonic())
            if next_start >= ctx.deadline or ctx.stop.wait(max(0.0, next_start - time.monotonic())):
                return
            try:
                client.ensure_started()
                ledgers = client.call(client.registered(root), 15)
            except Exception as e:
                client.log(f"recoverer: cannot list the writer's ledgers: {_error(e)}")
                continue
            if not ledgers:
                continue
            ledger = ledgers[-1]
            inv = base.append(ctx.journal, Op(process=process, type=INVOKE, f="recover", key=str(ledger)))
            type_, changes = _recover(client, ledger)
            base.append(ctx.journal, inv.complete(type_, **changes))
            if type_ == INFO:
                process += step
    except base.Retired:
        return


def _recover(client: Client, ledger: int) -> tuple[str, dict[str, Any]]:
    from clusters.bookkeeper.errors import BKNoSuchLedgerError
    try:
        last = client.call(client.recover(ledger), RECOVER_WAIT_S)
    except BKNoSuchLedgerError as e:
        return FAIL, {"error": _error(e)}
    except Exception as e:          # it may have fenced some bookies, or even closed the ledger
        return INFO, _failed_recovery(e)
    client.log(f"recovered ledger {ledger}: last entry {last}")
    return OK, {"value": {"last_entry": last}}


def start(ctx: Context) -> list[threading.Thread]:
    spec = ctx.spec
    roles = [r for r, w in (("writer", 0), ("recoverer", recoverer_worker(spec, ctx.workers))) if ctx.worker == w]
    client = client_for(ctx, "+".join(roles) or "none")
    targets: list[tuple[str, Callable[[], None]]] = []
    if ctx.worker == 0:
        writer = Writer(client, spec, registry_path(spec, ctx.run_dir.name))
        client.writer = writer
        try:
            client.ensure_started()       # before the first add, so that it measures the system
        except Exception as e:
            client.log(f"BookKeeper client not started yet: {_error(e)}")
        targets += [(f"adder-{i}", lambda i=i: run_adder(ctx, client, writer, i)) for i in range(adders(spec))]
    if ctx.worker == recoverer_worker(spec, ctx.workers):
        targets.append(("recoverer", lambda: run_recoverer(ctx, client, recoverer_process(spec), adders(spec) + 1)))
    return base.start_threads(ctx, targets)


FINAL_THREADS = 4


def start_final(ctx: Context) -> list[threading.Thread]:
    """Open every registered ledger with recovery and read it entirely: f "read", key = ledger id,
    process FINAL_PROCESS + its index in the registry (several ledgers at once)."""
    client = client_for(ctx)
    root = registry_path(ctx.spec, ctx.run_dir.name)
    end = time.monotonic() + ctx.spec.final_read_timeout
    ledgers: list[int] = []
    while True:
        try:
            client.ensure_started()
            ledgers = client.call(client.registered(root), 15)
            break
        except Exception as e:
            client.log(f"final reads: cannot list the ledgers: {_error(e)}")
            if time.monotonic() + 2 >= end or ctx.stop.wait(1.0):
                # the process fails, and the run's verdict becomes unknown: nothing was verified
                raise RuntimeError(f"final reads: cannot list the run's ledgers under {root} in ZooKeeper "
                                   f"({_error(e)}); the ledgers stay in the cluster's data for inspection")
    client.log(f"final reads of {len(ledgers)} ledgers: {ledgers}")

    def read_one(i: int, ledger: int) -> None:
        def perform() -> tuple[str, dict[str, Any]]:
            left = end - time.monotonic()
            if left <= 0:
                return INFO, {"error": f"not read within final_read_timeout ({ctx.spec.final_read_timeout:g}s)"}
            try:
                return OK, {"value": client.call(client.recover_and_read(ledger), left)}
            except Exception as e:
                return INFO, _failed_recovery(e)
        base.once(ctx, base.FINAL_PROCESS + i, "read", str(ledger), None, perform)

    def share(k: int) -> None:
        for i, ledger in enumerate(ledgers):
            if i % FINAL_THREADS == k:
                read_one(i, ledger)
    return base.start_threads(ctx, [(f"read-{k}", lambda k=k: share(k))
                                    for k in range(min(FINAL_THREADS, len(ledgers)))])


def checkers(spec: TestSpec | None = None) -> dict[str, tuple[Callable[..., Any], dict[str, Any]]]:
    from checkers import select
    want: dict[str, dict[str, Any]] = {"fencing": {"final_process": base.FINAL_PROCESS},
                                       "perf": {"write_fs": ("add",)}}
    return select(want)
