"""gpufleet.connection: settings validation and the socket options a live connection gets; interruption's report."""

from __future__ import annotations

import signal
import socket
from types import SimpleNamespace

from gpufleet import connection
from gpufleet._pyinfra import _connector, _signals
from gpufleet.config import load_node_config


def test_defaults_declare_a_silent_host_lost_within_30_s():
    bounds, errors = connection.load_bounds("node01", {})
    assert errors == []
    assert bounds == connection.SshBounds(connect_timeout=10.0, keepalive_interval=5, dead_after=20)
    assert bounds.detection_s == 25


def test_settings_are_validated_naming_host_key_value_and_what_is_allowed():
    _, errors = connection.load_bounds("node01", {"gpufleet_ssh_dead_after": 2, "gpufleet_ssh_keepalive": 5,
                                                  "gpufleet_ssh_connect_timeout": "10"})
    assert [str(e) for e in errors] == [
        "node01: gpufleet_ssh_connect_timeout='10': invalid value; allowed: seconds, a number from 1 to 600",
        "node01: gpufleet_ssh_dead_after=2: invalid value; allowed: seconds, an integer from 5 to 3600",
        "node01: gpufleet_ssh_keepalive=5: unknown gpufleet_ssh setting; allowed: one of "
        "gpufleet_ssh_connect_timeout, gpufleet_ssh_keepalive_interval, gpufleet_ssh_dead_after",
    ]


def test_node_config_leaves_the_ssh_keys_to_the_connection_module():
    load_node_config("node01", {"gpufleet_ssh_dead_after": 30})  # no "unknown gpufleet setting"


def test_connect_kwargs_keep_what_the_inventory_sets():
    bounds = connection.SshBounds(connect_timeout=7)
    assert connection.connect_kwargs(bounds, {"banner_timeout": 60}) == {
        "timeout": 7, "banner_timeout": 60, "auth_timeout": 7}


def test_a_live_socket_gets_keepalive_and_user_timeout():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        connection.bound_socket(sock, connection.SshBounds(keepalive_interval=5, dead_after=20))
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 5
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 5
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 4
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 20000


def test_a_connector_without_ssh_is_left_alone():
    assert _connector.bound_connection(object(), connection.SshBounds()) is False


class _State:
    def __init__(self, executing: bool, running: dict):
        self.is_executing = executing
        self.inventory = [SimpleNamespace(name=name, executing_op_hash=ops[0] if ops else None,
                                          nested_executing_op_hash=ops[1] if len(ops) > 1 else None)
                          for name, ops in running.items()]

    def get_op_meta(self, op_hash):
        return SimpleNamespace(names={op_hash})


def test_interruption_report_names_the_hosts_mid_change_and_their_stage():
    state = _State(True, {"node01": ["gpufleet: GPU node | NVIDIA driver 580"], "node02": [],
                          "node03": ["GPU settings (planned once the driver answers)", "MIG layout"]})
    assert _signals.report(state, signal.SIGINT) == (
        "gpufleet: interrupted by SIGINT while executing (exit 130).\n"
        "Hosts mid-change (stage):\n"
        "  node01: gpufleet: GPU node | NVIDIA driver 580\n"
        "  node03: GPU settings (planned once the driver answers) > MIG layout\n"
        "Commands already sent run to their end on those hosts (their gpufleet lock is held until then); run the "
        "same command again to converge them.")
    assert _signals.report(_State(False, {}), signal.SIGTERM) == (
        "gpufleet: interrupted by SIGTERM before executing anything: no host was changed (exit 143)")
