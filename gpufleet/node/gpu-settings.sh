#!/bin/sh
# gpufleet-gpu-settings: reapply gpufleet's per-GPU settings, keyed by GPU UUID (never by index).
#
# Installed by gpufleet (gpufleet/node/gpu-settings.sh) as /usr/local/sbin/gpufleet-gpu-settings and run at
# boot by gpufleet-power-limits.service and gpufleet-gpu-clocks.service; safe to run by hand.
#
#   gpufleet-gpu-settings power  [/etc/gpufleet/power-limits.conf]   lines UUID=WATTS       -> nvidia-smi -pl
#   gpufleet-gpu-settings clocks [/etc/gpufleet/gpu-clocks.conf]     lines UUID=MIN,MAX     -> nvidia-smi -lgc
#
# Lines starting with # and blank lines are ignored. `tolerance_w=W` (written by gpufleet from its one power
# tolerance, gpufleet.plan.POWER_TOLERANCE_W): a power limit within W of the current one is left as it is;
# without it every listed limit is set. A GPU listed in the file but not present (removed,
# replaced, fallen off the bus) is logged and skipped: not fatal. Exit status 1 when nvidia-smi cannot list
# the GPUs at all (driver not loaded) or when applying a setting failed; the other GPUs are still applied.
# After `clocks`, the locks applied are recorded in /run/gpufleet/gpu-clocks.locked (gpufleet reads it: the
# driver offers no way to read a clock lock back; /run is emptied at boot, as the locks are).
set -u

what=${1:-}
case $what in
    power) conf=${2:-/etc/gpufleet/power-limits.conf} ;;
    clocks) conf=${2:-/etc/gpufleet/gpu-clocks.conf} ;;
    *) echo "usage: gpufleet-gpu-settings power|clocks [FILE]" >&2; exit 2 ;;
esac
record=${GPUFLEET_CLOCKS_RECORD:-/run/gpufleet/gpu-clocks.locked}

if [ ! -r "$conf" ]; then
    echo "gpufleet-gpu-settings: $conf not found: nothing to apply"
    exit 0
fi
# one query: "GPU-…, 560.00" per GPU
if ! present=$(nvidia-smi --query-gpu=uuid,power.limit --format=csv,noheader,nounits 2>&1); then
    echo "gpufleet-gpu-settings: error: nvidia-smi cannot list the GPUs: $present" >&2
    exit 1
fi

tolerance=$(sed -n 's/^tolerance_w=\([0-9.]*\)$/\1/p' "$conf" | tail -n 1)
rc=0
applied=""
while IFS='=' read -r uuid value || [ -n "$uuid" ]; do
    case $uuid in GPU-*) ;; *) continue ;; esac
    current=$(printf '%s\n' "$present" | awk -F', *' -v u="$uuid" '$1 == u { print $2; found = 1 }
                                                                 END { exit !found }') || {
        echo "gpufleet-gpu-settings: warning: GPU $uuid is not present: $what setting $value skipped"
        continue
    }
    if [ "$what" = power ]; then
        if [ -n "$tolerance" ] && awk -v a="$current" -v b="$value" -v t="$tolerance" \
            'BEGIN { d = a - b; exit !(a != "" && d < t + 0 && d > -t) }'
        then
            echo "gpufleet-gpu-settings: GPU $uuid: power limit already $value W"
            continue
        fi
        set -- -pl "$value"
    else
        set -- -lgc "$value"  # a clock lock cannot be read back: always applied
    fi
    if out=$(nvidia-smi -i "$uuid" "$@" 2>&1); then
        echo "gpufleet-gpu-settings: GPU $uuid: $what $value applied"
        applied="$applied$uuid=$value
"
    else
        echo "gpufleet-gpu-settings: error: GPU $uuid: nvidia-smi $* failed: $out" >&2
        rc=1
    fi
done < "$conf"

if [ "$what" = clocks ]; then
    mkdir -p "$(dirname "$record")"
    printf '%s' "$applied" > "$record.tmp" && mv -f "$record.tmp" "$record"
fi
exit $rc
