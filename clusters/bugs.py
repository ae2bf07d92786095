"""The reference system's bug knobs: ordinary, documented options that restore a known unsafe behaviour.

They exist so that a test can prove the harness catches the bug; all are safe by default.

`REGISTRY` (a `core.registry.Registry`, like the faults', workloads' and checkers') maps each knob's name
to its `Knob`: the component it belongs to, its safe default, what the unsafe value does, the upstream
issue(s) it restores, and the scenario that exposes it (`pulsar-chaos bugs` lists them). A plugin adds
one with `REGISTRY.register(name, Knob(...))`.

Every component of the reference system receives its knobs the one way: a `Knobs` object built from
its node's `bugs` map and the component's name, at construction (`Knobs(cfg.bugs, "broker")`, or the
owner's `knobs.of("bookkeeper-client")`), and asks it `knobs.on("broker.schema_no_cas")`. It refuses an
unknown knob and a knob of another component, so a typo cannot silently read the default.
docs/extending.md has the recipe for a new knob.

A reported bug whose cause is not understood upstream gets no knob (a guessed mechanism would prove
nothing about the harness); bench/README.md "Four real Pulsar bugs as knobs" keeps a row for each with
the reason: apache/pulsar#20968 (rolling broker restarts lose data: open, not reproduced by the
maintainers, no fix) and apache/pulsar#22709 (acknowledgements lost when bookies and brokers restart:
closed without a reproducer or a fix naming a mechanism).
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any

from core.registry import Registry

# the parts of the reference system a knob can belong to (the `component` of a Knob, of a Knobs)
COMPONENTS = ("bookie", "bookkeeper-client", "managed-ledger", "broker", "load-balancer")
_ISSUE = re.compile(r"^[\w.-]+/[\w.-]+#\d+$")


@dataclass(frozen=True)
class Knob:
    """A bug knob's declaration. `issues`: the upstream issues or pull requests whose bug it restores
    ("apache/pulsar#7517"; empty for a knob that models a setting, e.g. journalSyncData=false, or an
    unsafe design no issue names); `scenario`: the `pulsar-chaos run` arguments that expose it (its
    row of campaigns/detection.toml), to which `--bug NAME` is added."""
    default: Any
    help: str
    _: KW_ONLY
    component: str
    issues: tuple[str, ...] = ()
    scenario: str = ""

    def __post_init__(self) -> None:
        if self.component not in COMPONENTS:
            raise ValueError(f"Knob(component={self.component!r}): use one of {', '.join(COMPONENTS)}")
        if isinstance(self.issues, str):
            raise ValueError(f"Knob(issues={self.issues!r}) must be a tuple of 'owner/repo#N', e.g. "
                             f"('apache/pulsar#7517',)")
        bad = [i for i in self.issues if not _ISSUE.match(i)]
        if bad:
            raise ValueError(f"Knob(issues=...) names {bad}; write each as 'owner/repo#N', e.g. apache/pulsar#7517")

    def to_json(self, name: str) -> dict[str, Any]:
        return {"name": name, "component": self.component, "default": self.default, "issues": list(self.issues),
                "scenario": self.scenario, "help": self.help}


_FENCING = "--workload log --nemesis zk-isolate --nemesis-interval 15 --time-limit 35"
_LB = "--brokers 3 --topics 40 --lb-setting loadBalancerReportUpdateMinIntervalMillis=1000"
_SHED = ("--workload balance --nemesis none --brokers 3 --topics 40 --time-limit 45 "
         "--lb-setting loadBalancerReportUpdateMinIntervalMillis=1000 "
         "--lb-setting loadBalancerSheddingIntervalMinutes=0.1 --lb-setting defaultNumberOfNamespaceBundles=12 "
         "--lb-setting loadBalancerOverrideBrokerNicSpeedGbps=0.0001 "
         "--lb-setting loadBalancerBrokerOverloadedThresholdPercentage=1 "
         "--lb-setting loadBalancerBundleUnloadMinThroughputThreshold=0")
_ROUND2 = "--nemesis kill,partition,zk-isolate --time-limit 60 --settle 10"
_DISK_WIPE = ("--workload log --nemesis none --nemesis-schedule bench/disk_wipe_schedule.toml --topics 1 "
              "--ensemble 2 --write-quorum 2 --ack-quorum 2 --time-limit 50")
# B1: the recoverer's fencing LAC read to one bookie of the ensemble is lost, and the (one) writer's adds to
# that bookie are 300 ms late, so its in-flight entry sits on the other bookie alone (Qa - 1 copies)
_B1 = ("--workload ledger --nemesis none --concurrency 2 --ensemble 2 --write-quorum 2 --ack-quorum 2 "
       "--time-limit 20 --option recover_interval=1.0 --option ledger_max_entries=0 --option lost_fence=true "
       "--option slow_adds_ms=300")
# B2: the writer's adds from entry 50 on are lost, so it replaces its whole ensemble 5 s later (the add timeout)
# and the last fragment stays empty; the recoverer's write-backs are lost; its first recovery comes 6-18 s in,
# after that change (one before it would hold the ledger in recovery, the writer's change refused)
_B2 = ("--workload ledger --nemesis none --bookies 4 --ensemble 2 --write-quorum 2 --ack-quorum 2 "
       "--time-limit 30 --option recover_interval=12.0 --option ledger_max_entries=0 --option lost_adds_from=50 "
       "--option lost_recovery_adds=true")
# B12: BookKeeper's own example (E 2, Qw = Qa = 1), a random bookie killed every ~4 s; the writer's adds to one
# bookie of the ensemble 20 ms late, so that the other's completed adds wait behind them when it dies, and its
# metadata writes 50 ms late, so that the late adds complete while its ensemble change is in progress
_B12 = ("--workload ledger --nemesis kill:bookie --nemesis-interval 2 --ensemble 2 --write-quorum 1 "
        "--ack-quorum 1 --rate 400 --time-limit 30 --option recover_interval=20.0 --option slow_adds_ms=20 "
        "--option slow_metadata_ms=50")
# B3: the issue's own example (E 3, Qw 3, Qa 2) on 6 bookies; the bookies of each ledger's first ensemble refuse
# the writer's adds one after another, each refusal after the entry reached Qa, and the writer's metadata writes
# are 4 s late, so that its three ensemble changes are in the store only seconds later; a recovery every ~4 s
_B3 = ("--workload ledger --nemesis none --bookies 6 --ensemble 3 --write-quorum 3 --ack-quorum 2 --rate 200 "
       "--time-limit 30 --option recover_interval=4.0 --option ledger_max_entries=0 "
       "--option refused_adds_every=100 --option slow_metadata_ms=4000")
# B11 (apache/pulsar#18236's own steps): the queue's subscription created by the admin API at the latest
# position before anything is sent, its consumers only 12 s later; the owner killed at 5 s, before any
# acknowledgement has made the cursor write its position again
_B11 = ("--workload queue --option subscribe_ahead_s=12 --nemesis kill:owner --nemesis-interval 5 "
        "--time-limit 30 --topics 1")
# B7 (#26197): every broker cut from ZooKeeper for 10 s (a ZooKeeper outage: every session expires), three
# bundles on two brokers, producers kept (no lookups while cut). As the sessions return, each broker's stale
# unloads close its topics and their clients look up at once: the first broker back is the only one
# registered, and the other holds fewer bundles of the namespace, so a broker is handed its own bundle back
# 0.15-0.5 s after its stale unload began; 120 topics (40 a bundle) keep the unloads running that long (with
# 20 they had often ended; with one broker cut, the other, registered all along, always got the bundle)
_B7 = ("--workload balance --nemesis zk-isolate:all-broker --nemesis-interval 10 --time-limit 45 --client-lifetime 0 "
       "--brokers 2 --topics 120 --lb-setting loadBalancerReportUpdateMinIntervalMillis=1000 "
       "--lb-setting defaultNumberOfNamespaceBundles=3")
# B5: two bookies, E = Qw = Qa = 2, 20 messages/s (gaps between entries, so that the last entry acknowledged
# is often above every LAC the bookies hold); the owner of the one topic killed (its ledger left open), then
# bookie-1 restarted on a truncated newest entry log and bookie-2 killed for 8 s, so the new owner's
# recovery of that ledger hears bookie-1 alone (bench/b5_schedule.toml)
_B5 = ("--workload log --nemesis none --nemesis-schedule bench/b5_schedule.toml --bookies 2 --topics 1 "
       "--ensemble 2 --write-quorum 2 --ack-quorum 2 --rate 20 --time-limit 35")
# B6: the owner of some topics paused for 16 s (a stop-the-world pause), twice: its ZooKeeper session expires and
# new producers' lookups (a producer lives 1 s) make the other broker take its topics over, recover their last
# ledgers and delete the empty ones; ledgers roll over by age (1.2 s) and each topic gets a send every ~15 s, so
# a topic's last ledger is empty at the pause; on resuming, the old owner writes the sends that reached it meanwhile
# to those ledgers. Cursor positions written at most every 100 s, so that a cursor write does not find the takeover
# first. The bookies garbage-collect deleted ledgers every second (gcWaitTime; BookKeeper's default is 10 min).
_B6 = ("--workload log --nemesis pause:owner --nemesis-interval 16 --time-limit 60 --topics 16 --concurrency 30 "
       "--rate 2 --client-lifetime 1 --broker-setting managedLedgerMaxLedgerRolloverTimeMinutes=0.02 "
       "--broker-setting managedLedgerDefaultMarkDeleteRateLimit=0.01 --bookie-setting gcWaitTime=1000")
# the extensible load manager's knobs (bench/README.md "Detection of the extensible load manager's bug knobs")
_EXT = ("--workload balance --load-manager extensible --nemesis none --brokers 3 --topics 40 "
        "--lb-setting loadBalancerReportUpdateMinIntervalMillis=1000")
# two splits, a rolling restart (each broker leaves gracefully: forced transfers), then two bursts of
# replayed channel messages
_EXT_REPLAY = f"{_EXT} --nemesis-schedule bench/lb_replay_schedule.toml --time-limit 45"
# twice a follower killed, two bundles transferred towards it while it is down, restarted within its
# session; 12 bundles; the monitor's interval longer than the run, the in-flight wait 5 s (Pulsar's names)
_EXT_RESTART = (f"{_EXT} --nemesis-schedule bench/lb_restart_schedule.toml --time-limit 40 "
                "--lb-setting defaultNumberOfNamespaceBundles=12 "
                "--lb-setting loadBalancerInFlightServiceUnitStateWaitingTimeInMillis=5000 "
                "--lb-setting loadBalancerServiceUnitStateMonitorIntervalInSeconds=120")
# the channel's records in ZooKeeper (ServiceUnitStateMetadataStoreTableViewImpl); a topic's owner cut from
# ZooKeeper for 12 s (past its 6-s session) twice; the leader's ownership monitor every 2 s (Pulsar: 60)
_EXT_METADATA = ("--workload balance --load-manager extensible --nemesis zk-isolate --nemesis-interval 12 "
                 "--time-limit 36 --brokers 3 --topics 40 --lb-setting loadBalancerReportUpdateMinIntervalMillis=1000 "
                 "--lb-setting loadManagerServiceUnitStateTableViewClassName=ServiceUnitStateMetadataStoreTableViewImpl "
                 "--lb-setting loadBalancerServiceUnitStateMonitorIntervalInSeconds=2")

# the order is the order of `pulsar-chaos bugs`
REGISTRY: Registry[Knob] = Registry("bug knob", {
    "bookie.ack_before_fsync": Knob(
        False, "bookie acknowledges an add once the journal write is issued, before fsync "
               "(BookKeeper's journalSyncData=false): power loss can lose acknowledged entries",
        component="bookie", scenario="--workload log --nemesis power-loss --nemesis-interval 10 --time-limit 30"),
    "bookie.ignore_fence": Knob(
        False, "bookie keeps accepting normal adds on a ledger it has fenced (it still records the "
               "fence and answers fencing reads), so a writer whose ledger was recovered and closed "
               "by another client keeps getting adds acknowledged beyond the closed end",
        component="bookie", scenario="--workload ledger --nemesis none --time-limit 10 "
                                     "--option recover_interval=1.0 --option ledger_max_entries=0"),
    "bookie.no_cookie": Knob(
        False, "bookie writes and checks no cookie: restarted on a wiped or replaced disk it rejoins at "
               "once under its old identity and answers 'no such entry' for entries it had acknowledged, "
               "and ledger recovery then truncates acknowledged entries (with cookies it refuses to start "
               "until formatted as a new bookie, and the ledgers it lost are in limbo)",
        component="bookie", issues=("apache/bookkeeper#4812", "apache/pulsar#26074"), scenario=_DISK_WIPE),
    "broker.recovery_fencing": Knob(
        True, "when false, a broker taking over a topic closes the previous owner's ledger in "
              "metadata without fencing it on the bookies, so the old owner can keep getting "
              "adds acknowledged that nobody will ever read",
        component="managed-ledger", scenario=_FENCING),
    "broker.dedup_pushed_only": Knob(
        False, "deduplication compares a message against the highest sequence id *pushed* to the ledger "
               "and keeps it after a failed write (Pulsar before apache/pulsar#5243, the bug of #5218), so "
               "a producer's resend of a message whose write failed is acknowledged as a duplicate and "
               "never stored",
        component="broker", issues=("apache/pulsar#5218", "apache/pulsar#5243"),
        scenario="--workload queue --option dedup=true --nemesis kill:ledger-bookies,flaky:owner "
                 "--nemesis-interval 10 --time-limit 30"),
    "broker.reactivate_on_release_failure": Knob(
        False, "a broker whose ZooKeeper delete of a bundle lock fails while unloading it re-activates the "
               "bundle and serves it again, although the delete's outcome is unknown and another broker may "
               "own it now (apache/pulsar#7517; the two-owner family of #24478): two owners",
        component="broker", issues=("apache/pulsar#7517", "apache/pulsar#24478"),
        scenario=f"--workload balance --nemesis unload:lost-answer --time-limit 45 {_LB}"),
    "broker.split_without_cas": Knob(
        False, "a bundle split reads the namespace's boundaries and writes them back without a version "
               "check, in separate steps, so concurrent splits of one namespace overwrite each other's "
               "boundaries (apache/pulsar#1117, #1428): a split's children vanish from the boundaries while "
               "their owner serves them, and the parent range is assigned again",
        component="broker", issues=("apache/pulsar#1117", "apache/pulsar#1428"),
        scenario=f"--workload balance --nemesis split --nemesis-interval 2 --time-limit 40 {_LB}"),
    "broker.schema_no_cas": Knob(
        False, "a new schema version is written to the topic's schema locator znode without a version "
               "check (Pulsar's BookkeeperSchemaStorage does a compare-and-set, and nothing else orders "
               "writers), so two producers or registrations bringing new schemas to one owner at once, or an "
               "old and a new owner during a takeover, both get the same version number for different "
               "schemas, and one of them is lost",
        component="broker", scenario=f"--workload schema {_ROUND2}"),
    "broker.delayed_index_in_memory": Knob(
        False, "a delayed message (deliverAt/deliverAfter on Shared and Key_Shared) counts as consumed for the "
               "subscription's persisted position while it waits in the broker's in-memory delayed index, so a "
               "broker crash or an owner change loses every delayed message not yet delivered",
        component="broker", scenario=f"--workload queue --option delay_max_ms=3000 {_ROUND2}"),
    "lb.shed_to_owner": Knob(
        False, "load shedding may choose the bundle's current owner as the destination, so the bundle is "
               "unloaded and assigned back to the same broker over and over (apache/pulsar#20822)",
        component="load-balancer", issues=("apache/pulsar#20822",), scenario=_SHED),
    "lb.keep_preallocations": Knob(
        False, "the leader never releases a bundle's preallocation, neither when the bundle shows in a load report "
               "nor when its broker dies, so it keeps assigning the bundle to a dead broker (apache/pulsar#478, "
               "#481)",
        component="load-balancer", issues=("apache/pulsar#478", "apache/pulsar#481"),
        scenario=f"--workload balance --nemesis kill:lb-follower --nemesis-interval 12 --time-limit 50 {_LB}"),
    # the BookKeeper client's and the bookie's real bugs (B1, B2, B4, B12 of the reference notes)
    "bk.recovery_reads_no_fence": Knob(
        False, "ledger recovery's reads carry no fence flag, only its LAC reads fence (BookKeeper before "
               "apache/bookkeeper#2616): when the fencing LAC read to one bookie is lost, that bookie stays "
               "unfenced, the reads decide the old writer's in-flight entry absent from the other bookies' "
               "'no such entry', and the entry reaches its ack quorum on the unfenced bookie after the ledger "
               "was closed before it",
        component="bookkeeper-client", issues=("apache/bookkeeper#2614", "apache/bookkeeper#2616"),
        scenario=_B1),
    "bk.recovery_min_lac_minus_one": Knob(
        False, "ledger recovery starts at the highest LAC the last ensemble reports, without the floor "
               "first-entry-of-the-last-fragment - 1 (BookKeeper before apache/bookkeeper#2654): an empty last "
               "fragment makes it re-add earlier fragments' entries, and one failed write-back then asks for a "
               "fragment keyed below the last one; the recovery fails the same way every time (the ledger "
               "cannot be closed: an availability bug)",
        component="bookkeeper-client", issues=("apache/bookkeeper#2615", "apache/bookkeeper#2654"),
        scenario=_B2),
    "bookie.no_limbo": Knob(
        False, "a wiped bookie, refused by its cookies and formatted, rejoins under its id trusted at once, as "
               "BookKeeper before BP-46 had it (apache/bookkeeper#2612): no ledger in limbo, so it answers 'no "
               "such entry' for entries it had acknowledged and lost, nothing is fenced or marked "
               "under-replicated, and recovery or reads take its answer for the truth (bookie.no_cookie goes "
               "further: the wiped bookie is not even refused)",
        component="bookie", issues=("apache/bookkeeper#2612",), scenario=_DISK_WIPE),
    "bk.ack_broken_entry_on_ensemble_change": Knob(
        False, "after an ensemble change the writer re-examines its pending adds in order with the change "
               "already over, and one the replaced bookie did not store acknowledges the completed adds behind "
               "it before their ack sets lost the replaced bookie (apache/bookkeeper#3005, fixed by #3041): an "
               "entry is acknowledged with fewer than Qa copies in its new fragment and never re-sent",
        component="bookkeeper-client", issues=("apache/bookkeeper#3005", "apache/bookkeeper#3041"),
        scenario=_B12),
    "bk.delayed_ensemble_change_local_only": Knob(
        False, "with Qw > Qa, a bookie that fails an add after it reached Qa is replaced (when the next add is "
               "sent) in the writer's local ensemble only, its metadata update left to the background while "
               "acknowledgements go on (apache/bookkeeper#1591, fixed by #1592): with the metadata store slow, "
               "successive failures move the whole write set to bookies the stored ensemble does not name, and a "
               "recovery then closes the ledger without the entries acknowledged on them",
        component="bookkeeper-client", issues=("apache/bookkeeper#1591", "apache/bookkeeper#1592"),
        scenario=_B3),
    "bookie.write_after_delete_accepted": Knob(
        False, "a bookie forgets a ledger's fence when the ledger is deleted (a client's delete, or garbage "
               "collection once its metadata is gone) and takes a later add to it for the first add of a new "
               "ledger (BookKeeper before apache/bookkeeper#4462; apache/pulsar#20094): a broker whose session "
               "expired keeps writing to its empty last ledger, which the topic's new owner recovered and "
               "deleted, and its producers get acknowledgements for messages nobody can read",
        component="bookie", issues=("apache/bookkeeper#4462", "apache/pulsar#20094"), scenario=_B6),
    "broker.dedup_recovery_race": Knob(
        False, "deduplication's recovery can run twice at once and a topic can open before it ends "
               "(apache/pulsar#25954, fixed by #25953): the enable path marks the status Recovering only "
               "after opening the dedup cursor, a check that finds it Recovering takes the recovery as done, "
               "and one that comes earlier starts a second replay over the same cursor; a topic load with "
               "topic-level policies checks twice, so a producer's resends after an owner change are "
               "stored again although deduplication is on",
        component="broker", issues=("apache/pulsar#25954", "apache/pulsar#25953"),
        scenario="--workload queue --option dedup=true --nemesis kill:owner --nemesis-interval 5 "
                 "--time-limit 45 --topics 1 --rate 2000"),
    "broker.cursor_persist_read_position": Knob(
        False, "a cursor created at the latest position or reset to a position persists its read position "
               "(the next entry to deliver) as its mark-delete position (apache/pulsar#18236, fixed by "
               "#18237; Pulsar's internalResetCursor): a broker killed before the cursor's next write leaves "
               "the next owner a subscription that skips an entry nobody acknowledged",
        component="managed-ledger", issues=("apache/pulsar#18236", "apache/pulsar#18237"),
        scenario=_B11),
    "broker.rollover_race_creates_two_ledgers": Knob(
        False, "the time-based rollover check (managedLedgerMaxLedgerRolloverTimeMinutes) also acts while the "
               "next ledger is being created, so a second ledger is created beside it (apache/pulsar#12221, "
               "#14664, fixed by #12223 and #14664): it takes the writes, its ledger-list update fails, and the "
               "adds acknowledged on it are in a ledger the list does not name (no consumer reads them)",
        component="managed-ledger", issues=("apache/pulsar#12221", "apache/pulsar#12223", "apache/pulsar#14664"),
        scenario="--workload log --nemesis slow:owner --nemesis-interval 8 --time-limit 30 "
                 "--broker-setting managedLedgerMaxLedgerRolloverTimeMinutes=0.02"),
    "broker.release_reacquired_lock": Knob(
        False, "a bundle lock that expired with the ZooKeeper session starts an unload in the background, and "
               "that unload, when it ends, deletes the bundle's lock whatever its generation "
               "(apache/pulsar#26197): a lookup that re-acquired the bundle meanwhile keeps serving it without "
               "a lock, and another broker acquires it too: two owners",
        component="broker", issues=("apache/pulsar#26197",),
        scenario=_B7),
    "bk.corrupt_log_says_nosuchentry": Knob(
        False, "a bookie whose entry log cannot give back an entry its index lists (a truncated log, a "
               "checksum mismatch) answers 'no such entry' instead of an I/O error (BookKeeper before "
               "apache/bookkeeper#2909, the bug of #2908): ledger recovery counts that answer as the entry's "
               "absence, and one such answer (Qw - Qa + 1 = 1 with Qw = Qa) closes the ledger before "
               "acknowledged entries another bookie still holds",
        component="bookie", issues=("apache/bookkeeper#2908", "apache/bookkeeper#2909"), scenario=_B5),
    "lb.no_version_check": Knob(
        False, "the extensible load manager's table views resolve channel messages without the versionId rule "
               "(before apache/pulsar#19620), so a delayed message of an older version from a partitioned broker "
               "is accepted whenever its transition is valid, and a forced one always: a stale transfer moves a "
               "bundle, and the views diverge from the topic's order",
        component="load-balancer", issues=("apache/pulsar#19620",), scenario=_EXT_REPLAY),
    "lb.tombstone_split_parent": Knob(
        False, "the extensible load manager's split handler tombstones the parent bundle as soon as it is Deleted "
               "(the 3.0-era handler), so the parent is Init again, which accepts any message, and a transfer step "
               "that raced the split re-owns the split parent beside its children (apache/pulsar#19490)",
        component="load-balancer", issues=("apache/pulsar#19490",), scenario=_EXT_REPLAY),
    "lb.ignore_existing_assigning": Knob(
        False, "a restarted broker (extensible load manager) handles only the Owned records it finds in the channel's "
               "history, not an Assigning to itself, so a bundle assigned to it while it was down stays Assigning "
               "until the leader's ownership monitor overrides it (apache/pulsar#25379)",
        component="load-balancer", issues=("apache/pulsar#25379",), scenario=_EXT_RESTART),
    "lb.metadata_table_view_stale_cache": Knob(
        False, "the extensible load manager's metadata-store table view (ServiceUnitStateMetadataStoreTableViewImpl) "
               "ignores its ZooKeeper session's loss, as before apache/pulsar#24478: it neither drops its records "
               "(closing the bundles it owned by them) when the session is lost nor reads the znodes again on the "
               "new session, so what changed meanwhile is never seen; a broker whose bundles the leader moved while "
               "it was cut from ZooKeeper still owns them by its table and serves them beside the new owner: "
               "two owners",
        component="load-balancer", issues=("apache/pulsar#24478",), scenario=_EXT_METADATA),
})
KNOBS = REGISTRY        # the name callers used before the registry


class UnknownBugKnob(ValueError):
    """A knob name no entry has."""


class KnobOfAnotherComponent(UnknownBugKnob):
    """A component asked for a knob that belongs to another one."""


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
        if key not in REGISTRY:
            known = ", ".join(sorted(REGISTRY))
            raise UnknownBugKnob(f"unknown bug knob {key!r}; known knobs: {known}")
        out[key] = parse_value(raw) if sep else True
    return out


def value(bugs: Mapping[str, Any] | None, key: str) -> Any:
    """The knob's value in this configuration, its safe default if unset (any component's knob: for
    the harness side; a component reads its own through its `Knobs`)."""
    if key not in REGISTRY:
        raise UnknownBugKnob(f"unknown bug knob {key!r}; known knobs: {', '.join(sorted(REGISTRY))}")
    if bugs and key in bugs:
        return bugs[key]
    return REGISTRY[key].default


def components() -> tuple[str, ...]:
    return COMPONENTS


def of_component(component: str) -> dict[str, Knob]:
    """The registered knobs of one component, in registry order."""
    return {name: k for name, k in REGISTRY.items() if k.component == component}


class Knobs:
    """One component's bug knobs: the node's `bugs` map (knob name -> value; a name not in it is at its
    safe default) seen by one component, which asks `on(name)` or `value(name)`. Asking for an unknown
    knob or for another component's knob raises (`UnknownBugKnob`, `KnobOfAnotherComponent`): a misspelt
    name must not read the default silently. `of(other)` is the same map for a component this one builds
    (the broker's BookKeeper client, its load manager)."""

    __slots__ = ("component", "_values")

    def __init__(self, values: Mapping[str, Any] | None, component: str):
        if component not in COMPONENTS:
            raise ValueError(f"unknown component {component!r} for bug knobs; use one of {', '.join(COMPONENTS)}")
        self.component = component
        self._values: dict[str, Any] = dict(values or {})

    @classmethod
    def defaults(cls, component: str) -> "Knobs":
        """Every knob at its safe default (harness-side clients, tests)."""
        return cls(None, component)

    def of(self, component: str) -> "Knobs":
        return self if component == self.component else Knobs(self._values, component)

    def value(self, name: str) -> Any:
        knob = REGISTRY.get(name)
        if knob is None:
            mine = ", ".join(of_component(self.component)) or "none"
            raise UnknownBugKnob(f"unknown bug knob {name!r} read by the {self.component}; its knobs: {mine}")
        if knob.component != self.component:
            raise KnobOfAnotherComponent(f"bug knob {name!r} belongs to the {knob.component}, not the "
                                         f"{self.component}; read it there, through that component's knobs")
        return self._values.get(name, knob.default)

    def on(self, name: str) -> bool:
        """The knob's value as a switch."""
        return bool(self.value(name))

    def unsafe(self) -> dict[str, Any]:
        """This component's knobs set off their safe default."""
        return {n: self._values[n] for n, k in of_component(self.component).items()
                if n in self._values and self._values[n] != k.default}

    def __repr__(self) -> str:
        return f"Knobs({self.component}, {self.unsafe()})"
