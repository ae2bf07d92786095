"""The one SparkSession of an `analyze` call: local mode by default, settings chosen for histories.

`start()` is the only place a session is built (it counts them: an analyze call starts one, however
many runs it reads); `require_java()` turns a missing Java into a one-line error before any JVM.
"""
from __future__ import annotations

import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any

DEFAULT_MASTER = "local[*]"        # every core of this machine (2 here): one task per core
# local mode runs the executors inside the driver JVM, so its heap is all the memory Spark gets; it is
# sized from the Parquet input (driver_memory_for) unless --driver-memory says otherwise: 2 GiB for a
# campaign of small runs, 4 GiB from 128 MiB of input (a 10,000,000-op history is ~360 MiB: joins and
# window sorts spill to disk past the heap), 8 GiB from 1 GiB. That leaves most of this 24 GiB
# machine to the clusters under test; bigger campaigns belong on a cluster (--master)
DEFAULT_DRIVER_MEMORY = None
MIN_JAVA = 17                      # pyspark 4.0 runs on Java 17 or 21

# a standalone master (spark://) must answer a TCP connect within this many seconds before the driver
# JVM starts, and grant the application an executor within MASTER_EXECUTORS_S after it: Spark itself
# retries an unreachable master for a minute and then logs a stack trace, and waits forever for
# executors a cluster cannot give
MASTER_CONNECT_S = 5.0
MASTER_EXECUTORS_S = 90.0
LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")

# the driver JVM's collector: the parallel one. A batch job wants throughput, and G1's concurrent
# threads and write barriers cost CPU that two shared cores do not have (a 1,000,000-op history: 122 s
# of the whole process tree's CPU with G1, 105 s with the parallel collector; bench/README.md).
# The optimising compiler (C2) only for methods four times as hot as the JVM's default thresholds: an
# analyze is a short job whose C2 threads compiled code that ran a few thousand times (Spark's planner,
# Janino, the code generated for each of its hundred-odd stages) for as much CPU as its tasks used on a
# 1,000,000-op history; the per-row loops of the big stages still pass these thresholds within a second
# (C1 compiles everything as before). The compilers' CPU on a 10,000,000-op history fell from 59 s to
# 38 s (bench/README.md); stopping at C1 altogether saved more but slowed the tasks by a third
JIT_OPTIONS = ("-XX:Tier4InvocationThreshold=20000 -XX:Tier4MinInvocationThreshold=2400 "
               "-XX:Tier4CompileThreshold=60000 -XX:Tier4BackEdgeThreshold=160000")
JVM_OPTIONS = f"-XX:+UseParallelGC {JIT_OPTIONS}"

# how many sessions start() built in this process (tests assert an analyze call builds one)
SESSIONS_STARTED = 0


class SparkUnavailable(RuntimeError):
    """Spark cannot start here (no Java, an old Java, no pyspark); the message names the fix."""


@dataclass
class Settings:
    master: str | None = None                  # None: local[*], or what spark-submit was given
    driver_memory: str | None = DEFAULT_DRIVER_MEMORY   # None: driver_memory_for(input bytes)
    ui: bool = False
    shuffle_partitions: int | None = None      # None: sized from the input bytes (shuffle_partitions_for)
    app_name: str = "pulsar-chaos analyze"
    extra: dict[str, str] = field(default_factory=dict)   # more spark.* settings, passed through


def java_version(java: str) -> int | None:
    """The major version of a java binary (8, 11, 17, 21...), None if it does not say."""
    try:
        cp = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r'version "(\d+)(?:\.(\d+))?', cp.stderr + cp.stdout)
    if not m:
        return None
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major    # "1.8.0" is Java 8


def require_java() -> str:
    """The java binary Spark will use (JAVA_HOME's, else the one on PATH), or SparkUnavailable."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.access(java, os.X_OK):
        where = f"JAVA_HOME={home} has no bin/java" if home else "no `java` on PATH"
        raise SparkUnavailable(f"Spark needs a Java {MIN_JAVA}+ runtime and there is none ({where}) "
                               f"(fix: run `make setup`, or apt-get install default-jre-headless, "
                               f"or set JAVA_HOME)")
    v = java_version(java)
    if v is not None and v < MIN_JAVA:
        raise SparkUnavailable(f"{java} is Java {v}; pyspark 4 needs Java {MIN_JAVA}+ "
                               f"(fix: install openjdk-17-jre-headless and point JAVA_HOME at it)")
    return java


def require_pyspark() -> None:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise SparkUnavailable("pyspark is not installed in this Python (fix: run `make setup`, which "
                               "installs it into .venv, or `pip install 'pulsar-chaos[analysis]'`)") from None


def under_spark_submit() -> bool:
    """This Python was launched by spark-submit (its JVM, master and driver memory are set already)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def effective_master(settings: Settings) -> str | None:
    """The master to ask for: --master, else spark-submit's own (None), else local[*]."""
    if settings.master:
        return settings.master
    return None if under_spark_submit() else DEFAULT_MASTER


