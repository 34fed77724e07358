"""Who listens on a TCP port, and which systemd unit owns it (stdlib only; runs on the target)."""

from __future__ import annotations

import os
import socket
import struct

from ansible_collections.blackwell.serving.plugins.module_utils.host.systemd import unit_of_pid

LISTEN_STATE = "0A"


def decode_address(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, struct.pack("<I", int(hex_address, 16)))
    words = struct.unpack("<4I", raw)
    return socket.inet_ntop(socket.AF_INET6, struct.pack(">4I", *words))


def listening_inodes(port: int, proc_root: str = "/proc") -> dict[int, str]:
    """Map socket inode -> local address for LISTEN sockets on the port."""
    inodes: dict[int, str] = {}
    for table in ("tcp", "tcp6"):
        try:
            with open(f"{proc_root}/net/{table}", encoding="ascii") as handle:
                rows = handle.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            address, port_hex = fields[1].split(":")
            if fields[3] == LISTEN_STATE and int(port_hex, 16) == port:
                inodes[int(fields[9])] = decode_address(address)
    return inodes


def processes_with_sockets(inodes: dict[int, str], proc_root: str = "/proc") -> list[dict]:
    wanted = {f"socket:[{inode}]": address for inode, address in inodes.items()}
    found = []
    for entry in os.listdir(proc_root):
        if not entry.isdigit():
            continue
        fd_dir = f"{proc_root}/{entry}/fd"
        try:
            targets = {os.readlink(f"{fd_dir}/{fd}") for fd in os.listdir(fd_dir)}
        except OSError:
            continue
        for target in targets & set(wanted):
            found.append(describe(int(entry), wanted[target], proc_root))
            break
    return sorted(found, key=lambda p: p["pid"])


def describe(pid: int, address: str, proc_root: str) -> dict:
    def read(name: str) -> str:
        try:
            with open(f"{proc_root}/{pid}/{name}", "rb") as handle:
                return handle.read().decode(errors="replace")
        except OSError:
            return ""

    return {"pid": pid, "comm": read("comm").strip(), "address": address,
            "cmdline": read("cmdline").replace("\0", " ").strip(), "unit": unit_of_pid(pid, proc_root)}


def port_report(port: int, allowed_units: list[str]) -> dict:
    """{free, listeners, strangers}: strangers are the listeners that belong to none of allowed_units."""
    if not 0 < port < 65536:
        raise ValueError(f"port must be between 1 and 65535, got {port}")
    listeners = processes_with_sockets(listening_inodes(port))
    strangers = [p for p in listeners if p["unit"] not in allowed_units]
    return {"free": not listeners, "listeners": listeners, "strangers": strangers}


def stranger_message(port: int, strangers: list[dict]) -> str:
    named = "; ".join(f"pid {p['pid']} ({p['cmdline'] or p['comm']}, unit {p['unit'] or 'none'})" for p in strangers)
    return (f"port {port} is taken by a process this deploy does not own: {named}. "
            "Stop it or choose another port in the profile; nothing was changed.")
