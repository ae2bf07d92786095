"""The checks of a standalone master before the driver JVM starts (no Spark needed): a master that
does not answer is one line naming it and the fix; one of an HA list answering is enough."""
from __future__ import annotations

import socket

import pytest

from spark_analysis import session


def _listener():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    return s


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_standalone_masters_parses_single_and_ha_urls():
    assert session.standalone_masters("spark://127.0.0.1:7077") == [("127.0.0.1", 7077)]
    assert session.standalone_masters("spark://a:1,b:2") == [("a", 1), ("b", 2)]
    assert session.standalone_masters("spark://host") == [("host", 7077)]
    assert session.standalone_masters("local[2]") == [] and session.standalone_masters("yarn") == []
    with pytest.raises(session.SparkUnavailable, match=r"is not HOST:PORT .*\(fix: "):
        session.standalone_masters("spark://host:port")


def test_a_master_that_does_not_answer_is_named_with_the_fix():
    port = _closed_port()
    with pytest.raises(session.SparkUnavailable) as e:
        session.check_master(f"spark://127.0.0.1:{port}", timeout=2)
    msg = str(e.value)
    assert f"the Spark master spark://127.0.0.1:{port} does not answer" in msg and "(fix: " in msg
    assert "\n" not in msg


def test_a_listening_master_or_one_of_an_ha_list_passes():
    with _listener() as s:
        port = s.getsockname()[1]
        session.check_master(f"spark://127.0.0.1:{port}")
        session.check_master(f"spark://127.0.0.1:{_closed_port()},127.0.0.1:{port}")
    session.check_master("local[*]")          # not a standalone master: nothing to check


def test_the_driver_binds_to_the_loopback_for_a_loopback_master_only():
    conf = session.config(session.Settings(master="spark://127.0.0.1:7077"))
    assert conf["spark.driver.host"] == "127.0.0.1"
    conf = session.config(session.Settings(master="spark://spark-master.example:7077"))
    assert "spark.driver.host" not in conf


def test_the_driver_jvm_gets_the_parallel_collector_and_the_quiet_log_config():
    opts = session.config(session.Settings())["spark.driver.extraJavaOptions"].split()
    assert "-XX:+UseParallelGC" in opts
    assert all(o in opts for o in session.JIT_OPTIONS.split())
    assert any(o.startswith("-Dlog4j2.configurationFile=file:") for o in opts)
    # a --conf of the user's replaces them
    mine = session.config(session.Settings(extra={"spark.driver.extraJavaOptions": "-XX:+UseG1GC"}))
    assert mine["spark.driver.extraJavaOptions"] == "-XX:+UseG1GC"
