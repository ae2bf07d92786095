"""The service-unit state channel's data and its conflict resolver (Pulsar's channel/ package).

Every bundle ("service unit") has one record on the compacted system topic
`persistent://pulsar/system/loadbalancer-service-unit-state`, keyed by the bundle's name. Every broker
reads the whole topic into a table view; a message the resolver rejects is skipped by every view
alike, so all views that read the same sequence hold the same table (Pulsar relies on the topic's
total order; the compactor applies the same resolver).

- `ServiceUnitState`: Init (no record, or tombstoned), Free, Owned, Assigning, Releasing, Splitting,
  Deleted; `is_in_flight` (Assigning, Releasing, Splitting) and `is_active` (in-flight or Owned).
- `is_valid_transition(from, to, storage)`: ServiceUnitState's tables for `StorageType.SystemTopic`
  (Init may go anywhere: compaction can drop history) and `StorageType.MetadataStore`.
- `ServiceUnitStateData`: Pulsar's record (state, dstBroker, sourceBroker,
  splitServiceUnitToDestBroker, force, timestamp, versionId) and its JSON as Pulsar's
  `Schema.JSON(ServiceUnitStateData.class)` writes it: the record's component names, the enum's
  constant name ("Owned"), null fields left out (the JSON schema's NON_NULL inclusion), the split map's
  `Optional<String>` values as the string or null. `decode` raises `ChannelDecodeError` (one line)
  on anything else.
- `resolve(from, to, storage, check_brokers)`: ServiceUnitStateDataConflictResolver.shouldKeepLeft,
  returning why `to` is rejected (None: accepted); `should_keep_left` is its boolean.
- `ChannelView`: the table view with the resolver: `apply(key, value | None)`.
"""
from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Mapping

JAVA_LONG_MAX = 2 ** 63 - 1
JAVA_LONG_MIN = -(2 ** 63)
VERSION_ID_INIT = 1
CHANNEL_TOPIC = "persistent://pulsar/system/loadbalancer-service-unit-state"


class ServiceUnitState(str, enum.Enum):
    Init = "Init"
    Free = "Free"
    Owned = "Owned"
    Assigning = "Assigning"
    Releasing = "Releasing"
    Splitting = "Splitting"
    Deleted = "Deleted"


S = ServiceUnitState
IN_FLIGHT = frozenset({S.Assigning, S.Releasing, S.Splitting})
ACTIVE = IN_FLIGHT | {S.Owned}


def is_in_flight(state: ServiceUnitState) -> bool:
    return state in IN_FLIGHT


def is_active(state: ServiceUnitState) -> bool:
    return state in ACTIVE


class StorageType(str, enum.Enum):
    SystemTopic = "SystemTopic"
    MetadataStore = "MetadataStore"


VALID_TRANSITIONS: dict[StorageType, dict[ServiceUnitState, frozenset[ServiceUnitState]]] = {
    StorageType.SystemTopic: {
        S.Init: frozenset({S.Free, S.Owned, S.Assigning, S.Releasing, S.Splitting, S.Deleted}),
        S.Free: frozenset({S.Assigning, S.Init}),
        S.Owned: frozenset({S.Splitting, S.Releasing}),
        S.Assigning: frozenset({S.Owned}),
        S.Releasing: frozenset({S.Assigning, S.Free}),
        S.Splitting: frozenset({S.Deleted}),
        S.Deleted: frozenset({S.Init}),
    },
    StorageType.MetadataStore: {
        S.Init: frozenset({S.Assigning}),
        S.Free: frozenset({S.Assigning}),
        S.Owned: frozenset({S.Splitting, S.Releasing}),
        S.Assigning: frozenset({S.Owned}),
        S.Releasing: frozenset({S.Assigning, S.Free}),
        S.Splitting: frozenset({S.Deleted}),
        S.Deleted: frozenset({S.Init}),
    },
}


def is_valid_transition(frm: ServiceUnitState, to: ServiceUnitState,
                        storage: StorageType = StorageType.SystemTopic) -> bool:
    return to in VALID_TRANSITIONS[storage][frm]


class ChannelDecodeError(ValueError):
    """A channel message that is not a ServiceUnitStateData."""


def is_blank(s: str | None) -> bool:
    return s is None or not s.strip()


