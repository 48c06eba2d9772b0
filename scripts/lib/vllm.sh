#!/usr/bin/env bash
# vLLM server lifecycle: arguments that fit the machine, start in a tracked
# process group, wait for health with a deadline, reuse only a server that
# serves the expected model, stop exactly the group we started.
# Library file: defines functions only. Needs common.sh, envs.sh, procs.sh.

# vllm_choose <run_dir|""> <model_dir>: pick the serving dtype and the CPU KV-cache
# size for this machine (coordinator/serving.py: float32 on a CPU
# without native bf16, bf16 with it or on a GPU of compute capability >= 8.0;
# BATON_VLLM_DTYPE forces one), say so once, and record the choice in
# <run_dir>/serving.json (when given). Sets VLLM_DTYPE and VLLM_KV_GIB; the KV cache holds
# VLLM_MAX_SESSIONS (default 32) requests of the full model length at once,
# unless VLLM_CPU_KVCACHE_SPACE is set. On a GPU node with no GPU usable (CUDA_VISIBLE_DEVICES
# empty), exit 2. Needs BATON_APP_PY.
vllm_choose() {
  local run_dir=$1 model=$2 out reason
  if [[ $(envs_device) == cuda ]] && (($(envs_gpu_count) < 1)); then
    printf "[baton] error: no GPU to serve on: nvidia-smi -L lists none, or CUDA_VISIBLE_DEVICES ('%s') names none;%s\n" \
      "${CUDA_VISIBLE_DEVICES-}" " give the job a GPU, or set BATON_DEVICE=cpu" >&2
    return 2
  fi
  out=$(PYTHONPATH="$(common_repo_root)" "$BATON_APP_PY" -m coordinator serving --device "$(envs_device)" \
    --model "$model" --sessions "${VLLM_MAX_SESSIONS:-32}" --max-model-len "${VLLM_MAX_MODEL_LEN:-2048}" \
    --record "${run_dir:+$run_dir/serving.json}") || return
  IFS=$'\t' read -r VLLM_DTYPE VLLM_KV_GIB reason <<<"$out"
  VLLM_KV_GIB=${VLLM_CPU_KVCACHE_SPACE:-$VLLM_KV_GIB}
  if [[ $(envs_device) == cuda ]]; then
    common_log "serving $VLLM_DTYPE: $reason"
  else
    common_log "serving $VLLM_DTYPE: $reason; KV cache ${VLLM_KV_GIB} GiB for ${VLLM_MAX_SESSIONS:-32} requests of ${VLLM_MAX_MODEL_LEN:-2048} tokens"
  fi
}

# vllm_args <model_dir> <port> <served_name>: print the server's arguments,
# one per line, for this machine (CPU: eager mode; GPU: data parallel over the
# local GPUs) in VLLM_DTYPE (vllm_choose; bfloat16 when unset).
# VLLM_MAX_MODEL_LEN and VLLM_GPU_MEMORY_UTILIZATION adjust them.
vllm_args() {
  local model=$1 port=$2 name=$3 gpus
  printf '%s\n' -m vllm.entrypoints.openai.api_server --model "$model" --served-model-name "$name" \
    --host 127.0.0.1 --port "$port" --max-model-len "${VLLM_MAX_MODEL_LEN:-2048}" \
    --dtype "${VLLM_DTYPE:-bfloat16}" --generation-config vllm
  if [[ $(envs_device) == cuda ]]; then
    gpus=$(envs_gpu_count)
    printf '%s\n' --data-parallel-size "$gpus" --gpu-memory-utilization "${VLLM_GPU_MEMORY_UTILIZATION:-0.85}" \
      --enable-sleep-mode
  else
    printf '%s\n' --enforce-eager
  fi
}

# vllm_models <port>: print the JSON of /v1/models (fails when unreachable).
vllm_models() {
  curl -fsS --max-time 5 "http://127.0.0.1:$1/v1/models"
}

# vllm_serves <port> <served_name> [model_dir]: true when a healthy server on
# <port> serves <served_name> (from <model_dir>, when given).
vllm_serves() {
  local port=$1 name=$2 model=${3:-} models
  curl -fsS --max-time 5 "http://127.0.0.1:$port/health" >/dev/null 2>&1 || return 1
  models=$(vllm_models "$port") || return 1
  [[ $models == *"\"id\":\"$name\""* ]] || return 1
  [[ -z $model || $models == *"\"root\":\"$model\""* ]]
}

