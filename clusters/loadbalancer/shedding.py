"""Which bundles the leader unloads, and where they go: Pulsar's load-shedding strategies and
ModularLoadManagerImpl.doLoadShedding.

Strategies (chosen by `loadBalancerLoadSheddingStrategy`, full Java class name or short name; see
`make_shedding_strategy`), each with `find_bundles_for_unloading(load_data, settings) ->
ShedderResult` (`unloads`: [(broker, bundle)], `record`: why, per broker):

- `ThresholdShedder` (default): an exponential average per broker of the weighted max resource
  usage (kept across calls); a broker at or above mean + loadBalancerBrokerThresholdShedder-
  Percentage sheds its biggest bundles (short-term throughput) until (usage - mean - threshold +
  5 %) of its throughput is covered, if that is at least loadBalancerBundleUnloadMinThroughput-
  Threshold MB; optional lower-boundary shedding (lowerBoundarySheddingEnabled).
- `OverloadShedder`: a broker whose unweighted max usage is at or above loadBalancerBroker-
  OverloadedThresholdPercentage sheds (usage - threshold + 5 %) of its throughput.
- `UniformLoadShedder`: compares the busiest and idlest brokers by msg rate (percent difference)
  and by throughput (ratio); sheds maxUnloadPercentage of the gap from the busiest.

All skip bundles unloaded within the grace period and brokers with fewer than two bundles, and
never pick a bundle of a heartbeat/SLA namespace. The leader's cycle is `plan_shedding`.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, MutableMapping

from clusters.loadbalancer.data import MIBI, LoadData, namespace_of
from clusters.loadbalancer.placement import (LeastLongTermMessageRate, LeastResourceUsageWithWeight,
                                             PlacementDecision, select_broker)
from clusters.loadbalancer.settings import LoadBalancerSettings

ADDITIONAL_THRESHOLD_PERCENT_MARGIN = 0.05
LOWER_BOUNDARY_THRESHOLD_MARGIN = 0.5
UNIFORM_EPS = 1e-6
JAVA_INT_MAX = 2 ** 31 - 1


@dataclass
class ShedderResult:
    unloads: list[tuple[str, str]] = field(default_factory=list)     # (broker, bundle), in selection order
    record: dict[str, Any] = field(default_factory=dict)             # the inputs and why, per broker


def _java_int(x: float) -> int:
    """Java's `(int) x`: truncated toward zero, saturated at the int range, NaN -> 0."""
    if math.isnan(x):
        return 0
    if x >= JAVA_INT_MAX:
        return JAVA_INT_MAX
    if x <= -JAVA_INT_MAX - 1:
        return -JAVA_INT_MAX - 1
    return int(x)


def _candidates(load_data: LoadData, broker: str, value: Callable[[Any], float]) -> list[tuple[str, float]]:
    """The broker's sheddable bundles (known, not recently unloaded, not system), biggest first."""
    local = load_data.brokers[broker].local
    recent = load_data.recently_unloaded_bundles
    out = [(b, value(d)) for b, d in load_data.bundle_data_for_load_shedding().items()
           if b in local.bundles and b not in recent]
    out.sort(key=lambda e: (-e[1], e[0]))
    return out


def _short_term_throughput(d: Any) -> float:
    return d.shortTermData.msgThroughputIn + d.shortTermData.msgThroughputOut


def _select_until(cands: list[tuple[str, float]], target: float) -> list[str]:
    """Biggest first until their sum reaches `target`; always at least one."""
    chosen, marked = [], 0.0
    for bundle, value in cands:
        if marked < target or not chosen:
            chosen.append(bundle)
            marked += value
    return chosen


def _offload(load_data: LoadData, broker: str, local: Any, to_offload: float, res: "ShedderResult",
             rec: dict[str, Any]) -> None:
    """An overloaded broker's bundles by descending short-term throughput until `to_offload` (at least
    one); a broker with a single bundle keeps it (both ThresholdShedder and OverloadShedder)."""
    if len(local.bundles) > 1:
        picked = _select_until(_candidates(load_data, broker, _short_term_throughput), to_offload)
        res.unloads += [(broker, b) for b in picked]
        rec["action"] = "overloaded"
        rec["bundles"] = picked
    else:
        rec["action"] = "sole-bundle" if local.bundles else "no-bundles"


