#!/usr/bin/env bash
# The GPU kit's entry script (docs/gpu.md). Run from the repository root:
#
#   bash .gpu_kit/run.sh OUT_DIR            # on the GPU machine (kit built by build.py)
#   bash bench/gpu_kit/run.sh OUT_DIR --smoke   # tiny sizes, CPU, the current environment
#
# Stages, each under its own timeout so one hung stage cannot eat the budget (limits below);
# every stage runs even when an earlier one failed. At most 8 files land in OUT_DIR:
#   summary.txt   one line per stage: name, exit code, seconds
#   env.log       kit install, versions, nvidia-smi, pip check
#   tests.log     the device check and the `gpu`-marked tests (pytest -m gpu)
#   tests.xml     their junit report
#   losses.log    bench_losses.py table;  losses.json  its raw numbers
#   step.log      bench_step.py table;    step.json    its raw numbers
# Stage limits (seconds) can be changed with KIT_T_INSTALL, KIT_T_ENV, KIT_T_TESTS, KIT_T_LOSSES,
# KIT_T_STEP (defaults 20, 20, 195, 150, 200: at most 9.75 min; an H100 run took 1, 12, 109, 94 s
# and over 120 s for the step, 2026-11-27);
# KIT_SKIP="losses step" skips the stages it names (a rerun that needs only some of them).
set -u
OUT=${1:?usage: run.sh OUT_DIR [--smoke]}
MODE=${2:-gpu}
KIT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
for s in ${KIT_SKIP:-}; do
  case $s in env | tests | losses | step) ;;
    *) echo "KIT_SKIP: unknown stage '$s' (stages: env tests losses step)" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
: >"$OUT/summary.txt"
export PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error TRL_EXPERIMENTAL_SILENCE=1
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PY=${PYTHON:-python3} KIT OUT

stage() {  # stage NAME LIMIT_S LOG CMD...
  local name=$1 limit=$2 log=$3 t0 rc
  shift 3
  case " ${KIT_SKIP:-} " in *" $name "*)
    echo "$name skipped (KIT_SKIP)" | tee -a "$OUT/summary.txt"
    return 0 ;;
  esac
  t0=$(date +%s)
  echo "### $name: $*" >>"$OUT/$log"
  if declare -F "$1" >/dev/null; then  # a function of this script: run it in a child bash
    timeout -k 15 "$limit" bash -c "$(declare -f "$1"); $*" >>"$OUT/$log" 2>&1
  else
    timeout -k 15 "$limit" "$@" >>"$OUT/$log" 2>&1
  fi
  rc=$?
  [ $rc -eq 124 ] && echo "### $name: TIMED OUT after ${limit}s" >>"$OUT/$log"
  echo "$name rc=$rc $(($(date +%s) - t0))s" | tee -a "$OUT/summary.txt"
}

if [ "$MODE" = "--smoke" ]; then
  LOSSES=(--smoke --acc-T 32)
  STEP=(--smoke)
  DEVICE=cpu
  TEST_PATHS="tests/unit/losses"  # CI: collect a corner only (every gpu test skips on CPU)
  CHECK_K="-k chunked"  # CI runs the whole device check itself
else
  LOSSES=(--device cuda --reps 5 --warmup 3 --acc-T 1024)
  STEP=(--device cuda --model-config qwen2.5-0.5b --rounds 1 --steps 3)
  DEVICE=cuda
  TEST_PATHS="tests"
  CHECK_K=""
fi
export TEST_PATHS CHECK_K
if [ -d "$KIT/tokenizer" ]; then  # the tests' `tokenizer` fixture reads it (tests/conftest.py)
  STEP+=(--tokenizer "$KIT/tokenizer")
  export COMPOSER_TEST_TOKENIZER=$KIT/tokenizer
fi

install_kit() {
  local site=/tmp/kit-site
  rm -rf "$site"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" "$KIT"/wheels/*.whl || return 1
  echo "installed into $site: $(ls "$KIT"/wheels | tr '\n' ' ')"
}
if [ -d "$KIT/wheels" ]; then
  stage install "${KIT_T_INSTALL:-20}" env.log install_kit
  export PYTHONPATH=/tmp/kit-site${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/kit-site/bin:$PATH
else  # smoke: the current environment, this checkout's sources
  export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
fi

env_report() {
  "$PY" - <<'PYEOF'
import importlib.metadata as md, platform, torch
import composer_replication as c
print("python", platform.python_version(), "composer_replication at", c.__file__)
for n in ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "triton", "liger-kernel", "pydantic"):
    try:
        print(n, md.version(n))
    except md.PackageNotFoundError:
        print(n, "MISSING")
print("cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
PYEOF
  command -v nvidia-smi >/dev/null && nvidia-smi
  "$PY" -m pip check || true
}
stage env "${KIT_T_ENV:-20}" env.log env_report

# every `gpu`-marked test, then the device check (tests/**/test_*device*.py, if any); modules
# that need packages the kit does not ship (dev extras) are reported, not fatal
run_tests() {
  local rc=0 rc2=0 checks ids listing
  local pytest=("$PY" -m pytest -q -p no:cacheprovider -o addopts= -rs)
  # list the gpu tests first (a module that cannot import here is reported, not run), then
  # run exactly those, so the exit code speaks of the tests alone
  listing=$(mktemp)
  "${pytest[@]}" --co -m gpu --continue-on-collection-errors $TEST_PATHS >"$listing" 2>&1
  cat "$listing"
  # the trainer's GPU tests first (the slowest, and the ones a cut-short stage must not lose)
  mapfile -t ids < <(grep '::' "$listing" | grep '^tests/unit/trainer/'; grep '::' "$listing" | grep -v '^tests/unit/trainer/')
  if [ ${#ids[@]} -eq 0 ]; then
    echo "no gpu-marked tests found"
  else
    "${pytest[@]}" --junitxml="$OUT/tests.xml" "${ids[@]}" || rc=$?
  fi
  # the CPU device check of the losses (the whole check, trains included, runs in the CPU suite)
  mapfile -t checks < <(find tests/unit/losses -name 'test_*device*.py' | sort)
  if [ ${#checks[@]} -gt 0 ]; then "${pytest[@]}" "${checks[@]}" $CHECK_K || rc2=$?; fi
  return $((rc > rc2 ? rc : rc2))
}
stage tests "${KIT_T_TESTS:-195}" tests.log run_tests

stage losses "${KIT_T_LOSSES:-150}" losses.log \
  "$PY" bench/bench_losses.py "${LOSSES[@]}" --json "$OUT/losses.json"
stage step "${KIT_T_STEP:-200}" step.log \
  "$PY" bench/bench_step.py "${STEP[@]}" --json "$OUT/step.json"

echo "device $DEVICE, results in $OUT:" && ls "$OUT"
! grep -v ' skipped (KIT_SKIP)$' "$OUT/summary.txt" | grep -qv ' rc=0 '
