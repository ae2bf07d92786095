"""What a test spec's names are checked against, read from the registries: workloads, faults, bug
knobs, deployment backends and cluster shapes (`core.spec.Catalog`, built here at the top)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


class RegistryCatalog:
    """`core.spec.Catalog` over the live registries (plugins included: it reads them at each call)."""

    def workload_names(self) -> Sequence[str]:
        import workloads
        return workloads.available()

    def workload_options(self, workload: str) -> tuple[Mapping[str, tuple[Any, str]], Mapping[str, Sequence[Any]]]:
        import workloads
        mod = workloads.get(workload)
        return mod.OPTIONS, getattr(mod, "CHOICES", {})

    def workload_option_problem(self, workload: str, spec: Any) -> tuple[str, str] | None:
        """(problem, fix) from the workload's `option_problem(spec)`, if it has one."""
        import workloads
        check = getattr(workloads.get(workload), "option_problem", None)
        return check(spec) if check is not None else None

    def fault_problem(self, name: Any) -> tuple[str, str] | None:
        from nemesis.base import FaultNameError
        from nemesis.registry import make
        try:
            make(name)
        except FaultNameError as e:
            return (e.problem, e.fix)
        return None

    def fault_takes_grudge(self, name: str) -> bool:
        from nemesis.registry import takes_grudge
        return takes_grudge(name)

    def bug_knob_names(self) -> Sequence[str]:
        from clusters import bugs
        return bugs.REGISTRY.names()

    def unsafe_causes(self, workload: str, options: Mapping[str, Any], bugs: Mapping[str, Any],
                      spec: Any = None) -> list[Any]:
        import workloads
        return workloads.unsafe_causes(workload, options, bugs, spec)

    def backend_names(self) -> Sequence[str]:
        from clusters.deploy.backends import BACKENDS
        return tuple(BACKENDS)

    def cluster_problem(self, zookeepers: int, bookies: int, ensemble: int, write_quorum: int,
                        ack_quorum: int) -> tuple[str, str, str] | None:
        from clusters.deploy.spec import shape_problem
        return shape_problem(zookeepers, bookies, ensemble, write_quorum, ack_quorum)

    def load_manager_names(self) -> Sequence[str]:
        from clusters.loadbalancer.manager import LOAD_MANAGERS
        return tuple(LOAD_MANAGERS)

    def lb_settings_problem(self, settings: Mapping[str, Any]) -> tuple[str, str] | None:
        from clusters.loadbalancer.settings import LoadBalancerSettings
        try:
            LoadBalancerSettings.from_mapping(settings)
        except ValueError as e:
            return (str(e), "use Pulsar's setting names and value types, as in broker.conf "
                            "(clusters/loadbalancer/settings.py lists them)")
        return None

    def bookie_settings_problem(self, settings: Mapping[str, Any]) -> tuple[str, str] | None:
        from clusters.bookie.settings import bookie_config
        try:
            bookie_config(settings)
        except ValueError as e:
            return (str(e), "use BookKeeper's setting names and values, as in bk_server.conf "
                            "(clusters/bookie/settings.py lists them)")
        return None

    def broker_settings_problem(self, settings: Mapping[str, Any]) -> tuple[str, str] | None:
        from clusters.broker.settings import broker_config
        try:
            broker_config(settings)
        except ValueError as e:
            return (str(e), "use one of the names clusters/broker/settings.py lists, with a number")
        return None


CATALOG = RegistryCatalog()
