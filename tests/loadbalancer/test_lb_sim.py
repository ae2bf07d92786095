"""The load-balancer simulator (clusters/loadbalancer/sim): the event core, scenarios and their one-line
errors, the invariants of a tiny scenario with each load manager, that the simulator runs the load
managers' own code (change a strategy, the result changes; no strategy defined twice), and that the
placement's namespace index gives the decisions the full scan gives."""
from __future__ import annotations

import ast
import dataclasses
import random
from pathlib import Path

import pytest

from clusters.loadbalancer import placement, shedding
from clusters.loadbalancer.data import BundleData, LoadData, NamespaceBundleStats
from clusters.loadbalancer.modular_leader import ModularLeader
from clusters.loadbalancer.settings import LoadBalancerSettings
from clusters.loadbalancer.sim import run, scenario
from clusters.loadbalancer.sim.events import Server, Sim
from tests.loadbalancer.helpers import broker

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------ event core

def test_events_run_in_time_order_and_ties_in_scheduling_order():
    sim, seen = Sim(), []
    sim.at(30, seen.append, "c")
    sim.at(10, seen.append, "a1")
    sim.at(10, seen.append, "a2")
    sim.after(20, seen.append, "b")
    assert sim.run(25) == 3
    assert seen == ["a1", "a2", "b"] and sim.now_ms == 25
    sim.run(100)
    assert seen[-1] == "c" and sim.now_ms == 100


def test_cancelled_and_periodic_events():
    sim, seen = Sim(), []
    h = sim.at(5, seen.append, "x", handle=True)
    h.cancel()
    ticks = []
    sim.every(10, lambda: ticks.append(sim.now_ms) or len(ticks) < 3)
    sim.run(1000)
    assert seen == [] and ticks == [10, 20, 30]


def test_a_negative_delay_is_refused_and_a_runaway_model_stops():
    sim = Sim(max_events=100)
    with pytest.raises(ValueError):
        sim.after(-1, print)

    def loop() -> None:
        sim.after(0, loop)
    sim.after(0, loop)
    with pytest.raises(RuntimeError, match="more than 100 events"):
        sim.run(10)


def test_server_serves_one_at_a_time():
    sim, done = Sim(), []
    q = Server(sim, 5.0)
    for i in range(3):
        q.submit(lambda i=i: done.append((i, sim.now_ms)))
    sim.run(100)
    assert done == [(0, 5), (1, 10), (2, 15)] and q.max_wait_ms == 10


def test_the_same_seed_gives_the_same_run_and_another_seed_another():
    sc = scenario.BUILTIN["tiny"]
    a = run.outcomes(run.simulate(sc, "modular", seed=3), 0)
    b = run.outcomes(run.simulate(sc, "modular", seed=3), 0)
    c = run.outcomes(run.simulate(sc, "modular", seed=4), 0)
    strip = ("wall_s", "max_rss_mb")
    assert {k: v for k, v in a.items() if k not in strip} == {k: v for k, v in b.items() if k not in strip}
    assert a["topics_per_broker"] != c["topics_per_broker"] or a["lookups"] != c["lookups"]


# ------------------------------------------------------------------------------------------ scenarios

def test_list_starts_with_the_seeds_four():
    assert list(scenario.BUILTIN)[:4] == ["reconnect-storm", "restart-latency", "scale-in-out", "hot-spot-split"]
    big = scenario.BUILTIN["reconnect-storm"]
    assert (big.brokers, big.bundles, big.publishers) == (100, 60_000, 100_000)


@pytest.mark.parametrize("text,where", [
    ('brokers = 3\n', "name"),
    ('name = "x"\nbrokers = "three"\n', "brokers"),
    ('name = "x"\nbrokerz = 3\n', "brokerz"),
    ('name = "x"\n[[events]]\nat_s = 1\nkind = "explode"\n', "events[0].kind"),
    ('name = "x"\nduration_s = 10\n[[events]]\nat_s = 20\nkind = "leave"\n', "events[0].at_s"),
    ('name = "x"\n[settings]\nloadBalancerFoo = 1\n', "settings"),
    ('name = "x"\n[params]\ntopic_load = 1\n', "params"),
    ('name = "x"\nbundles = 1\nnamespaces = 2\n', "bundles"),
    ('name = "x"\n[[events]]\nat_s = 1\nkind = "leave"\nfraction = 2\n', "events[0].fraction"),
    ('name = [', None),
])
def test_a_malformed_scenario_file_is_one_line_naming_the_field_and_the_fix(tmp_path, text, where):
    f = tmp_path / "s.toml"
    f.write_text(text)
    with pytest.raises(scenario.ScenarioError) as e:
        scenario.load(f)
    msg = str(e.value)
    assert "\n" not in msg and "(fix: " in msg
    if where:
        assert e.value.where == where


