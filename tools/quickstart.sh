#!/usr/bin/env bash
# Quick start: set up, build, then the main job: optx info, optx verify, a short optx bench.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
./build/tools/optx info
./build/tools/optx verify > build/verify.txt || { tail -n 20 build/verify.txt; exit 1; }
tail -n 1 build/verify.txt
./build/tools/optx bench --quick --json build/bench.json
