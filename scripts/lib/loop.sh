#!/usr/bin/env bash
# The single-node RL loop behind run.sh: the commands of each phase, running a
# phase as a tracked process group, serving the promoted policy, and the
# rollout / update / both loops. Globals come from cli.sh (RUN_*) and
# loop_setup (LOOP_*).
# Library file: defines functions only. Needs common.sh, envs.sh, procs.sh,
# vllm.sh, iteration.sh, nodes.sh.

# loop_setup: derive the run's paths, port, served name and rank weights (LOOP_* globals).
loop_setup() {
  LOOP_ROOT=$(common_repo_root)
  # Hydra list of the ranks' load weights: [1] on a single node without --rank-weights.
  LOOP_RANK_WEIGHTS="[${RUN_RANK_WEIGHTS:-1}]"
  # Per rank: nodes sharing the log path (even on one host) never stop or read each other's processes.
  LOOP_RUN_DIR="$RUN_LOG/run/rank_$RUN_RANK"
  LOOP_BASE_MODEL=${BATON_BASE_MODEL:-$RUN_DATA/models/SmolLM2-135M-Instruct}
  LOOP_PORT=${BATON_VLLM_PORT:-8999}
  LOOP_FAILURES=0
  # The rollout's exit code when the policy server stopped answering (rollout_engine/runner.py), and how
  # many times one rollout restarts vLLM for it.
  LOOP_POLICY_DOWN=75 LOOP_POLICY_RESTARTS=${BATON_POLICY_RESTARTS:-3}
  # Deadlines (docs/reliability.md): a rollout with no episode finished for LOOP_STALL_S seconds is stuck, one
  # still running after LOOP_ROLLOUT_S (0: none) too long; both are stopped, and resumed like a rollout whose
  # server died. The update-check gets LOOP_CHECK_S seconds. (cli_validate_env checked them.)
  LOOP_STALL_S=${BATON_ROLLOUT_STALL_S:-900} LOOP_ROLLOUT_S=${BATON_ROLLOUT_TIMEOUT_S:-0}
  LOOP_CHECK_S=${BATON_CHECK_TIMEOUT_S:-900} LOOP_EXPIRED=""
  # The last barrier's data (nodes_sync), e.g. "gone": the ranks it went on without (continue runs).
  declare -gA LOOP_SYNC=()
  LOOP_UPDATE_RUNNING=""
  LOOP_SLEEP_PID=""
  LOOP_WAIT_PID=""
  # What this node is doing (for the failure flag a multi-node run leaves on its way out).
  LOOP_N=0 LOOP_PHASE=start LOOP_DONE=0 LOOP_FINAL_DONE=0
  # A worker serves the version the master's plan names (LOOP_PINNED=1); "" is the base model.
  LOOP_PINNED=0 LOOP_PIN_VERSION=""
  case "$RUN_PHASE" in
    both) LOOP_ROLES=(rollout update) LOOP_GROUPS=(update update-check revert rollout-train rollout-test vllm) ;;
    rollout) LOOP_ROLES=(rollout) LOOP_GROUPS=(rollout-train rollout-test vllm) ;;
    update) LOOP_ROLES=(update) LOOP_GROUPS=(update update-check) ;;
  esac
  # The live view (loop_watch_start) is a group of each role: a rollout run and an update run on one log
  # path share this rank's run directory, so each names its own.
  case "$RUN_PHASE" in
    update) LOOP_WATCH=watch-update ;;
    *) LOOP_WATCH=watch ;;
  esac
  LOOP_GROUPS+=("$LOOP_WATCH")
  # The web page (--dashboard-port), named per role like the live view.
  LOOP_DASHBOARD=""
  if [[ -n ${RUN_DASHBOARD_PORT:-} ]]; then
    LOOP_DASHBOARD=${LOOP_WATCH/watch/dashboard}
    LOOP_GROUPS+=("$LOOP_DASHBOARD")
  fi
  LOOP_CLAIMED=()
  # vLLM's start-up polls for minutes: the heartbeat is watched there too (nodes_beat_check).
  # shellcheck disable=SC2034 # read by vllm_wait (vllm.sh)
  VLLM_ON_POLL=nodes_beat_check
}

# loop_claim: own this run's roles (rollout and/or update) in this rank's run
# directory; exit 2 while another live run.sh owns one, 1 when the claim's lock
# stays busy. A rollout run and an update run may share a log path; two of the
# same role may not.
loop_claim() {
  local role owner name rc
  for role in "${LOOP_ROLES[@]}"; do
    rc=0
    owner=$(procs_claim "$LOOP_RUN_DIR" "$role") || rc=$?
    if ((rc == 2)); then
      loop_release
      common_die 1 "could not claim the $role phase of rank $RUN_RANK on --log-path $RUN_LOG (lock busy); retry when it is free"
    elif ((rc != 0)); then
      loop_release
      cli_bad "another run.sh (pid $owner) is running the $role phase of rank $RUN_RANK on --log-path $RUN_LOG;" \
        "stop it (kill $owner: it cleans up) or use another --log-path"
    fi
    LOOP_CLAIMED+=("$role")
  done
  # A run of these roles that died (SIGKILL, power loss) may have left its rollout or update running: stop
  # them before they race the new run's on the same journal. A healthy vLLM of the run is reused instead.
  for name in "${LOOP_GROUPS[@]}"; do
    [[ $name == vllm ]] || procs_stop_stale "$LOOP_RUN_DIR" "$name"
  done
}

# loop_release: give up the roles this run owns.
loop_release() {
  local role
  for role in "${LOOP_CLAIMED[@]}"; do procs_release "$LOOP_RUN_DIR" "$role"; done
  LOOP_CLAIMED=()
}

# loop_py <python> <args...>: run a Baton module with the repository on PYTHONPATH.
loop_py() {
  local py=$1
  shift
  # LOOP_PY_EXEC: a background job of this function (`(LOOP_PY_EXEC=1 loop_py ...) &`) is python
  # itself, not a subshell with python under it, so that killing $! stops python.
  [[ -z ${LOOP_PY_EXEC:-} ]] || PYTHONPATH="$LOOP_ROOT" exec "$py" "$@"
  PYTHONPATH="$LOOP_ROOT" "$py" "$@"
}

