"""`pulsar-chaos serve` lists shrink folders (the run shrunk, its failure, from and to, how often the
minimal spec reproduced) and serves their shrink.html and minimal.toml."""
from __future__ import annotations

import io

from harness import serve, shrink
from tests.shrink.test_shrink_cli import _fake, make_run


def test_serve_lists_a_shrink_and_serves_its_page(tmp_path, monkeypatch):
    d = make_run(tmp_path)
    monkeypatch.setattr(shrink.ShrinkRun, "_run_candidate", _fake([]))
    root = tmp_path / "results"
    assert shrink.run(shrink.Options(run=str(d), tries=2, results_dir=str(root)), io.StringIO()) == 0
    client = serve.make_app(root).test_client()
    index = client.get("/").get_data(as_text=True)
    assert "<h2>Shrinks</h2>" in index and "log: lost" in index and "3 faults, 30s" in index
    assert "2 faults (kill, pause)" in index and "2/2" in index
    sdir = next((root / "shrinks" / "log-chaos").iterdir()).relative_to(root).as_posix()
    assert f'/files/{sdir}/shrink.html' in index
    page = client.get(f"/files/{sdir}/shrink.html")
    assert page.status_code == 200 and "minimal" in page.get_data(as_text=True)
    assert client.get(f"/files/{sdir}/minimal.toml").status_code == 200


def test_serve_without_shrinks_has_no_shrinks_section(tmp_path):
    make_run(tmp_path)
    assert "<h2>Shrinks</h2>" not in serve.make_app(tmp_path / "results").test_client().get("/").get_data(as_text=True)
