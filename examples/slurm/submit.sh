#!/bin/bash
# Runs a stepsim sweep on a Slurm cluster: N array tasks, one shard each, then a merge job
# that starts once all of them succeeded.
#
#   examples/slurm/submit.sh SWEEP.toml OUT_DIR N
#
# e.g. examples/slurm/submit.sh scenarios/sweeps/100b-capacity.toml /shared/$USER/100b 16
# When it is done, OUT_DIR holds sweep.csv, sweep.json and heatmap.png, and the merge job's
# log (stepsim-sweep-merge-<id>.log) the answer stepsim prints. SWEEP and OUT_DIR must be
# on a file system every node sees; STEPSIM names the binary if it is not `stepsim` on PATH.
# Extra sbatch options (partition, account) go in SBATCH_ARGS, e.g. SBATCH_ARGS="-p cpu".
set -euo pipefail

if [ $# -ne 3 ]; then
    echo "usage: $0 SWEEP.toml OUT_DIR N" >&2
    exit 2
fi
SWEEP="$(realpath "$1")"
OUT="$(realpath -m "$2")"
SHARDS="$3"
case "$SHARDS" in
    '' | *[!0-9]* | 0) echo "error: N must be a whole number of array tasks, at least 1, got '$SHARDS'" >&2; exit 2 ;;
esac
HERE="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$OUT"
export SWEEP OUT SHARDS
EXPORT="ALL,SWEEP=$SWEEP,OUT=$OUT,SHARDS=$SHARDS"
if [ -n "${STEPSIM:-}" ]; then
    EXPORT="$EXPORT,STEPSIM=$STEPSIM"
fi
# shellcheck disable=SC2086 # SBATCH_ARGS is a list of options
array=$(sbatch --parsable ${SBATCH_ARGS:-} --array="1-$SHARDS" --export="$EXPORT" \
    --chdir="$OUT" "$HERE/sweep-array.sbatch")
array="${array%%;*}"
# shellcheck disable=SC2086
merge=$(sbatch --parsable ${SBATCH_ARGS:-} --dependency="afterok:$array" --export="$EXPORT" \
    --chdir="$OUT" "$HERE/sweep-merge.sbatch")
echo "queued array job $array ($SHARDS shards) and merge job ${merge%%;*}; results in $OUT"
