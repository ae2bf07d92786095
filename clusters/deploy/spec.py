"""What cluster to deploy: counts of each role, replication settings and bug knobs, validated.

Shared by every backend; `ClusterSpec.validate()` turns a bad combination into a SpecError with its fix.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from clusters import bugs as bug_knobs
from clusters.deploy.backend import SpecError

ROOT = Path("/tmp/pulsar-chaos/clusters")
NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,23}$")
MAX_PER_ROLE = {"zookeeper": 5, "bookie": 39, "broker": 39, "client": 9}
# our own (Python) node processes; ZooKeeper (Java) always runs on the true clock
FAKE_CLOCK_ROLES = ("bookie", "broker")
# roles whose data dir can be a lazyfs mount (ZooKeeper's zoo.cfg and myid live in its data dir,
# written once by the deploy without fsync, so a power loss would take its identity)
LAZY_DISK_ROLES = ("bookie", "broker")


# Broker settings every deployed cluster starts from (a spec's broker_config overrides them).
# Infinite retention: Pulsar's default (0/0) deletes every ledger all subscriptions have consumed, and
# with no subscription every closed ledger, so a test's final read from earliest would see "lost"
# messages that were merely trimmed. A chaos test must read everything back, as a Jepsen test of real
# Pulsar configures defaultRetentionTimeInMinutes=-1. Retention tests set namespace policies instead.
# autoSkipNonRecoverableData: an entry that no bookie has any more (lost by a power loss of bookies
# that acknowledge before fsync) would stop every reader at it for ever (Pulsar's default), so a final
# read ends incomplete and the checker can only say unknown; skipping it lets the final read finish and
# the checker report the acknowledged messages it held as lost.
# Node settings the backend decides itself (addresses, ports, paths, the spec's own fields): not
# overridable through bookie_config / broker_config.
DEPLOY_OWNED = frozenset({"name", "role", "host", "zk", "data_dir", "bugs", "port", "http_port",
                          "ensemble", "write_quorum", "ack_quorum", "load_manager", "load_balancer"})
DEPLOY_BROKER_DEFAULTS: dict[str, Any] = {"default_retention_minutes": -1, "default_retention_size_mb": -1,
                                          "auto_skip_non_recoverable_data": True}


def shape_problem(zookeepers: int, bookies: int, ensemble: int, write_quorum: int, ack_quorum: int,
                  *, ledgers: bool = True) -> tuple[str, str, str] | None:
    """The first rule a cluster's shape breaks, as (setting, problem, fix), or None. Shared by
    ClusterSpec.validate and the harness's test spec (which names the setting). `ledgers=False`: a
    cluster without brokers or bookies (ZooKeeper only) needs no bookies for an ensemble."""
    if zookeepers not in (1, 3, 5):
        return ("zookeepers", f"zookeepers={zookeepers}: an ensemble needs an odd size to form a majority",
                "use --zookeepers 1, 3 or 5")
    e, w, a = ensemble, write_quorum, ack_quorum
    if not (e >= w >= a >= 1):
        return ("ack_quorum", f"ensemble={e} write_quorum={w} ack_quorum={a} violates E >= Qw >= Qa >= 1 "
                              f"(needs ensemble >= write_quorum >= ack_quorum)",
                "choose e.g. --ensemble 3 --write-quorum 2 --ack-quorum 2")
    if ledgers and bookies < e:
        return ("bookies", f"bookies={bookies} is fewer than ensemble={e}: no ledger could be created",
                f"use --bookies {e} or more, or a smaller --ensemble")
    return None


@dataclass
class ClusterSpec:
    name: str = "default"
    brokers: int = 2
    bookies: int = 3
    zookeepers: int = 1
    ensemble: int = 3
    write_quorum: int = 2
    ack_quorum: int = 2
    clients: int = 1
    bugs: dict[str, Any] = field(default_factory=dict)
    # extra settings for every node of a role (field names of clusters.config.BookieConfig /
    # BrokerConfig), e.g. {"max_entries_per_ledger": 100} for brokers
    bookie_config: dict[str, Any] = field(default_factory=dict)
    broker_config: dict[str, Any] = field(default_factory=dict)
    base_dir: Path | None = None       # default ROOT/<name>
    subnet: str | None = None          # an IPv4 /24; default: the first free 10.213.X.0/24
    # roles whose processes run under libfaketime, so that set_clock() can skew their wall clocks
    fake_clocks: list[str] = field(default_factory=list)
    # roles whose data dirs are lazyfs mounts (clusters/deploy/lazyfs.py), so that power_loss() can
    # drop what their processes did not fsync
    lazy_disks: list[str] = field(default_factory=list)
    # the brokers' load manager (clusters/loadbalancer/manager.py) and its settings under Pulsar's
    # names (clusters/loadbalancer/settings.py), e.g. {"loadBalancerSheddingIntervalMinutes": 0.1}
    load_manager: str | None = None         # None: DEFAULT_LOAD_MANAGER (clusters/loadbalancer/manager.py)
    lb_settings: dict[str, Any] = field(default_factory=dict)
    # settings of single brokers by node name, over broker_config: unequal brokers, e.g.
    # {"broker-1": {"cpu_cores": 0.5}}
    broker_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.base_dir is None:
            self.base_dir = ROOT / self.name
        self.base_dir = Path(self.base_dir)

    def validate(self) -> "ClusterSpec":
        if not NAME_RE.match(self.name or ""):
            raise SpecError(f"bad cluster name {self.name!r}",
                            "use 1-24 characters: a lowercase letter, then lowercase letters, digits or '-'")
        counts = {"zookeeper": self.zookeepers, "bookie": self.bookies, "broker": self.brokers,
                  "client": self.clients}
        for role, n in counts.items():
            if not isinstance(n, int) or n < 0:
                raise SpecError(f"{role} count must be a whole number >= 0, got {n!r}",
                                f"pass --{role}s 0 or more" if role != "zookeeper" else "pass --zookeepers 1, 3 or 5")
            if n > MAX_PER_ROLE[role]:
                raise SpecError(f"too many {role}s: {n}", f"use at most {MAX_PER_ROLE[role]}")
        problem = shape_problem(self.zookeepers, self.bookies, self.ensemble, self.write_quorum,
                                self.ack_quorum, ledgers=bool(self.brokers or self.bookies))
        if problem is not None:
            raise SpecError(problem[1], problem[2])
        # re-validates names; accepts the parsed form (key -> value)
        for key in self.bugs:
            if key not in bug_knobs.REGISTRY:
                known = ", ".join(sorted(bug_knobs.REGISTRY))
                raise SpecError(f"unknown bug knob {key!r}", f"use one of: {known}")
        from clusters import config as node_config
        for role, extra, cls in (("bookie", self.bookie_config, node_config.BookieConfig),
                                 ("broker", self.broker_config, node_config.BrokerConfig)):
            known = {f.name for f in fields(cls)} - DEPLOY_OWNED
            bad = sorted(set(extra) - known)
            if bad:
                raise SpecError(f"unknown {role} setting(s) {bad}", f"use one of: {', '.join(sorted(known))}")
        from clusters.loadbalancer.manager import DEFAULT_LOAD_MANAGER, LOAD_MANAGERS
        from clusters.loadbalancer.settings import LoadBalancerSettings
        self.load_manager = self.load_manager or DEFAULT_LOAD_MANAGER
        if self.load_manager not in LOAD_MANAGERS:
            raise SpecError(f"unknown load manager {self.load_manager!r}",
                            f"use one of: {', '.join(LOAD_MANAGERS)}")
        try:
            LoadBalancerSettings.from_mapping(self.lb_settings)
        except ValueError as ex:
            raise SpecError(str(ex), "use Pulsar's setting names, as in broker.conf "
                                     "(clusters/loadbalancer/settings.py lists them)") from None
        broker_names = {name for name, role, _ in self.layout() if role == "broker"}
        known = {f.name for f in fields(node_config.BrokerConfig)} - DEPLOY_OWNED
        for name, extra in self.broker_overrides.items():
            if name not in broker_names:
                raise SpecError(f"broker_overrides names {name!r}, not a broker of this cluster",
                                f"use one of: {', '.join(sorted(broker_names)) or '(no brokers)'}")
            bad = sorted(set(extra) - known)
            if bad:
                raise SpecError(f"unknown broker setting(s) {bad} for {name}", f"use one of: {', '.join(sorted(known))}")
        if not isinstance(self.fake_clocks, (list, tuple)) or any(r not in FAKE_CLOCK_ROLES
                                                                 for r in self.fake_clocks):
            raise SpecError(f"fake_clocks={self.fake_clocks!r}: only {' and '.join(FAKE_CLOCK_ROLES)} "
                            "processes can run on a fake clock",
                            "use fake_clocks=['bookie', 'broker'] or a part of it, or [] for true clocks")
        if not isinstance(self.lazy_disks, (list, tuple)) or any(r not in LAZY_DISK_ROLES for r in self.lazy_disks) \
                or len(set(self.lazy_disks)) != len(self.lazy_disks):
            raise SpecError(f"lazy_disks={self.lazy_disks!r}: only {' and '.join(LAZY_DISK_ROLES)} data dirs "
                            "can be lazyfs mounts, each named once",
                            "use lazy_disks=['bookie'] (or ['bookie', 'broker']), or [] for plain disks")
        if self.subnet is not None:
            try:
                net = ipaddress.IPv4Network(self.subnet)
            except ValueError as ex:
                raise SpecError(f"bad subnet {self.subnet!r}: {ex}", "give an IPv4 /24 like 10.213.7.0/24") from None
            if net.prefixlen != 24 or not net.is_private:
                raise SpecError(f"subnet {self.subnet} must be a private /24", "give e.g. 10.213.7.0/24")
        return self

    def layout(self) -> list[tuple[str, str, int]]:
        """(name, role, index) of every host, in start order."""
        out = []
        for role, prefix, n in (("zookeeper", "zk", self.zookeepers), ("bookie", "bookie", self.bookies),
                                ("broker", "broker", self.brokers), ("client", "client", self.clients)):
            out.extend((f"{prefix}-{i}", role, i) for i in range(1, n + 1))
        return out

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["base_dir"] = str(self.base_dir)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "ClusterSpec":
        return cls(**d)
