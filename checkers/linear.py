"""The linearizability checker: Wing & Gong / Lowe search with a (linearized set, state) cache.

A pure function over a history of Jepsen-style operations (`invoke`, then `ok` / `fail` / `info`)
and a sequential model from `checkers.models`. It answers whether some total order of the
operations, consistent with real time, is a legal run of the model.

Preprocessing (Knossos's `history/preprocess`): failed operations are removed; an operation whose
completion is `info`, or that never completed, is indeterminate: it may take effect at any point
after its invocation, or never (its return time is +infinity and it need not be linearized); an `ok`
completion gives the operation's value (a read's value is only known there). Intervals are closed:
at equal timestamps calls sort before returns, so [10, 20] and [20, 30] are concurrent. When every
operation carries the same time (hand-made histories, Jepsen's text formats), list order is time.

P-compositionality (Horn & Kroening): operations are partitioned by key (`op.key`, or the key of a
jepsen.independent `[key value]` tuple) and each partition is checked on its own, in up to two
worker processes when the history is large; the first invalid partition decides; unknown if any
partition ran out of budget.

The search (per partition) is the Wing & Gong / Lowe depth-first search as Porcupine and Knossos's
`wgl` run it: the ok operations' call and return entries sit in a doubly linked list sorted by time;
the operations that may go next are the calls before the first return entry; linearizing one lifts
its two entries out of the list (O(1), undone on backtrack); a configuration (linearized set, model
state) already explored is not explored again. The linearized set is a Python int used as a
bitset, stored in the cache shifted past the first unlinearized operation (its low bits are all
set), so entries stay small. States are interned: the walk and the cache hold a small int per distinct
state, and each class of equal (f, value) ops keeps a table from state id to next state id, so a
model step is computed, and a big state (a long appended string) hashed, once per state and class,
and cache keys hash three ints.

Indeterminate operations are kept out of the list (they never force a backtrack):
- a crashed read has no effect and is dropped (Knossos's advice);
- crashed operations with equal (f, value) are interchangeable once called, so only the earliest
  unused one of each class is tried (a canonical choice that prunes symmetric branches);
- the cache stores, per (linearized ok set, state), the sets of crashed operations used (at most
  BUCKET of them), and skips a configuration that used a superset of one already explored: fewer
  used is never worse.

Two rules make the walk find a linearization of a correct history without backtracking far:
- a read that is legal now goes now, with no alternative (it changes nothing and every op still to
  go returns after it began, so any linearization can be rewritten to place it here);
- otherwise the moves are tried in this order: the op that must return first (b), then the moves
  after which b is legal (ok ops, then indeterminate ones, less flexible first: a cas before a
  write), then the other ok ops by return time (a long op stays free for later), then the other
  indeterminate ops.
For models whose state only grows between resets (`kv`: appends between puts; `set`: adds; the
model's `reaches(state, value)` and `resets`), the reads that may go next but are illegal now also
steer and prune: a move after which one such read can still be reached (its value extends the
state) is tried first; and a move to a state from which one of them cannot be reached is skipped
when that read returns before any reset still to go (an ok put not linearized, an indeterminate one
not used) is called: no put can then come between, so the read's value must extend the state. This
is what keeps key-value histories with many concurrent appends (Porcupine's kv tests) from trying
every order of appends that no read ever sees.
When the walk stalls (STALL_STEPS steps with no deeper configuration), it first tries to refute a
window that ends at b: the ok ops wholly inside the window must be linearized, starting from an
unknown state, with every other op that overlaps the window optional and each indeterminate op
usable any number of times. In any linearization of the whole history, the stretch from the
window's first mandatory op to its last is a linearization of that relaxation (every op in it
overlaps the window), so none there means none at all: a local violation is proved without
searching all the history before it (models without an unknown state, the queue, skip this). Then it rewinds:
it abandons its last REWIND_OPS ops (doubling each time) and goes on from an earlier choice, the
abandoned move moved to the end of its node's list and its configurations dropped from the cache, so
the search stays exhaustive; after MAX_REWINDS it runs to the end.

Budgets: `time_limit_s`, `max_cache` (cache entries) and `max_memory_mb` (an estimate of the cache's
memory) end the search with valid "unknown" and the reason; never a hang. An invalid result carries,
per failing key, the longest linearizable prefix found (ops in linearization order, each with the
model state after it), the state after it, the op that cannot be placed next and every candidate that
was illegal there, plus the ops that overlap that stretch (for the report's diagram).
"""
from __future__ import annotations

import bisect
import concurrent.futures as cf
import multiprocessing
import time
from typing import Any

from checkers import models as M
from checkers.models import ILLEGAL, ModelError
from core.history import FAIL, INFO, INVOKE, NEMESIS_PROCESS, OK, CheckResult, Op

DEFAULTS: dict[str, Any] = {
    "model": "cas-register",
    "time_limit_s": None,        # seconds for the whole check; None: no limit
    "max_cache": 2_000_000,      # configurations cached per partition before giving up (unknown)
    "max_memory_mb": 1024,       # ... or this much memory held by one partition's cache (an estimate)
    "max_anomalies": 10,         # counterexamples kept (one per invalid key)
    "max_prefix": 40,            # linearized ops shown per counterexample (the last ones)
    "independent": None,         # values are jepsen.independent [key value] tuples; None: detect
    "parallel": True,            # check partitions in worker processes when it pays
    "parallel_min_ops": 4000,    # ... that is, with at least this many ops over several partitions
    "workers": 2,
    "initial": None,             # the model's initial state as a JSON value (Model.initial); None: its own
    "refute": True,              # try to refute a window when the search stalls
    "stall_steps": None,         # steps without progress that count as a stall (None: STALL_STEPS)
    "rewind_ops": None,          # ops abandoned at the first stall (None: REWIND_OPS)
}

ANOMALY = "nonlinearizable"

