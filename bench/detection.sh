#!/usr/bin/env bash
# Detection rate of the zk-isolate split brain: the same run with and without
# broker.recovery_fencing=false over several seeds. Prints one line per run and the two rates.
#   bench/detection.sh [SEEDS...]        (default seeds 1 2 3 4 5)
set -u
cd "$(dirname "$0")/.."
seeds=("$@"); [ ${#seeds[@]} -gt 0 ] || seeds=(1 2 3 4 5)
bin=.venv/bin/pulsar-chaos
invalid_bug=0; valid_ok=0
for s in "${seeds[@]}"; do
  $bin run --workload log --nemesis zk-isolate --bug broker.recovery_fencing=false --time-limit 60 \
      --seed "$s" --test-name detect-bug > /dev/null 2>&1; rc=$?
  lost=$(.venv/bin/python -c "import json; print(json.load(open('results/latest/results.json'))['checkers']['log']['stats']['anomaly_counts'].get('lost', 0))" 2>/dev/null)
  echo "seed $s  --bug broker.recovery_fencing=false  exit $rc  lost $lost"
  [ "$rc" = 1 ] && invalid_bug=$((invalid_bug+1))
  $bin run --workload log --nemesis zk-isolate --time-limit 60 --seed "$s" --test-name detect-safe > /dev/null 2>&1; rc=$?
  lost=$(.venv/bin/python -c "import json; print(json.load(open('results/latest/results.json'))['checkers']['log']['stats']['anomaly_counts'].get('lost', 0))" 2>/dev/null)
  echo "seed $s  (no bug)                             exit $rc  lost $lost"
  [ "$rc" = 0 ] && valid_ok=$((valid_ok+1))
done
echo "with the bug: invalid in $invalid_bug of ${#seeds[@]}; without: valid in $valid_ok of ${#seeds[@]}"
