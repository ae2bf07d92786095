"""Sequential specifications for the linearizability checker (`checkers/linear.py`).

A model is a pure, deterministic state machine (Knossos's `Model` protocol, Porcupine's `Model`):
`init()` gives the initial state and `step(f)` a function `(state, value) -> next state or ILLEGAL`
for one operation whose completion was observed (`ok`). `crash_step(f)` is the same for an
indeterminate operation (an `info` completion or none): its output is unknown, so only its input
counts; it returns None when such an operation has no effect on the state (a read) and can be
dropped, as Knossos's documentation advises. States are hashable and compared with `==`, so the
checker's cache can hash them (Porcupine's state hashing).

Value conventions are Jepsen's: a register `read` of None (value unknown) is always legal; `cas`
takes `[old new]`; a queue `dequeue` of None means the queue was empty; a set `read` gives the whole
set. `unknown()` is a state that stands for "any state" (used to refute a window of the history on
its own; see `linear.py`), or None when a model has no such state.

Every model checks one object; the checker partitions a history by key (P-compositionality), so a
key-value store is checked as one register per key.
"""
from __future__ import annotations

from typing import Any, Callable

ILLEGAL = type("Illegal", (), {"__repr__": lambda self: "ILLEGAL"})()

Step = Callable[[Any, Any], Any]


class _Unknown:
    """The state "any value" (a window's starting point); a singleton."""
    __slots__ = ()

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN = _Unknown()


class ModelError(ValueError):
    """An operation the model cannot interpret (unknown f, malformed value)."""


def freeze(v: Any) -> Any:
    """A hashable copy of a JSON/EDN value: lists become tuples, dicts sorted item tuples, sets frozensets."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return tuple(freeze(x) for x in v)
    if isinstance(v, (set, frozenset)):
        return frozenset(freeze(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted(((freeze(k), freeze(x)) for k, x in v.items()), key=repr))
    return str(v)


def thaw(v: Any) -> Any:
    """A JSON-able copy of a state or value (tuples as lists, sets sorted, UNKNOWN as "?")."""
    if v is UNKNOWN:
        return "?"
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (tuple, list)):
        return [thaw(x) for x in v]
    if isinstance(v, (set, frozenset)):
        items = [thaw(x) for x in v]
        try:
            return sorted(items)
        except TypeError:
            return sorted(items, key=repr)
    if isinstance(v, dict):
        return {str(k): thaw(x) for k, x in v.items()}
    return str(v)


class Model:
    """Base class; subclasses fill `fs` (accepted f -> canonical f) and the step tables."""
    name = ""
    fs: dict[str, str] = {}
    summary = ""

    def init(self) -> Any:
        return None

    def initial(self, value: Any) -> Any:
        """The state a user's initial value (`--initial JSON`) stands for; ModelError if it cannot be
        one. Registers and kv keys take the value itself."""
        return freeze(value)

    def is_pure(self, f: str, value: Any) -> bool:
        """Whether the op never changes the state (a read): an indeterminate one is dropped, and one
        that is legal now is linearized at once."""
        return self.crash_step(f) is None

    def unknown(self) -> Any:
        """The "any state" state, or None when this model has none."""
        return None

    def canonical_f(self, f: str) -> str:
        g = self.fs.get(f)
        if g is None:
            raise ModelError(f"f {f!r} is not an operation of the {self.name} model "
                             f"(it knows {', '.join(sorted(set(self.fs.values())))})")
        return g

    def norm(self, f: str, value: Any) -> Any:
        """The operation's value as the step functions expect it; ModelError if malformed."""
        return freeze(value)

    def step(self, f: str) -> Step:
        raise NotImplementedError

    def crash_step(self, f: str) -> Step | None:
        return self.step(f)

    def crash_priority(self, f: str) -> int:
        """Among indeterminate ops that could go next, lower goes first: the search tries the less
        flexible ones (a cas, legal in one state) before those legal anywhere (a write), which it
        keeps for later. Only the search's speed depends on it."""
        return 0

    def describe(self, state: Any) -> Any:
        return thaw(state)


# ------------------------------------------------------------------------------------------- registers

def _read(s: Any, v: Any) -> Any:
    if v is None or v == s:
        return s
    if s is UNKNOWN:
        return v
    return ILLEGAL


def _write(s: Any, v: Any) -> Any:
    return v


def _cas(s: Any, v: Any) -> Any:
    if s == v[0] or s is UNKNOWN:
        return v[1]
    return ILLEGAL


