from tests.bookie.cluster import bookies  # noqa: F401  (fixture)
