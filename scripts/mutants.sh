#!/usr/bin/env bash
# What the tests catch, measured with cargo-mutants over the code whose mistakes lose data or
# lie to the operator. Needs root (the root tests on loop devices are among the test runs).
#
#   scripts/mutants.sh full          every mutant of those files; a caught/missed/timeout table
#                                    per file (hours on 2 cores: a release-style audit, not CI)
#   scripts/mutants.sh diff [BASE]   only mutants in lines changed since BASE (default: the merge
#                                    base with origin/main, else HEAD~1), at most MUTANTS_MAX of
#                                    them (default 8; a deterministic slice beyond that): what CI runs
#
# The suite fails when a mutant of the format decision or the pool's allocation and release
# survives (MUST_KILL); other survivors are listed for the report.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT" || exit 1
OUT_DIR=${MUTANTS_OUT:-$REPO_ROOT/target/mutants}
MAX=${MUTANTS_MAX:-8}

# The driver's files (globs survive module splits) and the tests that exercise them: unit tests
# plus the in-process and root tests that drive allocation, staging and identity.
# The data-safety lines: the format decision, allocation, mountinfo matching and the mount
# logic on it (src/volume/mounts), path validation and volume-id parsing (src/request, src/volume/id.rs).
DRIVER_FILES=('src/volume/block/**' 'src/pool/**' src/os/mountinfo.rs 'src/volume/mounts/**'
  'src/request/**' src/volume/id.rs)
DRIVER_TESTS=(--lib --test inprocess --test nfs_inprocess --test security --test node_paths
  --test device_identity --test allocation_root --test block_root --test volume_conditions_root
  --test partition_layout_root --test partition_world_root)
CHECK_FILES=('crates/gds-check/src/parse/**' 'crates/gds-check/src/parse.rs'
  'crates/gds-check/src/node/**' 'crates/gds-check/src/node.rs')
MUST_KILL='^src/(volume/block/|pool/)[^:]*:[0-9]+:[0-9]+: .*(decide_format|allocate|fits|release|erase|verify_identity|existing|nothing_fits|fresh_device|free_devices)'

ensure_cargo_mutants() {
  command -v cargo-mutants >/dev/null && return
  cargo install --locked cargo-mutants || exit 1
}

file_args() { local f; for f in "$@"; do printf -- '-f\n%s\n' "$f"; done; }

# run NAME PACKAGE FILES... -- TEST ARGS...
run() {
  local name=$1 package=$2; shift 2
  local files=() tests=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do files+=("$1"); shift; done
  shift; tests=("$@")
  rm -rf "${OUT_DIR:?}/$name"
  local args=(--package "$package" --test-workspace=false --timeout 300 -o "$OUT_DIR/$name")
  mapfile -t fa < <(file_args "${files[@]}")
  args+=("${fa[@]}")
  if [ -n "${DIFF_FILE:-}" ]; then
    args+=(--in-diff "$DIFF_FILE")
    local n
    n=$(cargo mutants "${args[@]}" --list 2>/dev/null | wc -l)
    echo "$name: $n mutants in the changed lines"
    [ "$n" -eq 0 ] && return 0
    if [ "$n" -gt "$MAX" ]; then
      local shards=$(((n + MAX - 1) / MAX))
      echo "$name: more than $MAX: running slice 1/$shards (sharding=round-robin)"
      args+=(--shard "1/$shards" --sharding round-robin)
    fi
  fi
  # The test targets go to every cargo call, the build too: after `--` they would reach
  # only `cargo test`, and each mutant's build would link every test binary of the package.
  local i
  for ((i = 0; i < ${#tests[@]}; i++)); do
    if [ "${tests[i]}" = --test ]; then
      args+=("--cargo-arg=--test=${tests[i + 1]}")
      i=$((i + 1))
    else
      args+=("--cargo-arg=${tests[i]}")
    fi
  done
  GDS_CSI_NO_SKIP=1 cargo mutants "${args[@]}"
  local status=$?
  # 0: all caught; 2: some missed; 3: timeouts. Anything else is a broken run.
  case $status in 0 | 2 | 3) ;; *) echo "$name: cargo mutants failed ($status)"; return 1 ;; esac
}

# Per file: caught / missed / timeout / unviable, from cargo-mutants' outcome lists.
report() {
  local dir=$1/mutants.out
  [ -d "$dir" ] || return 0
  printf '%-48s %7s %7s %8s %9s\n' file caught missed timeout unviable
  cat "$dir"/{caught,missed,timeout,unviable}.txt 2>/dev/null | cut -d: -f1 | sort -u |
    while read -r f; do
      local c m t u
      c=$(grep -c "^$f:" "$dir/caught.txt" 2>/dev/null)
      m=$(grep -c "^$f:" "$dir/missed.txt" 2>/dev/null)
      t=$(grep -c "^$f:" "$dir/timeout.txt" 2>/dev/null)
      u=$(grep -c "^$f:" "$dir/unviable.txt" 2>/dev/null)
      printf '%-48s %7s %7s %8s %9s\n' "$f" "${c:-0}" "${m:-0}" "${t:-0}" "${u:-0}"
    done
  if [ -s "$dir/missed.txt" ]; then echo "missed:"; sed 's/^/  /' "$dir/missed.txt"; fi
}

need_root
mode=${1:-diff}
case $mode in
  full) DIFF_FILE= ;;
  diff)
    # The change under test: since the merge base with origin/main, or (on main itself, where
    # that is HEAD) the last commit.
    base=${2:-$(git merge-base HEAD origin/main 2>/dev/null)}
    [ -z "$base" ] || [ "$(git rev-parse "$base")" = "$(git rev-parse HEAD)" ] && base=$(git rev-parse HEAD~1)
    echo "mutating lines changed since $(git rev-parse --short "$base")"
    if ! git diff --name-only "$base" HEAD -- src crates/gds-check/src | grep -qE \
      '^(src/(volume/block|pool|request|mounts)|src/(os/mountinfo|volume/id)\.rs|crates/gds-check/src/(parse|node))'; then
      echo "no data-safety file changed: nothing to mutate"
      exit 0
    fi
    DIFF_FILE=$(mktemp)
    git diff "$base" HEAD -- src crates/gds-check/src >"$DIFF_FILE"
    ;;
  *) echo "usage: $0 full | diff [BASE]"; exit 2 ;;
esac
ensure_cargo_mutants
mkdir -p "$OUT_DIR"
failed=0
run driver gds-csi "${DRIVER_FILES[@]}" -- "${DRIVER_TESTS[@]}" || failed=1
run gds-check gds-check "${CHECK_FILES[@]}" -- --lib --test checks || failed=1
for name in driver gds-check; do echo "== $name"; report "$OUT_DIR/$name"; done
if grep -hE "$MUST_KILL" "$OUT_DIR"/*/mutants.out/missed.txt 2>/dev/null; then
  echo "mutants of the format decision or allocation survived (above): each needs a test"
  failed=1
fi
[ -n "${DIFF_FILE:-}" ] && rm -f "$DIFF_FILE"
exit $failed
