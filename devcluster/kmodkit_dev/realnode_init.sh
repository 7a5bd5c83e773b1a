#!/bin/sh
# The real node's start inside its VM (tests/kernel/vm_init.sh runs it, chrooted
# into this machine's root, which the VM sees read-only over virtio-9p).
#
# The node's directory on this machine (KMODKIT_NODE_DIR) is mounted writable at
# the same path, so configuration comes in and logs and hostPath files go out
# through it. Everything the node writes otherwise (/var: containerd's images and
# snapshots, the kubelet's pods, pod logs, CNI state) is a tmpfs of the VM's own.
# node.env, written by kmodkit_dev.realnode, names the node, the kernel's module
# tree and the forwarded ports.
set -eu

node=$KMODKIT_NODE_DIR
mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288 nodedir "$node"
mkdir -p "$node/logs"
exec >>"$node/logs/init.log" 2>&1
# shellcheck disable=SC1091 # written at start by realnode.py
. "$node/node.env"
echo "node init: $(date -u +%T) kernel $(uname -r)"

mount -t tmpfs -o size=3g,mode=0755 tmpfs /var
mkdir -p /var/lib/containerd /var/lib/kubelet /var/lib/cni /var/log/pods /var/tmp
ln -s /run /var/run
# The kernel resolves firmware paths in the VM's own root (the initramfs, which the
# node sees at /run/kmodkit-test/node), so the node's /var/lib/firmware is that
# root's: the search path the agent sets names the files it placed, as on any host.
mkdir -p /run/kmodkit-test/node/var/lib/firmware /var/lib/firmware
mount --bind /run/kmodkit-test/node/var/lib/firmware /var/lib/firmware
# /tmp stays this machine's (read-only: the node's directory may be under it).
export TMPDIR=/var/tmp
# The modules of the kernel this VM booted (this machine has the directory, from
# the kernel headers, but not its modules), so modprobe finds them. It and /usr/src
# are writable, as on any host (DKMS installs into both): overlays on the VM's memory.
mount --bind "$NODE_MODULES" "/lib/modules/$(uname -r)"
modprobe overlay
writable() { # lower, mount point
	layer=/run/kmodkit-node/overlays/$(echo "$2" | tr / _)
	mkdir -p "$layer/upper" "$layer/work"
	mount -t overlay overlay -o "lowerdir=$1,upperdir=$layer/upper,workdir=$layer/work" "$2"
}
writable "$NODE_MODULES" "/lib/modules/$(uname -r)"
writable /usr/src /usr/src
# The build link Debian's linux-headers package makes, so out-of-tree builds on the
# node (the Tenstorrent builder's) find the headers this machine has.
headers=/usr/src/linux-headers-$(uname -r)
[ -d "$headers" ] && ln -sfn "$headers" "/lib/modules/$(uname -r)/build"
# A driver's host files (tt-smi in /usr/local/bin, udev rules in /etc/udev) land here.
writable /usr/local /usr/local
writable /etc /etc
# drm: the class (/sys/class/drm) a GPU node has and Intel's device plugin mounts.
for module in virtio_net veth bridge br_netfilter nf_conntrack nf_nat drm \
	nf_tables nft_chain_nat nft_compat nft_masq nft_nat nft_ct xt_MASQUERADE xt_nat \
	xt_tcpudp xt_conntrack xt_comment xt_addrtype xt_mark xt_multiport ip_tables iptable_nat \
	iptable_filter; do
	modprobe "$module" || echo "node init: no module $module"
done

# Every mount shared, as systemd makes them at boot: pods that mount the root with
# HostToContainer propagation (the Tenstorrent builder's /host) need it.
mount --make-rshared /

# cgroup v2, every controller delegated to the kubelet's tree.
mount -t cgroup2 cgroup2 /sys/fs/cgroup
for controller in $(cat /sys/fs/cgroup/cgroup.controllers); do
	echo "+$controller" >/sys/fs/cgroup/cgroup.subtree_control ||
		echo "node init: cannot delegate $controller"
done
mkdir -p /dev/pts /dev/shm /dev/mqueue
mount -t devpts -o newinstance,ptmxmode=0666 devpts /dev/pts || true
mount -t tmpfs tmpfs /dev/shm
mount -t mqueue mqueue /dev/mqueue || true
mount -t bpf bpf /sys/fs/bpf 2>/dev/null || true
hostname "$NODE_NAME"

# qemu's user network (restrict=on): the guest is 10.0.2.15 and reaches nothing
# but the guestfwd addresses, which lead to the apiserver, the registry and the
# git daemon (pods reach that one at its guest address, SOURCES_URL).
ip link set lo up
ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0
ip route add default via 10.0.2.2
sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1

# The apiserver and registry certificates name 127.0.0.1, so the kubelet and
# containerd reach them at their own loopback addresses, forwarded out.
socat "TCP-LISTEN:$NODE_API_PORT,bind=127.0.0.1,fork,reuseaddr" "TCP:$NODE_API_GUEST" &
socat "TCP-LISTEN:$NODE_REGISTRY_PORT,bind=127.0.0.1,fork,reuseaddr" "TCP:$NODE_REGISTRY_GUEST" &
# Pods reach the API as in-cluster clients do, at the kubernetes Service's
# ClusterIP (no kube-proxy here: this one rule is its whole work on this node).
for chain in PREROUTING OUTPUT; do
	iptables -t nat -A "$chain" -d "$NODE_SERVICE_IP/32" -p tcp --dport 443 \
		-j DNAT --to-destination "$NODE_API_GUEST"
done

containerd --config "$node/containerd.toml" >>"$node/logs/containerd.log" 2>&1 &
until ctr --address /run/containerd/containerd.sock version >/dev/null 2>&1; do sleep 0.2; done
# The sandbox image is imported, not pulled: containerd would need the
# registry's credentials, which would let every pod pull without its secret.
ctr --address /run/containerd/containerd.sock -n k8s.io images import "$node/pause.tar"
echo "node init: $(date -u +%T) containerd ready"

"$NODE_KUBELET" --config="$node/kubelet.yaml" --kubeconfig="$node/kubelet.kubeconfig" \
	--hostname-override="$NODE_NAME" --node-ip=10.0.2.15 --node-labels="$NODE_LABELS" \
	--v=2 >>"$node/logs/kubelet.log" 2>&1 &
echo "node init: $(date -u +%T) kubelet started"
wait "$!"
echo "node init: kubelet exited $?"
