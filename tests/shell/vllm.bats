#!/usr/bin/env bats
# vllm.sh: a recorded vLLM is reused only when it is the server answering on the
# expected port with the expected served name (a tiny fake server stands in for vLLM).

bats_require_minimum_version 1.5.0

setup() {
  ROOT=$(cd "$BATS_TEST_DIRNAME/../.." && pwd -P)
  source "$ROOT/scripts/lib/common.sh"
  source "$ROOT/scripts/lib/envs.sh"
  source "$ROOT/scripts/lib/procs.sh"
  source "$ROOT/scripts/lib/vllm.sh"
  PY=$(envs_python app)
  export BATON_APP_PY=$PY
  RUN="$BATS_TEST_TMPDIR/run"
  MODEL="$BATS_TEST_TMPDIR/models/m"
  BG=()
}

teardown() {
  local pid
  procs_stop "$RUN" vllm 2 2>/dev/null
  for pid in "${BG[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
}

# free_port: print a TCP port that nothing listens on.
free_port() {
  "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# answers <port>: wait (at most 20 s) until a server answers on <port>.
answers() {
  local tries
  for ((tries = 0; tries < 200; tries++)); do
    curl -fsS --max-time 1 "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  return 1
}

# serve <port> <served_name> [fake_vllm flags...]: start the fake server as this run's recorded vLLM; sets PGID.
serve() {
  PGID=$(procs_start "$RUN" vllm "$RUN/vllm.log" "$PY" "$BATS_TEST_DIRNAME/fake_vllm.py" \
    --port "$1" --served-model-name "$2" --model "$MODEL" "${@:3}")
  answers "$1"
}

# serve_outsider <port> <served_name>: start the fake server as someone else's; sets OUTSIDER.
serve_outsider() {
  "$PY" "$BATS_TEST_DIRNAME/fake_vllm.py" --port "$1" --served-model-name "$2" --model "$MODEL" &
  OUTSIDER=$!
  BG+=("$OUTSIDER")
  answers "$1"
}

@test "vllm_reuse keeps the recorded server that answers on its port with the served name" {
  port=$(free_port)
  serve "$port" policy
  run -0 vllm_reuse "$RUN" "$port" policy
  [ "$output" = "[baton] vLLM on port $port (group $PGID, started by this run) already serves policy; reusing it" ]
  run -0 vllm_reuse "$RUN" "$port" policy "$MODEL"
  procs_group_alive "$PGID"
  [ -f "$RUN/pids/vllm.pgid" ]
}

@test "vllm_reuse stops a recorded server that serves another name" {
  port=$(free_port)
  serve "$port" other
  run -1 vllm_reuse "$RUN" "$port" policy
  [ "$output" = "[baton] warning: the vLLM this run started (group $PGID) does not serve policy on port $port; restarting it" ]
  run -1 procs_group_alive "$PGID"
  [ ! -e "$RUN/pids/vllm.pgid" ]
}

@test "vllm_reuse stops a recorded server on another port, even when the expected port answers with the name" {
  ours=$(free_port)
  serve "$ours" policy
  port=$(free_port)
  serve_outsider "$port" policy
  run -1 vllm_reuse "$RUN" "$port" policy
  [[ $output == *"(group $PGID) does not serve policy on port $port; restarting it"* ]]
  run -1 procs_group_alive "$PGID"
  kill -0 "$OUTSIDER"
}

@test "vllm_start never takes a server it did not start for the recorded one" {
  ours=$(free_port)
  serve "$ours" policy
  port=$(free_port)
  serve_outsider "$port" policy
  run -1 vllm_start "$RUN" "$MODEL" "$port" policy 5
  [[ $output != *"reusing it"* ]]
  [[ $output == *"port $port is held by a server that this run did not start; stop it or choose another port"* ]]
  run -1 procs_group_alive "$PGID"
  kill -0 "$OUTSIDER"
}

@test "vllm_reuse forgets a record whose pid now names another process, and never signals it" {
  setsid sleep 300 &
  other=$!
  BG+=("$other")
  mkdir -p "$RUN/pids"
  printf '%s 1\n' "$other" >"$RUN/pids/vllm.pgid"
  run -1 vllm_reuse "$RUN" "$(free_port)" policy
  kill -0 "$other"
  [ ! -e "$RUN/pids/vllm.pgid" ]
}

@test "loop_ensure_vllm restarts a recorded vLLM unless it answers on the port with the served name, and reloads a reused one" {
  source "$ROOT/scripts/lib/loop.sh"
  # shellcheck disable=SC2329 # called by loop_ensure_vllm
  vllm_start() { printf 'vllm_start %s\n' "$*"; }
  vllm_serve_new() {
    printf 'vllm_serve_new %s\n' "$*"
    # shellcheck disable=SC2030 # read by loop_ensure_vllm in this same subshell
    VLLM_SERVED_HOW=reload
  }
  loop_policy_path() { printf '%s\n' "$MODEL"; }
  loop_policy_version() { :; }
  RUN_DEBUG=0 LOOP_RUN_DIR=$RUN LOOP_PORT=$(free_port) LOOP_MODEL=policy
  serve "$LOOP_PORT" other
  run -0 loop_ensure_vllm
  [[ $output == *"(group $PGID) does not serve policy on port $LOOP_PORT; restarting it"* ]]
  [[ $output == *"vllm_start $RUN $MODEL $LOOP_PORT policy"* ]]
  run -1 procs_group_alive "$PGID"
  serve "$LOOP_PORT" policy
  run -0 loop_ensure_vllm
  [[ $output == *"already serves policy; reusing it"* && $output != *vllm_start* ]]
  # it may hold the weights of an older policy (a run that died after a promotion): the current one is loaded
  [[ $output == *"vllm_serve_new $RUN $LOOP_PORT policy $MODEL"* ]]
  # a server that recorded holding the current policy's weights is reused as it is: no reload, no restart
  vllm_record_weights "$RUN" "$MODEL"
  run -0 loop_ensure_vllm
  [[ $output == *"already serves policy; reusing it"* && $output == *"holds the current policy's weights ($MODEL) already"* ]]
  [[ $output != *vllm_serve_new* && $output != *vllm_start* ]]
  vllm_record_weights "$RUN" /elsewhere/v0001 # older weights: loaded again
  run -0 loop_ensure_vllm
  [[ $output == *"vllm_serve_new $RUN $LOOP_PORT policy $MODEL"* ]]
}

# stub_serving <fingerprints...>: vllm_fingerprint prints the next of <fingerprints> per call; vllm_reload
# succeeds unless RELOAD_FAILS=1; vllm_stop and vllm_start are recorded in $EVENTS.
stub_serving() {
  EVENTS="$BATS_TEST_TMPDIR/events" PRINTS="$BATS_TEST_TMPDIR/prints"
  printf '%s\n' "$@" >"$PRINTS"
  : >"$EVENTS"
  # shellcheck disable=SC2329 # called by vllm_serve_new
  {
    vllm_fingerprint() { head -n 1 "$PRINTS" && sed -i 1d "$PRINTS"; }
    vllm_reload() { echo "reload $2" >>"$EVENTS" && ((!${RELOAD_FAILS:-0})); }
    vllm_stop() { echo stop >>"$EVENTS"; }
    vllm_start() { echo "start $2" >>"$EVENTS"; }
  }
}

# served_how <args...>: run vllm_serve_new <args...> (its warnings to $BATS_TEST_TMPDIR/err); print VLLM_SERVED_HOW.
served_how() {
  vllm_serve_new "$@" 2>"$BATS_TEST_TMPDIR/err"
  # shellcheck disable=SC2031 # set by vllm_serve_new just above, in this shell
  printf '%s\n' "$VLLM_SERVED_HOW"
}

@test "vllm_serve_new: an in-place reload that changes the served outputs is kept (no restart)" {
  stub_serving old new
  [ "$(served_how "$RUN" 8999 policy /p/v1)" = reload ]
  [ "$(cat "$EVENTS")" = "reload /p/v1" ]
}

@test "vllm_serve_new: a refused reload falls back to a restart on the new weights" {
  stub_serving old new
  [ "$(RELOAD_FAILS=1 served_how "$RUN" 8999 policy /p/v1)" = restart ]
  grep -q "in-place reload is unavailable on port 8999; restarting vLLM on /p/v1" "$BATS_TEST_TMPDIR/err"
  [ "$(cat "$EVENTS")" = "$(printf '%s\n' 'reload /p/v1' stop 'start /p/v1')" ]
}

@test "vllm_serve_new: a reload that changes nothing is checked by a restart; still the same outputs: unchanged" {
  stub_serving same same same
  [ "$(served_how "$RUN" 8999 policy /p/v1)" = unchanged ]
  [ "$(cat "$EVENTS")" = "$(printf '%s\n' 'reload /p/v1' stop 'start /p/v1')" ]
  grep -q "in-place reload left the served outputs unchanged; restarting vLLM on /p/v1 to make sure" "$BATS_TEST_TMPDIR/err"
  grep -q "gives the same greedy outputs as the old one" "$BATS_TEST_TMPDIR/err"
}

# tied_model <dir> <tensor names...>: a model folder whose config ties the head to the embeddings and whose
# model.safetensors holds <tensor names> (headers only, one float each).
tied_model() {
  "$PY" - "$@" <<'PY'
import json, struct, sys
from pathlib import Path
folder = Path(sys.argv[1]); folder.mkdir(parents=True)
(folder / "config.json").write_text(json.dumps({"tie_word_embeddings": True}))
header = {name: {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]} for i, name in enumerate(sys.argv[2:])}
blob = json.dumps(header).encode()
(folder / "model.safetensors").write_bytes(struct.pack("<Q", len(blob)) + blob + bytes(4 * len(header)))
PY
}

