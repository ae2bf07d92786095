"""The modular load manager's leader, without I/O: what `ModularLoadManagerImpl`'s leader decides from
the brokers' load reports and the time it is given. The broker's `ModularLoadManager` (modular.py) is one
wrapper of it, reading the reports from ZooKeeper and carrying out the decisions over HTTP; a simulator
can be another. No clock, no ZooKeeper, no network: time is a parameter (`now_ms`) and randomness comes
from the `random.Random` handed in, so the same inputs give the same decisions.
"""
from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Any, Mapping

from clusters.loadbalancer.data import BundleData, LoadData, LocalBrokerData, namespace_of
from clusters.loadbalancer.placement import PlacementDecision, make_placement_strategy, select_broker
from clusters.loadbalancer.settings import LoadBalancerSettings
from clusters.loadbalancer.shedding import (ShedDecision, make_shedding_strategy, placement_destination,
                                            plan_shedding)
from clusters.loadbalancer.splitting import bundles_to_split

log = logging.getLogger(__name__)


@dataclass
class Refresh:
    """What one refresh (Pulsar's updateAll) found: the brokers with a readable report, the ones whose data
    was dropped, and the reports that could not be read."""
    brokers: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)
    malformed: list[str] = field(default_factory=list)


@dataclass
class Assign:
    """The leader's choice for an unowned bundle (selectBrokerForAssignment)."""
    broker: str | None
    reason: str                             # affinity | preallocated | lookup | no-brokers
    decision: PlacementDecision | None = None


@dataclass
class Split:
    bundle: str
    owner: str | None
    reason: str                             # Topics | Sessions | MsgRate | Bandwidth


