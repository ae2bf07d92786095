"""The counterexample diagram (harness/lin_diagram.py) and its place in the run report."""
from __future__ import annotations

import json
import re

from checkers.linear import ANOMALY, check
from harness import lin_diagram, report
from core.history import Op, write_jsonl


def invalid_history() -> list[Op]:
    """p0 writes 1; p1's write 2 times out but lands; p2 reads 2; p0 writes 3; p3 reads 2 (stale)."""
    ops: list[Op] = []

    def ev(p, type, f, value=None):
        ops.append(Op(process=p, type=type, f=f, value=value, time_ns=(len(ops) + 1) * 1_000_000,
                      index=len(ops)))

    ev(0, "invoke", "write", 1)
    ev(0, "ok", "write", 1)
    ev(1, "invoke", "write", 2)
    ev(2, "invoke", "read")
    ev(1, "info", "write", 2)
    ev(2, "ok", "read", 2)
    ev(0, "invoke", "write", 3)
    ev(0, "ok", "write", 3)
    ev(3, "invoke", "read")
    ev(3, "ok", "read", 2)
    return ops


def counterexample() -> dict:
    r = check(invalid_history(), {"model": "register"})
    assert r.valid is False
    return json.loads(json.dumps(r.anomalies[ANOMALY][0]))       # as results.json holds it


def test_fragment_rows_bars_points_and_the_bad_op():
    ce = counterexample()
    html = lin_diagram.fragment(ce)
    assert html.startswith('<figure class="lin-diagram"') and "<svg" in html and "</figure>" in html
    for p in (0, 1, 2, 3):
        assert f">process {p}</text>" in html
    assert html.count('class="bar bad"') == 1                      # the stale read
    assert html.count('<circle class="lin"') == ce["prefix_length"] == 4
    assert 'class="bar lin crash"' in html                         # the timed-out write, linearized
    infos = re.findall(r'data-info="([^"]*)"', html)
    assert any("cannot be linearized next: p3 read 2" in i and "state before it: 3" in i for i in infos)
    assert any(i.startswith("#2 in the linearization: p1 write 2") and "state after: 2" in i for i in infos)
    assert "<script>" in html and "addEventListener" in html


def test_fragment_is_offline():
    html = lin_diagram.page([counterexample()])
    assert html.startswith("<!DOCTYPE html>")
    assert not re.search(r"(src|href)=", html)
    assert "http" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_fragment_escapes_values():
    ce = counterexample()
    ce["op"]["value"] = "<script>alert(1)</script>"
    html = lin_diagram.fragment(ce)
    assert "<script>alert(1)" not in html and "&lt;script&gt;" in html


def test_report_embeds_the_diagram(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    r = check(invalid_history(), {"model": "register"})
    (run / "results.json").write_text(json.dumps({"valid": False, "exit_code": 1,
                                                  "checkers": {"linear": r.to_json()}}))
    write_jsonl(invalid_history(), run / "history.jsonl")
    page = report.render(run).read_text()
    assert page.count('<figure class="lin-diagram"') == 1
    assert "nonlinearizable" in page


def test_report_without_counterexamples_has_no_diagram(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    ops = invalid_history()[:8]
    r = check(ops, {"model": "register"})
    assert r.valid is True
    (run / "results.json").write_text(json.dumps({"valid": True, "checkers": {"linear": r.to_json()}}))
    assert "lin-diagram" not in report.render(run).read_text()
