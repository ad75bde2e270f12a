#!/usr/bin/env bash
# Makes .venv-peers (project root, git-ignored) with the peers of benchmarks/bench_streaming_peers.py:
# LitData, Mosaic Streaming, HF datasets, s3fs/boto3, moto's S3 server. Their pins conflict with the project's
# (.venv), hence a virtualenv of their own. Usage: bash benchmarks/peers/setup.sh   (PYTHON=python3.11 by default)
# PEERS_TORCH_FROM=<a venv with torch 2.9.1 + torchvision 0.24.1, e.g. the project's .venv>: hard-link its torch,
#   torchvision and the packages they need into .venv-peers (benchmarks/peers/link_torch.py) instead of downloading
#   PyPI's CUDA build again: seconds, and no extra disk on the same filesystem.
# PEERS_TORCH_INDEX=<url of PyTorch's CPU wheel index>: take torch/torchvision from there (no CUDA wheels).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="$root/.venv-peers"
"${PYTHON:-python3.11}" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --disable-pip-version-check)
if [[ -n "${PEERS_TORCH_FROM:-}" ]]; then
  "${pip[@]}" packaging
  "$venv/bin/python" "$root/benchmarks/peers/link_torch.py" "$PEERS_TORCH_FROM"
elif [[ -n "${PEERS_TORCH_INDEX:-}" ]]; then
  "${pip[@]}" --index-url "$PEERS_TORCH_INDEX" torch==2.9.1 torchvision==0.24.1
fi
"${pip[@]}" -r "$root/benchmarks/peers/requirements.txt"
"$venv/bin/python" -c "import litdata, streaming, datasets, s3fs, moto, torch; print('peers ready:', \
'litdata', litdata.__version__, '| mosaicml-streaming', streaming.__version__, '| datasets', datasets.__version__, \
'| torch', torch.__version__)"
