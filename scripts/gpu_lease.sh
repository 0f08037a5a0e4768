#!/usr/bin/env bash
# Serge's GPU checks in one go, for a lent GPU machine that reaches no registry.
#
#   bash scripts/gpu_lease.sh prepare        # here: gathers what the GPU machine lacks into .gpu/ (git-ignored)
#   bash scripts/gpu_lease.sh run OUT        # there, from the repo root, with .gpu/ carried: results in OUT
#
# `prepare` puts in .gpu/: Python 3.12 wheels of Serge's runtime dependencies that such a machine's image lacks
# (torch and the CUDA libraries it has), the llama.cpp source that the pinned llama-cpp-python vendors (less its
# models, docs and tests), llama-cpp-python's Python package without its CPU libraries, and the bundled model's
# tokenizer. About 50 MB: what travels to the machine is limited to 64 MiB.
#
# `run` builds llama.cpp with CUDA for this GPU (llama-server and the shared libraries that llama-cpp-python
# loads through LLAMA_CPP_LIB_PATH) while scripts/gpu_check.py runs the transformers paths; then converts
# gpu_check's random-weight SmolLM2-1.7B to an f16 GGUF with llama.cpp's own converter and runs
# scripts/gpu_llama.py: Serge's llama.cpp engine against llama-server on it. The build runs under `nice` beside
# gpu_check, whose timings are therefore taken beside a compiler (the machine has 16 cores; the build gets 14).
# Every step's output lands in OUT as it finishes (7 files), so a run stopped at its limit still returns what it
# measured.
# TRANSFORMERS_ONLY=1: gpu_check alone, no llama.cpp build. BUDGET: seconds the whole run may take (570); the
# build is stopped in time for the llama.cpp comparison.
# Set LLAMA_BUILD=DIR to use an existing build (its bin/ holds llama-server and libllama.so);
# DRY=1 (here, with LLAMA_BUILD) runs the same steps on the CPU with the dev venv, small and short (llama.cpp's
# converter then needs `sentencepiece` in that venv, which the GPU image has and Serge does not).
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
GPU="$HERE/.gpu"

prepare() {
  local py="$HERE/.venv/bin/python" sdist vendor
  mkdir -p "$GPU/whl" "$GPU/py" "$GPU/tok"
  # what the GPU image has already (torch, numpy, ...) is not carried; transformers, tokenizers and the hub are, for their pins
  "$py" - >"$GPU/reqs.txt" <<'EOF'
import importlib.metadata as md, re, tomllib
for d in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]:
    name = re.split(r"[<>=!;\[ ]", d)[0]
    if name not in ("torch", "llama-cpp-python"):
        print(f"{name}{'[standard]' if name == 'uvicorn' else ''}=={md.version(name)}")
EOF
  "$py" -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp -d "$GPU/whl" \
    $(for n in 1 5 12 17 24 26 27 28 31 34 35; do echo --platform manylinux_2_${n}_x86_64; done) \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -r "$GPU/reqs.txt"
  local image=" accelerate anyio attrs certifi click filelock fsspec h11 hf-xet httpcore httpx idna jinja2 lxml markdown-it-py markupsafe mdurl mpmath networkx numpy packaging pillow prometheus-client psutil pygments pyyaml regex requests rich safetensors setuptools shellingham sympy tqdm triton typer typing-extensions urllib3 uvloop "
  for f in "$GPU"/whl/*.whl; do
    n="$(basename "$f")"; n="${n%%-[0-9]*}"; n="$(echo "$n" | tr '_A-Z' '-a-z')"
    case "$n" in torch|nvidia-*|cuda-*) rm -f "$f"; continue;; esac
    [[ "$image" == *" $n "* ]] && rm -f "$f"
  done
  sdist="$(ls "$HERE"/bench/.peers/src/llama_cpp_python-*/vendor -d 2>/dev/null | head -1)"
  [ -n "$sdist" ] || { echo "no llama.cpp source: bash bench/install_peers.sh llama-server first"; return 1; }
  tar cJf "$GPU/llama.cpp.tar.xz" -C "$sdist" --exclude=llama.cpp/models --exclude=llama.cpp/docs \
    --exclude=llama.cpp/tests --exclude=llama.cpp/benches --exclude=llama.cpp/media --exclude=llama.cpp/tools/ui/tests \
    --exclude='llama.cpp/.git*' \
    --exclude='llama.cpp/ggml/src/ggml-'{vulkan,sycl,opencl,hexagon,metal,cann,et,openvino,webgpu,virtgpu,zdnn,musa,hip,zendnn} \
    llama.cpp
  vendor="$("$py" -c 'import llama_cpp, os; print(os.path.dirname(llama_cpp.__file__))')"
  rm -rf "$GPU/py/llama_cpp" && cp -r "$vendor" "$GPU/py/llama_cpp" && rm -rf "$GPU/py/llama_cpp/lib" "$GPU"/py/llama_cpp/__pycache__
  local tok="${SERGE_MODELS_DIR:-$HOME/.local/share/serge/models}/smollm2-135m-instruct/transformers"
  find "$tok" -maxdepth 1 -type f ! -name '*.safetensors' -exec cp {} "$GPU/tok/" \;
  du -sh "$GPU"
}