class Register(Model):
    """A read/write register (Knossos `register`): `write v`, `read` (ok value v); initially None."""
    name = "register"
    fs = {"read": "read", "write": "write"}
    summary = "read / write v; a read of None is unknown and always legal"

    def unknown(self) -> Any:
        return UNKNOWN

    def step(self, f: str) -> Step:
        return _read if f == "read" else _write

    def crash_step(self, f: str) -> Step | None:
        return None if f == "read" else self.step(f)


class CasRegister(Register):
    """Knossos `cas-register`: a register with `cas [old new]` (legal only when the value is old)."""
    name = "cas-register"
    fs = {"read": "read", "write": "write", "cas": "cas"}
    summary = "read / write v / cas [old new]; initially None"

    def norm(self, f: str, value: Any) -> Any:
        v = freeze(value)
        if f == "cas" and not (isinstance(v, tuple) and len(v) == 2):
            raise ModelError(f"a cas needs the value [old new], not {value!r}")
        return v

    def step(self, f: str) -> Step:
        return _cas if f == "cas" else _read if f == "read" else _write

    def crash_priority(self, f: str) -> int:
        return 0 if f == "cas" else 1


# ------------------------------------------------------------------------------------------- kv

class Partial:
    """A kv value of which only the end is known (appends to an UNKNOWN value)."""
    __slots__ = ("suffix",)

    def __init__(self, suffix: Any):
        self.suffix = suffix

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Partial) and other.suffix == self.suffix

    def __hash__(self) -> int:
        return hash(("Partial", self.suffix))

    def __repr__(self) -> str:
        return f"…{self.suffix!r}"


def _concat(s: Any, v: Any) -> Any:
    if s is None:
        s = "" if isinstance(v, str) else ()
    if isinstance(s, str):
        return s + v if isinstance(v, str) else ILLEGAL
    if isinstance(s, tuple):
        return s + (v if isinstance(v, tuple) else (v,))
    return ILLEGAL


def _kv_get(s: Any, v: Any) -> Any:
    if v is None or v == s:
        return s
    if s is None and (v == "" or v == ()):
        return s
    if s is UNKNOWN:
        return v
    if type(s) is Partial:
        suf = s.suffix
        if isinstance(v, type(suf)) and len(v) >= len(suf) and v[len(v) - len(suf):] == suf:
            return v
    return ILLEGAL


def _kv_append(s: Any, v: Any) -> Any:
    if s is UNKNOWN:
        return Partial(_concat(None, v))
    if type(s) is Partial:
        suf = _concat(s.suffix, v)
        return ILLEGAL if suf is ILLEGAL else Partial(suf)
    return _concat(s, v)


class KV(Model):
    """One key of a key-value store (the checker partitions by key): `put v`, `get` (ok value v),
    `append v` (concatenates strings, or extends a list); a key is None (absent) at first, and a
    get of "" or [] also matches an absent key (Porcupine's kv model returns "" for it)."""
    name = "kv"
    fs = {"get": "get", "read": "get", "put": "put", "write": "put", "append": "append"}
    summary = "get / put v / append v, partitioned by key; an absent key is None"

    def unknown(self) -> Any:
        return UNKNOWN

    def step(self, f: str) -> Step:
        return _kv_get if f == "get" else _write if f == "put" else _kv_append

    def crash_step(self, f: str) -> Step | None:
        return None if f == "get" else self.step(f)

    resets = frozenset(("put",))

    @staticmethod
    def reaches(s: Any, v: Any) -> bool:
        """Whether appends from state s can make a get return v (v starts with s); True when s is
        not a known value (absent, or only its end known)."""
        if type(s) is str:
            return type(v) is str and v.startswith(s)
        if type(s) is tuple:
            return type(v) is tuple and v[:len(s)] == s
        return True

    def describe(self, state: Any) -> Any:
        if type(state) is Partial:
            return {"ends_with": thaw(state.suffix)}
        return thaw(state)


# ------------------------------------------------------------------------------------------- queue

def _enqueue(s: tuple, v: Any) -> Any:
    return s + (v,)


def _dequeue(s: tuple, v: Any) -> Any:
    if v is None:
        return s if not s else ILLEGAL
    if s and s[0] == v:
        return s[1:]
    return ILLEGAL


def _dequeue_crashed(s: tuple, v: Any) -> Any:
    return s[1:] if s else ILLEGAL


