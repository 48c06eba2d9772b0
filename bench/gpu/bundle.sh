#!/usr/bin/env bash
# Bundle what a bare GPU machine lacks for bench/gpu/check.sh, into .gpu/ of the checkout
# (git-ignored; about 30 MB): wheels of the train lock's packages the GPU image does not
# provide at the locked version, the DeepSpeed sdist (built there with DS_BUILD_OPS=0), the
# default model's config, tokenizer and chat template (its weights are not needed: check.sh
# builds a random model of the same architecture), and a journal to train on.
#
#   bash bench/gpu/bundle.sh --data-path D     (D: a data path prepared by scripts/prepare.sh)
#
# The GPU image (python 3.12, torch 2.11.0 with CUDA, numpy, pandas, pyarrow, ...) is assumed
# to hold the locked torch; everything version-sensitive for the update is carried.
set -Eeuo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
# shellcheck source=scripts/lib/common.sh
source "$ROOT/scripts/lib/common.sh"
# shellcheck source=scripts/lib/envs.sh
source "$ROOT/scripts/lib/envs.sh"
G=$ROOT/.gpu
# The update's stack, carried at the lock's version whatever the image has, then what it imports
# that the GPU image lacks (optional imports such as av, wandb and modelscope stay behind).
CARRY=(llamafactory transformers tokenizers accelerate peft trl datasets huggingface_hub hydra-core omegaconf
  antlr4-python3-runtime safetensors dill multiprocess xxhash fsspec fire termcolor tyro docstring_parser shtab
  typing-inspection annotated-types pydantic pydantic_core hjson sentencepiece tiktoken einops
  protobuf gguf torchdata)
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
  --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux1_x86_64)

data=""
[[ ${1:-} == --data-path && -n ${2:-} ]] && data=$2
[[ -d $data/models/SmolLM2-135M-Instruct ]] ||
  common_die 2 "--data-path must be a data path with models/SmolLM2-135M-Instruct (got '$data'); run: bash scripts/prepare.sh --data-path D"
envs_export
mkdir -p "$G/whl" "$G/sdist" "$G/model"
grep -qx '/.gpu/' "$ROOT/.git/info/exclude" 2>/dev/null || echo '/.gpu/' >>"$ROOT/.git/info/exclude"

pins=()
for name in "${CARRY[@]}"; do
  pin=$(grep -i -m1 -E "^${name//[-_]/[-_]}==" "$ROOT/scripts/locks/train.txt") ||
    common_die 1 "$name is not in scripts/locks/train.txt"
  pins+=("$pin")
done
common_log "downloading ${#pins[@]} wheels for python 3.12 (manylinux x86_64); a source archive where there is none"
for pin in "${pins[@]}"; do
  "$BATON_TRAIN_PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]}" -d "$G/whl" "$pin" 2>/dev/null ||
    "$BATON_TRAIN_PY" -m pip download -q --no-deps --no-binary=:all: -d "$G/sdist" "$pin" 2>/dev/null ||
    common_die 1 "cannot download $pin"
done
"$BATON_TRAIN_PY" -m pip download -q --no-deps --no-binary=:all: -d "$G/sdist" \
  "$(grep -m1 '^deepspeed==' "$ROOT/scripts/locks/train.txt")"
find "$data/models/SmolLM2-135M-Instruct" -maxdepth 1 -type f ! -name '*.safetensors' -exec cp {} "$G/model/" \;
rm -rf "$G/journal"
"$BATON_TRAIN_PY" "$ROOT/bench/gpu/journal.py" "$G/model" "$G/journal" 64
du -sh "$G"