@dataclass(frozen=True)
class ServiceUnitStateData:
    state: ServiceUnitState
    dstBroker: str | None = None
    sourceBroker: str | None = None
    # child bundle range ("0x00000000_0x7fffffff") -> destination broker or None
    splitServiceUnitToDestBroker: Mapping[str, str | None] | None = None
    force: bool = False
    timestamp: int = 0
    versionId: int = VERSION_ID_INIT

    def __post_init__(self) -> None:
        if not isinstance(self.state, ServiceUnitState):
            object.__setattr__(self, "state", ServiceUnitState(self.state))
        # the record's compact constructor: every state but Free names a broker
        if self.state != S.Free and is_blank(self.dstBroker) and is_blank(self.sourceBroker):
            raise ValueError(f"Empty broker: a {self.state.value} record needs dstBroker or sourceBroker")
        if not JAVA_LONG_MIN <= self.versionId <= JAVA_LONG_MAX:
            raise ValueError(f"versionId {self.versionId} is outside a Java long")

    def __hash__(self) -> int:  # the split map is a dict; hash what identifies a record
        return hash((self.state, self.dstBroker, self.sourceBroker, self.force, self.timestamp, self.versionId))

    def with_(self, **changes: Any) -> "ServiceUnitStateData":
        return replace(self, **changes)

    # -- JSON ----------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state.value}
        if self.dstBroker is not None:
            out["dstBroker"] = self.dstBroker
        if self.sourceBroker is not None:
            out["sourceBroker"] = self.sourceBroker
        if self.splitServiceUnitToDestBroker is not None:
            out["splitServiceUnitToDestBroker"] = dict(self.splitServiceUnitToDestBroker)
        out["force"] = self.force
        out["timestamp"] = self.timestamp
        out["versionId"] = self.versionId
        return out

    def encode(self) -> bytes:
        return json.dumps(self.to_json(), separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: Any) -> "ServiceUnitStateData":
        if not isinstance(raw, dict):
            raise ChannelDecodeError(f"a ServiceUnitStateData is a JSON object, got {type(raw).__name__}")
        state = raw.get("state")
        if state not in ServiceUnitState.__members__:
            raise ChannelDecodeError(f"unknown service-unit state {state!r}; "
                                     f"one of {list(ServiceUnitState.__members__)}")
        for k in ("dstBroker", "sourceBroker"):
            if raw.get(k) is not None and not isinstance(raw[k], str):
                raise ChannelDecodeError(f"{k} must be a string or null, got {raw[k]!r}")
        split = raw.get("splitServiceUnitToDestBroker")
        if split is not None and (not isinstance(split, dict) or not all(
                isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in split.items())):
            raise ChannelDecodeError(f"splitServiceUnitToDestBroker must map ranges to a broker or null, got {split!r}")
        force = raw.get("force", False)
        if not isinstance(force, bool):
            raise ChannelDecodeError(f"force must be a boolean, got {force!r}")
        nums = {}
        for k, default in (("timestamp", 0), ("versionId", 0)):
            v = raw.get(k, default)
            if isinstance(v, bool) or not isinstance(v, int) or not JAVA_LONG_MIN <= v <= JAVA_LONG_MAX:
                raise ChannelDecodeError(f"{k} must be a Java long, got {v!r}")
            nums[k] = v
        try:
            return cls(ServiceUnitState(state), raw.get("dstBroker"), raw.get("sourceBroker"),
                       dict(split) if split is not None else None, force, nums["timestamp"], nums["versionId"])
        except ValueError as e:
            raise ChannelDecodeError(str(e)) from None

    @classmethod
    def decode(cls, payload: bytes | str) -> "ServiceUnitStateData":
        """From a channel message's value; ChannelDecodeError if it is not one."""
        try:
            raw = json.loads(payload)
        except (UnicodeDecodeError, ValueError) as e:
            raise ChannelDecodeError(f"a channel message is not JSON: {e}") from None
        return cls.from_json(raw)


def state_of(data: ServiceUnitStateData | None) -> ServiceUnitState:
    """A missing record (or tombstone) is Init."""
    return S.Init if data is None else data.state


