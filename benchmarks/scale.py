"""The no-op converge at fleet scale, through pyinfra's ``@fake`` connector (needs root once, to record):

    .venv/bin/python benchmarks/scale.py [--hosts 100,300,1000] [--shards N] [--record]

1. Record (once; cached in build/scale-recording.json; redone with ``--record``, or when the read-ahead command or
   the code of gpufleet's facts and operations changed): a few simulated hosts are brought up with a preinstalled
   driver and converged with deploys/gpu_node.py, then run again (a no-op: gpufleet learns
   which facts a converged host needs, see gpufleet/_pyinfra/_memo.py); then a further no-op run records every
   command the hosts answer and the real answer (benchmarks/_record_noop.py), and the reads it read ahead. The
   simulated fleet is brought down.
2. For each fleet size: an inventory of that many ``@fake`` hosts, each answering as one of the recorded hosts
   (round robin; its ``fake_responses`` are the recorded answers, ``fake_delay`` 0) with that host's settings and
   its remembered reads. ``pyinfra -y INVENTORY deploys/gpu_node.py`` must change nothing; its wall time and the
   pyinfra process's CPU (user + system) per host are reported.
3. The floor (what the target is judged by): a plain pyinfra deploy with the same number of operations per host
   as gpufleet's no-op AND the same number of fact reads (gpufleet's distinct fact reads per host; the plain
   operations read the File fact of absent files and change nothing), on the same fake hosts. For reference, the
   same number of operations reading one fact each.
4. Cores: pyinfra runs one process on one core. With ``--shards N`` (default: this machine's CPU count, when > 1)
   the largest fleet is also split into N inventories run by N pyinfra processes at once; wall time and speed-up
   are reported.

The pyinfra processes run with bytecode caching on (``PYTHONDONTWRITEBYTECODE`` removed), as an installed package
runs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote, unquote

os.environ.setdefault("GPUFLEET_SIM_DIR", "/tmp/gpufleet-bench-sim")
os.environ.setdefault("GPUFLEET_SIM_NET", "10.77.8")

REPO = Path(__file__).resolve().parents[1]
PYINFRA = str(Path(sys.executable).with_name("pyinfra"))
RECORDING = REPO / "build" / "scale-recording.json"
PROFILES = ["h100-sxm-8", "a100-40gb-1", "rtx4090-1"]
NOT_SETTINGS = ("ssh_",)  # host data that belongs to the real connection, not to the fake host


def _pyinfra(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return subprocess.run([PYINFRA, "-y", *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, env={**environ, **(env or {})})


def _learned(cache: Path) -> dict[str, list]:
    """The reads remembered per inventory name (gpufleet._pyinfra._memo: files ``reads/NAME@ADDRESS.json``)."""
    found = {}
    for path in (cache / "reads").glob("*.json"):
        found[unquote(path.stem).split("@", 1)[0]] = json.loads(path.read_text())
    return found


def seed_learned(cache: Path, recorded: dict, names: list[str]) -> None:
    """Give each fake host the remembered reads of the recorded host it answers as (its first run then reads ahead
    exactly what the recorded run did)."""
    sources = sorted(recorded)
    (cache / "reads").mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(names):
        (cache / "reads" / f"{quote('@fake/' + name, safe='')}.json").write_text(
            json.dumps(recorded[sources[i % len(sources)]]["learned"]))


def record(path: Path) -> None:
    from gpufleet.sim import hosts  # noqa: PLC0415 - only the recording needs the simulator

    with tempfile.TemporaryDirectory() as tmp:
        inventory = Path(tmp) / "inventory.py"
        responses = Path(tmp) / "responses.json"
        cache = {"GPUFLEET_CACHE_DIR": str(Path(tmp) / "cache")}
        fleet = hosts.up(len(PROFILES), PROFILES, driver="preinstalled", inventory=inventory, force=True,
                         log=lambda *_: None)
        try:
            for _ in range(3):  # converge, then no-ops: the last remembers what a converged host's run reads
                first = _pyinfra(str(inventory), "deploys/gpu_node.py", env=cache)
                if first.returncode != 0:
                    raise SystemExit(f"converging the simulated hosts failed:\n{first.stdout[-3000:]}")
            learned = _learned(Path(cache["GPUFLEET_CACHE_DIR"]))
            noop = _pyinfra(str(inventory), "benchmarks/_record_noop.py",
                            env={**cache, "GPUFLEET_RECORD_OUT": str(responses)})
            if noop.returncode != 0 or _totals(noop.stdout)["success"] != "-":
                raise SystemExit(f"the recorded run was not a no-op:\n{noop.stdout[-3000:]}")
            answers = json.loads(responses.read_text())
            data = {h.name: {k: v for k, v in hosts.inventory_host_data(fleet, h).items()
                             if not k.startswith(NOT_SETTINGS)} for h in fleet.hosts}
            profiles = {h.name: h.profile for h in fleet.hosts}
        finally:
            hosts.down(log=lambda *_: None)
    path.parent.mkdir(parents=True, exist_ok=True)
    recording = {name: {"profile": profiles[name], "data": data[name], "learned": learned.get(name, []),
                        # longest first: @fake matches substrings, first match wins
                        "responses": dict(sorted(answers[name].items(), key=lambda kv: -len(kv[0])))}
                 for name in sorted(answers)}
    path.write_text(json.dumps({"read_ahead": _read_ahead_shape(), "hosts": recording}, indent=1))


def _read_ahead_shape() -> str:
    """The read-ahead command's shape and a digest of the code that writes the remote commands (facts, operations):
    a recording made with other commands would not be answered."""
    import hashlib  # noqa: PLC0415

    from gpufleet._pyinfra._memo import read_ahead_script  # noqa: PLC0415

    digest = hashlib.sha1()
    for path in sorted([*REPO.glob("gpufleet/facts/*.py"), *REPO.glob("gpufleet/operations/*.py")]):
        digest.update(path.read_bytes())
    return f"{read_ahead_script(['COMMAND'])}\n# commands: {digest.hexdigest()}"


def _stale(path: Path) -> bool:
    try:
        return json.loads(path.read_text()).get("read_ahead") != _read_ahead_shape()
    except (ValueError, AttributeError):
        return True


def _totals(output: str) -> dict[str, str]:
    for line in output.splitlines():
        if "Grand total" in line:
            hosts, success, error, no_change = line.split("Grand total")[1].split()[:4]
            return {"hosts": hosts, "success": success, "error": error, "no_change": no_change}
    raise SystemExit(f"no result line in pyinfra's output:\n{output[-3000:]}")


def write_inventory(path: Path, recording_path: Path, names: list[str]) -> None:
    """An inventory of fake hosts ``names``, answering round robin as the recorded hosts."""
    path.write_text(
        "import json\n"
        f"_RECORDED = json.load(open({str(recording_path)!r}))['hosts']\n"
        "_SOURCES = sorted(_RECORDED)\n"
        "_FAKE = {'fake_delay': 0, 'fake_delay_jitter': 0}\n"
        f"_NAMES = {names!r}\n"
        "fleet = [(f'@fake/{name}', {**_RECORDED[_SOURCES[i % len(_SOURCES)]]['data'], **_FAKE,\n"
        "          'fake_responses': _RECORDED[_SOURCES[i % len(_SOURCES)]]['responses']})\n"
        "         for i, name in enumerate(_NAMES)]\n"
    )


def timed(*args: str, env: dict | None = None) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds of the pyinfra process, output)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    result = _pyinfra(*args, env=env)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise SystemExit(f"pyinfra {' '.join(args)} failed:\n{result.stdout[-3000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), result.stdout


def noop(inventory: Path, deploy: str, count: int, env: dict | None = None) -> tuple[float, float, int]:
    """(wall, CPU, operations per host, rounded: hosts of other profiles run other stages) of a run that must
    change nothing on ``count`` hosts."""
    wall, cpu, out = timed(str(inventory), deploy, env=env)
    totals = _totals(out)
    # the result line sums over operations: "hosts" and "no change" are operations x hosts
    if totals["success"] != "-" or totals["error"] != "-" or totals["hosts"] != totals["no_change"] \
            or not int(totals["no_change"]):
        raise SystemExit(f"{deploy} on {count} fake hosts was not a clean no-op: {totals}\n{out[-3000:]}")
    return wall, cpu, round(int(totals["no_change"]) / count)


def sharded(tmp: Path, names: list[str], shards: int, env: dict, recorded: dict) -> tuple[float, float]:
    """(wall, total CPU) of the fleet split into ``shards`` inventories run by as many pyinfra processes."""
    parts = [names[i::shards] for i in range(shards)]
    inventories = []
    for i, part in enumerate(parts):
        # each shard's hosts answer round robin within the shard: their remembered reads follow the same mapping
        seed_learned(Path(env["GPUFLEET_CACHE_DIR"]), recorded, part)
        inventories.append(tmp / f"shard{i}.py")
        write_inventory(inventories[-1], RECORDING, part)
    start = time.monotonic()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with ThreadPoolExecutor(shards) as pool:
        results = list(pool.map(lambda pair: noop(pair[0], "deploys/gpu_node.py", len(pair[1]), env=env),
                                zip(inventories, parts, strict=True)))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    del results
    return time.monotonic() - start, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", default="100,300,1000", help="fleet sizes, comma-separated")
    parser.add_argument("--shards", type=int, default=os.cpu_count() or 1,
                        help="processes for the sharded run of the largest fleet (1: none)")
    parser.add_argument("--record", action="store_true", help="record the answers again (needs root)")
    args = parser.parse_args()
    if args.record or not RECORDING.exists() or _stale(RECORDING):
        record(RECORDING)
    recorded = json.loads(RECORDING.read_text())["hosts"]
    sizes = [int(n) for n in args.hosts.split(",")]
    shown = [f"{name} ({rec['profile']}, {len(rec['responses'])} remote commands, {len(rec['learned'])} fact reads)"
             for name, rec in recorded.items()]
    print(f"recorded hosts: {', '.join(shown)}")
    print(f"machine: {os.cpu_count()} CPU(s); pyinfra: one process")
    # distinct fact reads per host: the remembered reads (read ahead), else (no read-ahead) the commands answered
    reads = round(sum(len(r["learned"]) or len(r["responses"]) for r in recorded.values()) / len(recorded))
    print("floor: plain pyinfra, as many operations per host as gpufleet's no-op and together as many fact reads "
          f"({reads}, gpufleet's distinct fact reads per host); ref: as many operations, one fact read each")
    print(f"{'hosts':>6}  {'gpufleet wall':>13}  {'CPU/host':>9}  {'ops/host':>8}  | floor: {'wall':>7}  "
          f"{'CPU/host':>9}  {'ratio':>5}  | ref: {'wall':>7}  {'CPU/host':>9}  {'ratio':>5}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        cache = tmp / "cache"
        env = {"GPUFLEET_CACHE_DIR": str(cache)}
        for count in sizes:
            names = [f"node{i:05d}" for i in range(count)]
            seed_learned(cache, recorded, names)
            inventory = tmp / f"fleet{count}.py"
            write_inventory(inventory, RECORDING, names)
            wall, cpu, ops = noop(inventory, "deploys/gpu_node.py", count, env=env)
            floor_wall, floor_cpu, floor_ops = noop(inventory, "benchmarks/_plain_noop.py", count,
                                                    env={"GPUFLEET_PLAIN_OPS": str(ops),
                                                         "GPUFLEET_PLAIN_READS": str(reads)})
            assert floor_ops == ops, (floor_ops, ops)
            ref_wall, ref_cpu, _ = noop(inventory, "benchmarks/_plain_noop.py", count,
                                        env={"GPUFLEET_PLAIN_OPS": str(ops)})
            rows.append((count, wall, cpu / count, ops, floor_wall, floor_cpu / count))
            print(f"{count:>6}  {wall:>11.2f} s  {cpu / count * 1000:>6.1f} ms  {ops:>8}  | {floor_wall:>13.2f} s  "
                  f"{floor_cpu / count * 1000:>6.1f} ms  {cpu / floor_cpu:>5.2f}  | {ref_wall:>9.2f} s  "
                  f"{ref_cpu / count * 1000:>6.1f} ms  {cpu / ref_cpu:>5.2f}")
        if len(rows) > 1:
            (n0, _, c0, *_), (n1, _, c1, *_) = rows[0], rows[-1]
            print(f"CPU per host from {n0} to {n1} hosts: x{c1 / c0:.2f} (1.00 = linear in hosts)")
        worst = max(row[2] / row[5] for row in rows)
        print(f"target: gpufleet CPU/host <= 1.5 x floor: {'met' if worst <= 1.5 else 'MISSED'} (worst x{worst:.2f})")
        if args.shards > 1:
            count = sizes[-1]
            names = [f"node{i:05d}" for i in range(count)]
            wall1 = rows[-1][1]
            wall, cpu = sharded(tmp, names, args.shards, env, recorded)
            print(f"{count} hosts in {args.shards} shards (parallel pyinfra processes): {wall:.2f} s wall "
                  f"(one process: {wall1:.2f} s, speed-up x{wall1 / wall:.2f}), {cpu / count * 1000:.1f} ms CPU/host")
    return 0


if __name__ == "__main__":
    sys.exit(main())
