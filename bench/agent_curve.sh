#!/usr/bin/env bash
# An agent that learns: warm start on demonstrations, then RL on its own
# successes, against a control that goes on training on the demonstrations
# alone for the same number of optimizer steps; held-out success per policy.
#
#   bash bench/agent_curve.sh --env miniwob|miniwob-open|textworld [--iterations N] [--seeds 1,2]
#                             [--arm rl|rl-disagree|control|mixed|grpo|both] [--arm-lr LR] [--arm-set KEY=VALUE]...
#                             [--data-path DIR] [--log-path DIR] [overrides...]
#
# Each training seed S runs under <log>/seedS (the seed reaches the rollouts,
# the trainer and each arm's draw of steps). miniwob-open gives demonstrations
# for three of its ten families only (bench/agent_curve.py BENCHES).
# Warm start (<log>/seedS/warm): the base model's held-out evaluation, then one
# update on the demonstration steps. Every arm starts from its policy (v0001)
# and runs N iterations (run.sh --rl-phase both), each evaluating the policy it
# serves on two held-out sets, greedy, then the last one (--final-eval):
#   rl       trains on the policy's own successes (RFT, shortest success per task);
#   rl-disagree (not in "both") the same on the tasks whose samples disagree only (an A/B);
#   control  trains on as many demonstration steps (a seeded draw each iteration) and
#            samples only a token train rollout;
#   mixed    (not in "both") half own successes, half demonstration steps;
#   grpo     (not in "both") algorithm=grpo: a policy gradient on every episode of the tasks whose samples
#            disagree, as many optimizer steps as the RL arm (issue 43's comparison with rft).
# --arm-lr: the arms' learning rate (default 1e-4; the warm start keeps 1e-4). Give another
# value its own --log-path, with each seedS/warm there a link to the first's (ln -s), so that
# both runs' arms start from the same warm start.
# --arm-set KEY=VALUE (repeatable): an override for the arms only, not the warm start, e.g.
# algorithm.policy_gradient.old_logprobs=trainer for the grpo arm (a key the warm start's rft lacks).
# The overrides after the flags go to the warm start and the arms alike.
# --iterations N: each arm's iterations in all. A rerun skips what is done and continues the rest: an
# interrupted arm, or every arm for a larger N (after the final evaluation of the earlier N, more
# iterations, then another final evaluation).
# An arm runs beside another (another BATON_VLLM_PORT) once the warm start is there, where memory allows: on
# 24 GiB two arms' updates at once (a trainer of about 7 GB each, beside two vLLMs) ran out of it.
# Outside CI: about 90 minutes (miniwob, N=5), about 60 a seed (miniwob-open, N=4) on
# 2 cores. Record the table and the plot in docs/benchmarks.md (section 3d).
set -Eeuo pipefail
[[ -n ${BATON_TRACE:-} ]] && set -x

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
# shellcheck source=scripts/lib/common.sh
source "$ROOT/scripts/lib/common.sh"
# shellcheck source=scripts/lib/envs.sh
source "$ROOT/scripts/lib/envs.sh"

# Per environment: the episode settings, the warm start's demonstration steps,
# and the steps each later iteration trains on (own successes or demonstrations).
# The RL arm's train rollout each iteration: AGENT_TASKS tasks x AGENT_SAMPLES samples.
AGENT_WARM=128 AGENT_STEP_ROWS=32 AGENT_TASKS=30 AGENT_SAMPLES=2
declare -a AGENT_ENV=()
# --arm-set's overrides: the arms take them after their own, the warm start does not
declare -a AGENT_ARM_SET=()

agent_settings() {
  local env=$1 data=$2
  case "$env" in
    miniwob)
      AGENT_ENV=(env=miniwob env.max_steps=5 env_config.server_size=4 policy_config.max_new_tokens=32)
      AGENT_WARM=128 AGENT_STEP_ROWS=32
      ;;
    miniwob-open)
      # seven of ten families have no demonstrations: more samples a task find the policy's rarer successes
      # there (8 against 4: docs/benchmarks.md 3d)
      AGENT_ENV=(env=miniwob env.max_steps=5 env_config.server_size=4 policy_config.max_new_tokens=32)
      AGENT_WARM=-1 AGENT_STEP_ROWS=32 AGENT_TASKS=36 AGENT_SAMPLES=8
      ;;
    textworld)
      AGENT_ENV=(env=textworld env.max_steps=6 "env.games_dir=$data/textworld/games" env_config.server_size=8
        policy_config.max_new_tokens=24)
      AGENT_WARM=-1 AGENT_STEP_ROWS=16
      ;;
    *) common_die 2 "--env must be miniwob, miniwob-open or textworld (got '$env')" ;;
  esac
}

