"""The bug knobs: their registry (clusters/bugs.py), the one way a component receives and reads them
(`Knobs`), and `pulsar-chaos bugs`, which lists them."""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from clusters import bugs
from clusters.bugs import COMPONENTS, REGISTRY, Knob, KnobOfAnotherComponent, Knobs, UnknownBugKnob
from core.registry import Registry
from harness import cli

REPO = Path(__file__).resolve().parents[1]


def test_bare_key_means_true_and_values_parse():
    got = bugs.parse(["bookie.ack_before_fsync", "broker.recovery_fencing=false"])
    assert got == {"bookie.ack_before_fsync": True, "broker.recovery_fencing": False}


def test_defaults_are_safe():
    assert bugs.value({}, "bookie.ack_before_fsync") is False
    assert bugs.value(None, "broker.recovery_fencing") is True
    assert bugs.value({"broker.recovery_fencing": False}, "broker.recovery_fencing") is False


def test_unknown_knob_names_the_known_ones():
    with pytest.raises(bugs.UnknownBugKnob, match="known knobs: .*bookie.ack_before_fsync"):
        bugs.parse(["bookie.ack_befor_fsync"])
    with pytest.raises(bugs.UnknownBugKnob, match="bookie.ack_befor_fsync"):
        bugs.value({}, "bookie.ack_befor_fsync")


# ------------------------------------------------------------------------------------ the registry

def test_the_knobs_are_a_registry_of_declared_entries():
    assert isinstance(REGISTRY, Registry) and bugs.KNOBS is REGISTRY
    assert len(REGISTRY) >= 10
    for name, k in REGISTRY.items():
        assert k.component in COMPONENTS, name
        assert k.help and k.scenario, name
        assert all(re.fullmatch(r"apache/(pulsar|bookkeeper)#\d+", i) for i in k.issues), (name, k.issues)
    assert REGISTRY["broker.reactivate_on_release_failure"].issues[0] == "apache/pulsar#7517"
    assert REGISTRY["bookie.ack_before_fsync"].issues == ()          # models journalSyncData=false
    assert REGISTRY["broker.recovery_fencing"].component == "managed-ledger"
    assert {k.component for k in REGISTRY.values()} >= {"bookie", "managed-ledger", "broker", "load-balancer"}


def test_a_knob_entry_refuses_an_unknown_component_and_a_malformed_issue():
    with pytest.raises(ValueError, match="use one of bookie"):
        Knob(False, "x", component="bookies")
    with pytest.raises(ValueError, match="owner/repo#N"):
        Knob(False, "x", component="bookie", issues=("pulsar 7517",))
    with pytest.raises(ValueError, match="tuple"):
        Knob(False, "x", component="bookie", issues="apache/pulsar#1")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Knob(False, "x")                        # type: ignore[call-arg]  # a knob names its component


def test_a_plugin_knob_is_one_register_call_and_pulsar_chaos_bugs_lists_it(capsys):
    REGISTRY.register("broker.plugin_example", Knob(False, "an example", component="broker",
                                                    issues=("apache/pulsar#1",), scenario="--workload log"))
    try:
        assert Knobs({"broker.plugin_example": True}, "broker").on("broker.plugin_example")
        assert cli.main(["bugs", "--component", "broker"]) == 0
        line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("broker.plugin_example ")]
        assert len(line) == 1 and "apache/pulsar#1" in line[0]
        with pytest.raises(ValueError, match="already registered"):
            REGISTRY.register("broker.plugin_example", Knob(True, "again", component="broker"))
    finally:
        REGISTRY.unregister("broker.plugin_example")
    assert "broker.plugin_example" not in REGISTRY


# ------------------------------------------------------------------------------------ Knobs

def test_knobs_read_the_given_value_or_the_safe_default():
    k = Knobs({"broker.schema_no_cas": True, "bookie.ignore_fence": True}, "broker")
    assert k.on("broker.schema_no_cas") is True and k.value("broker.schema_no_cas") is True
    assert k.on("broker.dedup_pushed_only") is False
    assert Knobs(None, "managed-ledger").on("broker.recovery_fencing") is True
    assert Knobs({"broker.recovery_fencing": False}, "managed-ledger").on("broker.recovery_fencing") is False
    assert k.unsafe() == {"broker.schema_no_cas": True}       # bookie.ignore_fence is not the broker's


