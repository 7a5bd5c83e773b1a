#!/usr/bin/python3
"""A CNI plugin, chained after the bridge on the real node: in each pod's network
namespace, TCP to 127.0.0.1:<port> goes to <to> (the registry's guestfwd address).

The registry's address is 127.0.0.1:<port> on this machine and in the VM's own
namespace, and its certificate names 127.0.0.1; a pod has a loopback of its own, so
without this a build Job could not pull or push where the kubelet pulls. Every
pod then reaches the registry at the one address everything else uses, as in a
cluster whose registry has a name. It reads the network configuration on stdin
(CNI spec 1.0) and passes the previous plugin's result on unchanged.
"""

import json
import os
import subprocess
import sys


def main() -> int:
    conf = json.load(sys.stdin)
    if os.environ.get("CNI_COMMAND") == "VERSION":
        print(json.dumps({"cniVersion": "1.0.0", "supportedVersions": ["1.0.0"]}))
        return 0
    if os.environ.get("CNI_COMMAND") == "ADD":
        port, to = str(conf["port"]), conf["to"]
        host = to.rsplit(":", 1)[0]
        net = ["nsenter", f"--net={os.environ['CNI_NETNS']}"]
        for cmd in (
            # Loopback addresses may be routed out once DNAT has rewritten them.
            ["sysctl", "-qw", "net.ipv4.conf.all.route_localnet=1"],
            ["iptables", "-t", "nat", "-A", "OUTPUT", "-d", "127.0.0.1/32", "-p", "tcp",
             "--dport", port, "-j", "DNAT", "--to-destination", to],
            ["iptables", "-t", "nat", "-A", "POSTROUTING", "-d", f"{host}/32", "-p", "tcp",
             "-j", "MASQUERADE"],
        ):  # fmt: skip
            done = subprocess.run([*net, *cmd], capture_output=True, text=True, check=False)
            if done.returncode != 0:
                msg = f"{' '.join(cmd)}: {done.stderr.strip()}"
                print(json.dumps({"cniVersion": "1.0.0", "code": 999, "msg": msg}))
                return 1
    # ADD passes the result on; DEL and CHECK have nothing to undo (the namespace goes).
    print(json.dumps(conf.get("prevResult") or {"cniVersion": conf.get("cniVersion")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
