#!/usr/bin/env bash
# The main job from a fresh machine: installs what is missing, builds, runs fsdpsim.
# With no arguments: `fsdpsim plan` on the built-in default (llama3-8b on 8xH100-SXM, seq 8192),
# writing out/plan.json and out/report.html.
set -euo pipefail
root="$(cd "$(dirname "$0")" && pwd)"
"$root/scripts/deps.sh"
"$root/scripts/build.sh" --target fsdpsim >/dev/null
if [[ $# -eq 0 ]]; then set -- plan --out "$root/out"; fi
exec "${FSDPSIM_BUILD_DIR:-$root/build}/fsdpsim" "$@"
