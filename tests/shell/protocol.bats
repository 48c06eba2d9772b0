#!/usr/bin/env bats
# The protocol CLI (python -m coordinator; coordinator/protocol_cli.py) from bash: barriers of background ranks, heartbeats,
# failures and deadlines, with the exit codes run.sh relies on.

bats_require_minimum_version 1.5.0

setup() {
  load hang_bound
  ROOT=$(cd "$BATS_TEST_DIRNAME/../.." && pwd -P)
  source "$ROOT/scripts/lib/common.sh"
  source "$ROOT/scripts/lib/envs.sh"
  cd "$ROOT" || return 1
  CLI=("$(envs_python app)" -m coordinator)
  LOG="$BATS_TEST_TMPDIR/log"
  BG=()
}

teardown() {
  local pid
  for pid in "${BG[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
}

# start: start a run of 3 nodes with short intervals; sets RUN.
start() {
  RUN=$("${CLI[@]}" start-run --log-path "$LOG" --num-nodes 3 --rank-weights 1,1,1 \
    --heartbeat-interval 0.1 --dead-after 1 --pid $$)
}

# wait_rc <pid>: wait for a background process and set RC to its exit code (`run wait` cannot: a subshell).
wait_rc() {
  RC=0
  wait "$1" || RC=$?
}

# bg <cmd...>: run <cmd> in the background (stopped by teardown); sets LAST to its pid.
bg() {
  "$@" 3>&- &
  LAST=$!
  BG+=("$LAST")
}

# beat <rank> [args...]: a heartbeat process for <rank> in the background; sets LAST.
beat() {
  bg "${CLI[@]}" heartbeat --log-path "$LOG" --run-id "$RUN" --rank "$@"
}

# seq_of <rank>: the sequence number in <rank>'s heartbeat file (0 while there is none).
seq_of() {
  local line
  line=$(cat "$LOG/cluster/runs/$RUN/heartbeat/rank_$1" 2>/dev/null) || line=0
  printf '%s\n' "${line%% *}"
}

@test "three ranks in the background pass a barrier together, not before the last arrives" {
  start
  local r
  for r in 0 1 2; do beat "$r"; done
  for r in 1 2; do
    run -0 --separate-stderr "${CLI[@]}" join --log-path "$LOG" --rank "$r" --num-nodes 3 --rank-weights 1,1,1 \
      --wait 10 --pid $$
    [ "$output" = "$RUN" ]
  done
  local -a ranks=()
  for r in 0 1 2; do
    ((r < 2)) || sleep 0.6
    {
      "${CLI[@]}" arrive --log-path "$LOG" --run-id "$RUN" --rank "$r" --iteration 1 --phase rollout_done &&
        "${CLI[@]}" wait --log-path "$LOG" --run-id "$RUN" --rank "$r" --iteration 1 --phase rollout_done --poll 0.05 &&
        date +%s.%N >"$BATS_TEST_TMPDIR/released_$r"
    } 3>&- &
    ranks+=($!)
    if ((r == 1)); then
      sleep 0.2
      [ ! -e "$BATS_TEST_TMPDIR/released_0" ] # nobody passes while rank 2 is missing
    fi
  done
  for r in 0 1 2; do wait "${ranks[$r]}"; done
  for r in 0 1 2; do [ -s "$BATS_TEST_TMPDIR/released_$r" ]; done
  [ -e "$LOG/cluster/runs/$RUN/barriers/iter_0001/rollout_done/rank_2.json" ]
  run -0 "${CLI[@]}" status --log-path "$LOG" --window 0.5
  local row='^0 +[^ ]+ +[0-9]+ +seq [0-9]+ +alive +iter_0001 rollout_done$'
  [[ ${lines[3]} =~ $row ]]
  [[ ${lines[5]} =~ ^2\ .*\ alive\ +iter_0001\ rollout_done$ ]]
}

@test "a heartbeat renews its sequence and exits 0 soon after SIGTERM" {
  start
  beat 0
  local i first
  for ((i = 0; i < 50; i++)); do (($(seq_of 0) > 0)) && break || sleep 0.1; done
  first=$(seq_of 0)
  ((first > 0))
  # it goes on renewing it (every 0.1 s; 30 s of looking only fails a heartbeat that stopped)
  for ((i = 0; i < 300; i++)); do (($(seq_of 0) >= first + 2)) && break || sleep 0.1; done
  (($(seq_of 0) >= first + 2))
  kill -TERM "$LAST"
  # it sleeps at most an interval (0.1 s) before it sees the signal: one that did not would beat on
  ends_within 30 "$LAST" "the heartbeat after SIGTERM"
  wait_rc "$LAST"
  [ "$RC" = 0 ] # its own clean exit, not SIGTERM's default death (143)
}

