"""The test spec: what one run does, from CLI flags and/or a TOML file, saved as test.toml in the run.

Every field is validated before anything is created; a bad field is a SpecError naming the field
and the fix (the CLI exits 254 with one line, as Jepsen does for usage errors). Names (workloads,
faults, bug knobs, backends) are checked against a `Catalog`, which the harness builds from the
registries: this module knows the spec's shape, not what is registered.
"""
from __future__ import annotations

import random
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

DEFAULT_NEMESES = ("partition", "kill", "pause", "zk-isolate")


class Catalog(Protocol):
    """What a spec's names are checked against (the harness's `harness.catalog.CATALOG`). Optional:
    `workload_option_problem(workload, spec) -> (problem, fix) | None`, a workload's own check of
    its option values against the spec (used when the catalog has it)."""

    def workload_names(self) -> Sequence[str]: ...

    def workload_options(self, workload: str) -> tuple[Mapping[str, tuple[Any, str]], Mapping[str, Sequence[Any]]]:
        """({option: (default, help)}, {option: allowed values}) of a registered workload."""

    def fault_problem(self, name: Any) -> tuple[str, str] | None:
        """Why `name` (NAME or NAME:PARAM) is not a fault, and the fix; None if it is one."""

    def fault_takes_grudge(self, name: str) -> bool:
        """Whether the fault cuts the spec's grudge (so a run naming it must give one)."""

    def bug_knob_names(self) -> Sequence[str]: ...

    def unsafe_causes(self, workload: str, options: Mapping[str, Any], bugs: Mapping[str, Any],
                      spec: Any = None) -> list[Any]:
        """The `core.expectation.Cause`s that make this configuration expected invalid."""

    def backend_names(self) -> Sequence[str]: ...

    def cluster_problem(self, zookeepers: int, bookies: int, ensemble: int, write_quorum: int,
                        ack_quorum: int) -> tuple[str, str, str] | None:
        """(field, problem, fix) if the cluster shape cannot be deployed; None if it can."""

    def load_manager_names(self) -> Sequence[str]: ...

    def lb_settings_problem(self, settings: Mapping[str, Any]) -> tuple[str, str] | None:
        """(problem, fix) if the load-balancer settings are not Pulsar's names and types; None if fine."""

    def broker_settings_problem(self, settings: Mapping[str, Any]) -> tuple[str, str] | None:
        """(problem, fix) if the broker settings are not names and values the brokers take; None if fine."""

    def bookie_settings_problem(self, settings: Mapping[str, Any]) -> tuple[str, str] | None:
        """(problem, fix) if the bookie settings are not names and values the bookies take; None if fine.
        Both settings checks are optional: a catalog without one leaves that table unchecked."""


def _fault_problem(name: Any, catalog: Catalog | None) -> tuple[str, str] | None:
    """Why `name` is not a fault name (a word, or NAME:PARAM), asking the catalog when there is one."""
    if not isinstance(name, str) or not name.strip():
        return (f"a fault name must be a word like partition or kill:owner, not {name!r}",
                "see `pulsar-chaos run --help` for the names")
    return catalog.fault_problem(name) if catalog is not None else None


class SpecError(ValueError):
    """A malformed spec: names the field (and file), says how to fix it."""

    def __init__(self, field_name: str, problem: str, fix: str, source: str = ""):
        self.field, self.problem, self.fix, self.source = field_name, problem, fix, source
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{field_name}: {problem} (fix: {fix})")


