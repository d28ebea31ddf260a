"""
Monitoring exporters of a GPU node: node_exporter (the distribution's package, with the textfile collector
directory verify writes into) and one GPU exporter: NVIDIA's dcgm-exporter (with DCGM) or gpufleet's own
NVML exporter. Both GPU exporters answer in dcgm-exporter's metric names and labels.
"""

from __future__ import annotations

import posixpath
import shlex

from pyinfra import host
from pyinfra.api import StringCommand, operation

from gpufleet.config import DEFAULT_TEXTFILE_DIR
from gpufleet.exporter import BUNDLE_NAME, bundle
from gpufleet.facts.system import Distribution
from gpufleet.plan.dcgm_counters import exporter_release, known_fields

from . import _packaging as pkg
from . import apt_lists, dcgm_package
from .dcgm_package import DCGM_PACKAGES, DCGM_PROFILING_PACKAGE
from .errors import refuse, report
from .managed_files import SETTINGS_DIR, put_bytes, put_file, remove_file, render
from .reads import get_state, read_together
from .units import UNIT_DIR, is_running, systemctl

NODE_EXPORTER_PACKAGE = "prometheus-node-exporter"  # Debian / Ubuntu
NODE_EXPORTER_UNIT = "prometheus-node-exporter.service"
NODE_EXPORTER_DEFAULTS = "/etc/default/prometheus-node-exporter"
# exporter-toolkit's web configuration (basic auth users' bcrypt hashes, TLS) of each exporter: never world-readable.
# node_exporter runs as Debian's User=prometheus (0640 root:prometheus); dcgm-exporter as NVIDIA's unit's User=root;
# gpufleet's exporter as a DynamicUser, which gets its copy through systemd's LoadCredential= (0600 root:root here).
NODE_EXPORTER_WEB_CONFIG = "/etc/prometheus/node-exporter-web-config.yml"
NODE_EXPORTER_GROUP = "prometheus"
NVML_WEB_CONFIG = "/etc/gpufleet/gpu-exporter-web-config.yml"
NVML_WEB_CREDENTIAL = "web-config.yml"
DCGM_WEB_CONFIG = "/etc/dcgm-exporter/web-config.yml"

NVML_UNIT = "gpufleet-exporter.service"
NVML_UNIT_PATH = posixpath.join(UNIT_DIR, NVML_UNIT)
# systemd copies the exporter's certificate and key for its dynamic user at start (LoadCredential=), so a renewed
# certificate (the fleet CA's yearly one, or a site's tool) is served only after a restart; a path unit watching
# both files and their directories does it (systemd.path(5): PathChanged=, Unit=;
# tests/reference/upstream/debian/bookworm/systemd/)
CERTIFICATE_WATCH_PATH_UNIT = "gpufleet-exporter-certificate.path"
CERTIFICATE_WATCH_SERVICE = "gpufleet-exporter-certificate.service"
CERTIFICATE_WATCH_PATHS = (posixpath.join(UNIT_DIR, CERTIFICATE_WATCH_PATH_UNIT),
                           posixpath.join(UNIT_DIR, CERTIFICATE_WATCH_SERVICE))
SYSTEMCTL = "/bin/systemctl"  # Debian 12's systemd package; /usr/bin/systemctl where /usr is merged (Debian 13,
# RHEL 8+), reached through the /bin symlink those systems have
SLEEP = "/bin/sleep"  # Debian 12's coreutils (the same /bin symlink elsewhere)
CERTIFICATE_SETTLE_S = 5
NVML_BUNDLE_DIR = "/opt/gpufleet/exporter"
NVML_BUNDLE = posixpath.join(NVML_BUNDLE_DIR, BUNDLE_NAME)
NVML_SETTINGS = posixpath.join(SETTINGS_DIR, "exporter.json")  # written by earlier versions: removed
DESIRED_TEXTFILE = "gpufleet_desired.prom"
PYTHON = "/usr/bin/python3"

