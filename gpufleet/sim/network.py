"""The simulated fleet's network: one bridge on the control machine, one network namespace per host.

Every address used lives on interfaces this module creates: the bridge (the control machine's side,
``<net>.1``) and the hosts' veth ends inside their own namespaces. NAT lets hosts reach the configured
Debian mirror, as a real server reaches its mirror.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

DEFAULT_NET = "10.77.0"
FIRST_HOST_OCTET = 11


def default_net() -> str:
    """The fleet's /24 (first three octets); GPUFLEET_SIM_NET lets a second fleet (e.g. tests) coexist."""
    return os.environ.get("GPUFLEET_SIM_NET", DEFAULT_NET)


def net_tag(net: str) -> str:
    return net.rsplit(".", 1)[1]


def bridge_name(net: str) -> str:
    return f"gfsim{net_tag(net)}"


def nft_table(net: str) -> str:
    return f"gpufleet_sim_{net_tag(net)}"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def bridge_address(net: str) -> str:
    return f"{net}.1"


def host_address(net: str, index: int) -> str:
    return f"{net}.{FIRST_HOST_OCTET + index}"


def netns_name(host: str, net: str) -> str:
    return f"gfsim{net_tag(net)}-{host}"


def veth_name(index: int, net: str) -> str:
    return f"vgf{net_tag(net)}x{index}"


def setup_bridge(net: str) -> None:
    bridge, table = bridge_name(net), nft_table(net)
    if _ip("link", "show", bridge, check=False).returncode != 0:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", f"{bridge_address(net)}/24", "dev", bridge)
    _ip("link", "set", bridge, "up")
    for key, value in (
        ("net.ipv4.ip_forward", "1"),
        ("fs.inotify.max_user_instances", "8192"),
        ("fs.inotify.max_user_watches", "1048576"),
    ):
        Path("/proc/sys", *key.split(".")).write_text(value)
    subprocess.run(["nft", "delete", "table", "ip", table], capture_output=True)
    rules = (
        f"table ip {table} {{ chain post {{ type nat hook postrouting priority 100; "
        f'ip saddr {net}.0/24 oifname != "{bridge}" masquerade; }}; }}'
    )
    subprocess.run(["nft", "-f", "-"], input=rules, text=True, check=True)


def teardown_bridge(net: str) -> None:
    bridge, table = bridge_name(net), nft_table(net)
    _ip("link", "del", bridge, check=False)
    subprocess.run(["nft", "delete", "table", "ip", table], capture_output=True)


def setup_host(host: str, index: int, net: str) -> None:
    ns, veth = netns_name(host, net), veth_name(index, net)
    teardown_host(host, index, net)
    _ip("netns", "add", ns)
    _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
    _ip("link", "set", veth, "master", bridge_name(net), "up")
    _ip("-n", ns, "link", "set", "lo", "up")
    _ip("-n", ns, "addr", "add", f"{host_address(net, index)}/24", "dev", "eth0")
    _ip("-n", ns, "link", "set", "eth0", "up")
    _ip("-n", ns, "route", "add", "default", "via", bridge_address(net))


def set_host_link(index: int, net: str, up: bool) -> None:
    """Cut or restore a host's network (the 'host-down' fault) as a pulled cable does: on the bridge's side of its
    link. The host's own eth0 stays configured and loses only its carrier, so its addresses and routes (the default
    route to the mirror included) are there again when the cable is back; setting eth0 itself down would make the
    kernel delete every route through it, which a real host does not suffer from a network outage."""
    _ip("link", "set", veth_name(index, net), "up" if up else "down")


def teardown_host(host: str, index: int, net: str) -> None:
    _ip("link", "del", veth_name(index, net), check=False)
    _ip("netns", "del", netns_name(host, net), check=False)


def leftovers(net: str) -> list[str]:
    """What of ours still exists (for `down`'s check and the tests)."""
    bridge, table = bridge_name(net), nft_table(net)
    found = []
    if _ip("link", "show", bridge, check=False).returncode == 0:
        found.append(f"bridge {bridge}")
    netns = _ip("netns", "list", check=False).stdout
    found += [f"netns {line.split()[0]}" for line in netns.splitlines() if line.startswith(f"gfsim{net_tag(net)}-")]
    links = _ip("-o", "link", "show", check=False).stdout
    found += [f"link {line.split(':')[1].strip().split('@')[0]}" for line in links.splitlines()
              if f": vgf{net_tag(net)}x" in line]
    if subprocess.run(["nft", "list", "table", "ip", table], capture_output=True).returncode == 0:
        found.append(f"nft table {table}")
    return found
