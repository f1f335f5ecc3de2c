#!/usr/bin/env bash
# Installs the Debian packages fsdpsim needs, only those missing (non-interactive).
#   scripts/deps.sh          build + run (the main job)
#   scripts/deps.sh --test   also what the test suite needs (MPI, BLAS, Chromium, Python parsers, clang)
set -euo pipefail
pkgs=(cmake g++ make ninja-build git libboost-graph-dev nlohmann-json3-dev libgtest-dev libgmock-dev
      libbenchmark-dev libopenblas-dev libopenmpi-dev openmpi-bin libyaml-cpp-dev libtomlplusplus-dev)
if [[ "${1:-}" == "--test" ]]; then
  pkgs+=(chromium python3 python3-yaml python3-jsonschema)
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "fsdpsim: installing ${missing[*]}" >&2
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
