#!/usr/bin/env bash
# Real-GPU check of gpufleet verify. READ-ONLY: it reads the GPUs (nvidia-smi queries, NVML, CUDA work for the
# benchmarks) and never changes a GPU setting (no persistence, power limit, MIG, reset, ECC, compute mode or
# clock command of nvidia-smi is ever run).
#
#   bash verify/gpu_check.sh [--out DIR]          (default DIR: tests/fixtures/real)
#
# 1. Saves real captures for the unit tests under DIR: nvidia-smi (table, -L, -q, the GpuInventory fact's exact
#    --query-gpu, topo -m, nvlink -s, mig -lgip), lspci, the probe document (no benchmarks) and its wall time.
# 2. Runs `gpufleet verify` on this machine (inventory: @local) with --bench quick, so the whole runner (probe
#    upload under /opt/gpufleet/probe, probe, quick benchmarks, checks, reports) runs on the real GPU; the
#    report lands in DIR/verify/ and the probe document with its benchmarks in DIR/probe-bench-quick.json. Where
#    gpufleet's control-side dependencies are missing, the probe runs the quick benchmarks directly instead.
# 3. Measures, in the same run, the best TFLOP/s of a plain torch.matmul loop (same sizes and precisions as the
#    quick profile, CUDA-event timed) and prints it next to verify's figure (target: verify >= 95 % of it).
#
# Pythons: the node side (probe, benchmarks) uses the first of $PYTHON, python3, .venv/bin/python that has a
# CUDA-enabled torch (else python3: the benchmarks then say "skipped" with the reason). nvidia-ml-py's pynvml.py is
# taken from .venv when that Python lacks it, as verify ships it to nodes. The control side uses .venv/bin/python
# when it can import gpufleet's runner.
#
# Exit status: 0 done; 1 a step failed (see the messages); 3 done, but verify's matmul figure is below 95 % of the
# direct loop for some GPU/precision.
set -euo pipefail

cd "$(dirname "$0")/.."
REPO=$PWD
OUT=tests/fixtures/real
while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUT=$2; shift 2 ;;
        -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
        *) echo "gpu_check.sh: unknown argument $1 (usage: gpu_check.sh [--out DIR])" >&2; exit 2 ;;
    esac
done
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
FAILED=0

say() { printf '\n=== %s\n' "$*"; }
warn() { printf 'gpu_check.sh: %s\n' "$*" >&2; }

command -v nvidia-smi >/dev/null 2>&1 || { warn "nvidia-smi not found: this is not a GPU machine"; exit 1; }

# ---------------------------------------------------------------------------------------------- Pythons
has_torch_cuda() { "$1" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; }
NODE_PY=""
for candidate in "${PYTHON:-}" python3 "$REPO/.venv/bin/python"; do
    [ -n "$candidate" ] || continue
    command -v "$candidate" >/dev/null 2>&1 || [ -x "$candidate" ] || continue
    if has_torch_cuda "$candidate"; then NODE_PY=$(command -v "$candidate" || echo "$candidate"); break; fi
done
if [ -z "$NODE_PY" ]; then
    NODE_PY=$(command -v "${PYTHON:-python3}" || true)
    [ -n "$NODE_PY" ] || { warn "no python3 found"; exit 1; }
    warn "no Python with a CUDA-enabled torch: the benchmarks will be reported as skipped"
fi
NODE_PYTHONPATH=$REPO
if ! "$NODE_PY" -c 'import pynvml' >/dev/null 2>&1; then
    nvml_py=""
    for found in "$REPO"/.venv/lib/python3*/site-packages/pynvml.py; do
        if [ -f "$found" ]; then nvml_py=$found; break; fi
    done
    if [ -z "$nvml_py" ]; then
        warn "$NODE_PY has no nvidia-ml-py (import pynvml) and .venv has no pynvml.py: pip install nvidia-ml-py"
        exit 1
    fi
    mkdir -p "$WORK/nvml"
    cp "$nvml_py" "$WORK/nvml/pynvml.py"  # pure Python, one file: exactly what verify ships to a node
    NODE_PYTHONPATH=$REPO:$WORK/nvml
fi
node_py() { PYTHONPATH=$NODE_PYTHONPATH "$NODE_PY" "$@"; }
CTRL_PY=""
for candidate in "$REPO/.venv/bin/python" "$NODE_PY" python3; do
    if PYTHONPATH=$REPO "$candidate" -c 'import gpufleet.verify.run' >/dev/null 2>&1; then CTRL_PY=$candidate; break; fi
done
echo "node Python: $NODE_PY ($("$NODE_PY" --version 2>&1)); control Python: ${CTRL_PY:-none (runner skipped)}"

