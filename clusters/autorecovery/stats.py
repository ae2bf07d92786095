"""Prometheus series of auto-recovery (in the bookie's /metrics, clusters/metrics.py REGISTRY)."""
from __future__ import annotations

from clusters.metrics import REGISTRY

AUDITOR = REGISTRY.gauge("bookkeeper_autorecovery_auditor",
                         "1 while this process is the elected auditor")
AUDITS = REGISTRY.counter("bookkeeper_autorecovery_audits_total",
                          "audits of every ledger's metadata run by this auditor")
LEDGERS_MARKED = REGISTRY.counter("bookkeeper_autorecovery_ledgers_marked_total",
                                  "ledgers marked (or re-marked with more lost bookies) under-replicated")
LEDGERS_REPLICATED = REGISTRY.counter("bookkeeper_autorecovery_ledgers_replicated_total",
                                      "under-replicated ledgers this worker brought back and unmarked")
FRAGMENTS_REPLICATED = REGISTRY.counter("bookkeeper_autorecovery_fragments_replicated_total",
                                        "fragment copies swapped into ledger metadata")
ENTRIES_COPIED = REGISTRY.counter("bookkeeper_autorecovery_entries_copied_total",
                                  "entries copied onto a replacement bookie")
BYTES_COPIED = REGISTRY.counter("bookkeeper_autorecovery_bytes_copied_total",
                                "payload bytes copied onto a replacement bookie")
OPEN_LEDGERS_RECOVERED = REGISTRY.counter(
    "bookkeeper_autorecovery_open_ledgers_recovered_total",
    "open ledgers fenced and closed after the rereplication grace period")
METADATA_CONFLICTS = REGISTRY.counter("bookkeeper_autorecovery_metadata_conflicts_total",
                                      "metadata version conflicts while swapping a bookie in")
FAILURES = REGISTRY.counter("bookkeeper_autorecovery_failures_total",
                            "failed replication attempts of a ledger, by reason", ["reason"])