@test "vllm_serve_new: a tied-head model without its head in its files is served by a restart, not a reload" {
  tied_model "$BATS_TEST_TMPDIR/base" model.embed_tokens.weight model.norm.weight
  tied_model "$BATS_TEST_TMPDIR/v1" model.embed_tokens.weight model.norm.weight lm_head.weight
  stub_serving old new
  [ "$(served_how "$RUN" 8999 policy "$BATS_TEST_TMPDIR/base")" = restart ]
  [ "$(cat "$EVENTS")" = "$(printf '%s\n' stop "start $BATS_TEST_TMPDIR/base")" ]
  grep -q "ties its output head to model.embed_tokens.weight and holds no lm_head.weight; restarting vLLM" \
    "$BATS_TEST_TMPDIR/err"
  stub_serving old new
  [ "$(served_how "$RUN" 8999 policy "$BATS_TEST_TMPDIR/v1")" = reload ]
}

@test "vllm_start: a server that exits during its start-up is said to have exited (not timed out), 3 attempts, then exit 1" {
  vllm_choose() { VLLM_KV_GIB=1; }
  vllm_args() { printf '%s\n' -c 'import sys; print("boom: cannot load the model"); sys.exit(1)'; }
  BATON_SERVE_PY=$PY
  run -1 vllm_start "$RUN" "$MODEL" "$(free_port)" policy 600
  [[ $(grep -c "vLLM exited during its start-up" <<<"$output") == 3 ]]
  [[ $output == *"boom: cannot load the model"* ]]
  [[ $output != *"did not become healthy"* ]]
  [[ $output == *"vLLM failed to start 3 times; see $RUN/logs/vllm.log"* ]]
}

