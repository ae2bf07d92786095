"""The simulator's model parameters: what the load managers' code does not decide but the time it
takes does. Each has its value and where that value comes from. `SimParams.from_mapping` takes
overrides (a scenario's `[params]` table) and refuses unknown names with the nearest known one.

Where a value says "assumed" it is not calibrated on our own cluster yet (bench/README.md "lb-sim"
says which figures depend on it); "Pulsar default" values are the client's or broker's defaults.
"""
from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import Any, Mapping

SOURCES: dict[str, str] = {
    "lookup_ms": "assumed: one lookup round trip client -> broker on a LAN (our loopback clusters: ~1 ms)",
    "redirect_ms": "assumed: a redirect is one more lookup round trip (same as lookup_ms)",
    "topic_load_ms": "assumed: opening a topic's managed ledger (metadata reads + a ledger create), ~20 ms "
                     "on our loopback clusters' logs; not calibrated at scale",
    "topic_load_concurrency": "Pulsar default maxConcurrentTopicLoadRequest is 5000; 100 assumed effective "
                              "(bounded by the metadata store and bookies)",
    "metadata_write_ms": "assumed: one ZooKeeper write (an ownership lock) ~5 ms latency",
    "metadata_write_service_ms": "assumed: ZooKeeper serialises writes at ~2000/s per ensemble (0.5 ms each)",
    "leader_assign_ms": "assumed: the modular leader's selectBrokerForAssignment is synchronized; 2 ms per "
                        "assignment with 100 brokers (our placement code's cost is measured separately)",
    "channel_ms": "assumed: a service-unit-channel message's publish + tail latency on a system topic, 5 ms",
    "channel_service_ms": "assumed: the channel topic's owner writes ~5000 messages/s (0.2 ms each)",
    "backoff_initial_ms": "Pulsar client default: initial reconnect back-off 100 ms",
    "backoff_max_ms": "Pulsar client default: max back-off 60 s (ClientBuilder.maxBackoffInterval)",
    "backoff_jitter": "Pulsar client's Backoff adds up to 10 % random jitter",
    "broker_restart_ms": "assumed: a broker process stopped and started again and registered, 30 s",
    "graceful_unload_ms": "assumed: a broker's graceful shutdown unloads its bundles in ~5 s before exiting; the "
                          "validation scenario's is measured on our real runs (each stop of a leave, per load manager)",
    "publish_ms": "assumed: a publish's latency while the topic is connected, 5 ms (p50 of our runs' sends)",
    "cpu_per_msg_us": "assumed: 20 us of CPU per message in + out on a broker",
    "cpu_cores": "assumed: 8 cores per broker",
    "nic_mbytes": "assumed: 125 MB/s per broker (1 Gbit/s) each way",
    "base_cpu_percent": "assumed: an idle broker's CPU, 5 % of one core per core (an idle broker's whole usage: "
                        "memory is not in the extensible load manager's max). The validation scenarios' is measured "
                        "on our real runs' reports of brokers without topics (`python -m bench.lb_sim calibrate`): "
                        "0.3 to 0.6 %",
    "report_noise": "0 by default (high rates average out): each report's bandwidth and message CPU times "
                    "max(0, 1 + N(0, report_noise)), a relative noise the same at every rate. The validation "
                    "scenario used 0.35 until our real reports showed their noise is a count's (report_noise_kb)",
    "report_noise_kb": "0 by default. Counting noise of a report's bandwidth: variance D x its KB/s over the report's "
                       "seconds (relative noise 1 / sqrt(rate)), one draw for in and out (our reports' in and out "
                       "deviations correlate at 0.86). The validation scenario's D is measured on our real runs' "
                       "reports before the leave (`python -m bench.lb_sim calibrate`, bench/README.md)",
    "base_kb_s": "0 by default. KB/s each way a broker carries without topics (lookups, keep-alives, consumers' "
                 "flow and acks not in a message's bytes); the validation scenario's is measured on our real runs "
                 "(the intercept of bandwidth against message rate)",
    "system_msg_overhead_bytes": "0 by default: the extensible load manager's system topics are not modelled as "
                                 "load. Above 0, every load-data, top-bundles and channel message costs its JSON plus "
                                 "these bytes on the leader, which owns those topics (once in, once per reader out), "
                                 "as on our brokers; the validation scenario's is a workload message's wire bytes "
                                 "beyond its payload, measured on our real runs",
    "connect_kb_in": "0 by default. KB a topic's clients send the broker it connects to beyond their messages "
                     "(lookups, producer and consumer commands), counted in that broker's next report: a broker that "
                     "takes many topics at once reports a burst. The validation scenario's is measured on our real "
                     "runs' leaves (`python -m bench.lb_sim leave`, bench/README.md)",
    "connect_kb_out": "0 by default. The same, from the broker to the clients (answers, and the consumer's "
                      "unacknowledged messages sent again: with 4 KB payloads 10 KB a topic, measured as the taking "
                      "broker's out beyond its in, `python -m bench.lb_sim leave`)",
    "stats_interval_ms": "0 by default: a bundle's rates are exact at every moment. Above 0, they are recomputed "
                         "every stats_interval_ms as our brokers' Rates do (clusters/broker/service.py "
                         "RATE_INTERVAL_S = 5 s): a topic shows nothing until the first recomputation after it "
                         "connected, then the part of that interval it was connected for",
    "report_phase": "0 by default: every broker reports at the same instant of each report round. Above 0, each "
                    "broker's reports come at its own offset into the round, drawn when it registers, uniform over "
                    "this fraction of the interval: our brokers' reporters start with the broker, and their "
                    "one-second reports keep each broker's own phase, spread over the second (bench/README.md "
                    "'Validation against our real cluster'); the validation scenarios use 1",
    "balance_smooth_s": "0: each broker's last report; the validation scenario uses 15 s, the '15 s band' of "
                        "bench/README.md (each broker's reports averaged over 15 s)",
    "balance_band": "the balance checker's band used in bench/README.md: every broker within 0.10 of the mean",
    "balance_hold_s": "the balance checker's hold_s used in bench/README.md: 15 s",
}