@test "a heartbeat ends by itself when the run is asked to stop (exit 4)" {
  start
  beat 1
  run -0 "${CLI[@]}" stop --log-path "$LOG" --reason "operator request"
  wait_rc "$LAST"
  [ "$RC" = 4 ]
}

@test "a heartbeat stops (exit 1) when its node's process is gone, so a dead node never looks alive" {
  start
  bg sleep 300
  local node=$LAST
  beat 1 --node-pid "$node" 2>"$BATS_TEST_TMPDIR/beat.err"
  sleep 0.3
  kill "$node"
  wait_rc "$LAST"
  [ "$RC" = 1 ]
  [ "$(cat "$BATS_TEST_TMPDIR/beat.err")" = "[baton] heartbeat of rank 1: its node's process $node exited; stopping" ]
}

@test "wait exits 3 naming the rank as soon as that rank writes fail" {
  start
  bg "${CLI[@]}" wait --log-path "$LOG" --run-id "$RUN" --rank 0 --iteration 2 --phase train_done --dead-after 30 \
    >"$BATS_TEST_TMPDIR/wait.out" 2>&1
  local waiter=$LAST
  sleep 0.3
  run -0 "${CLI[@]}" fail --log-path "$LOG" --run-id "$RUN" --rank 2 --iteration 2 --phase train \
    --reason "llamafactory-cli exited 1" --exit-code 1
  wait_rc "$waiter"
  [ "$RC" = 3 ]
  [ "$(cat "$BATS_TEST_TMPDIR/wait.out")" = "[baton] error: rank 2: failed in train of iteration 2: llamafactory-cli exited 1" ]
}

@test "partner-failed exits 0 naming the first other rank that arrives with a failed part, not a good one" {
  start
  bg "${CLI[@]}" partner-failed --log-path "$LOG" --run-id "$RUN" --rank 1 --iteration 2 --phase update \
    --key train_exit --poll 0.05 >"$BATS_TEST_TMPDIR/partner.out"
  local watcher=$LAST
  run -0 "${CLI[@]}" arrive --log-path "$LOG" --run-id "$RUN" --rank 2 --iteration 2 --phase update \
    --data '{"train_exit": 0}'
  run -0 "${CLI[@]}" arrive --log-path "$LOG" --run-id "$RUN" --rank 1 --iteration 2 --phase update \
    --data '{"train_exit": 1}' # its own arrival is not a partner's
  sleep 0.3
  kill -0 "$watcher" # still watching: nobody else failed
  run -0 "${CLI[@]}" arrive --log-path "$LOG" --run-id "$RUN" --rank 0 --iteration 2 --phase update \
    --data '{"exit": 1, "train_exit": 1}'
  wait_rc "$watcher"
  [ "$RC" = 0 ]
  [ "$(cat "$BATS_TEST_TMPDIR/partner.out")" = "$(printf '0\t1')" ]
}

@test "wait exits 3 when a rank's heartbeat process is killed" {
  start
  beat 0
  beat 1
  local killed=$LAST
  beat 2
  sleep 0.3
  kill -KILL "$killed"
  run -3 --separate-stderr "${CLI[@]}" wait --log-path "$LOG" --run-id "$RUN" --rank 0 --iteration 0 --phase start
  [[ $stderr == "[baton] error: rank 1: dead: no heartbeat change seen for 1 s" ]]
}

@test "a deadline exits 1 naming the missing ranks" {
  start
  run -0 "${CLI[@]}" arrive --log-path "$LOG" --run-id "$RUN" --rank 1 --iteration 0 --phase start
  run -1 --separate-stderr "${CLI[@]}" wait --log-path "$LOG" --run-id "$RUN" --rank 1 --iteration 0 --phase start \
    --timeout 0.3 --dead-after 30
  [ "$stderr" = "[baton] error: barrier start of iteration 0: ranks 0, 2 missing after 0.3 s" ]
}