@dataclass
class TestSpec:
    test_name: str = "log-chaos"
    workload: str = "log"
    nemesis: list[str] = field(default_factory=lambda: list(DEFAULT_NEMESES))
    nemesis_interval: float = 10.0          # seconds a fault lasts, and seconds between faults
    nemesis_overlap: int = 1                # faults in force at once at most (1: one after another)
    # explicit faults and times instead of random draws: [{at = S, name = "kill:owner", hold = S}, ...]
    nemesis_schedule: list[dict[str, Any]] = field(default_factory=list)
    grudge: dict[str, list[str]] = field(default_factory=dict)   # for the `grudge` nemesis
    time_limit: float = 60.0                # seconds of workload (and faults)
    rate: float = 200.0                     # target ops/s over all client processes
    concurrency: int = 6                    # logical client processes
    topics: int = 2
    brokers: int = 2
    bookies: int = 3
    zookeepers: int = 1
    ensemble: int = 3
    write_quorum: int = 2
    ack_quorum: int = 2
    bugs: dict[str, Any] = field(default_factory=dict)
    load_manager: str = ""                  # the brokers' load manager; "" = their default
    # load-balancer settings under Pulsar's names, e.g. loadBalancerSheddingIntervalMinutes = 0.1
    lb_settings: dict[str, Any] = field(default_factory=dict)
    # broker settings under Pulsar's names, e.g. managedLedgerMaxLedgerRolloverTimeMinutes = 0.02
    broker_settings: dict[str, Any] = field(default_factory=dict)
    # bookie settings under BookKeeper's names, e.g. journalSyncData = false (an unsafe setting)
    bookie_settings: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)   # the workload's options (its OPTIONS)
    seed: int = 0                           # 0: pick one at random (recorded in test.toml)
    results_dir: str = "results"
    backend: str = "netns"
    client_lifetime: float = 3.0            # seconds a producer lives before the workload makes a new
                                            # one (which looks its topic up again); 0: never
    settle: float = 10.0                    # seconds after heal before the final reads
    final_read_timeout: float = 60.0        # seconds the final reads may take per topic
    # the run's expectation (core/expectation.py): "" = from the bug knobs and the workload's unsafe
    # options (invalid if any is on); "valid"/"invalid" declares it, with expected_reason saying why.
    # A run's test.toml records the resolved one.
    expected: str = ""
    expected_reason: str = ""
    # the run folder this run replays (`pulsar-chaos run --replay RUN`) or was shrunk from; "" for none
    replay_of: str = ""

    def validate(self, source: str = "", *, catalog: Catalog | None) -> "TestSpec":
        """Check every field (and, with a catalog, every name); SpecError for the first bad one.
        `catalog=None` checks the shape only: for reading a finished run's test.toml."""
        def err(name: str, problem: str, fix: str) -> SpecError:
            return SpecError(name, problem, fix, source)

        if not self.test_name or any(c in self.test_name for c in "/\\ ") or self.test_name.startswith("."):
            raise err("test_name", f"{self.test_name!r} is not a folder name", "use letters, digits, - and _")
        if catalog is not None:
            workloads = catalog.workload_names()
            if self.workload not in workloads:
                raise err("workload", f"unknown workload {self.workload!r}", f"use one of {', '.join(workloads)}")
        if not isinstance(self.nemesis, list):
            raise err("nemesis", f"must be a list of names, not {self.nemesis!r}",
                      "use a comma list of fault names (`pulsar-chaos run --help`), or none")
        for n in self.nemesis:
            problem = _fault_problem(n, catalog)
            if problem:
                raise err("nemesis", *problem)
        if not isinstance(self.nemesis_overlap, int) or isinstance(self.nemesis_overlap, bool) \
                or not 1 <= self.nemesis_overlap <= 8:
            raise err("nemesis_overlap", f"must be a whole number from 1 to 8, not {self.nemesis_overlap!r}",
                      "use e.g. --nemesis-overlap 2")
        self._validate_grudge(self.grudge, "grudge", err)
        self._validate_schedule(err, catalog)
        if catalog is not None and not self.grudge:
            wanting = [n for n in self.nemesis if catalog.fault_takes_grudge(n)]
            wanting += [e["name"] for e in self.nemesis_schedule
                        if "grudge" not in e and catalog.fault_takes_grudge(e["name"])]
            if wanting:
                raise err("grudge", f"the {wanting[0].partition(':')[0]} nemesis needs a grudge",
                          """give e.g. --grudge '{"broker-1": ["zk-1"]}'""")
        for name, lo in (("nemesis_interval", 0.5), ("time_limit", 1.0), ("rate", 0.1), ("settle", 0.0),
                         ("final_read_timeout", 1.0), ("client_lifetime", 0.0)):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < lo:
                raise err(name, f"must be a number >= {lo}, not {v!r}", f"set {name} to a number >= {lo}")
        for name, lo, hi in (("concurrency", 1, 256), ("topics", 1, 1000), ("brokers", 1, 9),
                             ("bookies", 1, 9), ("zookeepers", 1, 5), ("ensemble", 1, 9),
                             ("write_quorum", 1, 9), ("ack_quorum", 1, 9)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
                raise err(name, f"must be a whole number from {lo} to {hi}, not {v!r}",
                          f"set {name} between {lo} and {hi}")
        if catalog is not None:
            problem = catalog.cluster_problem(self.zookeepers, self.bookies, self.ensemble, self.write_quorum,
                                              self.ack_quorum)
            if problem is not None:
                raise err(*problem)
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise err("seed", f"must be a whole number >= 0, not {self.seed!r}", "use e.g. --seed 42")
        if catalog is not None and self.backend not in catalog.backend_names():
            raise err("backend", f"unknown backend {self.backend!r}",
                      f"use one of {', '.join(catalog.backend_names())}")
        if not isinstance(self.bugs, dict):
            raise err("bugs", "must be a table of knob = value", 'write e.g. [bugs] "bookie.ack_before_fsync" = true')
        if catalog is not None:
            knobs = sorted(catalog.bug_knob_names())
            for k in self.bugs:
                if k not in knobs:
                    raise err("bugs", f"unknown bug knob {k!r}", f"use one of {', '.join(knobs)}")
        if catalog is not None and self.load_manager and self.load_manager not in catalog.load_manager_names():
            raise err("load_manager", f"unknown load manager {self.load_manager!r}",
                      f"use one of {', '.join(catalog.load_manager_names())}")
        if not isinstance(self.lb_settings, dict):
            raise err("lb_settings", "must be a table of setting = value",
                      "write e.g. [lb_settings] loadBalancerSheddingIntervalMinutes = 0.1")
        if catalog is not None:
            problem = catalog.lb_settings_problem(self.lb_settings)
            if problem is not None:
                raise err("lb_settings", *problem)
        for table, example in (("broker_settings", "managedLedgerMaxLedgerRolloverTimeMinutes = 0.02"),
                               ("bookie_settings", "journalSyncData = false")):
            settings = getattr(self, table)
            if not isinstance(settings, dict):
                raise err(table, "must be a table of setting = value", f"write e.g. [{table}] {example}")
            check = getattr(catalog, f"{table}_problem", None) if settings else None
            problem = check(settings) if check is not None else None
            if problem is not None:
                raise err(table, *problem)
        if self.expected not in ("", "valid", "invalid"):
            raise err("expected", f"must be valid or invalid, not {self.expected!r}",
                      'write expected = "invalid" (with expected_reason = "why"), or leave it out')
        if not isinstance(self.replay_of, str):
            raise err("replay_of", f"must be a string, not {self.replay_of!r}",
                      'write replay_of = "results/log-chaos/<run>", or leave it out')
        if not isinstance(self.expected_reason, str):
            raise err("expected_reason", f"must be a string, not {self.expected_reason!r}",
                      'write expected_reason = "why the run must fail"')
        if not isinstance(self.options, dict):
            raise err("options", "must be a table of option = value", 'write e.g. [options] dedup = true')
        if catalog is not None:
            self._validate_options(err, *catalog.workload_options(self.workload))
            # a workload's own check of its options' values against each other and the spec
            check = getattr(catalog, "workload_option_problem", None)
            problem = check(self.workload, self) if check is not None else None
            if problem:
                raise err("options", *problem)
        return self

    @staticmethod
    def _validate_grudge(g: Any, name: str, err: Any) -> None:
        ok = isinstance(g, dict) and all(isinstance(k, str) and isinstance(v, list)
                                         and all(isinstance(x, str) for x in v) for k, v in g.items())
        if not ok:
            raise err(name, f"must map node names to lists of node names, not {g!r}",
                      """write e.g. {"broker-1": ["zk-1"]}""")

    def _validate_schedule(self, err: Any, catalog: Catalog | None) -> None:
        sched = self.nemesis_schedule
        fix = 'write entries like {at = 5, name = "kill:owner", hold = 10}'
        if not isinstance(sched, list):
            raise err("nemesis_schedule", f"must be a list of faults, not {sched!r}", fix)
        for i, e in enumerate(sched):
            where = f"entry {i + 1}"
            if not isinstance(e, dict):
                raise err("nemesis_schedule", f"{where} is not a table: {e!r}", fix)
            extra = sorted(set(e) - {"at", "name", "hold", "grudge", "plan"})
            if extra:
                raise err("nemesis_schedule", f"{where} has unknown key(s) {extra}",
                          "use at, name, hold, grudge, plan")
            if "plan" in e and not isinstance(e["plan"], dict):
                raise err("nemesis_schedule", f"{where}: plan must be a table (the fault's recorded draws and "
                          f"targets), not {e['plan']!r}", "copy it from a run's nemesis journal, or leave it out")
            at, hold = e.get("at"), e.get("hold")
            if not isinstance(at, (int, float)) or isinstance(at, bool) or at < 0:
                raise err("nemesis_schedule", f"{where}: at must be seconds >= 0, not {at!r}", fix)
            if hold is not None and (not isinstance(hold, (int, float)) or isinstance(hold, bool) or hold <= 0):
                raise err("nemesis_schedule", f"{where}: hold must be seconds > 0, not {hold!r}", fix)
            problem = _fault_problem(e.get("name"), catalog)
            if problem:
                raise err("nemesis_schedule", f"{where}: {problem[0]}", problem[1])
            if "grudge" in e:
                self._validate_grudge(e["grudge"], "nemesis_schedule", err)

    def _validate_options(self, err: Any, known: Mapping[str, tuple[Any, str]],
                          choices_of: Mapping[str, Sequence[Any]]) -> None:
        for k, v in self.options.items():
            if k not in known:
                listed = ", ".join(sorted(known)) or "none"
                raise err("options", f"the {self.workload} workload has no option {k!r}",
                          f"use one of: {listed}")
            default, help_ = known[k]
            choices = choices_of.get(k)
            if type(default) is float and type(v) is int:
                v = self.options[k] = float(v)
            if type(v) is not type(default):
                kind = {bool: "true or false", int: "a whole number", float: "a number", str: "a string"}
                raise err("options", f"{k} must be {kind.get(type(default), type(default).__name__)}, not {v!r}",
                          f"{k}: {help_}")
            if choices and v not in choices:
                raise err("options", f"{k} must be one of {', '.join(map(str, choices))}, not {v!r}",
                          f"{k}: {help_}")

    def resolved(self) -> "TestSpec":
        """A copy with the seed fixed, so the saved test.toml re-runs the same schedule."""
        d = asdict(self)
        if not d["seed"]:
            d["seed"] = random.SystemRandom().randrange(1, 2**31)
        return TestSpec(**d)

    def expectation(self, catalog: Catalog):
        """This spec's `core.expectation.Expectation`: declared, or from the registries' unsafe things."""
        from core.expectation import expectation
        found = catalog.unsafe_causes(self.workload, self.options, self.bugs,
                                      {"bookie_settings": self.bookie_settings, "ensemble": self.ensemble,
                                       "write_quorum": self.write_quorum, "ack_quorum": self.ack_quorum})
        return expectation(found, self.expected, self.expected_reason)

    def with_expectation(self, catalog: Catalog) -> "TestSpec":
        """A copy with `expected` and `expected_reason` resolved, as a run's test.toml records them."""
        e = self.expectation(catalog)
        d = asdict(self)
        d.update(expected=e.expected, expected_reason=e.reason)
        return TestSpec(**d)

    def to_toml(self) -> str:
        lines = ["# pulsar-chaos test spec; rerun with: pulsar-chaos run --spec test.toml", ""]
        tables = ("bugs", "options", "grudge")
        for f in fields(self):
            if f.name not in tables:
                lines.append(f"{f.name} = {_toml_value(getattr(self, f.name))}")
        for name in tables:
            lines += ["", f"[{name}]"]
            for k, v in sorted(getattr(self, name).items()):
                lines.append(f"{_toml_value(k)} = {_toml_value(v)}")
        return "\n".join(lines) + "\n"


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_value(str(k))} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {v!r} to TOML")


