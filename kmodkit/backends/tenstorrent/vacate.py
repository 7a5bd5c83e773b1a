"""The DKMS vacate procedure, run on one node by a short-lived privileged pod.

The pod chroots into the host and runs the migration guide's per-node
procedure with the host's own tools: it refuses while anything holds the
device, unloads tt-kmd, removes DKMS's state and sources and every stray
``tenstorrent.ko*`` of the running kernel, runs depmod, and verifies. Every
line it prints says what it found or did. Run on a clean host it changes
nothing and ends with the same verdict, so it is safe to repeat.
"""

from __future__ import annotations

from typing import Any

from kmodkit.backends.tenstorrent import names

EXIT_HELD = 3
"""The device is held: nothing was changed."""
EXIT_UNVERIFIED = 1
"""The host still has DKMS state, a loaded module or an installable .ko."""
DEFAULT_IMAGE = "docker.io/library/busybox:1.36"
VACATED = "host vacated; operator can take over"

SCRIPT = r"""
set -u
# The host's own tools, whatever PATH the pod's image sets.
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
M=tenstorrent
KVER=$(uname -r)
echo "found: kernel $KVER"

held=""
if [ -d /sys/module/$M ]; then
  refcnt=$(cat /sys/module/$M/refcnt 2>/dev/null || echo 0)
  version=$(cat /sys/module/$M/version 2>/dev/null || echo unknown)
  echo "found: $M loaded, version $version, refcnt $refcnt"
  [ "$refcnt" != 0 ] && held="refcnt $refcnt"
else
  echo "found: $M not loaded"
fi
# One find and one ls (per few thousand fds) list every fd with its target, read
# by the shell itself: a command per fd would fork once per open file on the node.
holders=$(find /proc/[0-9]*/fd -mindepth 1 -maxdepth 1 -type l -exec ls -l {} + 2>/dev/null |
  while read -r line; do
    case "$line" in
      *" -> /dev/tenstorrent/"*)
        fd=${line% -> *}; fd=${fd##* /proc/}
        echo "${fd%%/*} ${line##* -> }" ;;
    esac
  done)
while read -r pid target; do
  [ -n "$pid" ] || continue
  echo "found: pid $pid ($(cat /proc/$pid/comm 2>/dev/null)) holds $target"
  held="$held pid:$pid"
done <<HOLDERS
$holders
HOLDERS
if [ -n "$held" ]; then
  echo "refused: /dev/tenstorrent is in use ($held); stop or drain the holders, then run again"
  exit 3
fi

if [ -d /sys/module/$M ]; then
  rmmod $M || { echo "failed: rmmod $M"; exit 1; }
  echo "did: rmmod $M"
fi
if [ -d /var/lib/dkms/$M ]; then
  echo "found: /var/lib/dkms/$M"
  if command -v dkms >/dev/null 2>&1; then
    dkms remove $M --all >/dev/null 2>&1 && echo "did: dkms remove $M --all"
  fi
  rm -rf /var/lib/dkms/$M && echo "did: rm -rf /var/lib/dkms/$M"
fi
for src in /usr/src/$M-*; do
  [ -e "$src" ] || continue
  echo "found: $src"
  rm -rf "$src" && echo "did: rm -rf $src"
done
kos=$(find /lib/modules/$KVER -name "$M.ko*" 2>/dev/null)
for ko in $kos; do
  rm -f "$ko" && echo "did: rm $ko"
done
if [ -n "$kos" ]; then
  depmod -a "$KVER" && echo "did: depmod -a $KVER"
fi

problems=""
[ -e /sys/module/$M ] && problems="$problems; $M still loaded"
[ -d /var/lib/dkms/$M ] && problems="$problems; /var/lib/dkms/$M remains"
for src in /usr/src/$M-*; do [ -e "$src" ] && problems="$problems; $src remains"; done
modprobe -n $M >/dev/null 2>&1 \
  && problems="$problems; modprobe still finds $M (find it: modinfo -n $M)"
if [ -n "$problems" ]; then
  echo "not vacated:${problems#;}"
  exit 1
fi
echo "__VACATED__"
""".replace("__VACATED__", VACATED)


# The procedure's report is the container's termination message (the kubelet keeps its
# last 4 KiB, the verdict included): the command reads it from the pod's status, which
# needs neither pods/log nor a connection from the apiserver to the node's kubelet.
# The script is an argument, never part of the outer command line.
REPORT = (
    'chroot /host /bin/sh -c "$1" >/dev/termination-log 2>&1; code=$?; '
    "cat /dev/termination-log; exit $code"
)


def vacate_pod(node: str, namespace: str, image: str) -> dict[str, Any]:
    """The pod that runs the procedure on ``node``: pinned there, privileged, host PID and root."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": names.fit(f"tt-vacate-{node}", 63),
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/name": "tt-vacate",
                "app.kubernetes.io/managed-by": "kmodkit",
            },
        },
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "hostPID": True,
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": "vacate",
                    "image": image,
                    "command": ["/bin/sh", "-c", REPORT, "vacate", SCRIPT],
                    "securityContext": {"privileged": True},
                    "volumeMounts": [{"name": "host", "mountPath": "/host"}],
                }
            ],
            "volumes": [{"name": "host", "hostPath": {"path": "/", "type": "Directory"}}],
        },
    }
