#!/bin/sh
# Prepare the real-kernel test tier from Debian's archive: qemu and busybox, the
# current Debian kernel image (extracted, never installed: its hooks want a
# bootloader) and its headers, our test module pair built against them, and a
# busybox initramfs that mounts this machine's root over virtio-9p, and the
# tests' stand-in for tt-kmd (ttmod/) built against the same headers. For the
# signature boot: two test signers (key and certificate, made with openssl), the
# test modules signed by each with the kernel's sign-file, OVMF, the kernel signed
# with a test platform key, and an OVMF variable store with Secure Boot on, that
# platform key enrolled and the first signer as a Machine Owner Key.
#
# Idempotent. Results are cached per kernel version under
# ${KMODKIT_CACHE:-~/.cache/kmodkit}/kernel/<version>/; the last line printed
# is that directory.
#
# `prepare.sh modules` stops after the headers (which bring sign-file, from
# linux-kbuild-<version>) and the test modules: what the signer's tests need.
set -eu

mode=${1:-all}

here=$(cd "$(dirname "$0")" && pwd)
cache_root=${KMODKIT_CACHE:-$HOME/.cache/kmodkit}/kernel

say() { echo "prepare: $*" >&2; }

as_root() {
	if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi
}

installed() {
	dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "ok installed"
}

apt_updated=no
apt_update() {
	if [ "$apt_updated" = no ]; then
		say "apt-get update"
		as_root apt-get update -qq >&2
		apt_updated=yes
	fi
}

apt_install() {
	missing=""
	for package in "$@"; do
		installed "$package" || missing="$missing $package"
	done
	[ -z "$missing" ] && return 0
	apt_update
	say "installing$missing"
	# shellcheck disable=SC2086 # word splitting of the package list is intended
	as_root env DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq --no-install-recommends $missing >&2
}

kernel_version() {
	apt-cache depends linux-image-amd64 2>/dev/null |
		sed -n 's/^ *Depends: linux-image-\([0-9].*\)$/\1/p' | head -n 1
}

# Publish a directory built beside its final name, so a cache entry is whole or absent.
publish() {
	rm -rf "$2"
	mv "$1" "$2"
}

if [ "$mode" = modules ]; then
	apt_install kmod make gcc
else
	apt_install qemu-system-x86 busybox-static kmod make gcc cpio gzip openssl ovmf keyutils sbsigntool
fi

version=$(kernel_version)
if [ -z "$version" ]; then
	apt_update
	version=$(kernel_version)
fi
[ -n "$version" ] || { say "cannot resolve linux-image-amd64 to a kernel version"; exit 1; }
cache=$cache_root/$version
mkdir -p "$cache"
say "kernel $version, cache $cache"

apt_install "linux-headers-$version"
headers=/usr/src/linux-headers-$version

if [ "$mode" != modules ] && [ ! -f "$cache/image/boot/vmlinuz-$version" ]; then
	say "downloading linux-image-$version"
	scratch=$(mktemp -d "$cache/.image.XXXXXX")
	(cd "$scratch" && apt-get download -q "linux-image-$version" >&2 2>&1)
	dpkg -x "$scratch"/linux-image-*.deb "$scratch/root"
	# The package ships no modules.dep (its postinst runs depmod); the initramfs
	# step needs it to find the 9p modules' dependencies.
	depmod -b "$scratch/root" "$version"
	publish "$scratch/root" "$cache/image"
	rm -rf "$scratch"
fi

