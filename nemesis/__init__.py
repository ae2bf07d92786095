"""Faults the harness's nemesis process performs: partitions, process kills and pauses, cutting a
topic's owner from ZooKeeper; `NemesisRunner` schedules them and journals every start and stop."""
from nemesis.base import Nemesis, NemesisContext, NemesisError, normalize_topic
from nemesis.combine import FACTORIES, NemesisRunner, make
from nemesis.partition import PartitionNemesis, ZkIsolateNemesis
from nemesis.process import KillNemesis, PauseNemesis

NAMES = tuple(FACTORIES)

__all__ = ["Nemesis", "NemesisContext", "NemesisError", "NemesisRunner", "PartitionNemesis",
           "ZkIsolateNemesis", "KillNemesis", "PauseNemesis", "FACTORIES", "NAMES", "make",
           "normalize_topic"]
