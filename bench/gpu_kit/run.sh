#!/usr/bin/env bash
# The GPU kit's entry script (docs/gpu.md). Run from the repository root:
#
#   bash .gpu_kit/run.sh OUT_DIR            # on the GPU machine (kit built by build.py)
#   bash bench/gpu_kit/run.sh OUT_DIR --smoke   # tiny sizes, CPU, the current environment
#
# Stages in the order of issue 62's priorities, each under its own timeout so one hung stage
# cannot eat the budget; every stage runs even when an earlier one failed, and each writes its
# results as it goes (a stage cut short keeps what it measured):
#   install, env   the kit's wheels; versions, nvidia-smi, pip check
#   1 tests        every `gpu`-marked test, the trainer's first, then the device check
#   2 step         our 3-channel step vs TRL's GRPOTrainer, single steps in turn (bench_step.py
#                  --lockstep): median and range of the per-round time ratio, peak memory
#   3 generation   batched generation (bench/bench_generation.py, when the checkout has it;
#                  its flags are GENERATION_GPU / GENERATION_SMOKE below, one place to adjust)
#   4 distill      a 2-step train, GRPO + on-policy distillation from a local bf16 teacher
#                  (Qwen2.5-0.5B's shape, random init); per step: time, teacher seconds
#   5 jsd          the fused JSD at H=896 only: ours (default budget, 512 MiB) vs Liger torch
#                  and Triton (bench_losses.py)
# At most 8 files land in OUT_DIR (the device tool brings back 8):
#   summary.txt   one line per stage: name, exit code, seconds
#   env.log       kit install, versions, nvidia-smi, pip check
#   tests.log     the `gpu`-marked tests and the device check;  tests.xml  their junit report
#   bench.log     the tables of stages 2-5 (step, generation, distill, jsd)
#   step.json     stage 2's raw numbers;  jsd.json  stage 5's
# Stage limits (seconds) can be changed with KIT_T_INSTALL, KIT_T_ENV, KIT_T_TESTS, KIT_T_STEP,
# KIT_T_GENERATION, KIT_T_DISTILL, KIT_T_JSD (defaults 10, 15, 150, 135, 45, 60, 60: 475 s, at
# most 8 min, so machine start, a run and a rerun fit a 15-minute lease; an H100 run took 1,
# 12, 109 s for install, env, tests without the trainer's, and over 120 s for a step stage of
# two sequential workers, 2026-11-27);
# KIT_SKIP="jsd step" skips the stages it names (a rerun that needs only some of them).
set -u
OUT=${1:?usage: run.sh OUT_DIR [--smoke]}
MODE=${2:-gpu}
KIT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
STAGES="env tests step generation distill jsd"
for s in ${KIT_SKIP:-}; do
  case " $STAGES " in *" $s "*) ;;
    *) echo "KIT_SKIP: unknown stage '$s' (stages: $STAGES)" >&2; exit 2 ;;
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

# stage 3's command: bench/bench_generation.py (the generation issue) with these flags; the one
# place to adjust when the script lands or changes its flags
GENERATION_SCRIPT=bench/bench_generation.py
GENERATION_GPU=(--device cuda --dtype bfloat16 --model-shape qwen2.5-0.5b)
GENERATION_SMOKE=(--device cpu --dtype float32 --rounds 1 --agents 2 --tokens 4 --threads 1)
JSD_VARIANTS=ours,ours_512m,liger_torch,liger_triton
if [ "$MODE" = "--smoke" ]; then
  STEP=(--smoke --lockstep --threads 1)
  GENERATION=("${GENERATION_SMOKE[@]}")
  JSD=(--smoke --configs 64x512x32 --acc-T 0)
  DEVICE=cpu SHAPE=tiny DTYPE=float32
  # CI: collect a corner only (every gpu test skips on CPU; CI runs the device check itself)
  TEST_PATHS="tests/unit/losses"
  CHECK_K="-k chunked"
else
  STEP=(--device cuda --model-config qwen2.5-0.5b --lockstep --rounds 4)
  GENERATION=("${GENERATION_GPU[@]}")
  JSD=(--device cuda --configs 4096x151936x896 --reps 5 --warmup 3 --acc-T 0)
  DEVICE=cuda SHAPE=qwen2.5-0.5b DTYPE=bfloat16
  # only the files that hold `gpu` tests: collecting the whole tree costs seconds of the stage
  TEST_PATHS=$(grep -rl 'mark\.gpu' tests --include='test_*.py' | sort | tr '\n' ' ')
  CHECK_K=""
