#!/usr/bin/env bats
# run.sh's command line: every rule of the argument table exits 2 with one clear
# message before anything is written; --help; --dry-run prints each phase's command.

bats_require_minimum_version 1.5.0

setup() {
  ROOT=$(cd "$BATS_TEST_DIRNAME/../.." && pwd -P)
  DATA="$BATS_TEST_TMPDIR/data"
  LOG="$BATS_TEST_TMPDIR/log"
  mkdir -p "$DATA"
  unset RANK NODE_RANK
  local var
  for var in $(compgen -e SLURM); do unset "$var"; done # outside any Slurm step (tests/shell/slurm.bats)
}

load bad_input

# run_bad <expected message part> <args...>: run.sh must exit 2, say it, write nothing.
run_bad() {
  expect_bad "$1" bash "$ROOT/scripts/run.sh" "${@:2}"
}

@test "--help prints the usage and exits 0" {
  run -0 bash "$ROOT/scripts/run.sh" --help
  [[ $output == *"usage: bash scripts/run.sh --data-path DIR --log-path DIR --rl-phase"* ]]
  [[ $output == *"--eval-interval N"* && $output == *"--max-iterations N"* && $output == *"--dry-run"* ]]
}

@test "required flags: data path, log path, phase" {
  run_bad "--data-path is required" --log-path "$LOG" --rl-phase update
  run_bad "--log-path is required" --data-path "$DATA" --rl-phase update
  run_bad "--rl-phase is required: rollout, update or both" --data-path "$DATA" --log-path "$LOG"
  run_bad "--rl-phase must be rollout, update or both (got 'train')" --data-path "$DATA" --log-path "$LOG" --rl-phase train
}

@test "paths must be absolute, the data path must exist, the log path must be a directory" {
  run_bad "--data-path must be an absolute path (got 'data')" --data-path data --log-path "$LOG" --rl-phase update
  run_bad "--log-path must be an absolute path (got 'exp1')" --data-path "$DATA" --log-path exp1 --rl-phase update
  run_bad "--data-path $BATS_TEST_TMPDIR/nope is not a directory" --data-path "$BATS_TEST_TMPDIR/nope" \
    --log-path "$LOG" --rl-phase update
  touch "$BATS_TEST_TMPDIR/file"
  run -2 --separate-stderr bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$BATS_TEST_TMPDIR/file" --rl-phase update
  [[ $stderr == *"exists and is not a directory"* ]]
  [ ! -s "$BATS_TEST_TMPDIR/file" ]
}

@test "--eval-interval: required with both, an integer >= 1, and only with both" {
  run_bad "--rl-phase both requires --eval-interval N" --data-path "$DATA" --log-path "$LOG" --rl-phase both
  run_bad "--eval-interval must be an integer >= 1 (got '0')" --data-path "$DATA" --log-path "$LOG" --rl-phase both --eval-interval 0
  run_bad "--eval-interval must be an integer >= 1 (got 'x')" --data-path "$DATA" --log-path "$LOG" --rl-phase both --eval-interval x
  run_bad "--eval-interval applies to --rl-phase both only (got --rl-phase update)" --data-path "$DATA" \
    --log-path "$LOG" --rl-phase update --eval-interval 2
}

@test "--rollout-split: required with rollout, one of two values, and only with rollout" {
  run_bad "--rl-phase rollout requires --rollout-split train-only or eval-only" --data-path "$DATA" --log-path "$LOG" --rl-phase rollout
  run_bad "--rollout-split must be train-only or eval-only (got 'both')" --data-path "$DATA" --log-path "$LOG" \
    --rl-phase rollout --rollout-split both
  run_bad "--rollout-split applies to --rl-phase rollout only (got --rl-phase both)" --data-path "$DATA" \
    --log-path "$LOG" --rl-phase both --eval-interval 1 --rollout-split train-only
}

@test "nodes: --num-nodes, --rank-weights, --master/--worker, RANK and NODE_RANK" {
  local -a base=(--data-path "$DATA" --log-path "$LOG" --rl-phase update)
  run_bad "--num-nodes must be an integer >= 1 (got '0')" "${base[@]}" --num-nodes 0
  run_bad "--num-nodes 2 requires --rank-weights with 2 values, e.g. \"1,1\"" "${base[@]}" --num-nodes 2 --master
  run_bad "--rank-weights needs exactly 2 values for --num-nodes 2 (got '1,1,1')" "${base[@]}" --num-nodes 2 --rank-weights 1,1,1 --master
  run_bad "--rank-weights values must be integers >= 1 (got '0' in '1,0')" "${base[@]}" --num-nodes 2 --rank-weights 1,0 --master
  run_bad "--master and --worker 1 are exclusive" "${base[@]}" --num-nodes 2 --rank-weights 1,1 --master --worker 1
  run_bad "--worker must be an integer in 1..1 for --num-nodes 2 (got '2')" "${base[@]}" --num-nodes 2 --rank-weights 1,1 --worker 2
  run_bad "--worker 1 needs --num-nodes > 1 (got 1)" "${base[@]}" --worker 1
  run_bad "--rank-weights needs exactly 1 value with --num-nodes 1 (got '1,1')" "${base[@]}" --rank-weights 1,1
  run_bad "--num-nodes 2 needs this node's rank: --master, --worker R, RANK / NODE_RANK in the environment, or one srun task per node (SLURM_PROCID; docs/slurm.md)" \
    "${base[@]}" --num-nodes 2 --rank-weights 1,1
  RANK=5 run_bad "RANK must be an integer in 0..1 for --num-nodes 2 (got '5')" "${base[@]}" --num-nodes 2 --rank-weights 1,1
  NODE_RANK=x run_bad "NODE_RANK must be an integer in 0..1" "${base[@]}" --num-nodes 2 --rank-weights 1,1
}