# ---------------------------------------------------------------------------------------------- captures
say "1. real captures into $OUT"
: > "$OUT/captures.txt"
capture() {  # capture FILE COMMAND...: stdout+stderr into FILE, exit status into captures.txt
    local file=$1; shift
    local rc=0
    "$@" > "$OUT/$file" 2>&1 || rc=$?
    printf '%s\trc=%s\t%s\n' "$file" "$rc" "$*" >> "$OUT/captures.txt"
    printf '  %-32s rc=%s\n' "$file" "$rc"
}
# 595+ deprecate driver_version for kmd_version (unknown before 595): ask the tool which one it lists, as the fact does
VFIELD=driver_version
if nvidia-smi --help-query-gpu 2>/dev/null | grep -q '^"kmd_version"'; then VFIELD=kmd_version; fi
QUERY=$(node_py -c 'from gpufleet.facts.nvidia import GPU_FIELDS; print(",".join(GPU_FIELDS))' 2>/dev/null || true)
QUERY=${QUERY/driver_version/$VFIELD}
if [ -z "$QUERY" ]; then  # gpufleet's facts need pyinfra; the same field list, spelled out
    QUERY=index,name,uuid,serial,pci.bus_id,pci.device_id,$VFIELD,vbios_version,compute_cap,memory.total
    QUERY=$QUERY,persistence_mode,power.limit,enforced.power.limit,power.default_limit,power.min_limit
    QUERY=$QUERY,power.max_limit,temperature.gpu,mig.mode.current,mig.mode.pending,ecc.mode.current,clocks.max.sm
fi
capture nvidia-smi.txt nvidia-smi
capture nvidia-smi-L.txt nvidia-smi -L
capture nvidia-smi-q.txt nvidia-smi -q
capture nvidia-smi-query-gpu.csv nvidia-smi "--query-gpu=$QUERY" --format=csv
capture nvidia-smi-topo-m.txt nvidia-smi topo -m
capture nvidia-smi-nvlink-s.txt nvidia-smi nvlink -s
capture nvidia-smi-mig-lgip.txt nvidia-smi mig -lgip
capture nvidia-smi-version.txt nvidia-smi --version
if command -v lspci >/dev/null 2>&1; then capture lspci-nvidia.txt lspci -n -D -d 10de:; fi
DRIVER=$(nvidia-smi "--query-gpu=$VFIELD" --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' ')
BRANCH=${DRIVER%%.*}
echo "  driver $DRIVER (branch $BRANCH)"

say "2a. probe (no benchmarks)"
start=$(date +%s%N)
if node_py -m gpufleet.probe --indent 1 > "$OUT/probe.json" 2> "$WORK/probe.err"; then
    end=$(date +%s%N)
    wall_ms=$(( (end - start) / 1000000 ))
    node_py - "$OUT/probe.json" "$wall_ms" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
print(f"  {doc.get('gpu_count')} GPU(s), driver {doc.get('driver_version')}, NVML error {doc.get('nvml_error')}; "
      f"NVML part {doc.get('duration_s')} s, whole probe process {int(sys.argv[2]) / 1000:.2f} s (target <= 1 s)")
for gpu in doc.get("gpus") or []:
    failed = {k: v for k, v in (gpu.get("errors") or {}).items()}
    print(f"  gpu{gpu['index']} {gpu.get('name')} {gpu.get('status')}; fields NVML refused: {failed or 'none'}")
PY
else
    warn "the probe failed: $(tail -n 3 "$WORK/probe.err")"
    FAILED=1
fi

say "2b. gpufleet verify @local --bench quick (the whole runner on this GPU)"
BENCH_DOC=$OUT/probe-bench-quick.json
rm -f "$BENCH_DOC"
if [ -n "$CTRL_PY" ]; then
    mkdir -p "$WORK/inv"
    cat > "$WORK/inv/inventory.py" <<EOF
# This machine only; the driver branch it runs is the expected one; no node_exporter textfile here.
local = [("@local", {"gpufleet_stages": ["driver"], "gpufleet_driver_branch": "$BRANCH",
                     "gpufleet_verify_textfile_dir": False, "gpufleet_verify_python": "$NODE_PY"})]
EOF
    rc=0
    (cd "$WORK/inv" && PYTHONPATH=$REPO "$CTRL_PY" -c 'import sys; from gpufleet.cli import main; sys.exit(main())' \
        verify inventory.py --bench quick --out "$OUT/verify") || rc=$?
    echo "  gpufleet verify exit status: $rc (1 = a check failed: see the summary above)"
    if [ -f "$OUT/verify/report.json" ]; then
        node_py - "$OUT/verify/report.json" "$BENCH_DOC" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
probe = (report.get("hosts") or [{}])[0].get("probe")
if probe:
    json.dump(probe, open(sys.argv[2], "w"), indent=1)
