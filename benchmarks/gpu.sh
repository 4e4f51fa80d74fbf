#!/usr/bin/env bash
# One call on a fresh Linux machine with an NVIDIA GPU: build the CUDA backend for the GPU found,
# then validate and the bench sections, written to docs/benchmarks-cuda.md, inside 9 minutes.
#
#   benchmarks/gpu.sh                 # CUDA: needs nvidia-smi, nvcc (or CUDA_HOME), cmake, a C++ compiler
#   benchmarks/gpu.sh --cpu           # the same sections on the CPU build (writes build/gpu-run/benchmarks-cpu.md)
#   benchmarks/gpu.sh --cpu --out F   # ... or to F
#   benchmarks/gpu.sh --minutes 15    # another wall-time budget (default 9)
#   benchmarks/gpu.sh --python PY     # an interpreter whose environment already holds dflash-gguf (and,
#                                     # for the train section, its [train] and [reference] extras): no set-up
#
# Stages, each printing its progress with the time since the start:
#   1. set-up        .venv with the base install and matplotlib (no PyTorch), unless one is there
#   2. build         dflash-gguf llama build --backend cuda --cuda-arch <compute capability of GPU 0>
#   3. fixtures      the trained pair as GGUF files (build/fixtures/trained)
#   4. sections      benchmarks/gpu_run.py: validate, memory-bound widening, SmolLM2 (when present),
#                    concurrency, train (when torch is there); a section that would not end before
#                    the deadline is skipped and the page says so
set -euo pipefail
cd "$(dirname "$0")/.."

backend=cuda
out=""
minutes=9
py=""
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) backend=cpu ;;
    --out) out="$2"; shift ;;
    --minutes) minutes="$2"; shift ;;
    --python) py="$2"; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "gpu.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

start=$(date +%s)
deadline=$((start + minutes * 60))
say() { printf '[%5ds] %s\n' "$(( $(date +%s) - start ))" "$*"; }

cores=$(nproc)
if [ "$backend" = cuda ]; then
  command -v nvidia-smi >/dev/null || { echo "gpu.sh: no nvidia-smi: no NVIDIA GPU here (--cpu runs the CPU build)" >&2; exit 2; }
  gpu=$(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader | head -n 1)
  arch=$(echo "$gpu" | awk -F', *' '{gsub(/\./, "", $2); print $2}')
  [ -n "$arch" ] || { echo "gpu.sh: nvidia-smi gave no compute capability ($gpu)" >&2; exit 2; }
  say "GPU: $gpu (CUDA architecture $arch); $cores cores"
  build_args=(--backend cuda --cuda-arch "$arch")
  # every layer of both models on the GPU; the CPU threads only feed it
  server_args=(-ngl 99 -ngld 99 -t "$(( cores < 8 ? cores : 8 ))")
  levels=1,2,4,8,16,32
  rounds=3
  out=${out:-docs/benchmarks-cuda.md}
  shared=()
  train_args=()
else
  say "CPU build, $cores cores"
  build_args=(--backend cpu)
  server_args=(-t "$(( cores / 2 > 0 ? cores / 2 : 1 ))")
  levels=1,2,4,8
  rounds=1  # the widened and the real target's curves take minutes a round on a few cores
  out=${out:-build/gpu-run/benchmarks-cpu.md}
  # on a machine with as few cores as this one, other work shares them
  shared=(); [ "$cores" -le 4 ] && shared=(--shared)
  train_args=(--train-threads "$(( cores / 2 > 0 ? cores / 2 : 1 ))")
fi

say "1/4 set-up"
if [ -z "$py" ]; then
  [ -x .venv/bin/python ] || make setup-run
  py=.venv/bin/python
fi

say "2/4 llama.cpp build (${build_args[*]}, $cores jobs)"
bin=$($py -m dflash_gguf.cli llama build "${build_args[@]}" -j "$cores")
say "   bin folder $bin"

say "3/4 fixtures: the trained pair"
$py -m training.fixtures.trained_gguf | while read -r line; do say "   $line"; done

say "4/4 sections (deadline in $(( deadline - $(date +%s) )) s)"
# each section is planned against the time left; one validate section takes ~1 min on 2 shared cores
$py -m benchmarks.gpu_run --backend "$backend" --out "$out" --deadline "$deadline" --levels "$levels" --rounds "$rounds" \
  --estimate "$([ "$backend" = cuda ] && echo 20 || echo 60)" ${shared[@]+"${shared[@]}"} \
  ${train_args[@]+"${train_args[@]}"} -- "${server_args[@]}"
say "done: $out ($(( $(date +%s) - start )) s of the $(( minutes * 60 )) s budget)"