# NVIDIA's units: DCGM's (nv-hostengine, listening on 127.0.0.1:5555) and the exporter package's
# (packaging/config-files/systemd/nvidia-dcgm-exporter.service of NVIDIA/dcgm-exporter).
DCGM_UNIT = "nvidia-dcgm.service"
DCGM_EXPORTER_UNIT = "nvidia-dcgm-exporter.service"
DCGM_EXPORTER_BINARY = "/usr/bin/dcgm-exporter"
# dcgm-exporter's -r/--remote-hostengine-info: the host engine nvidia-dcgm.service runs (nv-hostengine's default port
# and bind address); without it dcgm-exporter embeds a second host engine.
DCGM_HOSTENGINE = "localhost:5555"
DCGM_COUNTERS = "/etc/dcgm-exporter/gpufleet-counters.csv"
DCGM_DROP_IN = f"/etc/systemd/system/{DCGM_EXPORTER_UNIT}.d/gpufleet.conf"
# written by earlier versions under a unit name NVIDIA's package does not have: removed
OLD_DCGM_DROP_IN = "/etc/systemd/system/dcgm-exporter.service.d/gpufleet.conf"
# the textfile directory is a setting: its default is read together with the other files
read_together(NODE_EXPORTER_UNIT, NVML_UNIT, DCGM_UNIT, DCGM_EXPORTER_UNIT, CERTIFICATE_WATCH_PATH_UNIT,
              files=(NODE_EXPORTER_DEFAULTS, NODE_EXPORTER_WEB_CONFIG, NVML_WEB_CONFIG, DCGM_WEB_CONFIG, NVML_BUNDLE,
                     NVML_SETTINGS, NVML_UNIT_PATH, *CERTIFICATE_WATCH_PATHS, DCGM_COUNTERS, DCGM_DROP_IN,
                     OLD_DCGM_DROP_IN, dcgm_package.EXPORTER_PIN, DEFAULT_TEXTFILE_DIR,
                     posixpath.join(DEFAULT_TEXTFILE_DIR, DESIRED_TEXTFILE)))

# The counters the alerts and dashboards need (dcgm-exporter's default file comments out ECC, Xid counts,
# clock events and NVLink errors). (field, type, help); profiling fields only on GPUs that have them.
HEALTH_COUNTERS = (
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    ("DCGM_FI_DEV_SLOWDOWN_TEMP", "gauge", "Slowdown temperature threshold of the GPU (in C)."),
    ("DCGM_FI_DEV_SHUTDOWN_TEMP", "gauge", "Shutdown temperature threshold of the GPU (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "gauge", "Current power limit (in W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ)."),
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB)."),
    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge", "Current clock event reasons (bitmask)."),
    ("DCGM_FI_DEV_PERSISTENCE_MODE", "gauge", "Persistence mode (1 enabled)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION", "gauge", "Recovery action the driver asks for (nvmlGpuRecoveryAction_t: "
     "0 none; 1 GPU reset; 2 node reboot; 3 drain P2P; 4 drain and reset)."),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total number of single-bit volatile ECC errors."),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors."),
    ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "counter", "Total number of single-bit persistent ECC errors."),
    ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter", "Total number of double-bit persistent ECC errors."),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for correctable errors"),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for uncorrectable errors"),
    ("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "Whether remapping of rows is pending"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
    ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink flow-control CRC errors."),
    ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink data CRC errors."),
    ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink retries."),
    ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink recovery errors."),
    ("DCGM_FI_DEV_MIG_MODE", "gauge", "MIG mode (1 enabled)."),
    ("DCGM_FI_DRIVER_VERSION", "label", "Driver Version"),
)
PROFILING_COUNTERS = (
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_PROF_SM_ACTIVE", "gauge", "The ratio of cycles an SM has at least 1 warp assigned."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", "Ratio of cycles the device memory interface is active."),
)