# agent_run <log> <data> <overrides...> (the learning rate and the demonstrations among them): run.sh
# --rl-phase both on <log>, resuming a run already there.
agent_run() {
  local log=$1 data=$2
  shift 2
  local -a resume=()
  [[ ! -e $log/metrics.jsonl ]] || resume=(--resume)
  bash "$ROOT/scripts/run.sh" --data-path "$data" --log-path "$log" --rl-phase both --eval-interval 1 \
    "${resume[@]}" "${AGENT_ENV[@]}" env_config.max_vllm_sessions=16 "env_config.train_tasks_rollout_size=$AGENT_TASKS" \
    "env_config.n_samples_per_task=$AGENT_SAMPLES" env_config.test_greedy=true env_config.test_tasks_rollout_size=-1 \
    algorithm.warmup_steps=0 algorithm.num_train_epochs=1 \
    algorithm.per_device_train_batch_size=2 algorithm.gradient_accumulation_steps=4 algorithm.cutoff_len=1024 "$@"
}

# agent_seed <log>/seed<S> <data> <S> <arm> <iterations> <arm-lr> [extra...]: the arms of one training seed.
agent_seed() {
  local run=$1 data=$2 seed=$3 arm=$4 iterations=$5
  local -a lr=("algorithm.learning_rate=$6")
  shift 6
  # the seed reaches the rollouts' sampling, the trainer and each arm's draw of steps
  local -a seeded=("seed=$seed" "algorithm.seed=$seed")
  # every arm but grpo may draw demonstration steps (grpo trains sampled episodes only)
  local -a demos=("data.demonstrations=$data/demos")
  local -a token_rollout=(env_config.train_tasks_rollout_size=2 env_config.n_samples_per_task=1)
  # every arm takes the same optimizer steps an iteration, however many rows it has (batch 2 x 4)
  local -a steps=("algorithm.max_steps=$((AGENT_STEP_ROWS / 8))")
  # the warm start: the base model's held-out evaluation, then one update on demonstration steps alone
  # (its train rollout is a token one: nothing of it is trained on)
  if [[ ! -d $run/warm/policy/v0001 ]]; then # promoted last: there, the warm start is done
    common_log "seed $seed, warm start: one update on demonstrations: $run/warm"
    agent_run "$run/warm" "$data" --max-iterations 1 algorithm.learning_rate=1e-4 "${seeded[@]}" "${demos[@]}" \
      "data.demonstration_samples=$AGENT_WARM" algorithm.selection.positive_samples_to_train=0 \
      "algorithm.selection.seed=$seed" "${token_rollout[@]}" "$@"
  fi
  [[ -d $run/warm/policy/v0001 ]] || common_die 1 "the warm start promoted no policy ($run/warm/policy/v0001)"
  local warm=$run/warm/policy/v0001
  local -a own=("${demos[@]}" data.demonstration_samples=0 "algorithm.selection.seed=$seed"
    "algorithm.selection.positive_samples_to_train=$AGENT_STEP_ROWS")
  if [[ $arm == rl || $arm == both ]]; then
    agent_arm "$run/rl" "$data" "$warm" "$iterations" "seed $seed, RL arm: RFT on own successes from the warm start" \
      "${lr[@]}" "${seeded[@]}" "${steps[@]}" "${own[@]}" "$@"
  fi
  if [[ $arm == rl-disagree ]]; then
    agent_arm "$run/rl-disagree" "$data" "$warm" "$iterations" "seed $seed, RL arm on the tasks whose samples disagree" \
      "${lr[@]}" "${seeded[@]}" "${steps[@]}" "${own[@]}" algorithm.selection.disagreement_filter=true "$@"
  fi
  if [[ $arm == mixed ]]; then
    agent_arm "$run/mixed" "$data" "$warm" "$iterations" "seed $seed, mixed arm: own successes + demonstrations" \
      "${lr[@]}" "${seeded[@]}" "${steps[@]}" "${demos[@]}" "data.demonstration_samples=$((AGENT_STEP_ROWS / 2))" \
      "algorithm.selection.positive_samples_to_train=$((AGENT_STEP_ROWS / 2))" \
      "algorithm.selection.seed=$((seed + 2000))" "$@"
  fi
  if [[ $arm == grpo ]]; then
    # the same rollouts and optimizer steps as the RL arm; the steps' rows are a seeded draw of the kept episodes
    agent_arm "$run/grpo" "$data" "$warm" "$iterations" "seed $seed, grpo arm: policy gradient on own episodes" \
      algorithm=grpo "${lr[@]}" "${seeded[@]}" "${steps[@]}" "algorithm.selection.seed=$seed" "$@"
  fi
  if [[ $arm == control || $arm == both ]]; then
    agent_arm "$run/control" "$data" "$warm" "$iterations" "seed $seed, control arm: demonstrations alone from the warm start" \
      "${lr[@]}" "${seeded[@]}" "${steps[@]}" "${demos[@]}" "data.demonstration_samples=$AGENT_STEP_ROWS" \
      algorithm.selection.positive_samples_to_train=0 \
      "algorithm.selection.seed=$((seed + 1000))" "${token_rollout[@]}" "$@"
  fi
}

