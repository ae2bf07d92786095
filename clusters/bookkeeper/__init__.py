"""BookKeeper client: `from clusters.bookkeeper import BookKeeper` (see client.py)."""
from .client import BookKeeper, LedgerHandle, ReadHandle  # noqa: F401
from .errors import *  # noqa: F401,F403
from .metadata import LedgerMetadata  # noqa: F401
