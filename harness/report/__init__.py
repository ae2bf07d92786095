"""The run report: one self-contained report.html per run folder (verdict, anomalies, charts, faults, spec, files).

Renders whatever a run left behind, even a crashed or interrupted one; the charts are inline SVG drawn here,
so the page opens from disk with no network (no external scripts, styles, fonts or images). The run model
and the history's analysis are in `model`, formatting in `fmt`, the SVG charts in `charts`, the page's
sections and `render` in `page`.
"""
from harness.report.model import MAX_POINTS, REPORT_NAME, ReportError
from harness.report.page import main, render

__all__ = ["MAX_POINTS", "REPORT_NAME", "ReportError", "main", "render"]
