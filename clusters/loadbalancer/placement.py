"""Where the leader puts an unowned bundle: ModularLoadManagerImpl.selectBrokerForAssignment.

`select_broker(bundle, candidates, load_data, settings, rng)` runs the parts of Pulsar's pipeline
that apply to us, in Pulsar's order, on the candidates the glue gives (the available brokers that
the namespace's policies allow):

0. a bundle already preallocated to a broker (assigned, but not in that broker's report yet) goes
   there again;
1. `loadBalancerBrokerMaxTopics`: brokers whose reported topics plus preallocated bundles' topics
   exceed it are dropped, unless that drops all (LoadManagerShared.filterBrokersWithLargeTopicCount);
2. `loadBalancerDistributeBundlesEvenlyEnabled`: only the brokers with the fewest bundles of the
   bundle's namespace stay (removeMostServicingBrokersForNamespace);
3. the placement strategy (`loadBalancerLoadPlacementStrategy`) picks: `LeastLongTermMessageRate`
   (default) or `LeastResourceUsageWithWeight`;
4. if the pick is overloaded (weighted max resource usage > loadBalancerBrokerOverloadedThreshold-
   Percentage) the strategy runs again on all candidates;
5. the bundle is preallocated to the pick: its BundleData joins the broker's preallocated data
   (so the next scores count it) and `load_data.preallocated_broker(bundle)` answers the pick until
   the broker reports the bundle (LoadData.update_bundle_data).

Not modelled: namespace isolation, anti-affinity groups and failure domains, the broker version and
load-manager-class filters, the round robin for shedding-excluded namespaces.

Every call returns a `PlacementDecision` with its inputs and outputs (candidates after each filter,
scores, choice, reason) for the glue's logs and metrics.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from clusters.loadbalancer.data import (BrokerData, BundleData, LoadData, LocalBrokerData, is_system_service_namespace,
                                        namespace_of, preallocated_sums)
from clusters.loadbalancer.settings import LoadBalancerSettings


@dataclass
class PlacementDecision:
    bundle: str
    broker: str | None                       # the choice; None: no candidate
    reason: str                              # preallocated | selected | overload-fallback | no-candidates
    strategy: str = ""
    candidates: list[str] = field(default_factory=list)             # as given
    filters: list[tuple[str, list[str]]] = field(default_factory=list)  # (filter, brokers left after it)
    scores: dict[str, float] = field(default_factory=dict)          # of the last strategy run
    best: list[str] = field(default_factory=list)                   # the brokers the choice was drawn from
    overloaded: dict[str, float] = field(default_factory=dict)      # broker -> weighted usage, > threshold

    def as_dict(self) -> dict[str, Any]:
        return {"bundle": self.bundle, "broker": self.broker, "reason": self.reason, "strategy": self.strategy,
                "candidates": list(self.candidates), "filters": [[n, list(b)] for n, b in self.filters],
                "scores": dict(self.scores), "best": list(self.best), "overloaded": dict(self.overloaded)}


def placement_usage(local: LocalBrokerData, settings: LoadBalancerSettings) -> float:
    """The usage that the overload checks of placement compare with the threshold: the weighted
    max (the newest Pulsar; 2.x's LeastLongTermMessageRate used the unweighted max)."""
    return local.max_resource_usage_with_weight(settings)


class LeastLongTermMessageRate:
    """Score = long-term msg rate in+out of the broker's bundles (TimeAverageBrokerData) plus that of
    its preallocated bundles; +inf when overloaded. Uniformly random among the lowest scores; if all
    are +inf, random among all candidates."""
    name = "LeastLongTermMessageRate"

    def score(self, broker: BrokerData, settings: LoadBalancerSettings) -> float:
        if placement_usage(broker.local, settings) > settings.loadBalancerBrokerOverloadedThresholdPercentage / 100.0:
            return float("inf")
        pre = preallocated_sums(broker.preallocated_bundle_data)[0]
        ta = broker.time_average
        return pre + ta.longTermMsgRateIn + ta.longTermMsgRateOut

    def select(self, candidates: list[str], bundle_data: BundleData, load_data: LoadData,
               settings: LoadBalancerSettings, rng: random.Random) -> tuple[str | None, dict[str, float], list[str]]:
        scores = {b: self.score(load_data.brokers[b], settings) for b in candidates}
        finite = [s for s in scores.values() if s != float("inf")]
        best = [b for b in candidates if finite and scores[b] == min(finite)] or list(candidates)
        return (rng.choice(best) if best else None), scores, best


class LeastResourceUsageWithWeight:
    """Per broker an exponential average of the weighted max resource usage
    (u <- h*u + (1-h)*usage, h = loadBalancerHistoryResourcePercentage, first sample as is), kept
    across calls; random among the candidates whose average is at least
    loadBalancerAverageResourceUsageDifferenceThresholdPercentage below the candidates' mean, or
    among all candidates if none is."""
    name = "LeastResourceUsageWithWeight"

    def __init__(self) -> None:
        self.avg_usage: dict[str, float] = {}

    def on_active_brokers_change(self, active: Iterable[str]) -> None:
        keep = set(active)
        for b in list(self.avg_usage):
            if b not in keep:
                del self.avg_usage[b]

    def _update(self, broker: str, data: BrokerData, settings: LoadBalancerSettings) -> float:
        h = settings.loadBalancerHistoryResourcePercentage
        usage = data.local.max_resource_usage_with_weight(settings)
        prev = self.avg_usage.get(broker)
        self.avg_usage[broker] = usage if prev is None else prev * h + (1 - h) * usage
        return self.avg_usage[broker]

    def select(self, candidates: list[str], bundle_data: BundleData, load_data: LoadData,
               settings: LoadBalancerSettings, rng: random.Random) -> tuple[str | None, dict[str, float], list[str]]:
        if not candidates:
            return None, {}, []
        scores = {b: self._update(b, load_data.brokers[b], settings) for b in candidates}
        choice, best = pick_least_usage(candidates, scores, settings, rng)
        return choice, scores, best


def pick_least_usage(candidates: list[str], usage: Mapping[str, float], settings: LoadBalancerSettings,
                     rng: random.Random) -> tuple[str | None, list[str]]:
    """LeastResourceUsageWithWeight's choice among `candidates` given each one's usage (the modular
    load manager's local average, or the extensible one's reported weightedMaxEMA): random among the
    candidates whose usage is at least loadBalancerAverageResourceUsageDifferenceThresholdPercentage
    below the mean over the candidates that have a usage; random among all candidates if none is.
    Returns (choice or None without candidates, the brokers it was drawn from)."""
    if not candidates:
        return None, []
    known = [b for b in candidates if b in usage]
    best: list[str] = []
    if known:
        avg = sum(usage[b] for b in known) / len(known)
        diff = settings.loadBalancerAverageResourceUsageDifferenceThresholdPercentage / 100.0
        best = [b for b in known if usage[b] + diff <= avg]
    best = best or list(candidates)
    return rng.choice(best), best


PLACEMENT_STRATEGIES = {"LeastLongTermMessageRate": LeastLongTermMessageRate,
                        "LeastResourceUsageWithWeight": LeastResourceUsageWithWeight}


def make_placement_strategy(settings: LoadBalancerSettings) -> LeastLongTermMessageRate | LeastResourceUsageWithWeight:
    """The strategy `loadBalancerLoadPlacementStrategy` names (full Java class name or short name).
    Pulsar falls back to LeastLongTermMessageRate on a class it cannot load; we refuse it."""
    short = settings.loadBalancerLoadPlacementStrategy.rsplit(".", 1)[-1]
    if short not in PLACEMENT_STRATEGIES:
        raise ValueError(f"unknown loadBalancerLoadPlacementStrategy {settings.loadBalancerLoadPlacementStrategy!r}; "
                         f"known: {sorted(PLACEMENT_STRATEGIES)}")
    return PLACEMENT_STRATEGIES[short]()


def select_broker(bundle: str, candidates: Iterable[str], load_data: LoadData, settings: LoadBalancerSettings,
                  rng: random.Random, namespace_bundle_counts: Mapping[str, int] | None = None, *,
                  strategy: LeastLongTermMessageRate | LeastResourceUsageWithWeight | None = None,
                  preallocate: bool = True) -> PlacementDecision:
    """Choose the broker for `bundle` among `candidates` (see the module doc) and preallocate it.

    `namespace_bundle_counts` (broker -> bundles of the bundle's namespace it owns) defaults to
    what the load data shows (reports plus preallocations). `strategy` keeps state across calls
    (LeastResourceUsageWithWeight's averages): pass the same object each time; by default a new
    one from the settings. `preallocate=False` is Pulsar's selectBroker without the
    ForAssignment wrapper: no preallocated lookup, nothing preallocated; doLoadShedding picks
    destinations that way (since apache/pulsar#20822)."""
    given = sorted(set(candidates))
    strategy = strategy or make_placement_strategy(settings)
    decision = PlacementDecision(bundle, None, "no-candidates", strategy.name, given)
    pre = load_data.preallocated_broker(bundle) if preallocate else None
    if pre is not None:
        decision.broker, decision.reason = pre, "preallocated"
        return decision
    full = [b for b in given if b in load_data.brokers]
    decision.filters.append(("has-load-report", list(full)))
    if not full:
        return decision
    data = load_data.bundles.setdefault(bundle, BundleData.new_default())

    cands = _filter_large_topic_count(full, load_data, settings.loadBalancerBrokerMaxTopics)
    decision.filters.append(("loadBalancerBrokerMaxTopics", list(cands)))
    ns = namespace_of(bundle)
    if settings.loadBalancerDistributeBundlesEvenlyEnabled or is_system_service_namespace(ns):
        counts = namespace_bundle_counts if namespace_bundle_counts is not None else load_data.namespace_bundle_counts(ns)
        fewest = min(counts.get(b, 0) for b in cands)
        cands = [b for b in cands if counts.get(b, 0) <= fewest]
        decision.filters.append(("loadBalancerDistributeBundlesEvenlyEnabled", list(cands)))
    if not cands:
        cands = list(full)

    broker, decision.scores, decision.best = strategy.select(cands, data, load_data, settings, rng)
    decision.reason = "selected"
    threshold = settings.loadBalancerBrokerOverloadedThresholdPercentage / 100.0
    decision.overloaded = {b: u for b in full
                           if (u := placement_usage(load_data.brokers[b].local, settings)) > threshold}
    if broker is not None and broker in decision.overloaded:
        # all the filtered candidates were overloaded: look at every candidate
        broker, decision.scores, decision.best = strategy.select(full, data, load_data, settings, rng)
        decision.reason = "overload-fallback"
    decision.broker = broker
    if broker is not None and preallocate:
        load_data.brokers[broker].preallocated_bundle_data[bundle] = data
        load_data.preallocated_bundle_to_broker[bundle] = broker
    return decision


def _filter_large_topic_count(cands: list[str], load_data: LoadData, max_topics: int) -> list[str]:
    kept = []
    for b in cands:
        bd = load_data.brokers[b]
        total = bd.local.numTopics + preallocated_sums(bd.preallocated_bundle_data)[1]
        if total <= max_topics:
            kept.append(b)
    return kept or list(cands)
