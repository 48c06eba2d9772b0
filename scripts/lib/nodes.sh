#!/usr/bin/env bash
# Multi-node coordination of run.sh over the shared log path: start or join
# the run, beat, publish / await each step's plan, and the phase barriers.
# The protocol and its files (<log>/cluster/) are coordinator/'s; this file
# calls `python -m coordinator ...`, keeps the processes it needs tracked, and
# turns the protocol's outcomes into run.sh's exit codes (docs/multinode.md).
# With --num-nodes 1 they do nothing, except nodes_apply_file (a node file applies to one node too).
# Library file: defines functions only. Needs common.sh, procs.sh, slurm.sh and loop.sh (loop_py, LOOP_*).

# nodes_multi: true when several nodes share this run.
nodes_multi() {
  ((RUN_NUM_NODES > 1))
}

# nodes_is_master: true on rank 0 (and on a single node): the rank that decides and records.
nodes_is_master() {
  ((RUN_RANK == 0))
}

# nodes_apply_file: export this rank's settings from --node-file (or
# BATON_NODE_FILE): environment variables, interpreters, vLLM port, address.
# A bad file exits 2 naming the problem, before anything starts.
nodes_apply_file() {
  local file=${RUN_NODE_FILE:-${BATON_NODE_FILE:-}} exports
  [[ -n $file ]] || return 0
  exports=$(PYTHONPATH="$ROOT" "$BATON_APP_PY" -m coordinator node-env --node-file "$file" --rank "$RUN_RANK" \
    --num-nodes "$RUN_NUM_NODES") || exit 2 # its problems, each naming --node-file, are on stderr
  eval "$exports"
  [[ -z ${BATON_NODE_ADDR:-} || -n $RUN_NODE_ADDR ]] || RUN_NODE_ADDR=$BATON_NODE_ADDR
  [[ -z $exports ]] || common_log "node file $file: rank $RUN_RANK sets $(cut -d= -f1 <<<"${exports//export /}" | paste -sd' ')"
}

# nodes_group: print this run's protocol group: "" for --rl-phase both (files
# under <log>/cluster/), else the phase: a split deployment's rollout run and
# update run on the same log path coordinate apart (<log>/roles/<phase>/cluster/).
nodes_group() {
  [[ $RUN_PHASE == both ]] || printf '%s\n' "$RUN_PHASE"
}

# nodes_cli <subcommand> <args...>: run a protocol subcommand on this run's files.
nodes_cli() {
  local sub=$1 group
  shift
  group=$(nodes_group)
  loop_py "$BATON_APP_PY" -m coordinator "$sub" --log-path "$RUN_LOG" ${group:+--group "$group"} "$@"
}

# nodes_start: the master starts a run (a new run id: files of earlier runs
# are fenced off), a worker waits for a master it sees beating and joins; then
# the heartbeat runs beside this node as a tracked group. Sets NODES_RUN_ID,
# NODES_MASTER_ADDR and NODES_TORCHRUN_PORT.
nodes_start() {
  NODES_RUN_ID="" NODES_MASTER_ADDR="" NODES_TORCHRUN_PORT="" NODES_ON_FAILURE=abort NODES_PLANNED="" NODES_JOINED=""
  # shellcheck disable=SC2034 # NODES_ME (this node's registration, host:pid:start time) is read by loop_next
  NODES_ME="$HOSTNAME:$$:$(procs_start_time $$ || printf '0\n')"
  NODES_BEAT_PID=""
  nodes_multi || return 0
  local rc=0 key value group
  local -a node=(--num-nodes "$RUN_NUM_NODES" --rank-weights "$RUN_RANK_WEIGHTS" --pid $$ --vllm-port "$LOOP_PORT")
  [[ -z $RUN_NODE_ADDR ]] || node+=(--addr "$RUN_NODE_ADDR")
  if nodes_is_master; then
    NODES_RUN_ID=$(nodes_cli start-run "${node[@]}" --torchrun-port "$(loop_free_port)" \
      --on-rank-failure "$RUN_ON_FAILURE" --start-iteration "$(iteration_next "$RUN_LOG")" \
      --heartbeat-interval "${BATON_HEARTBEAT_S:-5}" --dead-after "${BATON_DEAD_AFTER_S:-30}") || rc=$?
  else
    common_log "rank $RUN_RANK: waiting for the master (rank 0) on $RUN_LOG (at most ${BATON_JOIN_WAIT_S:-600}s)"
    # In the background (bash runs a trap only once its foreground command ends): a SIGTERM or
    # Ctrl+C during the wait, which may last minutes, stops this node at once (loop_cleanup kills the join).
    # (a file of its own: a split deployment's other run, maybe on another host, shares this rank's directory)
    NODES_JOINED=$(mktemp "$LOOP_RUN_DIR/.join.XXXXXX")
    (LOOP_PY_EXEC=1 nodes_cli join --rank "$RUN_RANK" "${node[@]}" --wait "${BATON_JOIN_WAIT_S:-600}" >"$NODES_JOINED") &
    LOOP_WAIT_PID=$!
    loop_wait "$LOOP_WAIT_PID" || rc=$?
    LOOP_WAIT_PID=""
    NODES_RUN_ID=$(<"$NODES_JOINED")
    rm -f "$NODES_JOINED"
  fi
  ((rc == 0)) || nodes_exit "$rc" "could not $(nodes_is_master && echo start || echo join) the multi-node run"
  while IFS=$'\t' read -r key value; do
    case "$key" in
      master_addr) NODES_MASTER_ADDR=$value ;;
      torchrun_port) NODES_TORCHRUN_PORT=$value ;;
      on_rank_failure) NODES_ON_FAILURE=$value ;;
    esac
  done < <(nodes_cli record --run-id "$NODES_RUN_ID")
  group=$(nodes_group)
  # A split deployment's two runs share this rank's run directory: each has its own heartbeat and reason file.
  NODES_BEAT=heartbeat${group:+-$group} NODES_ENDED=$LOOP_RUN_DIR/ended${group:+-$group}
  # Every process this node starts from now on writes into the log path only while this run is the one the
  # run record names (rollout_engine/fence.py): a newer master's start fences an older run's node off.
  export BATON_RUN_ID=$NODES_RUN_ID BATON_RUN_FENCE=$RUN_LOG/${group:+roles/$group/}cluster/run.json
  rm -f "$NODES_ENDED"
  NODES_BEAT_CMD=(env PYTHONPATH="$LOOP_ROOT" "$BATON_APP_PY" -m coordinator heartbeat --log-path "$RUN_LOG"
    ${group:+--group "$group"} --run-id "$NODES_RUN_ID" --rank "$RUN_RANK" --node-pid $$ --stop-node
    --reason-file "$NODES_ENDED")
  NODES_BEAT_RESTARTS=0
  nodes_beat_start
  common_log "rank $RUN_RANK of $RUN_NUM_NODES: run $NODES_RUN_ID, master $NODES_MASTER_ADDR" \
    "(torchrun port $NODES_TORCHRUN_PORT); status: python -m coordinator status --log-path $RUN_LOG${group:+ --group $group}"
}

