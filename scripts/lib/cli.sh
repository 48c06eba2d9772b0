#!/usr/bin/env bash
# run.sh's command line: usage text, the while/case parser and every rule of
# the argument table (docs/cli.md). Bad input exits 2 with one message on
# stderr before anything is started or written.
# Library file: defines functions only. Needs common.sh and slurm.sh.

# cli_usage: print run.sh's usage text.
cli_usage() {
  cat <<'EOF'
usage: bash scripts/run.sh --data-path DIR --log-path DIR --rl-phase rollout|update|both [options] [overrides...]

  --data-path DIR            shared data (absolute, must exist): models/, tasks/
  --log-path DIR             this experiment's logs (absolute; created if missing)
  --rl-phase PHASE           rollout | update | both
  --eval-interval N          required with both: evaluate when iteration % N == 1 (N = 1: every iteration)
  --rollout-split SPLIT      required with rollout: train-only | eval-only
  --num-nodes N              nodes sharing the log path (default 1; under srun, SLURM_NTASKS)
  --rank-weights W0,W1,...   required when N > 1: one integer load weight >= 1 per node
  --master | --worker R      this node's rank (0 | 1..N-1); else $RANK, then $NODE_RANK, then under srun $SLURM_PROCID
  --node-addr ADDR           the address other nodes reach this one at (default $BATON_NODE_ADDR, else the default route's)
  --node-file FILE           per-node settings (environment variables, interpreters, vLLM port) by rank (default $BATON_NODE_FILE)
  --on-rank-failure MODE     the master's choice when a worker dies: abort (default: every node stops) | continue
                             (the master finishes the iteration without it; a restarted worker joins the next)
  --debug-mode               use the external vLLM at policy_config.base_url; start/stop nothing
  --resume                   continue the interrupted iteration (on several nodes the master's decides for all)
  --max-iterations N         stop after N iterations (default: run until stopped)
  --max-update-failures N    stop after N consecutive failed updates (default 3)
  --final-eval               both, with --max-iterations: evaluate the last promoted policy on the held-out tasks at the end
  --keep-best                both: after a held-out evaluation, serve the best policy so far again when the
                             evaluated one is worse (promoted as a new version; docs/cli.md)
  --keep-best-margin P       with --keep-best: points of held-out success a policy may fall below the best (default 0)
  --wait-timeout S           update: stop after S seconds with no new train rollout (default: wait until stopped)
  --dashboard-port P         serve the run's web page on 127.0.0.1:P while it runs (docs/observability.md)
  --dry-run                  print the commands each phase would run, then exit
  --stop                     with --log-path only: stop the run on that log path (every node), at once and cleanly
  -h, --help                 this text

overrides: key=value, +key=value, ~key (Hydra); they reach the rollout and the update
(each goes to the configs that have that key). Reference: docs/cli.md
EOF
}

# cli_bad <msg...>: report bad input (with a pointer to --help) and exit 2.
cli_bad() {
  printf '[baton] error: %s\n' "$*" >&2
  printf '[baton] see: bash scripts/run.sh --help\n' >&2
  exit 2
}

# cli_need_value <flag> <argc>: fail unless <flag> has a value after it.
cli_need_value() {
  [[ $2 -ge 2 ]] || cli_bad "$1 needs a value"
}

# cli_set_once <var> <flag> <value>: assign a flag's value; a flag given twice is an error.
cli_set_once() {
  local -n ref=$1
  [[ -z $ref ]] || cli_bad "$2 is given twice ('$ref' and '$3'); give it once"
  ref=$3
}

# cli_is_int <value> <min>: true when <value> is an integer >= <min>.
cli_is_int() {
  [[ $1 =~ ^[0-9]+$ ]] && (($1 >= $2))
}

# cli_parse <args...>: fill the RUN_* globals from the command line.
cli_parse() {
  RUN_DATA="" RUN_LOG="" RUN_PHASE="" RUN_EVAL_INTERVAL="" RUN_SPLIT="" RUN_NUM_NODES=""
  RUN_RANK_WEIGHTS="" RUN_MASTER="" RUN_WORKER="" RUN_DEBUG=0 RUN_RESUME=0 RUN_MAX_ITER=""
  # shellcheck disable=SC2034 # RUN_NODE_FILE is read by nodes.sh
  RUN_MAX_FAILURES="" RUN_WAIT="" RUN_DRY=0 RUN_HELP=0 RUN_FINAL_EVAL=0 RUN_NODE_ADDR="" RUN_STOP=0 RUN_NODE_FILE=""
  # shellcheck disable=SC2034 # RUN_NODE_ADDR_SOURCE is set and read by slurm.sh
  RUN_ON_FAILURE="" RUN_RANK_SOURCE="" RUN_NODE_ADDR_SOURCE=""
  # shellcheck disable=SC2034 # RUN_DASHBOARD_PORT is read by loop.sh
  RUN_DASHBOARD_PORT=""
  # shellcheck disable=SC2034 # RUN_KEEP_BEST and RUN_KEEP_BEST_MARGIN are read by loop.sh
  RUN_KEEP_BEST=0 RUN_KEEP_BEST_MARGIN=""
  RUN_OVERRIDES=()
  while (($#)); do
    case "$1" in
      --data-path | --log-path | --rl-phase | --eval-interval | --rollout-split | --num-nodes | \
        --rank-weights | --worker | --max-iterations | --max-update-failures | --wait-timeout | --node-addr | --node-file | \
          --on-rank-failure | --dashboard-port | --keep-best-margin)
        cli_need_value "$1" $#
        cli_parse_valued "$1" "$2"
        shift 2
        ;;
      --master) RUN_MASTER=1 && shift ;;
      --debug-mode)
        # shellcheck disable=SC2034 # RUN_DEBUG, RUN_DRY and RUN_HELP are read by run.sh and loop.sh
        RUN_DEBUG=1
        shift
        ;;
      --resume)
        # shellcheck disable=SC2034 # read by loop.sh
        RUN_RESUME=1
        shift
        ;;
      --final-eval) RUN_FINAL_EVAL=1 && shift ;;
      --keep-best) RUN_KEEP_BEST=1 && shift ;;
      --stop)
        # shellcheck disable=SC2034 # read by run.sh
        RUN_STOP=1
        shift
        ;;
      --dry-run)
        # shellcheck disable=SC2034 # read by run.sh
        RUN_DRY=1
        shift
        ;;
      -h | --help)
        # shellcheck disable=SC2034 # read by run.sh
        RUN_HELP=1
        shift
        ;;
      +* | ~* | *=*)
        [[ $1 != -* ]] || cli_bad "unknown option '$1'"
        RUN_OVERRIDES+=("$1")
        shift
        ;;
      *) cli_bad "unknown argument '$1' (flags start with --; overrides look like key=value, +key=value or ~key)" ;;
    esac
  done
}