class ThresholdShedder:
    name = "ThresholdShedder"

    def __init__(self) -> None:
        self.avg_usage: dict[str, float] = {}     # broker -> exponential average of its weighted usage

    def _update_avg(self, load_data: LoadData, s: LoadBalancerSettings, record: dict[str, Any]) -> float:
        h = s.loadBalancerHistoryResourcePercentage
        total = 0.0
        for broker in sorted(load_data.brokers):
            local = load_data.brokers[broker].local
            usage = local.max_resource_usage_with_weight(s)
            if usage > 1.0:
                # limits are mis-set: ignore the signals above 100 %
                usage = local.max_resource_usage_with_weight_within_limit(s)
            prev = self.avg_usage.get(broker)
            self.avg_usage[broker] = usage if prev is None else prev * h + (1 - h) * usage
            record.setdefault("brokers", {}).setdefault(broker, {})["usage"] = usage
            total += self.avg_usage[broker]
        return total / len(load_data.brokers) if load_data.brokers else 0.0

    def find_bundles_for_unloading(self, load_data: LoadData, settings: LoadBalancerSettings) -> ShedderResult:
        res = ShedderResult(record={"strategy": self.name, "brokers": {}})
        threshold = settings.loadBalancerBrokerThresholdShedderPercentage / 100.0
        min_throughput = settings.loadBalancerBundleUnloadMinThroughputThreshold * MIBI
        avg = self._update_avg(load_data, settings, res.record)
        res.record["avg_usage"] = avg
        if avg == 0:
            res.record["reason"] = "average usage is 0"
            return res
        for broker in sorted(load_data.brokers):
            local = load_data.brokers[broker].local
            cur = self.avg_usage.get(broker, 0.0)
            rec = res.record["brokers"].setdefault(broker, {})
            rec["avg_usage"] = cur
            if cur < avg + threshold:
                rec["action"] = "not-overloaded"
                continue
            fraction = cur - avg - threshold + ADDITIONAL_THRESHOLD_PERCENT_MARGIN
            throughput = local.msgThroughputIn + local.msgThroughputOut
            to_offload = throughput * fraction
            rec["to_offload"] = to_offload
            if to_offload < min_throughput:
                rec["action"] = "below-min-throughput"
                continue
            _offload(load_data, broker, local, to_offload, res, rec)
        if not res.unloads and settings.lowerBoundarySheddingEnabled:
            self._lower_boundary(load_data, settings, res)
        return res

    def _lower_boundary(self, load_data: LoadData, settings: LoadBalancerSettings, res: ShedderResult) -> None:
        """If some broker is below mean - threshold, shed threshold * 50 % of the throughput of the
        busiest broker (above mean - threshold, more than one bundle). As in Pulsar, the averages
        are updated a second time in this cycle before deciding."""
        threshold = settings.loadBalancerBrokerThresholdShedderPercentage / 100.0
        avg = self._update_avg(load_data, settings, {})
        rec: dict[str, Any] = {"avg_usage": avg}
        res.record["lower_boundary"] = rec
        busiest, top = None, avg - threshold
        below = False
        for broker in sorted(load_data.brokers):
            cur = self.avg_usage.get(broker, 0.0)
            if cur > top and len(load_data.brokers[broker].local.bundles) > 1:
                busiest, top = broker, cur
            if cur < avg - threshold:
                below = True
        rec.update(broker=busiest, broker_below_lower_bound=below)
        if busiest is None or not below:
            rec["action"] = "none"
            return
        local = load_data.brokers[busiest].local
        to_offload = (local.msgThroughputIn + local.msgThroughputOut) * threshold * LOWER_BOUNDARY_THRESHOLD_MARGIN
        rec["to_offload"] = to_offload
        if settings.loadBalancerBundleUnloadMinThroughputThreshold * MIBI > to_offload:
            rec["action"] = "below-min-throughput"
            return
        picked = _select_until(_candidates(load_data, busiest, _short_term_throughput), to_offload)
        res.unloads += [(busiest, b) for b in picked]
        rec["action"] = "shed"
        rec["bundles"] = picked


class OverloadShedder:
    name = "OverloadShedder"

    def find_bundles_for_unloading(self, load_data: LoadData, settings: LoadBalancerSettings) -> ShedderResult:
        res = ShedderResult(record={"strategy": self.name, "brokers": {}})
        threshold = settings.loadBalancerBrokerOverloadedThresholdPercentage / 100.0
        for broker in sorted(load_data.brokers):
            local = load_data.brokers[broker].local
            usage = local.max_resource_usage()
            rec = res.record["brokers"][broker] = {"usage": usage}
            if usage < threshold:
                rec["action"] = "not-overloaded"
                continue
            to_offload = (local.msgThroughputIn + local.msgThroughputOut) * (
                usage - threshold + ADDITIONAL_THRESHOLD_PERCENT_MARGIN)
            rec["to_offload"] = to_offload
            _offload(load_data, broker, local, to_offload, res, rec)
        return res