@test "vllm_reload: reloads, then resets the prefix cache; fails when vLLM says the cache was not reset" {
  port=$(free_port)
  serve "$port" policy
  run -0 vllm_reload "$port" /p/v1
  [ -z "$output" ]
  procs_stop "$RUN" vllm 2
  port=$(free_port)
  serve "$port" policy --prefix-cache-held
  run -1 vllm_reload "$port" /p/v1
}

@test "vllm_choose: a GPU node whose job may use none of its GPUs is exit 2, naming CUDA_VISIBLE_DEVICES" {
  mkdir -p "$BATS_TEST_TMPDIR/bin"
  printf '#!/bin/sh\necho "GPU 0: NVIDIA H100 (UUID: GPU-0)"\n' >"$BATS_TEST_TMPDIR/bin/nvidia-smi"
  chmod +x "$BATS_TEST_TMPDIR/bin/nvidia-smi"
  PATH="$BATS_TEST_TMPDIR/bin:$PATH" CUDA_VISIBLE_DEVICES='' run -2 vllm_choose "" "$MODEL"
  [ "$output" = "[baton] error: no GPU to serve on: nvidia-smi -L lists none, or CUDA_VISIBLE_DEVICES ('') names none; give the job a GPU, or set BATON_DEVICE=cpu" ]
}