class FifoQueue(Model):
    """Knossos `fifo-queue`: `enqueue v`; `dequeue` (ok value v) takes the head; a dequeue of None
    means the queue was empty. An indeterminate dequeue may have taken the head (value unknown)."""
    name = "fifo-queue"
    fs = {"enqueue": "enqueue", "dequeue": "dequeue"}
    summary = "enqueue v / dequeue (ok v = the head; None = empty)"

    def init(self) -> Any:
        return ()

    def initial(self, value: Any) -> Any:
        if not isinstance(value, (list, tuple)):
            raise ModelError(f"a fifo-queue's initial state is a list (head first), not {value!r}")
        return tuple(freeze(x) for x in value)

    def step(self, f: str) -> Step:
        return _enqueue if f == "enqueue" else _dequeue

    def crash_step(self, f: str) -> Step | None:
        return _enqueue if f == "enqueue" else _dequeue_crashed


# ------------------------------------------------------------------------------------------- set

class PartialSet:
    """A set of which only some members are known (adds to an UNKNOWN set)."""
    __slots__ = ("members",)

    def __init__(self, members: frozenset):
        self.members = members

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, PartialSet) and other.members == self.members

    def __hash__(self) -> int:
        return hash(("PartialSet", self.members))


def _set_add(s: Any, v: Any) -> Any:
    if s is UNKNOWN:
        return PartialSet(frozenset((v,)))
    if type(s) is PartialSet:
        return PartialSet(s.members | {v})
    return s if v in s else s | {v}


def _set_read(s: Any, v: Any) -> Any:
    if v is None or v == s:
        return s
    if s is UNKNOWN:
        return v
    if type(s) is PartialSet and s.members <= v:
        return v
    return ILLEGAL


class SetModel(Model):
    """Knossos `set`: `add v`; `read` (ok value = the whole set) must equal the set."""
    name = "set"
    fs = {"add": "add", "read": "read"}
    summary = "add v / read (ok value = the whole set)"

    def init(self) -> Any:
        return frozenset()

    def initial(self, value: Any) -> Any:
        if not isinstance(value, (list, tuple, set, frozenset)):
            raise ModelError(f"a set's initial state is a list of its members, not {value!r}")
        return frozenset(freeze(x) for x in value)

    def unknown(self) -> Any:
        return UNKNOWN

    def norm(self, f: str, value: Any) -> Any:
        if f == "read":
            if value is None:
                return None
            if not isinstance(value, (list, tuple, set, frozenset)):
                raise ModelError(f"a set read needs the whole set as its value, not {value!r}")
            return frozenset(freeze(x) for x in value)
        return freeze(value)

    def step(self, f: str) -> Step:
        return _set_add if f == "add" else _set_read

    @staticmethod
    def reaches(s: Any, v: Any) -> bool:
        """Whether adds from set s can make a read return v (s is a subset of v)."""
        if type(s) is frozenset:
            return isinstance(v, frozenset) and s <= v
        return True

    def crash_step(self, f: str) -> Step | None:
        return None if f == "read" else _set_add

    def describe(self, state: Any) -> Any:
        if type(state) is PartialSet:
            return {"includes": thaw(state.members)}
        return thaw(state)


# ------------------------------------------------------------------------------------------- mutex

def _acquire(s: Any, v: Any) -> Any:
    return True if s is not True else ILLEGAL


def _release(s: Any, v: Any) -> Any:
    return False if s is not False else ILLEGAL


class Mutex(Model):
    """Knossos `mutex` (a lease without expiry): `acquire` is illegal while held, `release` while
    free; initially free."""
    name = "mutex"
    fs = {"acquire": "acquire", "release": "release", "lock": "acquire", "unlock": "release"}
    summary = "acquire / release; acquire needs it free, release needs it held"

    def init(self) -> Any:
        return False

    def initial(self, value: Any) -> Any:
        if value in (True, "held"):
            return True
        if value in (False, "free"):
            return False
        raise ModelError(f'a mutex\'s initial state is "held" or "free" (true or false), not {value!r}')

    def unknown(self) -> Any:
        return UNKNOWN

    def norm(self, f: str, value: Any) -> Any:
        return None                     # the value (an owner, a lease id) does not matter

    def step(self, f: str) -> Step:
        return _acquire if f == "acquire" else _release

    def describe(self, state: Any) -> Any:
        return "?" if state is UNKNOWN else "held" if state else "free"


# ------------------------------------------------------------------------------------------- multi-register

_MICRO = {"read": "r", "r": "r", "write": "w", "w": "w"}


class PartialMap:
    """A multi-register state of which only some registers are known (from an UNKNOWN state)."""
    __slots__ = ("items",)

    def __init__(self, items: tuple):
        self.items = items

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, PartialMap) and other.items == self.items

    def __hash__(self) -> int:
        return hash(("PartialMap", self.items))


