#!/usr/bin/env bats
# setup.sh's detection helpers: device, interpreter, environment paths, system packages.

bats_require_minimum_version 1.5.0

setup() {
  ROOT=$(cd "$BATS_TEST_DIRNAME/../.." && pwd -P)
  source "$ROOT/scripts/lib/common.sh"
  source "$ROOT/scripts/lib/envs.sh"
  source "$ROOT/scripts/lib/sysdeps.sh"
  FAKEBIN="$BATS_TEST_TMPDIR/bin"
  mkdir -p "$FAKEBIN"
  unset BATON_DEVICE BATON_PYTHON CUDA_VISIBLE_DEVICES
}

fake_nvidia_smi() {
  printf '#!/bin/sh\n%s\n' "$1" >"$FAKEBIN/nvidia-smi"
  chmod +x "$FAKEBIN/nvidia-smi"
}

@test "envs_device: cpu when nvidia-smi is absent" {
  PATH="$FAKEBIN:/usr/bin:/bin" run -0 envs_device
  [ "$output" = cpu ]
}

@test "envs_device: cuda when nvidia-smi lists GPUs, and counts them" {
  fake_nvidia_smi 'printf "GPU 0: NVIDIA H100 (UUID: a)\nGPU 1: NVIDIA H100 (UUID: b)\n"'
  PATH="$FAKEBIN:$PATH" run -0 envs_device
  [ "$output" = cuda ]
  PATH="$FAKEBIN:$PATH" run -0 envs_gpu_count
  [ "$output" = 2 ]
  PATH="$FAKEBIN:$PATH" run -0 envs_recipe_name serve
  [ "$output" = serve-cuda ]
}

@test "envs_device: cpu when nvidia-smi exists but finds no GPU" {
  fake_nvidia_smi 'echo "No devices were found"; exit 6'
  PATH="$FAKEBIN:$PATH" run -0 envs_device
  [ "$output" = cpu ]
  PATH="$FAKEBIN:$PATH" run -0 envs_gpu_count
  [ "$output" = 0 ]
}

@test "envs_gpu_count: CUDA_VISIBLE_DEVICES narrows the GPUs nvidia-smi lists (as torch counts them)" {
  # shellcheck disable=SC2016 # $i is the fake's own variable
  fake_nvidia_smi 'for i in 0 1 2 3 4 5 6 7; do echo "GPU $i: NVIDIA H100 (UUID: GPU-$i)"; done'
  PATH="$FAKEBIN:$PATH" CUDA_VISIBLE_DEVICES=0,1 run -0 envs_gpu_count
  [ "$output" = 2 ]
  PATH="$FAKEBIN:$PATH" CUDA_VISIBLE_DEVICES=GPU-3 run -0 envs_gpu_count
  [ "$output" = 1 ]
  PATH="$FAKEBIN:$PATH" CUDA_VISIBLE_DEVICES='' run -0 envs_gpu_count
  [ "$output" = 0 ]
  # more names than GPUs: only the listed ones exist
  PATH="$FAKEBIN:$PATH" CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7,8,9 run -0 envs_gpu_count
  [ "$output" = 8 ]
  PATH="$FAKEBIN:$PATH" run -0 envs_gpu_count
  [ "$output" = 8 ]
}

@test "envs_device: BATON_DEVICE overrides detection; a bad value is exit 2 naming it" {
  BATON_DEVICE=cuda run -0 envs_device
  [ "$output" = cuda ]
  BATON_DEVICE=tpu run -2 envs_device
  [[ $output == *"BATON_DEVICE must be cpu or cuda (got 'tpu')"* ]]
}

@test "envs_recipe_name: app and train as is, serve by device, others rejected" {
  BATON_DEVICE=cpu run -0 envs_recipe_name serve
  [ "$output" = serve-cpu ]
  run -0 envs_recipe_name train
  [ "$output" = train ]
  run -2 envs_recipe_name gpu
  [[ $output == *"unknown environment 'gpu'"* ]]
}

@test "envs_base_python: rejects an interpreter older than 3.11" {
  printf '#!/bin/sh\nexit 1\n' >"$FAKEBIN/python-old"
  chmod +x "$FAKEBIN/python-old"
  PATH="$FAKEBIN" BATON_PYTHON=python-old run -1 envs_base_python
  [ -z "$output" ]
}