FIELD_TYPES = {f.name: f for f in fields(TestSpec)}


def from_mapping(raw: dict[str, Any], source: str = "", *, catalog: Catalog | None) -> TestSpec:
    """A spec from a TOML table (keys with - or _), defaults for what is missing, validated (its names
    against `catalog` when given)."""
    d: dict[str, Any] = {}
    for key, value in raw.items():
        name = key.replace("-", "_")
        if name not in FIELD_TYPES:
            raise SpecError(key, "unknown field", f"remove it; known fields: {', '.join(FIELD_TYPES)}", source)
        d[name] = value
    if isinstance(d.get("nemesis"), str):
        d["nemesis"] = parse_nemesis_list(d["nemesis"])
    for name in ("nemesis_interval", "time_limit", "rate", "settle", "final_read_timeout", "client_lifetime"):
        if isinstance(d.get(name), int) and not isinstance(d.get(name), bool):
            d[name] = float(d[name])
    try:
        return TestSpec(**d).validate(source, catalog=catalog)
    except TypeError as e:
        raise SpecError("spec", str(e), "check the field names", source) from None


def load(path: Path | str) -> dict[str, Any]:
    """The raw table of a TOML spec file (validated later, together with any flags)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise SpecError("--spec", f"{path} does not exist", "give the path of a test.toml") from None
    except tomllib.TOMLDecodeError as e:
        raise SpecError("--spec", f"{path} is not valid TOML ({e})", "fix the syntax at that line") from None
    except OSError as e:
        raise SpecError("--spec", f"cannot read {path} ({e.strerror})", "check the path") from None


def parse_nemesis_list(s: str) -> list[str]:
    s = s.strip()
    if s in ("", "none"):
        return []
    return [x.strip() for x in s.split(",") if x.strip()]


def parse_options(items: list[str]) -> dict[str, Any]:
    """`--option KEY=VALUE` flags as a table; VALUE is read as TOML (true, 3, 0.5, "x"), else as a string."""
    out: dict[str, Any] = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k.strip():
            raise SpecError("--option", f"{item!r} is not KEY=VALUE", "write e.g. --option subscription=key_shared")
        try:
            out[k.strip()] = tomllib.loads(f"v = {v.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            out[k.strip()] = v.strip()
    return out