def counters_csv(profiling: bool, release: tuple[int, int, int] | None = None) -> tuple[str, list[str]]:
    """(dcgm-exporter's counters file (``-f``), the fields left out): the health counters, plus profiling ones on
    datacenter GPUs, those the exporter ``release`` knows (None: all; a name it does not know stops it)."""
    rows = [*HEALTH_COUNTERS, *(PROFILING_COUNTERS if profiling else ())]
    kept, left_out = known_fields([field for field, _, _ in rows], release) if release else ([r[0] for r in rows], [])
    lines = ["# Managed by gpufleet (stage exporters). DCGM field, Prometheus type, help."]
    lines += [f"{field}, {kind}, {text}" for field, kind, text in rows if field in kept]
    return "\n".join(lines) + "\n", left_out


def _label(value) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


DESIRED_METRICS = (
    ("power_limit_w", "gpufleet_gpu_power_limit_desired_watts",
     "Power limit gpufleet's power stage sets on this GPU (in W), from the node plan."),
    ("persistence", "gpufleet_gpu_persistence_desired",
     "1 when gpufleet's persistence stage keeps persistence mode on for this GPU, else 0."),
    ("mig_enabled", "gpufleet_gpu_mig_mode_desired",
     "MIG mode gpufleet's MIG stage sets on this GPU (1 enabled), from the node plan."),
)


def desired_textfile(gpus: list[dict]) -> str:
    """node_exporter textfile of gpufleet's desired GPU settings: one series per GPU and setting the plan
    decides (``None``: not managed, no series), labelled ``gpu``, ``UUID``, ``pci_bus_id`` like the GPU
    exporters' current values (``DCGM_FI_DEV_POWER_MGMT_LIMIT``, ``_PERSISTENCE_MODE``, ``_MIG_MODE``), which
    the alert rules compare them with ``on(host, UUID)``."""
    lines = ["# Managed by gpufleet (stage exporters): desired GPU settings from the node plan."]
    for key, name, help_text in DESIRED_METRICS:
        rows = [g for g in sorted(gpus, key=lambda g: g["index"]) if g.get(key) is not None]
        if not rows:
            continue
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        for g in rows:
            value = g[key]
            value = int(value) if isinstance(value, bool) else value
            lines.append(f'{name}{{gpu="{g["index"]}",UUID="{_label(g["uuid"])}",'
                         f'pci_bus_id="{_label(g["pci_bus_id"])}"}} {value:g}')
    return "\n".join(lines) + "\n"


def node_exporter_defaults(textfile_dir: str, listen: str, web_config: bool = False) -> str:
    args = f"--collector.textfile.directory={textfile_dir} --web.listen-address={listen}"
    if web_config:
        args += f" --web.config.file={NODE_EXPORTER_WEB_CONFIG}"
    return ("# Managed by gpufleet (stage exporters): read by prometheus-node-exporter.service.\n"
            f"ARGS={shlex.quote(args)}\n")


def nvml_unit_text(listen: str, web_config: bool = False, credentials: tuple[tuple[str, str], ...] = ()) -> str:
    """gpufleet's exporter's unit; ``credentials``: (name, path) of more files its dynamic user gets through
    ``LoadCredential=`` (the TLS certificate and key its web configuration names relative to it)."""
    return render("systemd/gpufleet-exporter.service.j2", python=PYTHON, bundle=NVML_BUNDLE, listen=listen,
                  settings_dir=SETTINGS_DIR,
                  web_config=(NVML_WEB_CREDENTIAL, NVML_WEB_CONFIG) if web_config else None,
                  credentials=sorted(credentials))


