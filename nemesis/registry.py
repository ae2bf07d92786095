"""The fault registry: every fault name with what it makes, what it needs and how the report draws it.

A `Fault` entry is the whole declaration of a fault (Jepsen's fault package in one map): its factory
(taking the `:PARAM` or None), one line of help, the deployment it needs (fake clocks, lazy disks),
whether it cuts the spec's grudge, and its colour. The runner, the spec and the report read these
declarations; a new fault is its module plus one `REGISTRY.register(...)` (docs/extending.md).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from core.registry import Registry
from nemesis.base import FaultNameError, Nemesis
from nemesis.balance import ReplayNemesis, ScaleNemesis, SplitNemesis, UnloadNemesis
from nemesis.clock import ClockNemesis
from nemesis.corrupt import DiskCorruptNemesis
from nemesis.lifecycle import DiskWipeNemesis, KillRoleNemesis, RollingRestartNemesis
from nemesis.links import FlakyNemesis, SlowNemesis
from nemesis.partition import (ClientLinkNemesis, GrudgeNemesis, IsolateNemesis, PartitionNemesis,
                               PrimariesNemesis, ZkIsolateNemesis)
from nemesis.power import PowerLossNemesis
from nemesis.process import KillNemesis, PauseNemesis
from nemesis.targets import check_name

TARGETS_HELP = ("TARGET: owner, ledger-bookies, zk-leader, lb-leader, lb-follower, broker, bookie, zookeeper, "
                "all-<role>, or a node name (resolved when the fault starts)")
DEFAULT_COLOUR = "#D9C8A8"
# Colours for fault names no entry declares (histories from other tools): a stable pick by name.
OTHER_COLOURS = ("#F2C29B", "#C9D7A0", "#E7B3CF", "#B5C7E8", "#D9C8A8", "#BFE3C8")
SERVER_ROLES = ("bookie", "broker")
DEPLOYABLE = ("fake_clocks", "lazy_disks")       # ClusterSpec fields a fault may ask the runner to set


@dataclass(frozen=True)
class Fault:
    """One fault name's declaration.

    `deploy` names `ClusterSpec` fields the run's deployment must turn on for the fault to work, each
    with the roles it needs it on (`{"fake_clocks": ("bookie", "broker")}`); the runner sets them
    for every fault the spec names. `takes_grudge`: the factory takes the spec's (or a schedule
    entry's) grudge, and a run naming the fault must give one."""
    factory: Callable[..., Nemesis]       # factory(param) or, with takes_grudge, factory(param, grudge=...)
    help: str
    param: str = ""                       # what :PARAM is ("" when the name takes none)
    colour: str = DEFAULT_COLOUR          # its band and swatch in the report
    deploy: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    takes_grudge: bool = False

    def __post_init__(self) -> None:
        unknown = sorted(set(self.deploy) - set(DEPLOYABLE))
        if unknown:       # a misspelt need would otherwise be set on the ClusterSpec and never read
            raise ValueError(f"Fault(deploy=...) names {unknown}, which ClusterSpec does not have; "
                             f"use {', '.join(DEPLOYABLE)}")


def _plain(make_one: Callable[[], Nemesis]) -> Callable[[str | None], Nemesis]:
    return lambda _param: make_one()


PARTITION, ISOLATE, KILL = "#E9DCA0", "#F2C29B", "#E9A4A0"     # the first and third are Jepsen's perf colours