@test "a second master is refused while the first beats; other node counts are refused naming both (exit 2)" {
  start
  beat 0
  run -1 --separate-stderr "${CLI[@]}" start-run --log-path "$LOG" --num-nodes 3 --rank-weights 1,1,1 \
    --alive-window 5 --pid $$
  [[ $stderr == *"[baton] error: another master is running on $LOG: run $RUN of "*" still beats; stop it first"* ]]
  run -2 --separate-stderr "${CLI[@]}" join --log-path "$LOG" --rank 1 --num-nodes 2 --rank-weights 1,1 \
    --wait 5 --pid $$
  [[ $stderr == *"this node has --num-nodes 2 --rank-weights 1,1 but the running master"*"has --num-nodes 3 --rank-weights 1,1,1; give every node the same values" ]]
  run -2 --separate-stderr "${CLI[@]}" wait --log-path "$LOG" --run-id nope --rank 1 --iteration 0 --phase start
  [[ $stderr == "[baton] error: --run-id nope names no run on $LOG ("*"/cluster/runs/nope is missing)" ]]
}

@test "a split deployment's rollout run and update run coordinate apart (--group), beside a both run's files" {
  start
  beat 0
  run -0 --separate-stderr "${CLI[@]}" start-run --log-path "$LOG" --group rollout --num-nodes 2 --rank-weights 1,1 \
    --alive-window 0.5 --pid $$
  local rollout=$output
  run -0 --separate-stderr "${CLI[@]}" start-run --log-path "$LOG" --group update --num-nodes 2 --rank-weights 1,1 \
    --alive-window 0.5 --pid $$
  local update=$output
  [[ $rollout != "$update" && $rollout != "$RUN" ]]
  [ -d "$LOG/roles/rollout/cluster/runs/$rollout" ] && [ -d "$LOG/roles/update/cluster/runs/$update" ]
  [ -d "$LOG/cluster/runs/$RUN" ] && [ ! -e "$LOG/cluster/runs/$rollout" ]
  run -0 "${CLI[@]}" stop --log-path "$LOG" --group rollout --reason "test"
  [ -f "$LOG/roles/rollout/cluster/runs/$rollout/stop.json" ] && [ ! -e "$LOG/roles/update/cluster/runs/$update/stop.json" ]
}

@test "a second stop request keeps the first one's reason (every node reports why the run stopped)" {
  start
  run -0 "${CLI[@]}" stop --log-path "$LOG" --reason "operator: disk full"
  run -0 --separate-stderr "${CLI[@]}" stop --log-path "$LOG" --reason "SIGTERM on the master"
  [[ $stderr == *"was already asked to stop: operator: disk full"* ]]
  grep -q '"reason": "operator: disk full"' "$LOG/cluster/runs/$RUN/stop.json"
}

@test "continue: a worker restarted with the same host name and pid (a container) joins again after its eviction" {
  [[ $(id -u) == 0 ]] || skip "needs root: each worker runs as pid 1 of its own PID and UTS namespaces (unshare)"
  bg bash -c 'trap "" USR1 && exec sleep 300' # the master's node (an eviction signals it: SIGUSR1)
  local master=$LAST
  RUN=$("${CLI[@]}" start-run --log-path "$LOG" --num-nodes 2 --rank-weights 1,1 --on-rank-failure continue \
    --heartbeat-interval 0.1 --dead-after 1 --pid "$master")
  beat 0 --node-pid "$master" --stop-node 2>"$BATS_TEST_TMPDIR/master.err" # its watch evicts a silent worker
  # container: pid 1 in a fresh PID namespace, host name node1; it joins and dies without beating
  local -a worker=(unshare --pid --fork --mount-proc --uts sh -c
    "hostname node1 && exec $(printf '%q ' "${CLI[@]}") join --log-path '$LOG' --rank 1 --num-nodes 2 --rank-weights 1,1 --pid 1 --wait 10")
  run -0 --separate-stderr "${worker[@]}"
  [ "$output" = "$RUN" ]
  local i
  for ((i = 0; i < 100; i++)); do [[ -f $LOG/cluster/runs/$RUN/evicted/rank_1.json ]] && break || sleep 0.1; done
  [[ -f $LOG/cluster/runs/$RUN/evicted/rank_1.json ]]
  # the container restarts: the same host name and pid, a new process
  run -0 --separate-stderr "${worker[@]}"
  [ "$output" = "$RUN" ]
}