def certificate_watch_texts(paths: tuple[str, ...]) -> tuple[str, str]:
    """(the path unit, the service it starts): gpufleet's exporter restarted when a file of ``paths`` (its
    certificate and key: validated absolute paths of letters, digits, ``. _ - /``) or its directory changes. The
    directories too: a symlink swapped there (certbot's ``live/``) or a file renamed into place changes the
    directory, while a watch on the file itself follows the old target."""
    watched = [*paths, *dict.fromkeys(posixpath.dirname(path) for path in paths)]
    path_unit = ("# Managed by gpufleet (stage exporters): gpufleet's exporter gets its TLS certificate and key at\n"
                 "# start (LoadCredential=); when either changes (a renewal), it is restarted to serve the new one.\n"
                 "[Unit]\nDescription=Restart gpufleet's GPU exporter when its TLS certificate or key changes\n\n"
                 "[Path]\n" + "".join(f"PathChanged={path}\n" for path in watched)
                 + f"Unit={CERTIFICATE_WATCH_SERVICE}\n\n[Install]\nWantedBy=multi-user.target\n")
    # A renewal is a burst of changes (key, certificate, temporary files, symlinks; a deploy writes the key and the
    # certificate in two operations): one restart after it settles, not one per change, each of which could see a
    # key without its certificate and all of which count against the exporter's start limit (a few restarts in a
    # row leave it failed). No start limit on this oneshot: a refused trigger leaves the path unit watching nothing.
    # A restart that still sees half a renewal fails on the mismatched pair, and the exporter's Restart=on-failure
    # starts it again with both.
    service = ("# Managed by gpufleet (stage exporters): started by "
               f"{CERTIFICATE_WATCH_PATH_UNIT}\n"
               "[Unit]\nDescription=Restart gpufleet's GPU exporter for its changed TLS certificate\n"
               "StartLimitIntervalSec=0\n\n"
               f"[Service]\nType=oneshot\nExecStartPre={SLEEP} {CERTIFICATE_SETTLE_S}\n"
               f"ExecStart={SYSTEMCTL} try-restart {NVML_UNIT}\n")
    return path_unit, service


def _certificate_watch(files: dict, units: dict, paths: tuple[str, ...]):
    """The path unit watching ``paths`` (none: removed) enabled and running."""
    unit = units[CERTIFICATE_WATCH_PATH_UNIT]
    if not paths:
        commands = list(_stop_and_disable(unit, CERTIFICATE_WATCH_PATH_UNIT))
        for path in CERTIFICATE_WATCH_PATHS:
            commands += remove_file(files[path], path)
        return commands
    changed = []
    for path, text in zip(CERTIFICATE_WATCH_PATHS, certificate_watch_texts(paths), strict=True):
        changed += put_file(files[path], path, text)
    return [*changed, *_converge_service(unit, CERTIFICATE_WATCH_PATH_UNIT, bool(changed))]


# NVIDIA/dcgm-exporter#606: stopping or restarting the packaged unit can hang until systemd's stop timeout
# (90 s by default) and end in SIGKILL; a restart waits this long at most.
DCGM_EXPORTER_STOP_TIMEOUT_S = 20


def dcgm_drop_in_text(listen: str, collect_interval_ms: int, web_config: bool = False, https: bool = False) -> str:
    """The drop-in of NVIDIA's unit: our counters file, listen address and collect interval, the one host engine
    (``nvidia-dcgm.service``, started first and required), restarts after any failure (the packaged unit
    restarts on abort only: a start before the host engine listens would stay failed) and a bounded stop.
    ``https``: the web configuration has a ``tls_server_config``; exporter-toolkit re-reads the file on every
    request but decides HTTP or HTTPS at start, so the drop-in says which, and changes (restarting the exporter)
    only when that does."""
    argv = [DCGM_EXPORTER_BINARY, "-f", DCGM_COUNTERS, "-a", listen, "-c", str(collect_interval_ms),
            "-r", DCGM_HOSTENGINE, *(["--web-config-file", DCGM_WEB_CONFIG] if web_config else [])]
    scheme = f"# serves {'HTTPS' if https else 'HTTP'} (its web configuration decides at start)\n" if web_config else ""
    return ("# Managed by gpufleet (stage exporters)\n" + scheme
            + f"[Unit]\nRequires={DCGM_UNIT}\nAfter={DCGM_UNIT}\n\n"
            "[Service]\nExecStart=\n"
            f"ExecStart={' '.join(shlex.quote(a) for a in argv)}\n"
            "Restart=on-failure\nRestartSec=2s\n"
            f"TimeoutStopSec={DCGM_EXPORTER_STOP_TIMEOUT_S}s\n")


