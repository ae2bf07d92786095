"""A plugin (PULSAR_CHAOS_PLUGINS) that makes every bug knob silently ineffective: the runner's clusters
are deployed without them, while the run's test.toml still names them (and so still expects the run to
be invalid). A campaign must then report the knob run as an unmet expectation."""
from __future__ import annotations

from clusters.deploy.spec import ClusterSpec

_post_init = ClusterSpec.__post_init__


def _without_bugs(self: ClusterSpec) -> None:
    self.bugs = {}
    _post_init(self)


ClusterSpec.__post_init__ = _without_bugs  # type: ignore[method-assign]