STALL_STEPS = 20_000     # search steps without a deeper configuration before the walk counts as stuck
REWIND_OPS = 64          # ops of the walk abandoned at the first stall (doubling at each next one)
REFUTE_SHARE = 0.5       # refutation windows may cost this share of the search so far (time, cache)
REFUTE_MIN_S = 0.05      # ... but at least this many seconds
MAX_REWINDS = 8          # after that many, the walk runs to the end (the search stays exhaustive)
MAX_GUARDS = 4           # ... and at most this many of those reads
GUARD_ENTRIES = 32       # list entries looked at for reads that bound a growing model's next states
BUCKET = 16              # crashed-op sets kept per (linearized set, state) in the cache
MEMO_BYTES = 100         # a transition table entry (two ints in a dict), plus its share of the states
ENTRY_BYTES = 300        # a cache entry's memory besides its linearized set (key tuple, dict slot, state)

_NEMESIS = {NEMESIS_PROCESS, "nemesis", ":nemesis"}


class LinearInputError(ValueError):
    """The history or the options cannot be checked (unknown model or f, malformed value)."""


def check(history: list[Op], opts: dict[str, Any] | None = None) -> CheckResult:
    """Check `history` against opts["model"]; see the module docstring."""
    o = dict(DEFAULTS)
    o.update(opts or {})
    t0 = time.monotonic()
    try:
        model = M.get(str(o["model"]))
        if o.get("initial") is not None:
            model.initial(o["initial"])               # a bad initial state is an input error
        prep = prepare(history, model, o)
    except (ModelError, LinearInputError) as e:
        return CheckResult("unknown", {}, {"error": str(e), "input_error": True,
                                           "model": str(o.get("model"))})
    limit = o.get("time_limit_s")
    deadline = None if limit is None else time.time() + float(limit)
    parts = prep["partitions"]
    jobs = [(key, model.name, p["real"], p["crashed"]) for key, p in parts.items()]
    results: dict[Any, dict[str, Any]] = {}
    n_ops = sum(len(p["real"]) + len(p["crashed"]) for p in parts.values())
    workers = max(1, int(o.get("workers") or 1))
    parallel = (bool(o.get("parallel")) and workers > 1 and len(jobs) > 1
                and n_ops >= int(o.get("parallel_min_ops") or 0))
    sopts = {"deadline": deadline, "max_cache": o.get("max_cache"), "refute": bool(o.get("refute", True)),
             "max_memory_mb": o.get("max_memory_mb"),
             "stall_steps": o.get("stall_steps"), "rewind_ops": o.get("rewind_ops"), "initial": o.get("initial")}
    if parallel:
        results = _run_parallel(jobs, sopts, workers)
    else:
        # smallest first: a violation in a small key is found before a big key's search starts
        for key, name, real, crashed in sorted(jobs, key=lambda j: len(j[2]) + len(j[3])):
            r = check_partition(name, real, crashed, sopts)
            results[key] = r
            if r["valid"] is False:
                break
    return _result(history, prep, model, o, results, time.monotonic() - t0, parallel)


# ------------------------------------------------------------------------------------------ preprocessing

def _is_pair(v: Any) -> bool:
    return isinstance(v, (list, tuple)) and len(v) == 2


def prepare(history: list[Op], model: M.Model, o: dict[str, Any]) -> dict[str, Any]:
    """Pair invocations with completions and partition by key. Raises ModelError / LinearInputError."""
    client = [(pos, op) for pos, op in enumerate(history)
              if op.process not in _NEMESIS and not (isinstance(op.process, int) and op.process < 0)]
    independent = o.get("independent")
    if independent is None:
        independent = _looks_independent(client, model)
    use_times = len({op.time_ns for _, op in client}) > 1

    def t(pos: int) -> int:
        return history[pos].time_ns if use_times else pos

    open_: dict[Any, int] = {}
    pairs: list[tuple[int, int | None]] = []
    orphans = reinvoked = 0
    for pos, op in client:
        if op.type == INVOKE:
            if op.process in open_:
                reinvoked += 1                      # a process is single-threaded: the old one crashed
                pairs.append((open_[op.process], None))
            open_[op.process] = pos
        elif op.type in (OK, FAIL, INFO):
            ipos = open_.pop(op.process, None)
            if ipos is None:
                orphans += 1
                continue
            pairs.append((ipos, pos))
        else:
            raise LinearInputError(f"op {_where(history, pos)}: type {op.type!r} is not one of "
                                   f"invoke, ok, fail, info")
    pairs.extend((ipos, None) for ipos in open_.values())
    pairs.sort()

    parts: dict[Any, dict[str, list]] = {}
    counts = {"ok": 0, "fail": 0, "info": 0, "unfinished": 0, "crashed_reads_dropped": 0}
    for ipos, cpos in pairs:
        inv = history[ipos]
        comp = history[cpos] if cpos is not None else None
        ctype = comp.type if comp is not None else None
        if ctype == FAIL:
            counts["fail"] += 1
            continue
        counts["ok" if ctype == OK else "info" if ctype == INFO else "unfinished"] += 1
        try:
            f = model.canonical_f(str(inv.f).lstrip(":"))
        except ModelError as e:
            raise ModelError(f"op {_where(history, ipos)}: {e}") from None
        iv = inv.value
        cv = comp.value if comp is not None else None
        key: Any = inv.key if _has_key(inv) else comp.key if comp is not None and _has_key(comp) else ""
        if independent:
            if not _is_pair(iv) and not _is_pair(cv):
                raise LinearInputError(f"op {_where(history, ipos)}: value {iv!r} is not a "
                                       f"jepsen.independent [key value] tuple")
            key = (iv if _is_pair(iv) else cv)[0]
            iv = iv[1] if _is_pair(iv) else None
            cv = cv[1] if _is_pair(cv) else None
        if ctype == OK:
            value = cv if cv is not None else iv
        else:
            value = iv if iv is not None else cv
        try:
            value = model.norm(f, value)
        except ModelError as e:
            raise ModelError(f"op {_where(history, ipos)}: {e}") from None
        p = parts.setdefault(M.freeze(key), {"real": [], "crashed": []})
        if ctype == OK:
            p["real"].append((t(ipos), t(cpos), f, value, ipos, cpos))
        elif model.is_pure(f, value):
            counts["crashed_reads_dropped"] += 1
        else:
            p["crashed"].append((t(ipos), f, value, ipos, -1 if cpos is None else cpos))
    for p in parts.values():
        p["real"].sort(key=lambda r: (r[0], r[1], r[4]))       # by call time (values need not compare)
        p["crashed"].sort(key=lambda c: (c[0], c[3]))
    return {"partitions": parts, "counts": counts, "orphans": orphans, "reinvoked": reinvoked,
            "independent": bool(independent), "use_times": use_times, "t": t}


