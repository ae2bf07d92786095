"""The Elle-style cycle checker: a dependency graph over a log history, its cycles classified as Elle does.

A pure function over a `log`-style history, built as Jepsen's Kafka workload builds it: every ok send
(and every info or unfinished send whose value turned up in the log) is a single-op transaction that
appends its value; every ok receive, drain and final read is a single-op transaction that reads the
values it returned. Values are unique per topic, so each read value has exactly one writer
(Elle's recoverability), and each topic partition's log order (its longest ok final read; without
one, every observed position in ledger/entry/batch order) is the version order (traceability).

Edges (Elle's names, between the ops' nodes):
- ww: the writer of v_i -> the writer of v_{i+1}, for consecutive values of a partition's log that
  have a writer.
- wr: the writer of v -> each op that read v.
- rw: a reader whose highest observed value of a partition is v_i -> the writer of the next value
  of that partition with a writer (it read a state without it). Only ops whose f is in
  opts["rw_from"] (default the final reads, f "read") give rw edges: a Reader reads the topic to its
  end, but a consumer reads from its subscription's cursor, which may lag the head of the log, so an
  rw edge from a receive states a staleness Pulsar never promised (set rw_from to ("read",
  "receive") for Jepsen's Kafka behaviour; consumer lag then shows up as G-single-realtime).
- process: consecutive nodes of one client process.
- realtime: a completed (ok) before b was invoked. Built in linear time as Elle's realtime graph is:
  a chain of time nodes, one per run of completions between invocations; each ok op points to the
  time node of its completion, each time node to the next, and each op is pointed to by the last
  time node before its invocation. A path through time nodes is exactly one realtime edge, so
  reachability between ops is that of the full (quadratic) realtime relation.

Search: Kahn's algorithm peels every node that is on no cycle (one pass over the edges); an
iterative Tarjan over integer adjacency lists finds the strongly connected components of what is
left. In each component, for each anomaly in order (G0, G1c, G-single, G2, then each with process
edges, then with realtime edges; only those whose required edge kind occurs in the component),
the projection's own components are found and a short cycle through an edge of the required kind
is searched by breadth-first search (0-1 BFS: hops into time nodes cost nothing): the shortest
through the first of up to `max_tries` such edges that close a cycle and 20 more, each later search
bounded by the best length so far. All searches share `search_budget` node visits; once it is spent
(Elle has a time limit per component instead), each remaining component gets one cycle found by a
plain BFS over all its edges, so a cyclic component is never reported clean. The cycle is
classified by the edges it takes (each step takes the strongest kind available between its two
ops: ww, wr, rw, process, then realtime):

- G0: ww edges only. G1c: ww and wr (at least one wr). G-single: exactly one rw. G2: two or more rw.
- with -process when the cycle needs a process edge, -realtime when it needs a realtime edge.

What cycles mean for a Pulsar topic: G0-realtime is a send acknowledged before another send was
invoked that sits after it in the log (the acknowledged order reversed: the topic is not a
linearizable log); G1c-realtime a message placed in the log before one that a consumer had already
received before the first was even sent (a write into the past); G-single-realtime / G2-realtime
(rw from Readers) a Reader that read to the end of the topic yet missed a message acknowledged
before it began (a stale read). The -process variants say the same within one client's order (G0-
process: a producer's sends reordered in the log, which the log checker also calls nonmonotonic-
send). With one op per transaction and one version order per partition, cycles without process or
realtime edges cannot arise within one partition; they are still searched, as Elle does. Across the
partitions of one topic two Readers can form a G2 (each saw one partition further than the other):
a partitioned topic promises no state across its partitions, so remove G2 from the invalid set
before reading partitioned topics mid-run.

wr edges into a reader are left out when nothing leads from it back to a writer (every op invoked
after it completed is a reader without rw edges, and it has no later op in its process): the final
reads, whose wr edges would be one per message of the topic, are on no cycle.

Evidence per cycle: its ops (op refs, values), the steps with their kinds and a reason each, and a
one-line explanation. Invalid by default: every type (a strict-serializable log); opts["model"]
selects a weaker model's forbidden set (MODELS), opts["invalid"] an explicit one.
"""
from __future__ import annotations

from collections import deque
from typing import Any

from checkers.toolkit import (Cases, OpRefs, anomalies_of, anomaly_stats, gc_paused, jsonable, mid_json, mid_tuple,
                              norm_value, op_names, partition_of, position_key, unpack_position, verdict)
