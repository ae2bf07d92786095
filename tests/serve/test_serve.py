"""`pulsar-chaos serve` in a real headless Chromium (Debian's chromium and chromedriver, driven by
Selenium): the runs table loads with every run, a filter narrows it, a heading sorts it, a run's report
opens from it, a campaign's summary and Spark page are linked; screenshots of the table and of the
opened report are written (the test prints where). The server is the real CLI in its own process."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from core import store
from harness import junit, report
from tests.spark_analysis.helpers import FINAL, H, write_run

REPO = Path(__file__).resolve().parents[2]
CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
SHOTS = Path(tempfile.gettempdir()) / "pulsar-chaos-serve-screenshots"
T = "persistent://public/default/t0"

pytestmark = pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="needs Debian's chromium and chromium-driver "
                                                                   "(make setup installs them)")


def history(lose: bool):
    h = H()
    for v in range(1, 6):
        h.send(1, T, v, (10, v - 1, -1, -1))
    read = [(v, (10, v - 1, -1, -1)) for v in range(1, 6) if not (lose and v == 3)]
    h.recv(FINAL, T, read, f="read")
    return h.ops


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Four run folders (one invalid: a lost message) with real reports, and a campaign folder."""
    root = tmp_path_factory.mktemp("serve-results")
    runs = []
    for i, (name, lose, wl, kw) in enumerate([("log-ok", False, "log", {"nemesis": []}),
                                               ("log-lost", True, "log", {"nemesis": ["kill"]}),
                                               ("queue-ok", False, "log", {"nemesis": ["pause"]}),
                                               ("log-ok-2", False, "log", {"nemesis": ["partition"]})]):
        d = write_run(root, name, f"2026112{i}T0{i}0000", history(lose), workload=wl, **kw)
        report.render(d)
        runs.append(d)
    camp = root / "campaigns" / "smoke" / "20261125T010000"
    d = write_run(camp / "runs", "log-knob", "20261125T010001", history(True), workload="log",
                  nemesis=["zk-isolate"], bugs={"broker.recovery_fencing": False})
    report.render(d)
    recs = [{"name": "log-knob", "workload": "log", "outcome": "invalid", "expected": "invalid", "met": True,
             "seconds": 12.0, "run_dir": str(d)}]
    store.write_json(camp / "campaign.json", {"campaign": "smoke", "started": "20261125T010000", "entries": recs})
    (camp / "summary.txt").write_text("campaign smoke: 1 runs in 0m12s: 1 met their expectation\n")
    (camp / "junit.xml").write_bytes(junit.xml("smoke", recs, "20261125T010000", 12.0))
    (camp / "analysis" / "20261125T020000").mkdir(parents=True)
    (camp / "analysis" / "20261125T020000" / "campaign.html").write_text(
        "<html><head><title>pulsar-chaos campaign</title></head><body><h1>pulsar-chaos campaign</h1></body></html>")
    return root


@pytest.fixture(scope="module")
def server(results):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.Popen([sys.executable, "-m", "harness.cli", "serve", str(results), "--port", str(port)],
                         cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2).read()
            break
        except OSError:
            assert p.poll() is None, p.communicate()[0]
            time.sleep(0.2)
    try:
        yield url
    finally:
        p.terminate()
        p.wait(10)


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-background-networking", "--disable-gpu",
                 "--disable-dev-shm-usage", "--window-size=1500,1000"):
        opts.add_argument(flag)
    drv = webdriver.Chrome(service=Service(DRIVER), options=opts)
    drv.implicitly_wait(5)
    try:
        yield drv
    finally:
        drv.quit()


def shown(drv):
    from selenium.webdriver.common.by import By
    return [r for r in drv.find_elements(By.CSS_SELECTOR, "#runs tbody tr") if r.is_displayed()]


def type_into(box, text: str) -> None:
    from selenium.webdriver.common.keys import Keys
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(Keys.DELETE)                     # typed, so the page sees every input event
    if text:
        box.send_keys(text)