def _has_key(op: Op) -> bool:
    """Whether the op names its key (a `:key` field, our `key`); 0 and False are keys too."""
    return op.key is not None and op.key != ""


def _looks_independent(client: list[tuple[int, Op]], model: M.Model) -> bool:
    """jepsen.independent histories carry [key value] in every op (reads too) and no op.key."""
    if not client:
        return False
    for _, op in client:
        if _has_key(op) or not _is_pair(op.value):
            return False
        if model.name == "multi-register" and M.is_txn(op.value):
            return False                            # a txn of two micro-ops, not [key txn]
        if model.name == "cas-register" and str(op.f).lstrip(":") == "cas" and op.value[1] is not None \
                and not _is_pair(op.value[1]):
            return False
    return True


def _where(history: list[Op], pos: int) -> str:
    op = history[pos]
    idx = op.index if op.index is not None and op.index >= 0 else pos
    return f"#{idx} (process {op.process}, {op.type} {op.f})"


# ------------------------------------------------------------------------------------------ the search

def check_partition(model_name: str, real: list[tuple], crashed: list[tuple], sopts: dict[str, Any]
                    ) -> dict[str, Any]:
    """Check one partition. real: (call_t, ret_t, f, value, inv_pos, comp_pos) sorted; crashed:
    (call_t, f, value, inv_pos, comp_pos). The answer is JSON-able apart from positions."""
    model = M.get(model_name)
    t0 = time.monotonic()
    deadline = sopts.get("deadline")
    max_cache = sopts.get("max_cache")
    refute = sopts.get("refute", True) and model.unknown() is not None
    init = model.init() if sopts.get("initial") is None else model.initial(sopts["initial"])
    s = _Search(model, real, crashed, init, deadline, max_cache,
                max_memory_mb=sopts.get("max_memory_mb"))
    refutations = rewinds = 0
    tried: set[int] = set()
    stall_steps = int(sopts.get("stall_steps") or STALL_STEPS)
    rewind_ops = int(sopts.get("rewind_ops") or REWIND_OPS)
    while True:
        stall = stall_steps * (2 ** rewinds) if rewinds < MAX_REWINDS else None
        out = s.run(stall_after=stall)
        if out != "stalled":
            break
        # Stuck: no deeper configuration for a while. First try to prove a violation near the
        # operation that blocks the walk; if there is none, abandon the last stretch of the walk
        # (it is retried last) and go on from an earlier choice.
        blocker = s.blocker()
        if refute and blocker is not None and blocker not in tried:
            tried.add(blocker)
            refutations += 1
            # the windows may take up to REFUTE_SHARE of what the search has cost so far (steps,
            # and time): a refutation that fails must not cost more than the search it would spare
            w = _refute(model, real, crashed, blocker, deadline,
                        max(REFUTE_MIN_S, (time.monotonic() - t0) * REFUTE_SHARE), int(s.steps * REFUTE_SHARE))
            if w is not None:
                s.refuted = w
                out = False
                break
        s.rewind(rewind_ops * (2 ** rewinds))
        rewinds += 1
    r: dict[str, Any] = {"valid": out if out in (True, False) else "unknown", "ops": len(real),
                         "crashed": len(crashed), "cache": s.cache_size, "steps": s.steps,
                         "seconds": round(time.monotonic() - t0, 4), "refutations": refutations,
                         "rewinds": rewinds}
    if out not in (True, False):
        r["reason"] = out
    if out is not True:
        r["counterexample"] = s.counterexample(model)
        if s.refuted is not None:
            r["counterexample"]["refuted_window"] = s.refuted
    return r


