"""Histories from other tools as `Op` lists: our history.jsonl, Jepsen EDN lines, jepsen.util log lines.

- `jsonl`: our own history (`core.history.read_jsonl`).
- `jepsen-edn`: one EDN map per line, as Jepsen's `history.edn`:
  `{:process 0, :type :invoke, :f :read, :value nil}` (`:time` and `:index` are optional; newer
  Jepsen writes `#jepsen.history.Op{...}` records, read the same way).
- `jepsen-log`: the op lines of a Jepsen run's log, `INFO  jepsen.util - 3	:invoke	:cas	[1 4]`
  (process, type, f, value and, optionally, an error, separated by tabs); every other line of the log
  is skipped.

Jepsen's text formats carry no usable clock, so line order is time: each op's `index` is its
position among the ops read and `time_ns` stays 0 (the checker then orders ops by position). Nemesis ops (`:process :nemesis`) are skipped: the checkers
here look at client ops only. Keywords become plain strings (`:read` -> "read"), vectors and lists
Python lists, sets Python sets, maps dicts; `nil`, `true` and `false` None, True and False.

A line that cannot be read is a `HistoryError` naming the file and the line number.
"""
from __future__ import annotations

import bisect
import re
from pathlib import Path
from typing import Any

from core.history import NEMESIS_PROCESS, TYPES, HistoryError, Op, read_jsonl

FORMATS = ("jsonl", "jepsen-edn", "jepsen-log")


# ------------------------------------------------------------------------------------------ EDN

class EdnError(ValueError):
    pass


class Keyword(str):
    """An EDN keyword, kept apart from strings where it matters (process :nemesis); equal to its name."""
    __slots__ = ()


class Symbol(str):
    __slots__ = ()


_WS = " \t\r\n,"
_DELIM = _WS + "()[]{}\";"
_NUM = re.compile(r"[+-]?\d+(\.\d*)?([eE][+-]?\d+)?[NM]?$|[+-]?\d+/\d+$")
_CHARS = {"newline": "\n", "space": " ", "tab": "\t", "return": "\r", "backspace": "\b", "formfeed": "\f"}
_ESC = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "b": "\b", "f": "\f"}


class _Reader:
    """A recursive-descent reader for the EDN that Jepsen histories use."""

    def __init__(self, text: str):
        self.s = text
        self.i = 0

    def skip(self) -> None:
        s, n = self.s, len(self.s)
        while self.i < n:
            c = s[self.i]
            if c in _WS:
                self.i += 1
            elif c == ";":
                while self.i < n and s[self.i] != "\n":
                    self.i += 1
            else:
                break

    def read(self) -> Any:
        self.skip()
        if self.i >= len(self.s):
            raise EdnError("unexpected end of input")
        c = self.s[self.i]
        if c == "{":
            self.i += 1
            items = self.seq("}")
            if len(items) % 2:
                raise EdnError("a map needs an even number of forms")
            return {_hashable(items[k]): items[k + 1] for k in range(0, len(items), 2)}
        if c == "[":
            self.i += 1
            return self.seq("]")
        if c == "(":
            self.i += 1
            return self.seq(")")
        if c in ")]}":
            raise EdnError(f"unexpected {c!r}")
        if c == '"':
            return self.string()
        if c == "#":
            nxt = self.s[self.i + 1:self.i + 2]
            if nxt == "{":
                self.i += 2
                return {_hashable(x) for x in self.seq("}")}
            if nxt == "_":
                self.i += 2
                self.read()                         # discarded form
                return self.read()
            self.i += 1
            self.token()                            # a tag, e.g. #inst or #jepsen.history.Op
            return self.read()
        if c == "\\":
            self.i += 1
            t = self.token() or self.s[self.i:self.i + 1]
            if not t:
                raise EdnError("a character literal is cut off")
            if t == self.s[self.i:self.i + 1]:
                self.i += 1
            return _CHARS.get(t, t[0] if len(t) == 1 else t)
        t = self.token()
        if not t:
            raise EdnError(f"unexpected {c!r}")
        return _atom(t)

    def seq(self, close: str) -> list[Any]:
        out = []
        while True:
            self.skip()
            if self.i >= len(self.s):
                raise EdnError(f"missing {close!r}")
            if self.s[self.i] == close:
                self.i += 1
                return out
            out.append(self.read())

    def string(self) -> str:
        s, n = self.s, len(self.s)
        self.i += 1
        out = []
        while self.i < n:
            c = s[self.i]
            if c == '"':
                self.i += 1
                return "".join(out)
            if c == "\\":
                e = s[self.i + 1:self.i + 2]
                if e == "u":
                    try:
                        out.append(chr(int(s[self.i + 2:self.i + 6], 16)))
                    except ValueError:
                        raise EdnError("a bad \\u escape in a string") from None
                    self.i += 6
                    continue
                out.append(_ESC.get(e, e))
                self.i += 2
                continue
            out.append(c)
            self.i += 1
        raise EdnError("a string is not closed")

    def token(self) -> str:
        s, n, j = self.s, len(self.s), self.i
        while j < n and s[j] not in _DELIM:
            j += 1
        t = s[self.i:j]
        self.i = j
        return t