from core.history import INFO, INVOKE, OK, CheckResult, Op

# edge kinds, as bits (Elle's BitRels: ww 1, wr 2, rw 4, process 0x40, realtime 0x80; here the
# realtime relation is three kinds of edges around the time nodes)
WW, WR, RW, PROC, RT_OUT, RT_CHAIN, RT_IN = 1, 2, 4, 8, 16, 32, 64
RT = RT_OUT | RT_CHAIN | RT_IN
KIND_BITS = 7                        # an adjacency entry is (target << KIND_BITS) | kind
KIND_MASK = (1 << KIND_BITS) - 1
_NAMES = {WW: "ww", WR: "wr", RW: "rw", PROC: "process", RT_IN: "realtime"}

BASE_TYPES = ("G0", "G1c", "G-single", "G2")
ANOMALY_TYPES = BASE_TYPES + tuple(t + "-process" for t in BASE_TYPES) + tuple(t + "-realtime" for t in BASE_TYPES)
MODELS: dict[str, tuple[str, ...]] = {
    "read-uncommitted": ("G0",),
    "read-committed": ("G0", "G1c"),
    "serializable": BASE_TYPES,
    "strong-session-serializable": BASE_TYPES + tuple(t + "-process" for t in BASE_TYPES),
    "strict-serializable": ANOMALY_TYPES,
}

# The searches, in order: (anomaly it targets, required edge kind, kinds allowed on the way back).
_SEARCHES = (
    ("G0", WW, WW),
    ("G1c", WR, WW | WR),
    ("G-single", RW, WW | WR),
    ("G2", RW, WW | WR | RW),
    ("G0-process", PROC, WW | PROC),
    ("G1c-process", PROC, WW | WR | PROC),
    ("G-single-process", RW, WW | WR | PROC),
    ("G2-process", PROC, WW | WR | RW | PROC),
    ("G0-realtime", RT_IN, WW | PROC | RT),
    ("G1c-realtime", RT_IN, WW | WR | PROC | RT),
    ("G-single-realtime", RW, WW | WR | PROC | RT),
    ("G2-realtime", RT_IN, WW | WR | RW | PROC | RT),
)

DEFAULTS: dict[str, Any] = {
    "send": ("send", "enqueue"),                  # f names of appends
    "receive": ("receive", "dequeue", "drain"),   # f names of consumer reads
    "read": ("read",),                            # f names of final reads (whole-topic Readers)
    "rw_from": ("read",),                         # f names whose ops give rw edges (see above)
    "process": True,                              # process edges
    "realtime": True,                             # realtime edges
    "model": None,                                # a key of MODELS: its forbidden set is invalid
    "invalid": None,                              # explicit invalid types (overrides model)
    "max_anomalies": 100,                         # cycles kept per type (counts stay exact)
    "search_budget": 5_000_000,                   # BFS node visits in all (then one cycle per component)
    "max_tries": 200,                             # required edges tried per projection component
}


def check(history: list[Op], opts: dict[str, Any] | None = None) -> CheckResult:
    """Check a log history for dependency cycles; see the module docstring."""
    o = dict(DEFAULTS)
    o.update(opts or {})
    if o.get("model") is not None and o["model"] not in MODELS:
        raise ValueError(f"unknown model {o['model']!r}; fix: use one of {', '.join(MODELS)}")
    with gc_paused():
        g = _Graph(history, o)
        g.build()
        r = g.result()
        del g                       # freed before the collector is back, which then has less to walk
    return r