def is_local(master: str | None) -> bool:
    return master is None or master.startswith("local")


def standalone_masters(master: str | None) -> list[tuple[str, int]]:
    """(host, port) of each master of a spark:// URL (several for a high-availability one:
    spark://h1:7077,h2:7077); [] for any other master."""
    if not master or not master.startswith("spark://"):
        return []
    out = []
    for part in master[len("spark://"):].rstrip("/").split(","):
        host, _, port = part.strip().rpartition(":")
        if not host:
            host, port = port, "7077"
        try:
            out.append((host.strip("[]"), int(port)))
        except ValueError:
            raise SparkUnavailable(f"--master {master}: {part!r} is not HOST:PORT "
                                   f"(fix: e.g. --master spark://127.0.0.1:7077)") from None
    return out


def check_master(master: str | None, timeout: float = MASTER_CONNECT_S) -> None:
    """A spark:// master answers a TCP connect (any one of an HA list), or SparkUnavailable naming it
    and the fix: one bounded check before the driver JVM starts."""
    hosts = standalone_masters(master)
    if not hosts:
        return
    why = []
    for host, port in hosts:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return
        except socket.timeout:
            why.append(f"{host}:{port}: no answer in {timeout:g} s")
        except OSError as e:
            why.append(f"{host}:{port}: {e.strerror or e}")
    raise SparkUnavailable(f"the Spark master {master} does not answer ({'; '.join(why)}) (fix: start it, "
                           f"e.g. `spark-class org.apache.spark.deploy.master.Master --host HOST --port PORT` "
                           f"and a worker, or give the URL it logged as \"Starting Spark master at spark://...\")")


def wait_for_executors(spark: Any, master: str | None, timeout: float = MASTER_EXECUTORS_S) -> None:
    """On a standalone master, wait (bounded) until the application has an executor; SparkUnavailable
    if the master gave up on it or gave it none (no worker, or none with the cores and memory asked)."""
    if not standalone_masters(master):
        return
    import time
    sc = spark.sparkContext
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sc._jsc.sc().isStopped():
            break
        # the driver counts among the executor infos: more than one means a real executor
        if len(sc._jsc.sc().statusTracker().getExecutorInfos()) > 1:
            return
        time.sleep(0.5)
    stopped = sc._jsc.sc().isStopped()
    mem = sc.getConf().get("spark.executor.memory", "1g")
    try:
        spark.stop()
    except Exception:
        pass
    if stopped:
        raise SparkUnavailable(f"the Spark master {master} did not accept the application (is it a Spark "
                               f"{_pyspark_version()} standalone master?) (fix: check the master's log and the "
                               f"--master URL)")
    raise SparkUnavailable(f"the Spark master {master} gave the application no executor in {timeout:g} s "
                           f"(fix: start a worker (spark-class org.apache.spark.deploy.worker.Worker {master}) "
                           f"with at least one free core and {mem} free memory, or lower "
                           f"--conf spark.executor.memory)")


def _pyspark_version() -> str:
    try:
        import pyspark
        return pyspark.__version__
    except ImportError:  # pragma: no cover
        return "?"


def shuffle_partitions_for(input_bytes: int, cores: int) -> int:
    """Shuffle partitions for this much Parquet input: one per ~32 MiB of compressed Parquet (a few
    hundred MiB in memory per task) for big inputs, at most 800; at least two per core (both cores
    busy) from 2 x cores x 4 MiB of input (16 MiB here), and fewer below: one per 4 MiB, so a handful of short
    runs is one partition per shuffle (the job is hundreds of small stages: each extra partition is a
    task per stage, and adaptive execution runs independent stages side by side, which keeps the cores
    busy; 4 partitions took 22-30 s for 3 small runs on 2 cores, 1 took 15-16 s). Adaptive execution
    coalesces what turns out smaller."""
    per, small = 32 << 20, 4 << 20
    floor = min(2 * max(1, cores), max(1, math.ceil(input_bytes / small)))
    return int(max(floor, min(800, math.ceil(input_bytes / per))))


def driver_memory_for(input_bytes: int) -> str:
    """The driver heap for this much Parquet input (see DEFAULT_DRIVER_MEMORY)."""
    if input_bytes >= 1 << 30:
        return "8g"
    if input_bytes >= 128 << 20:
        return "4g"
    return "2g"


