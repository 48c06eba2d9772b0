#!/usr/bin/env bats
# common.sh: common_atomic_copy replaces a file by a rename in its own directory, never in place.

bats_require_minimum_version 1.5.0

setup() {
  ROOT=$(cd "$BATS_TEST_DIRNAME/../.." && pwd -P)
  source "$ROOT/scripts/lib/common.sh"
  SRC="$BATS_TEST_TMPDIR/src/resolved.yaml"
  DST="$BATS_TEST_TMPDIR/log/run/config.yaml"
  mkdir -p "$(dirname "$SRC")" "$(dirname "$DST")"
  printf 'new: 1\n' >"$SRC"
  chmod 0600 "$SRC" # as mktemp makes it
  printf 'old: 0\n' >"$DST"
}

@test "common_atomic_copy replaces the file whole, 0644, and leaves no temp file" {
  run -0 common_atomic_copy "$SRC" "$DST"
  [ "$output" = "" ]
  [ "$(cat "$DST")" = "new: 1" ]
  [ "$(stat -c %a "$DST")" = 644 ]
  [ "$(ls -A "$(dirname "$DST")")" = config.yaml ]
  [ "$(cat "$SRC")" = "new: 1" ]
}

@test "common_atomic_copy renames a new file over the old one: a reader of the old one reads it whole" {
  exec {reader}<"$DST"
  common_atomic_copy "$SRC" "$DST"
  [ "$(cat <&"$reader")" = "old: 0" ] # cp -f would have rewritten this very file in place
  exec {reader}<&-
  [ "$(cat "$DST")" = "new: 1" ]
}

@test "common_atomic_copy writes its temp file in the destination's directory (no rename across filesystems)" {
  cp() {
    printf '%s\n' "${@: -1}" >"$BATS_TEST_TMPDIR/cp.target"
    command cp "$@"
  }
  common_atomic_copy "$SRC" "$DST"
  [ "$(dirname "$(cat "$BATS_TEST_TMPDIR/cp.target")")" = "$(dirname "$DST")" ]
}

@test "common_atomic_copy: a failed copy leaves the destination untouched and no temp file" {
  run -1 common_atomic_copy "$BATS_TEST_TMPDIR/missing.yaml" "$DST"
  [[ $output == *"missing.yaml"* ]]
  [ "$(cat "$DST")" = "old: 0" ]
  [ "$(ls -A "$(dirname "$DST")")" = config.yaml ]
  run -1 common_atomic_copy "$SRC" "$BATS_TEST_TMPDIR/no/such/dir/config.yaml"
}
