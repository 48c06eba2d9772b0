#!/usr/bin/env bats
# run.sh under Slurm (docs/slurm.md): the rank and node count from
# SLURM_PROCID / SLURM_NTASKS in a task of an srun step, after --master/--worker
# and RANK / NODE_RANK; a mismatch with Slurm's view exits 2 with one message;
# rank 0's default address. (The host list and a step's task: tests/unit/driver/test_cli.py;
# SIGTERM on any node of a step stopping the whole run: tests/unit/driver/test_nodes.py's
# leave; scripts/slurm/baton.sbatch: slurm_sbatch.bats; a real Slurm: tests/e2e/test_slurm.py.)

bats_require_minimum_version 1.5.0

load bad_input

setup() {
  load fake_data
  fake_data_setup # (outside any Slurm step: no SLURM_* variables)
  fake_tasks
  unset RANK NODE_RANK BATON_NODE_ADDR BATON_NODE_FILE
}

# in_step <procid> <ntasks>: the environment srun gives task <procid> of <ntasks> (job 7, step 0, nodes n0 and n1).
in_step() {
  export SLURM_JOB_ID=7 SLURM_STEP_ID=0 SLURM_PROCID=$1 SLURM_NTASKS=$2 SLURM_JOB_NODELIST="n[0-1]"
  export SLURMD_NODENAME="n$1"
}

# in_batch_shell: the environment a batch script's own shell has (job 7 of 2 tasks; no step).
in_batch_shell() {
  export SLURM_JOB_ID=7 SLURM_PROCID=0 SLURM_NTASKS=2
}

# dry <args...>: run.sh --dry-run of a rollout (train-only) with <args>; must exit 0. With --debug-mode (an
# external server): the ranks are what these tests check, and the dry run then skips vLLM's parser of the
# server's command line (about 10 s an import of vLLM; tests/shell/run_iteration.bats checks that line).
dry() {
  run -0 --separate-stderr bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" --rl-phase rollout \
    --rollout-split train-only --dry-run --debug-mode "$@"
}

# bad <expected message part> <args...>: run.sh must exit 2, say it, write nothing.
bad() {
  expect_bad "$1" bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" "${@:2}"
}

@test "under srun each task is a node: the rank from SLURM_PROCID, the node count from SLURM_NTASKS" {
  in_step 1 2
  dry --rank-weights 2,1
  [[ $output == *"# Slurm job 7 step 0: task 1 of 2 on n1; rank 1 of 2 from SLURM_PROCID / SLURM_NTASKS"* ]]
  [[ $(grep '^\[train rollout\]' <<<"$output") == *" iteration=1 rank=1 rank_weights="'\[2\,1\]'" "* ]]
  dry --num-nodes 2 --rank-weights 1,1 # --num-nodes may be given: it agrees
  [[ $(grep '^\[train rollout\]' <<<"$output") == *" rank=1 rank_weights="'\[1\,1\]'" "* ]]
  in_step 0 1 # one task: a single node
  dry
  [[ $output == *"# Slurm job 7 step 0: task 0 of 1 on n0"* && $output != *"from SLURM_PROCID"* ]]
  [[ $(grep '^\[train rollout\]' <<<"$output") == *" rank=0 rank_weights="'\[1\]'" "* ]]
}

@test "precedence: --master / --worker, then RANK / NODE_RANK, then Slurm" {
  in_step 1 2
  dry --num-nodes 2 --rank-weights 1,1 --master
  [[ $(grep '^\[train rollout\]' <<<"$output") == *" rank=0 "* && $output != *"from SLURM_PROCID"* ]]
  in_step 0 2
  dry --num-nodes 2 --rank-weights 1,1 --worker 1
  [[ $(grep '^\[train rollout\]' <<<"$output") == *" rank=1 "* ]]
  RANK=1 dry --num-nodes 2 --rank-weights 1,1
  [[ $(grep '^\[train rollout\]' <<<"$output") == *" rank=1 "* ]]
  NODE_RANK=1 dry --num-nodes 2 --rank-weights 1,1
  [[ $(grep '^\[train rollout\]' <<<"$output") == *" rank=1 "* ]]
  # the rank given otherwise, Slurm's task count is not the node count: these flags are the run's
  in_step 0 3
  dry --num-nodes 2 --rank-weights 1,1 --master
  [[ $(grep '^\[train rollout\]' <<<"$output") == *" rank=0 rank_weights="'\[1\,1\]'" "* ]]
}