def keep(tmp_path: Path, drv, name: str) -> Path:
    path = tmp_path / name
    assert drv.save_screenshot(str(path))
    SHOTS.mkdir(exist_ok=True)
    copy = SHOTS / name
    shutil.copy(path, copy)
    print(f"screenshot: {copy}")
    return path


def test_table_loads_filters_sorts_and_opens_a_report(server, browser, tmp_path):
    from selenium.webdriver.common.by import By
    drv = browser
    drv.get(server)
    assert drv.title == "pulsar-chaos results"
    rows = shown(drv)
    assert len(rows) == 5                                   # four runs and the campaign's one
    text = drv.find_element(By.ID, "runs").text
    assert "log-lost" in text and "recovery_fencing" in text and "smoke/20261125T010000" in text
    # each run's expectation and whether it was met: the lost message was not expected, the knob's was
    met = {r.get_attribute("data-run").split("/")[-2]: r.find_elements(By.TAG_NAME, "td")[8].text for r in rows}
    assert met["log-lost"] == "NO" and met["log-knob"] == "yes" and met["log-ok"] == "yes", met
    # the trend of verdicts over nights, and the campaign with its links
    assert len(drv.find_elements(By.CSS_SELECTOR, "#trend rect")) >= 4
    camp = drv.find_element(By.ID, "campaigns").text
    assert "smoke" in camp and "Spark campaign.html" in camp and "junit.xml" in camp
    # a filter narrows it: the two invalid runs (the lost message, the knob run)
    box = drv.find_element(By.ID, "filter")
    type_into(box, "invalid")
    rows = shown(drv)
    assert sorted(r.get_attribute("data-run").split("/")[-2] for r in rows) == ["log-knob", "log-lost"]
    assert drv.find_element(By.ID, "shown").text == "2"
    keep(tmp_path, drv, "serve-table-filtered.png")
    type_into(box, "pause")
    assert [r.get_attribute("data-run").split("/")[0] for r in shown(drv)] == ["queue-ok"]
    type_into(box, "")
    assert len(shown(drv)) == 5
    # a heading sorts: by date ascending, then descending
    head = drv.find_elements(By.CSS_SELECTOR, "#runs th")[0]
    head.click()
    dates = [r.find_elements(By.TAG_NAME, "td")[0].text for r in shown(drv)]
    assert dates == sorted(dates)
    head.click()
    assert [r.find_elements(By.TAG_NAME, "td")[0].text for r in shown(drv)] == sorted(dates, reverse=True)
    keep(tmp_path, drv, "serve-table.png")
    # a run's report opens from the table
    row = next(r for r in shown(drv) if "log-lost" in r.get_attribute("data-run"))
    row.find_element(By.CSS_SELECTOR, "a.report").click()
    assert drv.current_url.endswith("/report.html")
    verdict = drv.find_element(By.ID, "verdict").text
    assert "INVALID" in verdict.upper() and "lost" in verdict
    keep(tmp_path, drv, "serve-report.png")
    # the campaign's summary and its Spark page
    drv.get(server)
    drv.find_element(By.LINK_TEXT, "summary").click()
    assert "1 met their expectation" in drv.find_element(By.TAG_NAME, "pre").text
    drv.find_element(By.LINK_TEXT, "Spark campaign.html").click()
    assert drv.title == "pulsar-chaos campaign"


def test_read_only_and_nothing_outside_the_results_dir(server, results):
    import urllib.error
    req = urllib.request.Request(server, method="POST", data=b"x")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=5)
    assert e.value.code == 405
    for path in ("files/%2e%2e/%2e%2e/etc/passwd", "files/..%2f..%2fetc/passwd", "campaign/..%2f..%2f"):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(server + path, timeout=5)
        assert e.value.code == 404, path
    listing = urllib.request.urlopen(server + "files/log-lost/20261121T010000/", timeout=5).read().decode()
    assert "report.html" in listing and "results.json" in listing
    with socket.socket() as s:                       # bound to the loopback address only
        s.settimeout(1)
        port = int(server.rsplit(":", 1)[1].strip("/"))
        other = [a for a in os.popen("hostname -I").read().split() if ":" not in a]
        if other:
            assert s.connect_ex((other[0], port)) != 0
