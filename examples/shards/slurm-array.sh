#!/bin/bash
# One job file embedded as 4 shards by a Slurm job array: one task per shard.
# `--shard auto` takes the index and the count from the array
# (SLURM_ARRAY_TASK_ID, SLURM_ARRAY_TASK_MIN and SLURM_ARRAY_TASK_COUNT), so
# --array=1-4 works as well as 0-3.
#
#   sbatch slurm-array.sh                  all 4 shards
#   sbatch --array=2 slurm-array.sh        shard 2 again: it resumes from its checkpoint
#   embedjob inspect out/docs              the 4 files, checked as one dataset
#
# A task stopped by its time limit (or by --max-duration, a little before it)
# exits 4 with what it paid for kept; submitting it again carries on.
#SBATCH --job-name=embed-docs
#SBATCH --array=0-3
#SBATCH --cpus-per-task=2
#SBATCH --time=02:00:00
#SBATCH --output=embed-docs-%A_%a.log
set -euo pipefail

exec embedjob run "${JOB_FILE:-$HOME/jobs/docs.toml}" --shard auto --max-duration 1h55m --quiet
