"""Exceptions of the BookKeeper client."""
from __future__ import annotations

__all__ = ["BKError", "BKLedgerFencedError", "BKLedgerClosedError", "BKNotEnoughBookiesError",
           "BKTimeoutError", "BKNoSuchLedgerError", "BKNoSuchEntryError", "BKMetadataVersionError",
           "BKRecoveryError", "BKReadError", "BKDigestError"]


class BKError(Exception):
    """Base class of every BookKeeper client error."""


class BKLedgerFencedError(BKError):
    """A bookie refused an add because another client fenced the ledger (it is being recovered).
    The entry may or may not have been written."""


class BKLedgerClosedError(BKError):
    """The ledger is closed (by this handle or by someone else's recovery)."""


class BKNotEnoughBookiesError(BKError):
    """Fewer bookies are available than the ensemble needs."""


class BKTimeoutError(BKError):
    """A bookie did not answer in time."""


class BKNoSuchLedgerError(BKError):
    """The ledger's metadata does not exist."""


class BKNoSuchEntryError(BKError):
    """The entry does not exist (or is beyond the readable end of the ledger)."""


class BKMetadataVersionError(BKError):
    """A metadata compare-and-set lost against a conflicting change."""


class BKRecoveryError(BKError):
    """Ledger recovery could not decide the ledger's end (not enough bookies answered)."""


class BKReadError(BKError):
    """A read failed on every bookie of the entry's write set for another reason."""


class BKDigestError(BKReadError):
    """A bookie returned an entry whose checksum does not match."""


class BKInvalidEnsembleError(BKRecoveryError):
    """A ledger recovery tried to add a fragment keyed below the ledger's last one (BookKeeper's
    IllegalStateException of apache/bookkeeper#2615): the recovery fails, every time the same way."""
