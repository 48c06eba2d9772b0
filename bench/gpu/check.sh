#!/usr/bin/env bash
# The GPU check, on a GPU machine: every update path of `python -m training`, called the way the
# run loop calls it, with wall time, the trainer's own runtime, compute dtype, the promoted
# weights' dtypes and modes, and each GPU process's peak memory.
#
#   bash bench/gpu/check.sh [--parallel N] CASE...      (from the repository root; bundle first)
#
# Needs .gpu/ from bench/gpu/bundle.sh (wheels of the train lock that the machine lacks, the
# DeepSpeed sdist, the default model's config and tokenizer, a journal). Installs them into
# /tmp/site once per machine (GPU_CHECK_NO_INSTALL=1: use python3's own packages, e.g. a rehearsal
# on a CPU machine with the train environment first on PATH). Results: $OUT (default /tmp/gpu-check): cases.jsonl, table.md,
# logs.tgz. Cases: check rft_auto rft_none rft_zero2 rft_zero3 lora lora_auto dpo kto
# prepare_2gpu check_2gpu rft_fp32 rft_ckpt quickstart, and warm (issue 45: bench/gpu/warm_check.py, its table in
# $OUT/warm/table.md); --parallel runs N cases at a time (the machine
# has many cores and the model is small: start-up is CPU-bound; the table says how many ran at once).
set -Eeuo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
G=$ROOT/.gpu
OUT=${OUT:-/tmp/gpu-check}
LOGS=/tmp/gpu-logs
SITE=/tmp/site
PARALLEL=1
if [[ ${1:-} == --parallel ]]; then
  PARALLEL=$2
  shift 2
fi
mkdir -p "$OUT" "$LOGS"

note() { echo "$*" | tee -a "$OUT/summary.txt"; }

