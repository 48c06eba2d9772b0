#!/usr/bin/env bats
# scripts/slurm/baton.sbatch as its batch shell runs it, with stand-ins for srun,
# squeue and scancel and a stand-in repository: one srun of run.sh with the job's
# arguments (RANK / NODE_RANK unset), --resume added on a requeued job, the
# environments built only when missing, and SIGTERM forwarded to the tasks with
# `scancel --signal=TERM` only while the job runs (the time limit's B: signal),
# never to srun. (A real Slurm runs it in tests/e2e/test_slurm.py.)

bats_require_minimum_version 1.5.0

setup() {
  ROOT=$(cd "$BATS_TEST_DIRNAME/../.." && pwd -P)
  T=$BATS_TEST_TMPDIR
  CALLS="$T/calls"
  local var
  for var in $(compgen -e SLURM); do unset "$var"; done
  unset BATON_REPO BATON_ENVS FAKE_ENVS_MISSING FAKE_STATE FAKE_RUN_EXIT FAKE_RUN_NOW
  mkdir -p "$T/repo/scripts/lib" "$T/bin"
  : >"$T/repo/scripts/lib/common.sh"
  # shellcheck disable=SC2016 # the stand-ins' own code, expanded when they run
  printf 'envs_export() { [[ -z ${FAKE_ENVS_MISSING:-} ]]; }\n' >"$T/repo/scripts/lib/envs.sh"
  printf 'printf "setup.sh %%s\\n" "$*" >>"%s"\n' "$CALLS" >"$T/repo/scripts/setup.sh"
  : >"$T/repo/scripts/run.sh"
  # srun: records its arguments (and RANK, NODE_RANK); the run.sh step runs until scancel's
  # stop file appears (or at once with FAKE_RUN_NOW), then exits FAKE_RUN_EXIT (143)
  cat >"$T/bin/srun" <<SH
#!/usr/bin/env bash
printf 'srun %s | RANK=%s NODE_RANK=%s\n' "\$*" "\${RANK-unset}" "\${NODE_RANK-unset}" >>"$CALLS"
[[ " \$* " == *" scripts/run.sh "* ]] || exit 0
until [[ -e "$T/stopped" || -n \${FAKE_RUN_NOW:-} ]]; do sleep 0.05; done
exit "\${FAKE_RUN_EXIT:-143}"
SH
  # shellcheck disable=SC2016 # the stand-in's own code, expanded when it runs
  printf '#!/usr/bin/env bash\nprintf "%%s\\n" "${FAKE_STATE:-RUNNING}"\n' >"$T/bin/squeue"
  printf '#!/usr/bin/env bash\nprintf "scancel %%s\\n" "$*" >>"%s"\ntouch "%s"\n' "$CALLS" "$T/stopped" >"$T/bin/scancel"
  chmod +x "$T/bin/srun" "$T/bin/squeue" "$T/bin/scancel"
  PATH="$T/bin:$PATH"
  export SLURM_JOB_ID=7 SLURM_JOB_NODELIST="n[0-1]" SLURM_NTASKS=2 SLURM_JOB_NUM_NODES=2 SLURM_SUBMIT_DIR="$T/repo"
}

# start_batch <args...>: the batch script in the background, its stderr in $T/err; sets BATCH;
# returns once its srun of run.sh has started.
start_batch() {
  bash "$ROOT/scripts/slurm/baton.sbatch" "$@" 2>"$T/err" &
  BATCH=$!
  local i
  for ((i = 0; i < 200; i++)); do
    grep -q 'scripts/run.sh' "$CALLS" 2>/dev/null && return 0
    sleep 0.05
  done
  printf 'srun of run.sh never started; stderr:\n%s\n' "$(cat "$T/err")" >&2
  return 1
}

# wait_batch: wait for the batch script; RC is its exit code.
wait_batch() {
  RC=0
  wait "$BATCH" || RC=$?
}

@test "one srun of run.sh with the job's arguments, RANK and NODE_RANK unset; srun's exit is the job's" {
  RANK=3 NODE_RANK=3 FAKE_RUN_NOW=1 FAKE_RUN_EXIT=0 run -0 --separate-stderr bash "$ROOT/scripts/slurm/baton.sbatch" \
    --data-path /d --log-path /l --rank-weights 1,1 a.b=1
  [ "$(cat "$CALLS")" = "srun --label --kill-on-bad-exit=0 --chdir=$T/repo bash scripts/run.sh --data-path /d --log-path /l --rank-weights 1,1 a.b=1 | RANK=unset NODE_RANK=unset" ]
  [[ $stderr == *"[baton-sbatch] job 7 on n[0-1]: 2 task(s); repository $T/repo"* ]]
  [[ $stderr == *"[baton-sbatch] run.sh's tasks ended: srun exit 0"* ]]
  FAKE_RUN_NOW=1 FAKE_RUN_EXIT=1 run -1 bash "$ROOT/scripts/slurm/baton.sbatch" --data-path /d
}