# vllm_reuse <run_dir> <port> <served_name> [model_dir]: keep the server this run
# directory recorded when its leader still runs (same start time), its group holds
# <port> and it answers there with <served_name> (from <model_dir>, when given).
# Otherwise stop it (a record whose pid now names another process is only
# forgotten) and return 1, so that the caller starts a new one.
vllm_reuse() {
  local run_dir=$1 port=$2 name=$3 model=${4:-} pgid
  pgid=$(procs_pgid "$run_dir" vllm) || return 1
  if ! procs_leader_alive "$run_dir" vllm; then
    procs_stop_stale "$run_dir" vllm
    return 1
  fi
  if procs_group_listens "$pgid" "$port" && vllm_serves "$port" "$name" "$model"; then
    common_log "vLLM on port $port (group $pgid, started by this run) already serves $name${model:+ from $model}; reusing it"
    return 0
  fi
  common_warn "the vLLM this run started (group $pgid) does not serve $name${model:+ from $model} on port $port; restarting it"
  procs_stop "$run_dir" vllm 10
  return 1
}

# vllm_wait <run_dir> <port> <served_name> <deadline_s>: wait until the server
# we started answers (0); 1 past the deadline; 2 at once when its process group is gone.
# Each poll first runs the function VLLM_ON_POLL names, if any.
vllm_wait() {
  local run_dir=$1 port=$2 name=$3 deadline=$4 start=$SECONDS pgid
  pgid=$(procs_pgid "$run_dir" vllm) || return 2
  while ((SECONDS - start < deadline)); do
    vllm_serves "$port" "$name" && return 0
    procs_group_alive "$pgid" || return 2
    [[ -z ${VLLM_ON_POLL:-} ]] || "$VLLM_ON_POLL" # the caller's watch beside the wait (run.sh: its heartbeat)
    sleep 1
  done
  return 1
}

# vllm_start <run_dir> <model_dir> <port> <served_name> [deadline_s]: start a
# server (up to 3 attempts, each given deadline_s seconds to answer; default
# BATON_VLLM_START_S, 600) and wait for it; reuse the one this run directory
# recorded if it still serves the same model on <port> (vllm_reuse). A server
# on <port> that this run directory did not start is never reused, reloaded or
# stopped.
# Logs go to <run_dir>/logs/vllm.log.
vllm_start() {
  local run_dir=$1 model=$2 port=$3 name=$4 deadline=${5:-${BATON_VLLM_START_S:-600}} attempt log started rc
  local -a args
  vllm_reuse "$run_dir" "$port" "$name" "$model" && return 0
  if curl -fsS --max-time 2 "http://127.0.0.1:$port/health" >/dev/null 2>&1; then
    common_die 1 "port $port is held by a server that this run did not start; stop it or choose another port" \
      "(BATON_VLLM_PORT), or use it with --debug-mode"
  fi
  mkdir -p "$run_dir/logs"
  vllm_choose "$run_dir" "$model" || common_die "$?" "cannot choose how to serve $model (message above)"
  mapfile -t args < <(vllm_args "$model" "$port" "$name")
  log="$run_dir/logs/vllm.log"
  for attempt in 1 2 3; do
    common_log "starting vLLM ($name from $model, port $port, attempt $attempt/3, log: $log)"
    procs_start "$run_dir" vllm "$log" env VLLM_SERVER_DEV_MODE=1 \
      VLLM_CPU_KVCACHE_SPACE="$VLLM_KV_GIB" "$BATON_SERVE_PY" "${args[@]}" >/dev/null
    started=$SECONDS rc=0
    vllm_wait "$run_dir" "$port" "$name" "$deadline" || rc=$?
    if ((rc == 0)); then
      common_log "vLLM ready on port $port"
      vllm_record_weights "$run_dir" "$model"
      return 0
    elif ((rc == 2)); then
      common_warn "vLLM exited during its start-up (after $((SECONDS - started))s); last lines of $log:"
    else
      common_warn "vLLM did not become healthy within ${deadline}s (BATON_VLLM_START_S); last lines of $log:"
    fi
    tail -n 15 "$log" >&2
    procs_stop "$run_dir" vllm 10
  done
  common_die 1 "vLLM failed to start 3 times; see $log"
}

# vllm_stop <run_dir>: stop the server this run started (nothing else).
vllm_stop() {
  procs_stop "$1" vllm "${2:-30}"
  rm -f "$1/vllm.weights"
}

# vllm_record_weights <run_dir> <model_dir>: note which weights the recorded server holds now (after a start
# or an in-place reload), in <run_dir>/vllm.weights, so that a later run.sh that reuses the server knows.
vllm_record_weights() {
  printf '%s\n' "$2" >"$1/.vllm.weights.tmp" && mv -f "$1/.vllm.weights.tmp" "$1/vllm.weights"
}

