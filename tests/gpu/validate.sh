#!/usr/bin/env bash
# The CUPTI shim on a real NVIDIA GPU, against torch.profiler and nvidia-smi, in under 5 minutes.
# Needs: python3 with torch (CUDA build), gcc, an NVIDIA driver; CUDA headers from the nvidia-* wheels or a local
# CUDA toolkit (CUDA_HOME, /usr/local/cuda). Needs no bcc, no package manager and no install of fleetprof.
#   bash tests/gpu/validate.sh [--steps N]      PYTHON=... picks the interpreter; OUT=dir gets gpu_validation.json
# Exit status: 0 when per-kernel GPU time agrees with torch.profiler within 5% and kernel records come for the
# sampled launches (FLEETPROF_CUPTI_ACTIVITY=sampled), 1 when not, 2 when it cannot run, 124 when it ran out of time.
set -euo pipefail

cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../.."

PYTHON=${PYTHON:-python3}
die() { echo "validate.sh: $*" >&2; exit 2; }

command -v "$PYTHON" >/dev/null || die "$PYTHON not found (set PYTHON=...)"
command -v gcc >/dev/null || die "no gcc: the shim is built here"
command -v nvidia-smi >/dev/null || echo "validate.sh: no nvidia-smi: the NVML comparison is skipped" >&2
"$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null \
    || die "$PYTHON has no torch with a usable CUDA device"

# 290 s in all, so the whole check stays under 5 minutes whatever hangs
exec timeout --kill-after=5 290 "$PYTHON" tests/gpu/validate.py --python "$PYTHON" "$@"
