"""A cluster simulated with Linux network namespaces (root only).

Each simulated node gets its own namespace with one veth interface; the other
ends sit on a bridge in a dedicated "switch" namespace, so nothing is added to
the host's network.  Addresses come from 198.18.0.0/24 (RFC 2544's range for
benchmarks), used only inside these namespaces.  With a link rate, a tbf qdisc
caps both directions of every node's link (node side: what it sends; switch
side: what it receives).  Intra-node traffic (shared memory, loopback) is not
capped.  Reduction servers (``servers``) are hosts like the nodes: a namespace
each, a link of the same rate, the addresses after the nodes'.

Everything lives inside the namespaces, so deleting them removes it all.
Names carry the launcher's pid (``fairring-bench-<pid>-sw``, ``-n<i>``,
``-s<j>``), and ``cleanup_leftovers()`` removes those whose launcher is gone.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import List, Optional

PREFIX = "fairring-bench-"
NODE_IF = "fbr0"  # the node's interface, inside its namespace
SUBNET = "198.18.0"
MAX_NODES = 200
# Nodes and servers together (their addresses .1 to .250 of the /24).
MAX_HOSTS = 250


class NetnsError(RuntimeError):
    pass


def check_usable(link_rate: bool = False) -> None:
    """Raise NetnsError with the reason when namespaces cannot be used here."""
    if os.geteuid() != 0:
        raise NetnsError("--netns needs root (it creates network namespaces, veth links and tc qdiscs); "
                         "run as root, or drop --netns to simulate nodes on the host's loopback")
    for tool in ["ip"] + (["tc"] if link_rate else []):
        if shutil.which(tool) is None:
            raise NetnsError(f"--netns needs the '{tool}' command (Debian: apt-get install iproute2)")


def _run(cmd: List[str]) -> None:
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        raise NetnsError(f"command failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout.strip()}")


def list_namespaces() -> List[str]:
    r = subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def ours(names: List[str], pid: Optional[int] = None) -> List[str]:
    """The namespaces among ``names`` that a benchmark created (of one pid if given)."""
    pat = re.compile(re.escape(PREFIX) + r"(\d+)-")
    out = []
    for n in names:
        m = pat.match(n)
        if m and (pid is None or int(m.group(1)) == pid):
            out.append(n)
    return out


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_leftovers(include_live: bool = False) -> List[str]:
    """Delete benchmark namespaces whose launcher no longer runs (all of them
    with include_live).  Returns the names deleted."""
    removed = []
    for name in ours(list_namespaces()):
        pid = int(name[len(PREFIX):].split("-")[0])
        if include_live or not _pid_alive(pid):
            subprocess.run(["ip", "netns", "del", name], stderr=subprocess.DEVNULL)
            removed.append(name)
    return removed


def tbf_args(rate_bytes_per_s: float) -> List[str]:
    """tbf settings for a link of the given rate: the bucket holds 1 ms of
    traffic (at least 64 KiB, the largest GSO packet veth hands over), so short
    bursts cannot beat the rate by more than that; up to 100 ms may queue."""
    burst = max(int(rate_bytes_per_s / 1000), 64 * 1024)
    return ["tbf", "rate", f"{int(rate_bytes_per_s * 8)}bit", "burst", str(burst), "latency", "100ms"]


class Cluster:
    """``with Cluster(nodes, rate) as c:`` creates the namespaces and links,
    and deletes them on exit, whatever happened.  ``servers``: that many more
    hosts for reduction servers (server j: ``server_ns[j]``, ``server_address(j)``)."""

    ifname = NODE_IF  # every host's link, inside its namespace

    def __init__(self, nodes: int, link_rate_bytes_per_s: Optional[float] = None, pid: Optional[int] = None,
                 servers: int = 0):
        if not 1 <= nodes <= MAX_NODES:
            raise NetnsError(f"--netns supports 1 to {MAX_NODES} nodes, got {nodes}")
        if servers < 0 or nodes + servers > MAX_HOSTS:
            raise NetnsError(f"--netns supports up to {MAX_HOSTS} nodes and servers together, got {nodes} + {servers}")
        self.nodes = nodes
        self.rate = link_rate_bytes_per_s
        tag = f"{PREFIX}{pid if pid is not None else os.getpid()}"
        self.switch = f"{tag}-sw"
        self.node_ns = [f"{tag}-n{i}" for i in range(nodes)]
        self.server_ns = [f"{tag}-s{j}" for j in range(servers)]
        self._created: List[str] = []

    def address(self, node: int) -> str:
        return f"{SUBNET}.{node + 1}"

    def server_address(self, server: int) -> str:
        return f"{SUBNET}.{self.nodes + server + 1}"

    def exec_prefix(self, node: int) -> List[str]:
        return ["ip", "netns", "exec", self.node_ns[node]]

    def server_exec_prefix(self, server: int) -> List[str]:
        return ["ip", "netns", "exec", self.server_ns[server]]

    def rank_env(self, node: int) -> dict:
        # Both Fairring and gloo must use the node's link, not the (absent)
        # address the host name resolves to.
        return {"FAIRRING_SOCKET_IFNAME": NODE_IF, "GLOO_SOCKET_IFNAME": NODE_IF}

    def create(self) -> None:
        sw = self.switch
        self._add_ns(sw)
        _run(["ip", "-n", sw, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", sw, "link", "set", "br0", "up"])
        _run(["ip", "-n", sw, "link", "set", "lo", "up"])
        for i, ns in enumerate(self.node_ns):
            self._add_host(ns, f"p{i}", self.address(i))
        for j, ns in enumerate(self.server_ns):
            self._add_host(ns, f"s{j}", self.server_address(j))

    def _add_host(self, ns: str, port: str, address: str) -> None:
        """A namespace whose NODE_IF is a port of the switch's bridge, at ``address``."""
        sw = self.switch
        self._add_ns(ns)
        # Created inside the switch namespace, the peer straight in ``ns``:
        # neither end ever exists in the machine's own namespace.
        _run(["ip", "-n", sw, "link", "add", port, "type", "veth", "peer", "name", NODE_IF, "netns", ns])
        _run(["ip", "-n", sw, "link", "set", port, "master", "br0", "up"])
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        _run(["ip", "-n", ns, "addr", "add", f"{address}/24", "dev", NODE_IF])
        _run(["ip", "-n", ns, "link", "set", NODE_IF, "up"])
        if self.rate:
            _run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", NODE_IF, "root"] + tbf_args(self.rate))
            _run(["ip", "netns", "exec", sw, "tc", "qdisc", "add", "dev", port, "root"] + tbf_args(self.rate))

    def _add_ns(self, name: str) -> None:
        _run(["ip", "netns", "add", name])
        self._created.append(name)

    def destroy(self) -> None:
        # Deleting a namespace deletes its interfaces, veth peers and qdiscs.
        for name in reversed(self._created):
            subprocess.run(["ip", "netns", "del", name], stderr=subprocess.DEVNULL)
        self._created = []

    def __enter__(self) -> "Cluster":
        try:
            self.create()
        except BaseException:
            self.destroy()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()