# loop_compose [save_file]: validate the overrides by composing every config
# once, with this rank's keys; set LOOP_ROLLOUT_OVR, LOOP_UPDATE_OVR, LOOP_BASE_URL,
# LOOP_MODEL, VLLM_MAX_SESSIONS (this node's max_vllm_sessions, which vLLM's KV cache must hold) and
# LOOP_TRACKERS (the chosen experiment trackers, e.g. "tensorboard,wandb"; "" for none).
loop_compose() {
  local save=${1:-} target value rest
  local -a args=(--data-path "$RUN_DATA" --log-path "$RUN_LOG" --base-model "$LOOP_BASE_MODEL"
    --rank "$RUN_RANK" --rank-weights "$LOOP_RANK_WEIGHTS" --num-nodes "$RUN_NUM_NODES")
  ((RUN_DEBUG)) && args+=(--debug-mode)
  [[ -n $save ]] && args+=(--save "$save")
  local out
  out=$(loop_py "$BATON_APP_PY" -m coordinator compose "${args[@]}" -- "${RUN_OVERRIDES[@]}") || exit 2
  LOOP_ROLLOUT_OVR=() LOOP_UPDATE_OVR=() LOOP_TRACKERS=""
  # shellcheck disable=SC2034 # VLLM_MAX_SESSIONS is read by vllm_choose (vllm.sh)
  while IFS=$'\t' read -r target value rest; do
    case "$target" in
      rollout) LOOP_ROLLOUT_OVR+=("$value") ;;
      update) LOOP_UPDATE_OVR+=("$value") ;;
      policy) LOOP_BASE_URL=$value LOOP_MODEL=$rest ;;
      sessions) VLLM_MAX_SESSIONS=$value ;;
      tracker) LOOP_TRACKERS=$value ;;
    esac
  done <<<"$out"
  ((RUN_DEBUG)) || LOOP_BASE_URL="http://127.0.0.1:$LOOP_PORT/v1"
}

# loop_policy_version: print the version to serve and fine-tune: the pinned
# one (a worker's: the master named it; a rollout run's for its step), else the
# one policy/current points at ("" for none: the base model).
loop_policy_version() {
  local link="$RUN_LOG/policy/current" target
  if ((LOOP_PINNED)); then
    [[ -z $LOOP_PIN_VERSION ]] || printf '%s\n' "$LOOP_PIN_VERSION"
    return 0
  fi
  [[ -L $link ]] || return 0
  target=$(readlink "$link")
  [[ $target =~ ^v0*([0-9]+)$ ]] && printf '%s\n' "${BASH_REMATCH[1]}"
  return 0
}

# loop_policy_path: print the model to serve and fine-tune: that version's folder, else the base model.
loop_policy_path() {
  local version
  version=$(loop_policy_version)
  if [[ -z $version ]]; then
    printf '%s\n' "$LOOP_BASE_MODEL"
  elif ((LOOP_PINNED)); then
    printf '%s/policy/v%04d\n' "$RUN_LOG" "$version"
  else
    readlink -f "$RUN_LOG/policy/current"
  fi
}

# loop_rollout_cmd <split> <iteration> <resume>: set LOOP_CMD to the rollout command.
loop_rollout_cmd() {
  local split=$1 n=$2 resume=$3 version
  LOOP_CMD=(env PYTHONPATH="$LOOP_ROOT" "$BATON_APP_PY" -m rollout_engine --config-name "rollout_$split"
    "data_path=$RUN_DATA" "log_path=$RUN_LOG" "iteration=$n" "rank=$RUN_RANK" "rank_weights=$LOOP_RANK_WEIGHTS"
    "policy_config.base_url=$LOOP_BASE_URL")
  ((RUN_DEBUG)) || LOOP_CMD+=("policy_config.model=$LOOP_MODEL")
  version=$(loop_policy_version)
  if ((!RUN_DEBUG)) && [[ -n $version ]]; then LOOP_CMD+=("policy_version=$version"); fi
  ((resume)) && LOOP_CMD+=(resume=true)
  LOOP_CMD+=("${LOOP_ROLLOUT_OVR[@]}")
}

# loop_free_port: print a free TCP port on the loopback interface.
loop_free_port() {
  loop_py "$BATON_APP_PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# loop_update_cmd <iteration> <phase> [override...]: set LOOP_CMD to the update command.
# A single node takes a free torchrun port (29500 may be another job's); on
# several, every node uses the master's address and the port it chose at the
# start of the run. An override of launch.master_port, which comes later, still wins.
loop_update_cmd() {
  local -a launch=("launch.nnodes=${LOOP_TRAIN_NODES:-$RUN_NUM_NODES}" "launch.node_rank=${LOOP_TRAIN_RANK:-$RUN_RANK}")
  if nodes_multi; then
    launch+=("launch.master_addr=$NODES_MASTER_ADDR" "launch.master_port=$NODES_TORCHRUN_PORT")
    [[ -z $RUN_NODE_ADDR ]] || launch+=("launch.node_addr=$RUN_NODE_ADDR")
  else
    launch+=("launch.master_port=$(loop_free_port)")
  fi
  LOOP_CMD=(env PYTHONPATH="$LOOP_ROOT" "$BATON_TRAIN_PY" -m training --config-name update
    "log_path=$RUN_LOG" "iteration=$1" "model_path=$(loop_policy_path)" "phase=$2" "${launch[@]}" "${@:3}" "${LOOP_UPDATE_OVR[@]}")
}

# loop_check_start: a run that trains: start `python -m training phase=check` (group update-check) beside vLLM's
# start-up; on several nodes the master checks (every node trains on its config and data). A check that
# passed on this rank with the same key (loop_check_key; a --resume, say) is not run again.
loop_check_start() {
  [[ $RUN_PHASE != rollout ]] && nodes_is_master || return 0
  LOOP_CHECK_LOG="$LOOP_RUN_DIR/logs/update-check.log" LOOP_CHECK_SINCE=$SECONDS
  loop_update_cmd "$(iteration_next "$RUN_LOG")" check
  LOOP_CHECK_KEY=$(loop_check_key)
  if [[ -f $LOOP_RUN_DIR/update-check.ok && $(<"$LOOP_RUN_DIR/update-check.ok") == "$LOOP_CHECK_KEY" ]]; then
    common_log "update-check: passed before with this command, environment and code; not run again"
    return 0
  fi
  : >"$LOOP_CHECK_LOG"
  common_log "update-check: started (log: $LOOP_CHECK_LOG)"
  procs_start "$LOOP_RUN_DIR" update-check "$LOOP_CHECK_LOG" "${LOOP_CMD[@]}" >/dev/null
}

# loop_check_wait: wait for the check; a rejection stops the run with exit 2 and its message, a failure with 1.
loop_check_wait() {
  local pgid rc=0 left
  [[ $RUN_PHASE != rollout ]] || return 0
  pgid=$(procs_pgid "$LOOP_RUN_DIR" update-check) || return 0
  # the deadline counts from the check's start (it ran beside vLLM's start-up)
  left=$((LOOP_CHECK_S - (SECONDS - LOOP_CHECK_SINCE)))
  ((left > 0)) || left=1
  loop_wait_for "$pgid" "$left" 0 || rc=$?
  if ((rc == 124)); then
    procs_stop "$LOOP_RUN_DIR" update-check 10
    common_die 1 "the check of the update configuration did not finish within ${LOOP_CHECK_S}s" \
      "(BATON_CHECK_TIMEOUT_S); stopped it. Its log: $LOOP_CHECK_LOG"
  fi
  rm -f "$LOOP_RUN_DIR/pids/update-check.pgid"
  if ((rc == 2)); then
    common_die 2 "the update would reject this configuration (checked in the train environment before any" \
      "rollout; log: $LOOP_CHECK_LOG):"$'\n'"$(loop_check_problems)"
  elif ((rc != 0)); then
    tail -n 15 "$LOOP_CHECK_LOG" >&2
    common_die 1 "the check of the update configuration failed (exit $rc; last lines of $LOOP_CHECK_LOG above)"
  fi
  printf '%s\n' "$LOOP_CHECK_KEY" >"$LOOP_RUN_DIR/update-check.ok.tmp"
  mv -f "$LOOP_RUN_DIR/update-check.ok.tmp" "$LOOP_RUN_DIR/update-check.ok"
  common_log "update-check: the update configuration is accepted ($((SECONDS - LOOP_CHECK_SINCE))s)"
}

# loop_check_key: print a hash of what decides the check's verdict: its command (the overrides, the
# model, the train environment's path, which names its pins; not the iteration, whose output path the
# check never writes, nor the free torchrun port it was given), the device, and the training code and configs.
loop_check_key() {
  {
    printf '%s\n' "${LOOP_CMD[@]}" | grep -Ev '^(launch.master_port|iteration)=' || true
    envs_device
    find "$LOOP_ROOT/training" "$LOOP_ROOT/configs" -type f \( -name '*.py' -o -name '*.yaml' \) -print0 |
      sort -z | xargs -0 cat
  } | sha256sum | cut -d ' ' -f 1
}

# loop_check_problems: print the check's report (its log after "bad config:" / "bad input:", else the last 15 lines).
loop_check_problems() {
  awk '/^bad (config|input):$/ { start = NR } { line[NR] = $0 }
    END { for (i = start ? start + 1 : (NR > 15 ? NR - 14 : 1); i <= NR; i++) print line[i] }' "$LOOP_CHECK_LOG"
}

# loop_run <name> <logfile> <cmd...>: run <cmd> as a tracked process group and
# wait for it; return its exit code. A signal to run.sh interrupts the wait. A
# rollout past its deadline (loop_wait_for: no episode finished for LOOP_STALL_S
# seconds, or LOOP_ROLLOUT_S in all) is stopped and returns 124.
loop_run() {
  local name=$1 logfile=$2 pgid rc=0 start=$SECONDS
  shift 2
  common_log "$name: started (log: $logfile)"
  procs_start "$LOOP_RUN_DIR" "$name" "$logfile" "$@" >/dev/null
  pgid=$(procs_pgid "$LOOP_RUN_DIR" "$name")
  case "$name" in rollout-train | rollout-test | update) loop_watch_start "$name" ;; esac
  case "$name" in
    rollout-*) loop_wait_for "$pgid" "$LOOP_ROLLOUT_S" "$LOOP_STALL_S" loop_rollout_progress "${name#rollout-}" || rc=$? ;;
    *) loop_wait "$pgid" || rc=$? ;;
  esac
  if ((rc == 124)); then
    common_warn "$name: $LOOP_EXPIRED; stopping it"
    procs_stop "$LOOP_RUN_DIR" "$name" 10
  fi
  rm -f "$LOOP_RUN_DIR/pids/$name.pgid"
  loop_watch_stop # before this shell prints again: a terminal's live block is cleared first
  if ((rc == 124)); then
    common_warn "$name: stopped after $((SECONDS - start))s (log: $logfile)"
  elif ((rc != 0)); then
    common_warn "$name failed (exit $rc) after $((SECONDS - start))s; last lines of $logfile:"
    tail -n 15 "$logfile" >&2
  else
    common_log "$name: done in $((SECONDS - start))s"
  fi
  return "$rc"
}