PY
    fi
fi
if [ ! -s "$BENCH_DOC" ]; then
    echo "  (runner unavailable or no probe document: running the probe with --bench quick directly)"
    node_py -m gpufleet.probe --bench quick --indent 1 > "$BENCH_DOC" 2> "$WORK/bench.err" || {
        warn "the probe with --bench quick failed: $(tail -n 3 "$WORK/bench.err")"; FAILED=1; }
fi

say "3. matmul: verify's quick benchmark next to a direct torch.matmul loop (same run, same sizes)"
cmp_rc=0
node_py - "$BENCH_DOC" <<'PY' || cmp_rc=$?
import json, sys

from gpufleet.probe.bench import PROFILES

TARGET = 0.95
try:
    doc = json.load(open(sys.argv[1]))
except (OSError, ValueError) as exc:
    print(f"  no benchmark document: {exc}")
    sys.exit(1)
bench = doc.get("bench") or {}
if bench.get("status") in (None, "skipped") and not bench.get("gpus"):
    print(f"  verify's benchmarks were skipped: {bench.get('reason')}")
    sys.exit(1)
try:
    import torch
except ImportError:
    print("  no torch on this Python: no direct loop to compare with")
    sys.exit(1)

sizes = PROFILES["quick"]["matmul_n"]


def direct_best(device: int, precision: str, n: int, trials: int = 10, target_ms: float = 50.0) -> float | None:
    """Best TFLOP/s of back-to-back torch.matmul calls timed with CUDA events (warm, no Python per-op timing)."""
    dev = torch.device("cuda", device)
    major, minor = torch.cuda.get_device_capability(device)
    old_tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        with torch.cuda.device(dev):
            torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
            if precision == "fp8":
                if (major, minor) < (8, 9) or not hasattr(torch, "_scaled_mm"):
                    return None
                a = torch.randn(n, n, device=dev).to(torch.float8_e4m3fn)
                b = torch.randn(n, n, device=dev).to(torch.float8_e4m3fn).t()
                one = torch.tensor(1.0, device=dev)

                def op():
                    return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
            else:
                if precision in ("bf16", "tf32") and major < 8:
                    return None
                dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32,
                         "fp32": torch.float32}[precision]
                a = torch.randn(n, n, device=dev, dtype=dtype)
                b = torch.randn(n, n, device=dev, dtype=dtype)
                out = torch.empty(n, n, device=dev, dtype=dtype)

                def op():
                    return torch.matmul(a, b, out=out)
            for _ in range(5):
                op()
            torch.cuda.synchronize(dev)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            op()
            end.record()
            end.synchronize()
            reps = max(1, min(2000, int(target_ms / max(start.elapsed_time(end), 1e-3))))
            best = 0.0
            for _ in range(trials):
                start.record()
                for _ in range(reps):
                    op()
                end.record()
                end.synchronize()
                ms = start.elapsed_time(end) / reps
                best = max(best, 2.0 * n ** 3 / (ms / 1000.0) / 1e12)
            return best
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old_tf32
        torch.cuda.empty_cache()


missed = []
print(f"  {'GPU':<5} {'prec':<5} {'n':>6} {'verify TFLOP/s':>15} {'direct best':>12} {'ratio':>7}")
for entry in bench.get("gpus") or []:
    device = entry.get("cuda_device", entry.get("index"))
    for precision, item in (entry.get("matmul") or {}).items():
        n = item.get("n") or sizes[precision]
        direct = direct_best(device, precision, n)
        ours = item.get("tflops") if item.get("status") == "ok" else None
        if ours is None or not direct:
            why = item.get("reason") if ours is None else "direct loop not possible"
            print(f"  gpu{entry.get('index'):<2} {precision:<5} {n:>6} {'-':>15} {direct or 0:>12.1f}   ({why})")
            continue
        ratio = ours / direct
        flag = "" if ratio >= TARGET else f"  BELOW {TARGET:.0%}"
        if ratio < TARGET:
            missed.append(f"gpu{entry.get('index')} {precision}")
        print(f"  gpu{entry.get('index'):<2} {precision:<5} {n:>6} {ours:>15.1f} {direct:>12.1f} {ratio:>7.1%}{flag}")
print(f"  target: verify's median >= {TARGET:.0%} of the direct loop's best: "
      + ("met" if not missed else "MISSED for " + ", ".join(missed)))
sys.exit(3 if missed else 0)
PY

say "done: captures, probe documents and the verify report are in $OUT"
ls -l "$OUT"
if [ "$FAILED" -ne 0 ] || [ "$cmp_rc" -eq 1 ]; then
    exit 1
fi
if [ "$cmp_rc" -eq 3 ]; then
    exit 3
fi
exit 0