install_once() {
  [[ -f $SITE/.done || -n ${GPU_CHECK_NO_INSTALL:-} ]] && return 0
  local started=$SECONDS
  DS_BUILD_OPS=0 python3 -m pip install --no-index --no-deps --no-compile --no-cache-dir --no-build-isolation \
    --upgrade --target "$SITE" "$G"/whl/*.whl "$G"/sdist/*.tar.gz >"$LOGS/pip.log" 2>&1 ||
    { tail -20 "$LOGS/pip.log"; return 1; }
  touch "$SITE/.done"
  note "installed the carried packages in $((SECONDS - started)) s"
}

# case_args <case>: the overrides of one case, after the common ones.
case_args() {
  case $1 in
    check | check_2gpu) echo "phase=check" ;;
    prepare_2gpu) echo "phase=prepare" ;;
    rft_auto) echo "" ;; # the defaults: launch.deepspeed=auto
    rft_none) echo "launch.deepspeed=none" ;;
    rft_fp32) echo "launch.deepspeed=none promotion.dtype=float32" ;;
    rft_zero2) echo "launch.deepspeed=zero2" ;;
    rft_zero3) echo "launch.deepspeed=zero3" ;;
    rft_ckpt) echo "launch.deepspeed=none algorithm.gradient_checkpointing=true" ;;
    lora) echo "algorithm.finetuning_type=lora launch.deepspeed=none" ;;
    lora_auto) echo "algorithm.finetuning_type=lora" ;;
    dpo) echo "algorithm=dpo launch.deepspeed=none" ;;
    kto) echo "algorithm=kto launch.deepspeed=none" ;;
    quickstart) echo "algorithm.num_train_epochs=2 algorithm.per_device_train_batch_size=8 algorithm.selection.positive_samples_to_train=128" ;;
    *) echo "unknown case $1" >&2 && return 2 ;;
  esac
}

# warm_case: issue 45's check, two updates in one warm trainer against fresh processes, every path at once
# (bench/gpu/warm_check.py; WARM_IDLE s between the jobs, default 180; WARM_PATHS, WARM_PARALLEL).
warm_case() {
  local rc=0
  python3 "$ROOT/bench/gpu/warm_check.py" --model /tmp/model --journal "$G/journal" --out "$OUT/warm" \
    --paths "${WARM_PATHS:-none,zero1,zero2,zero3,lora,grpo}" --parallel "${WARM_PARALLEL:-6}" --together --idle "${WARM_IDLE:-180}" --limit "${CASE_LIMIT:-240}" \
    >"$OUT/warm.out" 2>&1 || rc=$? # in $OUT: a run cut short still brings back what it printed
  note "warm: exit $rc"
  tail -12 "$OUT/warm.out" | cut -c1-400 | tee -a "$OUT/summary.txt"
}

run_case() {
  local name=$1 log=/tmp/runs/$1 port started rc=0 phase=all
  local -a extra common runner
  [[ $name == warm ]] && { warm_case; return; }
  read -r -a extra <<<"$(case_args "$name")"
  [[ " ${extra[*]} " == *" phase="* ]] && phase=""
  common=(algorithm.max_steps=2 algorithm.per_device_train_batch_size=2 algorithm.gradient_accumulation_steps=1
    algorithm.warmup_steps=0 algorithm.cutoff_len=512 algorithm.learning_rate=1e-5)
  [[ $name == quickstart ]] && common=(algorithm.gradient_accumulation_steps=1 algorithm.cutoff_len=512)
  runner=(python3 -m training)
  [[ $name == *_2gpu ]] && runner=(env FAKE_GPUS=2 python3 "$ROOT/bench/gpu/fake_gpus.py")
  rm -rf "$log" && mkdir -p "$log" && cp -a "$G/journal/trajectories" "$log/"
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  started=$(date +%s.%N)
  (cd "$ROOT" && timeout -k 10 "${CASE_LIMIT:-240}" "${runner[@]}" --config-name update "log_path=$log" iteration=0 \
    model_path=/tmp/model ${phase:+phase=$phase} launch.nnodes=1 launch.node_rank=0 "launch.master_port=$port" \
    "launch.timeout_s=$((${CASE_LIMIT:-240} - 20))" "${common[@]}" "${extra[@]}") >"$LOGS/$name.out" 2>&1 || rc=$?
  python3 "$ROOT/bench/gpu/inspect_run.py" "$name" "$log" 0 "$rc" "$(python3 -c "import time; print(time.time() - $started)")" \
    "$LOGS/memory.tsv" >>"$OUT/cases.jsonl"
  cp -f "$log/training/iter_0000/train.log" "$LOGS/$name.train.log" 2>/dev/null || true
  note "$name: exit $rc"
  ((rc == 0)) || tail -15 "$LOGS/$name.out" | cut -c1-300 | tee -a "$OUT/summary.txt"
}

main() {
  note "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo no GPU), $(nproc) cores; cases: $*; $PARALLEL at a time"
  install_once
  export PATH=$SITE/bin:$PATH PYTHONPATH=$ROOT:$SITE HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
  python3 -c "import torch, transformers, llamafactory, deepspeed; print('torch', torch.__version__, 'cuda', torch.version.cuda,
    'transformers', transformers.__version__, 'llamafactory', llamafactory.__version__, 'deepspeed', deepspeed.__version__)" |
    tee -a "$OUT/summary.txt"
  [[ -f /tmp/model/config.json ]] || python3 "$ROOT/bench/gpu/make_model.py" "$G/model" /tmp/model | tee -a "$OUT/summary.txt"
  python3 "$ROOT/bench/gpu/gpu_memory.py" "$LOGS/memory.tsv" 2>"$LOGS/memory.err" &
  local sampler=$! name
  local -a cases=()
  for name in "$@"; do
    while (($(jobs -rp | wc -l) > PARALLEL)); do sleep 1; done # the sampler is one of the jobs
    run_case "$name" &
    cases+=($!)
  done
  wait "${cases[@]}" || true
  kill "$sampler" 2>/dev/null || true
  [[ ! -f $OUT/cases.jsonl ]] || python3 "$ROOT/bench/gpu/report.py" "$OUT/cases.jsonl" | tee "$OUT/table.md"
  tar -czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null || true
}

main "$@"
