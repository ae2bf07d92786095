"""The `pulsar-chaos` command: run, check and report tests, analyze many runs, check histories from
other tools (`lin`), deploy and fault clusters by hand (`cluster ...`), check the machine (`doctor`).

New top-level commands register with `@command(...)`; `cluster` subcommands with `@cluster_command(...)`.
Every command exits with the one scheme of `core.store`: 0 valid / success, 1 invalid, 2 unknown,
254 a user error (a bad flag, spec, name or file; a missing prerequisite), 255 a crash.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from core.store import EXIT_CRASH, EXIT_USAGE

Handler = Callable[[argparse.Namespace], int | None]
Configure = Callable[[argparse.ArgumentParser], None]


@dataclass
class Subcommand:
    name: str
    help: str
    run: Handler
    configure: Configure | None = None


# name -> Subcommand; order of registration is the order in --help
COMMANDS: dict[str, Subcommand] = {}
CLUSTER_COMMANDS: dict[str, Subcommand] = {}


def command(name: str, help: str, configure: Configure | None = None,
            registry: dict[str, Subcommand] = COMMANDS) -> Callable[[Handler], Handler]:
    """Register a subcommand: `@command("demo", "...", configure=add_args) def run(args): ...`."""
    def deco(fn: Handler) -> Handler:
        registry[name] = Subcommand(name, help, fn, configure)
        return fn
    return deco


def cluster_command(name: str, help: str, configure: Configure | None = None) -> Callable[[Handler], Handler]:
    return command(name, help, configure, registry=CLUSTER_COMMANDS)


class UserError(Exception):
    """A mistake the user can fix; printed as one line `error: ... (fix: ...)`, exit 254."""

    def __init__(self, message: str, fix: str | None = None):
        super().__init__(message)
        self.message, self.fix = message, fix

    def __str__(self) -> str:
        return f"{self.message} (fix: {self.fix})" if self.fix else self.message


class Terminated(BaseException):
    """SIGTERM/SIGHUP turned into an exception so cleanup code (finally, __exit__) runs."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        fail(f"{message}", f"see `{self.prog} --help`")


def fail(message: str, fix: str | None = None) -> NoReturn:
    print(f"error: {message}" + (f" (fix: {fix})" if fix else ""), file=sys.stderr)
    sys.exit(EXIT_USAGE)


def is_tty() -> bool:
    return sys.stdout.isatty()


def print_json(data: Any) -> None:
    if is_tty():
        from rich.console import Console
        Console().print_json(json.dumps(data, default=str))
    else:
        print(json.dumps(data, indent=2, default=str))


def _configure_cluster(p: argparse.ArgumentParser) -> None:
    _add_subcommands(p, CLUSTER_COMMANDS, "cluster_command")


def _cluster_help(args: argparse.Namespace) -> int:
    args.parser.print_help(sys.stderr)
    return EXIT_USAGE


COMMANDS["cluster"] = Subcommand("cluster", "deploy a cluster in network namespaces and fault it by hand",
                                 _cluster_help, _configure_cluster)


# ------------------------------------------------------------------------------------ doctor

@command("doctor", "check prerequisites (root, ip, iptables, Java, ZooKeeper, pulsar-client, Docker, netns)")
def _doctor(args: argparse.Namespace) -> int:
    from harness import doctor
    return doctor.report(doctor.run_checks(), sys.stdout, rich=is_tty())


# ------------------------------------------------------------------------------------ demo

def _demo_args(p: argparse.ArgumentParser) -> None:
    from harness import demo
    demo.add_arguments(p)


@command("demo", "start a cluster, produce and consume through it with pulsar-client, tear it down",
         _demo_args)
def _demo(args: argparse.Namespace) -> int:
    from harness import demo
    return demo.run(args)


# ------------------------------------------------------------------------------------ cluster

def _name_arg(p: argparse.ArgumentParser) -> None:
    from clusters.deploy.backends import BACKENDS, DEFAULT
    p.add_argument("--name", default=None, help="cluster name (default: 'default')")
    p.add_argument("--backend", choices=list(BACKENDS), default=DEFAULT,
                   help="; ".join(f"{e.name}: {e.help}" for e in BACKENDS.values()))


def _node_arg(p: argparse.ArgumentParser) -> None:
    _name_arg(p)
    p.add_argument("node", help="node name, e.g. zk-1, bookie-2, broker-1")


def _cluster_name(args: argparse.Namespace) -> str:
    return args.name or "default"


def _name_flag(name: str) -> str:
    return "" if name == "default" else f" --name {name}"


def _cluster_class(backend: str):
    from clusters.deploy import backends
    return backends.get(backend).cluster_class()


def _attach_up(args: argparse.Namespace):
    """The named cluster, which must be up (root checked first: every caller changes the cluster)."""
    cls = _cluster_class(args.backend)
    cls.require()
    name = _cluster_name(args)
    cluster = cls.attach(name)
    status = cluster.state_status()
    if status not in ("up", "starting"):
        raise UserError(f"cluster {name!r} is not up (status: {status})",
                        f"start it with `pulsar-chaos cluster up{_name_flag(name)} --backend {args.backend}`")
    return cluster


