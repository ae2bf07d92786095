#!/usr/bin/env bash
# Issue 19's acceptance 3: the schema workload and the queue workload with delayed messages under
# kill,partition,zk-isolate, 5 seeds each without a bug knob (must be valid) and with its knob
# (broker.schema_no_cas, broker.delayed_index_in_memory: must be invalid). One run at a time; then a
# table of verdicts and anomaly counts (bench/round2_table.py).
#   bench/round2_detection.sh [RESULTS_DIR] [schema|queue|all] [SEEDS...]
# (default results/round2, all, seeds 1 2 3 4 5)
set -u
cd "$(dirname "$0")/.."
out=${1:-results/round2}; which=${2:-all}; shift $(( $# > 2 ? 2 : $# ))
seeds=("$@"); [ ${#seeds[@]} -gt 0 ] || seeds=(1 2 3 4 5)
bin=.venv/bin/pulsar-chaos
common=(--nemesis kill,partition,zk-isolate --time-limit 60 --results-dir "$out")
one() {   # test-name, then the run's own flags
  local name=$1; shift
  for s in "${seeds[@]}"; do
    timeout 900 $bin run "$@" "${common[@]}" --seed "$s" --test-name "$name" > /dev/null 2>&1
    echo "$name seed $s exit $?"
  done
}
if [ "$which" = schema ] || [ "$which" = all ]; then
  one schema --workload schema
  one schema-no-cas --workload schema --bug broker.schema_no_cas
fi
if [ "$which" = queue ] || [ "$which" = all ]; then
  one queue-delay --workload queue --option delay_max_ms=3000
  one queue-delay-bug --workload queue --option delay_max_ms=3000 --bug broker.delayed_index_in_memory
fi
.venv/bin/python bench/round2_table.py "$out"