run() {
  local out="$1" t0=$SECONDS build="${LLAMA_BUILD:-/tmp/lcb}" work=/tmp/serge-gpu py=python3 dry=() builder=""
  mkdir -p "$out" "$work" /tmp/lc
  stamp() { echo "[gpu_lease +$((SECONDS - t0))s] $*" | tee -a "$out/steps.log"; }
  left() { echo $(( ${BUDGET:-570} - (SECONDS - t0) )); }
  if [ -n "${DRY:-}" ]; then
    py="$HERE/.venv/bin/python" dry=(--dry-run)
    export PYTHONPATH="$GPU/py"
  else
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      "$GPU"/whl/*.whl || { stamp "wheels failed"; return 1; }
    export PYTHONPATH="/tmp/site:$GPU/py"
  fi
  export PYTHONUNBUFFERED=1 LLAMA_CPP_LIB_PATH="$build/bin"
  tar xJf "$GPU/llama.cpp.tar.xz" -C /tmp/lc || { stamp "no llama.cpp source"; return 1; }
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; nvcc --version | tail -2
    ls /usr/local/cuda*/include/cublas_v2.h
    "$py" scripts/llama_build.py; } >"$out/machine.txt" 2>&1
  stamp "ready: $(tr '\n' ' ' <"$out/machine.txt")"
  if [ -z "${LLAMA_BUILD:-}${TRANSFORMERS_ONLY:-}" ]; then
    (set -x; flags=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF
       -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=ON)
     cmake -S /tmp/lc/llama.cpp -B "$build" "${flags[@]}" || {
       # no cuBLAS beside nvcc: take the one in the image's Python packages (nvidia-cublas)
       cb="$(python3 -c 'import nvidia.cublas as m, os; print(list(m.__path__)[0])')"
       rm -rf "$build"; cmake -S /tmp/lc/llama.cpp -B "$build" "${flags[@]}" \
         -DCUDA_cublas_LIBRARY="$(ls "$cb"/lib/libcublas.so* | head -1)" \
         -DCUDA_cublasLt_LIBRARY="$(ls "$cb"/lib/libcublasLt.so* | head -1)" \
         -DCMAKE_CUDA_FLAGS="-I$cb/include" -DCMAKE_CXX_FLAGS="-I$cb/include"; } \
     && nice -n 19 cmake --build "$build" --target llama-server mtmd -j 14) >"$out/build.log" 2>&1 &
    builder=$!
  fi
  stamp "gpu_check (transformers) starts"
  timeout 300 "$py" scripts/gpu_check.py "${dry[@]}" --tokenizer-from "$GPU/tok" --work "$work" \
    --out "$out/gpu_check.json" >"$out/gpu_check.log" 2>&1
  stamp "gpu_check rc=$?"
  [ -n "${TRANSFORMERS_ONLY:-}" ] && return 0
  local gguf="$work/bench-1.7b-f16.gguf"
  timeout 150 "$py" /tmp/lc/llama.cpp/convert_hf_to_gguf.py "$work/src/bench-1.7b" --outtype f16 --outfile "$gguf" \
    >"$work/convert.log" 2>&1
  stamp "GGUF rc=$? $(ls -la "$gguf" 2>&1)"
  [ -f "$gguf" ] || tail -5 "$work/convert.log" | tee -a "$out/steps.log"
  if [ -n "$builder" ]; then
    while kill -0 "$builder" 2>/dev/null && [ "$(left)" -gt 150 ]; do sleep 5; done
    kill -0 "$builder" 2>/dev/null && { stamp "build still running: stopped"; kill -- -"$builder" 2>/dev/null; pkill -f ninja; }
    wait "$builder"; stamp "llama.cpp build rc=$? $(grep -c '\.cu' "$out/build.log") CUDA lines"
  fi
  [ -x "$build/bin/llama-server" ] || { stamp "no llama-server built"; tail -20 "$out/build.log"; return 1; }
  timeout "$(left)" "$py" scripts/gpu_llama.py "${dry[@]}" --gguf "$gguf" --llama-server "$build/bin/llama-server" \
    --work "$work/llama" --out "$out/gpu_llama.json" >"$out/gpu_llama.log" 2>&1
  stamp "gpu_llama rc=$?"
  tail -8 "$out/gpu_llama.log"
}

case "${1:-}" in
  prepare) prepare ;;
  run) run "${2:?run OUT}" ;;
  *) echo "usage: $0 prepare | run OUT" >&2; exit 2 ;;
esac