@test "envs_base_python: accepts a 3.11 interpreter from BATON_PYTHON" {
  BATON_PYTHON=python3 run -0 envs_base_python
  [[ $output == */python3* ]]
}

@test "envs_dir: keyed by recipe and a hash of the pins, under BATON_HOME" {
  BATON_HOME="$BATS_TEST_TMPDIR/home" BATON_DEVICE=cpu run -0 envs_dir serve
  [[ $output =~ ^$BATS_TEST_TMPDIR/home/envs/serve-cpu-[0-9a-f]{12}$ ]]
  BATON_HOME="$BATS_TEST_TMPDIR/home" BATON_DEVICE=cuda run -0 envs_dir serve
  [[ $output =~ /serve-cuda-[0-9a-f]{12}$ ]]
}

@test "envs_dir: several environments at once, each the directory it has alone, in the order asked" {
  export BATON_HOME="$BATS_TEST_TMPDIR/home" BATON_DEVICE=cpu
  run -0 envs_dir train app serve
  [ "${#lines[@]}" -eq 3 ]
  [ "${lines[0]}" = "$(envs_dir train)" ] && [ "${lines[1]}" = "$(envs_dir app)" ] && [ "${lines[2]}" = "$(envs_dir serve)" ]
  [[ ${lines[2]} == "$BATON_HOME/envs/serve-cpu-"* ]]
}

@test "envs_export: the first environment not set up is named with the setup hint, nothing exported" {
  local home="$BATS_TEST_TMPDIR/home" dir
  dir=$(BATON_HOME=$home envs_dir app)
  python3 -m venv --without-pip "$dir" && date >"$dir/.baton-verified"
  # shellcheck disable=SC2016 # $1 is the inner bash's argument
  BATON_HOME=$home run -1 bash -c 'set -e; source "$1/scripts/lib/common.sh"; source "$1/scripts/lib/envs.sh"; envs_export; echo exported' _ "$ROOT"
  [[ $output == *"the serve environment is not set up ($home/envs/serve-"*"run: bash scripts/setup.sh"* ]]
  [[ $output != *exported* ]]
}

@test "envs_is_complete: only a verified environment counts" {
  local dir="$BATS_TEST_TMPDIR/env"
  python3 -m venv --without-pip "$dir"
  run -1 envs_is_complete "$dir"
  date >"$dir/.baton-verified"
  run -0 envs_is_complete "$dir"
  rm "$dir/bin/python"
  run -1 envs_is_complete "$dir"
}

@test "envs_python: a missing environment fails with the setup hint" {
  BATON_HOME="$BATS_TEST_TMPDIR/empty" run -1 envs_python train
  [[ $output == *"the train environment is not set up"*"run: bash scripts/setup.sh"* ]]
}

@test "sysdeps_missing: names the Debian packages of missing tools" {
  ln -s "$(command -v bash)" "$FAKEBIN/bash"
  PATH="$FAKEBIN" BATON_CHROMIUM=/nonexistent run -0 sysdeps_missing
  [[ $output == *gcc* && $output == *make* && $output == *curl* && $output == *procps* ]]
}

@test "sysdeps_ensure: without apt it fails with the exact install command" {
  ln -s "$(command -v bash)" "$FAKEBIN/bash"
  PATH="$FAKEBIN" run -1 sysdeps_ensure 0
  [[ $output == *"missing system packages: "*"install them with: sudo apt-get install -y "*gcc* ]]
}

@test "sysdeps: the tests' own packages (a real Slurm, a shared filesystem) only when asked for" {
  ln -s "$(command -v bash)" "$FAKEBIN/bash"
  PATH="$FAKEBIN" run -0 sysdeps_missing_for_tests
  [ "$output" = $'slurm-wlm\nmunge\nglusterfs-server\nglusterfs-client\nsshfs\nopenssh-server\niproute2' ]
  PATH="$FAKEBIN" BATON_CHROMIUM=/nonexistent run -1 sysdeps_ensure 0
  [[ $output != *slurm-wlm* ]]
  PATH="$FAKEBIN" BATON_CHROMIUM=/nonexistent run -1 sysdeps_ensure 0 1
  [[ $output == *"install them with: sudo apt-get install -y "*" slurm-wlm munge glusterfs-server"* ]]
  printf '#!/bin/sh\n' >"$FAKEBIN/tool"
  chmod +x "$FAKEBIN/tool"
  local tool
  for tool in slurmctld slurmd sbatch munged glusterd glusterfs sshfs sshd ip; do ln -s "$FAKEBIN/tool" "$FAKEBIN/$tool"; done
  PATH="$FAKEBIN" run -0 sysdeps_missing_for_tests
  [ -z "$output" ]
}