def _atom(t: str) -> Any:
    if t == "nil":
        return None
    if t == "true":
        return True
    if t == "false":
        return False
    if t.startswith(":"):
        return Keyword(t[1:])
    if _NUM.match(t):
        if "/" in t:
            a, b = t.split("/")
            return int(a) / int(b)
        t2 = t.rstrip("NM")
        try:
            return int(t2)
        except ValueError:
            return float(t2)
    return Symbol(t)


def _hashable(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted(((_hashable(k), _hashable(x)) for k, x in v.items()), key=repr))
    if isinstance(v, set):
        return frozenset(v)
    return v


def parse_edn(text: str) -> Any:
    """The first EDN form in text; EdnError if it is malformed or followed by more forms."""
    r = _Reader(text)
    v = r.read()
    r.skip()
    if r.i < len(r.s):
        raise EdnError(f"unexpected text after the form: {r.s[r.i:r.i + 20]!r}")
    return v


def _plain(v: Any) -> Any:
    """EDN values as plain Python: keywords and symbols become str, tuples from map keys lists."""
    if isinstance(v, (Keyword, Symbol)):
        return str(v)
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    if isinstance(v, (set, frozenset)):
        return {_plain_key(x) for x in v}
    if isinstance(v, dict):
        return {_plain_key(k): _plain(x) for k, x in v.items()}
    return v


def _plain_key(v: Any) -> Any:
    if isinstance(v, (Keyword, Symbol)):
        return str(v)
    if isinstance(v, (list, tuple)):
        return tuple(_plain_key(x) for x in v)
    return v


# ------------------------------------------------------------------------------------------ ops

def _op(process: Any, type_: Any, f: Any, value: Any, error: Any, where: str) -> Op | None:
    """An Op from Jepsen fields; None for a nemesis op; EdnError if a field is wrong."""
    if isinstance(process, Keyword) or isinstance(process, Symbol) or process is None:
        if str(process) == "nemesis":
            return None
        raise EdnError(f":process {process!r} is neither an integer nor :nemesis")
    if not isinstance(process, int) or isinstance(process, bool):
        raise EdnError(f":process {process!r} is not an integer")
    t = str(type_) if isinstance(type_, (Keyword, Symbol, str)) else None
    if t not in TYPES:
        raise EdnError(f":type {type_!r} is not one of :invoke, :ok, :fail, :info")
    if f is None:
        raise EdnError("the op has no :f")
    err = "" if error is None else (str(error) if isinstance(error, (str, Keyword)) else repr(_plain(error)))
    return Op(process=process, type=t, f=str(f), value=_plain(value), error=err)


_EDN_FIX = ("fix: give Jepsen ops as EDN maps, one a line or all in one [...] vector, e.g. "
            "{:process 0, :type :invoke, :f :read, :value nil}, or pick the right --format")


class _Where:
    """Line numbers of positions in a text (1-based)."""

    def __init__(self, text: str):
        self.starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def line(self, pos: int) -> int:
        return bisect.bisect_right(self.starts, pos)


def _edn_op(d: Any) -> Op | None:
    """An Op from one EDN form (a map, or a #jepsen.history.Op record); None for a nemesis op."""
    if not isinstance(d, dict):
        kind = "a vector or list" if isinstance(d, list) else "a string" if isinstance(d, str) else "a value"
        raise EdnError(f"the form is {kind}, not a map {{...}}")
    op = _op(d.get("process"), d.get("type"), d.get("f"), d.get("value"), d.get("error"), "")
    if op is not None:
        k = d.get("key")
        if k is not None:
            op.key = _plain_key(k)
    return op


