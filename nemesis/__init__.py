"""Faults the harness's nemesis process performs: partitions of every shape, process kills and
pauses, ZooKeeper isolation, flaky and slow links, disk wipes, power loss, clock skew.
`NemesisRunner` schedules them and journals every start and stop; `REGISTRY` names them."""
from nemesis.base import Nemesis, NemesisContext, NemesisError, normalize_topic
from nemesis.combine import REGISTRY, NemesisRunner, Scheduled, help_lines, make, parse_name
from nemesis.partition import PartitionNemesis, ZkIsolateNemesis
from nemesis.process import KillNemesis, PauseNemesis

NAMES = tuple(REGISTRY)

__all__ = ["Nemesis", "NemesisContext", "NemesisError", "NemesisRunner", "PartitionNemesis",
           "ZkIsolateNemesis", "KillNemesis", "PauseNemesis", "REGISTRY", "NAMES", "Scheduled", "make",
           "help_lines", "parse_name", "normalize_topic"]
