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