def read_edn(path: Path | str, nemesis: list[int] | None = None) -> list[Op]:
    """Ops of a Jepsen or Knossos EDN history, in any of the shapes they write:

    - one op map per line (Jepsen's `history.edn`; `#jepsen.history.Op{...}` records too);
    - op maps one after another, each spanning as many lines as it likes;
    - the whole file one vector `[...]` or list `(...)` of op maps (Knossos's test data, older
      Jepsen `history.edn`).

    Blank lines, `;` comments and `#_` discards are skipped anywhere. An op's key is its `:key`
    field (Porcupine's and many key-value tests' shape) or, for the checker to split, a
    jepsen.independent `[key value]` tuple in `:value`. A form that cannot be read is a
    HistoryError naming the file and its line."""
    path = Path(path)
    text = _text(path)
    where = _Where(text)
    r = _Reader(text)
    r.skip()
    ops: list[Op] = []
    close = None
    if r.i < len(text) and text[r.i] in "[(":
        close = "]" if text[r.i] == "[" else ")"
        opened = where.line(r.i)
        r.i += 1
    while True:
        r.skip()
        if r.i >= len(text):
            if close is not None:
                raise HistoryError(f"{path}:{where.line(max(0, len(text.rstrip()) - 1))}: the history's {'[' if close == ']' else '('} "
                                   f"(line {opened}) is never closed; fix: end the file with {close!r}")
            break
        if close is not None and text[r.i] == close:
            r.i += 1
            r.skip()
            if r.i < len(text):
                raise HistoryError(f"{path}:{where.line(r.i)}: text after the history's closing {close!r}; "
                                   f"fix: put every op inside the one {'[...]' if close == ']' else '(...)'}")
            break
        at = r.i
        try:
            d = r.read()
        except EdnError as e:
            raise HistoryError(f"{path}:{_error_line(text, where, at, r.i)}: not a Jepsen op ({e}); "
                               f"{_EDN_FIX}") from None
        try:
            op = _edn_op(d)
        except EdnError as e:
            raise HistoryError(f"{path}:{where.line(at)}: not a Jepsen op ({e}); {_EDN_FIX}") from None
        if op is not None:
            op.index = len(ops)          # no clock: list order is time
            ops.append(op)
        elif nemesis is not None:
            nemesis.append(len(ops))     # a nemesis op, skipped: counted for the caller
    return ops


def _error_line(text: str, where: _Where, at: int, pos: int) -> int:
    """The line to blame for a form starting at `at` that failed at `pos`: the form's own line when
    that line holds a form of its own that is broken (a map a line with a '}' missing: the reader ran
    on into the next lines), else the line where reading failed."""
    n = where.line(at)
    if where.line(min(pos, len(text) - 1) if text else 0) == n:
        return n
    line_end = text.find("\n", at)
    line = text[at:line_end if line_end >= 0 else len(text)]
    rest = text[line_end + 1:] if line_end >= 0 else ""
    nxt = rest.lstrip(" \t\r,")
    # the next line starts a new op: this line was meant to be an op of its own
    if nxt.startswith(("{", "#jepsen", "#knossos")) and line.count("{") > line.count("}"):
        return n
    return where.line(min(pos, max(0, len(text) - 1)))


_LOG = re.compile(r"jepsen\.util\s+-\s+(.*)$")
_SPACED = re.compile(r"\s*(\S+)\s+(:(?:invoke|ok|fail|info))\s+(\S+)(?:\s+(.*))?$")