def test_knobs_refuse_a_misspelt_knob_and_one_of_another_component():
    k = Knobs({}, "broker")
    with pytest.raises(UnknownBugKnob, match="'broker.schema_nocas' read by the broker; its knobs: .*broker.schema_no_cas"):
        k.on("broker.schema_nocas")
    with pytest.raises(KnobOfAnotherComponent, match="belongs to the load-balancer, not the broker"):
        k.on("lb.shed_to_owner")
    assert k.of("load-balancer").on("lb.shed_to_owner") is False
    with pytest.raises(ValueError, match="unknown component 'brokers'"):
        Knobs({}, "brokers")


def test_of_hands_the_same_map_to_another_component():
    broker = Knobs({"lb.keep_preallocations": True}, "broker")
    lb = broker.of("load-balancer")
    assert lb.component == "load-balancer" and lb.on("lb.keep_preallocations")
    assert broker.of("broker") is broker


KNOB_READ = re.compile(r"knobs\.(?:on|value)\(\s*\"([^\"]+)\"")


def _reads() -> dict[str, list[str]]:
    """Every knob name read through a knobs object in clusters/, with the files reading it."""
    out: dict[str, list[str]] = {}
    for f in (REPO / "clusters").rglob("*.py"):
        for name in KNOB_READ.findall(f.read_text()):
            out.setdefault(name, []).append(str(f.relative_to(REPO)))
    return out


def test_every_knob_read_in_clusters_is_registered_and_every_registered_knob_is_read():
    reads = _reads()
    assert set(reads) - set(REGISTRY) == set(), "a knob read that no entry declares"
    assert set(REGISTRY) - set(reads) == set(), "a registered knob that nothing reads (it would do nothing)"


def test_no_component_reads_knobs_another_way():
    """The three old ways are gone from clusters/: `bugs.value(cfg.bugs, ...)`, `service.bug(...)`, flags."""
    for f in (REPO / "clusters").rglob("*.py"):
        if f.name == "bugs.py":
            continue
        text = f.read_text()
        assert not re.search(r"bugs\.value\(|\.bug\(\"|reactivate_on_failure|pushed_only=|cas=not ", text), f


def test_components_receive_their_knobs_at_construction(tmp_path):
    from clusters.bookie.server import Bookie
    from clusters.bookkeeper.client import BookKeeper
    from clusters.broker.managed_ledger import ManagedLedger
    from clusters.broker.service import BrokerService
    from clusters.config import BookieConfig, BrokerConfig
    on = {"bookie.ignore_fence": True, "lb.shed_to_owner": True, "broker.reactivate_on_release_failure": True,
          "broker.schema_no_cas": True, "broker.recovery_fencing": False}
    bookie = Bookie(BookieConfig(name="bookie-1", host="127.0.0.1", zk="", data_dir=str(tmp_path / "b"), bugs=on))
    assert bookie.knobs.component == "bookie" and bookie.ignore_fence is True
    assert Bookie(BookieConfig(name="bookie-2", host="127.0.0.1", zk="",
                               data_dir=str(tmp_path / "c"))).ignore_fence is False
    cfg = BrokerConfig(name="broker-1", host="127.0.0.1", zk="127.0.0.1:1", data_dir=str(tmp_path), bugs=on)
    svc = BrokerService(cfg)
    assert svc.knobs.component == "broker"
    assert svc.load_manager.lead.shed_to_owner is True and svc.load_manager.lead.keep_preallocations is False
    assert svc.ownership.knobs.on("broker.reactivate_on_release_failure")
    assert BrokerService(BrokerConfig(name="broker-2", host="127.0.0.1", zk="127.0.0.1:1",
                                      data_dir=str(tmp_path))).load_manager.lead.shed_to_owner is False
    # the BookKeeper client: the owner's map, seen as the client's; none (the harness's) is all safe
    assert BookKeeper(None, knobs=svc.knobs).knobs.component == "bookkeeper-client"  # type: ignore[arg-type]
    assert BookKeeper(None).knobs.unsafe() == {}                                     # type: ignore[arg-type]
    ml = ManagedLedger("public/default/persistent/t", None, None, cfg)               # type: ignore[arg-type]
    assert ml.knobs.on("broker.recovery_fencing") is False


# ------------------------------------------------------------------------------------ pulsar-chaos bugs

def _turn_on(name: str) -> str:
    d = REGISTRY[name].default
    return name if d is False else f"{name}={json.dumps(not d)}"


