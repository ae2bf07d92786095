#!/usr/bin/env bash
# Detection rate of one bug knob under its own scenario (the `scenario` `pulsar-chaos bugs` prints):
# for each seed, one run with the knob and one without, one at a time. Prints one line per run
# (exit code: 1 invalid, 0 valid; the checkers that found anomalies, with their counts) and the rates.
#   bench/knob_detection.sh KNOB [SEEDS...]        (default seeds 1 2 3 4 5)
set -u
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: bench/knob_detection.sh KNOB [SEEDS...]  (knobs: .venv/bin/pulsar-chaos bugs)" >&2; exit 254; }
knob=$1; shift
seeds=("$@"); [ ${#seeds[@]} -gt 0 ] || seeds=(1 2 3 4 5)
py=.venv/bin/python
scenario=$($py -c "import sys; from clusters import bugs; k = bugs.REGISTRY.get(sys.argv[1]); print(k.scenario if k else '')" "$knob")
[ -n "$scenario" ] || { echo "no bug knob $knob with a scenario; see .venv/bin/pulsar-chaos bugs" >&2; exit 254; }
summary() {
  $py -c "
import json
r = json.load(open('results/latest/results.json'))
bad = {n: {a: len(v) if isinstance(v, list) else v for a, v in (c.get('anomalies') or {}).items()}
       for n, c in r.get('checkers', {}).items() if c.get('valid') is False}
d = r.get('detection') or {}
print(r['run']['dir'], bad or '-', ('first detection %ss' % d['seconds']) if d.get('seconds') is not None else '')
" 2>/dev/null
}
caught=0; clean=0
for s in "${seeds[@]}"; do
  # shellcheck disable=SC2086
  .venv/bin/pulsar-chaos run $scenario --seed "$s" --bug "$knob" > /dev/null 2>&1; rc=$?
  echo "seed $s  --bug $knob  exit $rc  $(summary)"
  [ "$rc" = 1 ] && caught=$((caught+1))
  # shellcheck disable=SC2086
  .venv/bin/pulsar-chaos run $scenario --seed "$s" > /dev/null 2>&1; rc=$?
  echo "seed $s  (no knob)  exit $rc  $(summary)"
  [ "$rc" = 0 ] && clean=$((clean+1))
done
echo "$knob: with it invalid in $caught of ${#seeds[@]}; without it valid in $clean of ${#seeds[@]}"
echo "scenario: $scenario"
