"""The linearizability checker against a brute-force checker, for every model (hypothesis).

The brute force shares no code with the checker: it pairs the history itself, applies reference
semantics written here from the models' documentation, and enumerates every order of the
operations consistent with real time, each indeterminate operation included or not. Histories are
small (at most 7 operations, 2-4 processes) and have crashes (`info` completions and invocations
that never complete); they come from a simulated real object (mostly linearizable) or carry random
outputs (often not). The checker runs twice on each: as is, and with a tiny stall threshold so that
its window refutation and rewinds run too.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checkers import linear, models
from core.history import Op

NOPE = object()
EXAMPLES = 500          # per model and mode: 7 models x 2 modes x 500 = 7,000 histories


# ------------------------------------------------------------------------------------------ reference semantics

def ref_step(model: str, state, op: dict):
    """The state after `op` (dict: f, key, value, out, known) or NOPE if it cannot happen there."""
    f, v, out, known = op["f"], op["value"], op["out"], op["known"]
    if model in ("register", "cas-register"):
        if f == "read":
            return state if (not known or out is None or out == state) else NOPE
        if f == "write":
            return v
        return v[1] if state == v[0] else NOPE                      # cas [old new]
    if model == "kv":
        k = op["key"]
        cur = dict(state).get(k)
        if f == "get":
            if not known or out is None or out == cur or (cur is None and out in ("", [])):
                return state
            return NOPE
        if f == "put":
            new = v
        else:                                                       # append
            if cur is None:
                new = v if isinstance(v, str) else list(v) if isinstance(v, list) else [v]
            elif isinstance(cur, str):
                if not isinstance(v, str):
                    return NOPE
                new = cur + v
            else:
                new = cur + (v if isinstance(v, list) else [v])
        d = dict(state)
        d[k] = new
        return tuple(sorted(d.items()))
    if model == "fifo-queue":
        if f == "enqueue":
            return state + [v]
        if not known:
            return state[1:]                                        # took the head, or found none
        if out is None:
            return state if not state else NOPE
        return state[1:] if state and state[0] == out else NOPE
    if model == "set":
        if f == "add":
            return state | {v}
        return state if (not known or out is None or set(out) == state) else NOPE
    if model == "mutex":
        if f == "acquire":
            return True if not state else NOPE
        return False if state else NOPE
    if model == "multi-register":                                   # micro-ops in order
        regs = dict(state)
        for mf, k, x in (out if known else v):
            if mf == "write":
                regs[k] = x
            elif known and x is not None and regs.get(k) != x:
                return NOPE
        return tuple(sorted(regs.items()))
    raise AssertionError(model)


INIT = {"register": None, "cas-register": None, "kv": (), "fifo-queue": [], "set": frozenset(), "mutex": False,
        "multi-register": ()}


def brute_force(history: list[Op], model: str) -> bool:
    """True iff some order of the ops consistent with real time, with each indeterminate op in it or
    not, is legal for the model."""
    same_time = len({o.time_ns for o in history}) <= 1
    opened: dict[int, int] = {}
    pairs = []
    for pos, o in enumerate(history):
        if o.type == "invoke":
            opened[o.process] = pos
        else:
            pairs.append((opened.pop(o.process), pos))
    pairs += [(p, None) for p in opened.values()]
    ops = []
    for ip, cp in pairs:
        inv = history[ip]
        comp = history[cp] if cp is not None else None
        if comp is not None and comp.type == "fail":
            continue
        known = comp is not None and comp.type == "ok"
        t = (lambda pos: pos) if same_time else (lambda pos: history[pos].time_ns)
        ops.append({"f": inv.f, "key": inv.key, "value": inv.value,
                    "out": comp.value if known else None, "known": known,
                    "call": t(ip), "ret": t(cp) if known else float("inf")})
    n = len(ops)

    def go(done: frozenset, state) -> bool:
        if all(i in done for i in range(n) if ops[i]["known"]):
            return True
        for i in range(n):
            if i in done:
                continue
            # i may go next unless an op still to go returned before i was called
            if any(j not in done and ops[j]["ret"] < ops[i]["call"] for j in range(n)):
                continue
            ns = ref_step(model, state, ops[i])
            if ns is not NOPE and go(done | {i}, ns):
                return True
        return False

    return go(frozenset(), INIT[model])


# ------------------------------------------------------------------------------------------ histories

FS = {"register": ("read", "write"), "cas-register": ("read", "write", "cas"), "kv": ("get", "put", "append"),
      "fifo-queue": ("enqueue", "dequeue"), "set": ("add", "read"), "mutex": ("acquire", "release"),
      "multi-register": ("txn",)}
READS = {"read", "get", "dequeue"}


def invoke_value(draw, model: str, f: str):
    if f in ("write", "put", "append"):
        return draw(st.sampled_from(("a", "b"))) if model == "kv" else draw(st.integers(0, 2))
    if f == "cas":
        return [draw(st.integers(0, 2)), draw(st.integers(0, 2))]
    if f in ("enqueue", "add"):
        return draw(st.integers(1, 3))
    if f == "txn":
        return [[mf, draw(st.sampled_from(("x", "y"))), None if mf == "read" else draw(st.integers(0, 2))]
                for mf in draw(st.lists(st.sampled_from(("read", "write")), min_size=1, max_size=2))]
    return None


def apply_real(model: str, state, f: str, v, key: str):
    """What a real object does: (new state, ok?, output)."""
    if model in ("register", "cas-register"):
        if f == "read":
            return state, True, state
        if f == "write":
            return v, True, v
        return (v[1], True, v) if state == v[0] else (state, False, v)
    if model == "kv":
        cur = dict(state).get(key)
        if f == "get":
            return state, True, cur
        ns = ref_step("kv", state, {"f": f, "key": key, "value": v, "out": None, "known": True})
        return ns, True, v
    if model == "fifo-queue":
        if f == "enqueue":
            return state + [v], True, v
        return (state[1:], True, state[0]) if state else (state, True, None)
    if model == "set":
        return (state | {v}, True, v) if f == "add" else (state, True, sorted(state))
    if model == "multi-register":
        regs, out = dict(state), []
        for mf, k, x in v:
            if mf == "write":
                regs[k] = x
                out.append([mf, k, x])
            else:
                out.append([mf, k, regs.get(k)])
        return tuple(sorted(regs.items())), True, out
    if f == "acquire":
        return (True, True, None) if not state else (state, False, None)
    return (False, True, None) if state else (state, False, None)


def random_output(draw, model: str, f: str, v):
    if f in ("read", "get") and model != "set":
        return draw(st.one_of(st.none(), st.sampled_from(("a", "ab", "b", "")) if model == "kv"
                              else st.integers(0, 2)))
    if f == "dequeue":
        return draw(st.one_of(st.none(), st.integers(1, 3)))
    if model == "set" and f == "read":
        return sorted(draw(st.sets(st.integers(1, 3))))
    if f == "txn":
        return [m if m[0] == "write" else [m[0], m[1], draw(st.one_of(st.none(), st.integers(0, 2)))] for m in v]
    return v


@st.composite
def histories(draw, model: str, simulate: bool) -> list[Op]:
    n_threads = draw(st.integers(2, 4))
    n_ops = draw(st.integers(1, 7))
    state = INIT[model]
    pid = list(range(n_threads))
    pending: dict[int, dict] = {}            # thread -> the op in flight
    events: list[Op] = []
    started = 0
    while started < n_ops or pending:
        idle = [t for t in range(n_threads) if t not in pending]
        moves = (["invoke"] if started < n_ops and idle else []) + (["advance"] if pending else [])
        move = draw(st.sampled_from(moves))
        if move == "invoke":
            t = draw(st.sampled_from(idle))
            f = draw(st.sampled_from(FS[model]))
            key = draw(st.sampled_from(("x", "y"))) if model == "kv" else ""
            v = invoke_value(draw, model, f)
            events.append(Op(process=pid[t], type="invoke", f=f, key=key, value=v))
            pending[t] = {"f": f, "v": v, "key": key, "applied": False, "ok": True, "out": None}
            started += 1
            continue
        t = draw(st.sampled_from(sorted(pending)))
        op = pending[t]
        if not op["applied"] and draw(st.booleans()):
            # the op takes effect now (in the simulated object)
            state, op["ok"], out = apply_real(model, state, op["f"], op["v"], op["key"])
            op["applied"] = True
            op["out"] = out if simulate else random_output(draw, model, op["f"], out)
            if not simulate and op["f"] in ("cas", "acquire", "release"):
                op["ok"] = draw(st.booleans())                   # a reported outcome, true or not
            continue
        end = draw(st.sampled_from(("ok", "ok", "info", "never") if op["applied"] else
                                   ("info", "fail", "never")))
        if op["applied"] and end == "ok" and not op["ok"]:
            end = "fail"                                         # a cas that did not match, a busy lock
        del pending[t]
        if end == "never":
            pid[t] += 100                                        # a crashed process never comes back
            continue
        value = op["out"] if end == "ok" else op["v"]
        events.append(Op(process=pid[t], type=end, f=op["f"], key=op["key"], value=value))
        if end == "info":
            pid[t] += 100
    # times: distinct, with ties (closed intervals), or none at all (history order)
    mode = draw(st.sampled_from(("distinct", "ties", "none")))
    t = 0
    for i, o in enumerate(events):
        o.index = i
        if mode == "distinct":
            t += 10
        elif mode == "ties":
            t += draw(st.integers(0, 1))
        o.time_ns = t
    return events


# ------------------------------------------------------------------------------------------ the property

SEEN: dict[tuple[str, bool], set] = {}      # (model, simulated) -> verdicts met, for the last test


def agree(history: list[Op], model: str, simulated: bool) -> None:
    expected = brute_force(history, model)
    SEEN.setdefault((model, simulated), set()).add(expected)
    for opts in ({}, {"stall_steps": 1, "rewind_ops": 1}):
        r = linear.check(history, {"model": model, **opts})
        assert r.valid is expected, (opts, [o.to_json() for o in history], r.to_json())
        if r.valid is False:
            assert r.anomalies[linear.ANOMALY], r.to_json()


SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.parametrize("model", list(FS))
@SETTINGS
@given(data=st.data())
def test_agrees_with_brute_force_on_simulated_histories(model, data):
    agree(data.draw(histories(model, True)), model, True)


@pytest.mark.parametrize("model", list(FS))
@SETTINGS
@given(data=st.data())
def test_agrees_with_brute_force_on_random_outputs(model, data):
    agree(data.draw(histories(model, False)), model, False)


@pytest.mark.parametrize("model", [m for m in FS if m != "fifo-queue"])    # the queue has no window search
@settings(max_examples=EXAMPLES // 2, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_window_refutation_never_refutes_a_linearizable_history(model, data):
    """The relaxation the search uses to prove a violation locally (an unknown start state, the ops
    overlapping the window optional, indeterminate ops reusable) must hold for every window of a
    linearizable history: any window, ending at any ok op."""
    history = data.draw(histories(model, data.draw(st.booleans())))
    if not brute_force(history, model):
        return
    m = models.get(model)
    prep = linear.prepare(history, m, dict(linear.DEFAULTS))
    for part in prep["partitions"].values():
        real, crashed = part["real"], part["crashed"]
        for blocker in range(len(real)):
            for width in range(1, len(real) + 1):
                w = linear._window(m, real, crashed, blocker, width, None)
                assert not (w and w.get("refuted")), (blocker, width, [o.to_json() for o in history])


def test_both_verdicts_are_exercised():
    """Random outputs gave valid and invalid histories for every model above (else agreeing would be
    cheap); the simulation gave valid ones."""
    if len(SEEN) < 2 * len(FS):
        pytest.skip("runs after the property tests above")
    for model in FS:
        assert SEEN[(model, False)] == {True, False}, model
        assert True in SEEN[(model, True)], model