class _Search:
    """One WGL depth-first search over a partition; `run()` can be resumed after a stall."""

    def __init__(self, model: M.Model, real: list[tuple], crashed: list[tuple], init: Any,
                 deadline: float | None, max_cache: int | None, reuse: bool = False,
                 max_memory_mb: float | None = None):
        self.model = model
        self.real = real
        self.reuse = reuse          # a relaxation: an indeterminate op may take effect any number of times
        if any(real[i][0] > real[i + 1][0] for i in range(len(real) - 1)):
            raise ValueError("ok ops must be sorted by call time")   # the cache key relies on it
        self.crashed = crashed
        n = len(real)
        self.n = n
        self.rstep = [model.step(r[2]) for r in real]
        self.rval = [r[3] for r in real]
        # States are interned: the walk and the cache hold small ints (an id per distinct state), and
        # each class of equal (f, value) ops keeps a table state id -> next state id (-1: illegal),
        # so a step is computed, and a big state (a long appended value) hashed, once per state.
        self.sv: list[Any] = [init]                 # id -> state
        self.sids: dict[Any, int] = {init: 0}       # state -> id
        self.nmemo = 0                              # entries in the transition tables
        tables: dict[Any, dict[int, int]] = {}
        self.rt = [tables.setdefault((0, r[2], r[3]), {}) for r in real]
        self.rpure = [model.is_pure(r[2], r[3]) for r in real]     # reads: they change nothing
        # entries: (time, 0 call / 1 return, op); calls sort before returns at equal times
        ev = sorted([(r[0], 0, i) for i, r in enumerate(real)] + [(r[1], 1, i) for i, r in enumerate(real)])
        m = len(ev)
        self.head, self.tail = m, m + 1
        self.eop = [e[2] for e in ev] + [-1, -1]
        self.eret = [e[1] for e in ev] + [1, 1]
        self.etime = [e[0] for e in ev] + [0, 0]
        self.nxt = list(range(1, m + 1)) + [0 if m else m + 1, m + 1]
        self.prv = [m] + list(range(0, m - 1)) + [m, m - 1 if m else m]
        if m:
            self.nxt[m - 1] = m + 1
        callpos = [0] * n
        retpos = [0] * n
        for p, e in enumerate(ev):
            (retpos if e[1] else callpos)[e[2]] = p
        self.match = [0] * (m + 2)
        for i in range(n):
            self.match[callpos[i]] = retpos[i]
        # crashed (optional) ops grouped in classes of equal (f, value, known); ids sorted by call time
        classes: dict[Any, list[int]] = {}
        self.ccall: list[Any] = []
        for c, op in enumerate(crashed):
            self.ccall.append(op[0])
            classes.setdefault((op[1], op[2], len(op) > 5 and op[5]), []).append(c)
        order = sorted(classes.items(), key=lambda kv: crashed[kv[1][0]][0])
        self.cls_ops = [ids for _, ids in order]
        self.cls_first = [crashed[ids[0]][0] for ids in self.cls_ops]
        self.cstep = []
        self.cval = []
        self.cprio = []
        self.ct = []
        for (f, v, known), _ in order:
            self.cstep.append(model.step(f) if known else model.crash_step(f))
            self.cval.append(v)
            self.cprio.append(model.crash_priority(f))
            self.ct.append(tables.setdefault((1 if known else 2, f, v), {}))
        self.ccount = [0] * len(self.cls_ops)
        # models whose state only grows between resets (kv: appends between puts; set: adds)
        self.reaches = getattr(model, "reaches", None)
        resets = getattr(model, "resets", frozenset())
        self.rreset = [r[2] in resets for r in real]
        self.creset = [f in resets for (f, v, known), _ in order]
        self.resets_ok = [i for i in range(n) if self.rreset[i]]            # by call time
        self.resets_crashed = sorted((ccall_c, kk, pos) for kk, ids in enumerate(self.cls_ops) if self.creset[kk]
                                     for pos, ccall_c in enumerate(crashed[c][0] for c in ids))
        self.deadline = deadline
        self.max_cache = max_cache
        self.cache: dict[Any, Any] = {}
        self.cache_size = 0
        self.cache_bits = 0                         # bits of the linearized sets held by the cache
        self.max_bytes = None if max_memory_mb is None else int(max_memory_mb * 2 ** 20)
        self.steps = 0
        # the walk's state
        self.state = 0
        self.init = init
        self.lin = 0
        self.cb = 0
        self.depth = 0
        self.stack: list[tuple] = []
        self.node: tuple = (None, 0)           # the current node's moves, the next one to try
        self.best_depth = -1
        self.best: tuple[list[tuple], Any] = ([], 0)
        self.refuted: dict[str, Any] | None = None
        self.done: Any = None

    def next_reset(self, lin: int) -> Any:
        """The earliest call time of a reset op (a put) still to go: an ok one not linearized or an
        indeterminate one not used (it may take effect any time after its call); inf if none."""
        t = float("inf")
        ro = self.resets_ok
        if ro:
            f0 = self.eop[self.nxt[self.head]]          # every op called before it is linearized
            k = bisect.bisect_left(ro, f0)
            while k < len(ro) and lin >> ro[k] & 1:
                k += 1
            if k < len(ro):
                t = self.real[ro[k]][0]
        ccount, reuse = self.ccount, self.reuse
        for call, kk, pos in self.resets_crashed:
            if reuse or pos >= ccount[kk]:
                if call < t:
                    t = call
                break
        return t

    def trans(self, step: Any, value: Any, table: dict[int, int], sid: int) -> int:
        """The id of the state after an op (step, value) from state id `sid` (-1: illegal), computed
        and remembered in the op class's table."""
        ns = step(self.sv[sid], value)
        if ns is ILLEGAL:
            out = -1
        else:
            out = self.sids.get(ns)
            if out is None:
                out = len(self.sv)
                self.sids[ns] = out
                self.sv.append(ns)
        table[sid] = out
        self.nmemo += 1
        return out

    def run(self, stall_after: int | None = None) -> Any:
        """True (linearizable), False (not), "stalled", or an unknown reason ("time limit", ...)."""
        if self.done is not None:
            return self.done
        if self.n == 0:
            self.done = True
            return True
        nxt, prv, eop, eret, etime, match = self.nxt, self.prv, self.eop, self.eret, self.etime, self.match
        rstep, rval, rpure, rt = self.rstep, self.rval, self.rpure, self.rt
        cls_ops, cls_first, ccall, cstep, cval, ccount = (self.cls_ops, self.cls_first, self.ccall,
                                                          self.cstep, self.cval, self.ccount)
        ct, trans, sv = self.ct, self.trans, self.sv
        ncls = len(cls_ops)
        cprio = self.cprio
        reaches, rreset, creset = self.reaches, self.rreset, self.creset
        reuse = self.reuse
        cache = self.cache
        head, tail = self.head, self.tail
        stack = self.stack
        push, pop = stack.append, stack.pop
        state, lin, cb, depth = self.state, self.lin, self.cb, self.depth
        kids, j = self.node
        best_depth = self.best_depth
        deadline, max_cache, max_bytes = self.deadline, self.max_cache, self.max_bytes
        size, bits = self.cache_size, self.cache_bits
        steps = self.steps
        last_best = steps
        result: Any = None
        if best_depth < 0:
            best_depth = 0
            self.best = ([], state)
        mask = 1023                              # budgets are looked at every mask + 1 steps
        while stall_after is not None and mask > stall_after:
            mask >>= 1
        while True:
            steps += 1
            if not steps & mask:
                if deadline is not None and time.time() > deadline:
                    result = "time limit"
                    break
                if max_cache is not None and size > max_cache:
                    result = "cache limit"
                    break
                if max_bytes is not None and (size * ENTRY_BYTES + bits // 8 + self.nmemo * MEMO_BYTES
                                              > max_bytes):
                    result = "memory limit"
                    break
                if stall_after is not None and steps - last_best > stall_after:
                    result = "stalled"
                    break
            if kids is None:
                # A new node. The ok ops that may go next are the calls before the first return entry,
                # whose op b must be linearized before anything that starts later; an indeterminate
                # op (the earliest unused one of its class) may go whenever it has been called.
                # Order: b itself, then the moves after which b is legal, then the other ok ops by
                # return time (long ops stay free for later), then the other indeterminate ones;
                # for growing models, moves towards a waiting read first (see the module docstring).
                e = nxt[head]
                real_kids = []
                read = None
                targets = []
                while eret[e] == 0:
                    i = eop[e]
                    ns = rt[i].get(state)
                    if ns is None:
                        ns = trans(rstep[i], rval[i], rt[i], state)
                    if ns >= 0:
                        if rpure[i] and ns == state and (read is None or match[e] < match[read[1]]):
                            read = (0, e, i, ns)
                        real_kids.append((match[e], e, i, ns))
                    elif rpure[i] and reaches is not None:
                        targets.append(i)
                    e = nxt[e]
                if read is not None:
                    # A read that is legal now goes now, with no alternative: it changes nothing,
                    # and every op still to go returns after it began, so moving it here from
                    # later in any linearization keeps that linearization legal.
                    kids = [read]
                    j = 0
                    continue
                b = eop[e]
                tret = etime[e]
                bstep, bval, bt = rstep[b], rval[b], rt[b]
                kids = []
                later = []
                guards = None
                if reaches is not None and (len(real_kids) > 1 or ncls):
                    # Models that only grow between resets (kv, set): a read still to go that returns
                    # before any reset (put) still to go can be called is linearized at a state grown
                    # from the next one, so a move to a state that cannot grow into its value is a
                    # dead end (skipped). The reads looked at: the next GUARD_ENTRIES entries' returns.
                    t_reset = self.next_reset(lin)
                    guards = []
                    x = e
                    for _ in range(GUARD_ENTRIES):
                        if x == tail or etime[x] >= t_reset:
                            break
                        if eret[x]:
                            g = eop[x]
                            if rpure[g] and rval[g] is not None:
                                guards.append(rval[g])
                                if len(guards) >= MAX_GUARDS:
                                    break
                        x = nxt[x]
                if real_kids:
                    if len(real_kids) > 1:
                        real_kids.sort()
                    bnow = bt.get(state)
                    if bnow is None:
                        bnow = trans(bstep, bval, bt, state)
                    if targets or guards:
                        ranked = []
                        tvals = [rval[g] for g in targets] + (guards or [])
                        for rk in real_kids:
                            st = sv[rk[3]]
                            if guards and not rreset[rk[2]]:
                                dead = False
                                for v in guards:
                                    if not reaches(st, v):
                                        dead = True
                                        break
                                if dead:
                                    continue
                            h = rk[2] == b
                            if not h and bnow < 0:
                                x = bt.get(rk[3])
                                if x is None:
                                    x = trans(bstep, bval, bt, rk[3])
                                h = x >= 0
                            t = False
                            for v in tvals:
                                if reaches(st, v):
                                    t = True
                                    break
                            r = (0 if h else 1) if t else (2 if h else 3)
                            ranked.append((r, rk))
                        if len(ranked) > 1:
                            ranked.sort(key=lambda x: x[0])
                        for r, rk in ranked:
                            (kids if r < 3 else later).append((0, rk[1], rk[2], rk[3]))
                    else:
                        for rk in real_kids:
                            h = rk[2] == b
                            if not h:
                                x = bt.get(rk[3])
                                if x is None:
                                    x = trans(bstep, bval, bt, rk[3])
                                h = x >= 0
                            if h:
                                kids.append((0, rk[1], rk[2], rk[3]))
                            else:
                                later.append((0, rk[1], rk[2], rk[3]))
                helpers = []
                for kk in range(ncls):
                    if cls_first[kk] > tret:
                        break
                    ids = cls_ops[kk]
                    jj = ccount[kk]
                    if jj < len(ids):
                        c = ids[jj]
                        if ccall[c] <= tret:
                            tk = ct[kk]
                            ns = tk.get(state)
                            if ns is None:
                                ns = trans(cstep[kk], cval[kk], tk, state)
                            if ns >= 0 and guards and not creset[kk]:
                                st = sv[ns]
                                for v in guards:
                                    if not reaches(st, v):
                                        ns = -1
                                        break
                            if ns >= 0:
                                x = bt.get(ns)
                                if x is None:
                                    x = trans(bstep, bval, bt, ns)
                                if x >= 0:
                                    helpers.append((cprio[kk], ccall[c], kk, c, ns))
                                else:
                                    later.append((1, kk, c, ns))
                if helpers:
                    if len(helpers) > 1:
                        helpers.sort()
                    kids += [(1, h[2], h[3], h[4]) for h in helpers]
                kids += later
                j = 0
            moved = False
            nk = len(kids)
            while j < nk:
                kind, x, i, ns = kids[j]
                if kind == 0:
                    # lift x (a call entry) and its return entry out of the list
                    r = match[x]
                    p, q = prv[x], nxt[x]
                    nxt[p] = q
                    prv[q] = p
                    p, q = prv[r], nxt[r]
                    nxt[p] = q
                    prv[q] = p
                    first = nxt[head]
                    nl = lin | (1 << i)
                    if first == tail:
                        push((0, x, state, kids, j, i))
                        state, lin, depth = ns, nl, depth + 1
                        result = True
                        break
                    ncb = cb
                else:
                    nl = lin
                    ncb = cb if reuse else cb | (1 << i)
                    first = nxt[head]
                f0 = eop[first]
                rel = nl >> f0
                key = (f0, rel, ns)
                ent = cache.get(key)
                fresh = True
                if ent is None:
                    cache[key] = ncb
                    size += 1
                    bits += rel.bit_length()
                elif type(ent) is int:
                    if ent & ~ncb == 0:
                        fresh = False
                    elif ncb & ~ent == 0:
                        cache[key] = ncb
                    else:
                        cache[key] = [ent, ncb]
                        size += 1
                else:
                    d = _add_entry(ent, ncb)
                    fresh = d is not None
                    if fresh:
                        size += d
                if fresh:
                    push((kind, x, state, kids, j, i))
                    state, lin, cb = ns, nl, ncb
                    if kind == 0:
                        depth += 1
                        if depth > best_depth:
                            best_depth = depth
                            last_best = steps
                            self.best = (stack[:], state)
                    elif not reuse:
                        ccount[x] += 1
                    kids = None
                    moved = True
                    break
                if kind == 0:
                    # seen: put the entries back
                    p, q = prv[r], nxt[r]
                    nxt[p] = r
                    prv[q] = r
                    p, q = prv[x], nxt[x]
                    nxt[p] = x
                    prv[q] = x
                j += 1
            if result is True:
                break
            if moved:
                continue
            # nothing can go next: backtrack
            if not stack:
                result = False
                break
            kind, x, state, kids, j, i = pop()
            if kind == 0:
                r = match[x]
                p, q = prv[r], nxt[r]
                nxt[p] = r
                prv[q] = r
                p, q = prv[x], nxt[x]
                nxt[p] = x
                prv[q] = x
                lin &= ~(1 << i)
                depth -= 1
            elif not reuse:
                ccount[x] -= 1
                cb &= ~(1 << i)
            j += 1
        self.state, self.lin, self.cb, self.depth = state, lin, cb, depth
        self.node = (kids, j)
        self.best_depth = best_depth
        self.cache_size, self.cache_bits = size, bits
        self.steps = steps
        if result is True:
            self.best = (stack[:], state)
        if result != "stalled":
            self.done = result
            self.cache = {}
        return result

    def blocker(self) -> int | None:
        """The ok op that must be linearized next after the best configuration (earliest return)."""
        frames, _ = self.best
        done = {fr[5] for fr in frames if fr[0] == 0}
        rest = [i for i in range(self.n) if i not in done]
        if not rest:
            return None
        return min(rest, key=lambda i: (self.real[i][1], self.real[i][0], i))

    def rewind(self, ops: int) -> None:
        """Abandon the walk's last `ops` ok ops: pop back to an earlier node, whose move into the
        abandoned stretch is moved to the end of its list (so it is still tried: the search stays
        exhaustive), and forget the abandoned configurations. A configuration explored below them
        and pruned by one of them has the same linearized set as one of them (only indeterminate
        ops lie between), so dropping every cache entry with those linearized sets keeps every
        remaining entry a proven failure."""
        stack = self.stack
        if not stack:
            return
        nxt, prv, eop, match, head = self.nxt, self.prv, self.eop, self.match, self.head
        target = max(0, self.depth - ops)
        state, lin, cb, depth = self.state, self.lin, self.cb, self.depth
        purge = set()
        while stack:
            f0 = eop[nxt[head]]
            purge.add((f0, lin >> f0))
            kind, x, state, kids, j, i = stack.pop()
            if kind == 0:
                r = match[x]
                p, q = prv[r], nxt[r]
                nxt[p] = r
                prv[q] = r
                p, q = prv[x], nxt[x]
                nxt[p] = x
                prv[q] = x
                lin &= ~(1 << i)
                depth -= 1
                if depth <= target:
                    break
            else:
                self.ccount[x] -= 1
                cb &= ~(1 << i)
        self.state, self.lin, self.cb, self.depth = state, lin, cb, depth
        self.node = (kids[:j] + kids[j + 1:] + [kids[j]], j)
        cache = self.cache
        for key in [k for k in cache if k[:2] in purge]:
            ent = cache.pop(key)
            self.cache_size -= len(ent) if type(ent) is list else 1

    # ---------------------------------------------------------------------------------- evidence

    def linearized(self) -> list[tuple[str, int, Any]]:
        """The best configuration's linearization: (kind "ok"/"crashed", op id, state after)."""
        frames, last = self.best
        out = []
        for n, fr in enumerate(frames):
            after = frames[n + 1][2] if n + 1 < len(frames) else last
            out.append(("ok" if fr[0] == 0 else "crashed", fr[5], self.sv[after]))
        return out

    def counterexample(self, model: M.Model) -> dict[str, Any]:
        lin = self.linearized()
        state = self.sv[self.best[1]]
        done = {i for kind, i, _ in lin if kind == "ok"}
        rest = [i for i in range(self.n) if i not in done]
        out: dict[str, Any] = {"prefix": [(kind, i, model.describe(s)) for kind, i, s in lin],
                               "initial_state": model.describe(self.init),
                               "state": model.describe(state), "op": None, "cannot_place": []}
        if not rest:
            return out
        # The op that must return first cannot go here (else a deeper configuration would have been
        # reached: it is the first move tried); nor can the other ops listed, called before it returns.
        blocker = min(rest, key=lambda i: (self.real[i][1], self.real[i][0], i))
        tb = self.real[blocker][1]
        culprit = self.culprit(state, done, blocker)
        out["op"] = blocker if culprit is None else culprit
        for i in sorted(rest, key=lambda i: (i != out["op"], i != blocker, self.real[i][1])):
            if i == culprit or (self.real[i][0] <= tb and self.rstep[i](state, self.rval[i]) is ILLEGAL):
                out["cannot_place"].append(i)
        return out

    def culprit(self, state: Any, done: set[int], b: int) -> int | None:
        """For a growing model, when the op b that must go next is legal there but was skipped as a
        dead end, the read still to go that rules it out, the one to name: it is illegal here or
        called after b returns, and no state grown from after b reaches its value before a reset
        can come. None otherwise."""
        reaches = self.reaches
        if reaches is None or self.rreset[b]:
            return None
        nb = self.rstep[b](state, self.rval[b])
        if nb is ILLEGAL:
            return None
        t_reset = self.next_reset(sum(1 << i for i in done))
        cands = [i for i in range(self.n) if i not in done and self.rpure[i] and self.rval[i] is not None
                 and self.real[i][1] < t_reset and not reaches(nb, self.rval[i])]
        return min(cands, key=lambda i: (self.real[i][1], i)) if cands else None


