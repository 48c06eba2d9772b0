#!/usr/bin/env bash
# System packages Baton needs (Chromium for MiniWoB++, a C compiler for
# TextWorld's jericho), and those only its tests need (a real Slurm for
# tests/e2e/test_slurm.py; GlusterFS and sshfs, a real shared filesystem for the
# multi-node tests: bench/sharedfs.py): detection and installation with apt.
# Library file: defines functions only. Needs common.sh.

# sysdeps_chromium: print the path of a Chromium binary Playwright can launch.
sysdeps_chromium() {
  local candidate
  for candidate in "${BATON_CHROMIUM:-}" /usr/lib/chromium/chromium /usr/bin/chromium /usr/bin/chromium-browser; do
    [[ -n $candidate && -x $candidate ]] || continue
    printf '%s\n' "$candidate"
    return 0
  done
  return 1
}

# sysdeps_missing: print the Debian packages that are needed but not present.
sysdeps_missing() {
  sysdeps_chromium >/dev/null || printf 'chromium\n'
  command -v gcc >/dev/null 2>&1 || printf 'gcc\n'
  command -v make >/dev/null 2>&1 || printf 'make\n'
  command -v flock >/dev/null 2>&1 || printf 'util-linux\n'
  command -v curl >/dev/null 2>&1 || printf 'curl\n'
  command -v ps >/dev/null 2>&1 || printf 'procps\n'
  return 0
}

# sysdeps_missing_for_tests: print the Debian packages only the tests need that are not present.
sysdeps_missing_for_tests() {
  local tool
  for tool in slurmctld slurmd sbatch; do
    command -v "$tool" >/dev/null 2>&1 || {
      printf 'slurm-wlm\n'
      break
    }
  done
  command -v munged >/dev/null 2>&1 || printf 'munge\n'
  command -v glusterd >/dev/null 2>&1 || printf 'glusterfs-server\n'
  command -v glusterfs >/dev/null 2>&1 || printf 'glusterfs-client\n'
  command -v sshfs >/dev/null 2>&1 || printf 'sshfs\n'
  command -v sshd >/dev/null 2>&1 || printf 'openssh-server\n'
  command -v ip >/dev/null 2>&1 || printf 'iproute2\n'
  return 0
}

# sysdeps_can_apt: true when apt-get can be run (as root, apt-get present).
sysdeps_can_apt() {
  [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1
}

# sysdeps_ensure <allow_apt> [for_tests]: install missing packages with apt
# (with for_tests=1 also the tests' own), or fail with the command to run.
sysdeps_ensure() {
  local allow_apt=$1 for_tests=${2:-0} log
  local -a missing
  mapfile -t missing < <(sysdeps_missing && if ((for_tests)); then sysdeps_missing_for_tests; fi)
  ((${#missing[@]})) || return 0
  if [[ $allow_apt != 1 ]] || ! sysdeps_can_apt; then
    common_die 1 "missing system packages: ${missing[*]}; install them with: sudo apt-get install -y ${missing[*]} (then rerun)"
  fi
  log="$(common_baton_home)/logs/setup-apt.log"
  mkdir -p "$(dirname "$log")"
  common_run_logged "apt-get update" "$log" apt-get update -q ||
    common_die 1 "apt-get update failed; check the network route to the Debian mirrors"
  common_run_logged "apt-get install ${missing[*]}" "$log" \
    env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" ||
    common_die 1 "apt-get install ${missing[*]} failed (log above)"
}
