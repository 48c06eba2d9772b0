#!/usr/bin/env bash
# The RL loop: serve the policy with vLLM, roll out, train, serve the new policy.
#
#   bash scripts/run.sh --data-path DIR --log-path DIR --rl-phase rollout|update|both [options] [overrides...]
#
# Reference: docs/cli.md (every flag, the argument table, the files written).
# Bad input exits 2 before anything starts or is written; Ctrl+C / SIGTERM stop
# every process group this run started and exit 130 / 143.
set -Eeuo pipefail
[[ -n ${BATON_TRACE:-} ]] && set -x

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
# shellcheck source=scripts/lib/common.sh
source "$ROOT/scripts/lib/common.sh"
# shellcheck source=scripts/lib/envs.sh
source "$ROOT/scripts/lib/envs.sh"
# shellcheck source=scripts/lib/procs.sh
source "$ROOT/scripts/lib/procs.sh"
# shellcheck source=scripts/lib/vllm.sh
source "$ROOT/scripts/lib/vllm.sh"
# shellcheck source=scripts/lib/slurm.sh
source "$ROOT/scripts/lib/slurm.sh"
# shellcheck source=scripts/lib/cli.sh
source "$ROOT/scripts/lib/cli.sh"
# shellcheck source=scripts/lib/iteration.sh
source "$ROOT/scripts/lib/iteration.sh"
# shellcheck source=scripts/lib/loop.sh
source "$ROOT/scripts/lib/loop.sh"
# shellcheck source=scripts/lib/nodes.sh
source "$ROOT/scripts/lib/nodes.sh"

# run_print_cmd <label>: print LOOP_CMD as one shell-quoted line.
run_print_cmd() {
  printf '[%s]' "$1"
  printf ' %q' "${LOOP_CMD[@]}"
  printf '\n'
}

# cmd_dry_run: print the commands the next iteration's phases would run.
cmd_dry_run() {
  local n
  local -a args
  n=$(iteration_next "$RUN_LOG")
  printf '# iteration %s, --rl-phase %s (dry run: nothing started or written)\n' "$n" "$RUN_PHASE"
  [[ -z $(slurm_describe) ]] || printf '# %s\n' "$(slurm_describe)"
  if nodes_multi; then
    printf '# rank %s of %s; the master (rank 0) numbers the iterations and chooses the torchrun port\n' "$RUN_RANK" "$RUN_NUM_NODES"
    NODES_MASTER_ADDR="<master address>" NODES_TORCHRUN_PORT="<torchrun port>"
  fi
  if [[ $RUN_PHASE != rollout ]]; then
    loop_update_cmd "$n" check && run_print_cmd "update-check (once per run, before the first rollout or update)"
  fi
  if [[ $RUN_PHASE != update ]] && ((!RUN_DEBUG)); then
    vllm_choose "" "$(loop_policy_path)" || exit
    mapfile -t args < <(vllm_args "$(loop_policy_path)" "$LOOP_PORT" "$LOOP_MODEL")
    LOOP_CMD=(env VLLM_SERVER_DEV_MODE=1 "VLLM_CPU_KVCACHE_SPACE=$VLLM_KV_GIB" "$BATON_SERVE_PY" "${args[@]}")
    run_print_cmd serve
  fi
  if [[ $RUN_PHASE == both || $RUN_SPLIT == train-only ]]; then
    loop_rollout_cmd train "$n" "$RUN_RESUME" && run_print_cmd "train rollout"
  fi
  if [[ $RUN_SPLIT == eval-only ]] || { [[ $RUN_PHASE == both ]] && iteration_eval_due "$n" "$RUN_EVAL_INTERVAL"; }; then
    loop_rollout_cmd test "$n" "$RUN_RESUME" && run_print_cmd "eval rollout"
  fi
  if ((RUN_KEEP_BEST)) && nodes_is_master; then
    LOOP_CMD=(env PYTHONPATH="$LOOP_ROOT" "$BATON_APP_PY" -m coordinator keep-best --log-path "$RUN_LOG"
      --iteration "$n" --margin "$RUN_KEEP_BEST_MARGIN" --base-model "$LOOP_BASE_MODEL")
    run_print_cmd "keep-best (after each held-out rollout; a worse policy: python -m training ... phase=revert)"
  fi
  if ((RUN_FINAL_EVAL)); then
    loop_rollout_cmd test "<last+1>" 0 && run_print_cmd "final eval rollout (after the last iteration)"
  fi
  if [[ $RUN_PHASE != rollout ]] && nodes_multi; then
    loop_update_cmd "$n" train && run_print_cmd "update (this node's part of one torchrun; the master runs phase=prepare before and phase=promote after)"
  elif [[ $RUN_PHASE != rollout ]]; then
    loop_update_cmd "$n" all && run_print_cmd update
  fi
  if [[ -n $RUN_DASHBOARD_PORT ]]; then
    loop_dashboard_cmd && run_print_cmd "dashboard (for the whole run)"
  fi
  if [[ $RUN_PHASE == both ]] && ((!RUN_DEBUG)); then
    printf '[serve new policy] POST http://127.0.0.1:%s/collective_rpc {"method":"reload_weights","kwargs":{"weights_path":"%s"}}; POST /reset_prefix_cache (restart if the outputs do not change)\n' \
      "$LOOP_PORT" "$RUN_LOG/policy/v<NNNN>"
  fi
}

