#!/bin/bash
# Device-side run of the CUDA check (dev tooling). Prepare here, in the repo root:
#   echo /.gpu/ >> .git/info/exclude
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 -d /tmp/whl onnxruntime-gpu==1.31.1
#   python bench/gpu_pack_ort.py /tmp/whl/onnxruntime_gpu-1.31.1-*.whl .gpu/ort     # ~19 MiB
#   for each model NAME: memplan train-graph MODEL -o .gpu/m/NAME.orig.onnx
#                        memplan plan MODEL --budget B --emit .gpu/m/NAME.plan.onnx -o .gpu/m/NAME.plan.json
# then run `bash bench/gpu_run.sh NAME:HI ...` on the device with .gpu carried (HI: top of the
# gpu_mem_limit bisection, e.g. gpt:2GiB). Reports land in $OUT/NAME.json. SESSION=default runs
# under ORT's default session options (for models emitted with --pin-order).
# `bash bench/gpu_run.sh zoo [ARGS]` runs `bench/gpu_zoo.py run ARGS` instead: the whole table of the
# zoo and the fixtures at 80/60/50% and the max-batch rows, in $OUT/gpu_zoo.json. Here, first (about
# 25 min on 2 cores, two preps side by side): python bench/gpu_zoo.py prep --tag a --only ...;
# prep --tag b --only ... (the rest); prep-batch; prep-pinned; pack (-> .gpu/c, ~33 MiB). Then on
# the device, with carry [".gpu/ort", ".gpu/c"] (~61 MiB with the repo):
#   export PYTHONUNBUFFERED=1; set -o pipefail; bash bench/gpu_run.sh zoo --workers 12 --deadline 330 2>&1 | tee $OUT/log.txt
set -u
export PYTHONUNBUFFERED=1
S=/tmp/site
mkdir -p $S
t0=$(date +%s)
tar -xJf .gpu/ort/py.tar.xz -C $S || exit 3
python3 - <<'PY' || exit 3
import lzma, shutil
for src, dst in [(".gpu/ort/cuda.so.xz", "libonnxruntime_providers_cuda.so"),
                 (".gpu/ort/pybind.so.xz", "onnxruntime_pybind11_state.cpython-312-x86_64-linux-gnu.so")]:
    with lzma.open(src) as f, open("/tmp/site/onnxruntime/capi/" + dst, "wb") as g:
        shutil.copyfileobj(f, g)
PY
cp .gpu/ort/libonnxruntime_providers_shared.so $S/onnxruntime/capi/
export PYTHONPATH=$S
# CUDA 13 libraries (cuBLAS, cuDNN, cuFFT, cuRAND) come with the image's PyTorch as pip packages.
SP=$(python3 -c "import site; print(site.getsitepackages()[0])")
export LD_LIBRARY_PATH=$(find "$SP/nvidia" -name 'lib*.so*' -printf '%h\n' 2>/dev/null | sort -u | paste -sd:)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import onnxruntime as ort; print('onnxruntime', ort.__version__, ort.get_available_providers())"
if [ "${1:-}" = zoo ]; then
  shift
  python3 bench/gpu_zoo.py run "$@"
  rc=$?
  echo "total $(( $(date +%s) - t0 )) s"
  exit $rc
fi
for spec in "$@"; do
  name=${spec%%:*}
  hi=${spec#*:}
  echo "== $name ($(( $(date +%s) - t0 )) s)"
  timeout 200 python3 bench/gpu_check.py .gpu/m/$name.orig.onnx .gpu/m/$name.plan.onnx --plan .gpu/m/$name.plan.json \
    --reference cpu --bisect --hi "$hi" --session "${SESSION:-planned}" --json "$OUT/$name.json"
  echo "rc=$?"
done
echo "total $(( $(date +%s) - t0 )) s"
