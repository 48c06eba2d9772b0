#!/usr/bin/env bash
# The RL loop: serve the policy with vLLM, roll out, train, serve the new policy.
#
#   bash scripts/run.sh --data-path DIR --log-path DIR --rl-phase rollout|update|both [options] [overrides...]
#
# Reference: docs/cli.md (every flag, the argument table, the files written, the exit codes).
# This script finds the app environment and hands over to the driver, `python -m coordinator.driver`
# (coordinator/driver/), which owns the run: it keeps this script's pid (exec), so `run.sh --stop`
# and the run's owner records name it. Bad input exits 2 before anything starts or is written;
# Ctrl+C / SIGTERM stop every process group the run started and exit 130 / 143.
set -Eeuo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
# shellcheck source=scripts/lib/common.sh
source "$ROOT/scripts/lib/common.sh"
# shellcheck source=scripts/lib/envs.sh
source "$ROOT/scripts/lib/envs.sh"

envs_export
# the repository first, then the user's own folders (an environment in their own package: docs/environments.md)
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" exec "$BATON_APP_PY" -m coordinator.driver "$@"