fi
export TEST_PATHS CHECK_K SHAPE DTYPE
if [ -d "$KIT/tokenizer" ]; then  # the tests' `tokenizer` fixture reads it (tests/conftest.py)
  STEP+=(--tokenizer "$KIT/tokenizer")
  GENERATION+=(--tokenizer "$KIT/tokenizer")
  export COMPOSER_TEST_TOKENIZER=$KIT/tokenizer
fi
export KIT_TOKENIZER=${COMPOSER_TEST_TOKENIZER:-}

install_kit() {
  local site=/tmp/kit-site
  rm -rf "$site"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" "$KIT"/wheels/*.whl || return 1
  echo "installed into $site: $(ls "$KIT"/wheels | tr '\n' ' ')"
}
if [ -d "$KIT/wheels" ]; then
  stage install "${KIT_T_INSTALL:-10}" env.log install_kit
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
stage env "${KIT_T_ENV:-15}" env.log env_report

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
stage tests "${KIT_T_TESTS:-150}" tests.log run_tests

# 2: our 3-channel step vs TRL's GRPOTrainer (16 prompts x 8 generations x 128 tokens, bf16)
stage step "${KIT_T_STEP:-135}" bench.log \
  "$PY" bench/bench_step.py "${STEP[@]}" --json "$OUT/step.json"

# 3: batched generation, when the checkout has its script
if [ -f "$GENERATION_SCRIPT" ]; then
  stage generation "${KIT_T_GENERATION:-45}" bench.log "$PY" "$GENERATION_SCRIPT" "${GENERATION[@]}"
else
  echo "generation missing ($GENERATION_SCRIPT is not in this checkout)" | tee -a "$OUT/summary.txt"
fi

# 4: two steps of GRPO + self-distillation + on-policy distillation from a local bf16 teacher
# (both built from the shape's config, random init, the teacher from another seed); then per
# step the step time and the teacher's seconds, and a failure if the channel did not run
distill_train() {
  local d=/tmp/kit-distill tok=()
  rm -rf "$d"
  [ -n "$KIT_TOKENIZER" ] && tok=(--tokenizer "$KIT_TOKENIZER")
  "$PY" - "$SHAPE" "$d" "$DTYPE" "${tok[@]}" <<'PYEOF' || return 1
import sys
sys.path.insert(0, "bench")
from config_models import build_model_dir
shape, d, dtype, tok = sys.argv[1], sys.argv[2], sys.argv[3], (sys.argv[5:] or [None])[0]
print(build_model_dir(shape, f"{d}/student", tok, dtype), build_model_dir(shape, f"{d}/teacher", tok, "bfloat16", seed=1))
PYEOF
  "$PY" -m composer_replication.cli train --config gpu/qwen2.5-0.5b.yaml \
    "model.name=$d/student" "model.dtype=$DTYPE" "output_dir=$d/run" max_steps=2 \
    save_steps=100000 logging.report_to=[] eval.before_and_after=false \
    generation.backend=transformers generation.prompts_per_step=4 generation.num_generations=4 \
    generation.max_completion_length=32 optim.gradient_accumulation_steps=1 \
    grpo.mask_truncated_completions=false distill.weight=1.0 \
    "distill.teachers=[{name: local, model: '$d/teacher', dtype: bfloat16}]" \
    || return 1
  "$PY" - "$d/run/metrics.jsonl" <<'PYEOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
keys = ("step_time", "distill/teacher_forward_s", "distill/active", "distill/scored_frac",
        "distill/loss", "sdpo/active", "loss")
print("| step | " + " | ".join(keys) + " |")
print("|" + " --- |" * (len(keys) + 1))
for i, r in enumerate(rows, 1):
    print(f"| {i} | " + " | ".join(f"{r.get(k, float('nan')):.4g}" for k in keys) + " |")
bad = [i for i, r in enumerate(rows, 1) if r.get("distill/active") != 1.0
       or r.get("distill/scored_frac") != 1.0 or not r.get("distill/teacher_forward_s", 0) > 0]
sys.exit(f"the distill channel did not run on steps {bad}" if bad or len(rows) != 2 else 0)
PYEOF
}
stage distill "${KIT_T_DISTILL:-60}" bench.log distill_train

# 5: the fused JSD at H=896 only: ours at the default budget and at 512 MiB, Liger torch, Triton
stage jsd "${KIT_T_JSD:-60}" bench.log \
  "$PY" bench/bench_losses.py "${JSD[@]}" --variants "$JSD_VARIANTS" --json "$OUT/jsd.json"

echo "device $DEVICE, results in $OUT:" && ls "$OUT"
! grep -vE ' skipped \(KIT_SKIP\)$| missing \(' "$OUT/summary.txt" | grep -qv ' rc=0 '
