"""LoadBalancerSettings: Pulsar's names and defaults, from_mapping's checks and coercion."""
from __future__ import annotations

import dataclasses

import pytest

from clusters.loadbalancer.settings import LoadBalancerSettings


def test_defaults_are_pulsars():
    s = LoadBalancerSettings()
    # ServiceConfiguration defaults (ThresholdShedder is the default shedder since 2.10)
    assert s.loadBalancerLoadSheddingStrategy == "org.apache.pulsar.broker.loadbalance.impl.ThresholdShedder"
    assert s.loadBalancerLoadPlacementStrategy == "org.apache.pulsar.broker.loadbalance.impl.LeastLongTermMessageRate"
    assert s.loadBalancerBrokerOverloadedThresholdPercentage == 85
    assert s.loadBalancerSheddingGracePeriodMinutes == 30
    assert s.loadBalancerNamespaceMaximumBundles == 128
    assert s.loadBalancerNamespaceBundleMaxMsgRate == 30000
    assert s.loadBalancerNamespaceBundleMaxBandwidthMbytes == 100
    assert s.loadBalancerHistoryResourcePercentage == 0.9
    assert s.defaultNumberOfNamespaceBundles == 4
    assert s.defaultNamespaceBundleSplitAlgorithm == "range_equally_divide"
    assert s.maxUnloadBundleNumPerShedding == -1
    assert s.minUnloadMessageThroughput == 1024 * 1024


def test_from_mapping_coerces_broker_conf_strings():
    s = LoadBalancerSettings.from_mapping({
        "loadBalancerSheddingIntervalMinutes": "0.05",
        "lowerBoundarySheddingEnabled": "true",
        "loadBalancerNamespaceMaximumBundles": "16",
        "supportedNamespaceBundleSplitAlgorithms": "range_equally_divide, topic_count_equally_divide",
    })
    assert s.loadBalancerSheddingIntervalMinutes == 0.05
    assert s.lowerBoundarySheddingEnabled is True
    assert s.loadBalancerNamespaceMaximumBundles == 16
    assert s.supportedNamespaceBundleSplitAlgorithms == ("range_equally_divide", "topic_count_equally_divide")


def test_unknown_name_names_the_nearest():
    with pytest.raises(ValueError, match="did you mean 'loadBalancerSheddingEnabled'") as e:
        LoadBalancerSettings.from_mapping({"loadBalancerShedingEnabled": False})
    assert "\n" not in str(e.value)
    # Pulsar's spelling is the only one accepted
    with pytest.raises(ValueError, match="loadBalancerBandwithInResourceWeight"):
        LoadBalancerSettings.from_mapping({"loadBalancerBandwidthInResourceWeight": 1.0})


@pytest.mark.parametrize("name,value", [("loadBalancerSheddingEnabled", "maybe"),
                                        ("loadBalancerNamespaceMaximumBundles", 1.5),
                                        ("loadBalancerNamespaceMaximumBundles", True),
                                        ("loadBalancerBrokerOverloadedThresholdPercentage", "high"),
                                        ("defaultNamespaceBundleSplitAlgorithm", "halve")])
def test_bad_values_are_refused(name, value):
    with pytest.raises(ValueError, match=name):
        LoadBalancerSettings.from_mapping({name: value})


def test_as_dict_round_trips_and_is_frozen():
    s = LoadBalancerSettings.from_mapping({"maxUnloadPercentage": 0.5})
    d = s.as_dict()
    assert d["maxUnloadPercentage"] == 0.5
    assert isinstance(d["supportedNamespaceBundleSplitAlgorithms"], list)
    assert LoadBalancerSettings.from_mapping(d) == s
    assert s.replace(maxUnloadPercentage=0.2) == LoadBalancerSettings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.maxUnloadPercentage = 0.1  # type: ignore[misc]
