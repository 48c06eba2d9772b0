#!/usr/bin/env bash
# Slurm's view of this run.sh: under `srun` with one task per node, each task
# is one node of a multi-node run (its rank SLURM_PROCID, the node count
# SLURM_NTASKS), so that one `srun bash scripts/run.sh ...` starts every node.
# Flags and RANK / NODE_RANK come first (cli.sh); Slurm only fills in what they
# leave open. The master's address still travels in the run record (nodes.sh);
# the first host of SLURM_JOB_NODELIST is only rank 0's default --node-addr.
# Reference: docs/slurm.md. Library file: defines functions only. Needs common.sh.

# slurm_in_step: true in a task of a Slurm job step (srun), whose SLURM_PROCID
# and SLURM_NTASKS are the step's. A batch script's own shell has SLURM_PROCID=0
# and the job's SLURM_NTASKS too, but no step id: it is not a task.
slurm_in_step() {
  [[ -n ${SLURM_STEP_ID:-} && -n ${SLURM_PROCID:-} && ${SLURM_STEP_ID:-} != batch ]]
}

# slurm_first_host <hostlist>: print the first host of a Slurm host list
# ("gpu[003-004,010],cpu1" -> gpu003; "rack[1-2]n[5-6]" -> rack1n5), as
# `scontrol show hostnames` would, without asking Slurm.
slurm_first_host() {
  local list=$1 host="" range
  while [[ -n $list && ${list:0:1} != , ]]; do
    if [[ ${list:0:1} == '[' && $list == *']'* ]]; then
      range=${list%%]*}
      range=${range#[}
      host+=${range%%[,-]*}
      list=${list#*]}
    else
      host+=${list:0:1}
      list=${list:1}
    fi
  done
  printf '%s\n' "$host"
}

# slurm_default_addr: on rank 0 of a run whose rank came from Slurm, with no
# address given (--node-addr, BATON_NODE_ADDR, the node file), take the first
# host of SLURM_JOB_NODELIST, when that is this node (task 0's node under
# srun's default block distribution). Workers learn it from the run record.
slurm_default_addr() {
  local host
  [[ -z $RUN_NODE_ADDR && ${RUN_RANK_SOURCE:-} == SLURM_PROCID && $RUN_RANK == 0 ]] || return 0
  host=$(slurm_first_host "${SLURM_JOB_NODELIST:-}")
  [[ -n $host && $host =~ ^[A-Za-z0-9.:_-]+$ ]] || return 0
  if [[ -n ${SLURMD_NODENAME:-} && $host != "$SLURMD_NODENAME" ]]; then
    common_log "Slurm: task 0 runs on $SLURMD_NODENAME, not on the first host of SLURM_JOB_NODELIST ($host);" \
      "the master's address is this host's default route's (give --node-addr to choose)"
    return 0
  fi
  RUN_NODE_ADDR=$host
  RUN_NODE_ADDR_SOURCE="the first host of SLURM_JOB_NODELIST"
}

# slurm_describe: print one line on where this run.sh runs in Slurm (nothing outside a step).
slurm_describe() {
  slurm_in_step || return 0
  printf 'Slurm job %s step %s: task %s of %s on %s' "${SLURM_JOB_ID:-?}" "$SLURM_STEP_ID" "$SLURM_PROCID" \
    "${SLURM_NTASKS:-?}" "${SLURMD_NODENAME:-$(hostname)}"
  [[ ${RUN_RANK_SOURCE:-} != SLURM_PROCID ]] || printf '; rank %s of %s from SLURM_PROCID / SLURM_NTASKS' \
    "$RUN_RANK" "$RUN_NUM_NODES"
  [[ -z ${RUN_NODE_ADDR_SOURCE:-} ]] || printf '; address %s (%s)' "$RUN_NODE_ADDR" "$RUN_NODE_ADDR_SOURCE"
  printf '\n'
}
