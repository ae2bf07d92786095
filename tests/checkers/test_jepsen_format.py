"""Reading histories from other tools (Jepsen EDN, jepsen.util log lines, our jsonl) and checking
them with `pulsar-chaos lin`: verdicts, exit codes, bad input."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from checkers.jepsen_format import EdnError, detect, parse_edn, read_edn, read_history, read_log
from harness import cli
from core.history import HistoryError, Op, write_jsonl

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------ EDN

def test_edn_subset():
    v = parse_edn('{:a 1, :b "x\\ty\\"z", :c nil, :d true, :e false, :f [1 -2 3.5], :g (1 2), '
                  ':h #{1 2}, :i {:j [:k]}, :l 12N, :m \\a, :n :ns/kw, :o sym}')
    assert v["a"] == 1 and v["b"] == 'x\ty"z' and v["c"] is None and v["d"] is True and v["e"] is False
    assert v["f"] == [1, -2, 3.5] and v["g"] == [1, 2] and v["h"] == {1, 2}
    assert v["i"] == {"j": ["k"]} and v["l"] == 12 and v["m"] == "a" and v["n"] == "ns/kw"
    assert v["o"] == "sym"


def test_edn_tags_comments_and_discard():
    assert parse_edn('#jepsen.history.Op{:index 3, :f :read} ; a comment') == {"index": 3, "f": "read"}
    assert parse_edn('#inst "2020-01-01"') == "2020-01-01"
    assert parse_edn("[1 #_ 2 3]") == [1, 3]


@pytest.mark.parametrize("bad", ["{:a 1", "{:a}", "[1 2", '"open', "{:a 1} {:b 2}", ")"])
def test_edn_errors(bad):
    with pytest.raises(EdnError):
        parse_edn(bad)


# ------------------------------------------------------------------------------------------ readers

def test_read_edn_skips_nemesis_and_numbers_ops_in_order():
    ops = read_edn(DATA / "cas-valid.edn")
    assert all(isinstance(o, Op) for o in ops)
    assert [o.index for o in ops] == list(range(len(ops))) and {o.time_ns for o in ops} == {0}
    assert {o.process for o in ops} == {0, 1, 2, 3, 4}                 # no :nemesis
    assert (ops[0].process, ops[0].type, ops[0].f, ops[0].value) == (0, "invoke", "write", 1)
    assert ops[2].value == [1, 2]
    assert ops[4].type == "info" and ops[4].error == "timeout"
    assert (ops[11].type, ops[11].value) == ("ok", 3)                 # a #jepsen.history.Op record


def test_read_edn_names_the_bad_line():
    with pytest.raises(HistoryError, match=r"bad-line\.edn:3: not a Jepsen op"):
        read_edn(DATA / "bad-line.edn")


def test_read_edn_field_errors(tmp_path):
    p = tmp_path / "h.edn"
    for line, why in [("{:process 0, :type :done, :f :read}", ":type"),
                      ('{:process "x", :type :ok, :f :read}', ":process"),
                      ("{:process 0, :type :ok}", ":f"),
                      ("[1 2]", "not a map")]:
        p.write_text("{:process 0, :type :invoke, :f :read}\n" + line + "\n")
        with pytest.raises(HistoryError, match=rf"h\.edn:2: .*{why}"):
            read_edn(p)


def test_read_log_takes_op_lines_only():
    ops = read_log(DATA / "register-valid.log")
    assert [(o.process, o.type, o.f, o.value) for o in ops[:4]] == [
        (0, "invoke", "write", 1), (1, "invoke", "read", None), (0, "ok", "write", 1), (1, "ok", "read", 1)]
    assert all(o.process != "nemesis" for o in ops) and len(ops) == 14
    assert ops[6].error == "indeterminate: timed out"
    assert ops[-1].error == "connection-refused"


def test_read_log_names_the_bad_line(tmp_path):
    p = tmp_path / "jepsen.log"
    p.write_text("INFO  jepsen.util - 0\t:invoke\t:read\tnil\n"
                 "INFO  jepsen.util - Relative time begins now\n"           # a message, not an op
                 "INFO  jepsen.util - 0\t:ok\t:read\t[1 2\n")
    with pytest.raises(HistoryError, match=r"jepsen\.log:3: not a jepsen\.util op line"):
        read_log(p)


def test_detect_and_read_history(tmp_path):
    assert detect(DATA / "cas-valid.edn") == "jepsen-edn"
    assert detect(DATA / "register-valid.log") == "jepsen-log"
    j = tmp_path / "history.jsonl"
    write_jsonl([Op(0, "invoke", "write", value=1, time_ns=5), Op(0, "ok", "write", value=1, time_ns=6)], j)
    assert detect(j) == "jsonl"
    assert [o.time_ns for o in read_history(j)] == [5, 6]
    edn = tmp_path / "noext"
    edn.write_text((DATA / "cas-valid.edn").read_text())
    assert detect(edn) == "jepsen-edn"
    with pytest.raises(HistoryError, match="unknown format"):
        read_history(j, "xml")
    with pytest.raises(HistoryError, match="no such file"):
        read_history(tmp_path / "missing.edn")


# ------------------------------------------------------------------------------------------ the command

def lin(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = cli.main(["lin", *argv])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("path,model,fmt,code", [
    ("cas-valid.edn", "cas-register", "jepsen-edn", 0),
    ("cas-invalid.edn", "cas-register", "jepsen-edn", 1),
    ("register-valid.log", "register", "jepsen-log", 0),
    ("register-invalid.log", "register", "jepsen-log", 1),
    ("independent-invalid.edn", "cas-register", "auto", 1),
])
def test_lin_verdicts_and_exit_codes(capsys, path, model, fmt, code):
    rc, out, err = lin(capsys, "--model", model, "--format", fmt, str(DATA / path))
    assert rc == code, (out, err)
    assert out.startswith("valid: linearizable" if code == 0 else "INVALID: not linearizable"), out
    assert err == ""


def test_lin_invalid_names_the_op_and_writes_the_diagram(capsys, tmp_path):
    html_out = tmp_path / "lin.html"
    rc, out, _ = lin(capsys, "--model", "cas-register", "--out", str(html_out), str(DATA / "cas-invalid.edn"))
    assert rc == 1
    assert "read 2 by process 2 cannot be linearized" in out and "(the state is 3)" in out
    page = html_out.read_text()
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page and "http" not in page.replace(
        "http://www.w3.org/2000/svg", "")
    assert "cannot be placed" in page


def test_lin_independent_reports_the_key(capsys):
    rc, out, _ = lin(capsys, "--model", "cas-register", "--json", str(DATA / "independent-invalid.edn"))
    assert rc == 1
    r = json.loads(out)
    assert r["valid"] is False and r["stats"]["independent"] is True and r["stats"]["partitions"] == 2
    [ce] = r["anomalies"]["nonlinearizable"]
    assert ce["key"] == "y" and ce["op"]["value"] == ["y", 7] and ce["state"] == 5


def test_lin_json_of_a_valid_history(capsys):
    rc, out, _ = lin(capsys, "--model", "register", "--json", str(DATA / "register-valid.log"))
    r = json.loads(out)
    assert rc == 0 and r["valid"] is True and r["anomalies"] == {}
    assert r["stats"]["ops"] == {"ok": 4, "fail": 1, "info": 2, "unfinished": 0, "crashed_reads_dropped": 1}


def test_lin_our_jsonl(capsys, tmp_path):
    p = tmp_path / "history.jsonl"
    ops = [Op(0, "invoke", "enqueue", key="q", value=1), Op(0, "ok", "enqueue", key="q", value=1),
           Op(1, "invoke", "dequeue", key="q"), Op(1, "ok", "dequeue", key="q", value=2)]
    for i, o in enumerate(ops):
        o.index, o.time_ns = i, 1000 * (i + 1)
    write_jsonl(ops, p)
    assert lin(capsys, "--model", "queue", str(p))[0] == 1
    ops[3].value = 1
    write_jsonl(ops, p)
    assert lin(capsys, "--model", "queue", str(p))[0] == 0


def test_lin_unknown_exits_2(capsys, tmp_path):
    from tests.checkers.test_linear import simulated, with_bad_read
    p = tmp_path / "hard.edn"
    with open(p, "w") as f:
        for o in with_bad_read(simulated(3000, procs=10, info=0.2, seed=5), 0.9):
            v = "nil" if o.value is None else str(o.value).replace(",", "")
            f.write(f"{{:process {o.process}, :type :{o.type}, :f :{o.f}, :value {v}}}\n")
    rc, out, _ = lin(capsys, "--model", "cas-register", "--max-cache", "1000", str(p))
    assert rc == 2 and out.startswith("unknown: cache limit"), out
    rc, out, _ = lin(capsys, "--model", "cas-register", "--time-limit", "0.2", str(p))
    assert rc in (1, 2) and out.startswith(("unknown: time limit", "INVALID")), out


@pytest.mark.parametrize("argv,message", [
    (["--model", "register", "missing.edn"], "missing.edn: no such file"),
    (["--model", "cas-register", str(DATA / "bad-line.edn")], "bad-line.edn:3: not a Jepsen op"),
    (["--model", "stack", str(DATA / "cas-valid.edn")], "unknown model 'stack'"),
    (["--model", "fifo-queue", str(DATA / "cas-valid.edn")], "not an operation of the fifo-queue model"),
    ([str(DATA / "cas-valid.edn")], "--model"),
    (["--model", "register", "--format", "xml", str(DATA / "cas-valid.edn")], "invalid choice"),
    (["--model", "register", "--bogus", str(DATA / "cas-valid.edn")], "unrecognized arguments"),
])
def test_lin_bad_input_is_one_line_and_254(capsys, argv, message):
    rc, out, err = lin(capsys, *argv)
    assert rc == 254
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err
    assert "Traceback" not in err


def test_lin_console_script(tmp_path):
    """The installed command, as a user runs it (exit code through the process)."""
    exe = Path(sys.executable).with_name("pulsar-chaos")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "harness.cli"]
    p = subprocess.run(cmd + ["lin", "--model", "register", str(DATA / "register-invalid.log")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "INVALID" in p.stdout, p.stderr


# ------------------------------------------------------------------------------------------ shapes

ONE_A_LINE = """{:process 0, :type :invoke, :f :append, :key "4", :value "x 0 1 y"}
{:process 0, :type :ok, :f :append, :key "4", :value "x 0 1 y"}
{:process 1, :type :invoke, :f :get, :key "4", :value nil}
{:process 1, :type :ok, :f :get, :key "4", :value "x 0 1 y"}
"""


def _shape(ops):
    return [(o.process, o.type, o.f, o.key, o.value) for o in ops]


def test_read_edn_whole_file_vector_list_and_multiline_maps(tmp_path):
    want = _shape(read_edn(_write(tmp_path, "a.edn", ONE_A_LINE)))
    assert want[0] == (0, "invoke", "append", "4", "x 0 1 y") and want[3][4] == "x 0 1 y"
    maps = [line for line in ONE_A_LINE.splitlines()]
    vector = ("; a Knossos-style file: one vector of op maps\n[" + maps[0] + "\n\n ; a comment\n "
              + maps[1].replace(", ", ",\n   ") + "\n " + maps[2] + " " + maps[3] + "]\n")
    assert _shape(read_edn(_write(tmp_path, "b.edn", vector))) == want
    lst = "(" + "\n".join(m.replace(":f", "\n :f") for m in maps) + ")"
    assert _shape(read_edn(_write(tmp_path, "c.edn", lst))) == want
    spread = "\n".join(m.replace(", ", "\n  ") for m in maps) + "\n"
    assert _shape(read_edn(_write(tmp_path, "d.edn", spread))) == want
    records = "\n".join("#jepsen.history.Op" + m for m in maps)
    assert _shape(read_edn(_write(tmp_path, "e.edn", records))) == want
    assert detect(_write(tmp_path, "vector-noext", vector)) == "jepsen-edn"


def test_read_edn_key_field_and_independent_tuples_side_by_side(tmp_path):
    ops = read_edn(_write(tmp_path, "k.edn", '{:process 0, :type :invoke, :f :read, :key :x, :value nil}\n'
                                            '{:process 0, :type :ok, :f :read, :key 3, :value [1 2]}\n'))
    assert (ops[0].key, ops[1].key, ops[1].value) == ("x", 3, [1, 2])


@pytest.mark.parametrize("text,line,what", [
    ("[{:process 0, :type :invoke, :f :read}\n {:process 0, :type :ok, :f :read}\n", 2, "never closed"),
    ("[{:process 0, :type :invoke, :f :read}]\n{:process 0, :type :ok, :f :read}\n", 2, "after the history"),
    ("[{:process 0, :type :invoke,\n  :f :read}\n 7]\n", 3, "not a map"),
    ("{:process 0, :type :invoke, :f :read,\n :value [1 2}\n", 2, "not a Jepsen op"),
])
def test_read_edn_errors_name_the_line(tmp_path, text, line, what):
    with pytest.raises(HistoryError, match=rf"h\.edn:{line}: .*{what}.*fix:"):
        read_edn(_write(tmp_path, "h.edn", text))


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize("text,fmt,what", [
    ("", "auto", "is empty"),
    ("\n  \n", "jepsen-edn", "is empty"),
    ("root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n", "auto",
     "has no client op"),
])
def test_no_client_op_is_an_error_naming_the_file(tmp_path, text, fmt, what):
    p = _write(tmp_path, "passwd", text)
    with pytest.raises(HistoryError, match=rf"passwd: {what}.*expected .*fix:"):
        read_history(p, fmt)


@pytest.mark.parametrize("text,what", [
    ("", "is empty"),
    ("root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n", "has no client op"),
])
def test_lin_on_an_empty_file_or_no_history_exits_254_with_one_line(capsys, tmp_path, text, what):
    p = _write(tmp_path, "passwd", text)
    for model in ("kv", "cas-register"):
        rc, out, err = lin(capsys, "--model", model, str(p))
        assert rc == 254 and out == "", (rc, out)
        assert err.count("\n") == 1 and err.startswith(f"error: {p}: {what}") and "fix:" in err, err


def test_read_log_columns_aligned_with_spaces(tmp_path):
    p = _write(tmp_path, "jepsen.log",
               "INFO  jepsen.util - 1   :invoke :cas    [1 2]\n"
               "INFO  jepsen.util - Relative time begins now\n"
               "INFO  jepsen.util - 1   :fail   :cas    [1 2]   :precondition-failed\n"
               "INFO  jepsen.util - 0   :invoke :read   nil\n"
               "INFO  jepsen.util - 0   :ok     :read   3\n")
    ops = read_log(p)
    assert [(o.process, o.type, o.f, o.value, o.error) for o in ops] == [
        (1, "invoke", "cas", [1, 2], ""), (1, "fail", "cas", [1, 2], "precondition-failed"),
        (0, "invoke", "read", None, ""), (0, "ok", "read", 3, "")]


@pytest.mark.parametrize("name,text,fmt", [
    ("h.edn", "{:process :nemesis, :type :info, :f :start, :value nil}\n"
              "{:process :nemesis, :type :info, :f :stop, :value nil}\n", "auto"),
    ("jepsen.log", "INFO  jepsen.util - :nemesis\t:info\t:start\tnil\n"
                   "INFO  jepsen.util - :nemesis\t:info\t:stop\tnil\n", "jepsen-log"),
    ("history.jsonl", '{"process": -1, "type": "invoke", "f": "start-kill", "value": null}\n'
                      '{"process": -1, "type": "ok", "f": "start-kill", "value": {"node": "bookie-1"}}\n', "auto"),
])
def test_a_history_of_nemesis_ops_only_is_valid_with_a_note(capsys, tmp_path, name, text, fmt):
    p = _write(tmp_path, name, text)
    nem: list[int] = []
    ops = read_history(p, fmt, nemesis=nem)
    assert not [op for op in ops if op.process >= 0] and len(nem) == 2
    rc, out, err = lin(capsys, "--model", "cas-register", "--format", fmt, str(p))
    assert rc == 0 and err == "", (rc, err)
    assert out.startswith("valid: no client op to check (2 nemesis ops only)"), out
    rc, out, _ = lin(capsys, "--model", "kv", "--json", str(p))
    assert rc == 0 and json.loads(out)["valid"] is True and json.loads(out)["stats"]["nemesis_ops"] == 2