# cmd_run: create the log path, install the traps, run the phase's loop.
cmd_run() {
  local resolved
  resolved=$(mktemp)
  # shellcheck disable=SC2064 # expand now: the temp file of this call
  trap "rm -f '$resolved'" EXIT
  loop_compose "$resolved"
  if ((!RUN_DEBUG)) && [[ ! -f $(loop_policy_path)/config.json ]]; then
    cli_bad "no model to serve at $(loop_policy_path) (config.json missing); run: bash scripts/prepare.sh --data-path $RUN_DATA"
  fi
  loop_claim
  trap loop_cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  trap loop_evicted USR1
  mkdir -p "$LOOP_RUN_DIR/logs"
  common_atomic_copy "$resolved" "$LOOP_RUN_DIR/resolved.yaml" || common_die 1 "cannot write $LOOP_RUN_DIR/resolved.yaml (error above)"
  rm -f "$resolved"
  common_log "run: --rl-phase $RUN_PHASE, log path $RUN_LOG, policy ${LOOP_BASE_URL} (${LOOP_MODEL})"
  loop_dashboard_start
  [[ -z $(slurm_describe) ]] || common_log "$(slurm_describe)"
  nodes_start
  loop_steps
  common_log "run finished: $RUN_LOG/metrics.jsonl, $RUN_LOG/plots/success.png"
}

# cmd_stop: stop the run on --log-path: a running multi-node run through its stop
# request (each node's heartbeat sees it within an interval and stops its node:
# exit 0), else a single node by SIGTERM to the run.sh that owns it on this host.
cmd_stop() {
  local file host pid start group rc stopped=0
  [[ $RUN_LOG == /* && -d $RUN_LOG ]] || cli_bad "--stop needs the --log-path of a run (an existing absolute path; got '$RUN_LOG'); give the --log-path the run was started with"
  for group in "" rollout update; do # --rl-phase both, then a split deployment's runs
    [[ -f $RUN_LOG/${group:+roles/$group/}cluster/run.json ]] || continue
    rc=0 # 4: an earlier run's record (it finished, stopped, or its master is gone): a single-node run may be live
    loop_py "$BATON_APP_PY" -m coordinator stop --if-running --log-path "$RUN_LOG" ${group:+--group "$group"} \
      --reason "run.sh --stop by $(id -un)@$(hostname)" || rc=$?
    case $rc in 0) stopped=1 ;; 4) ;; *) common_die 1 "could not ask the run on $RUN_LOG to stop" ;; esac
  done
  if ((stopped)); then
    common_log "every node of the run stops within a heartbeat interval; resume later with --resume"
    return 0
  fi
  for file in "$RUN_LOG"/run/rank_*/owner.*; do
    { [[ -f $file ]] && read -r host pid start <"$file"; } || continue
    [[ $host == "$(hostname)" && $(procs_start_time "$pid") == "$start" ]] || continue
    kill -TERM "$pid" 2>/dev/null && stopped=1 && common_log "sent SIGTERM to run.sh (pid $pid, ${file##*/owner.})"
  done
  ((stopped)) || common_die 1 "nothing to stop: no run.sh of --log-path $RUN_LOG runs on this host"
}

main() {
  cli_parse "$@"
  if ((RUN_HELP)); then
    cli_usage
    return 0
  fi
  if ((RUN_STOP)); then
    envs_export
    LOOP_ROOT=$ROOT
    cmd_stop
    return 0
  fi
  cli_validate
  envs_export
  nodes_apply_file
  slurm_default_addr
  loop_setup
  if ((RUN_DRY)); then
    loop_compose
    cmd_dry_run
    return 0
  fi
  cmd_run
}

# One line: bash parses it whole, so an edit of this file while it runs (git pull) cannot run stray bytes.
main "$@"; exit
