#!/usr/bin/env bash
# The long kill -9 soak (issue 14, "Proof"): tests/kill_soak.rs with KILLS SIGKILLs (default 1,000)
# at random moments under steady submission of local mail and questions to a model. It fails unless
# every message that got a 250 is delivered exactly once and every acknowledged question has exactly
# one reply. Prints the seed (repeat a run with NIGHTMAIL_SOAK_SEED), the submitted and acknowledged
# counts, and the wall time; the whole output stays in target/kill_soak.log.
#
#   benches/kill_soak.sh [KILLS]      (builds the test in the dev profile, like CI)
set -euo pipefail
KILLS=${1:-1000}
cd "$(dirname "$0")/.."
cargo test --test kill_soak --no-run
start=$(date +%s)
status=0
NIGHTMAIL_SOAK_KILLS=$KILLS cargo test --test kill_soak -- --nocapture >target/kill_soak.log 2>&1 || status=$?
grep -E '^kill soak|^test result|panicked' target/kill_soak.log || tail -40 target/kill_soak.log
echo "kill soak: $KILLS kills in $(( $(date +%s) - start )) s, exit status $status"
exit $status