REGISTRY: Registry[Fault] = Registry("nemesis", {
    "partition": Fault(_plain(lambda: PartitionNemesis("halves")),
                       "random halves of the brokers and bookies (ZooKeeper with the bigger half)",
                       colour=PARTITION),
    "partition-ring": Fault(_plain(lambda: PartitionNemesis("majorities-ring")),
                            "majorities ring: every server sees a majority, neighbours different ones",
                            colour=PARTITION),
    "partition-bridge": Fault(_plain(lambda: PartitionNemesis("bridge")),
                              "two halves that only one bridge node reaches both of", colour=PARTITION),
    "isolate": Fault(lambda p: IsolateNemesis(p), "one node (random broker or bookie, or TARGET) cut "
                     "from every other server", "TARGET", colour=ISOLATE),
    "partition-one": Fault(lambda p: IsolateNemesis(p, name="partition-one"), "the same as isolate", "TARGET",
                           colour=ISOLATE),
    "primaries": Fault(_plain(PrimariesNemesis), "the owner of every topic, each cut from every other server",
                       colour="#D9C8A8"),
    "zk-isolate": Fault(lambda p: ZkIsolateNemesis(p), "a topic's owner (or TARGET) cut from ZooKeeper only, "
                        "still reaching bookies, brokers and clients", "TARGET", colour="#B6DDB0"),
    "client-link": Fault(lambda p: ClientLinkNemesis(p), "the clients cut from one broker (a topic's owner, "
                         "or TARGET) while the servers still talk", "TARGET", colour="#C9D7A0"),
    "grudge": Fault(lambda p, grudge=None: GrudgeNemesis(grudge),
                    "the spec's grudge, e.g. --grudge '{\"broker-1\": [\"zk-1\"]}'", colour="#E7B3CF",
                    takes_grudge=True),
    "kill": Fault(lambda p: KillNemesis(p), "SIGKILL a random broker or bookie (or TARGET), restart it "
                  "with its data", "TARGET", colour=KILL),
    "pause": Fault(lambda p: PauseNemesis(p), "SIGSTOP a random broker or bookie (or TARGET) for the hold, "
                   "then SIGCONT", "TARGET", colour="#A0B1E9"),
    "rolling-restart": Fault(lambda p: RollingRestartNemesis(p), "every broker (or ROLE) in turn stopped (MODE "
                             "stop) or killed (kill) and started again, waiting until each is ready", "ROLE+MODE",
                             colour="#B5C7E8"),
    "kill-role": Fault(lambda p: KillRoleNemesis(p), "every node of a role (brokers by default) killed at once, "
                       "all restarted at the stop", "ROLE", colour=KILL),
    "disk-wipe": Fault(lambda p: DiskWipeNemesis(p), "a bookie (or TARGET) killed, its data deleted, restarted "
                       "with the same identity at the stop (a bookie refuses its wiped disk: formatted as a new "
                       "bookie first)", "TARGET", colour="#C4C4C4"),
    "disk-corrupt": Fault(lambda p: DiskCorruptNemesis("bitflip", p), "a bookie (or TARGET) killed, 16 bits "
                          "flipped in the last quarter of its newest entry log (its index untouched), started "
                          "again at once", "TARGET", colour="#B8B0A0"),
    "disk-truncate": Fault(lambda p: DiskCorruptNemesis("truncate", p), "a bookie (or TARGET) killed, its newest "
                           "entry log cut in its last quarter (its index untouched), started again at once",
                           "TARGET", colour="#A89F8C"),
    "power-loss": Fault(lambda p: PowerLossNemesis(p), "every bookie (or TARGETS, joined by +: "
                        "all-bookie+all-broker) loses power at once: killed, un-fsync'ed writes dropped (lazyfs "
                        "disks); restarted at the stop", "TARGETS", colour="#F0A8B8",
                        deploy={"lazy_disks": SERVER_ROLES}),
    "clock": Fault(lambda p: ClockNemesis(p), "bump a random broker's or bookie's (or TARGET's) wall clock by "
                   "+/-1..300 s, or strobe it every 1..3 s (libfaketime)", "TARGET", colour="#D7B5E8",
                   deploy={"fake_clocks": SERVER_ROLES}),
    "flaky": Fault(lambda p: FlakyNemesis(p), "drop 20..50% of the packets on one node's (or TARGET's) links "
                   "to every server, or on 1..3 random server pairs", "TARGET", colour="#A8DCDC"),
    "slow": Fault(lambda p: SlowNemesis(p), "hold every packet 50..500 ms each way on one node's (or TARGET's) "
                  "links to every server, or on 1..3 server pairs (NFQUEUE)", "TARGET", colour="#BFE3C8"),
    "scale": Fault(lambda p: ScaleNemesis(p), "a random broker (MODE :N: N of them) leaves (stop: gracefully, the "
                   "default; kill) and joins again at the stop, with no bundles", "MODE[:N]", colour="#9FC5E8"),
    "unload": Fault(lambda p: UnloadNemesis(p), "the bundle of a random topic unloaded through the admin API "
                    "(MODE dest: towards a random broker, destinationBroker; lost-answer: ZooKeeper carries out the "
                    "owner's delete of the lock, the answer never arrives; to-restarted: transfers towards a broker "
                    "killed meanwhile and restarted within its session)", "MODE", colour="#F6D8AE"),
    "split": Fault(lambda p: SplitNemesis(p), "the bundle of a random topic split on its owner (ALGORITHM: "
                   "range_equally_divide by default) and its children unloaded", "ALGORITHM", colour="#D5A6BD"),
    "replay": Fault(_plain(ReplayNemesis), "earlier messages of the extensible load manager's service-unit state "
                    "channel published again, a partitioned broker's late commands (one earlier message each of up "
                    "to 8 bundles)", colour="#E8C9A0"),
})


