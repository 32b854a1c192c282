#!/usr/bin/env bash
# One short CUDA check for a session lent a GPU, in phases (PHASES="bench tests learning" by default):
#   bench     the speed benchmarks alone on the GPU, first, so that their timings are clean:
#             benchmarks/gpu_train.py (detrkit beside the reference: images/s, peak memory, busy fraction)
#             then benchmarks/memory_table.py (detrkit's peak memory per variant and batch size)
#   learning  the learning comparison (detrkit beside the reference, several seeds and settings at once,
#             in the background)
#   tests     the gpu-marked tests and the demo on CUDA, beside the learning runs
#
#   [PHASES="bench tests learning"] [BUDGET_S=540] bash benchmarks/gpu_session.sh OUT_DIR ["0 1 2 3 4 5"] \
#       [NAME='{"train": "kwargs"}' ...]
#
# Each NAME=JSON pair is one setting, trained by both packages for every seed (default: one
# setting, default={}); NAME@ARM=JSON trains detrkit through `benchmarks/learning_arms.py ARM`
# (with rfdetr importable) beside the plain reference. CHECKS=0 drops the tests phase. Every step has a
# timeout cut to what is left of BUDGET_S (default 540 s, the whole script). BENCH_CONFIGS overrides
# gpu_train.py's configurations ("nano:4 nano:64 medium:16"), BENCH_KWARGS its train() keywords
# (JSON, both packages). Runs in the repository root of a
# machine whose python3 has torch with CUDA. Packages that machine lacks come as wheels:
# .whl/*.whl for detrkit, .whl/ref/*.whl for the reference (rfdetr and the versions it pins).
# Writes to OUT_DIR (8 files at most): env.txt; bench: train_speed.json, memory_table.json, bench.log;
# tests: gpu_tests.log, demo.log; learning: learning.json, learning.log. Ends with the ratios table.
set -u
out=${1:?usage: gpu_session.sh OUT_DIR [SEEDS] [NAME=JSON ...]}
seeds=${2:-"0 1 2 3 4 5"}
shift $(( $# < 2 ? $# : 2 ))
settings=("$@")
[ ${#settings[@]} -gt 0 ] || settings=("default={}")
mkdir -p "$out"
phases=" ${PHASES:-bench tests learning} "
[ "${CHECKS:-1}" != 0 ] || phases=${phases/ tests / }
has() { [[ $phases == *" $1 "* ]]; }
budget=${BUDGET_S:-540}
# cap SECONDS [RESERVE]: SECONDS, or less so that RESERVE seconds of the budget stay for later steps
cap() { local rest=$(( budget - SECONDS - ${2:-0} )); echo $(( $1 < rest ? $1 : (rest > 20 ? rest : 20) )); }
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
here=$(pwd)
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
install /tmp/site .whl/*.whl || exit 1
install /tmp/refsite .whl/ref/*.whl || exit 1
ours="$here/src:/tmp/site"
theirs="/tmp/refsite:/tmp/site"  # the reference's own pins first

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch, pytorch_lightning as pl; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'lightning', pl.__version__)"
  nproc; } > "$out/env.txt" 2>&1

if has bench; then
  echo "== bench: gpu_train.py (alone on the GPU)" >&2
  # leave ~100 s for memory_table.py and, when they follow, ~150 s for the learning runs and tests
  limit=$(cap 330 $( (has learning || has tests) && echo 250 || echo 100))
  bench_kwargs=${BENCH_KWARGS:-"{}"}
  PYTHONPATH=$ours timeout -k 10 "$limit" python3 benchmarks/gpu_train.py drive --device cuda \
      --out "$out/train_speed.json" --log /tmp/bench_runs.log --budget $(( limit - 10 )) --run-timeout 110 \
      --detrkit-pythonpath "$ours" --reference-pythonpath "$theirs" --train-kwargs "$bench_kwargs" \
      ${BENCH_CONFIGS:+--configs $BENCH_CONFIGS} > /tmp/bench_drive.log 2>&1
  echo "gpu_train rc=$?" >> /tmp/bench_drive.log
  echo "== bench: memory_table.py" >&2
  PYTHONPATH=$ours timeout -k 10 "$(cap 120 $( (has learning || has tests) && echo 150 || echo 20))" python3 \
      benchmarks/memory_table.py --device cuda --out "$out/memory_table.json" > /tmp/bench_memory.log 2>&1
  echo "memory_table rc=$?" >> /tmp/bench_memory.log
  for log in /tmp/bench_drive.log /tmp/bench_memory.log /tmp/bench_runs.log; do
    echo "######## $log"; cat "$log"; done > "$out/bench.log" 2>&1
fi

if has learning; then
echo "== learning, in the background: ${settings[*]}" >&2
data=/tmp/learn
PYTHONPATH=$ours python3 -c "
from detrkit.datasets.synthetic import make_synthetic_dataset
make_synthetic_dataset('$data', num_train=200, num_valid=50, seed=0)"
for setting in "${settings[@]}"; do
  name=${setting%%=*} kwargs=${setting#*=}
  runner=(benchmarks/train_epoch.py) path=$ours
  if [[ $name == *@* ]]; then runner=(benchmarks/learning_arms.py "${name#*@}") path="$here/src:$theirs"; fi
  runs=/tmp/runs/$name
  mkdir -p "$runs"
  for seed in $seeds; do
    PYTHONPATH=$path timeout "$(cap 420 15)" python3 "${runner[@]}" --device cuda --dataset $data --epochs 2 \
        --train-images 200 --valid-images 50 --seeds "$seed" --train-kwargs "$kwargs" \
        --out "$runs/detrkit-$seed.json" > "$runs/detrkit-$seed.log" 2>&1 &
    PYTHONPATH=$theirs timeout "$(cap 420 15)" python3 benchmarks/reference_train_epoch.py --device cuda --dataset $data \
        --output "$runs/reference-out-$seed" --epochs 2 --seed "$seed" --train-kwargs "$kwargs" \
        > "$runs/reference-$seed.json" 2> "$runs/reference-$seed.log" &
  done
done
fi

if has tests; then
  echo "== gpu tests" >&2
  PYTHONPATH=$ours timeout "$(cap 150 30)" python3 -m pytest -q -p no:cacheprovider -m gpu tests > "$out/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?" >> "$out/gpu_tests.log"
  echo "== demo on cuda" >&2
  PYTHONPATH=$ours timeout "$(cap 120 15)" python3 -m detrkit.cli demo --device cuda --output /tmp/demo > "$out/demo.log" 2>&1
  echo "demo rc=$?" >> "$out/demo.log"
fi

wait
if has learning; then
tail -n 25 /tmp/runs/*/*.log > "$out/learning.log" 2>&1
python3 - "$out/learning.json" "$seeds" "${settings[@]}" <<'EOF'
import json, sys
from pathlib import Path


def read(setting: str, seeds: list[str]) -> dict:
    name, kwargs = setting.split("=", 1)
    runs = Path("/tmp/runs") / name
    result = {"train_kwargs": json.loads(kwargs), "detrkit": {}, "reference": {}}
    for seed in seeds:
        ours = runs / f"detrkit-{seed}.json"
        if ours.exists():
            run = json.loads(ours.read_text())["detrkit"]
            result["detrkit"][seed] = {"map_50": run["per_seed_map_50"][0], "seconds": run["per_seed_seconds"][0]}
        theirs = (runs / f"reference-{seed}.json").read_text().strip().splitlines()
        if theirs:
            run = json.loads(theirs[-1])
            result["reference"][seed] = {"map_50": run["map_50"], "seconds": run["seconds"]}
    pairs = [(result["detrkit"][s]["map_50"], result["reference"][s]["map_50"]) for s in seeds
             if s in result["detrkit"] and s in result["reference"]]
    for epoch in range(2):
        kept = [(a[epoch], b[epoch]) for a, b in pairs if len(a) > epoch and len(b) > epoch]
        if kept:
            diffs = [a - b for a, b in kept]
            mean = sum(diffs) / len(diffs)
            sd = (sum((d - mean) ** 2 for d in diffs) / max(len(diffs) - 1, 1)) ** 0.5
            result[f"epoch_{epoch + 1}"] = {
                "pairs": len(kept), "detrkit_mean": sum(a for a, _ in kept) / len(kept),
                "reference_mean": sum(b for _, b in kept) / len(kept),
                "mean_difference": mean, "standard_error": sd / len(diffs) ** 0.5}
    return result


out, seeds, settings = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
result = {"device": "cuda", "epochs": 2, "train_images": 200, "valid_images": 50, "resolution": 320,
          "batch_size": 4, "defaults": "EMA on, multi_scale per-batch, unless train_kwargs say otherwise",
          "note": "all runs at once on one GPU: seconds are not speed figures",
          "settings": {s.split("=", 1)[0]: read(s, seeds) for s in settings}}
Path(out).write_text(json.dumps(result, indent=2) + "\n")
for name, setting in result["settings"].items():
    print(name, json.dumps({k: v for k, v in setting.items() if k.startswith("epoch_")}))
EOF
fi

if has bench; then
  echo "== summary: detrkit/reference (train_speed.json), memory (memory_table.json)"
  [ -f "$out/train_speed.json" ] && python3 benchmarks/gpu_train.py summary "$out/train_speed.json"
  [ -f "$out/memory_table.json" ] && PYTHONPATH=$ours python3 benchmarks/memory_table.py --print "$out/memory_table.json"
fi
echo "== done in ${SECONDS} s of a ${budget} s budget"
