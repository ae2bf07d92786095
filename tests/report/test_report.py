"""The run report: hand-built run folders (valid, invalid, partial, empty) render a self-contained page."""
from __future__ import annotations

import json
import re
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

from harness import report

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}

SPEC = """# pulsar-chaos test spec
test_name = "log-chaos"
workload = "log"
nemesis = ["partition", "kill"]
nemesis_interval = 10.0
time_limit = 30.0
rate = 200.0
concurrency = 4
brokers = 2
bookies = 3
zookeepers = 1
ensemble = 3
write_quorum = 2
ack_quorum = 2
seed = 42

[bugs]
"""


class StrictParser(HTMLParser):
    """Every element closed by its own end tag, in order; counts tags and collects src/href values."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.tags: dict[str, int] = {}
        self.refs: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags[tag] = self.tags.get(tag, 0) + 1
        for k, v in attrs:
            if k in ("src", "href", "xlink:href", "action", "data", "poster") and v is not None:
                self.refs.append(v)
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags[tag] = self.tags.get(tag, 0) + 1
        for k, v in attrs:
            if k in ("src", "href", "xlink:href") and v is not None:
                self.refs.append(v)

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else None}>")
            if tag in self.stack:
                while self.stack and self.stack.pop() != tag:
                    pass
        else:
            self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def parse(page: str) -> StrictParser:
    p = StrictParser()
    p.feed(page)
    p.close()
    assert not p.errors, p.errors[:5]
    assert not p.stack, f"unclosed: {p.stack}"
    return p


def text_of(p: StrictParser) -> str:
    return re.sub(r"\s+", " ", " ".join(p.text))


def assert_self_contained(page: str, p: StrictParser) -> None:
    assert "http://" not in page and "https://" not in page
    assert not re.search(r"<script[^>]*\bsrc\s*=", page, re.I)
    assert not re.search(r"<link\b", page, re.I)
    assert not re.search(r"@import|url\(\s*['\"]?(?!#)", page, re.I)
    for ref in p.refs:
        assert not re.match(r"^\s*([a-z][a-z0-9+.-]*:|//)", ref, re.I), ref


def op(index, t_s, process, type_, f, **kw):
    d = {"index": index, "time_ns": int(t_s * 1e9), "process": process, "type": type_, "f": f,
         "key": kw.pop("key", ""), "value": kw.pop("value", None), "message_id": kw.pop("message_id", None),
         "node": kw.pop("node", ""), "error": kw.pop("error", None)}
    d.update(kw)
    return d


def make_history(duration_s=30.0, per_s=20, processes=4, faults=(("partition", 5.0, 12.0, ["n1", "n2"]),
                                                                   ("kill", 18.0, 22.0, ["bookie-2"]))):
    """Sends from `processes` clients; an info op now and then; nemesis start/stop pairs."""
    events = []
    n = 0
    for i in range(int(duration_s * per_s)):
        t = i / per_s
        p = i % processes
        events.append((t, p, "invoke", "send", {"value": n, "key": "t0"}))
        in_fault = any(s <= t < e for _, s, e, _ in faults)
        slow = min(0.2, 0.9 * processes / per_s)      # a process never has two ops outstanding
        lat = slow if in_fault else 0.004 + (i % 7) * 0.001
        typ = "info" if in_fault and i % 5 == 0 else "ok"
        extra = {"value": n, "key": "t0", "node": "broker-1"}
        if typ == "ok":
            extra["message_id"] = {"ledger_id": 7, "entry_id": n, "partition": -1, "batch_index": -1}
        else:
            extra["error"] = "Timeout: send timed out"
        events.append((t + lat, p, typ, "send", extra))
        n += 1
    for name, s, e, targets in faults:
        events.append((s, -1, "invoke", f"start-{name}", {"value": None}))
        events.append((s + 0.05, -1, "ok", f"start-{name}", {"value": targets}))
        events.append((e, -1, "invoke", f"stop-{name}", {"value": None}))
        events.append((e + 0.05, -1, "ok", f"stop-{name}", {"value": None}))
    events.sort(key=lambda x: x[0])
    # processes whose op ended info take fresh ids: keep it simple, remap per pair order
    out, fresh, remap = [], 100, {}
    for i, (t, p, typ, f, extra) in enumerate(events):
        proc = remap.get(p, p)
        out.append(op(i, t, proc, typ, f, **extra))
        if typ == "info" and p >= 0:
            remap[p] = fresh
            fresh += 1
    return out


def write_history(path: Path, ops, torn: str | None = None):
    with open(path, "w") as f:
        for o in ops:
            f.write(json.dumps(o) + "\n")
        if torn is not None:
            f.write(torn)


def make_run(root: Path, *, results=None, history=True, spec=True, nodes=True) -> Path:
    d = root / "log-chaos" / "20260101T120000"
    d.mkdir(parents=True)
    if spec:
        (d / "test.toml").write_text(SPEC)
    if history:
        write_history(d / "history.jsonl", make_history())
    if results is not None:
        (d / "results.json").write_text(json.dumps(results))
    if nodes:
        for n in ("broker-1", "bookie-2"):
            (d / "nodes" / n).mkdir(parents=True)
            (d / "nodes" / n / "node.log").write_text(f"{n} started\n")
    return d


RUN_INFO = {"dir": "results/log-chaos/20260101T120000", "started_at": "2026-01-01T12:00:00+00:00",
            "ended_at": "2026-01-01T12:00:45+00:00", "service_url": "pulsar://10.0.0.2:6650"}


def valid_results():
    return {"valid": True, "exit_code": 0, "error": None, "run": RUN_INFO,
            "checkers": {"log": {"valid": True, "anomalies": {},
                                 "stats": {"latency": {"p50": 4.1, "p99": 210.0}, "unavailable": 0,
                                           "counts": {"send": {"ok": 560, "info": 12}}}}}}


def invalid_results():
    lost = [{"value": 1234 + i, "topic": "persistent://public/default/t0",
             "message_id": {"ledger_id": 7, "entry_id": 40 + i, "partition": -1, "batch_index": -1},
             "send": {"index": 90 + i, "time_ns": 4_500_000_000, "process": 2, "type": "ok", "f": "send",
                      "value": 1234 + i}, "node": "broker-1"} for i in range(3)]
    dups = [{"value": 5000 + i,
             "message_ids": [{"ledger_id": 7, "entry_id": 60 + i, "partition": -1, "batch_index": -1},
                             {"ledger_id": 9, "entry_id": 2 + i, "partition": -1, "batch_index": -1}],
             "reads": [{"index": 700 + i, "process": 3, "type": "ok", "f": "read"}]} for i in range(250)]
    return {"valid": False, "exit_code": 1, "error": None, "run": RUN_INFO,
            "checkers": {"log": {"valid": False, "anomalies": {"lost": lost, "duplicate": dups},
                                 "stats": {"throughput": [10, 20, 30]}}}}


def render_and_parse(d: Path):
    out = report.render(d)
    assert out == d / "report.html" and out.is_file()
    page = out.read_text(encoding="utf-8")
    p = parse(page)
    assert_self_contained(page, p)
    return page, p


def test_valid_run_with_nemesis_periods(tmp_path):
    d = make_run(tmp_path, results=valid_results())
    page, p = render_and_parse(d)
    text = text_of(p)
    assert '<p class="word">valid</p>' in page and "v-valid" in page
    assert "exit code 0" in text
    assert "log-chaos" in text and "partition, kill" in text
    # charts: latency (log) and throughput, with both fault periods shaded and labelled
    assert p.tags.get("svg", 0) >= 2 and p.tags.get("path", 0) >= 3
    assert "Latency of send over time" in page and "Client ops completed per second" in page
    assert "partition n1, n2" in text and "kill bookie-2" in text
    # fault timeline table: start and stop seconds
    faults = page[page.index('id="faults"'):page.index('id="spec"')]
    assert ">5.000<" in faults and ">12.050<" in faults and ">18.000<" in faults
    # spec verbatim, node logs linked relatively, raw files listed
    assert "nemesis_interval = 10.0" in text
    assert 'href="nodes/broker-1/node.log"' in page and 'href="history.jsonl"' in page
    assert "No anomalies found" in text
    # page order
    idx = [page.index(f'id="{s}"') for s in ("verdict", "summary", "anomalies", "charts", "faults", "spec",
                                               "files")]
    assert idx == sorted(idx)


def test_invalid_run_lists_anomalies_with_evidence(tmp_path):
    d = make_run(tmp_path, results=invalid_results())
    page, p = render_and_parse(d)
    text = text_of(p)
    assert '<p class="word">INVALID</p>' in page and "v-invalid" in page
    assert "exit code 1 (invalid)" in text
    assert "lost: 3" in text and "duplicate: 250" in text
    assert ">1234<" in page                                # a known lost value in its table
    assert "(7,40,-1,-1)" in text                          # its message id, compactly
    assert "(7,60,-1,-1), (9,2,-1,-1)" in text             # a list of message ids
    assert "#90 p2 ok send" in text                        # the nested op that proves it
    assert "50 more not shown" in text                     # 250 rows, 200 shown
    dup = page[page.index('id="anomaly-log-duplicate"'):]
    dup = dup[:dup.index("</details>")]
    assert dup.count("<tr>") == 200 + 1                    # header row + 200


def test_partial_run_only_history_with_torn_and_corrupt_lines(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    ops = make_history()
    lines = [json.dumps(o) for o in ops]
    lines.insert(10, "{not json at all")
    (d / "history.jsonl").write_text("\n".join(lines) + '\n{"index": 99999, "time_ns": 12')
    page, p = render_and_parse(d)
    text = text_of(p)
    assert '<p class="word">unknown</p>' in page
    assert "results.json is missing" in text and "test.toml is missing" in text
    assert "skipped 2 corrupt line(s)" in text and "last line is torn" in text and "line 11" in text
    assert p.tags.get("svg", 0) >= 2
    assert "partition n1, n2" in text


def test_empty_folder(tmp_path):
    page, p = render_and_parse(tmp_path)
    text = text_of(p)
    assert '<p class="word">unknown</p>' in page
    for missing in ("test.toml is missing", "results.json is missing", "history.jsonl is missing",
                    "nodes/ is missing"):
        assert missing in text
    assert "nothing to chart" in text


def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(report.ReportError, match="no such run folder"):
        report.render(tmp_path / "nope")


def test_corrupt_results_and_spec_are_named(tmp_path):
    d = make_run(tmp_path, results=None)
    (d / "results.json").write_text('{"valid": tru')
    (d / "test.toml").write_text("test_name = [unclosed\n")
    page, p = render_and_parse(d)
    text = text_of(p)
    assert "results.json is not valid JSON" in text and "test.toml is not valid TOML" in text
    assert "test_name = [unclosed" in text                  # still shown verbatim
    assert '<p class="word">unknown</p>' in page


def test_everything_is_escaped(tmp_path):
    res = invalid_results()
    res["error"] = "<script>alert(1)</script>"
    res["checkers"]["log"]["anomalies"] = {"<b>weird</b>": [{"value": "<img src=x onerror=alert(1)>"}]}
    d = make_run(tmp_path, results=res)
    page, p = render_and_parse(d)
    assert "<script>alert" not in page and "<img" not in page and "<b>weird" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert p.tags.get("script") == 1                       # only the page's own sorting script


def test_unknown_verdict_crashed_run_with_error(tmp_path):
    res = {"valid": "unknown", "exit_code": 255, "error": "RuntimeError: deploy failed", "run": RUN_INFO,
           "checkers": {}}
    d = make_run(tmp_path, results=res, history=False)
    page, p = render_and_parse(d)
    text = text_of(p)
    assert '<p class="word">unknown</p>' in page and "v-unknown" in page
    assert "exit code 255 (the harness crashed)" in text and "RuntimeError: deploy failed" in text


def test_stats_only_charts_and_fault_periods(tmp_path):
    res = valid_results()
    res["checkers"]["log"]["stats"].update({
        "throughput": [50, 60, 0, 0, 55, 58],
        "latency_over_time": [{"t": 0, "p50": 3, "p99": 9}, {"t": 3, "p50": 300, "p99": 900}],
        "fault_periods": [[2.0, 4.0, "pause", ["broker-2"]], [4.5, None, "partition", "halves"]]})
    d = make_run(tmp_path, results=res, history=False)
    page, p = render_and_parse(d)
    text = text_of(p)
    assert p.tags.get("svg", 0) == 2
    assert "pause broker-2" in text and "partition halves" in text
    assert "not healed" in text


def test_history_parquet_fallback(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    ops = make_history()
    rows = [{**o, "value": json.dumps(o["value"]), "message_id": None, "error": o["error"] or ""} for o in ops]
    d = tmp_path / "run"
    d.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), d / "history.parquet")
    page, p = render_and_parse(d)
    text = text_of(p)
    assert "read from history.parquet" in text and "partition n1, n2" in text
    assert p.tags.get("svg", 0) >= 2


def test_large_history_is_fast_and_light(tmp_path):
    d = tmp_path / "big"
    d.mkdir()
    ops = make_history(duration_s=500.0, per_s=100, processes=8,
                       faults=tuple(("partition" if i % 2 else "pause", 20.0 + 40 * i, 35.0 + 40 * i, [f"n{i}"])
                                    for i in range(12)))
    assert len(ops) >= 100_000
    write_history(d / "history.jsonl", ops)
    t0 = time.monotonic()
    out = report.render(d)
    elapsed = time.monotonic() - t0
    page = out.read_text()
    parse(page)
    assert elapsed < 30, elapsed
    assert len(page) < 1_500_000, len(page)
    for m in re.finditer(r'<path d="([^"]*)"', page):    # no series above the point budget
        assert m.group(1).count("M") <= report.MAX_POINTS + 1


def test_stats_only_in_the_log_checkers_shape(tmp_path):
    """No history: the charts come from the log checker's bucketed series and latency points."""
    res = valid_results()
    res["checkers"]["log"]["stats"].update({
        "throughput": {"ok_sends": 300, "bucket_s": 1.0, "start_s": 0.0, "window_s": [0.0, 6.0],
                       "per_bucket": [50, 60, 0, 0, 55, 58]},
        "latency_over_time": {"bucket_s": 1.0, "start_s": 0.0, "p50_ms": [3, 4, None, None, 3, 3],
                              "p99_ms": [9, 12, None, None, 8, 9],
                              "points": [[0.1, 3.2, "ok"], [1.5, 250.0, "info"], [4.2, 2.9, "ok"]]},
        "fault_periods": [[2.0, 4.0, "partition", {"shape": "halves", "sides": [["n1"], ["n2", "n3"]],
                                                   "grudge": {"n1": ["n2", "n3"]}}]]})
    d = make_run(tmp_path, results=res, history=False)
    page, p = render_and_parse(d)
    text = text_of(p)
    assert p.tags.get("svg", 0) == 2
    assert "points from the checker's stats" in text and "Throughput" in text
    assert "partition halves: n1 | n2, n3" in text             # the plan, not the derived grudge
    assert "per_bucket" in page and "window_s" not in page[page.index('id="charts"'):page.index('id="faults"')]