# loop_watch_start <phase>: show a rollout's or an update's progress (every rank's, read from the log
# path) on run.sh's stderr while it runs (and while a node waits for the others after its rollout):
# `python -m coordinator watch` as the tracked group LOOP_WATCH. When stderr is not a terminal, lines come
# every BATON_PROGRESS_S seconds (30) and once at the end; BATON_PROGRESS_S=0 turns the view off.
loop_watch_start() {
  [[ ${BATON_PROGRESS_S:-30} != 0 ]] || return 0
  procs_start "$LOOP_RUN_DIR" "$LOOP_WATCH" - env PYTHONPATH="$LOOP_ROOT" "$BATON_APP_PY" -m coordinator watch \
    --log-path "$RUN_LOG" --phase "$1" --iteration "$LOOP_N" --every "${BATON_PROGRESS_S:-30}" >/dev/null
}

# loop_dashboard_cmd: set LOOP_CMD to the web page's server (read-only on the log path; 127.0.0.1 only).
loop_dashboard_cmd() {
  LOOP_CMD=(env PYTHONPATH="$LOOP_ROOT" "$BATON_APP_PY" -m coordinator dashboard --log-path "$RUN_LOG"
    --port "$RUN_DASHBOARD_PORT" --host 127.0.0.1)
}

# loop_dashboard_start: with --dashboard-port, serve the web page as the tracked group LOOP_DASHBOARD for the
# whole run (loop_cleanup stops it); a port it cannot bind is a warning in its log, never the run's end.
loop_dashboard_start() {
  [[ -n $LOOP_DASHBOARD ]] || return 0
  local logfile="$LOOP_RUN_DIR/logs/$LOOP_DASHBOARD.log"
  loop_dashboard_cmd
  procs_start "$LOOP_RUN_DIR" "$LOOP_DASHBOARD" "$logfile" "${LOOP_CMD[@]}" >/dev/null
  common_log "dashboard: http://127.0.0.1:$RUN_DASHBOARD_PORT/ (log: $logfile; from another host: ssh -L $RUN_DASHBOARD_PORT:127.0.0.1:$RUN_DASHBOARD_PORT $(hostname))"
}

# loop_watch_stop: stop the phase's live view (it clears its lines on a terminal).
loop_watch_stop() {
  procs_stop "$LOOP_RUN_DIR" "$LOOP_WATCH" 5
}

# loop_ensure_vllm: serve the current policy. A recorded server that still
# answers on this port with the served name is reused, and given the current
# policy's weights unless it recorded holding them (it may hold older ones: a
# run that died after a promotion, or during a reload).
loop_ensure_vllm() {
  ((RUN_DEBUG)) && return 0
  if vllm_reuse "$LOOP_RUN_DIR" "$LOOP_PORT" "$LOOP_MODEL"; then
    if [[ $(vllm_recorded_weights "$LOOP_RUN_DIR") == "$(loop_policy_path)" ]]; then
      LOOP_SERVED_VERSION=$(loop_policy_version)
      common_log "it holds the current policy's weights ($(loop_policy_path)) already"
    else
      LOOP_SERVED_VERSION=unknown
    fi
    loop_serve_current
    return 0
  fi
  vllm_start "$LOOP_RUN_DIR" "$(loop_policy_path)" "$LOOP_PORT" "$LOOP_MODEL"
  LOOP_SERVED_VERSION=$(loop_policy_version)
}

