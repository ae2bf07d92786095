"""BookKeeper auto-recovery for the reference system: an auditor elected among the bookies marks
ledgers with fragments on a lost bookie as under-replicated in ZooKeeper, and a replication worker
in every bookie copies those fragments to live bookies and swaps them into the ledger metadata.

    service.py    AutoRecovery: its own ZooKeeper session + BookKeeper client, the auditor
                  election, the auditor and the worker; `start_in_bookie(cfg)` is the bookie's hook
    auditor.py    Auditor: lost bookies (after lost_bookie_recovery_delay_s) -> marked ledgers
    worker.py     ReplicationWorker: lock, copy fragments, metadata CAS, unmark
    urmanager.py  the ZooKeeper layout under /ledgers/underreplication (records, locks, election)
    stats.py      bookkeeper_autorecovery_* Prometheus series

See docs/architecture.md, "Auto-recovery".
"""
from .service import AutoRecovery, start_in_bookie  # noqa: F401
from .urmanager import UnderreplicationManager, lock_path, ur_path  # noqa: F401
from .worker import ReplicationWorker  # noqa: F401