def _regs(items: tuple) -> tuple:
    return tuple(sorted(items, key=repr))


def _txn(s: Any, v: Any) -> Any:
    partial = s is UNKNOWN or type(s) is PartialMap
    regs = dict(() if s is UNKNOWN else s.items if partial else s)
    for kind, k, x in v:
        if kind == "w":
            regs[k] = x
        elif x is not None:
            if k in regs:
                if regs[k] != x:
                    return ILLEGAL
            elif partial:
                regs[k] = x                         # an unknown register: the read tells its value
            elif x is not None:
                return ILLEGAL                      # never written (nil)
    out = _regs(tuple(regs.items()))
    return PartialMap(out) if partial else out


def _txn_crashed(s: Any, v: Any) -> Any:
    return _txn(s, tuple((kind, k, x) for kind, k, x in v if kind == "w"))


class MultiRegister(Model):
    """Knossos `multi-register`: a map of registers, read and written in one `txn` op whose value is
    a list of micro-ops `[f k v]` (`f` read/r or write/w) applied in order, so a read sees the
    writes before it in the same txn; a read of nil (value unknown) is always legal; a register
    never written reads nil. Initially every register is nil, or `--initial {"x": 0, "y": 0}` (or a
    list of [key value] pairs, for keys that are not strings), as `(multi-register {:x 0 :y 0})`."""
    name = "multi-register"
    fs = {"txn": "txn", "read": "txn", "write": "txn"}
    summary = "txn [[read k v] [write k v] ...] over a map of registers; initially all nil"

    def init(self) -> Any:
        return ()

    def initial(self, value: Any) -> Any:
        if isinstance(value, dict):
            pairs = list(value.items())
        elif isinstance(value, (list, tuple)) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in value):
            pairs = [tuple(p) for p in value]
        else:
            raise ModelError(f"a multi-register's initial state is a map of registers, e.g. "
                             f'{{"x": 0, "y": 0}}, or a list of [key value] pairs, not {value!r}')
        return _regs(tuple((freeze(k), freeze(x)) for k, x in pairs))

    def unknown(self) -> Any:
        return UNKNOWN

    def norm(self, f: str, value: Any) -> Any:
        if not isinstance(value, (list, tuple)):
            raise ModelError(f"a txn needs a list of [f k v] micro-ops as its value, not {value!r}")
        out = []
        for m in value:
            if not (isinstance(m, (list, tuple)) and len(m) == 3 and str(m[0]).lstrip(":") in _MICRO):
                raise ModelError(f"a txn's micro-op is [read k v] or [write k v], not {m!r}")
            out.append((_MICRO[str(m[0]).lstrip(":")], freeze(m[1]), freeze(m[2])))
        return tuple(out)

    def is_pure(self, f: str, value: Any) -> bool:
        return all(kind == "r" for kind, _, _ in value)

    def step(self, f: str) -> Step:
        return _txn

    def crash_step(self, f: str) -> Step | None:
        return _txn_crashed             # the output is unknown: only its writes count

    def describe(self, state: Any) -> Any:
        if state is UNKNOWN:
            return "?"
        items = state.items if type(state) is PartialMap else state
        d = {str(thaw(k)): thaw(x) for k, x in items}
        return {"known": d} if type(state) is PartialMap else d


def is_txn(v: Any) -> bool:
    """Whether v looks like a multi-register txn (a list of [f k v] micro-ops)."""
    return isinstance(v, (list, tuple)) and len(v) > 0 and all(
        isinstance(m, (list, tuple)) and len(m) == 3 and str(m[0]).lstrip(":") in _MICRO for m in v)


MODELS: dict[str, Model] = {m.name: m for m in (Register(), CasRegister(), KV(), FifoQueue(), SetModel(),
                                                Mutex(), MultiRegister())}
ALIASES = {"queue": "fifo-queue", "fifo": "fifo-queue", "lease": "mutex", "lock": "mutex",
           "cas": "cas-register", "key-value": "kv", "multi-key": "kv", "multi": "multi-register",
           "multiregister": "multi-register"}


def get(name: str) -> Model:
    """The model called `name` (or an alias); ModelError naming the known ones."""
    m = MODELS.get(ALIASES.get(name, name))
    if m is None:
        raise ModelError(f"unknown model {name!r} (known: {', '.join(MODELS)})")
    return m


__all__ = ["ILLEGAL", "UNKNOWN", "MODELS", "ALIASES", "Model", "ModelError", "freeze", "thaw", "get"]
