#!/usr/bin/env bash
# BookKeeper's own bugs as knobs (issue 25): each knob's scenario (its `scenario` in clusters/bugs.py, as
# `pulsar-chaos bugs` prints it) for seeds 1-5 without the knob (must be valid) and with it (must be
# invalid), one run at a time; then the table of verdicts and anomaly counts (bench/round2_table.py).
#   bench/bk_detection.sh [RESULTS_DIR] [KNOB...]
# (default results/bk-detection and the six knobs below; SEEDS="1 2 3" to change the seeds;
# WITHOUT=0 to run only with the knob)
set -u
cd "$(dirname "$0")/.."
out=${1:-results/bk-detection}; shift $(( $# > 0 ? 1 : 0 ))
knobs=("$@")
[ ${#knobs[@]} -gt 0 ] || knobs=(bk.recovery_reads_no_fence bk.recovery_min_lac_minus_one
                                 bk.ack_broken_entry_on_ensemble_change bookie.no_limbo
                                 bk.delayed_ensemble_change_local_only bk.corrupt_log_says_nosuchentry)
read -r -a seeds <<< "${SEEDS:-1 2 3 4 5}"
bin=.venv/bin/pulsar-chaos
for k in "${knobs[@]}"; do
  scenario=$(.venv/bin/python -c "import sys; from clusters.bugs import REGISTRY; print(REGISTRY[sys.argv[1]].scenario)" "$k") || exit 2
  read -r -a args <<< "$scenario"
  for s in "${seeds[@]}"; do
    if [ "${WITHOUT:-1}" != 0 ]; then
      timeout 900 $bin run "${args[@]}" --results-dir "$out" --seed "$s" --test-name "$k-off" > /dev/null 2>&1
      echo "$k-off seed $s exit $?"
    fi
    timeout 900 $bin run "${args[@]}" --bug "$k" --results-dir "$out" --seed "$s" --test-name "$k" > /dev/null 2>&1
    echo "$k seed $s exit $?"
  done
done
.venv/bin/python bench/round2_table.py "$out"
