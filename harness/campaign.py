"""A campaign file: axes whose product is the runs (Jepsen's test-all), exclusions, per-entry overrides,
extra runs and seeds; parsed, validated and expanded here into one `Entry` per run, before anything runs.

    name = "smoke"              # optional (default: the file's name)
    seeds = 2                   # runs per entry, seeds seed_base+1 .. seed_base+N (--seeds overrides)
    seed_base = "date"          # a number (default 0), or "date": YYYYMMDD * 1000 of the campaign's start
    run_timeout = 600           # wall-clock seconds one run may take (default 3 x time_limit + 300)
    analyze = true              # end with `pulsar-chaos analyze` over the runs when Spark is installed

    [defaults]                  # test spec fields (as in test.toml) for every run
    time_limit = 20

    [axes]                      # each a list; every combination is one entry
    workload = ["log", "queue"]
    nemesis = ["none", "kill", "partition,pause"]
    bugs = [{}, {"broker.recovery_fencing" = false}]
    shape = [{bookies = 3}, {bookies = 4, ensemble = 3}]   # not a spec field: a table of fields

    [[exclude]]                 # drops the entries whose axes match every key given
    workload = "queue"
    bugs = "broker.recovery_fencing"

    [[override]]                # sets fields on the entries whose axes match `when` (and `seeds`,
    when = {workload = "register"}                        # their own number of seeds)
    set = {zookeepers = 3, nemesis = "partition-ring"}

    [[run]]                     # one more entry outside the product: spec fields
    workload = "ledger"
    bugs = {"bookie.ignore_fence" = true}

A value matches an axis value when equal, or (a string) when it names one of a nemesis list's faults,
one of a bug-knob table's knobs, or one of an options table's `key=value`. A bad file is a
`CampaignError`: one line naming the file, the problem and the fix.
"""
from __future__ import annotations

import fnmatch
import hashlib
import itertools
import json
import re
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.spec import FIELD_TYPES, SpecError, TestSpec, from_mapping, parse_nemesis_list
from harness.catalog import CATALOG

TOP_KEYS = {"name", "seeds", "seed_base", "run_timeout", "analyze", "defaults", "axes", "exclude", "override", "run"}
RUN_OVERHEAD_S = 300.0            # deploy, settle, final reads, teardown, check and report, at most


class CampaignError(ValueError):
    """A malformed campaign file (or flag): names the problem and the fix."""

    def __init__(self, source: str, problem: str, fix: str):
        self.problem, self.fix = problem, fix
        super().__init__(f"{source}: {problem} (fix: {fix})" if source else f"{problem} (fix: {fix})")


@dataclass
class Entry:
    """One run of the campaign: its test spec fields and what `--only`, exclusions and labels read."""
    index: int
    axes: dict[str, Any]                     # axis name -> this entry's value (incl. seed)
    fields: dict[str, Any]                   # TestSpec fields (test_name and results_dir set by the runner)
    label: str = ""
    key: str = ""                            # stable identity across a resume: a hash of the fields

    def words(self) -> list[str]:
        """Every string `--only` may match: axis values, fault names, knob names, option settings."""
        out = [self.label]
        for v in self.axes.values():
            out += _words(v)
        return out

    def spec(self, test_name: str, results_dir: str) -> TestSpec:
        return from_mapping({**self.fields, "test_name": test_name, "results_dir": results_dir}, catalog=CATALOG)


@dataclass
class Campaign:
    name: str
    path: Path
    text: str                                # the file as read (copied into the campaign folder)
    entries: list[Entry] = field(default_factory=list)
    run_timeout: float | None = None
    analyze: bool = True
    seed_base: int = 0

    def timeout_for(self, e: Entry) -> float:
        if self.run_timeout:
            return float(self.run_timeout)
        return 3 * float(e.fields.get("time_limit", TestSpec.time_limit)) + RUN_OVERHEAD_S

    def estimate(self, e: Entry) -> float:
        """Seconds a run is expected to take before any has been measured: its workload, plus set-up."""
        return float(e.fields.get("time_limit", TestSpec.time_limit)) + 40.0


def _words(v: Any) -> list[str]:
    if isinstance(v, dict):
        out = []
        for k, x in v.items():
            out += [str(k), f"{k}={_text(x)}", *_words(x)]
        return out or ["none"]
    if isinstance(v, list):
        return [",".join(map(str, v)) or "none", *map(str, v)]
    s = _text(v)
    if "," in s:
        return [s, *[x.strip() for x in s.split(",")]]
    return [s]


def _text(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v)


def _matches(value: Any, want: Any) -> bool:
    if isinstance(want, list):
        return any(_matches(value, w) for w in want)
    if value == want:
        return True
    if isinstance(want, str):
        return want in _words(value)
    return False