# nodes_beat_start: start this node's heartbeat (NODES_BEAT_CMD) as the tracked group NODES_BEAT; NODES_BEAT_PID
# is its pid, a child of this shell, so that a wait for a phase sees it exit (nodes_wait_child).
nodes_beat_start() {
  procs_start "$LOOP_RUN_DIR" "$NODES_BEAT" "$LOOP_RUN_DIR/logs/$NODES_BEAT.log" "${NODES_BEAT_CMD[@]}" >/dev/null
  NODES_BEAT_PID=$(procs_pgid "$LOOP_RUN_DIR" "$NODES_BEAT")
}

# nodes_wait_child <pid>: `wait <pid>`: its exit code (> 128 when a trapped signal cut the wait short), watching
# this node's heartbeat beside it (one that exits while the node waits is started again: nodes_beat_lost) and,
# while it trains, the other nodes' parts (nodes_watch_partners).
nodes_wait_child() {
  local rc who
  while [[ -n ${NODES_BEAT_PID:-} ]]; do
    rc=0 who=""
    wait -n -p who "$1" "$NODES_BEAT_PID" ${NODES_PARTNER_PID:+"$NODES_PARTNER_PID"} || rc=$?
    # (a trapped signal that cuts the wait short, e.g. the master's SIGUSR1 on an eviction, unsets `who`)
    if [[ -n ${who:-} && $who == "${NODES_PARTNER_PID:-}" ]]; then
      nodes_partner_failed "$rc"
    elif [[ ${who:-} == "$NODES_BEAT_PID" ]]; then
      nodes_beat_lost "$rc"
    else
      return "$rc"
    fi
  done
  wait "$1"
}

