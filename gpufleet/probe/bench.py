#!/usr/bin/env python3
"""gpufleet node benchmarks: matmul TFLOP/s per precision, memory and host<->device bandwidth, NCCL all-reduce,
DCGM diagnostics, with the clocks, power and clock event reasons NVML saw during the run.

Runs ON the node: standard library (>= 3.9), nvidia-ml-py for the sampling, and PyTorch or CuPy when installed
for the CUDA work. Nothing is made up: whatever cannot run is reported as ``skipped`` with the reason, and every
figure comes from a timed run on the device. Efficiency against the catalog's dense peak is computed on the
control side (gpufleet.verify.checks), not here.

``python3 bench.py --profile quick`` prints the JSON document; ``run_bench()`` returns it.

Timing: ``warmup`` untimed runs, then ``samples`` timed samples; each sample times ``reps`` back-to-back
operations between two CUDA events (``reps`` is chosen so that a sample lasts about ``target_sample_ms``). The
per-operation time of each sample gives the median and the spread (min, max, stdev, (max-min)/median).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

try:
    from . import probe_nvml as _nvml  # package mode
except ImportError:  # script mode: this directory is sys.path[0]
    import probe_nvml as _nvml  # type: ignore[no-redef]

BENCH_SCHEMA_VERSION = 1
PRECISIONS = ("bf16", "fp16", "tf32", "fp32", "fp8")

# Profiles: sizes and repetitions. quick is meant to finish within about a minute on an 8-GPU node.
PROFILES: dict[str, dict[str, Any]] = {
    "quick": {
        "precisions": PRECISIONS,
        "matmul_n": {"bf16": 8192, "fp16": 8192, "tf32": 8192, "fp32": 4096, "fp8": 8192},
        "warmup": 3,
        "samples": 7,
        "target_sample_ms": 25.0,
        "memory_bytes": 1 << 30,
        "transfer_bytes": 256 << 20,
        "copy_samples": 7,
        "nccl_args": ["-b", "32M", "-e", "512M", "-f", "2", "-w", "5", "-n", "20"],
        "nccl_timeout_s": 120,
        "dcgm_level": 1,
        "dcgm_timeout_s": 300,
        "sample_interval_s": 0.1,
    },
    "full": {
        "precisions": PRECISIONS,
        "matmul_n": {"bf16": 16384, "fp16": 16384, "tf32": 8192, "fp32": 8192, "fp8": 16384},
        "warmup": 10,
        "samples": 30,
        "target_sample_ms": 100.0,
        "memory_bytes": 4 << 30,
        "transfer_bytes": 1 << 30,
        "copy_samples": 20,
        "nccl_args": ["-b", "8M", "-e", "8G", "-f", "2", "-w", "10", "-n", "50"],
        "nccl_timeout_s": 900,
        "dcgm_level": 2,
        "dcgm_timeout_s": 1800,
        "sample_interval_s": 0.1,
    },
}
NCCL_TESTS_CANDIDATES = (
    "/usr/local/bin/all_reduce_perf",
    "/usr/bin/all_reduce_perf",
    "/opt/nccl-tests/build/all_reduce_perf",
    "/usr/local/nccl-tests/build/all_reduce_perf",
)


def skipped(reason: str, **extra: Any) -> dict[str, Any]:
    result = {"status": "skipped", "reason": reason}
    result.update(extra)
    return result


def timing_stats(sample_ms: list[float], reps: int) -> dict[str, Any]:
    """Per-operation statistics (ms) of samples that each timed ``reps`` operations."""
    per_op = [t / reps for t in sample_ms]
    median = statistics.median(per_op)
    return {
        "samples": len(per_op),
        "reps": reps,
        "median_ms": round(median, 6),
        "min_ms": round(min(per_op), 6),
        "max_ms": round(max(per_op), 6),
        "stdev_ms": round(statistics.pstdev(per_op), 6) if len(per_op) > 1 else 0.0,
        "spread_pct": round((max(per_op) - min(per_op)) / median * 100.0, 3) if median > 0 else None,
    }


# ----------------------------------------------------------------------------------------------------------------
# CUDA backends (PyTorch, CuPy). A backend exposes:
#   name, version, cuda_version; devices() -> [{index, name, uuid, pci_bus_id, compute_capability (major, minor),
#   memory_bytes}]; precision_unsupported(device, precision) -> reason or None;
#   matmul(device, precision, n, reps, samples, warmup) -> [ms per sample];
#   copy(device, kind, nbytes, reps, samples, warmup) -> [ms per sample], kind in d2d | h2d | d2h.
# ----------------------------------------------------------------------------------------------------------------


class TorchBackend:
    name = "torch"

    def __init__(self, torch: Any):
        self.torch = torch
        self.version = str(torch.__version__)
        self.cuda_version = getattr(torch.version, "cuda", None)

    def devices(self) -> list[dict[str, Any]]:
        torch = self.torch
        result = []
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            uuid = getattr(props, "uuid", None)
            uuid_text = None
            if uuid is not None:
                text = str(uuid)
                uuid_text = text if text.startswith(("GPU-", "MIG-")) else "GPU-" + text
            bus = None
            if hasattr(props, "pci_bus_id"):
                bus = f"{getattr(props, 'pci_domain_id', 0):08X}:{props.pci_bus_id:02X}:" \
                      f"{getattr(props, 'pci_device_id', 0):02X}.0"
            result.append({"index": i, "name": props.name, "uuid": uuid_text, "pci_bus_id": bus,
                           "compute_capability": (props.major, props.minor), "memory_bytes": props.total_memory})
        return result

    def precision_unsupported(self, device: int, precision: str) -> str | None:
        torch = self.torch
        major, minor = torch.cuda.get_device_capability(device)
        if precision in ("bf16", "tf32") and major < 8:
            return f"{precision} needs compute capability >= 8.0 (this GPU: {major}.{minor})"
        if precision == "fp8":
            if (major, minor) < (8, 9):
                return f"fp8 needs compute capability >= 8.9 (this GPU: {major}.{minor})"
            if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
                return f"this PyTorch ({self.version}) has no float8_e4m3fn/_scaled_mm"
        return None

    def _timed(self, device: int, op: Callable[[], Any], reps: int, samples: int, warmup: int) -> list[float]:
        torch = self.torch
        for _ in range(warmup):
            op()
        torch.cuda.synchronize(device)
        times = []
        for _ in range(samples):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                op()
            end.record()
            end.synchronize()
            times.append(float(start.elapsed_time(end)))
        return times

    def matmul(self, device: int, precision: str, n: int, reps: int, samples: int, warmup: int) -> list[float]:
        torch = self.torch
        dev = torch.device("cuda", device)
        allow_tf32 = torch.backends.cuda.matmul.allow_tf32
        with torch.cuda.device(dev):
            try:
                torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
                if precision == "fp8":
                    a = torch.randn(n, n, device=dev).to(torch.float8_e4m3fn)
                    b = torch.randn(n, n, device=dev).to(torch.float8_e4m3fn).t()  # column-major, as cuBLASLt wants
                    one = torch.tensor(1.0, device=dev)

                    def op() -> Any:
                        return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
                else:
                    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32,
                             "fp32": torch.float32}[precision]
                    a = torch.randn(n, n, device=dev, dtype=dtype)
                    b = torch.randn(n, n, device=dev, dtype=dtype)
                    out = torch.empty(n, n, device=dev, dtype=dtype)

                    def op() -> Any:
                        return torch.matmul(a, b, out=out)
                return self._timed(device, op, reps, samples, warmup)
            finally:
                torch.backends.cuda.matmul.allow_tf32 = allow_tf32
                torch.cuda.empty_cache()

    def copy(self, device: int, kind: str, nbytes: int, reps: int, samples: int, warmup: int) -> list[float]:
        torch = self.torch
        dev = torch.device("cuda", device)
        with torch.cuda.device(dev):
            try:
                if kind == "d2d":
                    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
                    dst = torch.empty_like(src)
                elif kind == "h2d":
                    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
                    dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
                else:
                    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
                    dst = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

                def op() -> Any:
                    return dst.copy_(src, non_blocking=True)
                return self._timed(device, op, reps, samples, warmup)
            finally:
                torch.cuda.empty_cache()


class CupyBackend:
    name = "cupy"

    def __init__(self, cupy: Any):
        self.cupy = cupy
        self.version = str(cupy.__version__)
        try:
            v = cupy.cuda.runtime.runtimeGetVersion()
            self.cuda_version = f"{v // 1000}.{(v % 1000) // 10}"
        except Exception:
            self.cuda_version = None

    def devices(self) -> list[dict[str, Any]]:
        cupy = self.cupy
        result = []
        for i in range(cupy.cuda.runtime.getDeviceCount()):
            props = cupy.cuda.runtime.getDeviceProperties(i)
            name = props.get("name")
            name = name.decode() if isinstance(name, bytes) else name
            bus = (f"{props.get('pciDomainID', 0):08X}:{props.get('pciBusID', 0):02X}:"
                   f"{props.get('pciDeviceID', 0):02X}.0")
            result.append({"index": i, "name": name, "uuid": None, "pci_bus_id": bus,
                           "compute_capability": (props.get("major"), props.get("minor")),
                           "memory_bytes": props.get("totalGlobalMem")})
        return result

    def precision_unsupported(self, device: int, precision: str) -> str | None:
        if precision in ("bf16", "fp8"):
            return f"{precision} matmul is not available in CuPy"
        if precision == "tf32":
            return "CuPy fixes TF32 at import time (CUPY_TF32); measured as fp32 only"
        return None

    def _timed(self, device: int, op: Callable[[], Any], reps: int, samples: int, warmup: int) -> list[float]:
        cupy = self.cupy
        for _ in range(warmup):
            op()
        cupy.cuda.Device(device).synchronize()
        times = []
        for _ in range(samples):
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record()
            for _ in range(reps):
                op()
            end.record()
            end.synchronize()
            times.append(float(cupy.cuda.get_elapsed_time(start, end)))
        return times

    def matmul(self, device: int, precision: str, n: int, reps: int, samples: int, warmup: int) -> list[float]:
        cupy = self.cupy
        with cupy.cuda.Device(device):
            dtype = {"fp16": cupy.float16, "fp32": cupy.float32}[precision]
            a = cupy.random.standard_normal((n, n)).astype(dtype)
            b = cupy.random.standard_normal((n, n)).astype(dtype)
            out = cupy.empty((n, n), dtype=dtype)
            try:
                return self._timed(device, lambda: cupy.matmul(a, b, out=out), reps, samples, warmup)
            finally:
                cupy.get_default_memory_pool().free_all_blocks()

    def copy(self, device: int, kind: str, nbytes: int, reps: int, samples: int, warmup: int) -> list[float]:
        cupy = self.cupy
        with cupy.cuda.Device(device):
            runtime = cupy.cuda.runtime
            if kind == "d2d":
                src, dst = cupy.empty(nbytes, cupy.uint8), cupy.empty(nbytes, cupy.uint8)
                args = (dst.data.ptr, src.data.ptr, nbytes, runtime.memcpyDeviceToDevice)
            else:
                host = cupy.cuda.alloc_pinned_memory(nbytes)
                dev = cupy.empty(nbytes, cupy.uint8)
                if kind == "h2d":
                    args = (dev.data.ptr, host.ptr, nbytes, runtime.memcpyHostToDevice)
                else:
                    args = (host.ptr, dev.data.ptr, nbytes, runtime.memcpyDeviceToHost)
            stream = cupy.cuda.get_current_stream().ptr
            return self._timed(device, lambda: runtime.memcpyAsync(*args, stream), reps, samples, warmup)


def detect_backend() -> tuple[Any, str | None]:
    """(backend, None) or (None, why there is none). Device order is PCI bus order, as NVML's."""
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    reasons = []
    try:
        import torch
    except ImportError:
        reasons.append("PyTorch not installed")
    else:
        try:
            if torch.cuda.is_available() and torch.cuda.device_count() > 0:
                return TorchBackend(torch), None
            reasons.append(f"PyTorch {torch.__version__} sees no CUDA device")
        except Exception as exc:
            reasons.append(f"PyTorch CUDA init failed: {exc}")
    try:
        import cupy
    except ImportError:
        reasons.append("CuPy not installed")
    else:
        try:
            if cupy.cuda.runtime.getDeviceCount() > 0:
                return CupyBackend(cupy), None
            reasons.append("CuPy sees no CUDA device")
        except Exception as exc:
            reasons.append(f"CuPy CUDA init failed: {exc}")
    return None, "no CUDA backend: " + "; ".join(reasons)