def _add_entry(ents: list[int], cb: int) -> int | None:
    """Add crashed-op set cb to a cache bucket unless a subset of it is there (then None); drop the
    supersets of cb; return the change in the bucket's size. A full bucket forgets its oldest set:
    the search may then explore a dominated configuration again, which costs time but never
    changes the answer."""
    for x in ents:
        if x & ~cb == 0:
            return None
    n = len(ents)
    ents[:] = [x for x in ents if cb & ~x != 0]
    if len(ents) >= BUCKET:
        del ents[0]
    ents.append(cb)
    return len(ents) - n


# ------------------------------------------------------------------------------------------ refutation

def _refute(model: M.Model, real: list[tuple], crashed: list[tuple], blocker: int,
            deadline: float | None, seconds: float = 10.0, steps: int = 10 ** 9) -> dict[str, Any] | None:
    """Try windows that end where the search is stuck; the first one with no linearization (from an
    unknown state, everything overlapping it optional) proves the whole partition invalid. All the
    windows together stop after `seconds` (and each after `steps` cache entries)."""
    end = time.time() + seconds
    deadline = end if deadline is None else min(deadline, end)
    for width in (8, 32, 128):
        w = _window(model, real, crashed, blocker, width, deadline, steps)
        if w is not None and w.get("refuted"):
            return w
        if w is None or (deadline is not None and time.time() > deadline):
            return None
    return None