# loop_serve_current: after a promotion, make vLLM serve policy/current; sets
# LOOP_SERVE_HOW (reload, restart, unchanged, or "" when nothing was to do).
loop_serve_current() {
  local version
  LOOP_SERVE_HOW=""
  version=$(loop_policy_version)
  [[ $version != "${LOOP_SERVED_VERSION:-}" ]] || return 0
  if ((RUN_DEBUG)); then
    common_warn "debug mode: the external server keeps its weights; policy v$version is at $RUN_LOG/policy/current"
    LOOP_SERVED_VERSION=$version LOOP_SERVE_HOW="external server not reloaded"
    return 0
  fi
  vllm_serve_new "$LOOP_RUN_DIR" "$LOOP_PORT" "$LOOP_MODEL" "$(loop_policy_path)"
  LOOP_SERVED_VERSION=$version LOOP_SERVE_HOW="v$version by $VLLM_SERVED_HOW"
}

# loop_timed <n> <phase> <fn...>: run <fn...>, recording its seconds for iteration <n> (the master records).
loop_timed() {
  local n=$1 phase=$2 start=$SECONDS rc=0
  shift 2
  LOOP_PHASE=$phase
  "$@" || rc=$?
  if nodes_is_master; then
    nodes_fence "recording the time of $phase of iteration $n"
    iteration_add_time "$RUN_LOG" "$n" "$phase" $((SECONDS - start))
  fi
  return "$rc"
}

# loop_mark <log> <n> <phase> [content]: iteration_mark on the master (and a single node) only, while its run
# is the log path's (nodes_fence).
loop_mark() {
  nodes_is_master || return 0
  nodes_fence "marking $3 of iteration $2"
  iteration_mark "$@"
}

# loop_rollout <split> <iteration>: one rollout phase (skipped when done; resumed
# with --resume). On several nodes each rolls out its share, then waits for
# the others; the master merges their journals' metrics.
loop_rollout() {
  local split=$1 n=$2 phase="${1}_rollout" resume=0 start=$SECONDS
  iteration_is_done "$RUN_LOG" "$n" "$phase" && return 0
  LOOP_TAKEOVER_PLAN=""
  ((LOOP_RESUME)) && [[ -s $RUN_LOG/trajectories/$split/$(printf 'iter_%04d' "$n")/rank_$RUN_RANK.jsonl ]] && resume=1
  loop_rollout_cmd "$split" "$n" "$resume"
  loop_timed "$n" "$phase" loop_rollout_run "$split" "$n" ||
    common_die 1 "the $split rollout of iteration $n failed; fix the cause, then rerun with --resume"
  if nodes_multi; then
    ! nodes_continue || loop_timed "$n" "${split}_takeover" loop_takeover "$split" "$n"
    nodes_is_master || return 0
    loop_py "$BATON_APP_PY" -m coordinator aggregate --log-path "$RUN_LOG" --split "$split" --iteration "$n" \
      --num-nodes "$RUN_NUM_NODES" --wall-s $((SECONDS - start)) --takeover-plan "${LOOP_TAKEOVER_PLAN:-}" \
      --ranks "$(loop_survivors "")" >/dev/null ||
      common_die 1 "could not merge the ranks' $split rollouts of iteration $n"
  fi
  loop_mark "$RUN_LOG" "$n" "$phase"
}

