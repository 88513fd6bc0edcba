#!/usr/bin/env bash
# One check of msa-tune on a GPU machine (issue 25): the GPU tests, the randomized differential tester
# (issue 35), a two-bucket tune, the quick benchmark and the host-cost benchmark, each timed; ends with exactly one summary line and exits
# non-zero when a part failed. Works on a bare image without registry access: the repo goes on
# PYTHONPATH (no build step), and the tuner's wheels come from .whl/ (README: "Checking on a GPU").
#
#   bash scripts/gpu_check.sh [--log PATH] [--only PARTS] [-n WORKERS] [--dry-run]
#   bash scripts/gpu_check.sh --fingerprint   # prints the sources' fingerprint a log's header names
#
# PARTS: a comma list of tests, fuzz, tune, bench, host_cost (default: all). --dry-run prints what each
# part would run, runs nothing. The header names the git commit and a fingerprint of the sources that
# run (the code, templates, tables, tests and scripts): a machine that gets a copy of the files without
# their git history reports a stale commit, never a stale fingerprint. GPU_CHECK_CMD_<PART> (e.g.
# GPU_CHECK_CMD_TESTS) replaces a part's command: how tests/interp/test_gpu_check.py exercises the
# script without a GPU.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 2

LOG=gpu_check.log
ONLY=tests,fuzz,tune,bench,host_cost
WORKERS=""
DRY=0
fingerprint() {  # sha256 over each source file's path and content, sorted by path (C locale): 16 hex
  (cd "$ROOT" && find codegen templates tuned_configs tests scripts benchmarks tune.py -type f \
     -not -path '*/__pycache__/*' -not -name '*.pyc' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum \
     | sha256sum | cut -c1-16)
}
usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --log) [ $# -ge 2 ] || { echo "gpu_check: --log needs a path" >&2; exit 2; }; LOG=$2; shift 2 ;;
    --only) [ $# -ge 2 ] || { echo "gpu_check: --only needs a comma list of parts" >&2; exit 2; }; ONLY=$2; shift 2 ;;
    -n) [ $# -ge 2 ] || { echo "gpu_check: -n needs a number of workers" >&2; exit 2; }; WORKERS=$2; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    --fingerprint) fingerprint; exit 0 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
PARTS=(tests fuzz tune bench host_cost)
IFS=',' read -r -a WANTED <<< "$ONLY"
[ ${#WANTED[@]} -gt 0 ] || { echo "gpu_check: --only: no part named (expected some of ${PARTS[*]})" >&2; exit 2; }
for part in "${WANTED[@]}"; do
  case " ${PARTS[*]} " in *" $part "*) ;; *) echo "gpu_check: --only: unknown part '$part' (expected some of ${PARTS[*]})" >&2; exit 2 ;; esac
done
if [ -n "$WORKERS" ] && ! [[ "$WORKERS" =~ ^[0-9]+$ && "$WORKERS" -ge 1 ]]; then
  echo "gpu_check: -n: expected a positive number of workers, got '$WORKERS'" >&2; exit 2
fi
wanted() { case ",$ONLY," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
PY=${PYTHON:-python3}

setup() {
  # The repo itself on PYTHONPATH: no editable install (on a bare image pip could not fetch setuptools).
  export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
  # The tuner's wheels, those whose distribution is not installed yet (never shadow the image's own).
  if compgen -G "$ROOT/.whl/*.whl" > /dev/null; then
    local site=${GPU_CHECK_SITE:-/tmp/msa-tune-site} missing
    missing=$("$PY" - "$ROOT"/.whl/*.whl <<'PYEOF'
import importlib.metadata as md, os, re, sys
for path in sys.argv[1:]:
    dist = re.sub(r"[-_.]+", "-", os.path.basename(path).split("-")[0]).lower()
    try:
        md.version(dist)
    except md.PackageNotFoundError:
        print(path)
PYEOF
)
    if [ -n "$missing" ]; then
      echo "gpu_check: installing $(echo "$missing" | wc -l) wheel(s) from .whl/ into $site"
      local wheel  # one at a time: a wheel for another Python must not keep the others out
      while read -r wheel; do
        PIP_ROOT_USER_ACTION=ignore "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$wheel" \
          || echo "gpu_check: WARNING: could not install $(basename "$wheel") (another Python's wheel?)"
      done <<< "$missing"
      export PYTHONPATH="$PYTHONPATH:$site"
    fi
  fi
  "$PY" -c "import codegen, torch, triton; print(f'gpu_check: codegen from {codegen.__file__}, torch {torch.__version__}, triton {triton.__version__}, GPU: {torch.cuda.get_device_name() if torch.cuda.is_available() else None}')" \
    || echo "gpu_check: WARNING: codegen/torch/triton do not import"
}

# The cores this process may use. GNU nproc also honours OMP_NUM_THREADS, which scripts/h200.sh sets to 2
# for the tuner's torch threads: through it the check once sized itself for 2 cores on a 16-core machine
# and ran the GPU tests in one worker (532 s instead of ~55 s).
cores() { env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2> /dev/null || echo "${1:-4}"; }

# -n: 12 workers on 16 cores (each gets one host thread: tests/gpu/conftest.py); pytest-xdist may be absent.
xdist_args() {
  if ! "$PY" -c "import xdist" 2> /dev/null; then
    echo "gpu_check: pytest-xdist missing (carry it in .whl/): tests run in one process" >&2
    return
  fi
  local cores n
  cores=$(cores 4)
  n=${WORKERS:-$(( cores * 3 / 4 > 12 ? 12 : (cores * 3 / 4 < 1 ? 1 : cores * 3 / 4) ))}
  echo "-n $n"
}

TMP_DIR=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
command_of() {
  local override="GPU_CHECK_CMD_$(echo "$1" | tr '[:lower:]' '[:upper:]')"
  if [ -n "${!override:-}" ]; then echo "${!override}"; return; fi
  case "$1" in
    tests) echo "$PY -m pytest tests/gpu -q -p no:cacheprovider --durations=25 $(xdist_args)" ;;
    # Seeded random cases for 150 s against tests/fuzz/oracle.py, a process per 10 GiB of the GPU's memory (12 at
    # most); a case that ran out of memory beside the others is judged by a run alone; a failure names its seed.
    fuzz) echo "$PY -m tests.fuzz.run --seconds 150 --min-cases 100" ;;
    # Two decode buckets, one table, a few trials: the tuner's whole pipeline, into temp folders only.
    tune) echo "$PY tune.py --kernels decode --modes scalar:fp8 --layouts tp4 --decode-buckets 1,64 --trials 6 --bucket-time 60 --out $TMP_DIR/tuned --storage sqlite:///$TMP_DIR/study.db" ;;
    bench) echo "$PY benchmarks/bench.py --quick" ;;
    host_cost) [ -f benchmarks/host_cost.py ] && echo "$PY benchmarks/host_cost.py --quick" ;;
  esac
}
LIMIT_tests=600; LIMIT_fuzz=300; LIMIT_tune=480; LIMIT_bench=480; LIMIT_host_cost=300  # a hung part must not hang the check

declare -A RESULT
FAILED=0
run_part() {
  local part=$1 cmd start rc secs out limit_var="LIMIT_$1"
  cmd=$(command_of "$part")
  if [ -z "$cmd" ]; then
    echo "== $part: skipped (benchmarks/$part.py not in this checkout)"; RESULT[$part]="$part skipped"; return
  fi
  echo "== $part: $cmd"
  if [ "$DRY" = 1 ]; then RESULT[$part]="$part dry-run"; return; fi
  out="$TMP_DIR/$part.out"
  start=$SECONDS
  timeout --kill-after=30 "${!limit_var}" bash -c "$cmd" 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  secs=$(( SECONDS - start ))
  RESULT[$part]="$part ${secs}s"
  local counts=""
  if [ "$part" = tests ]; then  # "(N passed, M failed)" from pytest's last line
    counts=$(tail -n 5 "$out" | grep -oE '[0-9]+ (passed|failed|errors?|skipped)' | paste -sd, - | sed 's/,/, /g')
  elif [ "$part" = fuzz ]; then  # "(N cases, M failed)" from the tester's summary
    counts=$(grep -E '^tests.fuzz.run: [0-9]+ cases' "$out" | tail -n 1 | grep -oE '[0-9]+ (cases|failed)' \
             | paste -sd, - | sed 's/,/, /g')
  fi
  [ -n "$counts" ] && RESULT[$part]+=" ($counts)"
  if [ "$part" = tests ] && [ "$rc" -eq 0 ] && ! grep -qE '(^|[^0-9])[1-9][0-9]* passed' <<< "$counts"; then
    rc=5  # exit 0 with nothing passed: every GPU test skipped (no GPU seen) or none collected
    RESULT[$part]+=" no GPU test passed"
  fi
  if [ "$rc" -ne 0 ]; then
    FAILED=1
    RESULT[$part]+=" FAILED (rc $rc$([ "$rc" -eq 124 ] && echo ", timed out after ${!limit_var}s"))"
  fi
}

main() {
  echo "gpu_check: $(date -u +%FT%TZ) in $ROOT at $(git -C "$ROOT" rev-parse --short HEAD 2> /dev/null || echo '?')" \
       "(sources $(fingerprint))," \
       "$(cores '?') cores, parts: $ONLY, log: $LOG"
  command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  [ "$DRY" = 1 ] || setup
  local summary=() part
  for part in "${PARTS[@]}"; do
    if wanted "$part"; then run_part "$part"; summary+=("${RESULT[$part]}"); fi
  done
  local verdict=PASSED
  [ "$DRY" = 1 ] && verdict=DRY-RUN
  [ "$FAILED" = 1 ] && verdict=FAILED
  local joined
  joined=$(printf ' | %s' "${summary[@]}")
  echo "gpu_check: $verdict ${joined:3}"
  return "$FAILED"
}

mkdir -p "$(dirname "$LOG")" || exit 2
main 2>&1 | tee "$LOG"
status=${PIPESTATUS[0]}
rm -rf "$TMP_DIR"
exit "$status"
