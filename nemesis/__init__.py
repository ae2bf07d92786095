"""Faults the harness's nemesis process performs: partitions of every shape, process kills and
pauses, ZooKeeper isolation, flaky and slow links, disk wipes, power loss, clock skew.
`nemesis.registry.REGISTRY` declares every fault; `nemesis.combine.NemesisRunner` schedules them."""
from nemesis.base import FaultNameError, Nemesis, NemesisContext, NemesisError, normalize_topic
from nemesis.combine import NemesisRunner, Scheduled
from nemesis.registry import REGISTRY, Fault, help_lines, make, parse_name

__all__ = ["Fault", "FaultNameError", "Nemesis", "NemesisContext", "NemesisError", "NemesisRunner", "REGISTRY",
           "Scheduled", "help_lines", "make", "parse_name", "normalize_topic"]
