#!/usr/bin/env bash
# Runs every test: installs what is missing, builds with AddressSanitizer and
# UndefinedBehaviorSanitizer, and runs ctest. GPU tests run when a GPU
# answers and are reported as skipped otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/install-deps.sh
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
build=${STOF_TEST_BUILD:-build-test}
cmake -S . -B "$build" -G Ninja -DSTOF_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build "$build"
# NVRTC and the CUDA driver keep process-lifetime allocations that
# LeakSanitizer would report; tests/lsan.supp names them, nothing of ours.
export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0"
export STOF_CACHE_DIR="$PWD/$build/kernel-cache"
ctest --test-dir "$build" --output-on-failure -j 2

# The Python package as a user installs it (pip install ., scikit-build-core driving the same
# CMake build), and its tests (tests/python: CPU always, the GPU part where torch sees one).
venv="$PWD/$build/venv"
python3 -m venv "$venv"
"$venv/bin/pip" install -q ".[test]"
(cd "$build" && PATH="$venv/bin:$PATH" "$venv/bin/python" -m pytest -q "$OLDPWD/tests/python")