def seed_base_of(raw: Any, source: str, today: float | None = None) -> int:
    if raw == "date":
        return int(time.strftime("%Y%m%d", time.localtime(today))) * 1000
    if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 0:
        return raw
    raise CampaignError(source, f"seed_base must be a whole number >= 0 or \"date\", not {raw!r}",
                        'write seed_base = 0 or seed_base = "date"')


def load(path: str | Path, *, seeds: int | None = None, seed_base: int | None = None) -> Campaign:
    """Read, validate and expand a campaign file (`seeds`/`seed_base` override the file's; a resume passes
    the seed base it started with). CampaignError for anything wrong, naming the file."""
    path = Path(path)
    src = str(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise CampaignError(src, "no such file", "give the path of a campaign file, e.g. campaigns/smoke.toml") from None
    except OSError as e:
        raise CampaignError(src, f"cannot read it ({e.strerror})", "check the path") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise CampaignError(src, f"not valid TOML ({e})", "fix the syntax at that line") from None
    unknown = sorted(set(raw) - TOP_KEYS)
    if unknown:
        raise CampaignError(src, f"unknown key(s) {', '.join(unknown)}",
                            f"use {', '.join(sorted(TOP_KEYS))}; spec fields go under [defaults] or [axes]")
    name = raw.get("name", path.stem)
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
        raise CampaignError(src, f"name must be a word of letters, digits, _ . -, not {name!r}", 'write name = "nightly"')
    n_seeds = raw.get("seeds", 1) if seeds is None else seeds
    if not isinstance(n_seeds, int) or isinstance(n_seeds, bool) or not 1 <= n_seeds <= 10000:
        raise CampaignError(src, f"seeds must be a whole number from 1 to 10000, not {n_seeds!r}", "write seeds = 5")
    base = seed_base if seed_base is not None else seed_base_of(raw.get("seed_base", 0), src)
    timeout = raw.get("run_timeout")
    if timeout is not None and (not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0):
        raise CampaignError(src, f"run_timeout must be seconds > 0, not {timeout!r}", "write run_timeout = 600")
    analyze = raw.get("analyze", True)
    if not isinstance(analyze, bool):
        raise CampaignError(src, f"analyze must be true or false, not {analyze!r}", "write analyze = false")
    defaults = _table(raw.get("defaults", {}), "[defaults]", src)
    _fields_ok(defaults, "[defaults]", src)
    axes = _table(raw.get("axes", {}), "[axes]", src)
    for ax, values in axes.items():
        if not isinstance(values, list) or not values:
            raise CampaignError(src, f"axis {ax!r} must be a non-empty list, not {values!r}",
                                f'write {ax} = ["a", "b"]')
        if ax not in FIELD_TYPES:
            for v in values:
                if not isinstance(v, dict):
                    raise CampaignError(src, f"axis {ax!r} is not a spec field, so each value must be a table of "
                                             f"fields, not {v!r}",
                                        f"name a spec field (workload, nemesis, bugs, ...) or write "
                                        f"{ax} = [{{bookies = 3}}, {{bookies = 4}}]")
                _fields_ok(v, f"axis {ax}", src)
    excludes = _tables(raw.get("exclude", []), "[[exclude]]", src)
    for ex in excludes:
        bad = sorted(set(ex) - set(axes) - {"seed"})
        if bad:
            raise CampaignError(src, f"an [[exclude]] names {', '.join(bad)}, which is not an axis",
                                f"use axis names: {', '.join(axes) or '(none: add [axes])'}")
    overrides = _tables(raw.get("override", []), "[[override]]", src)
    for ov in overrides:
        if set(ov) - {"when", "set"} or not isinstance(ov.get("set"), dict):
            raise CampaignError(src, f"an [[override]] must have `when` and `set` tables, not {sorted(ov)}",
                                'write when = {workload = "register"} and set = {zookeepers = 3}')
        when = ov.get("when", {})
        if not isinstance(when, dict) or set(when) - set(axes) - {"seed"}:
            raise CampaignError(src, f"an [[override]]'s when names {sorted(set(when) - set(axes))}, "
                                     f"which is not an axis", f"use axis names: {', '.join(axes)}")
        _fields_ok(ov["set"], "[[override]] set", src)
    extra = _tables(raw.get("run", []), "[[run]]", src)
    for r in extra:
        _fields_ok(r, "[[run]]", src)

    combos: list[dict[str, Any]] = []
    names = list(axes)
    for values in itertools.product(*(axes[a] for a in names)) if names else []:
        combo = dict(zip(names, values))
        if any(all(_matches(combo.get(k), w) for k, w in ex.items() if k != "seed") for ex in excludes):
            continue
        combos.append(combo)
    base_entries: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for combo in combos:
        f = dict(defaults)
        for ax, v in combo.items():
            if ax in FIELD_TYPES:
                f[ax] = v
            else:
                f.update(v)
        for ov in overrides:
            if all(_matches(combo.get(k), w) for k, w in ov.get("when", {}).items() if k != "seed"):
                f.update(ov["set"])
        base_entries.append((combo, f))
    for i, r in enumerate(extra):
        base_entries.append(({"run": r.get("test_name") or f"run{i + 1}", **{k: r[k] for k in r if k in
                                                                           ("workload", "nemesis", "bugs", "options")}},
                             {**defaults, **r}))
    if not base_entries:
        raise CampaignError(src, "it makes no runs (no [axes] and no [[run]], or everything excluded)",
                            "add [axes] lists or [[run]] tables")

    entries: list[Entry] = []
    for combo, f in base_entries:
        n = n_seeds if seeds is not None else f.get("seeds", n_seeds)
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 10000:
            raise CampaignError(src, f"the entry {_describe(combo)}: seeds must be a whole number from 1 to "
                                     f"10000, not {n!r}", "write seeds = 5")
        f = {k: v for k, v in f.items() if k not in ("test_name", "results_dir", "seeds")}
        if isinstance(f.get("nemesis"), str):
            f["nemesis"] = parse_nemesis_list(f["nemesis"])
        seeded = [f] if "seed" in f else [{**f, "seed": base + i + 1} for i in range(n)]
        for g in seeded:
            axes_of = {**combo, "seed": g["seed"]}
            e = Entry(len(entries), axes_of, g)
            try:
                e.spec("x", "results")          # every field and name, before anything runs
            except SpecError as err:
                raise CampaignError(src, f"the entry {_describe(combo)}: {err.field}: {err.problem}", err.fix) from None
            entries.append(e)
    _label(entries)
    return Campaign(name=name, path=path, text=text, entries=entries, run_timeout=timeout, analyze=analyze,
                    seed_base=base)


def _describe(combo: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{k} = {_text(v)}" for k, v in combo.items()) + "}"


def _table(v: Any, what: str, src: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise CampaignError(src, f"{what} must be a table, not {v!r}", f"write {what} followed by key = value lines")
    return v


def _tables(v: Any, what: str, src: str) -> list[dict[str, Any]]:
    if not isinstance(v, list) or not all(isinstance(x, dict) for x in v):
        raise CampaignError(src, f"{what} must be tables, not {v!r}", f"write {what} headers with key = value lines")
    return v


def _fields_ok(d: dict[str, Any], what: str, src: str) -> None:
    """Spec fields only (and `seeds`, an entry's own number of seeds, in an override's set or a run)."""
    extra = {"seeds"} if what in ("[[override]] set", "[[run]]") else set()
    bad = sorted(k for k in d if k.replace("-", "_") not in FIELD_TYPES and k not in extra)
    if bad:
        raise CampaignError(src, f"{what} has unknown field(s) {', '.join(bad)}",
                            f"use test spec fields: {', '.join(FIELD_TYPES)}")
    for k in ("test_name", "results_dir"):
        if k in d and what != "[[run]]":
            raise CampaignError(src, f"{what} sets {k}, which the campaign chooses", f"remove {k}")


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", s).strip("-.") or "x"


def _short(ax: str, v: Any) -> str:
    if ax == "seed":
        return f"s{v}"
    if isinstance(v, dict):
        if not v:
            return "none" if ax in ("bugs", "options") else ax
        return "+".join(f"{k.rpartition('.')[2]}-{_text(x)}" for k, x in v.items())
    if isinstance(v, list):
        return "+".join(map(str, v)) or "none"
    return str(v).replace(",", "+").replace(":", "-") or "none"


def _label(entries: list[Entry]) -> None:
    """Each entry's label (its test name: its axis values, short) and key (hash of its fields)."""
    seen: dict[str, int] = {}
    for e in entries:
        parts = [_short(ax, v) for ax, v in e.axes.items() if ax not in ("workload", "seed", "run")]
        wl = str(e.fields.get("workload", "log"))
        lab = _slug("-".join([wl, *parts, _short("seed", e.axes["seed"])]))[:100]
        n = seen.get(lab, 0) + 1
        seen[lab] = n
        e.label = lab if n == 1 else f"{lab}-{n}"
        e.key = hashlib.sha1(json.dumps(e.fields, sort_keys=True, default=str).encode()).hexdigest()[:12]


def select(entries: list[Entry], only: str | None, shard: tuple[int, int] | None) -> list[Entry]:
    """The K-th of N disjoint slices (every N-th entry from K-1, so each slice mixes the axes), then the
    entries any of whose values matches one of `only`'s comma-separated glob patterns."""
    if shard is not None:
        k, n = shard
        entries = [e for i, e in enumerate(entries) if i % n == k - 1]
    if only:
        pats = [p.strip() for p in only.split(",") if p.strip()]
        entries = [e for e in entries if any(fnmatch.fnmatchcase(w, p) for p in pats for w in e.words())]
    return entries


def parse_shard(s: str | None) -> tuple[int, int] | None:
    if s is None:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", s)
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise CampaignError("--shard", f"{s!r} is not K/N with 1 <= K <= N", "write e.g. --shard 2/4")
    return int(m.group(1)), int(m.group(2))
