"""A campaign's runs as JUnit XML, the Ant/Surefire format CI tools read (Jenkins, GitLab, GitHub test
reporters): one <testcase> per run; a run that met its expectation passes, an invalid run expected
valid (or a valid one expected invalid) is a <failure>, an unknown, crashed or timed-out run an <error>,
a run not started (--max-hours) <skipped>."""
from __future__ import annotations

import socket
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from typing import Any

PASS, FAILURE, ERROR, SKIPPED = "pass", "failure", "error", "skipped"


def judge(rec: dict[str, Any]) -> tuple[str, str, str]:
    """(kind, type, message) of one campaign record (see harness.campaign_run)."""
    outcome, expected = rec.get("outcome"), rec.get("expected") or "valid"
    anomalies = rec.get("anomalies") or ""
    if outcome == "not-run":
        return SKIPPED, "not-run", rec.get("why") or "not run"
    if outcome in ("crashed", "timeout"):
        return ERROR, outcome, rec.get("why") or outcome
    if outcome == "unknown":
        return ERROR, "unknown", "verdict unknown: " + (rec.get("why") or "the checkers could not decide")
    if outcome == "invalid" and expected != "invalid":
        return FAILURE, "invalid", anomalies or "invalid"
    if outcome == "valid" and expected == "invalid":
        return FAILURE, "expected-invalid", (f"expected invalid ({rec.get('expected_reason') or 'declared'}) but "
                                             f"the checkers found the run valid: is the unsafe setting in effect?")
    return PASS, "", ""


def xml(campaign: str, records: Iterable[dict[str, Any]], timestamp: str, seconds: float) -> bytes:
    recs = list(records)
    kinds = [judge(r)[0] for r in recs]
    counts = {k: kinds.count(k) for k in (FAILURE, ERROR, SKIPPED)}
    root = ET.Element("testsuites", name=campaign, tests=str(len(recs)), failures=str(counts[FAILURE]),
                      errors=str(counts[ERROR]), time=f"{seconds:.3f}")
    suite = ET.SubElement(root, "testsuite", name=campaign, tests=str(len(recs)), failures=str(counts[FAILURE]),
                          errors=str(counts[ERROR]), skipped=str(counts[SKIPPED]), time=f"{seconds:.3f}",
                          timestamp=timestamp, hostname=socket.gethostname())
    props = ET.SubElement(suite, "properties")
    ET.SubElement(props, "property", name="campaign", value=campaign)
    for r in recs:
        kind, typ, msg = judge(r)
        tc = ET.SubElement(suite, "testcase", name=str(r["name"]), classname=f"pulsar-chaos.{r.get('workload', '?')}",
                           time=f"{float(r.get('seconds') or 0):.3f}")
        detail = "\n".join(f"{k}: {r.get(k)}" for k in ("run_dir", "report", "expected", "expected_reason",
                                                       "verdict", "anomalies", "why", "exit_code") if r.get(k) not in (None, ""))
        if kind != PASS:
            el = ET.SubElement(tc, kind, type=typ, message=_one_line(msg))
            el.text = detail
        out = ET.SubElement(tc, "system-out")
        out.text = detail
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"


def _one_line(s: str, limit: int = 1000) -> str:
    s = " ".join(str(s).split())
    return s if len(s) <= limit else s[:limit - 1] + "…"