sources_hash=$(cat "$here"/testmod/* | md5sum | cut -c1-16)
driver=$cache/driver-$sources_hash
if [ ! -d "$driver" ]; then
	say "building the test modules against $headers"
	scratch=$(mktemp -d "$cache/.driver.XXXXXX")
	cp "$here"/testmod/* "$scratch/"
	make -s -C "$headers" M="$scratch" modules >&2 2>&1
	# The driver image, laid out the way KMM expects: <dirName>/lib/modules/<kernel>/.
	mkdir -p "$scratch/opt/lib/modules/$version/extra"
	cp "$scratch"/*.ko "$scratch/opt/lib/modules/$version/extra/"
	chmod 0755 "$scratch"
	publish "$scratch" "$driver"
fi
ln -sfn "$(basename "$driver")" "$cache/driver"
# The tests' stand-in for tt-kmd (ttmod/tenstorrent.c), for the real node's Tenstorrent tests.
tt_hash=$(cat "$here"/ttmod/* | md5sum | cut -c1-16)
ttmod=$cache/ttmod-$tt_hash
if [ ! -d "$ttmod" ]; then
	say "building the tt-kmd stand-in against $headers"
	scratch=$(mktemp -d "$cache/.ttmod.XXXXXX")
	cp "$here"/ttmod/* "$scratch/"
	make -s -C "$headers" M="$scratch" modules >&2 2>&1
	chmod 0755 "$scratch"
	publish "$scratch" "$ttmod"
fi
ln -sfn "$(basename "$ttmod")" "$cache/ttmod"
if [ "$mode" = modules ]; then
	echo "$cache"
	exit 0
fi

# The signers and the modules they signed are one cache entry: a new key always
# comes with modules signed by it. Bump the recipe tag when the recipe changes.
signed=$cache/signed-$sources_hash-r3
if [ ! -d "$signed" ]; then
	say "making the test signers and signing the test modules"
	sign_file=$headers/scripts/sign-file
	[ -x "$sign_file" ] || { say "$sign_file is missing (linux-kbuild)"; exit 1; }
	vars_tool=$(dirname "${KMODKIT_PYTHON:-python3}")/virt-fw-vars
	[ -x "$vars_tool" ] || vars_tool=$(command -v virt-fw-vars || true)
	[ -n "$vars_tool" ] || {
		say "virt-fw-vars (PyPI virt-firmware, in the dev extras) is missing: pip install -e '.[dev]'"
		exit 1
	}
	[ -f /usr/share/OVMF/OVMF_VARS_4M.fd ] || { say "ovmf's OVMF_VARS_4M.fd is missing"; exit 1; }
	scratch=$(mktemp -d "$cache/.signed.XXXXXX")
	# Fixed serials (high bit clear, so DER adds no leading zero): modinfo's sig_key
	# for a sign-file signature is the signer's serial, so the test knows it.
	make_signer() { # name serial common-name
		openssl req -new -x509 -newkey rsa:2048 -nodes -sha256 -days 36500 \
			-set_serial "0x$2" -subj "/CN=$3/" \
			-addext "basicConstraints=critical,CA:FALSE" \
			-addext "keyUsage=digitalSignature" -addext "extendedKeyUsage=codeSigning" \
			-keyout "$scratch/$1.key" -out "$scratch/$1.pem" 2>/dev/null
		openssl x509 -in "$scratch/$1.pem" -outform DER -out "$scratch/$1.der"
		mkdir -p "$scratch/$1/opt/lib/modules/$version/extra"
		for ko in "$driver"/opt/lib/modules/"$version"/extra/*.ko; do
			out=$scratch/$1/opt/lib/modules/$version/extra/$(basename "$ko")
			"$sign_file" sha256 "$scratch/$1.key" "$scratch/$1.der" "$ko" "$out"
		done
		key=$(echo "$2" | tr a-f A-F | sed 's/../&:/g; s/:$//')
		printf '"%s": {"signer": "%s", "sig_key": "%s"}' "$1" "$3" "$key" >>"$scratch/signers.json"
	}
	printf '{' >"$scratch/signers.json"
	make_signer trusted 6b6d6f646b6974 "kmodkit test signer"
	printf ', ' >>"$scratch/signers.json"
	make_signer untrusted 756e74727573746564 "kmodkit untrusted test signer"
	printf '}\n' >>"$scratch/signers.json"
	# Secure Boot with our own platform key (PK, KEK and db): the kernel is signed
	# with it (sbsign adds our signature beside Debian's), so OVMF's Secure Boot
	# build boots it. The trusted signer is a Machine Owner Key: MokList as
	# mokutil/MokManager leave it, and MokListRT, the runtime copy shim makes at
	# each boot and the kernel reads (no shim runs here, so the store holds it).
	openssl req -new -x509 -newkey rsa:2048 -nodes -sha256 -days 36500 \
		-subj "/CN=kmodkit test platform key/" \
		-keyout "$scratch/platform.key" -out "$scratch/platform.pem" 2>/dev/null
	sbsign --key "$scratch/platform.key" --cert "$scratch/platform.pem" \
		--output "$scratch/vmlinuz" "$cache/image/boot/vmlinuz-$version" >&2 2>&1
	owner=6b6d6f64-6b69-7400-0000-000000000001
	"$vars_tool" -i /usr/share/OVMF/OVMF_VARS_4M.fd --set-pk "$owner" "$scratch/platform.pem" \
		--add-kek "$owner" "$scratch/platform.pem" --add-db "$owner" "$scratch/platform.pem" \
		--add-mok "$owner" "$scratch/trusted.pem" --secure-boot \
		--output-json "$scratch/vars.json" -o "$scratch/vars-mok.fd" >&2 2>&1
	"${KMODKIT_PYTHON:-python3}" - "$scratch/vars.json" "$scratch/moklist-rt.json" <<-'EOF'
		import json, sys
		variables = json.load(open(sys.argv[1]))["variables"]
		mok = next(v for v in variables if v["name"] == "MokList")
		runtime = 0x7  # non-volatile, boot services, runtime: the kernel reads it
		copy = {"name": "MokListRT", "guid": mok["guid"], "attr": runtime, "data": mok["data"]}
		json.dump({"version": 2, "variables": [copy]}, open(sys.argv[2], "w"))
	EOF
	"$vars_tool" -i "$scratch/vars-mok.fd" --set-json "$scratch/moklist-rt.json" \
		-o "$scratch/OVMF_VARS.fd" >&2 2>&1
	rm -f "$scratch/vars-mok.fd" "$scratch/vars.json" "$scratch/moklist-rt.json"
	chmod 0755 "$scratch"
	publish "$scratch" "$signed"
fi

init_hash=$(cat "$here/vm_init.sh" | md5sum | cut -c1-16)
initramfs=$cache/initramfs-$init_hash.cpio.gz
if [ ! -f "$initramfs" ]; then
	say "building the initramfs"
	scratch=$(mktemp -d "$cache/.initramfs.XXXXXX")
	root=$scratch/root
	mkdir -p "$root/bin" "$root/proc" "$root/sys" "$root/dev" "$root/host" "$root/modules" \
		"$root/lib/modules/$version" "$root/tmp" "$root/run" "$root/var/lib"
	cp "$(command -v busybox)" "$root/bin/busybox"
	cp "$here/vm_init.sh" "$root/init"
	chmod 0755 "$root/init"
	cp "$cache/image/lib/modules/$version/modules.builtin" "$root/lib/modules/$version/"
	# What the VM needs to mount this machine's root: virtio-pci and 9p, with
	# their dependencies in load order (modprobe prints them as insmod lines).
	modprobe -a -d "$cache/image" -S "$version" --show-depends virtio_pci 9pnet_virtio 9p |
		awk '$1 == "insmod" { print $2 }' | while read -r ko; do
			name=$(basename "$ko")
			if ! grep -qx "/modules/$name" "$root/modules.load" 2>/dev/null; then
				cp "$ko" "$root/modules/$name"
				echo "/modules/$name" >>"$root/modules.load"
			fi
		done
	(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) >"$scratch/initramfs.cpio.gz"
	mv "$scratch/initramfs.cpio.gz" "$initramfs"
	rm -rf "$scratch"
fi

ln -sfn "$(basename "$signed")" "$cache/signed"
ln -sfn "$(basename "$initramfs")" "$cache/initramfs.cpio.gz"
echo "$cache"
