#!/bin/busybox sh
# /init of the kernel-tier VM. Mounts the test machine's root (read-only, over
# virtio-9p) at /host, then runs the scenario there with the machine's own
# Python, kmod tools and the agent under test, and powers off.
#
# The agent's host root is this initramfs itself, seen from inside /host at
# /run/kmodkit-test/node: the kernel resolves firmware paths in this root, so
# firmware the agent places under its host root is where the kernel looks.
# Only /run is covered by a tmpfs, so a checkout under /tmp stays visible.
#
# KMODKIT_PYTHON, KMODKIT_REPO, KMODKIT_DRIVER and (for the signature boot)
# KMODKIT_SCENARIO and KMODKIT_SIGNED come from the kernel command line; with
# KMODKIT_ENTRY set, that script runs instead of the scenario.

/bin/busybox --install -s /bin
export PATH=/bin

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

while read -r module; do
	insmod "$module" || echo "KMODKIT-INIT insmod $module failed"
done </modules.load

if ! mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=524288 hostroot /host; then
	echo "KMODKIT-INIT cannot mount the host root over 9p"
	poweroff -f
fi
mount -t proc proc /host/proc
mount -t sysfs sysfs /host/sys
mount -t devtmpfs devtmpfs /host/dev
mount -t tmpfs tmpfs /host/run
node=/host/run/kmodkit-test/node
mkdir -p "$node"
mount --bind / "$node"
mount --bind /proc "$node/proc"
mount --bind /sys "$node/sys"
mount --bind /dev "$node/dev"

# A child, not exec: chroot in PID 1 would move the root the kernel's
# firmware loader uses along with it.
if [ -n "${KMODKIT_ENTRY:-}" ]; then
	# Another role for the same VM (devcluster's real node): a script of this
	# machine's run with the kernel command line's KMODKIT_NODE_* settings, in a
	# mount namespace of its own whose root mount is this machine's root, moved
	# over / (as switch_root does). A plain chroot would leave the initramfs as
	# the namespace's root: runc's pivot_root would then keep it under every
	# container, and `runc exec` (exec probes) would land in the initramfs.
	# PID 1 stays in the first namespace, so the firmware root is unchanged.
	unshare -m /bin/sh -c 'cd /host && mount --move . / && exec chroot . "$@"' entry \
		/usr/bin/env -i \
		PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		HOME=/run/kmodkit-test $(env | grep '^KMODKIT_NODE_') \
		/bin/sh "$KMODKIT_ENTRY"
	echo "KMODKIT-INIT entry exited $?"
	poweroff -f
fi
chroot /host /usr/bin/env -i \
	PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
	HOME=/run/kmodkit-test PYTHONDONTWRITEBYTECODE=1 \
	KMODKIT_REPO="$KMODKIT_REPO" KMODKIT_DRIVER="$KMODKIT_DRIVER" \
	KMODKIT_SIGNED="${KMODKIT_SIGNED:-}" \
	"$KMODKIT_PYTHON" "$KMODKIT_REPO/tests/kernel/${KMODKIT_SCENARIO:-vm_scenario.py}"
echo "KMODKIT-INIT scenario exited $?"
poweroff -f