class UniformLoadShedder:
    name = "UniformLoadShedder"

    def find_bundles_for_unloading(self, load_data: LoadData, settings: LoadBalancerSettings) -> ShedderResult:
        res = ShedderResult(record={"strategy": self.name})
        rec = res.record
        max_rate = max_thr = -1.0
        min_rate = min_thr = float(JAVA_INT_MAX)
        rate_hi = thr_hi = rate_lo = thr_lo = None
        for broker in sorted(load_data.brokers):
            local = load_data.brokers[broker].local
            rate = local.msgRateIn + local.msgRateOut
            thr = local.msgThroughputIn + local.msgThroughputOut
            if rate > max_rate:
                rate_hi, max_rate = broker, rate
            if thr > max_thr:
                thr_hi, max_thr = broker, thr
            if rate < min_rate:
                rate_lo, min_rate = broker, rate
            if thr < min_thr:
                thr_lo, min_thr = broker, thr
        if -UNIFORM_EPS <= min_rate <= UNIFORM_EPS:
            min_rate = 1.0
        if -UNIFORM_EPS <= min_thr <= UNIFORM_EPS:
            min_thr = 1.0
        rate_diff_pct = (max_rate - min_rate) * 100 / min_rate
        thr_ratio = max_thr / min_thr
        rate_hit = (settings.loadBalancerMsgRateDifferenceShedderThreshold > 0
                    and rate_diff_pct > settings.loadBalancerMsgRateDifferenceShedderThreshold)
        thr_hit = (settings.loadBalancerMsgThroughputMultiplierDifferenceShedderThreshold > 0
                   and thr_ratio > settings.loadBalancerMsgThroughputMultiplierDifferenceShedderThreshold)
        rec.update(max_rate_broker=rate_hi, min_rate_broker=rate_lo, max_msg_rate=max_rate, min_msg_rate=min_rate,
                   msg_rate_difference_percent=rate_diff_pct, max_throughput_broker=thr_hi,
                   min_throughput_broker=thr_lo, max_throughput=max_thr, min_throughput=min_thr,
                   throughput_ratio=thr_ratio, msg_rate_exceeded=rate_hit, throughput_exceeded=thr_hit)
        if not (rate_hit or thr_hit):
            rec["action"] = "balanced"
            return res
        # Pulsar keeps these in ints: the amounts and each subtraction are truncated
        if rate_hit:
            broker, remaining = rate_hi, _java_int((max_rate - min_rate) * settings.maxUnloadPercentage)
            minimum, by = settings.minUnloadMessage, "msgRate"
            value: Callable[[Any], float] = lambda d: d.shortTermData.msgRateIn + d.shortTermData.msgRateOut
        else:
            broker, remaining = thr_hi, _java_int((max_thr - min_thr) * settings.maxUnloadPercentage)
            minimum, by = settings.minUnloadMessageThroughput, "msgThroughput"
            value = _short_term_throughput
        rec.update(by=by, broker=broker, to_offload=remaining)
        local = load_data.brokers[broker].local
        if len(local.bundles) <= 1 or remaining < minimum:
            rec["action"] = "sole-bundle" if len(local.bundles) <= 1 else "below-minimum"
            return res
        cap = settings.maxUnloadBundleNumPerShedding
        for bundle, v in _candidates(load_data, broker, value):
            if cap != -1 and len(res.unloads) >= cap:
                break
            if v <= remaining:
                remaining += _java_int(-v)
                res.unloads.append((broker, bundle))
        rec["action"] = "shed" if res.unloads else "no-bundle-fits"
        return res


SHEDDING_STRATEGIES = {"ThresholdShedder": ThresholdShedder, "OverloadShedder": OverloadShedder,
                       "UniformLoadShedder": UniformLoadShedder}

Shedder = ThresholdShedder | OverloadShedder | UniformLoadShedder


def make_shedding_strategy(settings: LoadBalancerSettings) -> Shedder:
    """The strategy `loadBalancerLoadSheddingStrategy` names (`org.apache.pulsar.broker.loadbalance.
    impl.ThresholdShedder` or `ThresholdShedder`...). Pulsar falls back to OverloadShedder on a class
    it cannot load; we refuse it (a misspelt strategy would silently change the experiment)."""
    short = settings.loadBalancerLoadSheddingStrategy.rsplit(".", 1)[-1]
    if short not in SHEDDING_STRATEGIES:
        raise ValueError(f"unknown loadBalancerLoadSheddingStrategy {settings.loadBalancerLoadSheddingStrategy!r}; "
                         f"known: {sorted(SHEDDING_STRATEGIES)}")
    return SHEDDING_STRATEGIES[short]()


# ---------------------------------------------------------------------------------------------------
# the leader's cycle

@dataclass
class Unload:
    bundle: str
    src: str
    dst: str
    placement: dict[str, Any] | None = None     # the destination's PlacementDecision, if the callback gave one


