"""The schema workload's client side without a cluster: admin answers cut short, the evolution
plan under BACKWARD, and what a failed creation leaves open."""
from __future__ import annotations

import http.client
import io

import pytest

from core.history import INFO, OK
from workloads import schema as sw


class _Resp(io.BytesIO):
    status = 200

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()


def _urlopen_script(monkeypatch, answers):
    """urlopen answers from `answers` in turn: an exception instance is raised, bytes are a 200."""
    calls = []

    def fake(req, timeout=None):
        calls.append(req.full_url)
        a = answers.pop(0)
        if isinstance(a, BaseException):
            raise a
        return _Resp(a)
    monkeypatch.setattr(sw.urllib.request, "urlopen", fake)
    return calls


def test_an_answer_cut_short_is_info_for_a_registration(monkeypatch):
    _urlopen_script(monkeypatch, [http.client.IncompleteRead(b'{"vers', 20)])
    type_, ch = sw.register("http://b1:8080", "persistent://public/default/s-0", "t0.1")
    assert type_ == INFO and "IncompleteRead" in ch["error"]


def test_a_final_registry_answer_cut_short_is_asked_again(monkeypatch):
    monkeypatch.setattr(sw.time, "sleep", lambda s: None)
    calls = _urlopen_script(monkeypatch, [
        http.client.IncompleteRead(b"{", 10),
        http.client.BadStatusLine(""),
        b'{"getSchemaResponses": [{"version": 0, "type": "JSON", "data": %s}]}'
        % __import__("json").dumps(sw.definition("base")).encode()])
    type_, ch = sw.ask_registry("http://b1:8080", "persistent://public/default/s-0", tries_s=30)
    assert type_ == OK and ch["value"] == [{"version": 0, "schema": "base", "type": "JSON"}]
    assert len(calls) == 3


def _thread(strategy, **opts):
    import random
    from pathlib import Path
    from types import SimpleNamespace
    spec = SimpleNamespace(options={"strategy": strategy, "incompatible_share": 1.0, **opts})
    ctx = SimpleNamespace(spec=spec, keys=["persistent://public/default/s-0"], run_dir=Path("/tmp/run-abcdef"),
                          rng=lambda name, i: random.Random(f"{name}:{i}"),
                          nodes=lambda role: [{"name": "broker-1"}], admin_urls=lambda: ["http://b1:8080"])
    return sw._Thread(ctx, session=None, index=0)


@pytest.mark.parametrize("strategy, drop", [("FULL", True), ("FORWARD", True), ("BACKWARD", False)])
def test_backward_runs_try_no_drop_for_what_adds_a_version(strategy, drop):
    """Under BACKWARD an accepted !drop would become the latest version and refuse every later
    evolution of the series: only !type is tried for producers and registrations there."""
    th = _thread(strategy)
    changes = set()
    for _ in range(200):
        f, value, _perform = th.plan(sw.Planned("evolve", "persistent://public/default/s-0", None, 0.0))
        if f != "create-consumer":
            changes.add(value["change"])
    assert ("drop" in changes) is drop and "type" in changes


class _Obj:
    def __init__(self):
        self.closed = False

    def producer_name(self):
        raise RuntimeError("gone")

    def close(self):
        self.closed = True


def test_a_made_producer_is_kept_when_its_node_cannot_be_told():
    from types import SimpleNamespace
    th = _thread("FULL")
    obj = _Obj()
    th.session = SimpleNamespace(client=SimpleNamespace(create_producer=lambda *a, **k: obj),
                                 node_of=lambda *a: "broker-1")
    type_, ch = th._make("producer", "persistent://public/default/s-0", "t0.1", "compatible")
    assert type_ == OK and ch == {"node": ""}
    assert th.producers["persistent://public/default/s-0"] is obj and th.label["persistent://public/default/s-0"] == "t0.1"
