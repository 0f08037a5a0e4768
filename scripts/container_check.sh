#!/usr/bin/env bash
# Build Serge's image where no registry is reachable, and stream one reply from the Serge inside it (the issue's CI
# step; see docs/container.md for its timings).
#
# The base image is made from Debian's packages (debootstrap --variant=minbase bookworm) and imported under the
# base's public name, so the Containerfile builds unchanged; buildah builds and runs it with --isolation chroot
# (where podman cannot start containers: cgroups and rlimits refused). Needs: debootstrap, buildah, podman, curl.
# Timings go to stdout, one line a step.
set -euo pipefail
cd "$(dirname "$0")/.."
work=${WORK:-/var/tmp/serge-container}
base=docker.io/library/debian:bookworm-slim
step() { echo "[container $(date +%T)] $*"; }
started=$(date +%s)

if ! buildah inspect --type image "$base" >/dev/null 2>&1; then
  step "debootstrap --variant=minbase bookworm (the base, from Debian's packages)"
  rm -rf "$work/rootfs" && mkdir -p "$work"
  debootstrap --variant=minbase bookworm "$work/rootfs" http://deb.debian.org/debian >/dev/null
  tar -C "$work/rootfs" -c . | podman import - "$base" >/dev/null
fi

# Where the host reaches PyPI through a TLS-inspecting proxy, its CA bundle (PIP_CERT or SSL_CERT_FILE) is lent to
# the build's and the server's pip for this check alone: mounted, never copied into the image.
ca=()
bundle=${PIP_CERT:-${SSL_CERT_FILE:-}}
if [ -n "$bundle" ] && [ -f "$bundle" ]; then
  printf '[global]\ncert = /run/host-ca.crt\n' >"$work/pip.conf"
  ca=(-v "$bundle:/run/host-ca.crt:ro" -v "$work/pip.conf:/etc/pip.conf:ro")
fi

step "buildah bud (llama.cpp compiles for the CPU: minutes)"
buildah bud --isolation chroot --layers "${ca[@]}" -t localhost/serge:check -f Containerfile . \
  >"$work/build.log" 2>&1 || { tail -50 "$work/build.log"; exit 1; }

step "serge serve inside it (models fetched on its first start)"
ctr=$(buildah from localhost/serge:check)
trap 'kill "${serve_pid:-0}" 2>/dev/null || true; buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
port=${PORT:-18008}
buildah run --isolation chroot "${ca[@]}" --env SERGE_HOST=127.0.0.1 --env SERGE_PORT="$port" "$ctr" -- serge serve \
  >"$work/serve.log" 2>&1 &
serve_pid=$!
for _ in $(seq 600); do
  curl -fs "http://127.0.0.1:$port/api/health" >/dev/null && break
  kill -0 "$serve_pid" 2>/dev/null || { tail -50 "$work/serve.log"; exit 1; }
  sleep 1
done
step "a streamed reply"
curl -fsN "http://127.0.0.1:$port/v1/chat/completions" -H 'content-type: application/json' -o "$work/reply.sse" \
  -d '{"messages": [{"role": "user", "content": "What is the capital of France?"}], "stream": true, "max_tokens": 12}' \
  || { tail -50 "$work/serve.log"; exit 1; }
grep -q '"content": "[^"]' "$work/reply.sse" && grep -q '^data: \[DONE\]' "$work/reply.sse" \
  || { cat "$work/reply.sse"; tail -50 "$work/serve.log"; exit 1; }
step "streamed: $(grep -o '"content": "[^"]*"' "$work/reply.sse" | cut -d'"' -f4 | tr -d '\n')"
step "done in $(( $(date +%s) - started )) s"
