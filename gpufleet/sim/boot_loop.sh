#!/bin/bash
# Supervises one simulated host: power-on reset of the simulated GPUs, then systemd-nspawn booting the
# host's root. nspawn exits 133 when the host reboots itself; `gpufleet sim reboot` asks for a power
# cycle with the power-cycle flag; `gpufleet sim down` sets the stop flag.
# usage: boot_loop.sh HOSTDIR PYTHON NSPAWN-ARGS...
H=$1; PY=$2; shift 2
echo $$ > "$H/loop.pid"
for cg in $GPUFLEET_SIM_CGROUPS; do
  mkdir -p "$cg" && echo $$ > "$cg/cgroup.procs"
done
while :; do
  rm -f "$H/power-cycle"
  "$PY" -m gpufleet.sim.boot "$H" >> "$H/boot.log" 2>&1 || break
  [ -e "$H/stop" ] && break
  SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1 SYSTEMD_NSPAWN_API_VFS_WRITABLE=network SYSTEMD_SUPPRESS_SYNC=1 \
    systemd-nspawn "$@" < /dev/null >> "$H/nspawn.log" 2>&1 &
  echo $! > "$H/nspawn.pid"
  wait $!
  rc=$?
  rm -f "$H/nspawn.pid"
  echo "$(date -Is) nspawn exited $rc" >> "$H/boot.log"
  [ -e "$H/stop" ] && break
  [ "$rc" -eq 133 ] || [ -e "$H/power-cycle" ] || break
done
rm -f "$H/loop.pid"
