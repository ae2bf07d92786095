"""Where the time of an `analyze` goes, from Spark's own event log: per phase (the job description
analyze sets for each of its phases) the jobs, stages and tasks, the wall time from the phase's first
job to its last, the summed task run and CPU time; then the stages with the most task time.

    pulsar-chaos analyze RUNS --out OUT --conf spark.eventLog.enabled=true \\
        --conf spark.eventLog.dir=file:///tmp/ev --conf spark.eventLog.compress=false
    .venv/bin/python bench/spark_eventlog.py /tmp/ev            # a file, or a folder of them
"""
from __future__ import annotations

import collections
import json
import sys
from pathlib import Path


def events(path: Path):
    # a folder: Spark 4's rolling event log (eventlog_v2_<app>/events_<n>_<app>, beside an appstatus
    # file and checksums), or a folder of plain event logs
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()
                                                 and not p.name.startswith((".", "appstatus")))
    for f in files:
        with open(f, encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    yield json.loads(line)


def main(argv: list[str]) -> int:
    jobs: dict[int, dict] = {}
    stage_phase: dict[int, str] = {}
    stages: dict[int, dict] = {}
    task = collections.defaultdict(lambda: [0, 0.0, 0.0])      # stage -> [tasks, run s, cpu s]
    for e in events(Path(argv[0])):
        t = e["Event"]
        if t == "SparkListenerJobStart":
            desc = (e.get("Properties") or {}).get("spark.job.description") or "(none)"
            desc = desc.removeprefix("analyze: ")
            jobs[e["Job ID"]] = {"phase": desc, "start": e["Submission Time"], "end": None}
            for s in e["Stage IDs"]:
                stage_phase.setdefault(s, desc)
        elif t == "SparkListenerJobEnd":
            jobs[e["Job ID"]]["end"] = e["Completion Time"]
        elif t == "SparkListenerStageCompleted":
            si = e["Stage Info"]
            stages[si["Stage ID"]] = {"name": si["Stage Name"], "tasks": si["Number of Tasks"],
                                      "wall": ((si.get("Completion Time") or 0) - (si.get("Submission Time") or 0)) / 1e3}
        elif t == "SparkListenerTaskEnd":
            m = e.get("Task Metrics") or {}
            acc = task[e["Stage ID"]]
            acc[0] += 1
            acc[1] += (m.get("Executor Run Time") or 0) / 1e3
            acc[2] += (m.get("Executor CPU Time") or 0) / 1e9
    phases: dict[str, dict] = {}
    for j in jobs.values():
        p = phases.setdefault(j["phase"], {"jobs": 0, "start": j["start"], "end": j["end"] or j["start"]})
        p["jobs"] += 1
        p["start"] = min(p["start"], j["start"])
        p["end"] = max(p["end"], j["end"] or j["start"])
    for s, ph in stage_phase.items():
        p = phases[ph]
        p["stages"] = p.get("stages", 0) + (1 if s in stages else 0)
        n, run, cpu = task.get(s, (0, 0.0, 0.0))
        p["tasks"] = p.get("tasks", 0) + n
        p["run"] = p.get("run", 0.0) + run
        p["cpu"] = p.get("cpu", 0.0) + cpu
    print("| phase | jobs | stages | tasks | wall s | task run s | task CPU s |")
    print("|---|---|---|---|---|---|---|")
    for name, p in sorted(phases.items(), key=lambda kv: kv[1]["start"]):
        print(f"| {name} | {p['jobs']} | {p.get('stages', 0)} | {p.get('tasks', 0)} | {(p['end'] - p['start']) / 1e3:.1f} "
              f"| {p.get('run', 0):.1f} | {p.get('cpu', 0):.1f} |")
    total = sum(v[1] for v in task.values())
    print(f"\nall: {len(jobs)} jobs, {len(stages)} stages, {sum(v[0] for v in task.values())} tasks, "
          f"{total:.1f} s of task run time\n")
    print("| stage | phase | tasks | task run s | share | stage wall s |")
    print("|---|---|---|---|---|---|")
    top = sorted(task.items(), key=lambda kv: -kv[1][1])[:10]
    for s, (n, run, _) in top:
        st = stages.get(s, {})
        print(f"| {s}: {st.get('name', '?')[:50]} | {stage_phase.get(s, '?')} | {n} | {run:.1f} "
              f"| {run / total:.0%} | {st.get('wall', 0):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