# vllm_recorded_weights <run_dir>: print the weights the recorded server holds ("" when unknown).
vllm_recorded_weights() {
  [[ ! -f $1/vllm.weights ]] || head -n 1 "$1/vllm.weights"
}

# vllm_post <port> <path> [json]: POST to the server's dev endpoint <path>, waiting at most
# BATON_VLLM_RELOAD_S seconds (600) for its answer.
vllm_post() {
  local port=$1 path=$2 body=${3:-}
  if [[ -n $body ]]; then
    curl -fsS --max-time "${BATON_VLLM_RELOAD_S:-600}" -X POST -H 'Content-Type: application/json' -d "$body" "http://127.0.0.1:$port$path"
  else
    curl -fsS --max-time "${BATON_VLLM_RELOAD_S:-600}" -X POST "http://127.0.0.1:$port$path"
  fi
}

# vllm_fingerprint <port> <served_name>: print the greedy tokens and logprobs of a
# fixed prompt (they identify the served weights). Needs BATON_APP_PY.
vllm_fingerprint() {
  PYTHONPATH="$(common_repo_root)" "$BATON_APP_PY" -m coordinator fingerprint \
    --base-url "http://127.0.0.1:$1/v1" --model "$2"
}

# vllm_reloadable <model_dir>: whether vLLM reloads <model_dir> in place exactly (a tied output head must be
# in its files: a promoted policy's is, a base model's is not; rollout_engine/checkpoint.py). Needs BATON_APP_PY.
vllm_reloadable() {
  PYTHONPATH="$(common_repo_root)" "$BATON_APP_PY" -m coordinator reloadable --model "$1"
}

# vllm_reload <port> <model_dir>: load <model_dir>'s weights into the running
# server without a restart (needs VLLM_SERVER_DEV_MODE=1, which vllm_start sets),
# then drop the prefix cache computed with the old weights. Fails when vLLM says
# the cache was not dropped ({"success":false}: blocks still held by requests).
vllm_reload() {
  local port=$1 model=$2 body reset
  body=$(printf '{"method":"reload_weights","kwargs":{"weights_path":"%s"}}' "$model")
  vllm_post "$port" /collective_rpc "$body" >/dev/null && reset=$(vllm_post "$port" /reset_prefix_cache) &&
    [[ $reset == *'"success":true'* ]]
}

# vllm_sleep <port>: free the accelerator's memory for a colocated training
# (GPU servers started with --enable-sleep-mode; a no-op on CPU).
vllm_sleep() {
  [[ $(envs_device) == cuda ]] || return 0
  vllm_post "$1" '/sleep?level=1' >/dev/null
}

# vllm_wake <port>: undo vllm_sleep (a no-op on CPU).
vllm_wake() {
  [[ $(envs_device) == cuda ]] || return 0
  vllm_post "$1" /wake_up >/dev/null
}

# vllm_serve_new <run_dir> <port> <served_name> <model_dir>: serve <model_dir>
# in place of the current weights: in-place reload when the fingerprint changes,
# else (reload refused, or no visible change) a restart on <model_dir>. Sets
# VLLM_SERVED_HOW: "reload", "restart", or "unchanged" when even a restart
# serves the same outputs (the update did not move the weights at served precision).
# shellcheck disable=SC2034 # VLLM_SERVED_HOW is this function's result, read by the caller
vllm_serve_new() {
  local run_dir=$1 port=$2 name=$3 model=$4 before after start=$SECONDS why
  before=$(vllm_fingerprint "$port" "$name") || before=""
  if ! why=$(vllm_reloadable "$model" 2>&1); then
    common_warn "${why:-$model cannot be reloaded in place}; restarting vLLM on it (an in-place reload would keep" \
      "the old output head)"
  elif vllm_reload "$port" "$model"; then
    after=$(vllm_fingerprint "$port" "$name") || after=""
    if [[ -n $after && $after != "$before" ]]; then
      common_log "vLLM reloaded $model in place in $((SECONDS - start))s (served outputs changed)"
      vllm_record_weights "$run_dir" "$model"
      VLLM_SERVED_HOW=reload
      return 0
    fi
    common_warn "in-place reload left the served outputs unchanged; restarting vLLM on $model to make sure"
  else
    common_warn "in-place reload is unavailable on port $port; restarting vLLM on $model"
  fi
  vllm_stop "$run_dir"
  vllm_start "$run_dir" "$model" "$port" "$name"
  after=$(vllm_fingerprint "$port" "$name") || after=""
  if [[ -n $before && $after == "$before" ]]; then
    common_warn "the new policy $model gives the same greedy outputs as the old one (an update too small to show)"
    VLLM_SERVED_HOW=unchanged
    return 0
  fi
  VLLM_SERVED_HOW=restart
}