# agent_arm <log> <data> <warm policy> <iterations> <what> <overrides...>: one arm from the warm start, up to
# <iterations> iterations in all, then its final held-out evaluation. An arm with fewer (interrupted, or run
# with a smaller --iterations) continues from where it stands; one with as many is skipped.
agent_arm() {
  local log=$1 data=$2 warm=$3 iterations=$4 what=$5
  shift 5
  local ran
  ran=$(PYTHONPATH="$ROOT" "$BATON_APP_PY" -m bench.agent_curve trained "$log") ||
    common_die 1 "cannot read the iterations of $log (messages above)"
  if ((ran >= iterations)); then
    common_log "$what: $ran iterations already ($log); skipped"
    return 0
  fi
  common_log "$what: iterations $((ran + 1))-$iterations: $log"
  agent_run "$log" "$data" --max-iterations "$((iterations - ran))" --final-eval "model_config.model=$warm" "$@" \
    "${AGENT_ARM_SET[@]}"
}

main() {
  local env="" iterations=5 data="" log="" arm=both seeds=1 arm_lr=1e-4
  local -a extra=()
  while (($#)); do
    case "$1" in
      --env | --iterations | --arm | --arm-lr | --arm-set | --data-path | --log-path | --seeds)
        [[ $# -ge 2 ]] || common_die 2 "$1 needs a value"
        case "$1" in
          --env) env=$2 ;;
          --iterations) iterations=$2 ;;
          --arm) arm=$2 ;;
          --arm-lr) arm_lr=$2 ;;
          --arm-set)
            [[ $2 =~ ^[A-Za-z_][A-Za-z0-9_.]*=. ]] ||
              common_die 2 "--arm-set must be KEY=VALUE, e.g. algorithm.policy_gradient.old_logprobs=trainer (got '$2')"
            AGENT_ARM_SET+=("$2")
            ;;
          --data-path) data=$2 ;;
          --log-path) log=$2 ;;
          --seeds) seeds=$2 ;;
        esac
        shift 2
        ;;
      -h | --help)
        awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}" # the header
        return 0
        ;;
      *) extra+=("$1") && shift ;;
    esac
  done
  [[ -n $env ]] || common_die 2 "--env is required: miniwob, miniwob-open or textworld"
  [[ $iterations =~ ^[1-9][0-9]*$ ]] || common_die 2 "--iterations must be a positive integer (got '$iterations')"
  [[ $arm =~ ^(rl|rl-disagree|control|mixed|grpo|both)$ ]] ||
    common_die 2 "--arm must be rl, rl-disagree, control, mixed, grpo or both (got '$arm')"
  # a decimal or an exponent form, and not zero
  [[ $arm_lr =~ ^[0-9]*\.?[0-9]+([eE]-?[0-9]+)?$ && ! $arm_lr =~ ^[0.]*([eE].*)?$ ]] ||
    common_die 2 "--arm-lr must be a positive learning rate, e.g. 3e-5 (got '$arm_lr')"
  [[ $seeds =~ ^[0-9]+(,[0-9]+)*$ ]] ||
    common_die 2 "--seeds must be training seeds separated by commas, e.g. 1,2 (got '$seeds')"
  data=${data:-$(common_baton_home)/bench-data-$env}
  log=${log:-$(common_baton_home)/bench-logs/agent-$env}
  agent_settings "$env" "$data"
  envs_export
  mkdir -p "$data" "$log"

  PYTHONPATH="$ROOT" "$BATON_TRAIN_PY" -m training.default_model --data-path "$data" ||
    common_die 1 "preparing the default model failed (messages above)"
  if [[ ! -s $data/tasks/test.jsonl ]]; then
    PYTHONPATH="$ROOT" "$BATON_APP_PY" -m bench.agent_curve tasks --env "$env" --out "$data/tasks"
  fi
  local demo_tasks=$data/tasks/demo.jsonl
  [[ -s $demo_tasks ]] || demo_tasks=$data/tasks/train.jsonl # task folders written before demo.jsonl existed
  if [[ ! -s $data/demos/demonstrations.jsonl ]]; then
    common_log "demonstrations: the expert on the train tasks of the families that have them ($demo_tasks)"
    PYTHONPATH="$ROOT" "$BATON_APP_PY" -m rollout_engine.demonstrations --env "${AGENT_ENV[0]#env=}" \
      --tasks "$demo_tasks" --out "$data/demos" "${AGENT_ENV[@]:1}"
  fi

  local seed
  local -a runs=()
  for seed in ${seeds//,/ }; do
    agent_seed "$log/seed$seed" "$data" "$seed" "$arm" "$iterations" "$arm_lr" "${extra[@]}"
  done
  for seed in "$log"/seed*; do
    [[ ! -e $seed/warm/metrics.jsonl ]] || runs+=("$seed")
  done
  local title="$env: warm start, then RL on own successes vs demonstrations only"
  [[ $arm_lr == 1e-4 ]] ||
    title="$env, the arms at lr $arm_lr: warm start, then RL on own successes vs demonstrations only"
  PYTHONPATH="$ROOT" "$BATON_APP_PY" -m bench.agent_curve report --env "$env" --out "$log/agent-$env.png" \
    --title "$title" "${runs[@]}"
}

# One line: bash parses it whole, so an edit of this file while it runs (git pull) cannot run stray bytes.
main "$@"; exit