def test_a_scenario_file_runs(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text('name = "mine"\nbrokers = 4\ninitial_brokers = 2\nbundles = 8\ntopics = 30\npublishers = 30\n'
                 'duration_s = 60\nmsg_rate = 300\n[[events]]\nat_s = 20\nkind = "join"\ncount = 2\n'
                 '[params]\nnic_mbytes = 0.01\n')
    sc = scenario.load(f)
    c = run.simulate(sc, "extensible")
    assert len(c.live()) == 4 and c.connected_pubs == 30


# ------------------------------------------------------------------------------------------ invariants

@pytest.mark.parametrize("lm", ["modular", "extensible"])
def test_tiny_scenario_invariants(lm):
    sc = scenario.BUILTIN["tiny"]
    c = run.simulate(sc, lm)
    o = run.outcomes(c, 0)
    # every publisher is connected at the end, each topic on its bundle's owner, each bundle owned once
    assert o["publishers_connected_end"] == o["publishers"] == 40
    for t in range(len(c.t_name)):
        b = c.bundles[c.t_bundle[t]]
        assert c.t_broker[t] == b.owner and c.brokers[b.owner].up
    owners = {}
    for name, br in c.brokers.items():
        for bundle in br.bundles:
            assert bundle not in owners, f"{bundle} owned by {owners.get(bundle)} and {name}"
            owners[bundle] = name
    # the restart disconnected some publishers and they came back
    assert o["reconnect_s"] is not None and 0 < o["reconnect_s"] < 60
    # the history is in the LB_EVENT shape and the balance checker reads it
    hist = run.history(c)
    reports = [op for op in hist if op.f == "lb-event" and op.value["event"] == "load-report"]
    assert reports and all(isinstance(op.value["mono_ns"], int) for op in reports)
    assert [op.time_ns for op in hist] == sorted(op.time_ns for op in hist)


def test_extensible_channel_ends_consistent_with_the_owners():
    c = run.simulate(scenario.BUILTIN["tiny"], "extensible")
    for name, b in c.bundles.items():
        if b.owner is not None:
            assert c.view.is_owner(name, b.owner)


def test_scale_in_out_is_judged_by_the_balance_checker():
    from harness import lb_sim
    sc = scenario.BUILTIN["small-6-3-6"]
    c = run.simulate(sc, "modular", seed=2)
    j = lb_sim.judge(run.history(c))
    assert len(j["events"]) == 2 and j["unloads"] > 0
    # and the scale-in emptied half the brokers while the scale-out filled them again
    assert len(c.live()) == 6 and all(c.brokers[b].topics > 0 for b in c.live())


# ------------------------------------------------------------------------------------------ the validation model

def test_counting_noise_is_relatively_smaller_at_higher_rates():
    """A report counts bytes over one interval: the noise's variance grows with the rate (a Poisson
    count of D-KB lumps), so the relative noise falls as 1 / sqrt(rate); a constant relative noise would
    give both rates the same relative spread."""
    from clusters.loadbalancer.sim.cluster import counted_noise
    rng = random.Random(7)
    zs = [rng.gauss(0, 1) for _ in range(4000)]

    def rel_sd(kb_s: float) -> float:
        xs = [counted_noise(kb_s, z, 0.1, 1.0) / kb_s for z in zs]
        m = sum(xs) / len(xs)
        return (sum((x - m) ** 2 for x in xs) / len(xs)) ** 0.5
    low, high = rel_sd(1.0), rel_sd(100.0)
    assert low == pytest.approx(0.1 ** 0.5, rel=0.1)           # sqrt(D x / T) / x at 1 KB/s
    assert high == pytest.approx(low / 10, rel=0.1)             # 100x the rate: a tenth of the relative noise
    assert counted_noise(2.0, 0.5, 0.0, 1.0) == 2.0             # off: the rate as it is
    assert counted_noise(0.1, -10.0, 1.0, 1.0) == 0.0           # never below zero
    assert counted_noise(4.0, 1.0, 1.0, 4.0) == pytest.approx(5.0)   # a 4-s report counts 4x the bytes


def _quiet(sc: scenario.Scenario, **params: float) -> scenario.Scenario:
    """No events, no shedding: the topics' load stays where it was placed."""
    return dataclasses.replace(sc, events=(), duration_s=40, params={**sc.params, **params},
                               settings={**sc.settings, "loadBalancerSheddingEnabled": False})


def test_reports_carry_counting_noise_only_when_asked():
    sc = scenario.BUILTIN["small-6-3-6"]
    for lm in ("modular", "extensible"):
        steady = run.simulate(_quiet(sc, report_noise_kb=0.0, system_msg_overhead_bytes=0), lm)
        noisy = run.simulate(_quiet(sc, report_noise_kb=0.1, system_msg_overhead_bytes=0), lm)
        # the last 10 s: every topic connected long since, no unloads while the grace period holds them
        def spread(c):
            return max(max(u for t, u in s if t > 30) - min(u for t, u in s if t > 30)
                       for s in c.load_series.values() if s)
        assert spread(steady) < 1e-9, lm
        assert spread(noisy) > 0.02, lm


def test_the_extensible_leader_carries_the_system_topics_traffic():
    """Our extensible brokers' load data, top bundles and channel are topics the leader owns: every
    broker's load data reaches every broker through it, which at a test's few KB/s is more than its own
    topics (measured on our cluster: bench/README.md "Validation against our real cluster")."""
    sc = scenario.BUILTIN["small-6-3-6"]

    def means(c):
        return {b: sum(u for t, u in s if t > 20) / sum(1 for t, _ in s if t > 20) for b, s in c.load_series.items()}
    on = run.simulate(_quiet(sc, report_noise_kb=0, system_msg_overhead_bytes=34), "extensible")
    off = run.simulate(_quiet(sc, report_noise_kb=0, system_msg_overhead_bytes=0), "extensible")
    assert on.leader == off.leader
    m_on, m_off = means(on), means(off)
    assert m_on[on.leader] > m_off[on.leader] + 0.15
    for b in m_on:
        if b != on.leader:
            assert m_on[b] == pytest.approx(m_off[b], abs=1e-6)
    # and the modular load manager's reports go to ZooKeeper: no such traffic whatever the setting
    mod = run.simulate(_quiet(sc, report_noise_kb=0, system_msg_overhead_bytes=34), "modular")
    assert all(b.sys_acc_in == 0 for b in mod.brokers.values())


def test_a_random_leave_draws_the_brokers_with_the_seed():
    base = scenario.BUILTIN["small-6-3-6"]
    last = dataclasses.replace(base, events=(scenario.Event(at_s=10, kind="leave", count=3),), duration_s=20)
    drawn = dataclasses.replace(last, events=(scenario.Event(at_s=10, kind="leave", count=3, random=True),))
    gone = set()
    for seed in range(1, 7):
        c = run.simulate(last, "modular", seed=seed)
        assert [c.brokers[b].name for b in c.order if not c.brokers[b].up] == ["broker-4", "broker-5", "broker-6"]
        c = run.simulate(drawn, "modular", seed=seed)
        left = [c.brokers[b].name for b in c.order if not c.brokers[b].up]
        assert len(left) == 3
        gone.add(tuple(left))
    assert len(gone) > 1 and any("broker-1" in g for g in gone)      # the first leader leaves in some seeds


def test_a_scenario_files_random_must_be_a_boolean(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text('name = "x"\n[[events]]\nat_s = 1\nkind = "leave"\nrandom = "yes"\n')
    with pytest.raises(scenario.ScenarioError) as e:
        scenario.load(f)
    assert e.value.where == "events[0].random"
    f.write_text('name = "x"\n[[events]]\nat_s = 1\nkind = "leave"\nrandom = true\n')
    assert scenario.load(f).events[0].random is True


def test_a_moved_topic_shows_in_the_stats_from_the_next_recomputation():
    """Our brokers recompute rates every RATE_INTERVAL_S; with stats_interval_ms the simulator's stats
    lag the same way: nothing before the first recomputation after a topic connected, then the part of
    that interval it was connected for; exact stats (0) show every connected topic at once."""
    from clusters.broker.service import RATE_INTERVAL_S
    sc = scenario.BUILTIN["small-6-3-6"]
    assert sc.params["stats_interval_ms"] == RATE_INTERVAL_S * 1000
    c = run.simulate(dataclasses.replace(sc, events=(), duration_s=12), "modular")
    c.stats_at = 10_000
    c.t_conn[0] = 12_000
    assert c.stats_weight(0) == 0.0
    c.t_conn[0] = 7_500
    assert c.stats_weight(0) == pytest.approx(0.5)
    c.t_conn[0] = 1_000
    assert c.stats_weight(0) == 1.0
    c.stats_ms = 0
    c.t_conn[0] = 12_000
    assert c.stats_weight(0) == 1.0
    # in a run, 6 s in (the topics connected in the first second, one recomputation since, at 5 s): a
    # broker's stats show part of its topics' rates, while its bandwidth carries every connected one
    c = run.simulate(dataclasses.replace(_quiet(sc, report_noise_kb=0), duration_s=6), "modular")
    lagging = 0
    for br in c.brokers.values():
        shown = sum(c.bundle_stats(c.bundles[b]).msgRateIn for b in br.bundles)
        mine = [t for t in range(len(c.t_name)) if c.t_broker[t] == br.id]
        assert shown == pytest.approx(sum(c.t_rate[t] * min(1.0, max(0, c.stats_at - c.t_conn[t]) / 5000)
                                          for t in mine if c.t_conn[t] <= c.stats_at))
        assert br.rate_in == pytest.approx(sum(c.t_rate[t] for t in mine))
        lagging += shown < br.rate_in - 1e-9
    assert lagging > 0


def test_recomputed_rates_are_counts_as_noisy_as_the_reports():
    """A bundle's rate, recomputed over 5 s, is a count too: with report_noise_kb each recomputation
    draws its own factor (so the top bundles change, as our brokers' do), without it the rate stays."""
    sc = scenario.BUILTIN["small-6-3-6"]
    for d, moves in ((0.1, True), (0.0, False)):
        c = run.simulate(_quiet(sc, report_noise_kb=d), "modular", seed=3)
        b = max(c.bundles.values(), key=lambda x: len(x.topics))
        seen = set()
        for _ in range(4):
            c.sim.run(c.sim.now_ms + 5000)
            seen.add(round(c.bundle_stats(b).msgRateIn, 9))
        assert (len(seen) > 1) is moves


def test_the_extensible_wrapper_is_mirrored_as_the_broker_does_it():
    """What our broker does around the extensible core, the simulator does too: the same republish
    window after a join; a new leader forgets recent unloads and has every broker push its load data;
    only a shed bundle's source is held back (extensible_manager.py's shed)."""
    from clusters.loadbalancer import extensible_manager
    from clusters.loadbalancer.sim import extensible as sim_ext
    assert sim_ext.REPUBLISH_ON_JOIN_S == extensible_manager.REPUBLISH_ON_JOIN_S
    only_dest = 0
    for seed in range(1, 6):
        c = run.simulate(scenario.BUILTIN["small-6-3-6"], "extensible", seed=seed)
        sources = {e["source"] for _, e in c.lb_events if e["event"] == "unload"}
        dests = {e["destination"] for _, e in c.lb_events if e["event"] == "unload"}
        assert set(c.recent_brokers) <= sources
        only_dest += len(dests - sources)
    assert only_dest            # some destination never a source: never held back
    c.recent_brokers["x"] = c.recent_bundles["y"] = 1
    c.leader = "gone"
    c._elect()
    assert not c.recent_brokers and not c.recent_bundles and c.push == set(c.live())


# ------------------------------------------------------------------------------------------ the brokers' code

def test_changing_a_strategy_changes_the_simulators_result(monkeypatch):
    """The simulator places bundles with placement.py's strategy: a strategy that always picks the
    first candidate puts every bundle on one broker, and the simulator shows it."""
    sc = dataclasses.replace(scenario.BUILTIN["tiny"], events=(),
                             settings={"loadBalancerDistributeBundlesEvenlyEnabled": False})
    before = run.simulate(sc, "modular")
    assert sum(1 for b in before.live() if before.brokers[b].bundles) > 1

    def first(self, candidates, bundle_data, load_data, settings, rng):
        return candidates[0], {}, candidates[:1]
    monkeypatch.setattr(placement.LeastLongTermMessageRate, "select", first)
    after = run.simulate(sc, "modular")
    assert [b for b in after.live() if after.brokers[b].bundles] == [after.live()[0]]


def test_changing_the_extensible_assignment_changes_the_simulators_result(monkeypatch):
    from clusters.loadbalancer.extensible import load_data
    sc = dataclasses.replace(scenario.BUILTIN["tiny"], events=())
    before = run.simulate(sc, "extensible")
    assert sum(1 for b in before.live() if before.brokers[b].bundles) > 1
    monkeypatch.setattr(load_data, "pick_least_usage", lambda cands, usage, settings, rng: (cands[-1], cands[-1:]))
    after = run.simulate(sc, "extensible")
    assert [b for b in after.live() if after.brokers[b].bundles] == [after.live()[-1]]


STRATEGY_NAMES = {"LeastLongTermMessageRate", "LeastResourceUsageWithWeight", "ThresholdShedder", "OverloadShedder",
                  "UniformLoadShedder", "TransferShedder", "SplitScheduler", "ChannelView", "ModularLeader",
                  "BrokerLoadData", "LocalBrokerData"}
STRATEGY_FUNCS = {"select_broker", "plan_shedding", "bundles_to_split", "handle_event", "resolve", "get_owner",
                  "top_k_bundles", "need_broker_data_update", "need_broker_load_data_update", "monitor_ownerships"}


def test_no_strategy_is_defined_twice():
    """The simulator's package defines none of the load managers' classes or decision functions: it
    imports them."""
    sim_dir = REPO / "clusters" / "loadbalancer" / "sim"
    defined = set()
    for f in sim_dir.glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                defined.add(node.name)
    assert defined & (STRATEGY_NAMES | STRATEGY_FUNCS) == set()
    imported = set()
    for f in sim_dir.glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("clusters.loadbalancer"):
                imported |= {a.name for a in node.names}
    assert {"ModularLeader", "TransferShedder", "SplitScheduler", "ChannelView", "handle_event",
            "select_broker"} <= imported


# ------------------------------------------------------------------------------------------ the index

def _random_load_data(rng: random.Random, brokers: int, namespaces: int) -> LoadData:
    ld = LoadData()
    reports = {}
    for i in range(brokers):
        stats = {}
        for _ in range(rng.randrange(0, 12)):
            ns = f"t/ns{rng.randrange(namespaces)}"
            lo = rng.randrange(0, 1 << 31)
            s = NamespaceBundleStats(msgRateIn=rng.random() * 100, msgThroughputIn=rng.random() * 1e5,
                                     topics=rng.randrange(1, 5))
            stats[f"{ns}/0x{lo:08x}_0x{lo + 1:08x}"] = s
        reports[f"b{i}"] = broker(cpu_percent=rng.random() * 90, bundles=stats)
    ld.update_all_broker_data(reports)
    ld.update_bundle_data()
    return ld


@pytest.mark.parametrize("seed", range(5))
def test_the_leaders_namespace_index_places_as_the_full_scan(seed):
    """ModularLeader.select with its index (and the preallocation sums' cache) chooses what
    select_broker with LoadData.namespace_bundle_counts chooses, placement after placement."""
    rng = random.Random(seed)
    settings = LoadBalancerSettings()
    regs = {}
    ld0 = _random_load_data(rng, 6, 3)
    for b, bd in ld0.brokers.items():
        regs[b] = bd.local
    lead = ModularLeader(settings, random.Random(seed))
    lead.refresh(regs)
    ref = LoadData()
    ref.update_all_broker_data(dict(regs))
    ref.update_bundle_data()
    ref_rng = random.Random(seed)
    strat = placement.make_placement_strategy(settings)
    for i in range(60):
        bundle = f"t/ns{i % 3}/0x{0x90000000 + i:08x}_0x{0x90000001 + i:08x}"
        got = lead.select(bundle)
        want = placement.select_broker(bundle, sorted(regs), ref, settings, ref_rng, strategy=strat)
        assert got.broker == want.broker, i
        assert lead.namespace_counts(f"t/ns{i % 3}") == {k: v for k, v in ref.namespace_bundle_counts(
            f"t/ns{i % 3}").items() if v or k in lead.namespace_counts(f"t/ns{i % 3}")}


def test_shedding_destination_with_the_index_is_the_same():
    rng = random.Random(7)
    ld = _random_load_data(rng, 5, 2)
    settings = LoadBalancerSettings()
    index = {ns: ld.namespace_bundle_counts(ns) for ns in ("t/ns0", "t/ns1")}
    a = shedding.placement_destination(ld, settings, random.Random(1))
    b = shedding.placement_destination(ld, settings, random.Random(1), counts=lambda ns: index[ns])
    for bundle in sorted(ld.bundles):
        assert a(bundle).broker == b(bundle).broker


def test_preallocation_sums_follow_every_change():
    from clusters.loadbalancer.data import PreallocatedBundles, preallocated_sums
    p = PreallocatedBundles()
    d1, d2 = BundleData.new_default(), BundleData.new_default()
    d2.topics = 3
    assert preallocated_sums(p) == (0, 0)
    p["a"] = d1
    assert preallocated_sums(p) == (100.0, 0)
    p["b"] = d2
    assert preallocated_sums(p) == (200.0, 3)
    del p["a"]
    assert preallocated_sums(p) == (100.0, 3)
    p.pop("b")
    assert preallocated_sums(p) == (0, 0)


# ------------------------------------------------------------------------------------------ the command

def _cli(argv, capsys):
    from harness.cli import main
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_shows_progress_in_simulated_and_wall_time(capsys):
    rc, out, err = _cli(["lb-sim", "tiny", "--load-manager", "extensible"], capsys)
    assert rc == 0 and "simulated 120/120 s, wall " in err and "40/40 publishers connected" in err
    assert out.startswith("tiny  extensible: ")


def test_cli_lists_one_scenario_a_line_the_seeds_first(capsys):
    rc, out, _ = _cli(["lb-sim", "--list"], capsys)
    assert rc == 0
    assert [line.split()[0] for line in out.splitlines()][:4] == list(scenario.BUILTIN)[:4]


@pytest.mark.parametrize("argv,needle", [
    (["lb-sim", "no-such"], "no scenario"),
    (["lb-sim", "tiny", "--lb-setting", "loadBalancerFoo=1"], "loadBalancerFoo"),
    (["lb-sim", "tiny", "--lb-setting", "loadBalancerSheddingIntervalMinutes"], "NAME=VALUE"),
    (["lb-sim", "tiny", "--lb-setting", "loadBalancerEnabled=maybe"], "loadBalancerEnabled"),
    (["lb-sim", "tiny", "--brokers", "0"], "--brokers"),
    (["lb-sim"], "no scenario"),
])
def test_cli_bad_input_is_one_line_and_exit_254(capsys, argv, needle):
    rc, out, err = _cli(argv, capsys)
    assert rc == 254
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_cli_sweep_tabulates_one_run_per_value_and_writes_json_and_html(capsys, tmp_path):
    import json
    rc, out, _ = _cli(["lb-sim", "tiny", "--load-manager", "modular", "--quiet", "--out", str(tmp_path),
                       "--lb-setting", "loadBalancerReportUpdateMinIntervalMillis=1000,5000"], capsys)
    assert rc == 0
    lines = [line for line in out.splitlines() if line.startswith("tiny")]
    assert len(lines) == 2 and "=1000" in lines[0] and "=5000" in lines[1]
    data = json.loads((tmp_path / "lb-sim.json").read_text())
    assert [r["settings"] for r in data["results"]] == [{"loadBalancerReportUpdateMinIntervalMillis": "1000"},
                                                         {"loadBalancerReportUpdateMinIntervalMillis": "5000"}]
    page = (tmp_path / "index.html").read_text()
    assert "<svg" in page and "http" not in page.replace("http://www.w3.org/2000/svg", "")
    assert (tmp_path / "modular-loadBalancerReportUpdateMinIntervalMillis=1000" / "journals" / "lb-events.jsonl").exists()


def test_serve_lists_simulations_beside_runs(capsys, tmp_path):
    from harness import serve
    rc, _, _ = _cli(["lb-sim", "tiny", "--quiet", "--out", str(tmp_path / "sims" / "tiny-1")], capsys)
    assert rc == 0
    page = serve.index_page(tmp_path)
    assert "<h2>Simulations</h2>" in page and "sims/tiny-1/index.html" in page
    assert "modular: " in page and "extensible: " in page
    assert serve.find_simulations(tmp_path / "sims" / "tiny-1" / "modular") == []


def test_channel_view_order_follows_every_key_change():
    """ChannelView keeps its sorted keys until a key comes or goes: items() and iteration stay sorted
    through assignments, updates, tombstones and rejected messages."""
    from clusters.loadbalancer.extensible.state import S, ChannelView, ServiceUnitStateData
    rng = random.Random(5)
    v = ChannelView()
    for i in range(400):
        key = f"t/ns/0x{rng.randrange(40):08x}_0x{rng.randrange(40, 80):08x}"
        cur = v.get(key)
        r = rng.random()
        if r < 0.2:
            v.apply(key, None)
        elif cur is None:
            v.apply(key, ServiceUnitStateData(S.Owned, "b1", None, None, False, i, 1))
        else:
            v.apply(key, ServiceUnitStateData(S.Releasing, None, cur.dstBroker, None, False, i, cur.versionId + 1)
                    if cur.state == S.Owned else ServiceUnitStateData(S.Owned, "b2", None, None, True, i,
                                                                     cur.versionId + 1))
        assert v.items() == sorted(v.data.items())
        assert list(v) == sorted(v.data)


SMALL = {"reconnect-storm": dict(brokers=10, bundles=60, topics=100, publishers=100),
         "restart-latency": dict(brokers=5, bundles=20, topics=100, publishers=100),
         "scale-in-out": dict(brokers=6, bundles=20, topics=120, publishers=120),
         "hot-spot-split": dict(brokers=4, bundles=1, topics=300, publishers=300)}


@pytest.mark.parametrize("lm", ["modular", "extensible"])
@pytest.mark.parametrize("name", list(SMALL))
def test_the_seeds_scenarios_keep_their_invariants_at_a_small_scale(name, lm):
    sc = scenario.BUILTIN[name].scaled(**SMALL[name])
    c = run.simulate(sc, lm)
    o = run.outcomes(c, 0)
    # every publisher is back, each topic on its bundle's live owner, no bundle owned twice
    assert o["publishers_connected_end"] == o["publishers"]
    for t in range(len(c.t_name)):
        b = c.bundles[c.t_bundle[t]]
        assert c.t_broker[t] == b.owner and c.brokers[b.owner].up
    seen: set[str] = set()
    for br in c.brokers.values():
        assert not (br.bundles & seen)
        seen |= br.bundles
    # each namespace's bundles still partition the hash range
    for ns, lows in c.bounds.items():
        ups = c.uppers[ns]
        assert lows[0] == 0 and ups[-1] == 0xFFFFFFFF and lows[1:] == ups[:-1]
    if lm == "extensible":
        for bname, b in c.bundles.items():
            assert b.owner is None or c.view.is_owner(bname, b.owner)
    # the scenario's own figure exists
    if sc.metric == "reconnect":
        assert o["reconnect_s"] is not None and o["reconnect_s"] > 0
    elif sc.metric == "p9999":
        assert o["p9999_ms"] is not None and o["p9999_ms"] > c.p.publish_ms
    elif sc.metric == "balance":
        assert [e["event"] for e in o["settle"]] == ["leave", "join"] and len(c.live()) == sc.brokers
    else:
        assert o["splits"] > 0 and len(c.bundles) > 1


def test_a_brokers_own_capacity_changes_its_load_and_is_checked(tmp_path):
    f = tmp_path / "cap.toml"
    f.write_text('name = "cap"\nbrokers = 2\nbundles = 8\ntopics = 40\npublishers = 40\nmsg_rate = 4000\n'
                 'duration_s = 30\n[params]\nnic_mbytes = 10\n[capacity.broker-2]\nnic_mbytes = 40\n')
    sc = scenario.load(f)
    c = run.simulate(sc, "modular")
    b1, b2 = (c.brokers[b] for b in c.order)
    u1 = c.usage(b1)["bandwidthIn"]
    u2 = c.usage(b2)["bandwidthIn"]
    assert u1.limit * 4 == u2.limit
    f.write_text('name = "cap"\nbrokers = 2\n[capacity.broker-3]\nnic_mbytes = 40\n')
    with pytest.raises(scenario.ScenarioError, match="capacity.broker-3"):
        scenario.load(f)
    f.write_text('name = "cap"\nbrokers = 2\n[capacity.broker-1]\ndisk = 40\n')
    with pytest.raises(scenario.ScenarioError, match="capacity.broker-1.disk"):
        scenario.load(f)


# ------------------------------------------------------------------------------------------ the leave's model

def test_a_broker_taking_topics_reports_their_clients_connecting():
    """Our brokers count every byte on their client connections: a broker that takes many topics at
    once reports their clients' lookups and producer/consumer commands as a burst (measured on our real
    runs' leaves, bench/lb_sim.py `leave`). With connect_kb_* the simulated broker's next report carries
    them, once; without, nothing; nothing else changes (the same seed, the same run otherwise)."""
    sc = scenario.BUILTIN["small-6-3-6"]
    quiet = dict(report_noise_kb=0, system_msg_overhead_bytes=0, stats_interval_ms=0, report_phase=0)
    off = run.simulate(dataclasses.replace(_quiet(sc, **quiet, connect_kb_in=0, connect_kb_out=0), duration_s=6),
                       "modular")
    on = run.simulate(dataclasses.replace(_quiet(sc, **quiet, connect_kb_in=2.0, connect_kb_out=2.0), duration_s=6),
                      "modular")
    link_kb = sc.sim_params().nic_mbytes * 1024
    extra = 0.0
    for b in on.load_series:
        for (t, u_on), (t2, u_off) in zip(on.load_series[b], off.load_series[b]):
            assert t == t2 and u_on >= u_off - 1e-12
            if t >= 3:                         # every topic connected before 2 s: no burst after
                assert u_on == pytest.approx(u_off, abs=1e-12)
            extra += u_on - u_off
    # each report is one second: its usage is KB/s over the link, so the excess sums to KB / link
    assert extra == pytest.approx(len(on.t_name) * 2.0 / link_kb, rel=1e-6)


@pytest.mark.parametrize("lm", ["modular", "extensible"])
def test_each_broker_reports_at_its_own_phase_when_asked(lm):
    """Our brokers' one-second reports keep each broker's own phase, the six spread over the second (their
    reporters start with the broker). report_phase 1: each simulated broker's reports come at its own
    offset into every round, the same offset round after round, drawn from the seed; 0: every broker at
    the round's instant. A leave's stops, about 1 s apart, then see some brokers' reports of the last
    stop's moves and not others'."""
    sc = dataclasses.replace(scenario.BUILTIN["tiny"], duration_s=31, events=())
    def offsets(phase: float, seed: int = 1) -> dict[str, set[int]]:
        p = dataclasses.replace(sc.sim_params(lm), report_phase=phase)
        c = run.LOAD_MANAGERS[lm](sc, sc.lb_settings(), p, seed)
        c.run()
        out: dict[str, set[int]] = {}
        for b, rows in c.load_series.items():
            # every report but the one a broker makes as it registers
            out[b] = {round(t * 1000) % c.report_ms for t, _ in rows[1:]}
        return out
    together = offsets(0)
    assert all(o == {0} for o in together.values())
    own = offsets(1)
    assert all(len(o) == 1 for o in own.values())          # one phase per broker, kept
    assert len({next(iter(o)) for o in own.values()}) == len(own) > 1   # and not the same phase
    assert offsets(1) == own                                 # drawn from the seed
    assert offsets(1, seed=2) != own


def test_a_load_manager_gets_its_own_parameters_over_the_scenarios(tmp_path):
    """[load_manager_params.X] overrides [params] for load manager X only: the two load managers' brokers
    stop in their own ways (measured: a modular stop 0.36 s, an extensible one about 0.9 s, transfers
    first), and the leave's stops follow each one's."""
    f = tmp_path / "s.toml"
    f.write_text('name = "x"\nbrokers = 4\nbundles = 8\ntopics = 20\npublishers = 20\nduration_s = 20\n'
                 '[params]\ngraceful_unload_ms = 300\n[load_manager_params.extensible]\ngraceful_unload_ms = 900\n'
                 '[[events]]\nat_s = 5\nkind = "leave"\ncount = 2\nsequential = true\n')
    sc = scenario.load(f)
    assert sc.sim_params().graceful_unload_ms == 300 and sc.sim_params("modular").graceful_unload_ms == 300
    assert sc.sim_params("extensible").graceful_unload_ms == 900
    for lm, each in (("modular", 300), ("extensible", 900)):
        c = run.simulate(sc, lm)
        inv = next(t for t, kind, f_, _ in c.nemesis if kind == "invoke" and f_ == "start-scale")
        ok = next(t for t, kind, f_, _ in c.nemesis if kind == "ok" and f_ == "start-scale")
        assert ok - inv == pytest.approx(2 * each, abs=2)
    for text, where in (('[load_manager_params.both]\ngraceful_unload_ms = 1\n', "load_manager_params.both"),
                        ('load_manager_params = 3\n', "load_manager_params"),
                        ('[load_manager_params.modular]\ngraceful = 1\n', "load_manager_params.modular")):
        f.write_text('name = "x"\n' + text)
        with pytest.raises(scenario.ScenarioError) as e:
            scenario.load(f)
        assert e.value.where == where and "\n" not in str(e.value)


def test_the_leave_measures_recover_what_a_run_holds(tmp_path):
    """bench/lb_sim.py's measures of a real leave, on a made-up run whose answers are known: the topic
    loads from the node log (a bundle's lock taken, then its topics loaded; one load 10 s later is not a
    waiting client's), and the connect bytes per topic a broker took beyond its topics' own rate."""
    from bench import lb_sim
    from clusters.loadbalancer.bundles import topic_hash
    from core.history import Op
    log = tmp_path / "nodes" / "broker-1" / "node.log"
    log.parent.mkdir(parents=True)
    lines = ["2026-11-28 08:59:56,600 broker-1 INFO clusters.loadbalancer.zk_ownership: acquired bundle "
             "public/default/0x00000000_0xffffffff"]
    for ms, t in ((640, "a"), (700, "b"), (900, "c")):
        lines.append(f"2026-11-28 08:59:56,{ms} broker-1 INFO clusters.broker.service: loaded topic "
                     f"persistent://public/default/{t}")
    lines.append("2026-11-28 09:00:06,700 broker-1 INFO clusters.broker.service: loaded topic persistent://public/default/d")
    log.write_text("\n".join(lines) + "\n")
    assert all(topic_hash(f"persistent://public/default/{t}") < 0xffffffff for t in "abcd")
    assert lb_sim.topic_loads(tmp_path) == pytest.approx([0.04, 0.1, 0.3], abs=1e-5)
    # a remaining broker at 1 KB/s per topic in, 2 out, with 10 topics; at 61 s it takes 20 more whose
    # clients cost 0.5 KB in and 0.25 out each, seen in the reports of 61 and 62 s
    link_kb, s = 100.0, 1_000_000_000
    ops = []
    for t in range(20, 64):
        topics = 10 if t < 61 else 30
        kin, kout = topics * 1.0, topics * 2.0
        if t == 61:
            kin, kout = kin + 6.0, kout + 3.0
        if t == 62:
            kin, kout = kin + 4.0, kout + 2.0
        ops.append(Op(-2, "ok", "lb-event", value={"event": "load-report", "broker": "b1", "logged_by": "broker-1",
                                                    "bandwidthIn": kin / link_kb * 100, "bandwidthOut": kout / link_kb * 100,
                                                    "numTopics": topics}, time_ns=t * s))
    got = lb_sim._connect_bytes(ops, 60 * s, 60 * s + s // 2, ["broker-2"], link_kb)
    assert {k: got[k] for k in ("in", "out", "brokers")} == {"in": pytest.approx(0.5), "out": pytest.approx(0.25),
                                                             "brokers": 1}
    # out beyond in (out at twice the in here: two subscriptions' worth): the clients' 0.25 KB out less twice
    # their 0.5 KB in
    assert got["out_beyond_in"] == pytest.approx(0.25 - 2 * 0.5)
    # a leaving broker is not one that took topics
    assert lb_sim._connect_bytes(ops, 60 * s, 60 * s + s // 2, ["broker-1"], link_kb) is None


def _reports(kb: dict[int, tuple[float, float, int]], link_kb: float) -> list:
    from core.history import Op
    return [Op(-2, "ok", "lb-event", value={"event": "load-report", "broker": "b1", "logged_by": "broker-1",
                                            "bandwidthIn": kin / link_kb * 100, "bandwidthOut": kout / link_kb * 100,
                                            "numTopics": n}, time_ns=t * 1_000_000_000)
            for t, (kin, kout, n) in sorted(kb.items())]


def test_the_redelivered_bytes_are_measured_through_the_sends_dip():
    """With 4 KB payloads our brokers' usage after a leave is two things at once: the sends dip (the send
    threads wait for the moved topics: in and out fall alike, to 0.3-0.7 for 2-4 s) and the broker that took
    topics sends their consumers' unacknowledged messages again (out alone jumps). Measured against the
    per-topic rate before, the dip hides the burst (the payload runs gave -6 to -12 KB a topic); out beyond
    in, which the dip lowers alike, recovers it. Made up: 10 topics at 5 KB/s each way, 20 more at 61 s
    whose consumers are sent 10 KB each again over 61-62 s, while every rate is halved from 61 to 63 s."""
    from bench import lb_sim
    link_kb, s = 400.0, 1_000_000_000
    kb = {}
    for t in range(20, 70):
        n = 10 if t < 61 else 30
        dip = 0.5 if 61 <= t < 63 else 1.0
        kin = kout = n * 5.0 * dip
        if t in (61, 62):
            kout += 20 * 10.0 / 2
        kb[t] = (kin, kout, n)
    got = lb_sim._connect_bytes(_reports(kb, link_kb), 60 * s, 60 * s + s // 2, ["broker-2"], link_kb)
    assert got["out_beyond_in"] == pytest.approx(10.0)
    # the measure against the rate before sees a quarter of it: the dip takes 7.5 KB a topic off the 10
    assert got["out"] == pytest.approx(2.5)
    # without a burst, the dip alone is not one
    for t in (61, 62):
        kb[t] = (kb[t][0], kb[t][0], kb[t][2])
    got = lb_sim._connect_bytes(_reports(kb, link_kb), 60 * s, 60 * s + s // 2, ["broker-2"], link_kb)
    assert got["out_beyond_in"] == pytest.approx(0.0, abs=1e-9)


def test_an_idle_brokers_cpu_is_read_from_its_reports_without_topics():
    """base_cpu_percent of the validation scenarios: the CPU of reports of brokers with no topic and no bundle,
    after their first three (a starting broker's first reports carry its start-up: 4 % in ours, then 0.4).
    The assumed 5 % made a joined broker look 0.05 loaded, ten times ours; TransferShedder moves half the
    difference between the most and the least loaded, so the joined brokers got less."""
    from bench import lb_sim
    from core.history import Op
    rows = [("a", 4.0, 0, 0), ("a", 1.0, 0, 0), ("a", 0.6, 0, 0), ("a", 0.4, 0, 0), ("a", 0.6, 0, 0),
            ("a", 12.0, 16, 5), ("b", 9.0, 0, 0), ("b", 9.0, 0, 0), ("b", 9.0, 0, 0), ("b", 2.0, 3, 1),
            ("b", 0.5, 0, 1)]
    hist = [Op(-2, "ok", "lb-event", value={"event": "load-report", "broker": b, "cpu": cpu, "numTopics": n,
                                            "numBundles": nb}, time_ns=i) for i, (b, cpu, n, nb) in enumerate(rows)]
    assert lb_sim.idle_cpu(hist) == [0.4, 0.6]
    assert lb_sim.idle_cpu(hist, skip=0) == [4.0, 1.0, 0.6, 0.4, 0.6, 9.0, 9.0, 9.0]


def test_the_planned_deviation_pairs_as_the_shedder_does():
    """The part of a join's outcome fixed before TransferShedder's one cycle: most loaded with least loaded,
    the next with the next (three pairs at most), each pair meeting half way."""
    from bench import lb_sim
    assert lb_sim.planned_deviation([0.0, 0.0, 0.0, 0.4, 0.4, 0.4]) == pytest.approx(0.0)
    # three at 0.5, 0.4, 0.2 and three idle: pairs at 0.25, 0.2, 0.1 around a mean of 0.183, the 0.1 pair
    # furthest from it
    assert lb_sim.planned_deviation([0.0, 0.0, 0.0, 0.5, 0.4, 0.2]) == pytest.approx(1.1 / 6 - 0.1)
    # an odd broker out keeps its load
    assert lb_sim.planned_deviation([0.0, 0.3, 0.6]) == pytest.approx(0.0)


@pytest.mark.parametrize("lm", ["modular", "extensible"])
def test_a_sequential_leave_stops_each_broker_once_the_last_is_gone(lm):
    """The scale nemesis stops the next broker when the previous one has exited. A next stop in the same
    instant as the last one's exit let the extensible broker hand its bundles to the broker just leaving
    (seen: up to 12 of 16 bundles Owned by a broker gone, until the leader's monitor a minute later, in
    seeds 1 and 2 among others); our brokers had every bundle owned again within 3 s. Now no stop begins
    before the previous broker is gone, a stopping extensible broker reports no more (our broker cancels
    its timers first: a drained broker's empty report made it the shedder's destination), and 3 s after
    the leave every bundle with topics is owned by a live broker. (The leader can still shed to a broker
    that is stopping, from its last report, as ours can: seed 8.)"""
    sc = scenario.BUILTIN["small-6-3-6"]
    for seed in (1, 2):
        c = run.LOAD_MANAGERS[lm](sc, sc.lb_settings(), sc.sim_params(lm), seed)
        stops: list[tuple[int, str, str]] = []
        orig_stopping, orig_stopped = c.broker_stopping, c.broker_stopped
        c.broker_stopping = lambda b: (stops.append((c.sim.now_ms, "stopping", b)), orig_stopping(b))[1]
        c.broker_stopped = lambda b: (stops.append((c.sim.now_ms, "stopped", b)), orig_stopped(b))[1]
        at = 60_000
        after: dict[str, tuple[str | None, str | None]] = {}
        live: set[str] = set()

        def snap() -> None:
            live.update(b for b in c.order if c.brokers[b].up)
            for n, b in c.bundles.items():
                rec = c.view.get(n) if lm == "extensible" else None
                after[n] = (b.owner, rec.state.value if rec is not None else None)
        c.sim.at(at + 3 * c.p.graceful_unload_ms + 3000, snap)
        c.run()
        leave = [s for s in stops if at <= s[0] < at + 10_000]
        assert [k for _, k, _ in leave] == ["stopping", "stopped"] * 3       # never two at once
        for (t1, _, b1), (t2, _, b2) in zip(leave[::2], leave[1::2]):
            assert b1 == b2 and t2 - t1 == pytest.approx(c.p.graceful_unload_ms, abs=1)
        assert len(live) == 3
        with_topics = [n for n in after if c.bundles.get(n) is not None and c.bundles[n].topics]
        assert with_topics and all(after[n][0] in live for n in with_topics)
        if lm == "extensible":
            assert all(after[n][1] == "Owned" for n in with_topics)
            for (t1, _, b), (t2, _, _) in zip(leave[::2], leave[1::2]):
                assert not [t for t, e in c.lb_events if e["event"] == "load-report" and e["broker"] == b
                            and t1 < t < t2]


def test_simulator_parameters_are_checked_by_name_type_sign_and_range():
    from clusters.loadbalancer.sim.params import SimParams
    assert SimParams.from_mapping({"report_phase": 1, "publish_ms": 2}).report_phase == 1.0
    for values, needle in (({"report_phase": 1.5}, "fraction from 0 to 1"), ({"publish_ms": -1}, "negative"),
                           ({"publish_ms": "x"}, "expects a number"), ({"publsh_ms": 1}, "did you mean 'publish_ms'")):
        with pytest.raises(ValueError, match=needle):
            SimParams.from_mapping(values)


def test_the_bench_takes_its_options_before_between_or_after_the_run_folders(monkeypatch, capsys):
    """`python -m bench.lb_sim calibrate RUN --seeds 3 RUN2`: an option between the run folders is read
    as an option (argparse's plain parse refused the second folder), and a missing folder is one line."""
    import sys
    from bench import lb_sim
    monkeypatch.setattr(sys, "argv", ["lb_sim", "calibrate", "/nonexistent-a", "--seeds", "3", "/nonexistent-b"])
    assert lb_sim.main() == 254
    err = capsys.readouterr().err
    assert "/nonexistent-a: no such run folder" in err and len(err.strip().splitlines()) == 1
