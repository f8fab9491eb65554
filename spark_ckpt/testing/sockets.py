"""The addresses a TCP port listens on, as the kernel's socket tables say (Linux
``/proc/net/tcp`` and ``/proc/net/tcp6``): for tests that check what a server exposes,
independently of the server's own report."""

from __future__ import annotations

import ipaddress
from pathlib import Path

#: The socket state of a listening socket in ``/proc/net/tcp*``.
_LISTEN = "0A"


def _address(hex_address: str) -> str:
    """An address of ``/proc/net/tcp*`` (each 32-bit word in the host's little-endian order)
    as text; an IPv4-mapped IPv6 address as its IPv4 address."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    if len(words) == 4:
        return str(ipaddress.IPv4Address(words))
    address = ipaddress.IPv6Address(words)
    return str(address.ipv4_mapped or address)


def listening_addresses(port: int, tables: tuple[str, ...] = ("tcp", "tcp6")) -> set[str]:
    """The local addresses sockets listen on at TCP *port* (``0.0.0.0`` or ``::``: every
    interface). Empty when nothing listens there."""
    found: set[str] = set()
    for name in tables:
        path = Path("/proc/net") / name
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            local, state = fields[1], fields[3]
            address, _, hex_port = local.partition(":")
            if state == _LISTEN and int(hex_port, 16) == port:
                found.add(_address(address))
    return found
