"""A private network for tests: a /24 on a bridge in this namespace, and one network
namespace per node, joined to the bridge by a veth pair. Root only (``ip netns``).

Names carry this process's pid (interfaces stay under Linux's 15 characters); ``close()``
deletes every namespace, link and address it made, whatever state the test left. The /24
is picked from 10.0.0.0/8 so that it overlaps no route of this machine.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import shutil
import subprocess
from collections.abc import Sequence


def available() -> str | None:
    """Why a private network cannot be made here (``None``: it can)."""
    if os.geteuid() != 0:
        return "needs root (ip netns)"
    if shutil.which("ip") is None:
        return "needs iproute2 (ip)"
    probe = f"jreprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def _free_subnet() -> ipaddress.IPv4Network:
    routes = _ip("-4", "route", "show", "table", "all").stdout.split()
    used = []
    for word in routes:
        try:
            used.append(ipaddress.ip_network(word, strict=False))
        except ValueError:
            continue
    rng = random.Random(os.getpid())
    for _ in range(200):
        net = ipaddress.ip_network(f"10.{rng.randrange(1, 255)}.{rng.randrange(0, 255)}.0/24")
        if not any(isinstance(u, ipaddress.IPv4Network) and net.overlaps(u) for u in used):
            return net
    raise RuntimeError("no free /24 in 10.0.0.0/8")


class PrivateNet:
    """``count`` namespaces on a fresh /24: the bridge is ``.1`` (this namespace: the server
    and the scheduler), node ``i`` is ``.(10 + i)``."""

    def __init__(self, count: int) -> None:
        pid = os.getpid()
        self.subnet = _free_subnet()
        hosts = list(self.subnet.hosts())
        self.gateway = str(hosts[0])
        self.bridge = f"jrb{pid}"
        self.namespaces = [f"jre{pid}n{i}" for i in range(count)]
        self.addresses = [str(hosts[9 + i]) for i in range(count)]
        self._veths = [f"jv{pid}h{i}" for i in range(count)]
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i, ns in enumerate(self.namespaces):
                host_end, ns_end = self._veths[i], f"jv{pid}n{i}"
                _ip("netns", "add", ns)
                _ip("link", "add", host_end, "type", "veth", "peer", "name", ns_end)
                _ip("link", "set", ns_end, "netns", ns)
                _ip("link", "set", host_end, "master", self.bridge)
                _ip("link", "set", host_end, "up")
                _ip("-n", ns, "addr", "add", f"{self.addresses[i]}/24", "dev", ns_end)
                _ip("-n", ns, "link", "set", ns_end, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise

    def wrap(self, i: int) -> Sequence[str]:
        """The command prefix that runs a program in namespace ``i``."""
        return ["ip", "netns", "exec", self.namespaces[i]]

    def close(self) -> None:
        """Delete the namespaces (their interfaces and veth peers go with them), any veth
        left in this namespace, and the bridge. Processes still in a namespace are killed."""
        for ns in self.namespaces:
            pids = _ip("netns", "pids", ns, check=False).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), 9)
            _ip("netns", "del", ns, check=False)
        for veth in self._veths:
            _ip("link", "del", veth, check=False)
        _ip("link", "del", self.bridge, check=False)

    def leftovers(self) -> list[str]:
        """Names of this net's namespaces and links that still exist (tests assert none)."""
        names = set(_ip("netns", "list", check=False).stdout.split())
        links = _ip("-o", "link", "show", check=False).stdout
        left = [ns for ns in self.namespaces if ns in names]
        left += [
            name
            for name in [self.bridge, *self._veths]
            if f" {name}:" in links or f" {name}@" in links
        ]
        return left