# loop_takeover <split> <iteration>: a continue run's second round: the master
# re-assigns the unfinished episodes of the ranks the rollout barrier went on
# without (their journals cut where they stand) to the survivors, who roll them
# out (rank_<r>.takeover_<d>.jsonl); every rank learns the decision, then
# waits for the others. A rank lost during the takeover ends the run (--resume).
loop_takeover() {
  local split=$1 n=$2 plan="" survivors
  local -A decided=()
  if nodes_is_master; then
    local dropped=${LOOP_SYNC[gone]:-}
    local dir out rank shared gone=""
    local -a dead=()
    shared=",$(loop_survivors ""),"
    # the ranks lost with a share of this step (a rank out of the step has none)
    for rank in ${dropped//,/ }; do [[ $shared != *",$rank,"* ]] || gone+="${gone:+,}$rank"; done
    if [[ -n $gone ]]; then
      dir="$RUN_LOG/trajectories/$split/$(printf 'iter_%04d' "$n")"
      survivors=$(loop_survivors "$gone")
      for rank in ${gone//,/ }; do dead+=(--dead "$rank"); done
      out=$(loop_py "$BATON_APP_PY" -m coordinator takeover-plan --config "$dir/rank_$RUN_RANK.config.yaml" \
        "${dead[@]}" --survivors "$survivors") ||
        common_die 1 "could not re-assign the $split episodes of ranks $gone (iteration $n)"
      plan=$(head -n 1 <<<"$out")
      common_log "iteration $n: the unfinished $split episodes of ranks $gone go to ranks $survivors" \
        "(dead rank, journal lines kept, survivor:episodes: $(tail -n +2 <<<"$out" | tr '\t\n' ' ;'))"
    fi
    LOOP_TAKEOVER_PLAN=$plan
    nodes_publish "$n" "${split}_takeover" "{\"plan\": \"$plan\"}"
  else
    nodes_receive "$n" "${split}_takeover" decided
    plan=${decided[plan]:-}
  fi
  [[ -n $plan ]] || return 0
  loop_rollout_cmd "$split" "$n" 1
  LOOP_CMD+=("takeover_plan=$plan")
  loop_run "rollout-$split" "$LOOP_RUN_DIR/logs/$(printf 'iter_%04d' "$n").$split.takeover.log" "${LOOP_CMD[@]}" ||
    common_die 1 "the $split takeover of iteration $n failed; fix the cause, then rerun with --resume"
  local before=",${LOOP_SYNC[gone]:-}," rank lost="" dropped
  nodes_sync "$n" "${split}_takeover_done" "" LOOP_SYNC
  dropped=${LOOP_SYNC[gone]:-}
  for rank in ${dropped//,/ }; do [[ $before == *",$rank,"* ]] || lost+="${lost:+,}$rank"; done
  [[ -z $lost ]] ||
    common_die 1 "ranks $lost were lost during the $split takeover of iteration $n; restart them, then every node with --resume"
}

# loop_survivors <gone csv>: the ranks with a share this step (weight > 0) that are not in <gone>.
loop_survivors() {
  local -a weights out=()
  local rank
  IFS=, read -r -a weights <<<"${LOOP_RANK_WEIGHTS//[\[\] ]/}"
  for rank in "${!weights[@]}"; do
    [[ ${weights[rank]} != 0 && ,$1, != *",$rank,"* ]] && out+=("$rank")
  done
  (IFS=, && printf '%s\n' "${out[*]}")
}

# loop_rollout_run <split> <iteration>: run LOOP_CMD, then (several nodes) the
# barrier. When the policy server stops answering under the rollout (exit
# LOOP_POLICY_DOWN), restart vLLM and resume the rollout, at most
# LOOP_POLICY_RESTARTS times (not in debug mode: the server is not ours).
loop_rollout_run() {
  local log rc restarts=0
  log="$LOOP_RUN_DIR/logs/$(printf 'iter_%04d' "$2").$1.log"
  while :; do
    rc=0
    loop_run "rollout-$1" "$log" "${LOOP_CMD[@]}" || rc=$?
    # The engine's start-up probe calls an unreachable server bad input (exit 2); ours answered a moment ago.
    if ((rc == 2 && !RUN_DEBUG)) && ! loop_policy_answers; then
      common_warn "the $1 rollout found the policy server unreachable at its start: it died meanwhile"
      rc=$LOOP_POLICY_DOWN
    fi
    (((rc == LOOP_POLICY_DOWN || rc == 124) && restarts < LOOP_POLICY_RESTARTS)) || break
    restarts=$((restarts + 1))
    if ((rc == 124)) && loop_policy_answers; then
      common_warn "the $1 rollout was stuck while the policy server answers; resuming it" \
        "(restart $restarts of $LOOP_POLICY_RESTARTS)"
    elif ((RUN_DEBUG)); then
      common_warn "the policy server $LOOP_BASE_URL stopped answering during the $1 rollout (debug mode: it is" \
        "not ours to restart)"
      break
    else
      common_warn "the policy server stopped answering during the $1 rollout; restarting vLLM and resuming" \
        "(restart $restarts of $LOOP_POLICY_RESTARTS)"
      vllm_stop "$LOOP_RUN_DIR"
      loop_ensure_vllm
    fi
    loop_rollout_cmd "$1" "$2" 1
  done
  ((rc == 0)) || return "$rc"
  LOOP_SYNC=()
  ! nodes_multi || loop_watch_start "rollout-$1" # the other ranks, while this one waits for them
  nodes_sync "$2" "${1}_rollout" "" LOOP_SYNC
  loop_watch_stop
}

# loop_policy_answers: true when the policy server answers a model list within 10 s.
loop_policy_answers() {
  curl -fsS --max-time 10 "$LOOP_BASE_URL/models" >/dev/null 2>&1
}

# loop_keep_best <iteration>: --keep-best, after the held-out rollout of <iteration>, on the master (a
# single node): when `python -m coordinator keep-best` finds the evaluated policy worse than the best one
# measured so far by more than --keep-best-margin points, promote the best's weights as a new version
# (`python -m training phase=revert`, the tracked group `revert`): policy/current names it, the update trains
# from it, loop_serve serves it (the workers: through the version the update barrier names). A resumed
# iteration that reverted already is not reverted again (the decision says `done`).
loop_keep_best() {
  local n=$1 out action served best source served_rate best_rate message log what
  local -a decided
  nodes_is_master || return 0
  out=$(loop_py "$BATON_APP_PY" -m coordinator keep-best --log-path "$RUN_LOG" --iteration "$n" \
    --margin "$RUN_KEEP_BEST_MARGIN" --base-model "$LOOP_BASE_MODEL") ||
    common_die 1 "iteration $n: --keep-best could not decide (error above); rerun with --resume"
  mapfile -t decided <<<"$out" # one value a line: empty ones stay in place
  action=${decided[0]:-} served=${decided[1]:-} best=${decided[2]:-} source=${decided[3]:-}
  served_rate=${decided[4]:-} best_rate=${decided[5]:-} message=${decided[6]:-}
  if [[ $action != revert ]]; then
    [[ -z $message ]] || common_log "iteration $n: $message"
    return 0
  fi
  log="$LOOP_RUN_DIR/logs/$(printf 'iter_%04d' "$n").revert.log"
  LOOP_CMD=(env PYTHONPATH="$LOOP_ROOT" "$BATON_TRAIN_PY" -m training --config-name update "log_path=$RUN_LOG"
    "iteration=$n" "model_path=$source" phase=revert "revert.to_version=$best" "revert.replaced=$served"
    "revert.replaced_success_rate=$served_rate" "revert.best_success_rate=$best_rate"
    "revert.margin_points=$RUN_KEEP_BEST_MARGIN" "${LOOP_UPDATE_OVR[@]}")
  what="v$best"
  [[ $best != 0 ]] || what="the base model"
  loop_run revert "$log" "${LOOP_CMD[@]}" ||
    common_die 1 "iteration $n: the revert to $what failed (see $log); rerun with --resume"
  common_log "$message as v$(loop_policy_version) (--keep-best)"
}

# loop_update_phase <iteration>: the training phase to run for <iteration>
# ("all", or "promote" when --resume finds a finished training not yet promoted).
loop_update_phase() {
  local n=$1
  if ((LOOP_RESUME)) && [[ -f $RUN_LOG/training/$(printf 'iter_%04d' "$n")/output/config.json ]] &&
    grep -q "\"kind\": \"training\", \"iteration\": $n," "$RUN_LOG/metrics.jsonl" 2>/dev/null; then
    printf 'promote\n'
  else
    printf 'all\n'
  fi
}

# loop_update <iteration>: train on the new trajectories and promote; a failure
# keeps the old policy (and stops the run after --max-update-failures in a row).
loop_update() {
  local n=$1 rc=0 log outcome
  iteration_is_done "$RUN_LOG" "$n" update && return 0
  log="$LOOP_RUN_DIR/logs/$(printf 'iter_%04d' "$n").update.log"
  # Only a run that serves (both) may put its own vLLM to sleep; an update-only run leaves servers alone.
  [[ $RUN_PHASE == both ]] && ((!RUN_DEBUG)) && { vllm_sleep "$LOOP_PORT" || common_warn "could not put vLLM to sleep; training beside it"; }
  LOOP_UPDATE_RUNNING=$n
  if nodes_multi; then
    loop_timed "$n" update loop_update_nodes "$n" "$log" || rc=$?
  else
    loop_update_cmd "$n" "$(loop_update_phase "$n")"
    loop_timed "$n" update loop_run update "$log" "${LOOP_CMD[@]}" || rc=$?
  fi
  LOOP_UPDATE_RUNNING=""
  [[ $RUN_PHASE == both ]] && ((!RUN_DEBUG)) && { vllm_wake "$LOOP_PORT" || common_warn "could not wake vLLM up"; }
  nodes_is_master || return 0
  if ((rc == 0)); then
    LOOP_FAILURES=0
    outcome="promoted v$(loop_policy_version)"
  elif ((rc == 2)); then # python -m training: bad input (a config only the train environment checks)
    loop_mark "$RUN_LOG" "$n" update "failed (exit 2: bad input)"
    common_die 2 "iteration $n: the update rejected its input (see $log); fix the configuration, then rerun" \
      "with --resume (the rollouts are kept; every further update would fail the same way)"
  elif ((rc == 3)); then # python -m training: too little data for one optimizer step
    outcome="skipped: too little to train on"
    common_warn "iteration $n: too few usable samples to train on (see $log); keeping the served policy"
  else
    LOOP_FAILURES=$((LOOP_FAILURES + 1))
    outcome="failed (exit $rc)"
    common_warn "iteration $n: update failed ($LOOP_FAILURES in a row); keeping the served policy"
    ((LOOP_FAILURES < RUN_MAX_FAILURES)) ||
      common_die 1 "$LOOP_FAILURES updates failed in a row (--max-update-failures $RUN_MAX_FAILURES); see $log"
  fi
  loop_mark "$RUN_LOG" "$n" update "$outcome"
}

# loop_update_nodes <iteration> <log>: the update on several nodes. The master
# prepares the dataset and tells the others whether to train; every node runs
# its torchrun node of the training; the master promotes; all wait for that.
# Returns the master's outcome (0 promoted, 3 nothing to train, else failed).
loop_update_nodes() {
  local n=$1 log=$2 rc=0 train=1 sha="" trained=0
  local -A decided=()
  if nodes_is_master; then
    if [[ $(loop_update_phase "$n") == all ]]; then
      loop_update_cmd "$n" prepare
      loop_run update "$log" "${LOOP_CMD[@]}" || rc=$?
      ((rc == 0)) || train=0
    else
      train=0 # --resume: trained already, promote only
    fi
    local members=""
    local -A now=()
    if nodes_continue; then # the step's members that are still in: they train
      nodes_members 0 now "$NODES_PLANNED"
      members=", \"members\": \"${now[members]}\""
      loop_train_on "${now[members]}"
    fi
    # Every node trains on exactly the files the master prepared: their sha256 goes with the plan.
    ((!train)) || sha=$(<"$RUN_LOG/training/$(printf 'iter_%04d' "$n")/dataset.sha256")
    # "version": the model trained from, which a --keep-best revert may have changed since the step's plan.
    nodes_publish "$n" update_plan "{\"train\": $train, \"prepare_exit\": $rc$members, \"dataset_sha256\": \"$sha\", \"version\": \"$(loop_policy_version)\"}"
  else
    nodes_receive "$n" update_plan decided
    [[ ! -v decided[version] ]] || LOOP_PIN_VERSION=${decided[version]}
    train=${decided[train]:-0} sha=${decided[dataset_sha256]:-}
    [[ -z ${decided[members]:-} ]] || loop_train_on "${decided[members]}" || train=0
  fi
  if ((train)); then
    loop_update_cmd "$n" train "launch.dataset_sha256=$sha"
    nodes_watch_partners "$n" # a node whose part fails says so at the barrier: the others stop theirs
    loop_run update "$log" "${LOOP_CMD[@]}" || rc=$?
    nodes_unwatch_partners
    trained=$rc
  fi
  if nodes_is_master && ((rc == 0)); then
    loop_update_cmd "$n" promote
    loop_run update "$log" "${LOOP_CMD[@]}" || rc=$?
  fi
  if nodes_is_master; then
    nodes_sync "$n" update "{\"exit\": $rc, \"train_exit\": $trained, \"version\": \"$(loop_policy_version)\"}"
  else
    # Serve the version the master promoted (its word, not policy/current, which NFS may show late).
    nodes_sync "$n" update "{\"train_exit\": $trained}" decided
    LOOP_PINNED=1 LOOP_PIN_VERSION=${decided[version]:-}
    rc=${decided[exit]:-1}
  fi
  return "$rc"
}

# loop_train_on <members csv>: train as one of the ranks listed (torchrun's nodes:
# LOOP_TRAIN_NODES, LOOP_TRAIN_RANK); false when this rank is not among them.
loop_train_on() {
  local -a ranks
  local i
  IFS=, read -r -a ranks <<<"$1"
  LOOP_TRAIN_NODES=${#ranks[@]}
  for i in "${!ranks[@]}"; do
    [[ ${ranks[i]} != "$RUN_RANK" ]] || { LOOP_TRAIN_RANK=$i && return 0; }
  done
  return 1
}

# loop_wait <pid>: wait for a child's exit status, through the SIGUSR1s that
# interrupt bash's wait (loop_evicted sets LOOP_SIGNALLED) and, on several nodes,
# a heartbeat that dies meanwhile (nodes_wait_child starts it again).
loop_wait() {
  local rc
  while :; do
    LOOP_SIGNALLED=0 rc=0
    nodes_wait_child "$1" || rc=$?
    ((LOOP_SIGNALLED)) || return "$rc"
  done
}

# loop_wait_for <pid> <total_s> <stall_s> [progress_fn args...]: loop_wait with
# deadlines, judged on this shell's clock: return 124 (LOOP_EXPIRED says why)
# once <pid> has run <total_s> seconds, or once the output of <progress_fn
# args...> has not changed for <stall_s> seconds (0: no such deadline). The
# caller stops the group. Polls every 2 s; a signal to run.sh still interrupts.
loop_wait_for() {
  local pid=$1 total=$2 stall=$3 start=$SECONDS last=$SECONDS seen="" now
  shift 3
  ((total > 0 || stall > 0)) || {
    loop_wait "$pid"
    return
  }
  while loop_running "$pid"; do
    nodes_beat_check
    if (($#)); then
      now=$("$@")
      [[ $now == "$seen" ]] || seen=$now last=$SECONDS
    fi
    if ((total > 0 && SECONDS - start >= total)); then
      LOOP_EXPIRED="still running after ${total}s (its deadline)"
      return 124
    fi
    if ((stall > 0 && $# && SECONDS - last >= stall)); then
      LOOP_EXPIRED="no progress for ${stall}s (no episode finished; BATON_ROLLOUT_STALL_S)"
      return 124
    fi
    sleep 2 &
    LOOP_SLEEP_PID=$!
    wait "$LOOP_SLEEP_PID" 2>/dev/null || true
    LOOP_SLEEP_PID=""
  done
  loop_wait "$pid"
}

# loop_running <pid>: true while <pid> runs (not yet exited: a zombie waiting to be reaped has).
loop_running() {
  local stat
  { read -r stat <"/proc/$1/stat"; } 2>/dev/null || return 1
  stat=${stat##*) }
  [[ ${stat:0:1} != Z ]]
}

# loop_rollout_progress <split>: print what changes when this rank's rollout of
# iteration LOOP_N finishes an episode: its journals' sizes (the main one and takeovers).
loop_rollout_progress() {
  local dir
  dir="$RUN_LOG/trajectories/$1/$(printf 'iter_%04d' "$LOOP_N")"
  stat -c '%n %s' -- "$dir/rank_$RUN_RANK."*jsonl 2>/dev/null || true
}

# loop_evicted: SIGUSR1 from the master's heartbeat: it evicted a rank (continue
# mode); a training that rank was part of would wait for it forever: stop it (the
# update fails, the served policy stays, the next iteration goes on without it).
loop_evicted() {
  LOOP_SIGNALLED=1
  [[ -n ${LOOP_UPDATE_RUNNING:-} ]] || return 0
  common_warn "a rank of this training was evicted; stopping the update of iteration $LOOP_UPDATE_RUNNING"
  loop_stop_update
}

# loop_serve <iteration>: serve the promoted policy before the next iteration.
# (Each node serves its own; only the master's marker is skipped on --resume.)
loop_serve() {
  local n=$1
  nodes_is_master && iteration_is_done "$RUN_LOG" "$n" serve && return 0
  loop_timed "$n" serve loop_serve_current
  loop_mark "$RUN_LOG" "$n" serve "${LOOP_SERVE_HOW:-no new policy}"
}

# loop_finish <iteration>: metrics record, plot, trackers, and the iteration's end marker (the master's).
loop_finish() {
  local n=$1 plot
  LOOP_PHASE=finish
  if ! nodes_is_master; then
    common_log "iteration $n done on rank $RUN_RANK"
    return 0
  fi
  local line
  line=$(loop_py "$BATON_APP_PY" -m coordinator summarize --log-path "$RUN_LOG" --iteration "$n" \
    --served-version "${2:-}") || common_warn "could not summarize iteration $n"
  plot=$(loop_py "$BATON_APP_PY" -m coordinator plot --log-path "$RUN_LOG") || common_warn "could not draw the plot"
  [[ -z ${LOOP_TRACKERS:-} ]] || loop_py "$BATON_APP_PY" -m coordinator track --log-path "$RUN_LOG" >/dev/null ||
    common_warn "could not log iteration $n to the trackers ($LOOP_TRACKERS); the next iteration logs it"
  nodes_fence "marking the end of iteration $n"
  iteration_mark "$RUN_LOG" "$n" iteration
  [[ -z ${line:-} ]] || common_log "$line"
  common_log "iteration $n done; metrics: $RUN_LOG/metrics.jsonl, plot: ${plot:-none}"
}

# loop_begin <iteration>: create the iteration's state with its resolved config (the master's).
loop_begin() {
  local n=$1 dir
  # shellcheck disable=SC2034 # LOOP_PHASE is read by nodes_leave (the failure flag)
  LOOP_N=$n LOOP_PHASE=begin
  if nodes_is_master; then
    nodes_fence "beginning iteration $n"
    ((LOOP_RESUME)) || iteration_restart "$RUN_LOG" "$n"
    dir=$(iteration_state_dir "$RUN_LOG" "$n")
    mkdir -p "$dir"
    cp -f "$LOOP_RUN_DIR/resolved.yaml" "$dir/config.yaml"
  fi
  if nodes_multi; then common_log "iteration $n ($RUN_PHASE, rank $RUN_RANK of $RUN_NUM_NODES)"; else common_log "iteration $n ($RUN_PHASE)"; fi
}

# loop_should_continue <done>: true while fewer than --max-iterations ran (always without it).
loop_should_continue() {
  [[ -z $RUN_MAX_ITER ]] || (($1 < RUN_MAX_ITER))
}

# loop_next <step>: decide what step <step> of this run does (LOOP_N, the
# iteration; LOOP_TRAIN, LOOP_EVAL, LOOP_UPDATE, LOOP_FINAL; LOOP_RESUME);
# false when the run is over. The master (or a single node) decides and, on
# several nodes, publishes the plan; a worker waits for it: iteration numbers,
# --max-iterations, --resume and the policy version a rollout serves are the
# master's.
loop_next() {
  local step=$1
  local -A plan=()
  LOOP_TRAIN=0 LOOP_EVAL=0 LOOP_UPDATE=0 LOOP_FINAL=0 LOOP_RESUME=$RUN_RESUME LOOP_SKIP=0
  if ! nodes_is_master; then
    nodes_receive "$step" plan plan
    ((!${plan[stop]:-0})) || return 1
    if nodes_continue && [[ ${plan[m_$RUN_RANK]:-} != "$NODES_ME" ]]; then
      # planned without this node (before it joined, or it was evicted since): the next step may have it
      common_log "rank $RUN_RANK: step $step was planned without this node; waiting for the next"
      LOOP_SKIP=1
      return 0
    fi
    [[ -z ${plan[weights]:-} ]] || LOOP_RANK_WEIGHTS="[${plan[weights]}]"
    ! nodes_continue || nodes_plan_members plan
    LOOP_N=${plan[iteration]} LOOP_TRAIN=${plan[train]} LOOP_EVAL=${plan[eval]} LOOP_UPDATE=${plan[update]}
    LOOP_FINAL=${plan[final]} LOOP_RESUME=${plan[resume]}
    # The policy version this step serves and fine-tunes is the master's ("" for the base model).
    LOOP_PINNED=1 LOOP_PIN_VERSION=${plan[version]}
    return 0
  fi
  local go=0
  case "$RUN_PHASE" in
    both) loop_plan_both && go=1 ;;
    rollout) loop_plan_rollout && go=1 ;;
    update) loop_plan_update && go=1 ;;
  esac
  if nodes_multi; then
    if ((go)); then
      local members="" key
      local -A in_step=()
      if nodes_continue; then
        nodes_members "$step" in_step
        nodes_plan_members in_step
        LOOP_RANK_WEIGHTS="[${in_step[weights]}]"
        common_log "step $step: ranks ${in_step[members]} (rank weights $LOOP_RANK_WEIGHTS)"
        for key in "${!in_step[@]}"; do members+=", \"$key\": \"${in_step[$key]}\""; done
      fi
      nodes_publish "$step" plan "$(printf '{"iteration": %d, "train": %d, "eval": %d, "update": %d, "final": %d, "resume": %d, "version": "%s"%s}' \
        "$LOOP_N" "$LOOP_TRAIN" "$LOOP_EVAL" "$LOOP_UPDATE" "$LOOP_FINAL" "$LOOP_RESUME" "$(loop_policy_version)" "$members")"
    else
      nodes_publish "$step" plan '{"stop": 1}'
    fi
  fi
  ((go))
}

# loop_plan_both: train rollout, eval when due, update; after --max-iterations,
# the --final-eval step (a test rollout only).
loop_plan_both() {
  if loop_should_continue "$LOOP_DONE"; then
    LOOP_N=$(iteration_next "$RUN_LOG") LOOP_TRAIN=1 LOOP_UPDATE=1
    ! iteration_eval_due "$LOOP_N" "$RUN_EVAL_INTERVAL" || LOOP_EVAL=1
  elif ((RUN_FINAL_EVAL && !LOOP_FINAL_DONE)); then
    LOOP_N=$(iteration_next "$RUN_LOG") LOOP_EVAL=1 LOOP_FINAL=1
  else
    return 1
  fi
}

# loop_plan_rollout: one rollout of --rollout-split per step.
loop_plan_rollout() {
  loop_should_continue "$LOOP_DONE" || return 1
  LOOP_N=$(iteration_next "$RUN_LOG")
  if [[ $RUN_SPLIT == eval-only ]]; then LOOP_EVAL=1; else LOOP_TRAIN=1; fi
  # Serve a newer policy (from an update run on this log path) before rolling out with it; the
  # step keeps that version (the plan names it to the workers) even if a newer one comes meanwhile.
  LOOP_PINNED=0
  loop_serve_current
  LOOP_PINNED=1 LOOP_PIN_VERSION=${LOOP_SERVED_VERSION:-}
}

# loop_plan_update: the newest train rollout not trained on yet; with nothing
# new it waits (polling), for at most --wait-timeout.
loop_plan_update() {
  local n poll=${BATON_UPDATE_POLL_S:-30} since=$SECONDS said=-1 waited
  loop_should_continue "$LOOP_DONE" || return 1
  until n=$(loop_untrained); do
    waited=$((SECONDS - since))
    if [[ -n $RUN_WAIT ]] && ((waited >= RUN_WAIT)); then
      loop_wait_expired "$LOOP_DONE" "$waited"
      return 1
    fi
    if ((said < 0 || waited - said >= 600)); then
      common_log "waiting for a new train rollout under $RUN_LOG/trajectories/train (from --rl-phase rollout" \
        "--rollout-split train-only on this log path); checking every ${poll}s, waited ${waited}s${RUN_WAIT:+ of $RUN_WAIT}"
      said=$waited
    fi
    [[ -z $RUN_WAIT ]] || ((poll <= RUN_WAIT - waited)) || poll=$((RUN_WAIT - waited))
    sleep "$poll" &
    LOOP_SLEEP_PID=$!
    loop_wait "$LOOP_SLEEP_PID" || true # beside the heartbeat (nodes_wait_child)
    LOOP_SLEEP_PID=""
  done
  LOOP_N=$n LOOP_UPDATE=1
}

# loop_steps: run the steps the plan gives (every --rl-phase): each node rolls
# out its share, trains its part, serves the promoted policy; the master
# records each iteration. A node that trains first checks the update's config
# while vLLM starts, and waits for that check before its first step.
loop_steps() {
  local step=0 served
  loop_check_start
  [[ $RUN_PHASE == update ]] || loop_ensure_vllm
  loop_check_wait
  while loop_next $((++step)); do
    ((!LOOP_SKIP)) || continue
    if [[ $RUN_PHASE == update ]]; then
      loop_update "$LOOP_N"
      LOOP_DONE=$((LOOP_DONE + 1))
      continue
    fi
    loop_begin "$LOOP_N"
    if ((LOOP_FINAL)); then
      served=$(loop_policy_version)
      common_log "final held-out evaluation of ${served:+v}${served:-the base model}"
    fi
    ((!LOOP_PINNED)) || loop_serve_current
    served=$(loop_policy_version)
    ((!LOOP_TRAIN)) || loop_rollout train "$LOOP_N"
    ((!LOOP_EVAL)) || loop_rollout test "$LOOP_N"
    ((!LOOP_EVAL || !${RUN_KEEP_BEST:-0})) || loop_keep_best "$LOOP_N"
    if ((LOOP_UPDATE)); then
      loop_update "$LOOP_N"
      loop_serve "$LOOP_N"
    fi
    loop_finish "$LOOP_N" "$served"
    if ((LOOP_FINAL)); then LOOP_FINAL_DONE=1; else LOOP_DONE=$((LOOP_DONE + 1)); fi
  done
}

# loop_untrained: print the newest iteration with a finished train rollout and no update yet.
loop_untrained() {
  local n
  for ((n = $(iteration_last "$RUN_LOG"); n >= 1; n--)); do
    iteration_is_done "$RUN_LOG" "$n" update && return 1
    iteration_is_done "$RUN_LOG" "$n" train_rollout && printf '%s\n' "$n" && return 0
  done
  return 1
}

# loop_wait_expired <updates_done> <waited_s>: --wait-timeout ran out; fine after
# at least one update, an error (exit 1) when there was never anything to train on.
loop_wait_expired() {
  if (($1 > 0)); then
    common_log "no new train rollout for ${2}s (--wait-timeout $RUN_WAIT); stopping after $1 update(s)"
    return 0
  fi
  common_die 1 "no train rollout to train on under $RUN_LOG after ${2}s (--wait-timeout $RUN_WAIT);" \
    "run --rl-phase rollout --rollout-split train-only (or both) on this log path first, or wait longer"
}

# loop_stop_update: stop a running update so that its training groups end too:
# SIGTERM makes python -m training stop the LLaMA-Factory and torchrun worker
# groups it started (within launch.grace_s = 10 s; SIGTERM rather than SIGINT,
# which a run started in the background inherits as ignored); as a last resort
# SIGKILL the groups it listed in training/iter_<N>/*.log.pgid. Every group is
# signalled only while its pid does not name another process than the recorded
# leader (the start time beside it: procs_signal), so a reused pid is never hit.
loop_stop_update() {
  local file="$LOOP_RUN_DIR/pids/update.pgid" pgid start waited=0 groups
  [[ -f $file ]] || return 0
  read -r pgid start <"$file" || true
  if procs_signal "$pgid" "$start" TERM; then
    while procs_group_ours "$pgid" "$start" && procs_group_alive "$pgid" && ((waited < 150)); do
      sleep 0.1
      waited=$((waited + 1))
    done
  fi
  procs_stop "$LOOP_RUN_DIR" update 5
  [[ -n ${LOOP_UPDATE_RUNNING:-} ]] || return 0
  for groups in "$RUN_LOG/training/$(printf 'iter_%04d' "$LOOP_UPDATE_RUNNING")"/*.log.pgid; do
    [[ -f $groups ]] || continue
    while read -r pgid start; do
      procs_signal "$pgid" "$start" KILL || true
    done <"$groups"
  done
  return 0
}

# loop_cleanup: the EXIT trap: stop the groups of this run's roles (an update
# run never stops a rollout run's vLLM), then give up the roles. Shared data and
# the log path's files stay.
loop_cleanup() {
  local rc=$? name
  # Clean-up runs to the end: a second Ctrl+C or SIGTERM (or a heartbeat that stops this node) must not cut it short.
  trap '' INT TERM
  [[ -n ${LOOP_RUN_DIR:-} && -d $LOOP_RUN_DIR ]] || return 0
  [[ -z ${LOOP_SLEEP_PID:-} ]] || kill "$LOOP_SLEEP_PID" 2>/dev/null || true
  [[ -z ${LOOP_WAIT_PID:-} ]] || kill "$LOOP_WAIT_PID" 2>/dev/null || true
  [[ -z ${NODES_JOINED:-} ]] || rm -f "$NODES_JOINED"
  # Several nodes: flag this node's failure first, so that the others stop now rather than at their next barrier.
  nodes_leave "$rc"
  if ((${#LOOP_CLAIMED[@]})); then
    [[ " ${LOOP_GROUPS[*]} " != *" update "* ]] || loop_stop_update
    for name in "${LOOP_GROUPS[@]}"; do procs_stop "$LOOP_RUN_DIR" "$name" 10; done
  fi
  [[ -z ${NODES_RUN_ID:-} ]] || procs_stop "$LOOP_RUN_DIR" "$NODES_BEAT" 5
  loop_release
  [[ -z ${NODES_RUN_ID:-} ]] || exit "$NODES_EXIT"
}