@test "--node-addr is a host or an address; --stop needs the log path of a run" {
  local -a base=(--data-path "$DATA" --log-path "$LOG" --rl-phase rollout --rollout-split eval-only)
  run_bad "--node-addr must be a host name or an IP address (got 'a b')" "${base[@]}" --num-nodes 2 --rank-weights 1,1 \
    --master --node-addr "a b"
  BATON_NODE_ADDR='x;y' run_bad "--node-addr must be a host name or an IP address (got 'x;y')" "${base[@]}"
  run_bad "--stop needs the --log-path of a run (an existing absolute path; got '$LOG')" --stop --log-path "$LOG"
  mkdir -p "$LOG"
  run -1 --separate-stderr bash "$ROOT/scripts/run.sh" --stop --log-path "$LOG"
  [[ $stderr == *"nothing to stop: no run.sh of --log-path $LOG runs on this host"* ]]
}

@test "--max-iterations and --max-update-failures are integers >= 1" {
  local -a base=(--data-path "$DATA" --log-path "$LOG" --rl-phase rollout --rollout-split eval-only)
  run_bad "--max-iterations must be an integer >= 1 (got '0')" "${base[@]}" --max-iterations 0
  run_bad "--max-update-failures must be an integer >= 1 (got '-1')" "${base[@]}" --max-update-failures -1
}

@test "--on-rank-failure is abort or continue" {
  local -a base=(--data-path "$DATA" --log-path "$LOG" --rl-phase rollout --rollout-split eval-only)
  run_bad "--on-rank-failure must be abort or continue (got 'ignore')" "${base[@]}" --on-rank-failure ignore
  run_bad "--on-rank-failure is given twice ('abort' and 'continue'); give it once" "${base[@]}" \
    --on-rank-failure abort --on-rank-failure continue
}

@test "--dashboard-port is a TCP port in 1..65535, given once" {
  local -a base=(--data-path "$DATA" --log-path "$LOG" --rl-phase rollout --rollout-split eval-only)
  local fix="; e.g. --dashboard-port 8080, or drop it"
  run_bad "--dashboard-port must be a TCP port in 1..65535 (got 'web')$fix" "${base[@]}" --dashboard-port web
  run_bad "--dashboard-port must be a TCP port in 1..65535 (got '0')$fix" "${base[@]}" --dashboard-port 0
  run_bad "--dashboard-port must be a TCP port in 1..65535 (got '70000')$fix" "${base[@]}" --dashboard-port 70000
  run_bad "--dashboard-port must be a TCP port in 1..65535 (got '-1')$fix" "${base[@]}" --dashboard-port -1
  run_bad "--dashboard-port needs a value" "${base[@]}" --dashboard-port
  run_bad "--dashboard-port is given twice ('8080' and '8081'); give it once" "${base[@]}" \
    --dashboard-port 8080 --dashboard-port 8081
}

@test "--wait-timeout: update only, whole seconds >= 0" {
  run_bad "--wait-timeout applies to --rl-phase update only (got --rl-phase both)" \
    --data-path "$DATA" --log-path "$LOG" --rl-phase both --eval-interval 1 --wait-timeout 10
  run_bad "--wait-timeout must be a number of seconds >= 0 (got '1.5')" \
    --data-path "$DATA" --log-path "$LOG" --rl-phase update --wait-timeout 1.5
}

@test "unknown arguments, flags without values and repeated flags are refused" {
  run_bad "unknown argument 'foo'" --data-path "$DATA" --log-path "$LOG" --rl-phase update foo
  run_bad "unknown option '--bogus=1'" --data-path "$DATA" --log-path "$LOG" --rl-phase update --bogus=1
  run_bad "--eval-interval needs a value" --data-path "$DATA" --log-path "$LOG" --rl-phase both --eval-interval
  run_bad "--rl-phase is given twice ('update' and 'both')" --data-path "$DATA" --log-path "$LOG" --rl-phase update --rl-phase both
}


@test "--final-eval needs --rl-phase both and --max-iterations; BATON_VLLM_DTYPE must be a dtype" {
  run_bad "--final-eval needs --rl-phase both and --max-iterations N" \
    --data-path "$DATA" --log-path "$LOG" --rl-phase both --eval-interval 1 --final-eval
  run_bad "--final-eval needs --rl-phase both and --max-iterations N" \
    --data-path "$DATA" --log-path "$LOG" --rl-phase rollout --rollout-split eval-only --max-iterations 1 --final-eval
  BATON_VLLM_DTYPE=fp32 run_bad "BATON_VLLM_DTYPE must be auto, float32, bfloat16 or float16 (got 'fp32')" \
    --data-path "$DATA" --log-path "$LOG" --rl-phase both --eval-interval 1
}
