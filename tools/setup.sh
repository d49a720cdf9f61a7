#!/usr/bin/env bash
# Installs what optx needs from Debian's packages (idempotent) and builds it into build/.
#   OPTX_BUILD_DIR   build directory (default: build)
#   OPTX_CMAKE_ARGS  extra CMake arguments
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(gcc g++ cmake ninja-build pkg-config libgtest-dev libopenblas-dev libdnnl-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

build="${OPTX_BUILD_DIR:-build}"
# shellcheck disable=SC2086
cmake -S . -B "$build" -G Ninja ${OPTX_CMAKE_ARGS:-}
cmake --build "$build" -j2