@test "sysdeps_chromium: BATON_CHROMIUM wins when executable" {
  printf '#!/bin/sh\n' >"$FAKEBIN/chromium"
  chmod +x "$FAKEBIN/chromium"
  BATON_CHROMIUM="$FAKEBIN/chromium" run -0 sysdeps_chromium
  [ "$output" = "$FAKEBIN/chromium" ]
}

@test "setup.sh: an unknown --only value is exit 2 naming it, nothing built" {
  BATON_HOME="$BATS_TEST_TMPDIR/home" run -2 bash "$ROOT/scripts/setup.sh" --only gpu
  [[ $output == *"--only must be app, serve or train (got 'gpu')"* ]]
  [ ! -e "$BATS_TEST_TMPDIR/home" ]
}

@test "setup.sh: unknown flags print usage and exit 2" {
  run -2 bash "$ROOT/scripts/setup.sh" --frobnicate
  [[ $output == *"Usage: bash scripts/setup.sh"* && $output == *"unknown argument '--frobnicate'"* ]]
}

@test "setup.sh: an unsupported Python is one clear error, nothing created" {
  ln -s "$(command -v bash)" "$FAKEBIN/bash"
  ln -s "$(command -v dirname)" "$FAKEBIN/dirname"
  for py in python3 python3.11 python3.12; do
    # shellcheck disable=SC2016 # the fake interpreter's own script, expanded when it runs
    printf '#!/bin/sh\n[ "$1" = --version ] && { echo "Python 3.9.2"; exit 0; }\nexit 1\n' >"$FAKEBIN/$py"
    chmod +x "$FAKEBIN/$py"
  done
  PATH="$FAKEBIN" BATON_HOME="$BATS_TEST_TMPDIR/home" run -1 "$FAKEBIN/bash" "$ROOT/scripts/setup.sh"
  [[ $output == *"Baton needs Python 3.11 or 3.12 (found: Python 3.9.2)"*"BATON_PYTHON"* ]]
  [ ! -e "$BATS_TEST_TMPDIR/home" ]
}

@test "sysdeps_can_apt: false when not root" {
  printf '#!/bin/sh\necho 1000\n' >"$FAKEBIN/id"
  chmod +x "$FAKEBIN/id"
  PATH="$FAKEBIN:$PATH" run -1 sysdeps_can_apt
}

@test "setup.sh: no route to the package index fails clearly and leaves no half-built env" {
  local home="$BATS_TEST_TMPDIR/home"
  PIP_INDEX_URL=http://127.0.0.1:9/simple PIP_EXTRA_INDEX_URL="" PIP_FIND_LINKS="" PIP_RETRIES=0 PIP_TIMEOUT=5 \
    BATON_HOME="$home" run -1 bash "$ROOT/scripts/setup.sh" --only app
  [[ $output == *"app: install failed"*"check that pip reaches the package index"* ]]
  run -0 find "$home/envs" -mindepth 1 -maxdepth 1
  [ -z "$output" ]
}

@test "setup.sh: environments built side by side each fail on their own, named, and the setup fails after both" {
  local home="$BATS_TEST_TMPDIR/home"
  PIP_INDEX_URL=http://127.0.0.1:9/simple PIP_EXTRA_INDEX_URL="" PIP_FIND_LINKS="" PIP_RETRIES=0 PIP_TIMEOUT=5 \
    BATON_HOME="$home" run -1 bash "$ROOT/scripts/setup.sh" --only app --only train
  [[ $output == *"app: install failed"* && $output == *"train: install failed"* ]]
  [[ ${lines[-1]} == *"setup failed (the environment named above); rerun to retry it"* ]]
  [[ $output != *"setup complete"* ]]
  run -0 find "$home/envs" -mindepth 1 -maxdepth 1
  [ -z "$output" ]
}