FRACTIONS = frozenset({"report_phase"})      # parameters from 0 to 1


@dataclass(frozen=True)
class SimParams:
    lookup_ms: float = 1.0
    redirect_ms: float = 1.0
    topic_load_ms: float = 20.0
    topic_load_concurrency: int = 100
    metadata_write_ms: float = 5.0
    metadata_write_service_ms: float = 0.5
    leader_assign_ms: float = 2.0
    channel_ms: float = 5.0
    channel_service_ms: float = 0.2
    backoff_initial_ms: float = 100.0
    backoff_max_ms: float = 60_000.0
    backoff_jitter: float = 0.1
    broker_restart_ms: float = 30_000.0
    graceful_unload_ms: float = 5_000.0
    publish_ms: float = 5.0
    cpu_per_msg_us: float = 20.0
    cpu_cores: int = 8
    nic_mbytes: float = 125.0
    base_cpu_percent: float = 5.0
    report_noise: float = 0.0
    report_noise_kb: float = 0.0
    base_kb_s: float = 0.0
    stats_interval_ms: float = 0.0
    system_msg_overhead_bytes: float = 0.0
    connect_kb_in: float = 0.0
    connect_kb_out: float = 0.0
    report_phase: float = 0.0
    balance_band: float = 0.10
    balance_hold_s: float = 15.0
    balance_smooth_s: float = 0.0

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "SimParams":
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kw: dict[str, Any] = {}
        for name, raw in values.items():
            if name not in fields:
                near = difflib.get_close_matches(name, fields, n=1, cutoff=0.0)
                raise ValueError(f"unknown simulator parameter {name!r}"
                                 + (f"; did you mean {near[0]!r}?" if near else ""))
            typ = int if fields[name].type == "int" else float
            try:
                kw[name] = typ(raw)
            except (TypeError, ValueError):
                raise ValueError(f"simulator parameter {name!r} expects a number, got {raw!r}") from None
            if kw[name] < 0:
                raise ValueError(f"simulator parameter {name!r} cannot be negative, got {raw!r}")
            if name in FRACTIONS and kw[name] > 1:
                raise ValueError(f"simulator parameter {name!r} is a fraction from 0 to 1, got {raw!r}")
        return cls(**kw)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def documented(self) -> list[dict[str, Any]]:
        return [{"name": k, "value": v, "source": SOURCES.get(k, "")} for k, v in self.as_dict().items()]