@test "a requeued job (SLURM_RESTART_COUNT > 0) continues with --resume, added once" {
  SLURM_RESTART_COUNT=1 FAKE_RUN_NOW=1 FAKE_RUN_EXIT=0 run -0 --separate-stderr bash "$ROOT/scripts/slurm/baton.sbatch" --data-path /d
  [[ $(cat "$CALLS") == *"bash scripts/run.sh --data-path /d --resume | "* ]]
  [[ $stderr == *"restart 1 of a requeued job: adding --resume"* ]]
  : >"$CALLS"
  SLURM_RESTART_COUNT=2 FAKE_RUN_NOW=1 FAKE_RUN_EXIT=0 run -0 bash "$ROOT/scripts/slurm/baton.sbatch" --resume --data-path /d
  [[ $(cat "$CALLS") == *"bash scripts/run.sh --resume --data-path /d | "* ]]
  : >"$CALLS"
  SLURM_RESTART_COUNT=0 FAKE_RUN_NOW=1 FAKE_RUN_EXIT=0 run -0 bash "$ROOT/scripts/slurm/baton.sbatch" --data-path /d
  [[ $(cat "$CALLS") != *"--resume"* ]]
}

@test "SIGTERM while the job runs (the time limit's B: signal) is forwarded with scancel --signal=TERM, not to srun" {
  start_batch --data-path /d
  kill -TERM "$BATCH"
  wait_batch
  [ "$RC" = 143 ]
  [ "$(grep -c '^scancel' "$CALLS")" = 1 ]
  grep -qx "scancel --quiet --signal=TERM 7" "$CALLS"
  grep -q "SIGTERM (the time limit is near): stopping every node at a resumable point" "$T/err"
  grep -q "run.sh's tasks ended: srun exit 143" "$T/err"
}

@test "SIGTERM of a cancelled or requeued job (completing) forwards nothing: Slurm signals every task itself" {
  FAKE_STATE=COMPLETING start_batch --data-path /d
  kill -TERM "$BATCH"
  local i
  for ((i = 0; i < 100; i++)); do
    grep -q "job COMPLETING" "$T/err" && break
    sleep 0.05
  done
  touch "$T/stopped" # the tasks end by Slurm's own SIGTERM
  wait_batch
  [ "$RC" = 143 ]
  run -1 grep -q '^scancel' "$CALLS"
  grep -q "SIGTERM (job COMPLETING: cancelled or requeued): every node stops by Slurm's own SIGTERM" "$T/err"
}

@test "the environments are built only when missing: once here (shared) or on every node (per-node)" {
  FAKE_RUN_NOW=1 FAKE_RUN_EXIT=0 run -0 bash "$ROOT/scripts/slurm/baton.sbatch" --data-path /d
  run -1 grep -q '^setup.sh' "$CALLS"
  FAKE_ENVS_MISSING=1 FAKE_RUN_NOW=1 FAKE_RUN_EXIT=0 run -0 bash "$ROOT/scripts/slurm/baton.sbatch" --data-path /d
  grep -qx 'setup.sh --no-apt' "$CALLS"
  : >"$CALLS"
  BATON_ENVS=per-node FAKE_RUN_NOW=1 FAKE_RUN_EXIT=0 run -0 bash "$ROOT/scripts/slurm/baton.sbatch" --data-path /d
  [[ $(head -n 1 "$CALLS") == "srun --ntasks-per-node=1 --ntasks=2 --chdir=$T/repo --label bash -c "*"envs_export"*"bash scripts/setup.sh --no-apt | "* ]]
}

@test "bad settings stop the job before srun, naming the setting and the fix" {
  BATON_ENVS=everywhere run -2 --separate-stderr bash "$ROOT/scripts/slurm/baton.sbatch" --data-path /d
  [[ $stderr == *"error: BATON_ENVS must be shared or per-node (got 'everywhere')"* ]]
  BATON_REPO="$T/nowhere" run -2 --separate-stderr bash "$ROOT/scripts/slurm/baton.sbatch" --data-path /d
  [[ $stderr == *"error: no scripts/run.sh under BATON_REPO=$T/nowhere; submit from the repository's root or set BATON_REPO"* ]]
  [ ! -e "$CALLS" ]
}