def next_version_id(prev: ServiceUnitStateData | None) -> int:
    """What a writer publishes after `prev` (getNextVersionId): 1 after nothing, else +1 with Java
    long overflow (MAX -> MIN)."""
    if prev is None:
        return VERSION_ID_INIT
    return JAVA_LONG_MIN if prev.versionId == JAVA_LONG_MAX else prev.versionId + 1


# reasons a message is rejected
VERSION_NOT_NEWER = "version-not-newer"
VERSION_GAP = "version-gap"
VERSION_NOT_INITIAL = "version-not-initial"
INVALID_TRANSITION = "invalid-transition"
BROKER_MISMATCH = "broker-mismatch"


def resolve(frm: ServiceUnitStateData | None, to: ServiceUnitStateData | None,
            storage: StorageType = StorageType.SystemTopic, check_brokers: bool = True,
            check_version: bool = True) -> str | None:
    """Why `to` loses against the current `frm` (ServiceUnitStateDataConflictResolver.shouldKeepLeft),
    or None if `to` is accepted. Rules, in order:
    1. a tombstone (`to` None) is accepted;
    2. versions: MAX -> MIN is an overflow and goes on; `from.v >= to.v` is rejected; a gap
       (`from.v < to.v - 1`) is accepted on the system topic (compaction dropped the messages between)
       and rejected on the metadata store; without `from`, the metadata store wants `to.v == 1`;
    3. `to.force` is accepted (but not before the version check);
    4. an invalid transition is rejected;
    5. with `check_brokers`, the brokers must agree with the transition (see `_brokers_mismatch`).
    Without `check_version` rule 2 is skipped: the resolver before apache/pulsar#19620 added versionId
    (the bug knob lb.no_version_check), which accepts a delayed message of an older version whenever its
    transition is valid, and a forced one always."""
    if to is None:
        return None
    if not check_version:
        pass
    elif frm is not None:
        if frm.versionId == JAVA_LONG_MAX and to.versionId == JAVA_LONG_MIN:
            pass
        elif frm.versionId >= to.versionId:
            return VERSION_NOT_NEWER
        elif frm.versionId < to.versionId - 1:
            if storage != StorageType.SystemTopic:
                return VERSION_GAP
            return None
    elif storage == StorageType.MetadataStore and to.versionId != VERSION_ID_INIT:
        return VERSION_NOT_INITIAL
    if to.force:
        return None
    prev, nxt = state_of(frm), to.state
    if not is_valid_transition(prev, nxt, storage):
        return INVALID_TRANSITION
    if check_brokers and frm is not None and _brokers_mismatch(frm, to):
        return BROKER_MISMATCH
    return None


def _same_brokers(a: ServiceUnitStateData, b: ServiceUnitStateData) -> bool:
    return a.dstBroker == b.dstBroker and a.sourceBroker == b.sourceBroker


def _brokers_mismatch(frm: ServiceUnitStateData, to: ServiceUnitStateData) -> bool:
    """The broker checks of a valid transition (the Java switch's cases each return, so no
    fall-through applies)."""
    pair = (frm.state, to.state)
    if pair == (S.Owned, S.Splitting):
        # the owner splits: no destination, the source is the owner
        return not is_blank(to.dstBroker) or frm.dstBroker != to.sourceBroker
    if pair == (S.Owned, S.Releasing):
        # the owner releases: source is the owner, destination (if any) another broker
        return is_blank(to.sourceBroker) or frm.dstBroker != to.sourceBroker or frm.dstBroker == to.dstBroker
    if pair in ((S.Assigning, S.Owned), (S.Releasing, S.Free), (S.Splitting, S.Deleted)):
        return not _same_brokers(frm, to)
    if pair == (S.Releasing, S.Assigning):
        return is_blank(to.dstBroker) or not _same_brokers(frm, to)
    if pair == (S.Free, S.Assigning):
        return not is_blank(to.sourceBroker) or is_blank(to.dstBroker)
    return False


def should_keep_left(frm: ServiceUnitStateData | None, to: ServiceUnitStateData | None,
                     storage: StorageType = StorageType.SystemTopic, check_brokers: bool = True,
                     check_version: bool = True) -> bool:
    """True: `to` is rejected and `frm` stays (Pulsar's name)."""
    return resolve(frm, to, storage, check_brokers, check_version) is not None