# nodes_beat_check: for a wait that polls (a phase with deadlines, vLLM's start-up, the update's wait for a
# rollout) rather than waits for a child: when this node's heartbeat has exited, reap it and start it again
# (nodes_beat_lost), as nodes_wait_child does, so that no phase leaves the node without its heartbeat.
nodes_beat_check() {
  local rc=0
  [[ -n ${NODES_BEAT_PID:-} ]] && ! loop_running "$NODES_BEAT_PID" || return 0
  wait "$NODES_BEAT_PID" || rc=$?
  nodes_beat_lost "$rc"
}

# nodes_watch_partners <iteration>: while this node runs its part of the training of <iteration>, watch the
# others' parts: a node whose part failed arrives at the update barrier with train_exit != 0, and as its
# torchrun is gone, this node's part would wait for it until launch.timeout_s (3600 s) while the others wait
# at the barrier. The watcher (NODES_PARTNER_PID, a child of this shell) is waited for beside the training
# (nodes_wait_child), which then stops this node's part (nodes_partner_failed).
nodes_watch_partners() {
  nodes_multi || return 0
  NODES_PARTNER_OUT=$(mktemp "$LOOP_RUN_DIR/.partner.XXXXXX")
  (LOOP_PY_EXEC=1 nodes_cli partner-failed --run-id "$NODES_RUN_ID" --rank "$RUN_RANK" --iteration "$1" \
    --phase update --key train_exit >"$NODES_PARTNER_OUT") &
  NODES_PARTNER_PID=$!
}

# nodes_unwatch_partners: stop the watcher, if it runs, and forget it.
nodes_unwatch_partners() {
  if [[ -n ${NODES_PARTNER_PID:-} ]]; then
    kill "$NODES_PARTNER_PID" 2>/dev/null || true
    wait "$NODES_PARTNER_PID" 2>/dev/null || true
  fi
  [[ -z ${NODES_PARTNER_OUT:-} ]] || rm -f "$NODES_PARTNER_OUT"
  NODES_PARTNER_PID="" NODES_PARTNER_OUT=""
}

# nodes_partner_failed <wait status>: the watcher ended: when it found another node's failed part (status 0),
# stop this node's part of the training now (loop_stop_update) rather than at launch.timeout_s.
nodes_partner_failed() {
  local rank="" code=""
  NODES_PARTNER_PID=""
  (($1 == 0)) || return 0
  IFS=$'\t' read -r rank code <"$NODES_PARTNER_OUT" || true
  common_warn "the update of iteration ${LOOP_UPDATE_RUNNING:-?}: rank ${rank:-?}'s part of the training failed" \
    "(exit ${code:-?}); it cannot finish without it: stopping this node's part instead of waiting for it"
  loop_stop_update
}

# nodes_beat_lost <wait status>: this node's heartbeat exited while the node runs (killed, crashed). Without
# it the other ranks count this node dead after dead_after_s (abort: the run stops; continue: it is evicted)
# while it works on, so start it again at once (it goes on from its last beat), at most 3 times per run.sh,
# then stop this node (exit 1). A heartbeat that ended the node on purpose (its reason file written, its
# SIGTERM on the way) is not started again.
nodes_beat_lost() {
  local rc=$1 how
  NODES_BEAT_PID=""
  [[ -z $(nodes_ended) ]] || return 0
  how="exit $rc"
  ((rc <= 128)) || how="killed by SIG$(kill -l $((rc - 128)))"
  ((NODES_BEAT_RESTARTS < 3)) ||
    common_die 1 "the heartbeat of rank $RUN_RANK exited ($how) a 4th time (log: $LOOP_RUN_DIR/logs/$NODES_BEAT.log);" \
      "without it the other ranks count this node dead: stopping it. Start it again with --resume (docs/multinode.md)"
  NODES_BEAT_RESTARTS=$((NODES_BEAT_RESTARTS + 1))
  common_warn "the heartbeat of rank $RUN_RANK exited ($how) while this node runs; starting it again" \
    "($NODES_BEAT_RESTARTS of 3) before the other ranks count this node dead"
  nodes_beat_start
}

# nodes_fence <what>: before the master writes the run's state (run/state), make sure this node's run is still
# the log path's: once a newer master's start superseded it, this node writes nothing more there and stops
# (exit 143, as a stopped run).
nodes_fence() {
  [[ -n ${NODES_RUN_ID:-} ]] || return 0
  nodes_cli fence --run-id "$NODES_RUN_ID" || nodes_exit $? "$1"
}