def test_fault_outcomes_from_nemesis_ops(tmp_path):
    """A failed start is listed but not drawn; a failed stop leaves the fault on until heal; kill is a point."""
    ops = make_history(faults=())
    t = lambda s: int(s * 1e9)
    nem = [
        {"time_ns": t(2.0), "process": -1, "type": "invoke", "f": "start-pause", "value": {"node": "broker-2"}},
        {"time_ns": t(2.1), "process": -1, "type": "fail", "f": "start-pause", "error": "no such process"},
        {"time_ns": t(4.0), "process": -1, "type": "invoke", "f": "start-partition", "value": {"node": "zk-1"}},
        {"time_ns": t(4.1), "process": -1, "type": "ok", "f": "start-partition", "value": {"node": "zk-1"}},
        {"time_ns": t(9.0), "process": -1, "type": "invoke", "f": "stop-partition"},
        {"time_ns": t(9.1), "process": -1, "type": "fail", "f": "stop-partition", "error": "iptables busy"},
        {"time_ns": t(14.0), "process": -1, "type": "invoke", "f": "kill", "value": ["bookie-3"]},
        {"time_ns": t(14.2), "process": -1, "type": "ok", "f": "kill", "value": ["bookie-3"]},
        {"time_ns": t(20.0), "process": -1, "type": "invoke", "f": "heal"},
        {"time_ns": t(20.5), "process": -1, "type": "ok", "f": "heal", "value": {"healed": True}},
        {"time_ns": t(25.0), "process": -1, "type": "invoke", "f": "start-partition", "value": ["n1"]},
        {"time_ns": t(25.1), "process": -1, "type": "info", "f": "start-partition", "error": "timeout"},
    ]
    allops = sorted(ops + nem, key=lambda o: o["time_ns"])
    for i, o in enumerate(allops):
        o["index"] = i
    d = tmp_path / "run"
    d.mkdir()
    write_history(d / "history.jsonl", allops)
    page, p = render_and_parse(d)
    faults = page[page.index('id="faults"'):page.index('id="spec"')]
    ft = text_of(parse(faults[faults.index("<table"):faults.index("</table>") + 8]))
    assert "start failed: no such process: no effect" in ft
    assert "stop failed: iptables busy: still on" in ft and "ended by heal" in ft and ">20.500<" in faults
    assert "one-shot" in ft and "bookie-3" in ft
    assert "start indeterminate: timeout" in ft and "not healed by the end of the history" in ft
    charts = page[page.index('id="charts"'):page.index('id="faults"')]
    assert "pause broker-2" not in charts and "partition zk-1" in charts and "kill bookie-3" in charts
    # the summary tells the faults that ran from the one that failed to start
    summary = page[page.index('id="summary"'):]
    summary = summary[:summary.index("</section>")]
    assert "faults in this run: kill, partition; failed to start, no effect: pause" in summary