def read_log(path: Path | str, nemesis: list[int] | None = None) -> list[Op]:
    """Ops of the `jepsen.util` op lines of a Jepsen log (fields separated by tabs, or aligned with
    spaces); other lines are skipped."""
    path = Path(path)
    ops: list[Op] = []
    for n, line in _lines(path):
        m = _LOG.search(line.rstrip("\r\n"))
        if not m:
            continue
        if "\t" in m.group(1):
            fields = m.group(1).split("\t")
        else:
            # columns aligned with spaces (some logs were written or copied so): process, a :type,
            # f, then the value (one EDN form) and the error
            sm = _SPACED.match(m.group(1))
            if not sm:
                continue                            # a message of jepsen.util, not an op
            fields = [sm.group(1), sm.group(2), sm.group(3)]
            rest = (sm.group(4) or "").strip()
            if rest:
                r = _Reader(rest)
                try:
                    r.read()
                    fields += [rest[:r.i], rest[r.i:]]
                except EdnError:
                    fields.append(rest)             # reported below, with the line
        try:
            if len(fields) < 3:
                raise EdnError("expected process, type and f separated by tabs")
            process = _atom(fields[0].strip())
            type_ = _atom(fields[1].strip())
            f = _atom(fields[2].strip())
            value = parse_edn(fields[3]) if len(fields) > 3 and fields[3].strip() else None
            error = "\t".join(fields[4:]).strip() or None
            if error is not None:
                try:
                    error = parse_edn(error)            # Jepsen writes it with pr-str: :timeout, {...}
                except EdnError:
                    pass                                # or plain text
            op = _op(process, type_, f, value, error, f"{path}:{n}")
        except EdnError as e:
            raise HistoryError(f"{path}:{n}: not a jepsen.util op line ({e}); fix: lines look like "
                               f"'INFO  jepsen.util - 3<TAB>:invoke<TAB>:cas<TAB>[1 4]', or pick the right "
                               f"--format") from None
        if op is not None:
            op.index = len(ops)          # no clock: list order is time
            ops.append(op)
        elif nemesis is not None:
            nemesis.append(len(ops))     # a nemesis op, skipped: counted for the caller
    return ops


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise HistoryError(f"{path}: no such file; fix: give the path of a history file") from None
    except IsADirectoryError:
        raise HistoryError(f"{path}: is a folder; fix: give the history file in it (history.jsonl, "
                           f"history.edn or a jepsen.log)") from None
    except OSError as e:
        raise HistoryError(f"{path}: cannot read ({e.strerror}); fix: check the path and its "
                           f"permissions") from None
    except UnicodeDecodeError:
        raise HistoryError(f"{path}: not UTF-8 text; fix: give a text history file") from None


def _lines(path: Path) -> list[tuple[int, str]]:
    return list(enumerate(_text(path).split("\n"), start=1))


def detect(path: Path | str) -> str:
    """The format of a history file, from its name or its first op line."""
    path = Path(path)
    name = path.name.lower()
    if name.endswith((".jsonl", ".json")):
        return "jsonl"
    if name.endswith(".edn"):
        return "jepsen-edn"
    for _, line in _lines(path)[:2000]:
        s = line.strip()
        if not s or s.startswith(";"):
            continue
        if _LOG.search(s):
            return "jepsen-log"
        if s.startswith("{") and '"type"' in s:
            return "jsonl"
        if s.startswith(("{", "#", "[", "(")):
            return "jepsen-edn"
    return "jepsen-log"


_EXPECTED = {
    "jsonl": "JSON lines of our history schema, e.g. "
             '{"process": 0, "type": "invoke", "f": "read", "value": null}',
    "jepsen-edn": "Jepsen EDN op maps, e.g. {:process 0, :type :invoke, :f :read, :value nil}",
    "jepsen-log": "jepsen.util op lines, e.g. 'INFO  jepsen.util - 3<TAB>:invoke<TAB>:cas<TAB>[1 4]'",
}


def read_history(path: Path | str, fmt: str = "auto", nemesis: list[int] | None = None) -> list[Op]:
    """The ops of a history file in `fmt` ("auto": detected); HistoryError naming the line, or the
    file when no op at all could be read from it (an empty file, or not a history). A history of
    nemesis ops only is read (no client op to check: valid, as Knossos and Jepsen judge it); the
    nemesis ops skipped (Jepsen formats) are counted into `nemesis` when given."""
    path = Path(path)
    if fmt in (None, "", "auto"):
        fmt = detect(path)
    if fmt == "jsonl":
        if not path.exists():
            raise HistoryError(f"{path}: no such file; fix: give the path of a history file")
        ops = list(read_jsonl(path))
        for n, op in enumerate(ops):
            if op.index is None or op.index < 0:
                op.index = n
    skipped: list[int] = []
    if fmt == "jsonl":
        skipped = [op.index for op in ops if op.process == NEMESIS_PROCESS]
    elif fmt == "jepsen-edn":
        ops = read_edn(path, skipped)
    elif fmt == "jepsen-log":
        ops = read_log(path, skipped)
    else:
        raise HistoryError(f"unknown format {fmt!r}; fix: use one of {', '.join(FORMATS)} or auto")
    if nemesis is not None:
        nemesis.extend(skipped)
    if not any(op.process != NEMESIS_PROCESS for op in ops) and not skipped:
        empty = not _text(path).strip()
        what = "is empty" if empty else f"has no client op (read as {fmt})"
        raise HistoryError(f"{path}: {what}; expected a history of invoke/ok/fail/info client ops, "
                           f"as {_EXPECTED[fmt]}; fix: give the history file of a test run"
                           + ("" if empty else ", or the right --format"))
    return ops


__all__ = ["FORMATS", "read_history", "read_edn", "read_log", "parse_edn", "detect", "EdnError"]