@test "a mismatch with Slurm's view exits 2 naming the field, the value and the fix, before anything is written" {
  local -a rollout=(--rl-phase rollout --rollout-split train-only)
  in_step 1 2
  bad "--num-nodes 3 does not match this Slurm step's SLURM_NTASKS=2 (each task is one node); start one task per node (sbatch or srun --nodes=3 --ntasks-per-node=1), or give --num-nodes 2" \
    "${rollout[@]}" --num-nodes 3 --rank-weights 1,1,1
  bad "--num-nodes 1 does not match this Slurm step's SLURM_NTASKS=2" "${rollout[@]}" --num-nodes 1
  bad "--num-nodes 2 (from SLURM_NTASKS) requires --rank-weights with 2 values, e.g. \"1,1\"" "${rollout[@]}"
  bad "--rank-weights needs exactly 2 values for --num-nodes 2 (from SLURM_NTASKS) (got '1,1,1')" "${rollout[@]}" \
    --rank-weights 1,1,1
  SLURM_NTASKS=two bad "SLURM_NTASKS must be an integer >= 1 in a Slurm step (got 'two'); give the rank with --master / --worker R" \
    "${rollout[@]}" --num-nodes 2 --rank-weights 1,1
  SLURM_PROCID=x bad "SLURM_PROCID must be an integer in 0..1 for --num-nodes 2 (got 'x')" "${rollout[@]}" --rank-weights 1,1
  bad "--num-nodes must be an integer >= 1 (got 'x')" "${rollout[@]}" --num-nodes x
}

@test "a batch script's own shell is no task: its SLURM_PROCID is not a rank" {
  in_batch_shell
  bad "--num-nodes 2 needs this node's rank: --master, --worker R, RANK / NODE_RANK in the environment, or one srun task per node (SLURM_PROCID; docs/slurm.md)" \
    --rl-phase rollout --rollout-split train-only --num-nodes 2 --rank-weights 1,1
  dry # a single node, whatever the job's task count
  [[ $output != *"Slurm job"* && $output != *"# rank "* ]]
}

@test "rank 0's default address is the first host of SLURM_JOB_NODELIST; --node-addr, BATON_NODE_ADDR win" {
  local -a update=(--rl-phase update --dry-run --rank-weights "1,1")
  fake_pythons_setup # the dry run of rank 0 runs the update-check: a fake train interpreter answers it
  in_step 0 2
  run -0 --separate-stderr bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" "${update[@]}"
  [[ $output == *"; address n0 (the first host of SLURM_JOB_NODELIST)"* ]]
  [[ $(grep '^\[update ' <<<"$output") == *" launch.node_addr=n0"* ]]
  BATON_NODE_ADDR=10.0.0.5 run -0 --separate-stderr bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" \
    "${update[@]}"
  [[ $(grep '^\[update ' <<<"$output") == *" launch.node_addr=10.0.0.5"* && $output != *"first host"* ]]
  run -0 --separate-stderr bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" "${update[@]}" \
    --node-addr 10.0.0.6
  [[ $(grep '^\[update ' <<<"$output") == *" launch.node_addr=10.0.0.6"* ]]
  # a worker learns the master's address from the run record: no hint of its own
  in_step 1 2
  run -0 --separate-stderr bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" "${update[@]}"
  [[ $(grep '^\[update ' <<<"$output") != *"launch.node_addr="* ]]
  # task 0 on another node than the list's first: no hint, and it says so
  in_step 0 2
  export SLURMD_NODENAME=n1
  run -0 --separate-stderr bash "$ROOT/scripts/run.sh" --data-path "$DATA" --log-path "$LOG" "${update[@]}"
  [[ $(grep '^\[update ' <<<"$output") != *"launch.node_addr="* ]]
  [[ $stderr == *"Slurm: task 0 runs on n1, not on the first host of SLURM_JOB_NODELIST (n0)"* ]]
}
