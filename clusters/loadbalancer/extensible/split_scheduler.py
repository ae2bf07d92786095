"""SplitScheduler's per-cycle choice (DefaultNamespaceBundleSplitStrategyImpl), pure.

Every broker, every loadBalancerSplitIntervalMinutes, looks at its own bundles' instantaneous stats
(`bundle_stats`, not long-term averages). A bundle qualifies with at least two topics, owned by this
broker in the channel view, with a splittable range, and one of: topics >
loadBalancerNamespaceBundleMaxTopics (Topics), producers + consumers >
loadBalancerNamespaceBundleMaxSessions if > 0 (Sessions), msg rate in+out >
loadBalancerNamespaceBundleMaxMsgRate (MsgRate), throughput in+out >
loadBalancerNamespaceBundleMaxBandwidthMbytes MiB (Bandwidth) — the thresholds of the modular split
task (splitting.py). The condition must hold on more than
loadBalancerNamespaceBundleSplitConditionHitCountThreshold consecutive cycles (the scheduler keeps
the counts; a cycle without the condition resets the bundle's count). Then: the namespace's bundle
count plus this cycle's splits must stay below loadBalancerNamespaceMaximumBundles (128); a bundle
whose range shares an end with a bundle in Splitting is left alone; the boundary comes from
defaultNamespaceBundleSplitAlgorithm (splitting.py) and must be exactly one; at most
loadBalancerMaxNumberOfBundlesToSplitPerCycle splits a cycle.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from clusters.loadbalancer.data import MIBI, NamespaceBundleStats, bundle_bounds, namespace_of, range_of
from clusters.loadbalancer.extensible.state import ChannelView
from clusters.loadbalancer.settings import LoadBalancerSettings
from clusters.loadbalancer.splitting import can_split, split_boundaries


@dataclass(frozen=True)
class SplitDecision:
    bundle: str
    source_broker: str
    children: dict[str, str | None]     # child range -> destination (None: stays on the source)
    reason: str                         # Topics | Sessions | MsgRate | Bandwidth


@dataclass
class SplitResult:
    decisions: list[SplitDecision] = field(default_factory=list)
    failures: list[tuple[str, str]] = field(default_factory=list)       # (bundle, why), counted Failure/Unknown


def split_reason(stats: NamespaceBundleStats, settings: LoadBalancerSettings) -> str | None:
    if stats.topics > settings.loadBalancerNamespaceBundleMaxTopics:
        return "Topics"
    if (settings.loadBalancerNamespaceBundleMaxSessions > 0
            and stats.consumerCount + stats.producerCount > settings.loadBalancerNamespaceBundleMaxSessions):
        return "Sessions"
    if stats.msgRateIn + stats.msgRateOut > settings.loadBalancerNamespaceBundleMaxMsgRate:
        return "MsgRate"
    if stats.msgThroughputIn + stats.msgThroughputOut > settings.loadBalancerNamespaceBundleMaxBandwidthMbytes * MIBI:
        return "Bandwidth"
    return None


class SplitScheduler:
    def __init__(self) -> None:
        self.hit_counts: dict[str, int] = {}

    def decide(self, bundle_stats: Mapping[str, NamespaceBundleStats], *, me: str, view: ChannelView,
               bundle_counts: Mapping[str, int], settings: LoadBalancerSettings,
               topics: Mapping[str, Sequence[str]] | None = None) -> SplitResult:
        """One cycle of broker `me`. `bundle_counts`: namespace -> its current number of bundles;
        `topics`: bundle -> its topics' full names (for the topic-count algorithm)."""
        s = settings
        out = SplitResult()
        if not s.loadBalancerAutoBundleSplitEnabled:
            return out
        splitting = view.splitting()
        for b in list(self.hit_counts):
            if b not in bundle_stats:
                del self.hit_counts[b]
        pending: dict[str, int] = {}
        for bundle, stats in sorted(bundle_stats.items()):
            if stats.topics < 2 or not view.is_owner(bundle, me):
                continue
            lo, hi = bundle_bounds(bundle)
            if not can_split(lo, hi):
                out.failures.append((bundle, "range cannot be split"))
                continue
            reason = split_reason(stats, s)
            if reason is not None:
                self.hit_counts[bundle] = self.hit_counts.get(bundle, 0) + 1
            else:
                self.hit_counts.pop(bundle, None)
            if self.hit_counts.get(bundle, 0) <= s.loadBalancerNamespaceBundleSplitConditionHitCountThreshold:
                continue
            ns = namespace_of(bundle)
            if bundle_counts.get(ns, 0) + pending.get(ns, 0) >= s.loadBalancerNamespaceMaximumBundles:
                continue
            lo_s, hi_s = range_of(bundle).split("_")
            if any(namespace_of(p) == ns and (range_of(p).startswith(lo_s) or range_of(p).endswith(hi_s))
                   for p in splitting):
                continue
            cuts = split_boundaries(s.defaultNamespaceBundleSplitAlgorithm, lo, hi, s,
                                    topics=(topics or {}).get(bundle, ()))
            if not cuts or len(cuts) != 1:
                out.failures.append((bundle, f"split boundaries {cuts}"))
                continue
            children = {f"0x{lo:08x}_0x{cuts[0]:08x}": None, f"0x{cuts[0]:08x}_0x{hi:08x}": None}
            out.decisions.append(SplitDecision(bundle, me, children, reason))
            pending[ns] = pending.get(ns, 0) + 1
            self.hit_counts.pop(bundle, None)
            if len(out.decisions) >= s.loadBalancerMaxNumberOfBundlesToSplitPerCycle:
                break
        return out
