"""Two machines on one host: two network namespaces, each a node with its own address and its
own host name, joined by a veth pair. Needs root (ip netns) and iproute2 and util-linux.

A command runs on a node through `ip netns exec` (which also mounts /etc/netns/<ns>/hosts over
/etc/hosts, so each node resolves both names to their addresses, as on a real network) and
`unshare --uts` (its own host name: torchrun's c10d rendezvous and gloo find a node's address
from its host name). The test process reaches a node through `Node.call`: a thread that has
entered the node's network namespace, so no route or address is added to the host's own.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import shutil
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
NETNS_ETC = Path("/etc/netns")


def lacking() -> str | None:
    """What this machine lacks to make nodes, or None."""
    if os.geteuid() != 0:
        return "root (network namespaces need it)"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"the `{tool}` command (iproute2 / util-linux)"
    return None


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")


@dataclass
class Node:
    ns: str
    host: str
    address: str
    _pool: ThreadPoolExecutor | None = field(default=None, repr=False)

    def argv(self, argv: list[str]) -> list[str]:
        """`argv` run on this node: in its network namespace, under its host name."""
        return ["ip", "netns", "exec", self.ns, "unshare", "--uts", "sh", "-c",
                'hostname "$0" && exec "$@"', self.host, *argv]

    def call(self, fn: Callable[..., T], *args: Any, timeout: float = 60, **kwargs: Any) -> T:
        """fn(*args, **kwargs) in a thread of this process that lives in the node's network
        namespace: sockets it opens are the node's."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix=self.ns,
                                            initializer=_enter, initargs=(self.ns,))
        return self._pool.submit(fn, *args, **kwargs).result(timeout)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


def _enter(ns: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {ns}")
    finally:
        os.close(fd)


@contextmanager
def two_nodes(subnet: str = "10.231.7") -> Iterator[tuple[Node, Node]]:
    """Nodes `<tag>-node0` (subnet.1) and `<tag>-node1` (subnet.2) on a /24 of their own,
    removed (namespaces, link, hosts files) on exit."""
    tag = f"ast{secrets.token_hex(3)}"
    nodes = [Node(f"{tag}-{i}", f"{tag}-node{i}", f"{subnet}.{i + 1}") for i in range(2)]
    hosts = "127.0.0.1 localhost\n" + "".join(f"{n.address} {n.host}\n" for n in nodes)
    veth = [f"{tag}v{i}" for i in range(2)]
    try:
        for node in nodes:
            _ip("netns", "add", node.ns)
            (NETNS_ETC / node.ns).mkdir(parents=True, exist_ok=True)
            (NETNS_ETC / node.ns / "hosts").write_text(hosts)
        _ip("link", "add", veth[0], "type", "veth", "peer", "name", veth[1])
        for node, link in zip(nodes, veth, strict=True):
            _ip("link", "set", link, "netns", node.ns)
            _ip("-n", node.ns, "addr", "add", f"{node.address}/24", "dev", link)
            _ip("-n", node.ns, "link", "set", link, "up")
            _ip("-n", node.ns, "link", "set", "lo", "up")
        yield nodes[0], nodes[1]
    finally:
        for node in nodes:
            node.close()
            subprocess.run(["ip", "netns", "delete", node.ns], capture_output=True, timeout=30)
            shutil.rmtree(NETNS_ETC / node.ns, ignore_errors=True)