def _converge_service(status: dict, unit: str, changed: bool):
    """daemon-reload / enable / start or restart ``unit`` as needed; yields the commands."""
    if status["need_daemon_reload"] or changed:
        yield systemctl("daemon-reload")
    if status["unit_file_state"] != "enabled":
        yield systemctl("enable", unit)
    if not is_running(status):
        yield systemctl("start", unit)
    elif changed:
        yield systemctl("restart", unit)


def _stop_and_disable(status: dict, unit: str):
    if is_running(status):
        yield systemctl("stop", unit)
    if status["unit_file_state"] == "enabled":
        yield systemctl("disable", unit)


def _require_apt():
    distro = host.get_fact(Distribution) or {}
    if pkg.family(distro) != pkg.APT:
        yield from refuse(f"{host.name}: the exporters stage installs Debian/Ubuntu packages; "
                          f"{distro.get('name')} is not supported yet (RHEL: node_exporter from EPEL "
                          "'golang-github-prometheus-node-exporter', DCGM from NVIDIA's CUDA repository)")
        return False
    return True


@operation()
def node_exporter(textfile_dir: str, listen: str = "0.0.0.0:9100", web_config: str = ""):
    """
    Install and run the distribution's node_exporter with a textfile collector directory.

    + textfile_dir: ``--collector.textfile.directory`` (verify writes ``gpufleet_verify.prom`` there)
    + listen: ``--web.listen-address``, ``ADDRESS:PORT``
    + web_config: the text of its web configuration file (basic auth users' bcrypt hashes, TLS), written to
      ``/etc/prometheus/node-exporter-web-config.yml`` (0640 root:prometheus, never shown) and passed as
      ``--web.config.file``; empty: none

    Debian/Ubuntu: package ``prometheus-node-exporter``; its arguments go to
    ``/etc/default/prometheus-node-exporter`` (``ARGS=``, read by the packaged unit), which gpufleet manages
    whole. The service is enabled, started, and restarted when the arguments changed.

    **Example:**

    .. code:: python

        from gpufleet.operations import exporters

        exporters.node_exporter(
            name="node_exporter",
            textfile_dir="/var/lib/prometheus/node-exporter",
            listen="0.0.0.0:9100",
        )
    """
    if not (yield from _require_apt()):
        return
    yield from apt_lists.packages._inner(packages=[NODE_EXPORTER_PACKAGE])
    managed = get_state(paths=(NODE_EXPORTER_DEFAULTS, NODE_EXPORTER_WEB_CONFIG, textfile_dir),
                        units=(NODE_EXPORTER_UNIT,))
    commands = []
    if managed["files"][textfile_dir] is None:
        commands.append(StringCommand("mkdir", "-p", shlex.quote(textfile_dir)))
    # before the arguments that name it; exporter-toolkit reads it again on every request, but decides between
    # HTTP and HTTPS once, at start: a change restarts node_exporter
    web = list(put_file(managed["files"][NODE_EXPORTER_WEB_CONFIG], NODE_EXPORTER_WEB_CONFIG, web_config,
                        mode="640", group=NODE_EXPORTER_GROUP, secret=True)) if web_config else []
    commands += web
    defaults = list(put_file(managed["files"][NODE_EXPORTER_DEFAULTS], NODE_EXPORTER_DEFAULTS,
                             node_exporter_defaults(textfile_dir, listen, bool(web_config))))
    commands += defaults
    commands += _converge_service(managed["units"][NODE_EXPORTER_UNIT], NODE_EXPORTER_UNIT, bool(defaults or web))
    if not commands:
        host.noop(f"node_exporter running on {listen}{' (web config)' if web_config else ''}, textfile collector "
                  f"{textfile_dir}")
    yield from commands