# ----------------------------------------------------------------------------------------------------------------
# NVML sampling during the run
# ----------------------------------------------------------------------------------------------------------------


class NvmlSampler:
    """Samples one GPU's clock event reasons, SM clock, power and temperature in a thread while it works."""

    def __init__(self, nvml_index: int, interval_s: float = 0.1, nvml: Any = None):
        self.index = nvml_index
        self.interval_s = interval_s
        self.nvml = nvml
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.samples: list[dict[str, Any]] = []
        self.error: str | None = None
        self._handle: Any = None

    def start(self) -> NvmlSampler:
        if self.nvml is None:
            try:
                import pynvml
            except ImportError:
                self.error = "pynvml_not_installed"
                return self
            self.nvml = pynvml
        try:
            self.nvml.nvmlInit()
            self._handle = self.nvml.nvmlDeviceGetHandleByIndex(self.index)
        except Exception as exc:
            self.error = _nvml.nvml_status(exc)
            return self
        self._sample()
        self._thread = threading.Thread(target=self._loop, name=f"nvml-sampler-{self.index}", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> None:
        nvml, h = self.nvml, self._handle
        sample: dict[str, Any] = {}
        for key, fn, args in (
            ("reasons", "nvmlDeviceGetCurrentClocksEventReasons", ()),
            ("sm_mhz", "nvmlDeviceGetClockInfo", (1,)),
            ("power_mw", "nvmlDeviceGetPowerUsage", ()),
            ("temperature_c", "nvmlDeviceGetTemperature", (0,)),
        ):
            try:
                sample[key] = getattr(nvml, fn)(h, *args)
            except Exception as exc:
                self.error = self.error or f"{key}: {_nvml.nvml_status(exc)}"
        self.samples.append(sample)

    def stop(self) -> dict[str, Any]:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._sample()
        if self._handle is not None:
            try:
                self.nvml.nvmlShutdown()
            except Exception:
                pass
        return summarize_samples(self.samples, self.error)


def summarize_samples(samples: list[dict[str, Any]], error: str | None = None) -> dict[str, Any]:
    mask = 0
    for s in samples:
        if s.get("reasons") is not None:
            mask |= int(s["reasons"])
    names, hardware = _nvml.decode_clock_event_reasons(mask)

    def series(key: str) -> list[float]:
        return [s[key] for s in samples if s.get(key) is not None]

    sm, power, temp = series("sm_mhz"), series("power_mw"), series("temperature_c")
    return {
        "samples": len(samples),
        "error": error,
        "clock_event_reasons_mask": _nvml.hex_mask(mask) if series("reasons") else None,
        "clock_event_reasons": names if series("reasons") else None,
        "hardware_problems": hardware if series("reasons") else None,
        "sm_clock_mhz": {"min": min(sm), "median": statistics.median(sm), "max": max(sm)} if sm else None,
        "power_w": {"median": round(statistics.median(power) / 1000.0, 2), "max": round(max(power) / 1000.0, 2)}
        if power else None,
        "temperature_c": {"max": max(temp)} if temp else None,
    }


# ----------------------------------------------------------------------------------------------------------------
# nccl-tests and dcgmi parsers
# ----------------------------------------------------------------------------------------------------------------

_MPI_PREFIX = re.compile(r"^\[\d+,\d+\]<std(?:out|err)>:")
_RANK_RE = re.compile(r"^#\s+Rank\s+(\d+)\s+Group\s+(\d+)\s+.*?\bon\s+(\S+)\s+"
                      r"device\s+(\d+)\s+\[([^\]]*)\]\s+(.*)$")


def _num(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def parse_all_reduce_perf(text: str) -> dict[str, Any]:
    """Parse nccl-tests ``all_reduce_perf`` output (util.cu format; see reference nvidia_ground_truth.md §7.3).

    Returns rows (size, count, type, redop, root, out-of-place and in-place time/algbw/busbw/#wrong), the
    reported average bus bandwidth, out-of-bounds count, nGpus and the devices listed.
    """
    result: dict[str, Any] = {
        "version": None, "n_gpus": None, "n_threads": None, "devices": [], "rows": [],
        "avg_busbw_gbs": None, "avg_busbw_check": None, "out_of_bounds": None, "wrong_total": 0,
        "max_busbw_gbs": None,
    }
    for raw in text.splitlines():
        line = _MPI_PREFIX.sub("", raw.rstrip())
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            body = stripped[1:].strip()
            m = re.match(r"nccl-tests version (\S+)", body)
            if m:
                result["version"] = m.group(1)
            m = re.search(r"\bnThread (\d+) nGpus (\d+)", body)
            if m:
                result["n_threads"], result["n_gpus"] = int(m.group(1)), int(m.group(2))
            m = _RANK_RE.match(stripped)
            if m:
                result["devices"].append({"rank": int(m.group(1)), "host": m.group(3), "device": int(m.group(4)),
                                          "bus": m.group(5), "name": m.group(6).strip()})
            m = re.match(r"Avg bus bandwidth\s*:\s*(\S+)\s*(\S*)", body)
            if m:
                result["avg_busbw_gbs"] = _num(m.group(1))
                result["avg_busbw_check"] = m.group(2) or None
            m = re.match(r"Out of bounds values\s*:\s*(\d+)", body)
            if m:
                result["out_of_bounds"] = int(m.group(1))
            continue
        parts = stripped.split()
        if len(parts) < 13 or not parts[0].isdigit():
            continue
        size, count, dtype, redop, root = parts[:5]
        oop, ip = parts[5:9], parts[9:13]

        def half(p: list[str]) -> dict[str, Any]:
            wrong = _num(p[3])
            return {"time_us": _num(p[0]), "algbw_gbs": _num(p[1]), "busbw_gbs": _num(p[2]),
                    "wrong": None if wrong is None else int(wrong)}

        row = {"size_bytes": int(size), "count": int(count) if count.isdigit() else None, "type": dtype,
               "redop": redop, "root": int(root) if root.lstrip("-").isdigit() else None,
               "out_of_place": half(oop), "in_place": half(ip)}
        result["rows"].append(row)
        result["wrong_total"] += (row["out_of_place"]["wrong"] or 0) + (row["in_place"]["wrong"] or 0)
    busbw = [r[k]["busbw_gbs"] for r in result["rows"] for k in ("out_of_place", "in_place")
             if r[k]["busbw_gbs"] is not None]
    result["max_busbw_gbs"] = max(busbw) if busbw else None
    return result


def _diag_status(raw: Any) -> str:
    word = " ".join(str(raw or "").lower().split())
    if word in ("pass", "passed", "ok"):
        return "pass"
    if word in ("fail", "failed", "error"):
        return "fail"
    if word in ("warn", "warning"):
        return "warn"
    if word in ("skip", "skipped", "not applicable", "n/a"):
        return "skip"
    return "not_run"  # "Not Run" and any word we do not know: never read as a pass


def parse_dcgmi_diag(text: str) -> dict[str, Any]:
    """Parse ``dcgmi diag -r N -j`` output, DCGM 3.x ("DCGM GPU Diagnostic") and 4.x ("DCGM Diagnostic", entity
    results, "metadata") shapes; banner text before the JSON is ignored. Raises ValueError when no JSON object
    is found."""
    start = text.find("{")
    if start < 0:
        raise ValueError("no JSON object in dcgmi output")
    doc, _ = json.JSONDecoder().raw_decode(text[start:])
    if not isinstance(doc, dict):
        raise ValueError("dcgmi output is not a JSON object")
    root = doc.get("DCGM GPU Diagnostic") or doc.get("DCGM Diagnostic") or doc
    if not isinstance(root, dict):
        root = {}
    metadata = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    version = root.get("version") or metadata.get("version") or doc.get("version")
    driver = (root.get("driver_version_detected") or metadata.get("Driver Version Detected")
              or doc.get("driver_version") or root.get("Driver Version Detected"))
    categories = [c for c in root.get("test_categories") or [] if isinstance(c, dict)]
    tests_in = [(c.get("category"), t) for c in categories for t in (c.get("tests") or [])]
    hoisted = root.get("tests") or (doc.get("tests") if root is not doc else None) or []  # 4.x variants
    tests_in += [(None, t) for t in hoisted]
    tests = []
    for category, test in tests_in:
        if not isinstance(test, dict):  # DCGM 3.x puts nulls between tests
            continue
        results = []
        for r in test.get("results") or []:
            if not isinstance(r, dict):
                continue
            gpus = r.get("gpu_ids", r.get("entity_id"))
            if isinstance(gpus, str):
                gpu_list = [int(g) for g in gpus.split(",") if g.strip().isdigit()]
            elif isinstance(gpus, int):
                gpu_list = [gpus]
            else:
                gpu_list = []
            messages = []
            for w in r.get("warnings") or []:
                messages.append(w.get("warning") if isinstance(w, dict) else str(w))
            info = r.get("info") or []
            results.append({"gpus": gpu_list, "status": _diag_status(r.get("status")),
                            "warnings": [m for m in messages if m], "info": [str(i) for i in info]
                            if isinstance(info, list) else [str(info)]})
        statuses = [r["status"] for r in results]
        summary = test.get("test_summary") if isinstance(test.get("test_summary"), dict) else {}
        if summary.get("status"):
            statuses.append(_diag_status(summary["status"]))
        tests.append({"category": category, "name": test.get("name"), "status": _worst(statuses),
                      "results": results})
    runtime_error = doc.get("runtime_error") or root.get("runtime_error")
    overall = _worst([t["status"] for t in tests]) if tests else "not_run"
    if runtime_error:
        overall = "fail"
    return {"version": version, "driver_version": driver, "result": overall, "runtime_error": runtime_error,
            "tests": tests}


_ORDER = ("fail", "not_run", "warn", "skip", "pass")


def _worst(statuses: list[str]) -> str:
    if not statuses:
        return "not_run"
    if all(s == "skip" for s in statuses):
        return "skip"
    statuses = [s for s in statuses if s != "skip"]
    for word in _ORDER:
        if word in statuses:
            return word
    return "not_run"


# ----------------------------------------------------------------------------------------------------------------
# External tools
# ----------------------------------------------------------------------------------------------------------------


def _run_tool(argv: list[str], timeout: float) -> tuple[int | None, str, str]:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode("utf-8", "replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return None, out, f"timed out after {timeout:.0f} s"
    except OSError as exc:
        return None, "", f"{type(exc).__name__}: {exc}"
    return proc.returncode, proc.stdout, proc.stderr


def find_all_reduce_perf(which: Callable[[str], str | None] = shutil.which) -> str | None:
    env_dir = os.environ.get("GPUFLEET_NCCL_TESTS_DIR")
    if env_dir and os.access(os.path.join(env_dir, "all_reduce_perf"), os.X_OK):
        return os.path.join(env_dir, "all_reduce_perf")
    found = which("all_reduce_perf")
    if found:
        return found
    for path in NCCL_TESTS_CANDIDATES:
        if os.access(path, os.X_OK):
            return path
    return None


def run_nccl_all_reduce(n_gpus: int, profile: dict[str, Any], *, exe: str | None = None,
                        runner: Callable[[list[str], float], tuple[int | None, str, str]] = _run_tool,
                        which: Callable[[str], str | None] = shutil.which) -> dict[str, Any]:
    if n_gpus < 2:
        return skipped(f"all-reduce needs at least 2 GPUs (this node: {n_gpus})")
    exe = exe or find_all_reduce_perf(which)
    if exe is None:
        return skipped("nccl-tests all_reduce_perf not found (PATH, GPUFLEET_NCCL_TESTS_DIR, /opt/nccl-tests)")
    argv = [exe, *profile["nccl_args"], "-g", str(n_gpus)]
    rc, out, err = runner(argv, profile["nccl_timeout_s"])
    parsed = parse_all_reduce_perf(out)
    result: dict[str, Any] = {"status": "ok", "tool": "nccl-tests", "command": argv, "exit_code": rc}
    result.update(parsed)
    if rc != 0 or not parsed["rows"]:
        tail = "\n".join((out + "\n" + err).strip().splitlines()[-5:])
        result.update(status="error", reason=f"all_reduce_perf exit {rc}: {tail}" if rc is not None else err)
    return result


def run_dcgm_diag(profile: dict[str, Any], *, level: int | None = None,
                  runner: Callable[[list[str], float], tuple[int | None, str, str]] = _run_tool,
                  which: Callable[[str], str | None] = shutil.which) -> dict[str, Any]:
    exe = which("dcgmi")
    if exe is None:
        return skipped("dcgmi not found (DCGM not installed)")
    level = level or profile["dcgm_level"]
    argv = [exe, "diag", "-r", str(level), "-j"]
    rc, out, err = runner(argv, profile["dcgm_timeout_s"])
    result: dict[str, Any] = {"status": "ok", "tool": "dcgmi", "command": argv, "exit_code": rc, "level": level}
    try:
        result.update(parse_dcgmi_diag(out))
    except ValueError as exc:
        tail = "\n".join((out + "\n" + err).strip().splitlines()[-5:])
        result.update(status="error", reason=f"{exc}; dcgmi exit {rc}: {tail}")
    return result


# ----------------------------------------------------------------------------------------------------------------
# Orchestration
# ----------------------------------------------------------------------------------------------------------------


def _match_nvml_index(dev: dict[str, Any], gpus: list[dict[str, Any]] | None) -> int:
    for g in gpus or []:
        if dev.get("uuid") and g.get("uuid") == dev["uuid"]:
            return g["index"]
    for g in gpus or []:
        bus = (g.get("pci_bus_id") or "").upper()
        if dev.get("pci_bus_id") and bus and bus.split(":", 1)[-1] == dev["pci_bus_id"].upper().split(":", 1)[-1]:
            return g["index"]
    return dev["index"]  # CUDA_DEVICE_ORDER=PCI_BUS_ID gives NVML's order


def _bench_matmul(backend: Any, device: int, precision: str, prof: dict[str, Any]) -> dict[str, Any]:
    reason = backend.precision_unsupported(device, precision)
    if reason:
        return skipped(reason)
    n = prof["matmul_n"][precision]
    try:
        # One warm-up run tells how long an operation takes; reps makes a sample last ~target_sample_ms.
        first = backend.matmul(device, precision, n, 1, 1, prof["warmup"])
        reps = max(1, min(1000, int(math.ceil(prof["target_sample_ms"] / max(first[0], 1e-3)))))
        times = backend.matmul(device, precision, n, reps, prof["samples"], 1)
    except Exception as exc:  # a precision that fails on this GPU is reported, not fatal
        return {"status": "error", "reason": f"{type(exc).__name__}: {exc}", "n": n}
    stats = timing_stats(times, reps)
    flop = 2.0 * n ** 3
    result = {"status": "ok", "n": n, "flop_per_op": flop}
    result.update(stats)
    result["tflops"] = round(flop / (stats["median_ms"] / 1000.0) / 1e12, 3)
    result["tflops_best"] = round(flop / (stats["min_ms"] / 1000.0) / 1e12, 3)
    return result


def _bench_copy(backend: Any, device: int, kind: str, nbytes: int, prof: dict[str, Any]) -> dict[str, Any]:
    try:
        first = backend.copy(device, kind, nbytes, 1, 1, 2)
        reps = max(1, min(1000, int(math.ceil(prof["target_sample_ms"] / max(first[0], 1e-3)))))
        times = backend.copy(device, kind, nbytes, reps, prof["copy_samples"], 1)
    except Exception as exc:
        return {"status": "error", "reason": f"{type(exc).__name__}: {exc}", "bytes": nbytes}
    stats = timing_stats(times, reps)
    moved = 2 * nbytes if kind == "d2d" else nbytes  # a device copy reads and writes every byte
    result: dict[str, Any] = {"status": "ok", "bytes": nbytes, "bytes_moved_per_op": moved}
    result.update(stats)
    result["gbs"] = round(moved / (stats["median_ms"] / 1000.0) / 1e9, 3)
    result["gbs_best"] = round(moved / (stats["min_ms"] / 1000.0) / 1e9, 3)
    return result


def run_bench(profile: str = "quick", *, gpus: list[dict[str, Any]] | None = None, backend: Any = None,
              backend_reason: str | None = None,
              sampler_factory: Callable[[int, float], Any] | None = None,
              nccl: Callable[[int, dict[str, Any]], dict[str, Any]] | None = None,
              dcgm: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
              precisions: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Run the benchmarks of ``profile`` (none | quick | full) and return the bench document.

    ``gpus``: the probe's GPU list (maps CUDA devices to NVML index / UUID). ``backend``: a CUDA backend object
    (default: detected; tests inject one). ``sampler_factory(nvml_index, interval_s)`` -> object with start()/stop()
    (default NvmlSampler). ``nccl`` / ``dcgm``: replace the external-tool runners.
    """
    started = time.time()
    doc: dict[str, Any] = {
        "schema_version": BENCH_SCHEMA_VERSION, "profile": profile, "status": "skipped", "reason": None,
        "started": _nvml.utc_timestamp(started), "duration_s": None, "backend": None, "gpus": [],
        "nccl_all_reduce": None, "dcgm_diag": None,
    }
    if profile == "none":
        doc["reason"] = "bench profile none"
        doc["duration_s"] = 0.0
        return doc
    if profile not in PROFILES:
        raise ValueError(f"unknown bench profile {profile!r}; known: none, {', '.join(PROFILES)}")
    prof = PROFILES[profile]
    if backend is None and backend_reason is None:
        backend, backend_reason = detect_backend()
    sampler_factory = sampler_factory or (lambda index, interval: NvmlSampler(index, interval))
    ran, failed = 0, 0
    devices: list[dict[str, Any]] = []
    if backend is None:
        doc["reason"] = backend_reason or "no CUDA backend"
    else:
        doc["backend"] = {"name": backend.name, "version": backend.version, "cuda_version": backend.cuda_version}
        devices = backend.devices()
        for dev in devices:
            nvml_index = _match_nvml_index(dev, gpus)
            probe_gpu = next((g for g in gpus or [] if g.get("index") == nvml_index), {})
            entry: dict[str, Any] = {
                "index": nvml_index, "cuda_device": dev["index"], "uuid": dev.get("uuid") or probe_gpu.get("uuid"),
                "name": dev.get("name") or probe_gpu.get("name"), "matmul": {},
            }
            sampler = sampler_factory(nvml_index, prof["sample_interval_s"]).start()
            for precision in precisions or prof["precisions"]:
                entry["matmul"][precision] = _bench_matmul(backend, dev["index"], precision, prof)
            entry["memory_bandwidth"] = _bench_copy(backend, dev["index"], "d2d", prof["memory_bytes"], prof)
            entry["host_to_device"] = _bench_copy(backend, dev["index"], "h2d", prof["transfer_bytes"], prof)
            entry["device_to_host"] = _bench_copy(backend, dev["index"], "d2h", prof["transfer_bytes"], prof)
            entry["during_run"] = sampler.stop()
            for item in [*entry["matmul"].values(), entry["memory_bandwidth"], entry["host_to_device"],
                         entry["device_to_host"]]:
                ran += item["status"] == "ok"
                failed += item["status"] == "error"
            doc["gpus"].append(entry)
    n_gpus = len(devices) if devices else len([g for g in gpus or [] if g.get("status") == "ok"])
    doc["nccl_all_reduce"] = (nccl or (lambda n, p: run_nccl_all_reduce(n, p)))(n_gpus, prof)
    doc["dcgm_diag"] = (dcgm or (lambda p: run_dcgm_diag(p)))(prof)
    for item in (doc["nccl_all_reduce"], doc["dcgm_diag"]):
        ran += item["status"] == "ok"
        failed += item["status"] == "error"
    if ran and not failed:
        doc["status"] = "ok"
    elif ran:
        doc["status"] = "partial"
    elif failed:
        doc["status"] = "error"
    else:
        doc["status"] = "skipped"
        doc["reason"] = doc["reason"] or "nothing could run"
    doc["duration_s"] = round(time.time() - started, 3)
    return doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench", description="gpufleet node benchmarks: prints one JSON document")
    parser.add_argument("--profile", choices=("none", "quick", "full"), default="quick")
    parser.add_argument("--precisions", default=None, help="comma-separated subset of " + ",".join(PRECISIONS))
    parser.add_argument("--indent", type=int, default=None)
    args = parser.parse_args(argv)
    precisions = tuple(p for p in args.precisions.split(",") if p) if args.precisions else None
    gpus = _nvml.collect_nvml()["gpus"]
    doc = run_bench(args.profile, gpus=gpus, precisions=precisions)
    sys.stdout.write(json.dumps(doc, indent=args.indent) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