# nodes_continue: true in a run that goes on without a failed worker (--on-rank-failure continue).
nodes_continue() {
  nodes_multi && [[ $NODES_ON_FAILURE == continue ]]
}

# nodes_members <step> <var> [planned]: the master's view of who is in the step,
# into the associative array <var>: "members" (csv), "weights" (the run's, 0 for a
# rank that is out), "m_<r>" (host:pid:start time of each member's registration). With
# [planned] (NODES_PLANNED of a step; "" for no worker), those of the step's members not evicted since.
# On the first step of a continue run it first waits (BATON_JOIN_WAIT_S) for every rank to join.
nodes_members() {
  local wait=0 out key value
  local -n found=$2
  local -a extra=()
  ((${1:-0} != 1)) || wait=${BATON_JOIN_WAIT_S:-600}
  (($# < 3)) || extra=(--planned "$3")
  out=$(nodes_cli members --run-id "$NODES_RUN_ID" --rank 0 --wait-all "$wait" "${extra[@]}") ||
    nodes_exit $? "reading the members of step $1"
  found=()
  # shellcheck disable=SC2034 # a nameref: the caller's array
  while IFS=$'\t' read -r key value; do found["$key"]=$value; done <<<"$out"
}

# nodes_plan_members <var>: set NODES_PLANNED (rank=host:pid:start time,... of the workers)
# from the members array named <var> (a plan's, or nodes_members').
nodes_plan_members() {
  local -n of=$1
  local key
  NODES_PLANNED=""
  for key in "${!of[@]}"; do
    [[ $key == m_* && $key != m_0 ]] && NODES_PLANNED+="${NODES_PLANNED:+,}${key#m_}=${of[$key]}"
  done
  return 0
}

# nodes_wait_bg <out> <iteration> <phase> [wait args...]: wait for a barrier in
# the background (so that run.sh's traps run at once), its output to <out>;
# a protocol outcome other than success ends this node (nodes_exit).
nodes_wait_bg() {
  local out=$1 n=$2 phase=$3 rc=0
  shift 3
  # A continue run's barrier waits for the workers its step was planned with (none: ""), never for one that
  # joined since: that one skips the step and is planned into the next.
  ! nodes_continue || set -- "$@" --planned "${NODES_PLANNED:-}"
  (LOOP_PY_EXEC=1 nodes_cli wait --run-id "$NODES_RUN_ID" --rank "$RUN_RANK" --iteration "$n" --phase "$phase" "$@" >"$out") &
  LOOP_WAIT_PID=$!
  loop_wait "$LOOP_WAIT_PID" || rc=$?
  LOOP_WAIT_PID=""
  ((rc == 0)) || nodes_exit "$rc" "the $phase barrier of iteration $n"
}

# nodes_sync <iteration> <phase> [data-json] [var]: arrive at the barrier (with
# data for the others), then wait until every rank has, while they live; with
# <var>, the associative array of that name receives the arrivals' data.
nodes_sync() {
  nodes_multi || return 0
  local n=$1 phase=$2 data=${3:-} out key value
  local -a extra=()
  [[ -z $data ]] || extra=(--data "$data")
  nodes_cli arrive --run-id "$NODES_RUN_ID" --rank "$RUN_RANK" --iteration "$n" --phase "$phase" \
    --pid $$ "${extra[@]}" || nodes_exit $? "arriving at the $phase barrier of iteration $n"
  if [[ -z ${4:-} ]]; then
    nodes_wait_bg /dev/null "$n" "$phase"
    return 0
  fi
  local -n got=$4
  out=$(mktemp)
  nodes_wait_bg "$out" "$n" "$phase" --print-data
  got=()
  # shellcheck disable=SC2034 # a nameref: the caller's array
  while IFS=$'\t' read -r key value; do got["$key"]=$value; done <"$out"
  rm -f "$out"
}

# nodes_publish <step> <phase> <data-json>: the master tells every rank what it decided.
nodes_publish() {
  nodes_cli arrive --run-id "$NODES_RUN_ID" --rank 0 --iteration "$1" --phase "$2" --pid $$ --data "$3" ||
    nodes_exit $? "publishing the $2 of step $1"
}

# nodes_receive <step> <phase> <var>: a worker waits for the master's decision
# and stores its key<TAB>value lines in the associative array named <var>.
nodes_receive() {
  local step=$1 phase=$2 out key value
  local -n into=$3
  out=$(mktemp)
  nodes_wait_bg "$out" "$step" "$phase" --ranks 0 --print-data --report-every 600
  into=()
  # shellcheck disable=SC2034 # a nameref: the caller's array
  while IFS=$'\t' read -r key value; do into["$key"]=$value; done <"$out"
  rm -f "$out"
}

# nodes_exit <code> <what>: end this node after a protocol outcome: 3 another
# rank failed or died (exit 1), 4 the run was stopped (exit 143, like SIGTERM),
# 5 this rank was evicted (exit 1), 6 the run finished (exit 0: the master ran
# the last step and exited).
nodes_exit() {
  local code=$1 what=$2
  case "$code" in
    3) common_die 1 "$what: another rank failed or died (above); stopping this node. Fix it, then start every node again with --resume" ;;
    4)
      NODES_STOPPED=1
      common_log "the run was asked to stop ($what); this node stops"
      exit 143
      ;;
    5) common_die 1 "$what: this rank was evicted by the master (declared dead); restart it with --resume to join again" ;;
    6)
      common_log "$what: the run finished (the master ran its last step and exited); this node stops"
      exit 0
      ;;
    2) common_die 2 "$what: bad input (above)" ;;
    *) common_die 1 "$what failed (exit $code)" ;;
  esac
}

