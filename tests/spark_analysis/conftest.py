"""One SparkSession for every Spark test (built once per pytest session through spark_analysis.session,
as `analyze` builds its own), so that the Spark tests add one JVM start to `make test`, not one each."""
from __future__ import annotations

import contextlib

import pytest

from spark_analysis import session as spark_session


@pytest.fixture(scope="session")
def spark():
    try:
        s = spark_session.start(spark_session.Settings(master="local[2]", driver_memory="2g",
                                                       app_name="pulsar-chaos tests"))
    except spark_session.SparkUnavailable as e:
        pytest.fail(f"{e}")
    try:
        yield s
    finally:
        s.stop()


class KeepOpen:
    """The shared session for code that stops the session it started (analyze): stop() does nothing."""

    def __init__(self, spark):
        self._spark = spark

    def __getattr__(self, name):
        return getattr(self._spark, name)

    def stop(self) -> None:
        pass


@contextlib.contextmanager
def counting_shared_session(spark):
    """Within it, spark_session.start() returns the shared session (counted, as a real start is), so
    analyze() can be called without a session and the sessions it starts counted (the list of calls)."""
    calls = []

    def fake_start(settings=None, input_bytes=0):
        calls.append(settings)
        spark_session.SESSIONS_STARTED += 1
        return KeepOpen(spark)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(spark_session, "start", fake_start)
        yield calls


@pytest.fixture
def shared_session_as_new(spark):
    with counting_shared_session(spark) as calls:
        yield calls
