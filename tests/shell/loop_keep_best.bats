#!/usr/bin/env bats
# loop.sh's loop_keep_best (--keep-best): after a held-out rollout, the master asks
# `python -m coordinator keep-best` on canned metrics.jsonl rows and, for a worse policy,
# runs the revert promotion (`python -m training phase=revert`, in the train environment: the update's
# process looks up the node's device with torch first) that serves the best one again as a new version.

bats_require_minimum_version 1.5.0

setup() {
  ROOT=$(cd "$BATS_TEST_DIRNAME/../.." && pwd -P)
  source "$ROOT/scripts/lib/common.sh"
  source "$ROOT/scripts/lib/procs.sh"
  source "$ROOT/scripts/lib/iteration.sh"
  source "$ROOT/scripts/lib/nodes.sh"
  source "$ROOT/scripts/lib/loop.sh"
  RUN_LOG="$BATS_TEST_TMPDIR/log" RUN_PHASE=both RUN_DEBUG=0 RUN_NUM_NODES=1 RUN_RANK=0 RUN_KEEP_BEST=1
  RUN_KEEP_BEST_MARGIN=0 LOOP_ROOT=$ROOT LOOP_RUN_DIR="$RUN_LOG/run/rank_0" LOOP_PINNED=0 LOOP_WATCH=watch
  LOOP_BASE_MODEL="$BATS_TEST_TMPDIR/base" LOOP_UPDATE_OVR=()
  BATON_PROGRESS_S=0
  mkdir -p "$LOOP_RUN_DIR/logs"
  model "$LOOP_BASE_MODEL" w0
}

# model <dir> <weights>: a model folder (config.json without tied embeddings, one fake weights file).
model() {
  mkdir -p "$1"
  printf '{}\n' >"$1/config.json"
  printf '%s\n' "$2" >"$1/model.safetensors"
}

# policy <version>...: promoted versions v<NNNN> (parent: the one before), current the last.
policy() {
  local v parent=null
  for v in "$@"; do
    model "$RUN_LOG/policy/$(printf 'v%04d' "$v")" "w$v"
    printf '{"version": %d, "iteration": %d, "parent": %s}\n' "$v" "$v" "$parent" \
      >"$RUN_LOG/policy/$(printf 'v%04d' "$v")/baton_policy.json"
    parent=$v
  done
  ln -sfn "$(printf 'v%04d' "$v")" "$RUN_LOG/policy/current"
}

# held_out <iteration> <version|null> <success rate>: the test rollout record of an iteration.
held_out() {
  printf '{"kind": "rollout", "split": "test", "iteration": %d, "policy_version": %s, "success_rate": %s, "ok_episodes": 40}\n' \
    "$1" "$2" "$3" >>"$RUN_LOG/metrics.jsonl"
}

@test "a policy as good as the best is kept: nothing promoted" {
  policy 1 2 3 4
  held_out 3 2 0.2
  held_out 5 4 0.2
  run -0 --separate-stderr loop_keep_best 5
  [ "$stderr" = "" ]
  [ "$(readlink "$RUN_LOG/policy/current")" = v0004 ]
  [ ! -e "$RUN_LOG/policy/v0005" ]
  [ "$(grep -c '"kind": "revert"' "$RUN_LOG/metrics.jsonl")" = 0 ]
}

@test "a policy within the margin is kept, and says so" {
  policy 1 2 3 4
  held_out 3 2 0.2
  held_out 5 4 0.125
  RUN_KEEP_BEST_MARGIN=10
  run -0 --separate-stderr loop_keep_best 5
  [ "$stderr" = "[baton] iteration 5: held-out 12.5 % for v4, best 20.0 % for v2: within 10 points, keeping v4 (--keep-best)" ]
  [ "$(readlink "$RUN_LOG/policy/current")" = v0004 ]
}

@test "a worse policy: the best's weights are promoted as the next version, logged once and recorded" {
  policy 1 2 3 4
  held_out 1 null 0.1
  held_out 3 2 0.2
  held_out 5 4 0.125
  run -0 --separate-stderr loop_keep_best 5
  [[ $stderr == *"[baton] held-out 12.5 % for v4 < 20.0 % for v2 (best): serving v2 again as v5 (--keep-best)"* ]]
  [ "$(grep -c 'serving v2 again' <<<"$stderr")" = 1 ]
  [ "$(readlink "$RUN_LOG/policy/current")" = v0005 ]
  [ "$(cat "$RUN_LOG/policy/v0005/model.safetensors")" = w2 ]
  run -0 "$BATON_APP_PY" -c 'import json, sys; r = json.load(open(sys.argv[1])); print(r["parent"], r["reverted_to"], r["iteration"], r["why"]["replaced"])' \
    "$RUN_LOG/policy/v0005/baton_policy.json"
  [ "$output" = "4 2 5 4" ]
  [ "$(grep -c '"kind": "revert", "iteration": 5, .*"policy_version": 5, "reverted_to": 2' "$RUN_LOG/metrics.jsonl")" = 1 ]
  [ "$(readlink "$RUN_LOG/policy/best")" = v0002 ] # kept by pruning while it is the best
}

@test "a resumed iteration is not reverted twice, even when the run died before the revert's record" {
  policy 1 2 3 4
  held_out 3 2 0.2
  held_out 5 4 0.125
  loop_keep_best 5 2>/dev/null
  run -0 --separate-stderr loop_keep_best 5 # --resume after the revert: nothing more
  [ "$stderr" = "" ]
  grep -v '"kind": "revert"' "$RUN_LOG/metrics.jsonl" >"$BATS_TEST_TMPDIR/m" && mv "$BATS_TEST_TMPDIR/m" "$RUN_LOG/metrics.jsonl"
  run -0 --separate-stderr loop_keep_best 5 # died between the promotion and its record: the same version again
  [[ $stderr == *"serving v2 again as v5 (--keep-best)"* ]]
  [ ! -e "$RUN_LOG/policy/v0006" ] && [ "$(readlink "$RUN_LOG/policy/current")" = v0005 ]
  [ "$(grep -c '"kind": "revert"' "$RUN_LOG/metrics.jsonl")" = 1 ]
}

@test "the base model as the best: its folder becomes the next version" {
  policy 1
  held_out 1 null 0.3
  held_out 2 1 0.1
  run -0 --separate-stderr loop_keep_best 2
  [[ $stderr == *"[baton] held-out 10.0 % for v1 < 30.0 % for the base model (best): serving the base model again as v2 (--keep-best)"* ]]
  [ "$(cat "$RUN_LOG/policy/current/model.safetensors")" = w0 ]
  [ ! -e "$RUN_LOG/policy/best" ]
}

@test "no held-out rollout this iteration: nothing to decide" {
  policy 1
  held_out 1 null 0.3
  run -0 --separate-stderr loop_keep_best 2
  [ "$stderr" = "" ]
  [ "$(readlink "$RUN_LOG/policy/current")" = v0001 ]
}