# cli_parse_valued <flag> <value>: store one flag that takes a value.
cli_parse_valued() {
  case "$1" in
    --data-path) cli_set_once RUN_DATA "$1" "$2" ;;
    --log-path) cli_set_once RUN_LOG "$1" "$2" ;;
    --rl-phase) cli_set_once RUN_PHASE "$1" "$2" ;;
    --eval-interval) cli_set_once RUN_EVAL_INTERVAL "$1" "$2" ;;
    --rollout-split) cli_set_once RUN_SPLIT "$1" "$2" ;;
    --num-nodes) cli_set_once RUN_NUM_NODES "$1" "$2" ;;
    --rank-weights) cli_set_once RUN_RANK_WEIGHTS "$1" "$2" ;;
    --worker) cli_set_once RUN_WORKER "$1" "$2" ;;
    --max-iterations) cli_set_once RUN_MAX_ITER "$1" "$2" ;;
    --max-update-failures) cli_set_once RUN_MAX_FAILURES "$1" "$2" ;;
    --wait-timeout) cli_set_once RUN_WAIT "$1" "$2" ;;
    --node-addr) cli_set_once RUN_NODE_ADDR "$1" "$2" ;;
    --node-file) cli_set_once RUN_NODE_FILE "$1" "$2" ;;
    --on-rank-failure) cli_set_once RUN_ON_FAILURE "$1" "$2" ;;
    --dashboard-port) cli_set_once RUN_DASHBOARD_PORT "$1" "$2" ;;
    --keep-best-margin) cli_set_once RUN_KEEP_BEST_MARGIN "$1" "$2" ;;
  esac
}

