#!/usr/bin/env bash
# Installs what stof needs to build on Debian/Ubuntu, if it is missing:
# CMake, Ninja, a C compiler, Lua 5.4 and cJSON development packages. The CUDA
# toolkit (nvcc, NVRTC, cuBLASLt headers and libraries) is expected to be there.
set -euo pipefail

missing=()
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v ninja >/dev/null 2>&1 || missing+=(ninja-build)
command -v cc >/dev/null 2>&1 || missing+=(gcc)
for pkg in liblua5.4-dev libcjson-dev pkg-config; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
# the Python package's tests install it into a virtual environment
command -v python3 >/dev/null 2>&1 || missing+=(python3)
python3 -c "import ensurepip, venv" >/dev/null 2>&1 || missing+=(python3-venv)

if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "The CUDA toolkit is missing: install NVIDIA's cuda-toolkit package (nvcc, NVRTC, cuBLASLt)." >&2
  exit 1
fi
