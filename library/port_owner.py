#!/usr/bin/python
"""Ansible module: who listens on a TCP port (stdlib only)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: port_owner
short_description: Report which processes listen on a TCP port, and which systemd units own them
description:
  - Reads C(/proc/net/tcp) and C(/proc/net/tcp6) for sockets in LISTEN state on I(port), maps their
    inodes to processes through C(/proc/*/fd), and names each process's systemd service from its cgroup.
  - Read-only; safe in check mode. Used by the deploy preflight to tell "port held by the engine being
    replaced" from "port held by a stranger".
options:
  port:
    description: TCP port to look at.
    type: int
    required: true
  allowed_units:
    description:
      - Units allowed to hold the port (for example the engine units being replaced).
      - With I(fail_on_stranger), any other listener fails the task, naming it.
    type: list
    elements: str
    default: []
  fail_on_stranger:
    description: Fail when a process outside I(allowed_units) listens on the port.
    type: bool
    default: false
author:
  - LLM serving maintainers
"""

EXAMPLES = r"""
- name: Preflight | the engine port is free or held by an engine unit
  port_owner:
    port: 30000
    allowed_units: [sglang.service, vllm.service]
    fail_on_stranger: true
"""

RETURN = r"""
free:
  description: Nobody listens on the port.
  type: bool
  returned: always
listeners:
  description: Processes with a listening socket on the port.
  type: list
  elements: dict
  returned: always
  sample: [{pid: 4242, comm: python3, cmdline: "python3 -m http.server 30000", unit: null, address: "0.0.0.0"}]
strangers:
  description: The listeners that belong to none of I(allowed_units).
  type: list
  elements: dict
  returned: always
"""

import os
import socket
import struct

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.bws_systemd import unit_of_pid

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


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "port": {"type": "int", "required": True},
            "allowed_units": {"type": "list", "elements": "str", "default": []},
            "fail_on_stranger": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    port = module.params["port"]
    if not 0 < port < 65536:
        module.fail_json(msg=f"port must be between 1 and 65535, got {port}")
    listeners = processes_with_sockets(listening_inodes(port))
    strangers = [p for p in listeners if p["unit"] not in module.params["allowed_units"]]
    result = {"changed": False, "free": not listeners, "listeners": listeners, "strangers": strangers}
    if strangers and module.params["fail_on_stranger"]:
        named = "; ".join(f"pid {p['pid']} ({p['cmdline'] or p['comm']}, unit {p['unit'] or 'none'})"
                          for p in strangers)
        module.fail_json(msg=f"port {port} is taken by a process this deploy does not own: {named}. "
                             "Stop it or choose another port in the profile; nothing was changed.", **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