# nodes_ended: print why the heartbeat stopped this node ("<code>\t<reason>"), if it did.
nodes_ended() {
  [[ -n ${NODES_ENDED:-} && -s $NODES_ENDED ]] && cat "$NODES_ENDED"
  return 0
}

# nodes_leave <exit code>: the EXIT trap's part: on a failure of this node,
# flag it so that the other ranks stop at once instead of waiting; report why
# the heartbeat ended this node; the master of a run that ended well says so
# (finished.json), so that a node still running (a rank that rejoined, one still
# reloading its vLLM) stops with exit 0 instead of taking the master's silence
# for its death. Sets NODES_EXIT, the exit code run.sh ends with.
nodes_leave() {
  local rc=$1 ended code reason
  NODES_EXIT=$rc
  nodes_unwatch_partners
  [[ -n ${NODES_RUN_ID:-} ]] || return 0
  ended=$(nodes_ended)
  if [[ -n $ended ]]; then
    IFS=$'\t' read -r code reason <<<"$ended"
    case "$code" in
      4) common_log "stopped: $reason" && rc=143 ;;
      3) common_warn "stopping this node: $reason; start every node again with --resume once it is fixed" && rc=1 ;;
      5) common_warn "this rank was evicted: $reason" && rc=1 ;;
      6) common_log "$reason; this node stops" && rc=0 ;;
    esac
  elif ((rc == 0)) && nodes_is_master; then
    nodes_cli finish --run-id "$NODES_RUN_ID" --reason "the master (rank 0) ran the run's last step and exited" ||
      common_warn "could not write the run's finished.json; a node still running will take the master for dead"
  elif ((rc == 130 || rc == 143)) && { nodes_is_master || slurm_in_step; } && ((!${NODES_STOPPED:-0})); then
    # Ctrl+C or SIGTERM on the master stops the whole run: a stop, not a failure. So does one on any
    # node of a Slurm step: Slurm signals every task at once (scancel, the time limit's signal, a requeue),
    # and a worker's signal taken as its failure would race the others' (exit 1 instead of 143).
    reason="SIGINT on"
    ((rc == 130)) || reason="SIGTERM on"
    if nodes_is_master; then reason+=" the master"; else reason+=" rank $RUN_RANK"; fi
    ! slurm_in_step || reason+=" (Slurm job ${SLURM_JOB_ID:-?}: scancel, the time limit or a requeue)"
    common_log "$reason: every node of the run stops; continue it with --resume"
    nodes_cli stop --run-id "$NODES_RUN_ID" --reason "$reason" 2>/dev/null || true
  elif ((rc != 0)) && ((!${NODES_STOPPED:-0})); then
    case "$rc" in
      130) reason="stopped by SIGINT" ;;
      143) reason="stopped by SIGTERM" ;;
      *) reason=${COMMON_LAST_ERROR:-run.sh exited $rc} ;;
    esac
    nodes_cli fail --run-id "$NODES_RUN_ID" --rank "$RUN_RANK" --iteration "${LOOP_N:-0}" \
      --phase "${LOOP_PHASE:-run}" --reason "$reason" --exit-code "$rc" \
      --pid $$ 2>/dev/null || true
  fi
  # shellcheck disable=SC2034 # read by loop_cleanup
  NODES_EXIT=$rc
}
