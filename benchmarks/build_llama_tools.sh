#!/usr/bin/env bash
# Build llama.cpp's own tools (llama-bench, llama-completion, llama-batched-bench, llama-lookup,
# llama-speculative-simple, llama-server, llama-mtmd-cli, llama-embedding) from the llama-cpp-python
# source distribution of the installed version, into ../.bench/ (ignored by git).
# Usage: benchmarks/build_llama_tools.sh [TARGET...]   -> prints the folder holding the binaries.
# With targets (e.g. llama-server, which the test suite compares infer serve with) only those
# are built: llama-server alone takes about 5 minutes on 2 cores, all of them about 18.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
out="$here/.bench"
version="$(python -c 'from importlib.metadata import version; print(version("llama_cpp_python"))')"
mkdir -p "$out/src"
if [ ! -d "$out/src/llama_cpp_python-$version" ]; then
  pip download --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$out/src" >&2
  tar -xzf "$out/src/llama_cpp_python-$version.tar.gz" -C "$out/src"
fi
src="$out/src/llama_cpp_python-$version/vendor/llama.cpp"
# LLAMA_USE_PREBUILT_UI=OFF: llama-server without its web UI (the default downloads it from
# Hugging Face at build time; the benchmarks only use its HTTP API).
cmake -S "$src" -B "$out/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_USE_PREBUILT_UI=OFF >&2
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(llama-bench llama-completion llama-batched-bench llama-lookup llama-speculative-simple llama-server
           llama-mtmd-cli llama-embedding)
fi
cmake --build "$out/build" -j "$(nproc)" --target "${targets[@]}" >&2
echo "$out/build/bin"
