#!/usr/bin/env bash
# The main job: install what is missing, build stof, and show what it does on
# this machine. Without a GPU it still builds, checks the model scripts,
# runs the CPU reference and draws a mask, and says what it skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/install-deps.sh
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build
stof=./build/stof
mkdir -p build/out

echo; echo "== device"
$stof info

echo; echo "== bert-base at batch 8, seq 512 (BigBird mask): the operator graph"
$stof graph scripts/bert.lua --set preset=base --set batch=8 --set seq=512 | tail -n 8

echo; echo "== masks of the paper's Table 2 at seq 1024"
for m in sliding_window dilated longformer bigbird; do
  $stof mask scripts/bert.lua --set preset=small --set batch=1 --set seq=1024 --set mask=$m \
    --png build/out/mask-$m.png --px 512 | sed -n '1,2p'
done
echo "heatmaps: build/out/mask-*.png"

echo; echo "== CPU reference: bert-small, batch 1, seq 128"
$stof run --cpu scripts/bert.lua --set preset=small --set batch=1 --set seq=128

if $stof info | grep -q '^GPU 0'; then
  echo; echo "== tune bert-small (batch 8, seq 512, BigBird) on this GPU, then run the plan"
  $stof tune scripts/bert.lua --set preset=small --set batch=8 --set seq=512 \
    --time-limit 60 -o build/out/bert-small.json | grep -E '^(end to end|tuning|time|wrote)'
  $stof run build/out/bert-small.json | tail -n 3

  echo; echo "== GPU tests"
  ctest --test-dir build -L gpu --output-on-failure
  if python3 -c "import torch" >/dev/null 2>&1; then
    echo; echo "== attention: stof against PyTorch (bench/attention.py --quick)"
    STOF_LIB=build/libstof.so python3 bench/attention.py --quick --out build/out/attention.md
    if python3 -c "import transformers, safetensors" >/dev/null 2>&1; then
      echo; echo "== parity with transformers: bert-base, gpt2, t5-small (bench/parity.py --quick)"
      python3 bench/parity.py --quick --stof build/stof --out build/out/parity.md | tail -n 3
    else
      echo; echo "transformers or safetensors is not installed: skipped the parity check (bench/parity.py)."
    fi
  else
    echo; echo "PyTorch is not installed: skipped the comparison with PyTorch (bench/attention.py)."
  fi
else
  echo; echo "== an unmeasured plan for sm_90 (kernels compiled into the cache, nothing timed)"
  $stof tune scripts/bert.lua --set preset=small --set batch=8 --set seq=512 --arch sm_90 \
    -o build/out/bert-small-sm90.json | tail -n 3
  echo; echo "No GPU on this machine: skipped tuning on the GPU, the GPU tests (ctest -L gpu) and all GPU timing."
fi