def _quiet_log4j() -> str:
    """A log4j2 config that keeps Spark's JVM to errors (its INFO/WARN lines would bury the summary)."""
    path = os.path.join(tempfile.gettempdir(), f"pulsar-chaos-spark-log4j2-{os.getuid()}.properties")
    text = ("rootLogger.level = error\nrootLogger.appenderRef.stderr.ref = console\n"
                "appender.console.type = Console\nappender.console.name = console\n"
                "appender.console.target = SYSTEM_ERR\nappender.console.layout.type = PatternLayout\n"
                "appender.console.layout.pattern = spark: %p %c{1}: %m%n\n")
    try:
        with open(path) as f:
            if f.read() == text:
                return path
    except OSError:
        pass
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    return path


def config(settings: Settings, input_bytes: int = 0) -> dict[str, Any]:
    """The spark.* settings of a session, each chosen on purpose (see the comments)."""
    cores = os.cpu_count() or 2
    conf: dict[str, Any] = {
        "spark.app.name": settings.app_name,
        # shuffles sized to the data, not Spark's fixed 200 (see shuffle_partitions_for)
        "spark.sql.shuffle.partitions": str(settings.shuffle_partitions
                                            or shuffle_partitions_for(input_bytes, cores)),
        # adaptive execution: re-plans joins from real sizes (the run tables are tiny: broadcast) and
        # coalesces small shuffle partitions, so a 4-run campaign and a 10M-op history both run well
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.adaptive.coalescePartitions.enabled": "true",
        "spark.sql.adaptive.skewJoin.enabled": "true",
        # Arrow for toPandas(): the campaign tables come back to the driver columnar, not row by row
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.execution.arrow.pyspark.fallback.enabled": "true",
        # one clock for the day trends and the timestamps in the output
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "true" if settings.ui else "false",
        "spark.ui.showConsoleProgress": "false",
        # keep the run tables (small) broadcast even when AQE's estimate is rough
        "spark.sql.autoBroadcastJoinThreshold": str(32 << 20),
        # the persisted op table and messages (checks.prepare) cached as plain columns, not compressed:
        # they are read a few times within the job, and compressing 10,000,000 rows of 22 columns cost
        # more task CPU than it saved (the op table's phase: 43 s of task CPU at 10M ops, 29 s without);
        # what does not fit the heap goes to disk as before (MEMORY_AND_DISK)
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
    }
    if not under_spark_submit():
        # the driver JVM starts here: its heap (in local mode, the executors' too: the whole budget)
        # and a log4j config that keeps Spark to errors (its INFO/WARN lines would bury the summary)
        conf["spark.driver.memory"] = settings.driver_memory or driver_memory_for(input_bytes)
        conf["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile=file:{_quiet_log4j()} {JVM_OPTIONS}"
        hosts = standalone_masters(effective_master(settings))
        if is_local(effective_master(settings)) or (hosts and all(h in LOOPBACK for h, _ in hosts)):
            # bind to the loopback: this machine's hostname may resolve to an address inside a test
            # network namespace, unreachable from here (and from a standalone cluster on 127.0.0.1,
            # whose executors connect back to the driver)
            conf["spark.driver.host"] = "127.0.0.1"
            conf["spark.driver.bindAddress"] = "127.0.0.1"
    conf.update(settings.extra)
    return conf


def start(settings: Settings | None = None, input_bytes: int = 0):
    """A new SparkSession (or the one spark-submit made, with these settings where it allows)."""
    global SESSIONS_STARTED
    settings = settings or Settings()
    require_pyspark()
    master = effective_master(settings)
    if not under_spark_submit():
        require_java()           # the JVM starts here (also for a remote master: the driver is local)
        check_master(master)
        if is_local(master) and master is not None:
            # Python workers run this interpreter (the venv, with pyarrow and pandas), not whatever
            # `python3` is first on PATH; a cluster's executors use their own (spark.pyspark.python).
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    builder = SparkSession.builder
    if master is not None:
        builder = builder.master(master)
    for k, v in config(settings, input_bytes).items():
        builder = builder.config(k, v)
    try:
        spark = builder.getOrCreate()
    except Exception as e:                 # the JVM did not come up (Java missing or broken, no memory)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SparkUnavailable(f"Spark did not start with master {master or 'from spark-submit'} ({first}) "
                               f"(fix: check `java -version` (17+) and --driver-memory, or the --master URL)"
                               ) from None
    spark.sparkContext.setLogLevel("ERROR")
    wait_for_executors(spark, master)
    SESSIONS_STARTED += 1
    return spark


def set_shuffle_partitions(spark: Any, input_bytes: int) -> int:
    """Resize the shuffles of an existing session to this input (a shared test session, spark-submit)."""
    cores = spark.sparkContext.defaultParallelism or os.cpu_count() or 2
    n = shuffle_partitions_for(input_bytes, cores)
    spark.conf.set("spark.sql.shuffle.partitions", str(n))
    return n