def _up_args(p: argparse.ArgumentParser) -> None:
    _name_arg(p)
    p.add_argument("--brokers", type=int, default=2)
    p.add_argument("--bookies", type=int, default=3)
    p.add_argument("--zookeepers", type=int, default=1)
    p.add_argument("--ensemble", "-e", type=int, default=3, help="bookies per ledger (E)")
    p.add_argument("--write-quorum", "-w", type=int, default=2, help="copies of each entry (Qw)")
    p.add_argument("--ack-quorum", "-a", type=int, default=2, help="acks before an add succeeds (Qa)")
    p.add_argument("--clients", type=int, default=1, help="client hosts for run_client (default 1)")
    p.add_argument("--subnet", default=None, help="an unused private /24 (default: first free 10.213.X.0/24)")
    p.add_argument("--bug", action="append", default=[], metavar="KEY[=VALUE]",
                   help="turn on a bug knob of the reference system (repeatable)")
    _lb_args(p, None)


def _lb_args(p: argparse.ArgumentParser, default: str | None) -> None:
    from clusters.loadbalancer.manager import DEFAULT_LOAD_MANAGER, LOAD_MANAGERS
    p.add_argument("--load-manager", default=default, metavar="NAME",
                   help=f"the brokers' load manager (Pulsar's loadManagerClassName): one of "
                        f"{', '.join(LOAD_MANAGERS)}; default {DEFAULT_LOAD_MANAGER}")
    p.add_argument("--lb-setting", action="append", default=None, metavar="NAME=VALUE",
                   help="a load-balancer setting under Pulsar's name, e.g. "
                        "loadBalancerSheddingIntervalMinutes=0.1 (repeatable)")


def _settings(flag: str, example: str, items: list[str] | None) -> dict[str, Any]:
    """`NAME=VALUE` strings of `flag` -> {NAME: VALUE} (values stay strings: the load-balancer, broker and
    bookie settings check and coerce them); a malformed item is a UserError naming the flag, with
    `example` (a NAME=VALUE of that flag) in the fix."""
    out: dict[str, Any] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise UserError(f"{flag} {item!r} is not NAME=VALUE", f"write e.g. {flag} {example}")
        out[name.strip()] = value.strip()
    return out


def _lb_settings(items: list[str] | None) -> dict[str, Any]:
    return _settings("--lb-setting", "loadBalancerSheddingIntervalMinutes=0.1", items)


def _broker_settings(items: list[str] | None) -> dict[str, Any]:
    return _settings("--broker-setting", "managedLedgerMaxLedgerRolloverTimeMinutes=0.02", items)


def _bookie_settings(items: list[str] | None) -> dict[str, Any]:
    return _settings("--bookie-setting", "journalSyncData=false", items)


@cluster_command("up", "start a cluster (it keeps running after this command) and print its service URL",
                 _up_args)
def _cluster_up(args: argparse.Namespace) -> int:
    from clusters import bugs
    from clusters.deploy.spec import ClusterSpec
    spec = ClusterSpec(name=_cluster_name(args), brokers=args.brokers, bookies=args.bookies,
                       zookeepers=args.zookeepers, ensemble=args.ensemble, write_quorum=args.write_quorum,
                       ack_quorum=args.ack_quorum, clients=args.clients, bugs=bugs.parse(args.bug),
                       subnet=args.subnet, load_manager=args.load_manager,
                       lb_settings=_lb_settings(args.lb_setting))
    cluster = _cluster_class(args.backend)(spec)          # validates the spec
    if is_tty():
        print(f"starting cluster {spec.name!r} in {spec.base_dir} ...", file=sys.stderr)
    try:
        cluster.up()                      # on any failure or interrupt it tears itself down
    except (KeyboardInterrupt, Terminated):
        print(f"interrupted: cluster {spec.name!r} removed", file=sys.stderr)
        raise
    cluster.detach()
    if is_tty():
        _print_nodes(cluster.status())
    print(cluster.service_url or f"(no brokers) zookeeper: {cluster.zk_connect}")
    return 0