# cli_validate: check every rule of the argument table; set RUN_RANK.
cli_validate() {
  cli_validate_paths
  cli_validate_phase
  cli_validate_nodes
  if [[ -n $RUN_MAX_ITER ]] && ! cli_is_int "$RUN_MAX_ITER" 1; then
    cli_bad "--max-iterations must be an integer >= 1 (got '$RUN_MAX_ITER'); omit it to run until stopped"
  fi
  if ((RUN_FINAL_EVAL)) && [[ $RUN_PHASE != both || -z $RUN_MAX_ITER ]]; then
    cli_bad "--final-eval needs --rl-phase both and --max-iterations N (it evaluates the policy of the last iteration)"
  fi
  RUN_ON_FAILURE=${RUN_ON_FAILURE:-abort}
  [[ $RUN_ON_FAILURE == abort || $RUN_ON_FAILURE == continue ]] ||
    cli_bad "--on-rank-failure must be abort or continue (got '$RUN_ON_FAILURE')"
  RUN_MAX_FAILURES=${RUN_MAX_FAILURES:-3}
  cli_is_int "$RUN_MAX_FAILURES" 1 ||
    cli_bad "--max-update-failures must be an integer >= 1 (got '$RUN_MAX_FAILURES')"
  case "${BATON_VLLM_DTYPE:-auto}" in
    auto | float32 | bfloat16 | float16) ;;
    *) cli_bad "BATON_VLLM_DTYPE must be auto, float32, bfloat16 or float16 (got '$BATON_VLLM_DTYPE'); unset it to detect" ;;
  esac
  if [[ -n $RUN_DASHBOARD_PORT ]] && ! { cli_is_int "$RUN_DASHBOARD_PORT" 1 && ((10#$RUN_DASHBOARD_PORT <= 65535)); }; then
    cli_bad "--dashboard-port must be a TCP port in 1..65535 (got '$RUN_DASHBOARD_PORT'); e.g. --dashboard-port 8080, or drop it"
  fi
  cli_validate_keep_best
  cli_validate_env
  RUN_NODE_ADDR=${RUN_NODE_ADDR:-${BATON_NODE_ADDR:-}}
  if [[ -n $RUN_NODE_ADDR && ! $RUN_NODE_ADDR =~ ^[A-Za-z0-9.:_-]+$ ]]; then
    cli_bad "--node-addr must be a host name or an IP address (got '$RUN_NODE_ADDR')"
  fi
  return 0
}

# cli_validate_keep_best: --keep-best needs --rl-phase both and a server of ours; its margin is 0..100 points.
cli_validate_keep_best() {
  if [[ -n $RUN_KEEP_BEST_MARGIN ]]; then
    ((RUN_KEEP_BEST)) || cli_bad "--keep-best-margin $RUN_KEEP_BEST_MARGIN applies with --keep-best only; add --keep-best or drop it"
    if ! [[ $RUN_KEEP_BEST_MARGIN =~ ^[0-9]+(\.[0-9]+)?$ ]] || ! awk -v m="$RUN_KEEP_BEST_MARGIN" 'BEGIN { exit !(m <= 100) }'; then
      cli_bad "--keep-best-margin must be a number of percentage points in 0..100 (got '$RUN_KEEP_BEST_MARGIN'); e.g. --keep-best-margin 2.5"
    fi
  fi
  RUN_KEEP_BEST_MARGIN=${RUN_KEEP_BEST_MARGIN:-0}
  ((RUN_KEEP_BEST)) || return 0
  [[ $RUN_PHASE == both ]] ||
    cli_bad "--keep-best needs --rl-phase both (got --rl-phase $RUN_PHASE): it acts between an evaluation and the update; drop it"
  ((!RUN_DEBUG)) ||
    cli_bad "--keep-best cannot be used with --debug-mode: the external server keeps its weights; drop one of them"
}

# cli_validate_env: the deadlines and counts set in the environment (docs/cli.md) are whole numbers.
cli_validate_env() {
  local name min
  for name in BATON_ROLLOUT_STALL_S BATON_ROLLOUT_TIMEOUT_S BATON_CHECK_TIMEOUT_S BATON_VLLM_START_S \
    BATON_VLLM_RELOAD_S BATON_POLICY_RESTARTS BATON_JOIN_WAIT_S BATON_PROGRESS_S; do
    [[ -n ${!name:-} ]] || continue
    min=0
    case "$name" in BATON_CHECK_TIMEOUT_S | BATON_VLLM_START_S | BATON_VLLM_RELOAD_S | BATON_JOIN_WAIT_S) min=1 ;; esac
    cli_is_int "${!name}" "$min" ||
      cli_bad "$name must be a whole number >= $min (got '${!name}'); unset it for the default (docs/cli.md, Environment)"
  done
}

# cli_validate_paths: --data-path and --log-path are given, absolute, usable.
cli_validate_paths() {
  [[ -n $RUN_DATA ]] || cli_bad "--data-path is required (the shared data directory, e.g. --data-path /data/shared)"
  [[ -n $RUN_LOG ]] || cli_bad "--log-path is required (this experiment's directory, e.g. --log-path /data/exp1)"
  [[ $RUN_DATA == /* ]] || cli_bad "--data-path must be an absolute path (got '$RUN_DATA'); use $PWD/$RUN_DATA"
  [[ $RUN_LOG == /* ]] || cli_bad "--log-path must be an absolute path (got '$RUN_LOG'); use $PWD/$RUN_LOG"
  [[ $RUN_DATA == / ]] || RUN_DATA=${RUN_DATA%/}
  [[ $RUN_LOG == / ]] || RUN_LOG=${RUN_LOG%/}
  [[ -d $RUN_DATA ]] || cli_bad "--data-path $RUN_DATA is not a directory; run: bash scripts/prepare.sh --data-path $RUN_DATA"
  if [[ -e $RUN_LOG && ! -d $RUN_LOG ]]; then
    cli_bad "--log-path $RUN_LOG exists and is not a directory; choose another path"
  fi
  [[ $RUN_LOG != "$RUN_DATA" ]] || cli_bad "--log-path must differ from --data-path (both are $RUN_LOG)"
}

# cli_validate_phase: --rl-phase and the flags that depend on it.
cli_validate_phase() {
  case "$RUN_PHASE" in
    rollout | update | both) ;;
    "") cli_bad "--rl-phase is required: rollout, update or both" ;;
    *) cli_bad "--rl-phase must be rollout, update or both (got '$RUN_PHASE')" ;;
  esac
  if [[ $RUN_PHASE == both ]]; then
    [[ -n $RUN_EVAL_INTERVAL ]] || cli_bad "--rl-phase both requires --eval-interval N (evaluate when iteration % N == 1; N = 1: every iteration)"
    cli_is_int "$RUN_EVAL_INTERVAL" 1 || cli_bad "--eval-interval must be an integer >= 1 (got '$RUN_EVAL_INTERVAL')"
  elif [[ -n $RUN_EVAL_INTERVAL ]]; then
    cli_bad "--eval-interval applies to --rl-phase both only (got --rl-phase $RUN_PHASE); drop it"
  fi
  if [[ $RUN_PHASE == rollout ]]; then
    [[ -n $RUN_SPLIT ]] || cli_bad "--rl-phase rollout requires --rollout-split train-only or eval-only"
    [[ $RUN_SPLIT == train-only || $RUN_SPLIT == eval-only ]] ||
      cli_bad "--rollout-split must be train-only or eval-only (got '$RUN_SPLIT')"
  elif [[ -n $RUN_SPLIT ]]; then
    cli_bad "--rollout-split applies to --rl-phase rollout only (got --rl-phase $RUN_PHASE); drop it"
  fi
  if [[ -n $RUN_WAIT ]]; then
    [[ $RUN_PHASE == update ]] || cli_bad "--wait-timeout applies to --rl-phase update only (got --rl-phase $RUN_PHASE); drop it"
    cli_is_int "$RUN_WAIT" 0 || cli_bad "--wait-timeout must be a number of seconds >= 0 (got '$RUN_WAIT'); 0 stops at once when there is nothing new"
  fi
}

# cli_validate_nodes: --num-nodes, --rank-weights and the rank (flags, $RANK,
# $NODE_RANK, then Slurm's SLURM_PROCID / SLURM_NTASKS under srun).
cli_validate_nodes() {
  local nodes w
  local -a weights
  RUN_RANK_SOURCE=""
  if [[ -n $RUN_NUM_NODES ]] && ! cli_is_int "$RUN_NUM_NODES" 1; then
    cli_bad "--num-nodes must be an integer >= 1 (got '$RUN_NUM_NODES')"
  fi
  if [[ -n $RUN_MASTER && -n $RUN_WORKER ]]; then
    cli_bad "--master and --worker $RUN_WORKER are exclusive; give --master on node 0, --worker R on the others"
  fi
  nodes="--num-nodes ${RUN_NUM_NODES:-1}"
  if [[ -z $RUN_MASTER && -z $RUN_WORKER && -z ${RANK:-} && -z ${NODE_RANK:-} ]] && slurm_in_step; then
    cli_validate_slurm
    nodes="--num-nodes $RUN_NUM_NODES (from SLURM_NTASKS)"
  fi
  RUN_NUM_NODES=${RUN_NUM_NODES:-1}
  if ((RUN_NUM_NODES == 1)); then
    [[ -z $RUN_WORKER ]] || cli_bad "--worker $RUN_WORKER needs --num-nodes > 1 (got 1); drop it for a single node"
    if [[ -n $RUN_RANK_WEIGHTS && ! $RUN_RANK_WEIGHTS =~ ^[0-9]+$ ]]; then
      cli_bad "--rank-weights needs exactly 1 value with $nodes (got '$RUN_RANK_WEIGHTS'); drop it"
    fi
    RUN_RANK=0 RUN_RANK_SOURCE=""
    return 0
  fi
  [[ -n $RUN_RANK_WEIGHTS ]] || cli_bad "$nodes requires --rank-weights with $RUN_NUM_NODES values, e.g. \"$(cli_ones "$RUN_NUM_NODES")\""
  IFS=, read -r -a weights <<<"$RUN_RANK_WEIGHTS"
  ((${#weights[@]} == RUN_NUM_NODES)) || cli_bad "--rank-weights needs exactly $RUN_NUM_NODES values for $nodes (got '$RUN_RANK_WEIGHTS')"
  for w in "${weights[@]}"; do
    cli_is_int "$w" 1 || cli_bad "--rank-weights values must be integers >= 1 (got '$w' in '$RUN_RANK_WEIGHTS')"
  done
  cli_validate_rank
}

# cli_validate_slurm: a task of a Slurm step (srun) with no rank from the flags
# or the environment: each task is one node, so the node count is the step's
# SLURM_NTASKS (--num-nodes, when given, must agree) and the rank SLURM_PROCID.
cli_validate_slurm() {
  cli_is_int "${SLURM_NTASKS:-}" 1 ||
    cli_bad "SLURM_NTASKS must be an integer >= 1 in a Slurm step (got '${SLURM_NTASKS:-}'); give the rank with --master / --worker R"
  if [[ -z $RUN_NUM_NODES ]]; then
    RUN_NUM_NODES=$SLURM_NTASKS
  elif ((RUN_NUM_NODES != SLURM_NTASKS)); then
    cli_bad "--num-nodes $RUN_NUM_NODES does not match this Slurm step's SLURM_NTASKS=$SLURM_NTASKS (each task is one node);" \
      "start one task per node (sbatch or srun --nodes=$RUN_NUM_NODES --ntasks-per-node=1), or give --num-nodes $SLURM_NTASKS"
  fi
  ((RUN_NUM_NODES == 1)) || RUN_RANK_SOURCE=SLURM_PROCID
}

# cli_validate_rank: the node rank of a multi-node run, in priority order; sets
# RUN_RANK and RUN_RANK_SOURCE (--master, --worker, RANK, NODE_RANK, SLURM_PROCID).
cli_validate_rank() {
  if [[ -n $RUN_MASTER ]]; then
    RUN_RANK=0 RUN_RANK_SOURCE="--master"
  elif [[ -n $RUN_WORKER ]]; then
    { cli_is_int "$RUN_WORKER" 1 && ((RUN_WORKER <= RUN_NUM_NODES - 1)); } ||
      cli_bad "--worker must be an integer in 1..$((RUN_NUM_NODES - 1)) for --num-nodes $RUN_NUM_NODES (got '$RUN_WORKER'); node 0 uses --master"
    RUN_RANK=$RUN_WORKER RUN_RANK_SOURCE="--worker"
  elif [[ -n ${RANK:-} ]]; then
    RUN_RANK=$RANK RUN_RANK_SOURCE="RANK"
  elif [[ -n ${NODE_RANK:-} ]]; then
    RUN_RANK=$NODE_RANK RUN_RANK_SOURCE="NODE_RANK"
  elif [[ $RUN_RANK_SOURCE == SLURM_PROCID ]]; then
    RUN_RANK=$SLURM_PROCID
  else
    cli_bad "--num-nodes $RUN_NUM_NODES needs this node's rank: --master, --worker R, RANK / NODE_RANK in the environment," \
      "or one srun task per node (SLURM_PROCID; docs/slurm.md)"
  fi
  { cli_is_int "$RUN_RANK" 0 && ((RUN_RANK < RUN_NUM_NODES)); } ||
    cli_bad "$RUN_RANK_SOURCE must be an integer in 0..$((RUN_NUM_NODES - 1)) for --num-nodes $RUN_NUM_NODES (got '$RUN_RANK')"
}

# cli_ones <n>: print "1,1,...,1" with <n> ones.
cli_ones() {
  local out="1" i
  for ((i = 1; i < $1; i++)); do out+=",1"; done
  printf '%s\n' "$out"
}
