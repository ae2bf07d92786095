"""The schema checker: every message's schema version exists, is the one its schema was given, means
one schema, and every broker answers the same versions; no incompatible schema is accepted.

A pure function over a schema-workload history (workloads/schema.py). Schemas are named by labels
(the workload's, e.g. "base", "t3.2", "t3.2!type"); the ops it reads:

- creations: f "create-producer", "create-consumer", "register" (opts["create"]); the invoke value
  {"schema": label, "change": "compatible" | "type" | "drop"}; a register's ok value {"version": v}
  is the version the broker answered for that schema. ok or info: the schema may be accepted.
- deliveries: f "receive" and the final "read" (opts["deliver"]); ok values are lists of
  {"value", "schema" (the writer's label, from the payload), "version" (from the metadata), ...}.
- the final registry: f "registry" (opts["registry"]), one per broker (node) and topic (key); ok
  value [{"version", "schema"}] is that broker's answer. The last ok answer of each broker counts.

Anomalies (all invalid unless opts["invalid"] says otherwise):
- `lost-version`: a delivered message whose version no broker's final answer for its topic holds
  (the version was given out, then lost from the registry).
- `unaccepted-version`: a delivered message whose version is not one its schema was given: a
  registration of its writer's schema on that topic was answered ok with other versions only, or
  no creation or registration of its writer's schema on that topic was ever answered ok (nor left
  indeterminate).
- `divergence`: two brokers' final answers for one topic differ (versions, or a version's schema),
  judged on the last round (the registry op's invoke value {"round"}) in which every broker asked
  answered ok: answers from different rounds can differ while a registration finishes. A topic
  without such a round is not judged for divergence (stats `topics_without_complete_round`).
  Every broker reads the same locator znode, without a cache, and the admin API forwards a
  schema request to the topic's owner (as Pulsar's SchemasResourceBase validates ownership), so a
  divergence can practically only come from a broker bug (a stale cache, a wrong path), not from
  the faults.
- `incompatible-accepted`: a creation or registration answered ok that the strategy
  (opts["strategy"], FULL by default) must refuse: `must_refuse(strategy, role, change)`, once the
  topic held a schema (a compatible creation on it had been answered ok before it was invoked;
  before that, any schema is a topic's first and accepted).
- `version-conflict`: one version number of a topic standing for two different schemas, among the
  delivered messages (version and writer label), the registrations' answers and the final answers.

Indeterminate ops never prove an anomaly: an info creation only counts as a possible acceptance, an
info registry answer is left out, and a topic with delivered messages but no ok final answer makes
the verdict "unknown" (lost-version cannot be judged there). Messages without a version (no schema)
or without a writer label are counted in the stats, not judged. One pass; memory linear in the
distinct (topic, version, label) triples and messages.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any

from checkers.toolkit import Cases, OpRefs, anomalies_of, anomaly_stats, jsonable, op_names, verdict
from core.history import INFO, OK, CheckResult, Op, pairs

ANOMALY_TYPES = ("lost-version", "unaccepted-version", "divergence", "incompatible-accepted", "version-conflict")

DEFAULTS: dict[str, Any] = {
    "strategy": "FULL",                                          # the namespace's compatibility strategy
    "create": ("create-producer", "create-consumer", "register"),
    "deliver": ("receive", "read"),
    "registry": ("registry",),
    "invalid": None,                                             # None: every type in ANOMALY_TYPES
    "max_anomalies": 1000,
}
STRATEGIES = ("ALWAYS_COMPATIBLE", "ALWAYS_INCOMPATIBLE", "BACKWARD", "FORWARD", "FULL",
              "BACKWARD_TRANSITIVE", "FORWARD_TRANSITIVE", "FULL_TRANSITIVE")


def must_refuse(strategy: str, role: str, change: str) -> bool:
    """Whether Pulsar refuses a schema with `change` against a topic holding the workload's series
    (SchemaRegistryServiceImpl; role "producer" and "register" add a version, "consumer" is only
    checked: BACKWARD against the latest under BACKWARD, FORWARD, FORWARD_TRANSITIVE and FULL, the
    strategy itself against every version otherwise). "type" (a field's type changed) can neither
    read nor be read; "drop" (the required field removed) reads old data (BACKWARD holds) but old
    readers cannot read it (FORWARD fails)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown schema compatibility strategy {strategy!r}: one of {', '.join(STRATEGIES)}")
    if change == "compatible" or strategy == "ALWAYS_COMPATIBLE":
        return False
    if strategy == "ALWAYS_INCOMPATIBLE" or change == "type":
        return True
    if change != "drop":
        raise ValueError(f"unknown schema change {change!r}: compatible, type or drop")
    if role == "consumer":
        return strategy == "FULL_TRANSITIVE"
    return strategy not in ("BACKWARD", "BACKWARD_TRANSITIVE")


def check(history: list[Op], opts: dict[str, Any] | None = None) -> CheckResult:
    """Check a schema-workload history; see the module docstring."""
    o = dict(DEFAULTS)
    o.update(opts or {})
    return _SchemaCheck(history, o).result()


class _SchemaCheck(OpRefs):
    ref_key = True

    def __init__(self, h: list[Op], o: dict[str, Any]):
        self.h = h
        self.o = o
        self.cap = o.get("max_anomalies")
        create_fs, deliver_fs, registry_fs = op_names(o, "create", "deliver", "registry")
        self.strategy = str(o.get("strategy") or "FULL")
        must_refuse(self.strategy, "producer", "compatible")          # a bad strategy: one clear error
        self.creations: list[tuple[Op, Op | None]] = []
        # (topic, label) -> creations answered ok or info; -> versions registrations answered ok with
        self.maybe_accepted: dict[tuple[str, str], list[Op]] = defaultdict(list)
        self.answered: dict[tuple[str, str], dict[int, Op]] = defaultdict(dict)
        # topic -> version -> label -> one op that says so
        self.meaning: dict[str, dict[int, dict[str, tuple[str, Op]]]] = defaultdict(lambda: defaultdict(dict))
        self.messages: list[tuple[str, dict[str, Any], Op]] = []
        self.final: dict[str, dict[str, Op]] = defaultdict(dict)           # topic -> broker -> last ok answer
        self.final_info: dict[str, int] = defaultdict(int)
        # topic -> round -> [broker -> last ok answer in it, whether every ask in it answered ok]
        self.rounds: dict[str, dict[Any, list[Any]]] = defaultdict(dict)
        for inv, done in pairs(h):
            if inv.f in create_fs:
                self.creations.append((inv, done))
                label = (inv.value or {}).get("schema") if isinstance(inv.value, dict) else None
                if done is not None and done.type in (OK, INFO) and label:
                    self.maybe_accepted[(inv.key, label)].append(done)
                    if done.type == OK and inv.f == "register" and isinstance(done.value, dict) \
                            and done.value.get("version") is not None:
                        v = int(done.value["version"])
                        self.answered[(inv.key, label)][v] = done
                        self.meaning[inv.key][v].setdefault(label, ("registration answer", done))
            elif inv.f in deliver_fs and done is not None and done.type == OK:
                for m in done.value if isinstance(done.value, list) else []:
                    if isinstance(m, dict):
                        self.messages.append((done.key or inv.key, m, done))
            elif inv.f in registry_fs:
                rnd = inv.value.get("round") if isinstance(inv.value, dict) else None
                group = self.rounds[inv.key].setdefault(rnd, [{}, True])
                if done is not None and done.type == OK and isinstance(done.value, list):
                    broker = done.node or (inv.value.get("broker", "") if isinstance(inv.value, dict) else "")
                    self.final[inv.key][broker or f"process-{inv.process}"] = done
                    group[0][broker or f"process-{inv.process}"] = done
                else:
                    group[1] = False
                    if done is not None:
                        self.final_info[inv.key] += 1
        self.stats: dict[str, Any] = {"messages": len(self.messages), "unversioned": 0, "unlabelled": 0,
                                      "creations": defaultdict(int), "topics_without_final_answer": []}

    # ------------------------------------------------------------------------------ finders
    def lost_and_unaccepted_cases(self) -> tuple[Cases, Cases, bool]:
        """`lost-version` and `unaccepted-version` over the delivered messages (one case per distinct
        (topic, version, writer label)); unknown when a topic with messages has no ok final answer."""
        lost, unacc = Cases(self.cap), Cases(self.cap)
        final_versions = {t: set().union(*({int(s["version"]) for s in a.value if isinstance(s, dict)}
                                           for a in answers.values()))
                          for t, answers in self.final.items()}
        seen: set[tuple[str, int, str]] = set()
        unknown_topics: set[str] = set()
        for topic, m, op in self.messages:
            v, label = m.get("version"), m.get("schema")
            if v is None:
                self.stats["unversioned"] += 1
                continue
            v = int(v)
            if not label:
                self.stats["unlabelled"] += 1
                continue
            self.meaning[topic][v].setdefault(label, ("message", op))
            if (topic, v, label) in seen:
                continue
            seen.add((topic, v, label))
            if topic not in final_versions:
                unknown_topics.add(topic)
            elif v not in final_versions[topic]:
                lost.add(lambda: {"topic": topic, "version": v, "schema": label, "message": jsonable(m),
                                  "delivery": self.ref(op),
                                  "final_versions": sorted(final_versions[topic]),
                                  "final_answers": [self.ref(a) for a in self.final[topic].values()]})
            given = self.answered.get((topic, label), {})
            if not self.maybe_accepted.get((topic, label)):
                unacc.add(lambda: {"topic": topic, "version": v, "schema": label, "message": jsonable(m),
                                   "delivery": self.ref(op), "why": "no creation or registration of its "
                                   "schema on this topic was answered ok (or left indeterminate)"})
            elif given and v not in given:
                unacc.add(lambda: {"topic": topic, "version": v, "schema": label, "message": jsonable(m),
                                   "delivery": self.ref(op), "answered_versions": sorted(given),
                                   "registrations": [self.ref(x) for x in given.values()],
                                   "why": "its schema's registration was answered with another version"})
        self.stats["topics_without_final_answer"] = sorted(unknown_topics)
        return lost, unacc, bool(unknown_topics)

    def divergence_cases(self) -> Cases:
        """`divergence`: two brokers' answers for a topic differ in its last round where every broker
        asked answered ok (see the module docstring). Evidence: the topic, the round, each broker's
        answer and op."""
        cases = Cases(self.cap)
        without: list[str] = []
        for topic, rounds in sorted(self.rounds.items()):
            complete = [r for r, (_, ok) in rounds.items() if ok]
            if not complete:
                without.append(topic)
                continue
            last = max(complete, key=lambda r: -1 if r is None else r)
            answers = rounds[last][0]
            shapes = {b: tuple(sorted((int(s["version"]), str(s.get("schema"))) for s in a.value
                                      if isinstance(s, dict))) for b, a in answers.items()}
            if len(set(shapes.values())) > 1:
                cases.add(lambda: {"topic": topic, "round": last, "answers": {b: {"op": self.ref(answers[b]),
                                                                    "versions": [list(x) for x in shapes[b]]}
                                                                for b in sorted(shapes)}})
        self.stats["topics_without_complete_round"] = without
        return cases

    def incompatible_cases(self) -> Cases:
        """`incompatible-accepted`: an ok creation or registration the strategy must refuse, invoked
        after a compatible one on the same topic had been answered ok. Evidence: the op, the change,
        the strategy, the earlier compatible acceptance."""
        cases = Cases(self.cap)
        first_ok: dict[str, Op] = {}            # topic -> the first ok compatible creation's completion
        events: list[tuple[int, int, Op, Op | None]] = []
        for inv, done in self.creations:
            events.append((self.op_index(inv), 0, inv, done))
            if done is not None:
                events.append((self.op_index(done), 1, inv, done))
        for _, kind, inv, done in sorted(events, key=lambda e: (e[0], e[1])):
            value = inv.value if isinstance(inv.value, dict) else {}
            change = str(value.get("change") or "compatible")
            if kind == 1:
                if done is not None and done.type == OK and change == "compatible":
                    first_ok.setdefault(inv.key, done)
                continue
            self.stats["creations"][f"{inv.f}:{change}:{done.type if done else 'unfinished'}"] += 1
            role = "register" if inv.f == "register" else inv.f.rsplit("-", 1)[-1]
            if done is None or done.type != OK or inv.key not in first_ok:
                continue
            if must_refuse(self.strategy, role, change):
                before = first_ok[inv.key]
                cases.add(lambda: {"topic": inv.key, "schema": value.get("schema"), "change": change,
                                   "role": role, "strategy": self.strategy, "op": self.ref(done),
                                   "invoke": self.ref(inv), "topic_had_schema_since": self.ref(before)})
        return cases

    def conflict_cases(self) -> Cases:
        """`version-conflict`: one version of a topic standing for two schemas. Evidence: the topic,
        the version, each schema with where it was seen (message, registration answer, final answer)."""
        for topic, answers in self.final.items():
            for a in answers.values():
                for s in a.value:
                    if isinstance(s, dict) and s.get("schema") is not None:
                        self.meaning[topic][int(s["version"])].setdefault(str(s["schema"]), ("final answer", a))
        cases = Cases(self.cap)
        for topic, by_v in sorted(self.meaning.items()):
            for v, labels in sorted(by_v.items()):
                if len(labels) > 1:
                    cases.add(lambda: {"topic": topic, "version": v,
                                       "schemas": {lab: {"seen_in": src, "op": self.ref(op)}
                                                   for lab, (src, op) in sorted(labels.items())}})
        return cases

    def result(self) -> CheckResult:
        lost, unacc, unknown = self.lost_and_unaccepted_cases()
        cases = {"lost-version": lost, "unaccepted-version": unacc, "divergence": self.divergence_cases(),
                 "incompatible-accepted": self.incompatible_cases(), "version-conflict": self.conflict_cases()}
        invalid = set(self.o["invalid"]) if self.o.get("invalid") is not None else set(ANOMALY_TYPES)
        self.stats["creations"] = dict(sorted(self.stats["creations"].items()))
        self.stats["final_answers"] = {t: len(a) for t, a in sorted(self.final.items())}
        self.stats["final_answers_indeterminate"] = dict(sorted(self.final_info.items()))
        self.stats["versions"] = {t: len(by_v) for t, by_v in sorted(self.meaning.items())}
        self.stats["strategy"] = self.strategy
        self.stats.update(anomaly_stats(cases, invalid))
        return CheckResult(valid=verdict(cases, invalid, unknown), anomalies=anomalies_of(cases), stats=self.stats)


__all__ = ["ANOMALY_TYPES", "DEFAULTS", "STRATEGIES", "check", "must_refuse"]
