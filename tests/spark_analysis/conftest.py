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


@pytest.fixture(scope="session")
def small_campaign(tmp_path_factory):
    """A small campaign written once per session (the CLI, spark-submit, standalone-cluster and
    incremental tests all read it): two small log runs (one losing a message), a log run with lost,
    duplicate and divergence planted under a kill, a queue run with every queue anomaly, and a corrupt
    run folder (skipped)."""
    from core import store
    from tests.spark_analysis.helpers import write_run
    from tests.spark_analysis.test_checks import log_history, queue_history
    from tests.spark_analysis.test_inputs import small_history
    root = tmp_path_factory.mktemp("small-campaign")
    write_run(root, "cli", "20261106T101010", small_history(), workload="log", nemesis=[])
    write_run(root, "cli", "20261106T111111", small_history(lose=True), workload="log", nemesis=[])
    write_run(root, "planted", "20261107T101010", log_history("lost", "duplicate", "divergence"), workload="log",
              nemesis=["kill"], bugs={"bookie.ignore_fence": True})
    write_run(root, "queue", "20261108T101010", queue_history(), workload="queue", nemesis=[])
    bad = write_run(root, "cli", "20261106T121212", small_history(), workload="log", nemesis=[])
    (bad / store.HISTORY_PARQUET).write_bytes(b"PAR1 not really")
    return root


@pytest.fixture(scope="session")
def small_campaign_tables(small_campaign, spark, tmp_path_factory):
    """Its tables from one full analysis in local mode without the store of per-run tables (the
    reference the standalone cluster's and the incremental analyses are compared with)."""
    from spark_analysis import main as analysis
    from tests.spark_analysis.helpers import analysis_tables
    res = analysis.analyze([str(small_campaign)], str(tmp_path_factory.mktemp("small-campaign-out")), spark=spark,
                           echo=None, reuse=False)
    return analysis_tables(res.out_dir, small_campaign)