def _print_nodes(status: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table
    table = Table(title=f"cluster {status['name']} ({status['status']}) - {status['base_dir']}")
    for col in ("node", "role", "address", "pid", "state", "log"):
        table.add_column(col)
    for n in status["nodes"]:
        table.add_row(n["name"], n["role"], n["host"], str(n["pid"] or ""), n["state"], n["log"] or "")
    Console().print(table)


@cluster_command("status", "print the cluster's nodes, pids, liveness, logs and URLs as JSON", _name_arg)
def _cluster_status(args: argparse.Namespace) -> int:
    print_json(_cluster_class(args.backend).attach(_cluster_name(args)).status())
    return 0


@cluster_command("list", "list the clusters of every backend known on this host")
def _cluster_list(args: argparse.Namespace) -> int:
    from clusters.deploy.backends import list_clusters
    print_json(list_clusters())
    return 0


def _down_args(p: argparse.ArgumentParser) -> None:
    _name_arg(p)
    p.add_argument("--force", action="store_true",
                   help="remove leftovers of killed runs: every pulsar-chaos cluster, namespace, link and "
                        "rule on this host (only --name's if given), killing only recorded processes")


@cluster_command("down", "stop the cluster and remove its namespaces and links (logs and data stay)", _down_args)
def _cluster_down(args: argparse.Namespace) -> int:
    if args.force:                   # everything of this backend marked ours (only --name's if given)
        report = _cluster_class(args.backend).cleanup_all(force=True, names=[args.name] if args.name else None)
        print_json(report)
        left = sorted(p for pids in report.get("left_running", {}).values() for p in pids)
        if left:
            print(f"warning: processes not recorded by pulsar-chaos were running in the removed namespaces "
                  f"and were left alone: {' '.join(map(str, left))} (fix: check them with `ps -p PID` "
                  f"and `kill PID` those that are yours)", file=sys.stderr)
        return 0
    cluster = _attach_up(args)
    cluster.down()
    print(f"cluster {cluster.name!r} is down; logs and data kept in {cluster.base_dir}/nodes")
    return 0


def _node_action(verb: str, help: str) -> None:
    @cluster_command(verb, help, _node_arg)
    def _run(args: argparse.Namespace) -> int:
        cluster = _attach_up(args)
        getattr(cluster, verb)(args.node)
        node = cluster.node(args.node)
        print(f"{node.name}: {'paused' if node.paused else 'running' if node.alive else 'dead'}"
              + (f" (pid {node.pid})" if node.alive else ""))
        return 0


for _verb, _help in (("start", "start a stopped or killed node (same config, data and identity)"),
                     ("stop", "stop a node gracefully (SIGTERM, then SIGKILL)"),
                     ("kill", "SIGKILL a node"), ("pause", "SIGSTOP a node"), ("resume", "SIGCONT a paused node")):
    _node_action(_verb, _help)


def _partition_args(p: argparse.ArgumentParser) -> None:
    _name_arg(p)
    p.add_argument("groups", nargs="+", metavar="GROUP",
                   help="comma-separated node names, e.g. broker-1,bookie-1 broker-2,zk-1; nodes in different "
                        "groups drop each other's packets ('host' names the machine running the harness)")


@cluster_command("partition", "cut the network between groups of nodes (adds to partitions in force)",
                 _partition_args)
def _cluster_partition(args: argparse.Namespace) -> int:
    from clusters.deploy.backend import partition_groups
    groups = [[n for n in g.split(",") if n] for g in args.groups]
    if len([g for g in groups if g]) < 2:
        raise UserError("a partition needs at least two groups", "e.g. `cluster partition broker-1 broker-2,zk-1`")
    cluster = _attach_up(args)
    cluster.partition(partition_groups(groups))
    print_json({"partitions": cluster.status()["partitions"]})
    return 0


@cluster_command("heal", "remove every partition and flaky link", _name_arg)
def _cluster_heal(args: argparse.Namespace) -> int:
    _attach_up(args).heal()
    print("healed")
    return 0


# ------------------------------------------------------------------------------------ run, check, report

def _usage_error(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(EXIT_USAGE)


def _strict_usage(p: argparse.ArgumentParser) -> None:
    """This subcommand's unknown arguments are its own usage error, naming its --help."""
    parse_known = p.parse_known_args

    def strict(args: Any = None, namespace: Any = None) -> tuple[argparse.Namespace, list[str]]:
        ns, extras = parse_known(args, namespace)
        if extras:
            p.error(f"unrecognized arguments: {' '.join(extras)}")
        return ns, []
    p.parse_known_args = strict  # type: ignore[method-assign]


def _run_epilog() -> str:
    """`run --help`'s lists: one paragraph per workload (its line, then its options), then one line
    per fault name."""
    from nemesis.registry import TARGETS_HELP, help_lines
    from workloads import available, get
    lines = ["workloads (--workload NAME; options with --option KEY=VALUE):"]
    for name in available():
        mod = get(name)
        lines.append(f"  {name:15} {mod.DESCRIPTION}")
        for k, (d, h) in mod.OPTIONS.items():
            lines.append(f"  {'':15}   {k}={d!r}: {h}")
    lines += ["", "faults (--nemesis NAME,NAME[:TARGET],...; --nemesis-schedule FILE for exact times):"]
    lines += help_lines()
    lines += [f"  {TARGETS_HELP}"]
    return "\n".join(lines)


def load_schedule(path: str) -> list[dict[str, Any]]:
    """A fault schedule file: TOML with [[fault]] tables (at, name, hold, grudge), or a JSON list of
    the same. SpecError naming the file and the fix if it cannot be read."""
    import tomllib
    from core.spec import SpecError
    fix = 'write [[fault]] tables with at = SECONDS, name = "kill:owner", optional hold = SECONDS'
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise SpecError("--nemesis-schedule", f"cannot read {path} ({e.strerror})", "check the path") from None
    try:
        data: Any = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        try:
            data = json.loads(text)
        except ValueError:
            raise SpecError("--nemesis-schedule", f"{path} is neither TOML nor a JSON list ({e})", fix) from None
    if isinstance(data, dict):
        extra = sorted(set(data) - {"fault"})
        if extra:
            raise SpecError("--nemesis-schedule", f"{path} has unknown table(s) {extra}", fix)
        data = data.get("fault", [])
    if not isinstance(data, list) or not data:
        raise SpecError("--nemesis-schedule", f"{path} lists no faults", fix)
    return data


def _run_args(p: argparse.ArgumentParser) -> None:
    # argparse errors of `run` are usage errors: exit 254 with one line, like a bad spec
    _strict_usage(p)
    p.add_argument("--spec", metavar="FILE", default=None,
                   help="a TOML test spec (e.g. a run's test.toml); flags given here override it")
    p.add_argument("--replay", metavar="RUN", default=None,
                   help="run a run folder's spec again with the faults it really had: each fault's time, "
                        "name and the nodes it hit (not new random ones); other flags override the rest")
    p.formatter_class = argparse.RawDescriptionHelpFormatter      # keep the epilog's lines
    p.epilog = _run_epilog()
    p.add_argument("--workload", default=None, metavar="NAME", help="workload (default log; listed below)")
    p.add_argument("--option", action="append", default=None, metavar="KEY=VALUE",
                   help="a workload option (repeatable), e.g. --option subscription=key_shared; "
                        "each workload's options are listed below")
    p.add_argument("--nemesis", default=None, metavar="LIST",
                   help="comma list of fault names (listed below), or none "
                        "(default: partition,kill,pause,zk-isolate)")
    p.add_argument("--nemesis-interval", type=float, default=None, metavar="S",
                   help="seconds a fault lasts and seconds between faults (default 10)")
    p.add_argument("--nemesis-overlap", type=int, default=None, metavar="N",
                   help="up to N faults in force at once: a new one every interval, each held "
                        "interval*N (default 1: one after another)")
    p.add_argument("--nemesis-schedule", default=None, metavar="FILE",
                   help="faults at given times instead of random ones: TOML [[fault]] tables with "
                        "at, name, hold (seconds from the first op), or a JSON list")
    p.add_argument("--grudge", default=None, metavar="JSON",
                   help="""the grudge nemesis's cut links, e.g. '{"broker-1": ["zk-1"]}' (symmetric)""")
    p.add_argument("--time-limit", type=float, default=None, metavar="S", help="seconds of workload (default 60)")
    p.add_argument("--rate", type=float, default=None, metavar="N", help="target ops/s over all clients (default 200)")
    p.add_argument("--concurrency", type=int, default=None, metavar="N", help="logical client processes (default 6)")
    p.add_argument("--topics", type=int, default=None, metavar="N", help="topics (default 2)")
    p.add_argument("--brokers", type=int, default=None, metavar="N", help="brokers (default 2)")
    p.add_argument("--bookies", type=int, default=None, metavar="N", help="bookies (default 3)")
    p.add_argument("--zookeepers", type=int, default=None, metavar="N", help="ZooKeeper nodes: 1, 3 or 5 (default 1)")
    p.add_argument("--ensemble", type=int, default=None, metavar="N", help="bookies per ledger, E (default 3)")
    p.add_argument("--write-quorum", type=int, default=None, metavar="N", help="copies of each entry, Qw (default 2)")
    p.add_argument("--ack-quorum", type=int, default=None, metavar="N", help="acks before an add succeeds, Qa (default 2)")
    p.add_argument("--bug", action="append", default=None, metavar="KEY[=VALUE]",
                   help="turn on a bug knob of the reference system (repeatable; `pulsar-chaos bugs` lists them)")
    _lb_args(p, None)
    p.add_argument("--broker-setting", action="append", default=None, metavar="NAME=VALUE",
                   help="a broker setting under Pulsar's name, e.g. "
                        "managedLedgerMaxLedgerRolloverTimeMinutes=0.02 (repeatable; clusters/broker/settings.py)")
    p.add_argument("--bookie-setting", action="append", default=None, metavar="NAME=VALUE",
                   help="a bookie setting under BookKeeper's name, e.g. journalSyncData=false (an unsafe setting: "
                        "the run is expected invalid; repeatable; clusters/bookie/settings.py)")
    p.add_argument("--seed", type=int, default=None, metavar="N", help="random seed (default: a random one, saved in test.toml)")
    p.add_argument("--test-name", default=None, metavar="NAME", help="the run folder's parent name (default log-chaos)")
    p.add_argument("--results-dir", default=None, metavar="DIR", help="where run folders go (default results)")
    p.add_argument("--backend", default=None, metavar="NAME", help="deployment backend (default netns)")
    p.add_argument("--settle", type=float, default=None, metavar="S",
                   help="seconds between healing and the final reads (default 10)")
    p.add_argument("--final-read-timeout", type=float, default=None, metavar="S",
                   help="seconds the final read of a topic may take (default 60)")
    p.add_argument("--client-lifetime", type=float, default=None, metavar="S",
                   help="seconds a producer lives before a new one looks its topic up again (default 3; 0 never)")


_RUN_FLAGS = ("workload", "nemesis", "nemesis_interval", "nemesis_overlap", "time_limit", "rate", "concurrency", "topics", "brokers",
              "bookies", "zookeepers", "ensemble", "write_quorum", "ack_quorum", "seed", "test_name",
              "results_dir", "backend", "settle", "final_read_timeout", "client_lifetime", "load_manager")


def run_spec(args: argparse.Namespace) -> Any:
    """The validated TestSpec of `run`'s arguments (the --spec file, then the flags); SpecError if bad."""
    from clusters import bugs
    from harness import runner
    from core.spec import SpecError
    overrides = {k: getattr(args, k) for k in _RUN_FLAGS}
    if args.bug:
        try:
            overrides["bugs"] = bugs.parse(args.bug)
        except bugs.UnknownBugKnob as e:
            raise SpecError("--bug", str(e), "drop that --bug or use a known knob (pulsar-chaos bugs)") from None
    if args.lb_setting:
        overrides["lb_settings"] = _lb_settings(args.lb_setting)
    if getattr(args, "broker_setting", None):
        overrides["broker_settings"] = _broker_settings(args.broker_setting)
    if getattr(args, "bookie_setting", None):
        overrides["bookie_settings"] = _bookie_settings(args.bookie_setting)
    if args.option:
        from core.spec import parse_options
        overrides["options"] = parse_options(args.option)
    if args.nemesis_schedule:
        overrides["nemesis_schedule"] = load_schedule(args.nemesis_schedule)
        if args.nemesis is None:
            overrides["nemesis"] = "none"      # the schedule's faults replace the random ones (nemesis/combine.py)
    if args.grudge:
        try:
            overrides["grudge"] = json.loads(args.grudge)
        except ValueError as e:
            raise SpecError("--grudge", f"not JSON ({e})", """write e.g. '{"broker-1": ["zk-1"]}'""") from None
    if getattr(args, "replay", None):
        return _replay_spec(args, overrides)
    return runner.spec_from_args(args.spec, overrides)


@command("run", "run a chaos test: deploy a cluster, drive the workload under faults, check the history, "
                "write the report (exit 0 valid, 1 invalid, 2 unknown, 254 bad spec, 255 crashed)", _run_args)
def _run(args: argparse.Namespace) -> int:
    from clusters.deploy.backend import ClusterError
    from harness import runner
    from core.spec import SpecError
    try:
        spec = run_spec(args)
        runner.preflight(spec)           # root, iproute2, iptables, ZooKeeper: before any run folder
    except (SpecError, ClusterError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return runner.run(spec)
    except SpecError as e:               # e.g. a results dir that cannot be written
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE


def _replay_spec(args: argparse.Namespace, overrides: dict[str, Any]):
    """`run --replay RUN`: the run's spec with its recorded faults, flags other than the faults on top."""
    import dataclasses
    from core.spec import SpecError
    from harness import replay, runner
    clash = [f for f, v in (("--spec", args.spec), ("--nemesis", args.nemesis),
                            ("--nemesis-schedule", args.nemesis_schedule)) if v is not None]
    if clash:
        raise SpecError(clash[0], "cannot be given with --replay (the replay's faults are the run's)",
                        f"drop {clash[0]}, or drop --replay")
    try:
        base = replay.replay_spec(args.replay)
    except replay.ReplayError as e:
        raise UserError(str(e)) from None
    return runner.spec_from_args(None, overrides, base=dataclasses.asdict(base))


def _run_dir_arg(p: argparse.ArgumentParser) -> None:
    _strict_usage(p)
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder, e.g. results/latest")


@command("check", "re-run the checkers on a run folder from disk, rewrite results.json, print the verdict "
                  "(exit 0 valid, 1 invalid, 2 unknown)", _run_dir_arg)
def _check(args: argparse.Namespace) -> int:
    from harness import runner
    from core.history import HistoryError
    try:
        return runner.recheck(args.run_dir)
    except HistoryError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE


@command("report", "re-render a run folder's report.html and print its path", _run_dir_arg)
def _report(args: argparse.Namespace) -> int:
    from harness import runner
    from core.history import HistoryError
    from harness.report import ReportError
    try:
        print(runner.rereport(args.run_dir))
    except (HistoryError, ReportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    return 0


def _analyze_args(p: argparse.ArgumentParser) -> None:
    from spark_analysis import main as analysis
    analysis.add_arguments(p)


@command("analyze", "check and tabulate every run under results dirs in one Spark session: Parquet tables "
                    "and campaign.html under <out>/analysis/<time>/ (exit 0, skipped runs listed)", _analyze_args)
def _analyze(args: argparse.Namespace) -> int:
    from spark_analysis import main as analysis
    return analysis.run_args(args)


def _campaign_args(p: argparse.ArgumentParser) -> None:
    _strict_usage(p)
    p.add_argument("file", metavar="FILE.toml", help="a campaign file (axes, exclusions, overrides; see campaigns/)")
    p.add_argument("--only", default=None, metavar="PATTERN",
                   help="only the runs any of whose axis values (a workload, fault, bug knob, option, seed) "
                        "matches one of these comma-separated glob patterns")
    p.add_argument("--seeds", type=int, default=None, metavar="N", help="runs per entry (overrides the file's seeds)")
    p.add_argument("--results-dir", default="results", metavar="DIR",
                   help="the campaign folder goes to DIR/campaigns/<name>/<time>/ (default results)")
    p.add_argument("--resume", default=None, metavar="DIR",
                   help="go on with an interrupted campaign folder: only runs without a complete run folder made "
                        "with the settings the file gives now; --only, --shard and --seeds as the folder recorded")
    p.add_argument("--junit", default=None, metavar="FILE", help="also write the JUnit XML here")
    p.add_argument("--max-hours", type=float, default=None, metavar="H",
                   help="start no run that would end after H hours (the rest are reported as not run)")
    p.add_argument("--shard", default=None, metavar="K/N", help="run only the K-th of N disjoint slices")
    p.add_argument("--no-analyze", action="store_true", help="do not end with `pulsar-chaos analyze`")
    p.add_argument("--analyze-master", default=None, metavar="URL",
                   help="run the closing analysis on this Spark master (spark://host:7077, yarn, k8s://...; "
                        "default local mode); its executors must read the campaign folder (a shared filesystem)")


@command("campaign", "run every combination of a campaign file one after another; campaign folder, summary, "
                     "JUnit XML (exit 0 every expectation met, 1 one not met, 2 some unknown)", _campaign_args)
def _campaign(args: argparse.Namespace) -> int:
    from clusters.deploy.backend import ClusterError
    from harness import campaign_run
    from harness.campaign import CampaignError
    opts = campaign_run.Options(file=args.file, only=args.only, seeds=args.seeds, results_dir=args.results_dir,
                                resume=args.resume, junit=args.junit, max_hours=args.max_hours, shard=args.shard,
                                analyze=not args.no_analyze, analyze_master=args.analyze_master)
    try:
        return campaign_run.run(opts)
    except (CampaignError, ClusterError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE


def _detection_args(p: argparse.ArgumentParser) -> None:
    _strict_usage(p)
    p.add_argument("dirs", nargs="*", metavar="CAMPAIGN_DIR",
                   help="a campaign folder (results/campaigns/<name>/<time>), or the folders of its shards")
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of a markdown table")


@command("detection", "print a campaign's detection matrix as a markdown table, without Spark: per bug knob or "
                      "unsafe setting and scenario, detected/runs (target 4 of 5), anomaly types, mean time to "
                      "first detection, false alarms without it", _detection_args)
def _detection(args: argparse.Namespace) -> int:
    from harness import detection_table
    try:
        return detection_table.main(args.dirs, as_json=args.json)
    except detection_table.DetectionInputError as e:
        raise UserError(str(e)) from None


def _shrink_args(p: argparse.ArgumentParser) -> None:
    _strict_usage(p)
    p.add_argument("run_dir", metavar="RUN", help="a run folder that failed (verdict invalid), e.g. results/latest")
    p.add_argument("--tries", type=int, default=3, metavar="N",
                   help="runs of each candidate; it still fails when one shows the same anomaly (default 3)")
    p.add_argument("--verify", type=int, default=None, metavar="N",
                   help="rerun the minimal spec N times at the end to say how often it fails (default: --tries)")
    p.add_argument("--max-hours", type=float, default=None, metavar="H",
                   help="start no candidate that would end after H hours; the best so far is the result")
    p.add_argument("--results-dir", default="results", metavar="DIR",
                   help="the shrink folder goes to DIR/shrinks/<test>/<time>/ (default results)")
    p.add_argument("--resume", default=None, metavar="DIR",
                   help="go on with an interrupted shrink folder: no finished candidate is run again")


@command("shrink", "from a failing run, search for the smallest run that fails the same way (fewer faults, shorter "
                   "holds and run, less load); minimal.toml and shrink.html (exit 0 found, 2 the replay did not "
                   "fail, 254 nothing to shrink)", _shrink_args)
def _shrink(args: argparse.Namespace) -> int:
    from harness import shrink
    try:
        opts = shrink.Options(run=args.run_dir, tries=args.tries, max_hours=args.max_hours,
                              results_dir=args.results_dir, resume=args.resume, verify_tries=args.verify)
        return shrink.run(opts)
    except shrink.ShrinkError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE


def _serve_args(p: argparse.ArgumentParser) -> None:
    _strict_usage(p)
    p.add_argument("results_dir", nargs="?", default="results", metavar="RESULTS_DIR",
                   help="the results dir to browse (default results)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only; 0.0.0.0 shares it with the network)")


@command("serve", "browse every run and campaign under a results dir in a local, read-only web page", _serve_args)
def _serve(args: argparse.Namespace) -> int:
    import importlib.util
    from harness import serve
    if importlib.util.find_spec("flask") is None:
        raise UserError("serve needs Flask, which is not installed",
                        "run `make setup`, or pip install -e '.[serve]'")
    if not Path(args.results_dir).is_dir():
        raise UserError(f"{args.results_dir}: no such results dir", "give the folder runs were written to, e.g. results")
    if not 0 < args.port < 65536:
        raise UserError(f"--port {args.port} is not a TCP port", "use e.g. --port 8000")
    try:
        serve.serve(args.results_dir, args.host, args.port)
    except OSError as e:
        raise UserError(f"cannot listen on {args.host}:{args.port} ({e.strerror or e})",
                        "choose another --port, or stop what uses it") from None
    return 0


def _lin_args(p: argparse.ArgumentParser) -> None:
    _strict_usage(p)
    p.add_argument("file", metavar="FILE", help="a history: history.jsonl, Jepsen or Knossos EDN (op maps, a map "
                                                "a line or all in one vector) or a Jepsen log")
    p.add_argument("--model", required=True, metavar="MODEL",
                   help="register, cas-register, kv, fifo-queue, set, mutex or multi-register (aliases: queue, "
                        "lease)")
    p.add_argument("--initial", default=None, metavar="JSON",
                   help="the model's initial state, as Knossos's models take one: e.g. 0 for a register, "
                        "'{\"x\": 0, \"y\": 0}' for a multi-register, [1, 2] for a queue (default: nil / empty)")
    p.add_argument("--format", default="auto", choices=("auto", "jsonl", "jepsen-edn", "jepsen-log"))
    p.add_argument("--time-limit", type=float, default=None, metavar="S", help="give up (unknown) after S seconds")
    p.add_argument("--max-cache", type=int, default=None, metavar="N",
                   help="give up (unknown) past N cached configurations per key (default 2,000,000)")
    p.add_argument("--independent", action="store_true", default=None,
                   help="values are jepsen.independent [key value] tuples (detected when every op has one)")
    p.add_argument("--json", action="store_true", help="print the whole result as JSON")
    p.add_argument("--out", metavar="FILE.html", default=None, help="write the counterexample diagram here if invalid")


@command("lin", "check a history file for linearizability against a model (exit 0 valid, 1 invalid, "
                "2 unknown, 254 bad input)", _lin_args)
def _lin(args: argparse.Namespace) -> int:
    from checkers import jepsen_format, linear, models
    from core.history import HistoryError
    try:
        model = models.get(args.model)
        nemesis_ops: list[int] = []
        history = jepsen_format.read_history(args.file, args.format, nemesis=nemesis_ops)
    except (models.ModelError, HistoryError) as e:
        _usage_error(f"{e}" + ("" if "fix:" in str(e) else " (fix: pick one of those models with --model)"))
    from core.history import NEMESIS_PROCESS
    if not any(op.process != NEMESIS_PROCESS for op in history):
        # nothing to check: valid, as Knossos and Jepsen judge a history with no client op
        n = len(nemesis_ops)
        note = (f"no client op to check ({n} nemesis op{'s' if n != 1 else ''} only): a history with no "
                f"client op is linearizable")
        if args.json:
            print(json.dumps({"valid": True, "note": note, "stats": {"model": model.name, "client_ops": 0,
                                                                      "nemesis_ops": n}}, indent=1))
        else:
            print(f"valid: {note} ({model.name})")
        return 0
    opts: dict[str, Any] = {"model": model.name, "time_limit_s": args.time_limit, "independent": args.independent}
    if args.initial is not None:
        try:
            opts["initial"] = json.loads(args.initial)
        except ValueError as e:
            _usage_error(f"--initial {args.initial!r} is not JSON ({e}) (fix: e.g. --initial 0, --initial '\"a\"' "
                         f"or --initial '{{\"x\": 0}}')")
        try:
            model.initial(opts["initial"])
        except models.ModelError as e:
            _usage_error(f"--initial: {e} (fix: give the {model.name} model's state as JSON)")
    if args.max_cache is not None:
        opts["max_cache"] = args.max_cache
    r = linear.check(history, opts)
    if r.stats.get("input_error"):
        _usage_error(f"{args.file}: {r.stats['error']} (fix: check --model and --format)")
    ces = r.anomalies.get(linear.ANOMALY, [])
    if args.out and r.valid is False:
        from harness import lin_diagram
        try:
            with open(args.out, "w", encoding="utf-8") as f:
                f.write(lin_diagram.page(ces, f"{args.file}: not linearizable ({model.name})"))
        except OSError as e:
            _usage_error(f"{args.out}: cannot write the diagram ({e.strerror}) (fix: give a writable path)")
    if args.json:
        print(json.dumps(r.to_json(), indent=1, default=str))
    else:
        st = r.stats
        n = st["ops"]
        checked = n["ok"] + n["info"] + n["unfinished"]
        what = (f"{model.name}, {checked} op{'s' if checked != 1 else ''} checked: {n['ok']} ok, "
                f"{n['info'] + n['unfinished']} indeterminate ({n['fail']} failed, left out), "
                f"{st['partitions']} key{'s' if st['partitions'] != 1 else ''}, {st['seconds']} s")
        if r.valid is True:
            print(f"valid: linearizable ({what})")
        elif r.valid is False:
            ce = ces[0] if ces else {}
            key = f"key {ce.get('key')!r}: " if st["partitions"] > 1 else ""
            print(f"INVALID: not linearizable ({what}); {key}{ce.get('message', '')}"
                  + (f"; diagram: {args.out}" if args.out else ""))
        else:
            print(f"unknown: {st.get('reason', 'the search did not finish')} ({what})")
    return 0 if r.valid is True else 1 if r.valid is False else 2


# ------------------------------------------------------------------------------------ lb-sim

def _lb_sim_args(p: argparse.ArgumentParser) -> None:
    _strict_usage(p)
    p.add_argument("scenario", nargs="?", default=None,
                   help="a scenario name (`--list`) or a scenario file (TOML; clusters/loadbalancer/sim/scenario.py)")
    p.add_argument("--list", action="store_true", help="list the built-in scenarios, one a line, name first")
    p.add_argument("--load-manager", choices=("modular", "extensible", "both"), default="both",
                   help="which load manager's code to simulate (default both)")
    p.add_argument("--brokers", type=int, default=None, metavar="N", help="brokers (default: the scenario's)")
    p.add_argument("--bundles", type=int, default=None, metavar="N", help="initial bundles (default: the scenario's)")
    p.add_argument("--topics", type=int, default=None, metavar="N", help="topics (default: the scenario's)")
    p.add_argument("--publishers", type=int, default=None, metavar="N", help="publishers (default: the scenario's)")
    p.add_argument("--lb-setting", action="append", default=None, metavar="NAME=VALUE",
                   help="a load-balancer setting (repeatable); NAME=v1,v2,... runs once per value and tabulates")
    p.add_argument("--seed", type=int, default=1, metavar="N", help="random seed (default 1)")
    p.add_argument("--out", default=None, metavar="DIR", help="write lb-sim.json, index.html and the histories here")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


@command("lb-sim", "simulate the load balancer (the brokers' own load-manager code) at any scale in simulated time",
         _lb_sim_args)
def _lb_sim(args: argparse.Namespace) -> int:
    from clusters.loadbalancer.sim.scenario import ScenarioError
    from harness import lb_sim
    try:
        return lb_sim.main(args)
    except ScenarioError as e:
        raise UserError(f"scenario {e.where}: {e.problem}", e.fix) from None
    except lb_sim.LbSimError as e:
        raise UserError(e.message, e.fix) from None


# ------------------------------------------------------------------------------------ bugs

def _bugs_args(p: argparse.ArgumentParser) -> None:
    from clusters.bugs import COMPONENTS
    _strict_usage(p)
    p.add_argument("--component", default=None, metavar="NAME",
                   help=f"only the knobs of one component: {', '.join(COMPONENTS)}")
    p.add_argument("--json", action="store_true", help="print the knobs as a JSON list (with each one's help)")


def bug_lines(knobs: "list[tuple[str, Any]]") -> list[str]:
    """One line per knob: name, component, safe default, upstream issues, then the scenario that exposes
    it as a `pulsar-chaos run` command with the knob at its unsafe value."""
    if not knobs:
        return []
    wn = max(len(n) for n, _ in knobs)
    wc = max(len(k.component) for _, k in knobs)
    wi = max(len(",".join(k.issues) or "-") for _, k in knobs)
    out = []
    for name, k in knobs:
        default = json.dumps(k.default)
        turn = name if k.default is False else f"{name}={json.dumps(not k.default)}" if isinstance(
            k.default, bool) else f"{name}=VALUE"
        scenario = f"pulsar-chaos run {k.scenario} --bug {turn}" if k.scenario else "no scenario yet"
        out.append(f"{name:{wn}}  {k.component:{wc}}  default={default:5}  "
                   f"{','.join(k.issues) or '-':{wi}}  {scenario}")
    return out


@command("bugs", "list the reference system's bug knobs, one a line: name, component, safe default, upstream "
                 "issue(s), the scenario that exposes it", _bugs_args)
def _bugs(args: argparse.Namespace) -> int:
    from clusters import bugs
    if args.component is not None and args.component not in bugs.COMPONENTS:
        raise UserError(f"unknown component {args.component!r}", f"use one of {', '.join(bugs.COMPONENTS)}")
    knobs = [(n, k) for n, k in bugs.REGISTRY.items() if args.component in (None, k.component)]
    if args.json:
        print(json.dumps([k.to_json(n) for n, k in knobs], indent=1))
    else:
        for line in bug_lines(knobs):
            print(line)
    return 0


# ------------------------------------------------------------------------------------ plumbing

def _add_subcommands(parser: argparse.ArgumentParser, registry: dict[str, Subcommand], dest: str) -> None:
    subs = parser.add_subparsers(dest=dest, metavar="COMMAND", parser_class=_Parser)
    for sc in registry.values():
        p = subs.add_parser(sc.name, help=sc.help, description=sc.help)
        if sc.configure:
            sc.configure(p)
        p.set_defaults(handler=sc.run, parser=p)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pulsar-chaos", description="A Jepsen-style chaos harness for Pulsar-like systems.")
    _add_subcommands(parser, COMMANDS, "command")
    parser.set_defaults(handler=None, parser=parser)
    return parser


def _on_signal(signum: int, frame: Any) -> None:
    raise Terminated(signum)


def main(argv: list[str] | None = None) -> int:
    from harness import plugins
    try:
        plugins.load()                    # before the parser: --help lists what plugins registered
    except plugins.PluginError as ex:
        print(f"error: {ex}", file=sys.stderr)
        return EXIT_USAGE
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.handler is None:
        args.parser.print_help(sys.stderr)
        return EXIT_USAGE
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    from clusters.bugs import UnknownBugKnob
    from clusters.deploy.backend import ClusterError
    from clusters.zookeeper import ZooKeeperMissing
    from core.registry import UnknownName
    try:
        return args.handler(args) or 0
    except (UserError, ClusterError, ZooKeeperMissing, UnknownName) as ex:
        print(f"error: {ex}", file=sys.stderr)
        return EXIT_USAGE
    except UnknownBugKnob as ex:
        print(f"error: {ex} (fix: drop that --bug or use a known knob)", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Terminated as ex:
        print("terminated", file=sys.stderr)
        return 128 + (ex.args[0] if ex.args else signal.SIGTERM)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception:
        traceback.print_exc()
        print("error: pulsar-chaos crashed (the traceback above is a bug; please report it)", file=sys.stderr)
        return EXIT_CRASH


if __name__ == "__main__":
    sys.exit(main())