def parse_name(spec: str) -> tuple[str, str | None]:
    """"kill:owner" -> ("kill", "owner"); "kill" -> ("kill", None)."""
    name, sep, param = spec.strip().partition(":")
    return name.strip(), (param.strip() if sep else None)


def entry(spec: str) -> Fault:
    """The entry of a fault name (`NAME` or `NAME:PARAM`); FaultNameError if unknown."""
    name, _ = parse_name(spec)
    found = REGISTRY.get(name)
    if found is None:
        raise FaultNameError(f"unknown nemesis {name!r}", f"use one of {', '.join(REGISTRY)} "
                             "(see `pulsar-chaos run --help`)")
    return found


def make(spec: str, grudge: dict[str, list[str]] | None = None) -> Nemesis:
    """The nemesis of a fault name (`NAME` or `NAME:PARAM`); FaultNameError naming the fix if unknown.
    `grudge` goes to a fault that takes one (None: it uses the spec's, from its context)."""
    fault = entry(spec)
    name, param = parse_name(spec)
    if param is not None and not fault.param:
        raise FaultNameError(f"nemesis {name!r} takes no :{param}", f"write just {name}")
    if param == "":
        raise FaultNameError(f"nemesis {spec!r} has an empty {fault.param} after ':'",
                             f"write {name}:{fault.param} or just {name}")
    if param is not None and fault.param == "TARGET":
        check_name(param)
    try:
        nem = fault.factory(param, grudge=grudge) if fault.takes_grudge else fault.factory(param)
        nem.fault_name = spec.strip()         # the whole name (kill:owner), journaled for replays
        return nem
    except FaultNameError:
        raise
    except ValueError as e:          # a parameter the nemesis itself refuses (kill-role:nobody)
        raise FaultNameError(str(e), f"see `pulsar-chaos run --help` for what {name} takes") from None


def help_lines(width: int = 22) -> list[str]:
    """One line per fault name, for `run --help`."""
    out = []
    for name, e in REGISTRY.items():
        shown = f"{name}[:{e.param}]" if e.param else name
        out.append(f"  {shown:{width}} {e.help}")
    return out


def colour(name: str) -> str:
    """The report colour of a fault name: its entry's, else a stable pick for names from elsewhere."""
    found = REGISTRY.get(parse_name(name)[0])
    if found is not None:
        return found.colour
    return OTHER_COLOURS[sum(map(ord, name)) % len(OTHER_COLOURS)]


def deployment_needs(names: list[str]) -> dict[str, list[str]]:
    """The `ClusterSpec` fields (with their roles, sorted) that the faults named need turned on."""
    out: dict[str, set[str]] = {}
    for n in names:
        fault = REGISTRY.get(parse_name(n)[0])
        for field_name, roles in (fault.deploy.items() if fault is not None else ()):
            out.setdefault(field_name, set()).update(roles)
    return {k: sorted(v) for k, v in out.items()}


def takes_grudge(name: Any) -> bool:
    fault = REGISTRY.get(parse_name(name)[0]) if isinstance(name, str) else None
    return bool(fault and fault.takes_grudge)