class _Graph(OpRefs):
    ref_key = True                   # a cycle's ops span topics: each reference names its own

    def __init__(self, history: list[Op], opts: dict[str, Any]):
        self.h = history
        self.o = opts
        self.send_fs, self.recv_fs, self.read_fs = op_names(opts)
        self.rw_fs = frozenset(opts.get("rw_from") or ())
        # nodes: ops and time nodes. op[n] is the op (None for a time node)
        self.op: list[Op | None] = []
        self.inv_t: list[int] = []
        self.adj: list[list[int]] = []
        self.att_of: list[int] = []                           # the time node an op's invocation follows
        self.edges = {WW: 0, WR: 0, RW: 0, PROC: 0, RT_OUT: 0, RT_CHAIN: 0, RT_IN: 0}
        self.writer: dict[str, dict[Any, int]] = {}          # topic -> value -> node
        self.readers: list[int] = []                          # nodes of receives and reads
        self.final: dict[str, tuple[int, int]] = {}           # topic -> (messages, node) of its longest read
        self.seqs: dict[tuple[str, int], list[Any]] = {}     # (topic, partition) -> values in log order
        self.idx: dict[tuple[str, int], dict[Any, int]] = {}
        self.order_source: dict[str, str] = {}
        self.reused = 0
        self.budget = [0]

    # ---------------------------------------------------------------------------------- building

    def _node(self, op: Op, inv_t: int, att: int) -> int:
        n = len(self.op)
        self.op.append(op)
        self.inv_t.append(inv_t)
        self.att_of.append(att)
        self.adj.append([])
        return n

    def build(self) -> None:
        realtime = bool(self.o.get("realtime", True))
        process = bool(self.o.get("process", True))
        send_fs, recv_fs, read_fs = self.send_fs, self.recv_fs, self.read_fs
        nodes, inv_ts, adj = self.op, self.inv_t, self.adj
        writer, readers, final = self.writer, self.readers, self.final
        node_add, inv_add, adj_add = nodes.append, inv_ts.append, adj.append
        att_of = self.att_of
        att_add = att_of.append
        n_rt_in = n_rt_out = n_chain = n_proc = 0
        open_: dict[int, tuple[Op, int]] = {}
        last_of: dict[int, int] = {}
        cur_t = -1              # the time node of the latest completions
        t_used = True           # an invocation has attached to cur_t since it was made
        for op in self.h:
            p = op.process
            if p < 0:                       # the nemesis and observers are not clients
                continue
            typ = op.type
            if typ == INVOKE:
                if cur_t >= 0:
                    t_used = True
                open_[p] = (op, cur_t)
                continue
            inv, att = open_.pop(p, (None, -1))
            f = op.f
            if inv is not None and inv.f != f:
                inv, att = None, -1
            if f in send_fs:
                if typ != OK and typ != INFO:
                    continue
                n = len(nodes)
                node_add(op)
                inv_add(inv.time_ns if inv is not None else op.time_ns)
                att_add(att)
                lst = []
                adj_add(lst)
                v = inv.value if inv is not None else op.value
                if type(v) is not int:
                    v = norm_value(v)
                w = writer.get(op.key)
                if w is None:
                    w = writer[op.key] = {}
                if v in w:
                    self.reused += 1
                    prev = nodes[w[v]]
                    if prev.type == OK and typ != OK:
                        v = None                              # keep the acknowledged writer
                if v is not None:
                    w[v] = n
            elif f in recv_fs or f in read_fs:
                if not (typ == OK or (typ == INFO and isinstance(op.value, (list, tuple)))):
                    continue
                n = len(nodes)
                node_add(op)
                inv_add(inv.time_ns if inv is not None else op.time_ns)
                att_add(att)
                lst = []
                adj_add(lst)
                readers.append(n)
                if f in read_fs and typ == OK:
                    m = len(op.value) if isinstance(op.value, (list, tuple)) else 0
                    cur = final.get(op.key)
                    if cur is None or m >= cur[0]:
                        final[op.key] = (m, n)
            else:
                continue
            if realtime:
                if att >= 0:
                    adj[att].append((n << KIND_BITS) | RT_IN)
                    n_rt_in += 1
                if typ == OK:
                    if t_used:
                        t = len(nodes)
                        node_add(None)
                        inv_add(-1)
                        att_add(-1)
                        adj_add([])
                        if cur_t >= 0:
                            adj[cur_t].append((t << KIND_BITS) | RT_CHAIN)
                            n_chain += 1
                        cur_t, t_used = t, False
                    lst.append((cur_t << KIND_BITS) | RT_OUT)
                    n_rt_out += 1
            if process:
                prev_n = last_of.get(p)
                if prev_n is not None:
                    adj[prev_n].append((n << KIND_BITS) | PROC)
                    n_proc += 1
                last_of[p] = n
        # sends that never completed may have been written: nodes without outgoing edges of their own
        for p, (inv, att) in open_.items():
            if inv.f not in send_fs:
                continue
            v = inv.value if type(inv.value) is int else norm_value(inv.value)
            w = writer.setdefault(inv.key, {})
            if v in w:
                continue
            n = w[v] = self._node(inv, inv.time_ns, att)
            if realtime and att >= 0:
                adj[att].append((n << KIND_BITS) | RT_IN)
                n_rt_in += 1
            if process and p in last_of:
                adj[last_of[p]].append((n << KIND_BITS) | PROC)
                n_proc += 1
        self.edges.update({RT_IN: n_rt_in, RT_OUT: n_rt_out, RT_CHAIN: n_chain, PROC: n_proc})
        self._orders()
        self._data_edges()

    def _messages(self, op: Op) -> Any:
        v = op.value
        if isinstance(v, (list, tuple)):
            return v
        if isinstance(v, dict):
            return (v,)
        return ()

    def _orders(self) -> None:
        """Each topic partition's log order: its longest ok final read, else the observed positions."""
        by_topic: dict[str, list[int]] = {}
        for n in self.readers:
            by_topic.setdefault(self.op[n].key, []).append(n)
        for topic in set(self.writer) | set(by_topic):
            fr = self.final.get(topic)
            if fr is not None:
                self.order_source[topic] = "final-read"
                for m in self._messages(self.op[fr[1]]):
                    if type(m) is dict:
                        v = m.get("value")
                        if type(v) is not int:
                            v = norm_value(v)
                        d = m.get("message_id")
                        part = partition_of(d)
                    else:
                        v, part = norm_value(m), -1
                    if v is None:
                        continue
                    self._place(topic, part, v)
                continue
            self.order_source[topic] = "positions"
            at: dict[Any, tuple[Any, int]] = {}
            for v, n in self.writer.get(topic, {}).items():      # acknowledged positions first
                op = self.op[n]
                if op.type == OK and op.message_id is not None:
                    pk = position_key(op.message_id)
                    if pk is not None:
                        at.setdefault(pk, (v, partition_of(op.message_id)))
            for n in by_topic.get(topic, ()):
                for m in self._messages(self.op[n]):
                    if type(m) is not dict or m.get("message_id") is None:
                        continue
                    pk = position_key(m["message_id"])
                    v = m.get("value")
                    if pk is not None and v is not None and pk not in at:
                        at[pk] = (v if type(v) is int else norm_value(v), partition_of(m["message_id"]))
            for pk in sorted(at, key=unpack_position):
                v, part = at[pk]
                self._place(topic, part, v)

    def _place(self, topic: str, part: int, v: Any) -> None:
        """v is next in the log order of (topic, partition), unless already placed."""
        key = (topic, part)
        ix = self.idx.get(key)
        if ix is None:
            ix = self.idx[key] = {}
            self.seqs[key] = []
        if v not in ix:
            ix[v] = len(self.seqs[key])
            self.seqs[key].append(v)

    def _data_edges(self) -> None:
        adj = self.adj
        edges = self.edges
        # ww along each log, between consecutive values that have a writer
        for (topic, part), seq in self.seqs.items():
            w = self.writer.get(topic, {})
            prev = -1
            for v in seq:
                n = w.get(v)
                if n is None:
                    continue
                if prev >= 0 and prev != n:
                    adj[prev].append((n << KIND_BITS) | WW)
                    edges[WW] += 1
                prev = n
        # rw from readers that read to the end of the topic
        next_w: dict[tuple[str, int], list[int]] = {}
        for r in self.readers:
            op = self.op[r]
            if op.f not in self.rw_fs:
                continue
            topic = op.key
            fr = self.final.get(topic)
            if fr is not None and fr[1] == r and self.order_source.get(topic) == "final-read":
                continue                                  # the read the order comes from saw it all
            hw: dict[int, int] = {}
            for m in self._messages(op):
                v = m.get("value") if type(m) is dict else m
                if type(v) is not int:
                    v = norm_value(v)
                part = _part(m)
                ix = self.idx.get((topic, part))
                i = ix.get(v) if ix is not None else None
                if i is not None and i > hw.get(part, -1):
                    hw[part] = i
            for part, i in hw.items():
                key = (topic, part)
                nw = next_w.get(key)
                if nw is None:
                    nw = next_w[key] = self._next_writers(key)
                if i + 1 < len(nw) and nw[i + 1] >= 0 and nw[i + 1] != r:
                    adj[r].append((nw[i + 1] << KIND_BITS) | RW)
                    edges[RW] += 1
        # wr into readers. A reader is on no cycle when nothing leads from it back to a writer: every
        # path out of it goes through its process's later ops and ops invoked after it completed,
        # and data edges leave only writers and readers with rw edges. So when every such op was
        # invoked before the reader completed (the final reads, at the end), its wr edges (one per
        # message of the topic) are left out.
        att_of = self.att_of
        last_att = max((att_of[n] for w in self.writer.values() for n in w.values()), default=-1)
        for r in self.readers:
            if any(e & RW for e in adj[r]) and att_of[r] > last_att:
                last_att = att_of[r]
        for r in self.readers:
            lst = adj[r]
            if not lst:
                continue
            if all(e & KIND_MASK == RT_OUT for e in lst) and lst[0] >> KIND_BITS > last_att:
                continue
            op = self.op[r]
            w = self.writer.get(op.key)
            if not w:
                continue
            for m in self._messages(op):
                v = m.get("value") if type(m) is dict else m
                if type(v) is not int:
                    v = norm_value(v)
                n = w.get(v)
                if n is not None and n != r:
                    adj[n].append((r << KIND_BITS) | WR)
                    edges[WR] += 1

    def _next_writers(self, key: tuple[str, int]) -> list[int]:
        """For each index of a log, the node of the first value at or after it that has a writer."""
        seq = self.seqs[key]
        w = self.writer.get(key[0], {})
        out = [-1] * (len(seq) + 1)
        nxt = -1
        for i in range(len(seq) - 1, -1, -1):
            n = w.get(seq[i])
            if n is not None:
                nxt = n
            out[i] = nxt
        return out

    # ------------------------------------------------------------------------------------ cycles

    def _cyclic_part(self) -> list[int]:
        """Nodes left after Kahn's algorithm peels every node with no incoming edge, repeatedly:
        exactly the nodes on a cycle or downstream of one."""
        adj = self.adj
        n = len(adj)
        indeg = [0] * n
        for lst in adj:
            for e in lst:
                indeg[e >> KIND_BITS] += 1
        stack = [u for u in range(n) if not indeg[u]]
        pop, push = stack.pop, stack.append
        while stack:
            for e in adj[pop()]:
                v = e >> KIND_BITS
                d = indeg[v] - 1
                indeg[v] = d
                if not d:
                    push(v)
        return [u for u in range(n) if indeg[u]]

    def _core(self, rest: list[int]) -> list[int]:
        """Of the nodes Kahn's algorithm left, those that also lead to a cycle: peel, repeatedly, the
        ones with no outgoing edge left (the same algorithm on the reversed edges)."""
        adj = self.adj
        alive = bytearray(len(adj))
        for u in rest:
            alive[u] = 1
        outdeg = [0] * len(adj)
        preds: dict[int, list[int]] = {}
        for u in rest:
            c = 0
            for e in adj[u]:
                v = e >> KIND_BITS
                if alive[v]:
                    c += 1
                    p = preds.get(v)
                    if p is None:
                        preds[v] = [u]
                    else:
                        p.append(u)
            outdeg[u] = c
        stack = [u for u in rest if not outdeg[u]]
        while stack:
            for u in preds.get(stack.pop(), ()):
                d = outdeg[u] - 1
                outdeg[u] = d
                if not d:
                    stack.append(u)
        return [u for u in rest if outdeg[u]]

    def _sccs_all(self, nodes: list[int]) -> list[list[int]]:
        """Non-trivial strongly connected components among `nodes` (any edge kind): an iterative
        Tarjan over flat arrays, for the whole graph."""
        adj = self.adj
        n = len(adj)
        alive = bytearray(n)
        for u in nodes:
            alive[u] = 1
        index = [-1] * n
        low = [0] * n
        on = bytearray(n)
        stack: list[int] = []
        out: list[list[int]] = []
        counter = 0
        for root in nodes:
            if index[root] >= 0:
                continue
            work = [root]
            pos = [0]
            index[root] = low[root] = counter
            counter += 1
            stack.append(root)
            on[root] = 1
            while work:
                u = work[-1]
                lst = adj[u]
                i = pos[-1]
                descended = False
                while i < len(lst):
                    v = lst[i] >> KIND_BITS
                    i += 1
                    if not alive[v]:
                        continue
                    if index[v] < 0:
                        pos[-1] = i
                        index[v] = low[v] = counter
                        counter += 1
                        stack.append(v)
                        on[v] = 1
                        work.append(v)
                        pos.append(0)
                        descended = True
                        break
                    if on[v] and index[v] < low[u]:
                        low[u] = index[v]
                if descended:
                    continue
                work.pop()
                pos.pop()
                if work and low[u] < low[work[-1]]:
                    low[work[-1]] = low[u]
                if low[u] == index[u]:
                    x = stack.pop()
                    on[x] = 0
                    if x != u:
                        comp = [x]
                        while x != u:
                            x = stack.pop()
                            on[x] = 0
                            comp.append(x)
                        out.append(comp)
        return out

    @staticmethod
    def _sccs(nodes: list[int], adj: list[list[int]], mask: int) -> list[list[int]]:
        """Non-trivial strongly connected components of the subgraph on `nodes` using edges of `mask`
        (iterative Tarjan)."""
        inside = set(nodes)
        index: dict[int, int] = {}
        low: dict[int, int] = {}
        on: set[int] = set()
        stack: list[int] = []
        out: list[list[int]] = []
        counter = 0
        for root in nodes:
            if root in index:
                continue
            work = [(root, 0)]
            index[root] = low[root] = counter
            counter += 1
            stack.append(root)
            on.add(root)
            while work:
                u, i = work[-1]
                lst = adj[u]
                while i < len(lst):
                    e = lst[i]
                    i += 1
                    if not e & mask:
                        continue
                    v = e >> KIND_BITS
                    if v not in inside:
                        continue
                    if v not in index:
                        work[-1] = (u, i)
                        index[v] = low[v] = counter
                        counter += 1
                        stack.append(v)
                        on.add(v)
                        work.append((v, 0))
                        break
                    if v in on and index[v] < low[u]:
                        low[u] = index[v]
                else:
                    work.pop()
                    if work:
                        parent = work[-1][0]
                        if low[u] < low[parent]:
                            low[parent] = low[u]
                    if low[u] == index[u]:
                        comp = []
                        while True:
                            x = stack.pop()
                            on.discard(x)
                            comp.append(x)
                            if x == u:
                                break
                        if len(comp) > 1:
                            out.append(comp)
        return out

    def _shortest_back(self, start: int, goal: int, inside: set[int], mask: int, limit: int | None = None
                       ) -> list[int] | None:
        """Nodes of a shortest path start ... goal inside `inside` over `mask` edges (0-1 BFS: a hop into
        a time node costs nothing), or None; with `limit`, only paths entering fewer op nodes."""
        adj, ops = self.adj, self.op
        dist = {start: 0}
        parent: dict[int, int] = {}
        dq = deque([start])
        budget = self.budget
        while dq:
            u = dq.popleft()
            if u == goal:
                path = [u]
                while u != start:
                    u = parent[u]
                    path.append(u)
                path.reverse()
                return path
            du = dist[u]
            if limit is not None and du >= limit:
                return None                           # distances only grow from here
            budget[0] -= 1
            for e in adj[u]:
                if not e & mask:
                    continue
                v = e >> KIND_BITS
                if v not in inside:
                    continue
                w = 0 if ops[v] is None else 1
                dv = dist.get(v)
                if dv is None or du + w < dv:
                    dist[v] = du + w
                    parent[v] = u
                    if w:
                        dq.append(v)
                    else:
                        dq.appendleft(v)
        return None

    def _search(self, comp: list[int], req: int, back: int) -> tuple[list[int] | None, bool]:
        """A short cycle in `comp` through a `req` edge and back over `back` edges (the shortest through
        the edges tried), and whether the budget cut the search short before it found one."""
        adj, ops = self.adj, self.op
        mask = req | back
        best: list[int] | None = None
        best_len = 0
        truncated = False
        max_tries = int(self.o.get("max_tries") or 200)
        for sub in self._sccs(comp, adj, mask):
            inside = set(sub)
            tries = 0
            after = 0
            for u in sub:
                for e in adj[u]:
                    if not e & req:
                        continue
                    v = e >> KIND_BITS
                    if v not in inside:
                        continue
                    if self.budget[0] < 0 or tries >= max_tries or after >= 20:
                        truncated |= best is None and after < 20
                        break
                    tries += 1
                    if best is not None:
                        after += 1                    # a few more tries once a cycle is known
                    v_op = 1 if ops[v] is not None else 0
                    path = self._shortest_back(v, u, inside, back,
                                               None if best is None else best_len - v_op)
                    if path is None:
                        continue
                    cyc = [u] + path[:-1]                 # u -req-> v ... -> u
                    n = _op_len(cyc, ops)
                    if best is None or n < best_len:
                        best, best_len = cyc, n
                    if best_len <= 2:
                        return best, False
                else:
                    continue
                break
        return best, truncated

    def _any_cycle(self, comp: list[int]) -> list[int]:
        """Some cycle of a strongly connected component, over any edges (the search's fallback)."""
        inside = set(comp)
        for u in comp:
            for e in self.adj[u]:
                v = e >> KIND_BITS
                if v in inside:
                    path = self._shortest_back(v, u, inside, KIND_MASK)
                    if path is not None:
                        return [u] + path[:-1]
        raise AssertionError("a strongly connected component without a cycle")

    def _steps(self, cyc: list[int], mask: int) -> list[tuple[int, int, int]]:
        """(from op node, to op node, kind) of a node cycle: runs through time nodes become one
        realtime step; parallel edges take the strongest kind the search allowed."""
        ops, adj = self.op, self.adj
        start = next(i for i, n in enumerate(cyc) if ops[n] is not None)
        seq = cyc[start:] + cyc[:start] + [cyc[start]]
        out = []
        a = seq[0]
        k = 1
        while k < len(seq):
            b = seq[k]
            if ops[b] is None:                        # through time nodes to the next op
                while ops[seq[k]] is None:
                    k += 1
                out.append((a, seq[k], RT_IN))
                a = seq[k]
                k += 1
                continue
            kinds = 0
            for e in adj[a]:
                if e >> KIND_BITS == b:
                    kinds |= e & KIND_MASK
            kinds &= mask
            kind = next(x for x in (WW, WR, RW, PROC) if kinds & x)
            out.append((a, b, kind))
            a = b
            k += 1
        return out

    @staticmethod
    def _classify(steps: list[tuple[int, int, int]]) -> str:
        kinds = [k for _, _, k in steps]
        rw = kinds.count(RW)
        base = ("G0" if WR not in kinds else "G1c") if rw == 0 else "G-single" if rw == 1 else "G2"
        if RT_IN in kinds:
            return base + "-realtime"
        if PROC in kinds:
            return base + "-process"
        return base

    def cycles(self) -> tuple[dict[str, Cases], dict[str, Any]]:
        """The cycles of each type (module docstring): at most one per type and strongly connected
        component, the same ops not twice; each with its ops, steps and explanation as evidence.
        Also the search's stats (components, their size, searches the budget cut short)."""
        cap = self.o.get("max_anomalies")
        cases = {t: Cases(cap) for t in ANOMALY_TYPES}
        rest = self._cyclic_part()
        core = self._core(rest) if rest else []
        comps = self._sccs_all(core) if core else []
        truncated = 0
        sizes = []
        self.budget = [int(self.o.get("search_budget") or 5_000_000)]
        for comp in comps:
            sizes.append(sum(1 for n in comp if self.op[n] is not None))
            inside = set(comp)
            present = 0                                # the edge kinds inside the component
            for u in comp:
                for e in self.adj[u]:
                    if e >> KIND_BITS in inside:
                        present |= e & KIND_MASK
            seen: set[str] = set()
            cycles: set[frozenset[int]] = set()
            cut = False
            searches = [(req, back) for _, req, back in _SEARCHES if req & present]
            if self.budget[0] < 0:
                searches = []
            for req, back in searches:
                cyc, t = self._search(comp, req, back)
                cut |= t
                if cyc is None:
                    continue
                steps = self._steps(cyc, req | back)
                kind = self._classify(steps)
                ops = frozenset(a for a, _, _ in steps)
                if kind in seen or ops in cycles:      # a later search found the same ops again
                    continue
                seen.add(kind)
                cycles.add(ops)
                cases[kind].add(lambda: self._cycle_json(kind, steps))
            if not seen:                               # the budget ran out: some cycle, classified
                cut = True
                steps = self._steps(self._any_cycle(comp), KIND_MASK)
                kind = self._classify(steps)
                cases[kind].add(lambda: self._cycle_json(kind, steps))
            truncated += cut
        stats = {"components": len(comps), "largest_component_ops": max(sizes, default=0),
                 "ops_on_or_between_cycles": sum(1 for n in core if self.op[n] is not None),
                 "searches_cut_short": truncated}
        return cases, stats

    # ---------------------------------------------------------------------------------- evidence

    def _values(self, op: Op) -> list[Any]:
        out = []
        for m in self._messages(op):
            v = m.get("value") if type(m) is dict else m
            out.append(jsonable(v if type(v) is int else norm_value(v)))
        return out

    def _label(self, n: int) -> str:
        op = self.op[n]
        if op.f in self.send_fs:
            return f"{op.f} {jsonable(op.value)} (p{op.process})"
        vals = self._values(op)
        shown = ", ".join(str(x) for x in vals[:3]) + (", ..." if len(vals) > 3 else "")
        return f"{op.f} [{shown}] (p{op.process})"

    def _why(self, a: int, b: int, kind: int) -> str:
        oa, ob = self.op[a], self.op[b]
        if kind == WW:
            ia = self._log_index(oa)
            ib = self._log_index(ob)
            return (f"{jsonable(oa.value)} precedes {jsonable(ob.value)} in the log of {oa.key}"
                    + (f" (positions {ia} and {ib})" if ia is not None and ib is not None else ""))
        if kind == WR:
            return f"the {ob.f} returned {jsonable(oa.value)}, which the {oa.f} wrote"
        if kind == RW:
            return (f"{oa.f} read {oa.key} up to a value before {jsonable(ob.value)} and did not see it")
        if kind == PROC:
            return f"process {oa.process} did {oa.f} before {ob.f}"
        return (f"{oa.f} completed at {oa.time_ns / 1e9:.6f} s, before {ob.f} was invoked at "
                f"{self.inv_t[b] / 1e9:.6f} s")

    def _log_index(self, op: Op) -> int | None:
        v = op.value if type(op.value) is int else norm_value(op.value)
        for (topic, _), ix in self.idx.items():
            if topic == op.key and v in ix:
                return ix[v]
        return None

    def _cycle_json(self, kind: str, steps: list[tuple[int, int, int]]) -> dict[str, Any]:
        nodes = [a for a, _, _ in steps]
        pos = {n: i for i, n in enumerate(nodes)}
        ops = []
        for n in nodes:
            op = self.op[n]
            d = {"op": self.ref(op), "topic": op.key}
            if op.f in self.send_fs:
                d["value"] = jsonable(op.value if type(op.value) is int else norm_value(op.value))
                d["message_id"] = mid_json(mid_tuple(op.message_id))
            else:
                vals = self._values(op)
                d["values"] = vals[:20]
                d["messages"] = len(vals)
            ops.append(d)
        st = [{"from": pos[a], "to": pos[b], "kind": _NAMES[k], "why": self._why(a, b, k)} for a, b, k in steps]
        line = "".join(f"T{pos[a]} -{_NAMES[k]}-> " for a, _, k in steps) + "T0"
        legend = "; ".join(f"T{i} = {self._label(n)}" for i, n in enumerate(nodes))
        return {"type": kind, "ops": ops, "steps": st,
                "explanation": f"{line}, a cycle where {legend}: no order of these ops obeys every edge"}

    # ------------------------------------------------------------------------------------ verdict

    def result(self) -> CheckResult:
        """The verdict: the cycles found, and the graph's and the search's stats."""
        cases, cstats = self.cycles()
        o = self.o
        if o.get("invalid") is not None:
            inv = set(o["invalid"])
        elif o.get("model") is not None:
            inv = set(MODELS[o["model"]])
        else:
            inv = set(ANOMALY_TYPES)
        n_ops = sum(1 for x in self.op if x is not None)
        stats = {
            "nodes": {"ops": n_ops, "time": len(self.op) - n_ops,
                      "sends": sum(1 for w in self.writer.values() for _ in w),
                      "reads": len(self.readers)},
            "edges": {"ww": self.edges[WW], "wr": self.edges[WR], "rw": self.edges[RW],
                      "process": self.edges[PROC],
                      "realtime": {"to_time": self.edges[RT_OUT], "chain": self.edges[RT_CHAIN],
                                   "from_time": self.edges[RT_IN]}},
            "log_order": dict(sorted(self.order_source.items(), key=lambda x: str(x[0]))),
            "reused_values": self.reused,
            **anomaly_stats(cases, inv),
            **cstats,
        }
        return CheckResult(valid=verdict(cases, inv), anomalies=anomalies_of(cases), stats=stats)


def _part(m: Any) -> int:
    """The partition of a received message (a dict with its message_id); -1 when unknown."""
    return partition_of(m.get("message_id")) if type(m) is dict else -1


def _op_len(cyc: list[int], ops: list[Op | None]) -> int:
    return sum(1 for n in cyc if ops[n] is not None)