def _window(model: M.Model, real: list[tuple], crashed: list[tuple], blocker: int, width: int,
            deadline: float | None, steps: int = 10 ** 9) -> dict[str, Any] | None:
    """Search the window of the `width` ok ops (by return) that end with `blocker`: those wholly
    inside it are mandatory, every other op overlapping it optional, the start state unknown.
    {"refuted": True, ...} if it has no linearization; None if the window is the whole history."""
    end = real[blocker][1]
    upto = sorted((i for i in range(len(real)) if real[i][1] <= end), key=lambda i: (real[i][1], i))
    if width > 2 * len(upto) and width > 8:
        return None
    t_start = real[upto[max(0, len(upto) - width)]][0]
    mand = [i for i in upto if real[i][0] >= t_start]
    if blocker not in mand:
        return {"refuted": False}
    lo = min(real[i][0] for i in mand)
    hi = max(real[i][1] for i in mand)
    mset = set(mand)
    wreal = sorted((real[i] for i in mand), key=lambda r: (r[0], r[1], r[4]))   # by call, as _Search needs
    opt: list[tuple] = []
    for i, r in enumerate(real):
        if i not in mset and r[0] <= hi and r[1] >= lo and not model.is_pure(r[2], r[3]):
            opt.append((r[0], r[2], r[3], r[4], r[5], True))       # optional, output known
    opt += [c for c in crashed if c[0] <= hi]
    budget = max(2000, min(steps, 20_000 * (1 + width // 32)))
    dl = time.time() + 0.3 + width / 200
    if deadline is not None:
        dl = min(dl, deadline)
    w = _Search(model, wreal, opt, model.unknown(), dl, budget, reuse=True)
    if w.run() is False:
        return {"refuted": True, "ops": len(mand), "optional": len(opt), "from_time": lo, "to_time": hi}
    return {"refuted": False}


# ------------------------------------------------------------------------------------------ parallel

def _run_parallel(jobs: list[tuple], sopts: dict[str, Any], workers: int) -> dict[Any, dict[str, Any]]:
    ctx = multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() else None
    results: dict[Any, dict[str, Any]] = {}
    # biggest first, so the two workers finish together
    jobs = sorted(jobs, key=lambda j: -(len(j[2]) + len(j[3])))
    ex = cf.ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=ctx)
    try:
        futs = {ex.submit(check_partition, name, real, crashed, sopts): key
                for key, name, real, crashed in jobs}
        for fut in cf.as_completed(futs):
            try:
                r = fut.result()
            except Exception as e:                   # a worker died (killed, out of memory)
                r = {"valid": "unknown", "reason": f"worker failed: {type(e).__name__}: {e}"}
            results[futs[fut]] = r
            if r["valid"] is False:
                for f in futs:
                    f.cancel()
                break
    finally:
        ex.shutdown(wait=True, cancel_futures=True)
    return results


# ------------------------------------------------------------------------------------------ the result

def _result(history: list[Op], prep: dict[str, Any], model: M.Model, o: dict[str, Any],
            results: dict[Any, dict[str, Any]], seconds: float, parallel: bool) -> CheckResult:
    parts = prep["partitions"]
    invalid = [k for k, r in results.items() if r["valid"] is False]
    unknown = [k for k, r in results.items() if r["valid"] == "unknown"]
    unchecked = [k for k in parts if k not in results]
    if invalid:
        valid: bool | str = False
    elif unknown or unchecked:
        valid = "unknown"
    else:
        valid = True
    cap = o.get("max_anomalies")
    evidence = []
    for k in sorted(invalid, key=repr):
        if cap is not None and len(evidence) >= cap:
            break
        evidence.append(_counterexample(history, prep, model, o, k, results[k]))
    anomalies = {ANOMALY: evidence} if evidence else {}
    stats: dict[str, Any] = {
        "model": model.name,
        "valid": valid,
        "ops": prep["counts"],
        "partitions": len(parts),
        "independent": prep["independent"],
        "time_order": "time_ns" if prep["use_times"] else "history order",
        "orphan_completions": prep["orphans"],
        "reinvoked_processes": prep["reinvoked"],
        "invalid_keys": [M.thaw(k) for k in sorted(invalid, key=repr)[:100]],
        "invalid_count": len(invalid),
        "unknown_keys": {str(M.thaw(k)): results[k].get("reason") for k in sorted(unknown, key=repr)[:100]},
        "unknown_count": len(unknown),
        "unchecked_partitions": len(unchecked),
        "parallel": parallel,
        "seconds": round(seconds, 3),
        "cache_entries": sum(r.get("cache", 0) for r in results.values()),
        "search_steps": sum(r.get("steps", 0) for r in results.values()),
        "refutations_tried": sum(r.get("refutations", 0) for r in results.values()),
        "rewinds": sum(r.get("rewinds", 0) for r in results.values()),
    }
    if unknown:
        reasons = sorted({str(results[k].get("reason")) for k in unknown})
        stats["reason"] = "; ".join(reasons)
    elif unchecked and not invalid:
        stats["reason"] = "not every partition was checked"
    if len(parts) <= 50:
        stats["per_key"] = {str(M.thaw(k)): {x: r.get(x) for x in ("valid", "ops", "crashed", "cache",
                                                                    "steps", "seconds", "reason")
                                              if r.get(x) is not None}
                            for k, r in sorted(results.items(), key=lambda kv: repr(kv[0]))}
    return CheckResult(valid=valid, anomalies=anomalies, stats=stats)


def op_json(history: list[Op], prep: dict[str, Any], ipos: int, cpos: int | None) -> dict[str, Any]:
    """One operation as its completion's Op.to_json() (the invocation's if it never completed), with
    the checker's call and return times (`invoke_time_ns`, `time_ns`; history positions when the
    history has no times) and the invocation's index."""
    t = prep["t"]
    inv = history[ipos]
    src = history[cpos] if cpos is not None and cpos >= 0 else inv
    d = M.thaw(_plain(_op_dict(src)))
    if src is inv:
        d["type"] = INFO if cpos is not None and cpos >= 0 else "invoke"
        d["time_ns"] = None
    else:
        d["time_ns"] = t(cpos)
    if d.get("value") is None and inv.value is not None:
        d["value"] = M.thaw(_plain(inv.value))
    d["invoke_index"] = inv.index if inv.index is not None and inv.index >= 0 else ipos
    d["invoke_time_ns"] = t(ipos)
    if d.get("index") is None or d["index"] < 0:
        d["index"] = cpos if cpos is not None and cpos >= 0 else ipos
    return d


def _op_dict(op: Op) -> dict[str, Any]:
    """Op.to_json() without dataclasses.asdict's deep copy (the caller copies what it keeps)."""
    mid = op.message_id
    return {"process": op.process, "type": op.type, "f": op.f, "key": op.key, "value": op.value,
            "message_id": None if mid is None else mid.__dict__.copy(), "node": op.node, "error": op.error,
            "time_ns": op.time_ns, "index": op.index}


def _plain(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, (set, frozenset)):
        return M.thaw(frozenset(M.freeze(x) for x in v))
    return v


def _counterexample(history: list[Op], prep: dict[str, Any], model: M.Model, o: dict[str, Any],
                    key: Any, r: dict[str, Any]) -> dict[str, Any]:
    part = prep["partitions"][key]
    real, crashed = part["real"], part["crashed"]
    ce = r["counterexample"]

    def ojk(kind: str, i: int) -> dict[str, Any]:
        if kind == "ok":
            return op_json(history, prep, real[i][4], real[i][5])
        c = crashed[i]
        return op_json(history, prep, c[3], c[4] if c[4] >= 0 else None)

    prefix = ce["prefix"]
    keep = max(0, int(o.get("max_prefix") or 0))
    shown = prefix[len(prefix) - keep:] if keep else []
    omitted = len(prefix) - len(shown)
    before_shown = prefix[omitted - 1][2] if omitted > 0 else ce["initial_state"]
    out: dict[str, Any] = {
        "key": M.thaw(key),
        "model": model.name,
        "time_order": "time_ns" if prep["use_times"] else "history order",
        "op": ojk("ok", ce["op"]) if ce["op"] is not None else None,
        "state": ce["state"],
        "prefix_length": len(prefix),
        "prefix_omitted": omitted,
        "state_before_prefix": before_shown,
        "prefix": [{"op": ojk(kind, i), "state": s, "indeterminate": kind == "crashed"}
                   for kind, i, s in shown],
        "cannot_place": [ojk("ok", i) for i in ce["cannot_place"][:20]],
    }
    if "refuted_window" in ce:
        out["refuted_window"] = dict(ce["refuted_window"])
    # every op that overlaps the shown stretch, for the diagram (bounded)
    if out["op"] is not None:
        t_lo = min([x["op"]["invoke_time_ns"] for x in out["prefix"]] + [out["op"]["invoke_time_ns"]])
        t_hi = out["op"]["time_ns"]
        seen = {(x["op"]["invoke_index"]) for x in out["prefix"]} | {out["op"]["invoke_index"]}
        seen |= {x["invoke_index"] for x in out["cannot_place"]}
        others = []
        for i, rr in enumerate(real):
            if rr[0] <= t_hi and rr[1] >= t_lo:
                d = ojk("ok", i)
                if d["invoke_index"] not in seen:
                    others.append(d)
        earlier = 0
        for i, c in enumerate(crashed):
            if c[0] <= t_hi:
                inv = history[c[3]]
                if (inv.index if inv.index is not None and inv.index >= 0 else c[3]) in seen:
                    continue
                if c[0] < t_lo:
                    earlier += 1            # called before the stretch: could go anywhere in it
                    continue
                others.append(ojk("crashed", i))
        others.sort(key=lambda d: d["invoke_time_ns"])
        out["concurrent"] = others[-60:]
        out["concurrent_omitted"] = max(0, len(others) - 60)
        out["indeterminate_called_before"] = earlier
        p = out["op"]
        out["message"] = (f"{p['f']} {_short(p.get('value'))} by process {p['process']} cannot be "
                          f"linearized after the {len(prefix)}-op linearizable prefix "
                          f"(the state is {_short(ce['state'])})")
        if "refuted_window" in out:
            w = out["refuted_window"]
            out["message"] += (f"; proved on a window of {w['ops']} ops around it, which has no "
                               f"linearization from any state")
    return out


def _short(v: Any) -> str:
    s = repr(v) if not isinstance(v, str) else v
    return s if len(s) <= 60 else s[:59] + "…"


__all__ = ["check", "prepare", "check_partition", "op_json", "DEFAULTS", "ANOMALY", "LinearInputError"]
