"""TransferShedder (extensions/scheduler/TransferShedder.java), the leader's shedding cycle, pure.

`TransferShedder().find_bundles_for_unloading(...)` takes the brokers' BrokerLoadData and top bundles,
the available brokers, the recently unloaded bundles and brokers, the channel view and `now_ms`, and
returns a `SheddingResult`: the unloads with their reason and the breakdown the
`brk_lb_unload_broker_breakdown_total{result, reason}` metric counts. The object keeps the shedding
condition's hit count across cycles.

1. Load statistics over the brokers' `weightedMaxEMA`: load data older than
   loadBalancerBrokerLoadDataTTLInSeconds is left out (OutDatedData, if nothing is left); a broker
   unloaded recently whose data is not loadBalanceSheddingDelayInSeconds newer than the unload stops
   the cycle (CoolDown; an entry past the delay is removed from `recently_unloaded_brokers`); no data
   at all: NoBrokers; an available broker without data: NoLoadData.
2. The hit count grows while std > loadBalancerBrokerLoadTargetStd, or the least loaded broker is
   underloaded (ema < avg * m or msgThroughputEMA < the most loaded broker's * m, m = min(0.5,
   targetStd / 2)), or the most loaded is overloaded (ema > the overloaded threshold and > avg +
   targetStd); otherwise it drops to 0. The cycle sheds only while it is above
   loadBalancerSheddingConditionHitCountThreshold (else Skip/HitCount).
3. Up to loadBalancerMaxNumberOfBrokerSheddingPerCycle times, most loaded against least loaded:
   offload (maxLoad - minLoad) / 2 of the load, i.e. maxThroughput * offload / maxLoad of throughput,
   taking the max broker's top bundles in their report's order; skipped: bundles the view does not
   show Owned by it, of excluded namespaces, recently unloaded, not transferable (the caller's
   `transferable` predicate, for policies), of zero throughput; the loop stops when one top bundle is
   left. A bundle that overshoots the target is taken only if swapping some of the min broker's top
   bundles to the max broker balances them (transfer on only); otherwise the broker is done.
   Unload(max -> min) if loadBalancerTransferEnabled, else Unload(max) with no destination.
4. No unload: Skip with NoLoadData, NoBundles or HitCount; any unload resets the hit count.

As in Pulsar (with debug mode off), the throughput a swap brings back is not subtracted from what the
max broker is considered to have shed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, MutableMapping

from clusters.loadbalancer.data import namespace_of
from clusters.loadbalancer.extensible.load_data import BrokerLoadData, TopBundlesLoadData
from clusters.loadbalancer.extensible.state import ChannelView
from clusters.loadbalancer.settings import LoadBalancerSettings

SUCCESS, SKIP, FAILURE = "Success", "Skip", "Failure"
OVERLOADED, UNDERLOADED, HIT_COUNT, NO_BUNDLES = "Overloaded", "Underloaded", "HitCount", "NoBundles"
COOL_DOWN, OUTDATED_DATA, NO_LOAD_DATA, NO_BROKERS, UNKNOWN = (
    "CoolDown", "OutDatedData", "NoLoadData", "NoBrokers", "Unknown")


@dataclass(frozen=True)
class Unload:
    sourceBroker: str
    serviceUnit: str
    destBroker: str | None = None


@dataclass(frozen=True)
class UnloadDecision:
    unload: Unload
    label: str           # Success
    reason: str          # Overloaded | Underloaded


@dataclass
class SheddingResult:
    decisions: list[UnloadDecision] = field(default_factory=list)
    label: str = SUCCESS                 # Skip / Failure when there is no decision
    reason: str | None = None            # the Skip / Failure reason
    avg: float = 0.0                     # the load statistics before this cycle's unloads
    std: float = 0.0
    hit_count: int = 0

    def breakdown(self) -> list[tuple[str, str]]:
        """The (result, reason) increments of brk_lb_unload_broker_breakdown_total for this cycle."""
        if self.decisions:
            return [(d.label, d.reason) for d in self.decisions]
        return [(self.label, self.reason or UNKNOWN)]


@dataclass
class _Stats:
    brokers: list[str]                 # every broker with load data, ascending weightedMaxEMA
    total: int = 0
    sum: float = 0.0
    sq_sum: float = 0.0
    avg: float = 0.0                     # the load statistics before this cycle's unloads
    std: float = 0.0
    max_idx: int = 0
    min_idx: int = 0
    shed: int = 0

    def set(self, total: int, s: float, sq: float) -> None:
        self.total, self.sum, self.sq_sum = total, s, sq
        if total == 0:
            self.avg = self.std = 0.0
        else:
            self.avg = s / total
            self.std = math.sqrt(max(0.0, sq / total - self.avg * self.avg))

    def offload(self, mx: float, mn: float, off: float) -> None:
        self.sq_sum -= mx * mx + mn * mn
        maxd, mind = max(0.0, mx - off), mn + off
        self.sq_sum += maxd * maxd + mind * mind
        self.std = math.sqrt(abs(self.sq_sum / self.total - self.avg * self.avg))
        self.shed += 1
        self.min_idx += 1


class TransferShedder:
    def __init__(self) -> None:
        self.hit_count = 0

    def find_bundles_for_unloading(self, *, broker_load: Mapping[str, BrokerLoadData],
                                   top_bundles: Mapping[str, TopBundlesLoadData],
                                   available_brokers: Iterable[str],
                                   recently_unloaded_bundles: Mapping[str, int],
                                   recently_unloaded_brokers: MutableMapping[str, int],
                                   settings: LoadBalancerSettings, now_ms: int,
                                   view: ChannelView | None = None,
                                   transferable: Callable[[str, str, str | None], bool] | None = None
                                   ) -> SheddingResult:
        """One cycle (see the module doc). `recently_unloaded_brokers` loses the entries whose
        delay has passed, as Pulsar's map does. `transferable(bundle, src, dst)` defaults to True."""
        s = settings
        target_std = s.loadBalancerBrokerLoadTargetStd
        transfer = s.loadBalancerTransferEnabled
        can_move = transferable or (lambda bundle, src, dst: True)
        names = sorted(broker_load)
        stats = _Stats(sorted(names, key=lambda b: broker_load[b].weightedMaxEMA))
        stats.max_idx, stats.min_idx = len(stats.brokers) - 1, 0

        # 1. load statistics
        reason: str | None = None
        total, acc, sq = 0, 0.0, 0.0
        missing = set(available_brokers) - set(names)
        for b in names:
            d = broker_load[b]
            if now_ms - d.updatedAt > s.loadBalancerBrokerLoadDataTTLInSeconds * 1000:
                reason = OUTDATED_DATA
                continue
            if b in recently_unloaded_brokers:
                if d.updatedAt - recently_unloaded_brokers[b] < s.loadBalanceSheddingDelayInSeconds * 1000:
                    return SheddingResult(label=SKIP, reason=COOL_DOWN, hit_count=self.hit_count)
                del recently_unloaded_brokers[b]
            acc += d.weightedMaxEMA
            sq += d.weightedMaxEMA ** 2
            total += 1
        if total == 0:
            return SheddingResult(label=SKIP, reason=reason or NO_BROKERS, hit_count=self.hit_count)
        if missing:
            return SheddingResult(label=SKIP, reason=NO_LOAD_DATA, hit_count=self.hit_count)
        stats.set(total, acc, sq)
        result = SheddingResult(avg=stats.avg, std=stats.std)

        def underloaded(b: str) -> bool:
            m = min(0.5, max(0.0, target_std / 2.0))
            d = broker_load[b]
            if d.weightedMaxEMA < stats.avg * m:
                return True
            return d.msgThroughputEMA < broker_load[stats.brokers[stats.max_idx]].msgThroughputEMA * m

        def overloaded(b: str) -> bool:
            load = broker_load[b].weightedMaxEMA
            return load > s.loadBalancerBrokerOverloadedThresholdPercentage / 100.0 and load > stats.avg + target_std

        # 2. hit count
        if (stats.std > target_std or underloaded(stats.brokers[stats.min_idx])
                or overloaded(stats.brokers[stats.max_idx])):
            self.hit_count += 1
        else:
            self.hit_count = 0
        result.hit_count = self.hit_count
        if self.hit_count <= s.loadBalancerSheddingConditionHitCountThreshold:
            result.label, result.reason = SKIP, HIT_COUNT
            return result

        # 3. shed
        excluded = set(s.loadBalancerSheddingExcludedNamespaces)
        no_data = few_bundles = 0
        decided: set[str] = set()
        while stats.shed < s.loadBalancerMaxNumberOfBrokerSheddingPerCycle and stats.min_idx < stats.max_idx:
            if stats.std > target_std:
                why = OVERLOADED
            elif underloaded(stats.brokers[stats.min_idx]):
                why = UNDERLOADED
            elif overloaded(stats.brokers[stats.max_idx]):
                why = OVERLOADED
            else:
                break
            max_b = stats.brokers[stats.max_idx]
            stats.max_idx -= 1
            min_b = stats.brokers[stats.min_idx]
            max_d, min_d = broker_load[max_b], broker_load[min_b]
            max_load, min_load = max_d.weightedMaxEMA, min_d.weightedMaxEMA
            offload = (max_load - min_load) / 2
            max_thr, min_thr = max_d.msg_throughput(), min_d.msg_throughput()
            offload_thr = max_thr * offload / max_load if max_load > 0 else 0.0
            marked_offload = marked_gain = 0.0
            tops = top_bundles.get(max_b)
            if tops is None or not tops.topBundlesLoadData:
                no_data += 1
                continue
            max_tops = tops.topBundlesLoadData
            if len(max_tops) == 1:
                few_bundles += 1
                continue
            min_tops = iter(top_bundles[min_b].topBundlesLoadData) if min_b in top_bundles else None
            remaining = len(max_tops)
            for bundle, bstats in max_tops:
                if view is not None and not view.is_owner(bundle, max_b):
                    continue
                if namespace_of(bundle) in excluded or bundle in recently_unloaded_bundles or bundle in decided:
                    continue
                if not can_move(bundle, max_b, min_b):
                    continue
                if remaining <= 1:
                    break
                bundle_thr = bstats.msgThroughputIn + bstats.msgThroughputOut
                if bundle_thr <= 0:
                    continue
                swap = False
                swaps: list[Unload] = []
                if marked_offload - marked_gain + bundle_thr > offload_thr:
                    if transfer and min_tops is not None:
                        max_new = max_thr - marked_offload + marked_gain - bundle_thr
                        min_new = min_thr + marked_offload - marked_gain + bundle_thr
                        for min_bundle, min_stats in min_tops:
                            if not can_move(min_bundle, min_b, max_b):
                                continue
                            t = min_stats.msgThroughputIn + min_stats.msgThroughputOut
                            if max_new + t < max_thr and min_new - t < max_thr:
                                swaps.append(Unload(min_b, min_bundle, max_b))
                                max_new, min_new = max_new + t, min_new - t
                                if min_new <= max_new and max_new < max_thr * 0.75:
                                    swap = True
                                    break
                    if not swap:
                        break
                if transfer:
                    if swap:
                        for u in swaps:
                            result.decisions.append(UnloadDecision(u, SUCCESS, why))
                            decided.add(u.serviceUnit)
                    unload = Unload(max_b, bundle, min_b)
                else:
                    unload = Unload(max_b, bundle, None)
                result.decisions.append(UnloadDecision(unload, SUCCESS, why))
                decided.add(bundle)
                marked_offload += bundle_thr
                remaining -= 1
            if marked_offload > 0:
                adjusted = (marked_offload - marked_gain) * max_load / max_thr if max_thr > 0 else offload
                stats.offload(max_load, min_load, adjusted)
            else:
                few_bundles += 1

        if not result.decisions:
            result.label = SKIP
            result.reason = NO_LOAD_DATA if no_data else NO_BUNDLES if few_bundles else HIT_COUNT
        else:
            self.hit_count = 0
            result.hit_count = 0
        return result