@operation()
def desired_state(textfile_dir: str, gpus: list[dict], lost: list[str] | tuple = ()):
    """
    Publish gpufleet's desired GPU settings to Prometheus as a node_exporter textfile.

    + textfile_dir: node_exporter's textfile collector directory
    + gpus: one dict per GPU: ``index``, ``uuid``, ``pci_bus_id`` and the desired ``power_limit_w``,
      ``persistence`` (bool) and ``mig_enabled`` (bool), each ``None`` where gpufleet does not manage it
    + lost: PCI addresses of GPUs the driver reports lost: an existing file is kept as it is until they are back

    Writes ``TEXTFILE_DIR/gpufleet_desired.prom`` (``gpufleet_gpu_power_limit_desired_watts``,
    ``gpufleet_gpu_persistence_desired``, ``gpufleet_gpu_mig_mode_desired``): the alert rules compare them with
    the current values either GPU exporter exports, so the desired-state alerts work on the dcgm and nvml paths.

    **Example:**

    .. code:: python

        from gpufleet.operations import exporters

        exporters.desired_state(
            name="desired GPU settings for Prometheus",
            textfile_dir="/var/lib/prometheus/node-exporter",
            gpus=[{"index": 0, "uuid": "GPU-…", "pci_bus_id": "00000000:18:00.0",
                   "power_limit_w": 500.0, "persistence": True, "mig_enabled": None}],
        )
    """
    path = posixpath.join(textfile_dir, DESIRED_TEXTFILE)
    managed = get_state(paths=(path,), units=())
    if lost and managed["files"][path] is not None:
        host.noop(f"desired GPU settings in {path} kept while GPU(s) {', '.join(lost)} are lost")
        return
    commands = list(put_file(managed["files"][path], path, desired_textfile(gpus)))
    if not commands:
        host.noop(f"desired GPU settings of {len(gpus)} GPU(s) published in {path}")
    yield from commands


