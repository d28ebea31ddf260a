"""The no-op converge at fleet scale, through pyinfra's ``@fake`` connector (needs root once, to record):

    .venv/bin/python benchmarks/scale.py [--hosts 100,300,1000] [--shards N] [--apply 1000,3000,10000] [--jobs J]
                                         [--drift 3000] [--rollout 3000] [--repeat R] [--record]

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
5. ``gpufleet apply`` (``--apply 1000,3000,10000``; ``--apply ''``: none): each fleet size run by
   ``gpufleet apply -y --jobs 1`` and ``--jobs J`` (``--jobs``, default this machine's CPU count), each
   ``--repeat`` times (interleaved: a shared machine's noise falls on both): wall, CPU per host (the coordinator
   and its workers, user + system), speed-up, and the controller's peak memory (the resident memory of the
   coordinator and all its workers together, sampled every 0.1 s) per host. Every run must change nothing.
6. The per-host cost of a real SSH connection (recorded with the answers, step 1): a pyinfra run reading one
   trivial fact (``server.Hostname``: connect + one command) on the simulated hosts, each under 8 inventory names
   (24 connections), minus the same run on as many ``@fake`` hosts, per connection (the median of 5). With it and
   the measured per-host CPU of ``gpufleet apply``, a PROJECTION (not a measurement) of a 10,000-host no-op's wall
   time on a 16-core controller.
7. ``gpufleet drift`` (``--drift 3000``: a no-op) and ``gpufleet rollout`` (``--rollout 3000``: a canary and 25 %
   waves, no verify or drain, changing every host's power limit so that its waves run) with ``--jobs 1`` and
   ``--jobs J``, as step 5: wall, CPU per host, memory per host, speed-up.

The pyinfra processes run with bytecode caching on (``PYTHONDONTWRITEBYTECODE`` removed), as an installed package
runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote, unquote

os.environ.setdefault("GPUFLEET_SIM_DIR", "/tmp/gpufleet-bench-sim")
os.environ.setdefault("GPUFLEET_SIM_NET", "10.77.8")

REPO = Path(__file__).resolve().parents[1]
PYINFRA = str(Path(sys.executable).with_name("pyinfra"))
GPUFLEET = str(Path(sys.executable).with_name("gpufleet"))
RECORDING = REPO / "build" / "scale-recording.json"
PROFILES = ["h100-sxm-8", "a100-40gb-1", "rtx4090-1"]
NOT_SETTINGS = ("ssh_",)  # host data that belongs to the real connection, not to the fake host
# what the rollout changes on every fake host (its waves run only where a change is planned): the power limit
# the recorded hosts do not have. A fake host keeps no state, so every run changes it again.
CHANGED = {"gpufleet_power_limit": "90%"}


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
    from gpufleet.config import GPU_EXPORTER_PORT, NODE_EXPORTER_PORT
    from gpufleet.sim import hosts  # only the recording needs the simulator

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
            ssh_cpu = ssh_cost({h.name: hosts.inventory_host_data(fleet, h) for h in fleet.hosts}, Path(tmp))
            data = {h.name: {k: v for k, v in hosts.inventory_host_data(fleet, h).items()
                             if not k.startswith(NOT_SETTINGS)} for h in fleet.hosts}
            for h in fleet.hosts:  # the exporters' default listen address is the host's ssh_hostname, which a
                address = hosts.inventory_host_data(fleet, h).get("ssh_hostname")  # fake host has not: given
                if address:
                    data[h.name].setdefault("gpufleet_exporters_gpu_listen", f"{address}:{GPU_EXPORTER_PORT}")
                    data[h.name].setdefault("gpufleet_exporters_node_listen", f"{address}:{NODE_EXPORTER_PORT}")
            profiles = {h.name: h.profile for h in fleet.hosts}
        finally:
            hosts.down(log=lambda *_: None)
    path.parent.mkdir(parents=True, exist_ok=True)
    recording = {name: {"profile": profiles[name], "data": data[name], "learned": learned.get(name, []),
                        # longest first: @fake matches substrings, first match wins
                        "responses": dict(sorted(answers[name].items(), key=lambda kv: -len(kv[0])))}
                 for name in sorted(answers)}
    path.write_text(json.dumps({"read_ahead": _read_ahead_shape(), "hosts": recording,
                                "ssh_cpu_per_host": ssh_cpu}, indent=1))


def ssh_cost(reached: dict[str, dict], tmp: Path, runs: int = 5, aliases: int = 8) -> float:
    """Controller CPU seconds per host of a real SSH connection and one command: ``pyinfra INVENTORY fact
    server.Hostname`` on the simulated hosts (``reached``: name -> their inventory data), each under ``aliases``
    inventory names (so many connections per run that pyinfra's start-up, the same in both, is no longer most of
    the figure; fewer than sshd's 10 unauthenticated connections at once per host), minus the same on as many
    ``@fake`` hosts (pyinfra's start-up and the fact's own cost), per connection; the median of ``runs``. Both
    inventories are plain data (neither imports anything the other does not)."""
    names = list(reached)
    real = tmp / "ssh_aliases.py"
    real.write_text(f"hosts = {[(f'{n}-c{k}', data) for n, data in reached.items() for k in range(aliases)]!r}\n")
    fake = tmp / "fake_floor.py"
    floor_hosts = [(f"@fake/{n}-c{k}", {"fake_delay": 0, "fake_delay_jitter": 0})
                   for n in names for k in range(aliases)]
    fake.write_text(f"hosts = {floor_hosts!r}\n")
    connections = len(names) * aliases
    costs = []
    for _ in range(runs):
        on_hosts = timed(str(real), "fact", "server.Hostname")[1]
        floor = timed(str(fake), "fact", "server.Hostname")[1]
        costs.append((on_hosts - floor) / connections)
    return sorted(costs)[len(costs) // 2]


def _read_ahead_shape() -> str:
    """The read-ahead command's shape and a digest of the code that writes the remote commands (facts, operations):
    a recording made with other commands would not be answered."""
    import hashlib

    from gpufleet._pyinfra._memo import read_ahead_script

    digest = hashlib.sha1()
    for path in sorted([*REPO.glob("gpufleet/facts/*.py"), *REPO.glob("gpufleet/operations/*.py")]):
        digest.update(path.read_bytes())
    return f"{read_ahead_script(['COMMAND'])}\n# commands: {digest.hexdigest()}"


def stale(path: Path) -> bool:
    """No recording at ``path``, or one made with other remote commands than today's."""
    try:
        return json.loads(path.read_text()).get("read_ahead") != _read_ahead_shape()
    except (OSError, ValueError, AttributeError):
        return True


def _totals(output: str) -> dict[str, str]:
    for line in output.splitlines():
        if "Grand total" in line:
            hosts, success, error, no_change = line.split("Grand total")[1].split()[:4]
            return {"hosts": hosts, "success": success, "error": error, "no_change": no_change}
    raise SystemExit(f"no result line in pyinfra's output:\n{output[-3000:]}")


def write_inventory(path: Path, recording_path: Path, names: list[str], settings: dict | None = None) -> None:
    """An inventory of fake hosts ``names``, answering round robin as the recorded hosts; ``settings`` on every
    host over the recorded host's."""
    path.write_text(
        "import json\n"
        f"_RECORDED = json.load(open({str(recording_path)!r}))['hosts']\n"
        "_SOURCES = sorted(_RECORDED)\n"
        f"_FAKE = {{'fake_delay': 0, 'fake_delay_jitter': 0, **{settings or {}!r}}}\n"
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
    return wall, cpu, _noop_ops(out, deploy, count)


def _noop_ops(out: str, deploy: str, count: int) -> int:
    totals = _totals(out)
    # the result line sums over operations: "hosts" and "no change" are operations x hosts
    if totals["success"] != "-" or totals["error"] != "-" or totals["hosts"] != totals["no_change"] \
            or not int(totals["no_change"]):
        raise SystemExit(f"{deploy} on {count} fake hosts was not a clean no-op: {totals}\n{out[-3000:]}")
    return round(int(totals["no_change"]) / count)


def _tree_rss(pid: int) -> int:
    """Resident memory (bytes) of process ``pid`` and all its descendants, from /proc."""
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        try:
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
            for task in Path(f"/proc/{current}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue
    return total


def command_argv(kind: str, inventory: Path, jobs: int, out: Path) -> list[str]:
    """The fleet command ``kind`` (apply, drift, rollout) over ``inventory`` with ``--jobs JOBS``. The rollout: a
    canary and 25 % waves, no verify or drain (their waits are not the controller's work), its state and reports
    in ``out``."""
    common = ["--jobs", str(jobs), str(inventory), "deploys/gpu_node.py"]
    if kind == "apply":
        return [GPUFLEET, "apply", "-y", *common]
    if kind == "drift":
        return [GPUFLEET, "drift", *common]
    return [GPUFLEET, "rollout", "-y", *common, "--canary", "1", "--waves", "25%", "--verify", "none", "--drain",
            "none", "--out", str(out)]


def _check_noop(kind: str, out: str, count: int) -> None:
    """The run did what it should, else the benchmark stops: apply and drift changed / found nothing (pyinfra's
    result line; no host differs), the rollout changed every host (its waves ran: see CHANGED)."""
    if kind == "apply":
        _noop_ops(out, "gpufleet apply", count)
    elif kind == "drift" and not re.search(rf"^gpufleet drift: 0 of {count} host\(s\) differ from the "
                                           r"configuration$", out, re.M):
        raise SystemExit(f"gpufleet drift found drift on the fake hosts:\n{out[-3000:]}")
    elif kind == "rollout" and not re.search(rf"^changed \({count}\)", out, re.M):
        raise SystemExit(f"gpufleet rollout did not change every fake host:\n{out[-3000:]}")


def fleet_command(kind: str, inventory: Path, count: int, jobs: int, env: dict) -> tuple[float, float, int, float]:
    """(wall, CPU of the command and its workers, peak resident memory of them all together, CPU of the busiest
    worker plus the coordinator's: the wall time on free cores when CPU-bound; ``gpufleet apply`` reports its
    workers' CPU, the others do not: their CPU in all) of the fleet command ``kind`` with ``--jobs JOBS`` over
    ``inventory``, which must do what :func:`_check_noop` says (apply, drift: nothing; rollout: every host)."""
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with tempfile.TemporaryDirectory() as out_dir:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.monotonic()
        process = subprocess.Popen(command_argv(kind, inventory, jobs, Path(out_dir)), cwd=REPO,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   env={**environ, **env})
        peak = [0]

        def sample() -> None:
            while process.poll() is None:
                peak[0] = max(peak[0], _tree_rss(process.pid))
                time.sleep(0.1)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        out = process.communicate()[0]
        wall = time.monotonic() - start
        sampler.join()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if process.returncode != 0:
        raise SystemExit(f"gpufleet {kind} --jobs {jobs} on {count} hosts failed:\n{out[-3000:]}")
    _check_noop(kind, out, count)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    workers = re.search(r"worker CPU ([\d.]+) s at most, ([\d.]+) s in all", out)
    # the longest chain of CPU work: the busiest worker, and the coordinator's own (all but the workers')
    critical = float(workers[1]) + cpu - float(workers[2]) if workers else cpu
    return wall, cpu, peak[0], critical


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def fake_fleet(tmp: Path, count: int, env: dict, recorded: dict, settings: dict | None = None) -> Path:
    """An inventory of ``count`` fake hosts (answering as the recorded ones), their remembered reads seeded."""
    names = [f"node{i:05d}" for i in range(count)]
    seed_learned(Path(env["GPUFLEET_CACHE_DIR"]), recorded, names)
    inventory = tmp / f"fake{count}.py"
    write_inventory(inventory, RECORDING, names, settings)
    return inventory


def measure_jobs(kind: str, tmp: Path, sizes: list[int], jobs: int, repeat: int, env: dict,
                 recorded: dict) -> dict:
    """``gpufleet KIND`` (apply, drift: a no-op; rollout: a change on every host) at each size with --jobs 1 and
    --jobs ``jobs``, ``repeat`` times each (interleaved); every run printed. Returns {size: {jobs: [(wall, CPU per
    host, memory per host, critical CPU), ...]}}."""
    what = f"every host's {', '.join(CHANGED)} changed" if kind == "rollout" else "no-op"
    print(f"\ngpufleet {kind} ({what}), --jobs 1 and --jobs {jobs}; CPU: the command + its workers, user + system; "
          "memory: peak resident memory of the command and all its workers together")
    if kind == "apply":
        print("speed-up: wall of --jobs 1 / wall; on free cores: CPU of --jobs 1 / (CPU of the busiest worker + the "
              "coordinator's), what the speed-up is where every worker has a core of its own (this machine is "
              "shared)")
    print(f"{'hosts':>6}  {'jobs':>4}  {'run':>3}  {'wall':>8}  {'CPU/host':>9}  {'mem/host':>9}  {'speed-up':>8}  "
          f"{'on free cores' if kind == 'apply' else '':>13}")
    found: dict[int, dict[int, list]] = {}
    for count in sizes:
        runs = found[count] = {1: [], jobs: []}
        for run in range(1, repeat + 1):
            for j in dict.fromkeys((1, jobs)):
                # seeded again for every run: a run that changed hosts remembers other reads than the recording's
                inventory = fake_fleet(tmp, count, env, recorded, CHANGED if kind == "rollout" else None)
                wall, cpu, memory, critical = fleet_command(kind, inventory, count, j, env)
                runs[j].append((wall, cpu / count, memory / count, critical))
                speedup = f"x{runs[1][-1][0] / wall:.2f}" if j != 1 else ""
                free = f"x{runs[1][-1][1] * count / critical:.2f}" if j != 1 and kind == "apply" else ""
                print(f"{count:>6}  {j:>4}  {run:>3}  {wall:>6.2f} s  {cpu / count * 1000:>6.1f} ms  "
                      f"{memory / count / 1024:>6.1f} KiB  {speedup:>8}  {free:>13}", flush=True)
    return found


def report_jobs(kind: str, found: dict, jobs: int) -> None:
    """The medians of each size: how much faster ``--jobs JOBS`` is and what its CPU per host costs."""
    if kind == "drift":
        print("(drift --jobs 1 is one pyinfra --dry process after an inventory read of its own; --jobs N runs gpufleet "
              "apply's workers, which read the inventory once each: part of the difference is that path)")
    for count, runs in found.items():
        w1, wj = _median([r[0] for r in runs[1]]), _median([r[0] for r in runs[jobs]])
        c1, cj = _median([r[1] for r in runs[1]]), _median([r[1] for r in runs[jobs]])
        print(f"gpufleet {kind} at {count} @fake hosts (median of {len(runs[1])}): --jobs {jobs} {wj:.1f} s vs "
              f"--jobs 1 {w1:.1f} s: x{w1 / wj:.2f} faster; CPU/host {cj * 1000:.1f} vs {c1 * 1000:.1f} ms "
              f"(x{cj / c1:.2f})")


def report_apply(found: dict, jobs: int, ssh_cpu: float | None) -> None:
    """Medians per size, the targets, and the projection of a 10,000-host no-op on 16 cores."""
    print(f"\nmedians: {'hosts':>6}  {'wall j1':>8}  {f'wall j{jobs}':>8}  {'speed-up':>8}  {'CPU/host j1':>11}  "
          f"{f'CPU/host j{jobs}':>11}  {'ratio':>5}  {f'mem/host j{jobs}':>12}")
    rows = {}
    for count, runs in found.items():
        w1, wj = _median([r[0] for r in runs[1]]), _median([r[0] for r in runs[jobs]])
        c1, cj = _median([r[1] for r in runs[1]]), _median([r[1] for r in runs[jobs]])
        mj = _median([r[2] for r in runs[jobs]])
        free = c1 * count / _median([r[3] for r in runs[jobs]])
        rows[count] = (w1, wj, c1, cj, mj, free)
        print(f"         {count:>6}  {w1:>6.2f} s  {wj:>6.2f} s  {w1 / wj:>7.2f}x  {c1 * 1000:>8.1f} ms  "
              f"{cj * 1000:>8.1f} ms  {cj / c1:>5.2f}  {mj / 1024:>8.1f} KiB  (on free cores x{free:.2f})")
    sizes = sorted(rows)
    if len(sizes) > 1:
        first, last = rows[sizes[0]], rows[sizes[-1]]
        print(f"CPU per host from {sizes[0]} to {sizes[-1]} hosts: --jobs 1 x{last[2] / first[2]:.2f}, --jobs {jobs} "
              f"x{last[3] / first[3]:.2f} (1.00 = linear in hosts)")
    if 3000 in rows and jobs > 1:
        w1, wj, c1, cj, _, free = rows[3000]
        print(f"target at 3000 hosts: --jobs {jobs} >= 1.7x faster than --jobs 1: "
              f"{'met' if w1 / wj >= 1.7 else 'MISSED'} (x{w1 / wj:.2f} wall; x{free:.2f} on free cores); CPU per "
              f"host with workers <= 1.2x one process's: {'met' if cj / c1 <= 1.2 else 'MISSED'} (x{cj / c1:.2f})")
    if jobs > 1:
        count = sizes[-1]
        _, _, c1, cj, _, _ = rows[count]
        measured = (cj - c1) / (jobs - 1)  # per host and extra worker: each loads the whole inventory
        duplicated = max(0.0, measured)
        if measured < 0:
            print(f"what each further worker adds per host measured {measured * 1000:.2f} ms (the workers used less "
                  "CPU per host than one process: noise): counted as 0, so the projection below is a lower bound")
        ssh = ssh_cpu or 0.0
        if ssh < 0:  # 3 hosts against pyinfra's start-up: a cost below the noise of this measurement
            print(f"SSH connection CPU/host measured {ssh * 1000:.1f} ms (below this measurement's noise): counted as "
                  "0 ms in the projection")
            ssh = 0.0
        cores, fleet = 16, 10_000
        wall = fleet * (c1 + ssh) / cores + fleet * duplicated
        print(f"PROJECTION (not measured): a {fleet}-host no-op over SSH on a {cores}-core controller with --jobs "
              f"{cores}: ~{wall:.0f} s wall ({wall / 60:.1f} min) = {fleet} x ({c1 * 1000:.1f} ms no-op CPU/host at "
              f"{count} @fake hosts, --jobs 1 + {ssh * 1000:.1f} ms SSH connection CPU/host measured on simulated "
              f"hosts) / {cores} cores + {fleet} x {duplicated * 1000:.2f} ms (what each further worker adds per "
              f"host, from --jobs {jobs} vs 1: its own inventory load, run in parallel). Assumes per-host costs "
              f"stay linear and the {cores} cores are free; one process today: ~{fleet * (c1 + ssh) / 60:.1f} min.")


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
    parser.add_argument("--apply", default="1000,3000,10000",
                        help="fleet sizes for gpufleet apply, comma-separated ('': none)")
    parser.add_argument("--drift", default="3000", help="fleet sizes for gpufleet drift, comma-separated ('': none)")
    parser.add_argument("--rollout", default="3000",
                        help="fleet sizes for gpufleet rollout, comma-separated ('': none)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="--jobs of gpufleet apply, drift and rollout besides 1")
    parser.add_argument("--repeat", type=int, default=2, help="runs of gpufleet apply per size and --jobs")
    parser.add_argument("--record", action="store_true", help="record the answers again (needs root)")
    args = parser.parse_args()
    if args.record or stale(RECORDING):
        record(RECORDING)
    recording = json.loads(RECORDING.read_text())
    recorded = recording["hosts"]
    ssh_cpu = recording.get("ssh_cpu_per_host")
    if ssh_cpu is not None:
        print(f"SSH connection + one command, controller CPU per host (simulated hosts, beyond @fake): "
              f"{ssh_cpu * 1000:.1f} ms")
    sizes = [int(n) for n in args.hosts.split(",") if n]
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
        if rows:
            worst = max(row[2] / row[5] for row in rows)
            print(f"target: gpufleet CPU/host <= 1.5 x floor: {'met' if worst <= 1.5 else 'MISSED'} "
                  f"(worst x{worst:.2f})")
        if args.shards > 1 and rows:
            count = sizes[-1]
            names = [f"node{i:05d}" for i in range(count)]
            wall1 = rows[-1][1]
            wall, cpu = sharded(tmp, names, args.shards, env, recorded)
            print(f"{count} hosts in {args.shards} shards (parallel pyinfra processes): {wall:.2f} s wall "
                  f"(one process: {wall1:.2f} s, speed-up x{wall1 / wall:.2f}), {cpu / count * 1000:.1f} ms CPU/host")
        apply_sizes = [int(n) for n in args.apply.split(",") if n]
        if apply_sizes:
            found = measure_jobs("apply", tmp, apply_sizes, args.jobs, args.repeat, env, recorded)
            report_apply(found, args.jobs, ssh_cpu)
        for kind in ("drift", "rollout"):
            sizes = [int(n) for n in getattr(args, kind).split(",") if n]
            if sizes:
                report_jobs(kind, measure_jobs(kind, tmp, sizes, args.jobs, args.repeat, env, recorded), args.jobs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
