#!/usr/bin/env bash
# One device call of the GPU checks (issue 29), in parts that each fit the device tool's 10-minute command limit.
# Run from the repository root on the GPU host, with the wheels of dependency-injector and msgspec in .whl/:
#   bash benchmarks/gpu_session.sh card      # the card's totals (nvidia-smi, cudaMemGetInfo), torch, driver
#   bash benchmarks/gpu_session.sh cuda      # the CUDA, allocator, resize and worst-case-step tests
#   bash benchmarks/gpu_session.sh suite     # the rest of the suite (pytest-timeout, xdist: as on the device image)
#   bash benchmarks/gpu_session.sh faults    # benchmarks/gpu_fault_matrix.py (every row PASS)
#   bash benchmarks/gpu_session.sh headroom  # benchmarks/gpu_measured_headroom.py --steps 200 (about 6 minutes)
#   bash benchmarks/gpu_session.sh mixed     # the same with --enable-mixed-chunk, Llama-3.1-8B unless MODELS says
# Several parts in one call: bash benchmarks/gpu_session.sh card cuda faults. Logs and JSON go to $OUT (or ./gpu-out).
set -uo pipefail
out="${OUT:-gpu-out}"; mkdir -p "$out"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
plugin=(-o addopts=)  # the summary line (pyproject's -q plus ours would hide it)
python3 -c "import importlib.metadata as m, sys; sys.exit(any(e.name == 'kvcache' for e in m.entry_points(group='pytest11')))" \
  && plugin+=(-p kvcache.testing.pytest_plugin)  # the entry point pip registers, where the tree is not installed
rc=0
for part in "$@"; do
  echo "== $part $(date -u +%H:%M:%S)"
  case "$part" in
    card)
      nvidia-smi --query-gpu=name,memory.total,memory.used,memory.free,driver_version --format=csv | tee "$out/card.txt"
      python3 - <<'PY' | tee -a "$out/card.txt"
import json, torch, pynvml
free, total = torch.cuda.mem_get_info()
pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0); m = pynvml.nvmlDeviceGetMemoryInfo(h)
print(json.dumps(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda,
                      cuda_mem_get_info_total=int(total), cuda_mem_get_info_free_after_context=int(free),
                      nvml_total=int(m.total), nvml_free=int(m.free), nvml_used=int(m.used),
                      driver=pynvml.nvmlSystemGetDriverVersion())))
PY
      ;;
    cuda)
      timeout 200 python3 -m pytest "${plugin[@]}" -q -rs tests/test_cuda*.py tests/test_forward_extend.py \
        tests/test_allocator*.py tests/test_resize*.py tests/test_vmm*.py tests/test_post_capture_resize.py \
        tests/test_worst_case_steps.py tests/test_mixed_chunk.py 2>&1 | tee "$out/cuda_tests.log" | tail -25 || rc=1
      ;;
    suite)  # the CUDA tests apart (they each want the whole card), the rest on 8 workers where pytest-xdist is
      # installed (serially it takes ~13 minutes on a CUDA host: each test ends with a full gc); a test that hangs
      # fails at 90 s and the rest go on; the slowest listed
      workers=(); python3 -c "import xdist" 2>/dev/null && workers=(-n 8)
      timeout "${SUITE_S:-400}" python3 -m pytest "${plugin[@]}" "${workers[@]}" -q -rfs -p no:cacheprovider --timeout 90 \
        --durations 25 --ignore-glob='tests/test_cuda*' > "$out/suite.log" 2>&1 || rc=1
      grep -E "^(FAILED|ERROR)|passed|failed" "$out/suite.log" | tail -30; grep -A27 "slowest" "$out/suite.log" | tail -26
      ;;
    faults)
      timeout 400 python3 benchmarks/gpu_fault_matrix.py --json "$out/fault_matrix.json" 2>&1 | tee "$out/fault_matrix.log" | tail -60 || rc=1
      ;;
    headroom)
      timeout 560 python3 benchmarks/gpu_measured_headroom.py --out "$out" --steps "${STEPS:-200}" --card "${CARD:-H200}" ${MODELS:+--models $MODELS} \
        2>&1 | tee "$out/measured_headroom.log" | cut -c1-600 || rc=1
      ;;
    mixed)
      timeout 560 python3 benchmarks/gpu_measured_headroom.py --out "$out/mixed" --steps "${STEPS:-200}" --card "${CARD:-H200}" \
        --mixed-chunk --models ${MODELS:-Llama-3.1-8B-Instruct} 2>&1 | tee "$out/measured_headroom_mixed.log" | cut -c1-600 || rc=1
      ;;
    *) echo "unknown part $part"; rc=2 ;;
  esac
done
exit $rc