@dataclass
class ShedDecision:
    skipped: str | None = None                  # why the whole cycle did nothing, if it did not run
    strategy: str = ""
    unloads: list[Unload] = field(default_factory=list)
    not_unloaded: list[dict[str, Any]] = field(default_factory=list)   # {bundle, src, dst, why}
    expired: list[str] = field(default_factory=list)                    # grace-period entries dropped
    strategy_record: dict[str, Any] = field(default_factory=dict)

    @property
    def unloaded_brokers(self) -> int:
        """Brokers with at least one unload (brk_lb_unload_broker_total's increment)."""
        return len({u.src for u in self.unloads})

    def as_dict(self) -> dict[str, Any]:
        return {"skipped": self.skipped, "strategy": self.strategy,
                "unloads": [{"bundle": u.bundle, "src": u.src, "dst": u.dst, "placement": u.placement}
                            for u in self.unloads],
                "not_unloaded": list(self.not_unloaded), "expired": list(self.expired),
                "strategy_record": self.strategy_record}


def placement_destination(load_data: LoadData, settings: LoadBalancerSettings, rng: random.Random,
                          candidates: Callable[[str], Iterable[str]] | None = None,
                          strategy: LeastLongTermMessageRate | LeastResourceUsageWithWeight | None = None,
                          counts: Callable[[str], Mapping[str, int]] | None = None
                          ) -> Callable[[str], PlacementDecision]:
    """A `select_destination` for plan_shedding that asks the placement as Pulsar's doLoadShedding
    does (selectBroker: the whole pipeline, without preallocating). `candidates(bundle)` gives
    the brokers allowed for the bundle (default: every broker with load data). `counts(namespace)`, if
    given, answers LoadData.namespace_bundle_counts(namespace) from the caller's index (the same numbers,
    without scanning every bundle for each destination)."""
    def select(bundle: str) -> PlacementDecision:
        cands = candidates(bundle) if candidates is not None else load_data.brokers
        ns_counts = counts(namespace_of(bundle)) if counts is not None else None
        return select_broker(bundle, cands, load_data, settings, rng, ns_counts, strategy=strategy,
                             preallocate=False)
    return select


def plan_shedding(load_data: LoadData, strategy: Shedder, recently_unloaded: MutableMapping[str, int], now_ms: int,
                  settings: LoadBalancerSettings,
                  select_destination: Callable[[str], str | PlacementDecision | None],
                  skip_current_owner: bool = True) -> ShedDecision:
    """One shedding cycle of the leader (doLoadShedding), without the unload calls.

    Skipped when loadBalancerEnabled or loadBalancerSheddingEnabled is off, or when at most one
    broker has load data. Entries of `recently_unloaded` (bundle -> ms of unload) older than
    loadBalancerSheddingGracePeriodMinutes are dropped; the rest are kept from being picked
    (`load_data.recently_unloaded_bundles` becomes this very dict). For each (broker, bundle) the
    strategy proposes, `select_destination(bundle)` names the destination (a broker id, a
    PlacementDecision, or None); no destination -> not unloaded; destination == current owner ->
    not unloaded (apache/pulsar#20822) unless `skip_current_owner=False`, the bug knob that unloads
    it anyway (the bundle comes back to the same broker, over and over). Each planned unload is
    recorded in `recently_unloaded` at `now_ms`: the glue removes the entry if its unload fails.
    """
    decision = ShedDecision(strategy=getattr(strategy, "name", type(strategy).__name__))
    if not (settings.loadBalancerEnabled and settings.loadBalancerSheddingEnabled):
        decision.skipped = "disabled"
        return decision
    if len(load_data.brokers) <= 1:
        decision.skipped = "only one broker"
        return decision
    timeout = now_ms - settings.loadBalancerSheddingGracePeriodMinutes * 60_000
    for bundle, ts in list(recently_unloaded.items()):
        if ts < timeout:
            del recently_unloaded[bundle]
            decision.expired.append(bundle)
    load_data.recently_unloaded_bundles = recently_unloaded    # type: ignore[assignment]
    result = strategy.find_bundles_for_unloading(load_data, settings)
    decision.strategy_record = result.record
    for broker, bundle in result.unloads:
        answer = select_destination(bundle)
        placement = answer.as_dict() if isinstance(answer, PlacementDecision) else None
        dst = answer.broker if isinstance(answer, PlacementDecision) else answer
        if dst is None:
            decision.not_unloaded.append({"bundle": bundle, "src": broker, "dst": None, "why": "no destination"})
            continue
        if dst == broker and skip_current_owner:
            decision.not_unloaded.append({"bundle": bundle, "src": broker, "dst": dst,
                                          "why": "destination is the current owner"})
            continue
        decision.unloads.append(Unload(bundle, broker, dst, placement))
        recently_unloaded[bundle] = now_ms
    return decision