# pins_copy: a copy of the repository's recipe files under $BATS_TEST_TMPDIR/repo (pins.py finds them from its path).
pins_copy() {
  local repo="$BATS_TEST_TMPDIR/repo"
  mkdir -p "$repo/scripts/lib"
  cp "$ROOT/pyproject.toml" "$repo/"
  cp "$ROOT/scripts/lib/pins.py" "$repo/scripts/lib/"
  cp -r "$ROOT/scripts/locks" "$repo/scripts/"
  printf '%s\n' "$repo"
}

@test "pins.py: every install runs with the environment's lock as constraints, an extra's flags kept" {
  run -0 python3 "$ROOT/scripts/lib/pins.py" train
  [[ ${lines[0]} == $'install\t-c\t'"$ROOT/scripts/locks/train.txt"$'\ttorch==2.11.0\t'* ]]
  [[ ${lines[1]} == $'install\t-c\t'"$ROOT/scripts/locks/train.txt"$'\t--no-build-isolation\tdeepspeed==0.19.8' ]]
  run -0 python3 "$ROOT/scripts/lib/pins.py" app --unlocked
  [ "${lines[1]}" = $'install\t--no-deps\tminiwob==1.1.0' ]
}

@test "pins.py: the hash covers the lock's content (a transitive pin), not the checkout's path" {
  local repo before
  repo=$(pins_copy)
  before=$(python3 "$ROOT/scripts/lib/pins.py" app --hash)
  run -0 python3 "$repo/scripts/lib/pins.py" app --hash
  [ "$output" = "$before" ]
  sed -i 's/^idna==.*/idna==0.0.1/' "$repo/scripts/locks/app.txt"
  run -0 python3 "$repo/scripts/lib/pins.py" app --hash
  [[ $output =~ ^[0-9a-f]{12}$ && $output != "$before" ]]
}

@test "pins.py: the serve-cpu hash covers the files its site step copies; a missing one is refused naming it" {
  local repo before
  repo=$(pins_copy)
  cp -r "$ROOT/scripts/lib/site" "$repo/scripts/lib/"
  before=$(python3 "$ROOT/scripts/lib/pins.py" serve-cpu --hash)
  run -0 python3 "$repo/scripts/lib/pins.py" serve-cpu
  [[ $output == *$'\nsite\tscripts/lib/site/baton_torchvision_cpu.py\tscripts/lib/site/baton_torchvision_cpu.pth\n'* ]]
  printf '# changed\n' >>"$repo/scripts/lib/site/baton_torchvision_cpu.py"
  run -0 python3 "$repo/scripts/lib/pins.py" serve-cpu --hash
  [[ $output =~ ^[0-9a-f]{12}$ && $output != "$before" ]]
  rm "$repo/scripts/lib/site/baton_torchvision_cpu.pth"
  run -2 python3 "$repo/scripts/lib/pins.py" serve-cpu --hash
  [[ $output == *"scripts/lib/site/baton_torchvision_cpu.pth is no file of the repository"* ]]
}

@test "pins.py: a missing lock names the command that makes it; a raw install step is refused" {
  local repo
  repo=$(pins_copy)
  rm "$repo/scripts/locks/train.txt"
  run -2 python3 "$repo/scripts/lib/pins.py" train --hash
  [[ $output == *"scripts/locks/train.txt is missing; make it with: bash scripts/lock.sh train"* ]]
  sed -i 's/^  "extra miniwob --no-deps",/  "install --no-deps miniwob==1.1.0",/' "$repo/pyproject.toml"
  run -2 python3 "$repo/scripts/lib/pins.py" app
  [[ $output == *"bad step 'install --no-deps miniwob==1.1.0' in [tool.baton.envs.app]"* ]]
}

@test "lock.sh: an unknown recipe is exit 2 naming it, nothing written" {
  run -2 bash "$ROOT/scripts/lock.sh" gpu
  [[ $output == *"RECIPE must be app, serve-cpu, serve-cuda or train (got 'gpu')"* ]]
  [ ! -e "$ROOT/scripts/locks/gpu.txt" ]
  run -2 bash "$ROOT/scripts/lock.sh"
  [[ $output == *"Usage: bash scripts/lock.sh RECIPE"* ]]
}