@operation()
def gpu_exporter(kind: str, listen: str = "0.0.0.0:9400", profiling: bool = False, profiling_package: bool = False,
                 collect_interval_ms: int = 15_000, web_config: str = "",
                 credentials: tuple[tuple[str, str], ...] = (), version: str = ""):
    """
    Run one GPU exporter on dcgm-exporter's port and names: NVIDIA's (``dcgm``) or gpufleet's (``nvml``).

    + kind: ``dcgm`` (packages from the configured NVIDIA repository), ``nvml`` (gpufleet's exporter) or
      ``none`` (both stopped and disabled)
    + listen: ``ADDRESS:PORT`` the exporter listens on
    + profiling: ``dcgm``: export the ``DCGM_FI_PROF_*`` counters (datacenter GPUs only)
    + profiling_package: ``dcgm``: install ``datacenter-gpu-manager-4-proprietary`` (profiling on Ampere and earlier)
    + collect_interval_ms: ``dcgm``: how often dcgm-exporter collects (``-c``), the scrape interval
    + web_config: the text of the exporter's web configuration file (exporter-toolkit's format: basic auth, TLS),
      passed as ``--web-config-file`` (dcgm-exporter's flag; gpufleet's exporter reads the same format); never shown
    + credentials: ``nvml``: (name, path) of the files its web configuration names relative to itself (TLS
      certificate and key), handed to the exporter's dynamic user by ``LoadCredential=``; a path unit
      (``gpufleet-exporter-certificate.path``) restarts the exporter when one of them changes (a renewal)
    + version: ``dcgm``: the dcgm-exporter release to install, pin and hold (``4.2.3-4.1.3``); empty: apt's
      candidate, not held

    ``nvml`` uploads the exporter's zip file and its hardened unit ``gpufleet-exporter.service``; ``dcgm`` installs
    DCGM and dcgm-exporter, writes the counters file and a drop-in that runs NVIDIA's unit against the one host
    engine. The other kind's exporter is stopped and disabled; an exporter restarts only when what it reads at
    start changed. docs/monitoring.md has the details.

    **Example:**

    .. code:: python

        from gpufleet.operations import exporters

        exporters.gpu_exporter(name="GPU exporter", kind="nvml", listen="0.0.0.0:9400")
    """
    managed = get_state(paths=(NVML_BUNDLE, NVML_SETTINGS, NVML_UNIT_PATH, DCGM_COUNTERS, DCGM_DROP_IN,
                               OLD_DCGM_DROP_IN, dcgm_package.EXPORTER_PIN, NVML_WEB_CONFIG, DCGM_WEB_CONFIG,
                               *CERTIFICATE_WATCH_PATHS),
                        units=(NVML_UNIT, DCGM_UNIT, DCGM_EXPORTER_UNIT, CERTIFICATE_WATCH_PATH_UNIT))
    files, units = managed["files"], managed["units"]
    commands = []
    commands += remove_file(files[NVML_SETTINGS], NVML_SETTINGS)  # the desired values moved to a textfile
    commands += remove_file(files[OLD_DCGM_DROP_IN], OLD_DCGM_DROP_IN)
    if kind != "nvml":
        commands += _stop_and_disable(units[NVML_UNIT], NVML_UNIT)
        commands += remove_file(files[NVML_UNIT_PATH], NVML_UNIT_PATH)
    if kind != "dcgm":
        commands += _stop_and_disable(units[DCGM_EXPORTER_UNIT], DCGM_EXPORTER_UNIT)
    if kind == "nvml":
        changed = list(put_bytes(files[NVML_BUNDLE], NVML_BUNDLE, bundle()))
        if web_config:  # systemd copies it for the dynamic user at start (LoadCredential=): a change restarts
            changed += put_file(files[NVML_WEB_CONFIG], NVML_WEB_CONFIG, web_config, mode="600", secret=True)
        changed += put_file(files[NVML_UNIT_PATH], NVML_UNIT_PATH,
                            nvml_unit_text(listen, bool(web_config), tuple(credentials)))
        commands += changed
        commands += _converge_service(units[NVML_UNIT], NVML_UNIT, bool(changed))
    watched = tuple(path for _, path in credentials) if kind == "nvml" and web_config else ()
    commands += _certificate_watch(files, units, watched)
    if kind == "dcgm":
        if not (yield from _require_apt()):
            return
        names = [*DCGM_PACKAGES, *([DCGM_PROFILING_PACKAGE] if profiling_package else [])]
        installing, replaced = dcgm_package.packages(names, version, files[dcgm_package.EXPORTER_PIN])
        yield from commands + installing
        done, commands = bool(commands or installing), []
        running = version or dcgm_package.exporter_version(names)  # read after the install
        counters, left_out = counters_csv(profiling, exporter_release(running))
        if left_out:  # said on every run: the host runs without them until its exporter is upgraded
            report(f"dcgm-exporter {running}: counters its field map does not know left out: {', '.join(left_out)}")
        restart = list(put_file(files[DCGM_COUNTERS], DCGM_COUNTERS, counters))
        restart += put_file(files[DCGM_DROP_IN], DCGM_DROP_IN,
                            dcgm_drop_in_text(listen, collect_interval_ms, bool(web_config), "tls_server_config"
                                              in web_config))
        commands += restart
        if web_config:  # re-read on every request (exporter-toolkit): no restart
            commands += put_file(files[DCGM_WEB_CONFIG], DCGM_WEB_CONFIG, web_config, mode="600", secret=True)
        commands += _converge_service(units[DCGM_UNIT], DCGM_UNIT, False)
        # restarted when what it reads at start changed, or its program (an installed or replaced package)
        commands += _converge_service(units[DCGM_EXPORTER_UNIT], DCGM_EXPORTER_UNIT, bool(restart) or replaced)
        if not (commands or done):
            host.noop(f"GPU exporter dcgm (dcgm-exporter {running}) running on {listen}")
        yield from commands
        return
    if not commands:
        host.noop(f"GPU exporter {kind} running on {listen}" if kind != "none" else "no GPU exporter running")
    yield from commands