class ModularLeader:
    """The leader's state and decisions. `shed_to_owner` and `keep_preallocations` are the bug knobs
    lb.shed_to_owner and lb.keep_preallocations (clusters/bugs.py)."""

    def __init__(self, settings: LoadBalancerSettings, rng: random.Random, *, shed_to_owner: bool = False,
                 keep_preallocations: bool = False):
        self.settings = settings
        self.rng = rng
        self.shed_to_owner = shed_to_owner
        self.keep_preallocations = keep_preallocations
        self.load_data = LoadData()
        self.registrations: dict[str, dict[str, Any]] = {}   # brokers with a readable report
        self.urls: dict[str, str] = {}            # brokerId -> pulsarServiceUrl, of every broker seen
        self.affinity: dict[str, str] = {}        # bundle -> brokerId (unload with a destination)
        # bundle -> (its destination, the brokers' report times when the affinity was used): the moves
        # under way, preallocated to their destination until its report shows the bundle
        self.moving: dict[str, tuple[str, dict[str, int]]] = {}
        self.recently_unloaded: dict[str, int] = {}   # bundle -> ms (the grace period)
        self.shedder: Any = None                  # the shedding strategy (keeps its state)
        self.placement: Any = None                # the placement strategy (keeps its state)
        # namespace -> broker -> its bundles of that namespace (reports + preallocations): what
        # LoadData.namespace_bundle_counts answers, kept between refreshes so that a placement does not
        # scan every bundle of the cluster
        self._ns_counts: dict[str, dict[str, int]] | None = None

    def forget(self) -> None:
        """A new term as leader: the load data and the shedder's memory start afresh (Pulsar's LoadData of
        a newly elected leader is filled by its first updateAll)."""
        self.load_data = LoadData()
        self.shedder = None
        self.moving.clear()

    # -- updateAll ---------------------------------------------------------------------------------
    def refresh(self, registrations: Mapping[str, dict[str, Any]]) -> Refresh:
        """Every live broker's registration (its LocalBrokerData JSON) into the load data; dead brokers'
        data dropped and their preallocations released (unless the bug knob keeps them)."""
        out = Refresh()
        reports: dict[str, Any] = {}
        for b, doc in registrations.items():
            if isinstance(doc, LocalBrokerData):
                reports[b] = doc          # a simulator hands the report as an object (no JSON round trip)
                continue
            try:
                reports[b] = LocalBrokerData.from_json(doc)
            except Exception:  # noqa: BLE001 - a malformed report: the broker counts as without one
                reports[b] = None
                out.malformed.append(b)
            if isinstance(doc.get("pulsarServiceUrl"), str):
                self.urls[b] = doc["pulsarServiceUrl"]
        self.registrations = {b: d for b, d in registrations.items() if reports.get(b) is not None}
        out.brokers = sorted(self.registrations)
        kept = dict(self.load_data.preallocated_bundle_to_broker) if self.keep_preallocations else {}
        self._ns_counts = None
        out.gone = self.load_data.update_all_broker_data(reports)
        self.load_data.update_bundle_data()
        if kept:
            # bug knob lb.keep_preallocations (apache/pulsar#478): preallocations are never released,
            # neither when the bundle shows in a report nor when the broker dies
            for bundle, broker in kept.items():
                self.load_data.preallocated_bundle_to_broker.setdefault(bundle, broker)
        self._keep_moving()
        return out

    def _keep_moving(self) -> None:
        """A move by affinity stays preallocated to its destination until the destination's report shows
        the bundle. The previous owner's report may still list it (written before the unload, it is
        rewritten only when it changed enough): that drops the preallocation in update_bundle_data, and
        is put right here. A move ends without its destination when the destination is gone, or when
        both the destination's and another broker's reports were written since the move (another
        lastUpdate, whichever way that broker's clock went) and only the other one shows the bundle: it
        took the bundle after all (both, so that a report of the old owner sampled before the unload
        and written just after the move does not end it)."""
        for bundle, (dest, seen) in list(self.moving.items()):
            bd = self.load_data.brokers.get(dest)
            taken = bd is not None and bd.local.lastUpdate != seen.get(dest) and any(
                b != dest and bundle in o.local.lastStats and o.local.lastUpdate != seen.get(b)
                for b, o in self.load_data.brokers.items())
            if bd is None or bundle in bd.local.lastStats or taken:
                del self.moving[bundle]
            elif self.load_data.preallocated_bundle_to_broker.get(bundle) != dest:
                self._preallocate(bundle, dest)

    # -- assignment --------------------------------------------------------------------------------
    def placement_strategy(self) -> Any:
        if self.placement is None:
            self.placement = make_placement_strategy(self.settings)
        return self.placement

    def select(self, bundle: str) -> Assign:
        """selectBrokerForAssignment over the brokers of the last refresh: affinity first (unload with a
        destination; used once, its broker preallocated like any choice), then a preallocation, then the
        placement strategy (its choice preallocated)."""
        if not self.registrations:
            return Assign(None, "no-brokers")
        dest = self.affinity.pop(bundle, None)
        if dest in self.registrations and dest in self.load_data.brokers:
            self.moving[bundle] = (dest, {b: bd.local.lastUpdate for b, bd in self.load_data.brokers.items()})
            self._preallocate(bundle, dest)
            return Assign(dest, "affinity")
        decision = select_broker(bundle, sorted(self.registrations), self.load_data, self.settings, self.rng,
                                 self.namespace_counts(namespace_of(bundle)), strategy=self.placement_strategy())
        if decision.broker is not None and decision.reason in ("selected", "overload-fallback"):
            # select_broker preallocated it: one more bundle of the namespace on that broker, unless its
            # report already showed it
            if bundle not in self.load_data.brokers[decision.broker].local.lastStats:
                counts = self.namespace_counts(namespace_of(bundle))
                counts[decision.broker] = counts.get(decision.broker, 0) + 1
        return Assign(decision.broker, "preallocated" if decision.reason == "preallocated" else "lookup", decision)

    def _preallocate(self, bundle: str, broker: str) -> None:
        """The bundle assigned to `broker` by its affinity is preallocated there, as every assignment is
        (and taken from any other broker's preallocations): an affinity is used once, and the lookups
        that follow it before `broker` owns the bundle (the producer's and the consumer's reconnections
        after one unload come together) must get the same answer, not a placement or an older
        preallocation to the bundle's previous owner, which is answered at once on that broker and takes
        the bundle back while the client redirected to the destination is still on its way."""
        ld = self.load_data
        for other, bd in ld.brokers.items():
            if other != broker and bundle in bd.preallocated_bundle_data:
                del bd.preallocated_bundle_data[bundle]
        data = ld.bundles.setdefault(bundle, BundleData.new_default())
        ld.brokers[broker].preallocated_bundle_data[bundle] = data
        ld.preallocated_bundle_to_broker[bundle] = broker
        self._ns_counts = None                  # rebuilt at the next placement (affinities are rare)

    def namespace_counts(self, namespace: str) -> dict[str, int]:
        """LoadData.namespace_bundle_counts(namespace), from an index built once per refresh."""
        if self._ns_counts is None:
            index: dict[str, dict[str, int]] = {}
            for broker, bd in self.load_data.brokers.items():
                for name in set(bd.local.lastStats) | set(bd.preallocated_bundle_data):
                    per = index.setdefault(namespace_of(name), {})
                    per[broker] = per.get(broker, 0) + 1
            self._ns_counts = index
        return self._ns_counts.setdefault(namespace, {})

    # -- shedding ---------------------------------------------------------------------------------
    def shed(self, now_ms: int) -> ShedDecision:
        """One doLoadShedding cycle: the strategy's bundles, each towards the placement's choice (never the
        current owner, unless the bug knob), none twice within the grace period (`recently_unloaded`)."""
        if self.shedder is None:
            self.shedder = make_shedding_strategy(self.settings)
        select = placement_destination(self.load_data, self.settings, self.rng, strategy=self.placement_strategy(),
                                       counts=self.namespace_counts)
        return plan_shedding(self.load_data, self.shedder, self.recently_unloaded, now_ms, self.settings,
                             select, skip_current_owner=not self.shed_to_owner)

    def unload_failed(self, bundle: str) -> None:
        """An unload of the plan could not be carried out: it may be chosen again before the grace ends."""
        self.recently_unloaded.pop(bundle, None)

    # -- splitting ---------------------------------------------------------------------------------
    def splits(self) -> list[Split]:
        """The leader's BundleSplitterTask: the bundles over Pulsar's thresholds, with their owners."""
        if not (self.settings.loadBalancerAutoBundleSplitEnabled and len(self.registrations) > 1):
            return []
        counts: dict[str, int] = {}
        owners: dict[str, str] = {}
        for broker, reg in self.registrations.items():
            for name in (reg.bundles if isinstance(reg, LocalBrokerData) else reg.get("bundles") or []):
                ns = name.rsplit("/", 1)[0]
                counts[ns] = counts.get(ns, 0) + 1
                owners[name] = broker
        return [Split(b, owners.get(b), reason) for b, reason in bundles_to_split(self.load_data, self.settings, counts)]