@dataclass(frozen=True)
class ApplyResult:
    key: str
    accepted: bool
    reason: str | None                         # why rejected; None when accepted
    previous: ServiceUnitStateData | None      # the record before the message
    current: ServiceUnitStateData | None       # the record after it


@dataclass
class ChannelView:
    """A broker's table view of the channel with the conflict resolver: messages are applied in the
    topic's order; a rejected one leaves the table as it was. Two views fed the same sequence are
    equal (`==`)."""
    storage: StorageType = StorageType.SystemTopic
    check_brokers: bool = True
    # False: the resolver without its version rule (the bug knob lb.no_version_check, apache/pulsar#19620)
    check_version: bool = True
    data: dict[str, ServiceUnitStateData] = field(default_factory=dict)
    # the keys in Splitting, kept by apply (SplitScheduler asks every cycle; a scan would cost every bundle)
    _splitting: set[str] = field(default_factory=set, compare=False, repr=False)
    # the keys in order, kept until a key comes or goes (most messages change a record, not the key set)
    _keys: list[str] | None = field(default=None, compare=False, repr=False)

    def apply(self, key: str, value: ServiceUnitStateData | None) -> ApplyResult:
        prev = self.data.get(key)
        reason = resolve(prev, value, self.storage, self.check_brokers, self.check_version)
        if reason is not None:
            return ApplyResult(key, False, reason, prev, prev)
        if value is None:
            if self.data.pop(key, None) is not None:
                self._keys = None
        else:
            if prev is None:
                self._keys = None
            self.data[key] = value
        if value is not None and value.state == S.Splitting:
            self._splitting.add(key)
        else:
            self._splitting.discard(key)
        return ApplyResult(key, True, None, prev, value)

    def replace(self, key: str, value: ServiceUnitStateData | None) -> ApplyResult | None:
        """The metadata-store table view's update (MetadataStoreTableViewImpl.updateData): the record read
        from the store replaces the cached one, without the resolver (the store applied it on the write,
        and a notification may skip versions); None when it equals the cached one (nothing to handle)."""
        prev = self.data.get(key)
        if prev == value:
            return None
        if value is None:
            self.data.pop(key, None)
            self._keys = None
            self._splitting.discard(key)
        else:
            if prev is None:
                self._keys = None
            self.data[key] = value
            if value.state == S.Splitting:
                self._splitting.add(key)
            else:
                self._splitting.discard(key)
        return ApplyResult(key, True, None, prev, value)

    def clear(self) -> list[tuple[str, ServiceUnitStateData]]:
        """Drop every record (the metadata-store table view's untrusted data after a session loss); the
        records dropped."""
        dropped = self.items()
        self.data.clear()
        self._splitting.clear()
        self._keys = None
        return dropped

    def splitting(self) -> list[str]:
        """The keys whose record is Splitting, sorted."""
        return sorted(self._splitting)

    def apply_encoded(self, key: str, payload: bytes | None) -> ApplyResult:
        """A raw message: None (or empty) is a tombstone; ChannelDecodeError on a bad payload."""
        return self.apply(key, ServiceUnitStateData.decode(payload) if payload else None)

    def get(self, key: str) -> ServiceUnitStateData | None:
        return self.data.get(key)

    def state(self, key: str) -> ServiceUnitState:
        return state_of(self.data.get(key))

    def __contains__(self, key: object) -> bool:
        return key in self.data

    def _sorted_keys(self) -> list[str]:
        if self._keys is None or len(self._keys) != len(self.data):
            self._keys = sorted(self.data)
        return self._keys

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._sorted_keys()))

    def __len__(self) -> int:
        return len(self.data)

    def items(self) -> list[tuple[str, ServiceUnitStateData]]:
        keys = self._sorted_keys()
        return list(zip(keys, map(self.data.__getitem__, keys)))

    def owned_by(self, broker: str) -> list[str]:
        return [k for k, d in self.items() if d.state == S.Owned and d.dstBroker == broker]

    def is_owner(self, key: str, broker: str) -> bool:
        """ServiceUnitStateChannel.isOwner: the record is Owned with dstBroker == broker."""
        d = self.data.get(key)
        return d is not None and d.state == S.Owned and d.dstBroker == broker
