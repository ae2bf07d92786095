"""The reference system's bug knobs: ordinary, documented options that restore a known unsafe behaviour.

They exist so that a test can prove the harness catches the bug; all are off (safe) by default.
A new one is one entry here, read with `value(cfg.bugs, key)` where the behaviour lives
(docs/extending.md).
"""
from __future__ import annotations

from typing import Any, NamedTuple


class Knob(NamedTuple):
    """A bug knob's declaration: its safe default, and what turning it to the unsafe value does."""
    default: Any
    help: str


KNOBS: dict[str, Knob] = {
    "bookie.ack_before_fsync": Knob(
        False, "bookie acknowledges an add once the journal write is issued, before fsync "
               "(BookKeeper's journalSyncData=false): power loss can lose acknowledged entries"),
    "bookie.ignore_fence": Knob(
        False, "bookie keeps accepting normal adds on a ledger it has fenced (it still records the "
               "fence and answers fencing reads), so a writer whose ledger was recovered and closed "
               "by another client keeps getting adds acknowledged beyond the closed end"),
    # component: bookie; upstream: a bookie without a cookie check (apache/bookkeeper#4812,
    # apache/pulsar#26074; before apache/bookkeeper#544 / PR #712 for empty directories);
    # scenario: disk-wipe of a bookie of a ledger's last entry, then ledger recovery
    "bookie.no_cookie": Knob(
        False, "bookie writes and checks no cookie: restarted on a wiped or replaced disk it rejoins at "
               "once under its old identity and answers 'no such entry' for entries it had acknowledged, "
               "and ledger recovery then truncates acknowledged entries (with cookies it refuses to start "
               "until formatted as a new bookie, and the ledgers it lost are in limbo)"),
    "broker.recovery_fencing": Knob(
        True, "when false, a broker taking over a topic closes the previous owner's ledger in "
              "metadata without fencing it on the bookies, so the old owner can keep getting "
              "adds acknowledged that nobody will ever read"),
    "broker.dedup_pushed_only": Knob(
        False, "deduplication compares a message against the highest sequence id *pushed* to the ledger "
               "and keeps it after a failed write (Pulsar before apache/pulsar#5243, the bug of #5218), so "
               "a producer's resend of a message whose write failed is acknowledged as a duplicate and "
               "never stored"),
    "broker.reactivate_on_release_failure": Knob(
        False, "a broker whose ZooKeeper delete of a bundle lock fails while unloading it re-activates the "
               "bundle and serves it again, although the delete's outcome is unknown and another broker may "
               "own it now (apache/pulsar#7517; the two-owner family of #24478): two owners"),
    "broker.split_without_cas": Knob(
        False, "a bundle split reads the namespace's boundaries and writes them back without a version "
               "check, in separate steps, so concurrent splits of one namespace overwrite each other's "
               "boundaries (apache/pulsar#1117, #1428): a split's children vanish from the boundaries while "
               "their owner serves them, and the parent range is assigned again"),
    "broker.schema_no_cas": Knob(
        False, "a new schema version is written to the topic's schema locator znode without a version "
               "check (Pulsar's BookkeeperSchemaStorage does a compare-and-set, and nothing else orders "
               "writers), so two producers or registrations bringing new schemas to one owner at once, or an "
               "old and a new owner during a takeover, both get the same version number for different "
               "schemas, and one of them is lost"),
    "broker.delayed_index_in_memory": Knob(
        False, "a delayed message (deliverAt/deliverAfter on Shared and Key_Shared) counts as consumed for the "
               "subscription's persisted position while it waits in the broker's in-memory delayed index, so a "
               "broker crash or an owner change loses every delayed message not yet delivered"),
    "lb.shed_to_owner": Knob(
        False, "load shedding may choose the bundle's current owner as the destination, so the bundle is "
               "unloaded and assigned back to the same broker over and over (apache/pulsar#20822)"),
    "lb.keep_preallocations": Knob(
        False, "the leader never releases a bundle's preallocation, neither when the bundle shows in a load report "
               "nor when its broker dies, so it keeps assigning the bundle to a dead broker (apache/pulsar#478, "
               "#481)"),
}


class UnknownBugKnob(ValueError):
    pass


def parse_value(raw: str) -> Any:
    low = raw.strip().lower()
    if low in ("true", "yes", "on", "1"):
        return True
    if low in ("false", "no", "off", "0"):
        return False
    try:
        return int(raw)
    except ValueError:
        pass
    try:
        return float(raw)
    except ValueError:
        return raw


def parse(items: list[str] | None) -> dict[str, Any]:
    """Parse `KEY[=VALUE]` strings (a bare key means true) into a validated knob map."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if key not in KNOBS:
            known = ", ".join(sorted(KNOBS))
            raise UnknownBugKnob(f"unknown bug knob {key!r}; known knobs: {known}")
        out[key] = parse_value(raw) if sep else True
    return out


def value(bugs: dict[str, Any] | None, key: str) -> Any:
    """The knob's value in this configuration, its safe default if unset."""
    if key not in KNOBS:
        raise UnknownBugKnob(key)
    if bugs and key in bugs:
        return bugs[key]
    return KNOBS[key].default