def test_pulsar_chaos_bugs_lists_every_knob_one_a_line_name_first(capsys):
    assert cli.main(["bugs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in lines] == list(REGISTRY)
    for ln, (name, k) in zip(lines, REGISTRY.items()):
        fields = ln.split()
        assert fields[1] == k.component and fields[2] == f"default={json.dumps(k.default)}"
        assert fields[3] == (",".join(k.issues) or "-")
        assert ln.endswith(f"pulsar-chaos run {k.scenario} --bug {_turn_on(name)}")
    fencing = next(ln for ln in lines if ln.startswith("broker.recovery_fencing "))
    assert "managed-ledger" in fencing and "default=true" in fencing and fencing.endswith("=false")


def test_pulsar_chaos_bugs_filters_by_component_and_prints_json(capsys):
    assert cli.main(["bugs", "--component", "load-balancer"]) == 0
    names = [ln.split()[0] for ln in capsys.readouterr().out.splitlines()]
    assert names == ["lb.shed_to_owner", "lb.keep_preallocations", "lb.no_version_check",
                     "lb.tombstone_split_parent", "lb.ignore_existing_assigning", "lb.metadata_table_view_stale_cache"]
    assert cli.main(["bugs", "--json", "--component", "bookie"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert [g["name"] for g in got] == ["bookie.ack_before_fsync", "bookie.ignore_fence", "bookie.no_cookie",
                                        "bookie.no_limbo", "bookie.write_after_delete_accepted",
                                        "bk.corrupt_log_says_nosuchentry"]
    assert got[0] == {"name": "bookie.ack_before_fsync", "component": "bookie", "default": False, "issues": [],
                      "scenario": REGISTRY["bookie.ack_before_fsync"].scenario,
                      "help": REGISTRY["bookie.ack_before_fsync"].help}
    assert cli.main(["bugs", "--json"]) == 0
    assert [g["name"] for g in json.loads(capsys.readouterr().out)] == list(REGISTRY)


def test_pulsar_chaos_bugs_with_an_unknown_component_is_a_one_line_usage_error(capsys):
    assert cli.main(["bugs", "--component", "zookeeper"]) == 254
    out = capsys.readouterr()
    assert out.out == ""
    err = out.err.strip().splitlines()
    assert len(err) == 1 and "unknown component 'zookeeper'" in err[0] and "(fix: " in err[0]
    assert all(c in err[0] for c in COMPONENTS)


def _detection_rows() -> list:
    from harness.campaign import load
    c = load(REPO / "campaigns" / "detection.toml")
    return [e.spec(e.label, "r") for e in c.entries]


FIELDS = ("workload", "nemesis", "nemesis_interval", "time_limit", "options", "brokers", "topics", "lb_settings",
          "broker_settings", "bookie_settings")


def _fields(spec) -> dict:
    out = {f: getattr(spec, f) for f in FIELDS}
    for table in ("lb_settings", "broker_settings", "bookie_settings"):      # the --*-setting flags give text
        out[table] = {k: str(v) for k, v in out[table].items()}
    return out


@pytest.mark.parametrize("name", list(REGISTRY))
def test_each_knobs_scenario_is_a_valid_run_that_expects_it_invalid_and_is_its_detection_row(name):
    """The scenario `pulsar-chaos bugs` prints parses as `pulsar-chaos run` arguments, the run is expected
    invalid because of the knob (and valid without it), and campaigns/detection.toml runs that same
    configuration with the knob."""
    from harness.catalog import CATALOG
    argv = ["run", *shlex.split(REGISTRY[name].scenario)]
    with_knob = cli.run_spec(cli.build_parser().parse_args([*argv, "--bug", _turn_on(name)]))
    exp = with_knob.expectation(CATALOG)
    # the scenario's own unsafe settings (clusters/unsafe_settings.py: B12's ack quorum 1), which its
    # detection row without the knob declares valid
    without = cli.run_spec(cli.build_parser().parse_args(argv)).expectation(CATALOG)
    own = [c.label for c in without.causes if c.kind == "unsafe setting"]
    assert [c.kind for c in without.causes] == ["unsafe setting"] * len(own)
    assert exp.expected == "invalid" and [lab.split("=")[0] for lab in exp.labels if lab not in own] == [name]
    assert without.expected == ("invalid" if own else "valid")
    mine = _fields(with_knob)
    rows = [_fields(s) for s in _detection_rows() if name in s.bugs]
    assert rows, f"{name} has no row in campaigns/detection.toml"
    assert mine in rows, (mine, rows)
