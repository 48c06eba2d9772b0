# Sourced by the run.sh bats files (bats `load`): ROOT, LOG, and a data path
# whose model folder has only config.json (enough for run.sh's checks; these
# tests start no vLLM and no training).
# shellcheck shell=bash disable=SC2034 # ROOT, LOG, DATA are for the test files

fake_data_setup() {
  ROOT=$(cd "$BATS_TEST_DIRNAME/../.." && pwd -P)
  source "$ROOT/scripts/lib/common.sh"
  LOG="$BATS_TEST_TMPDIR/log"
  DATA="$BATS_TEST_TMPDIR/data"
  mkdir -p "$DATA/models/SmolLM2-135M-Instruct"
  # SmolLM2-135M's shape: the serving helper sizes vLLM's KV cache from it
  printf '{"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}\n' \
    >"$DATA/models/SmolLM2-135M-Instruct/config.json"
}
