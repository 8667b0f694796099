"""Run a command under the system-call sandbox of a systemd unit, as systemd builds it:
MemoryDenyWriteExecute, RestrictAddressFamilies, SystemCallFilter (the allow list, its ``~``
removals, SystemCallErrorNumber). The filters are libseccomp's, as systemd's are; system-call
groups are expanded by ``systemd-analyze syscall-filter``.

    python unit_seccomp.py deploy/umad.service -- umad --socket /tmp/x.sock
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import subprocess
import sys
from pathlib import Path

ALLOW, KILL_PROCESS = 0x7FFF0000, 0x80000000
CMP_EQ, CMP_MASKED_EQ = 4, 7
PROT_WRITE, PROT_EXEC, SHM_EXEC = 0x2, 0x4, 0o100000


def errno_action(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


class ArgCmp(ctypes.Structure):  # libseccomp's struct scmp_arg_cmp
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int)] + [
        (n, ctypes.c_uint64) for n in ("a", "b")
    ]


def libseccomp() -> ctypes.CDLL:
    lib = ctypes.CDLL("libseccomp.so.2")
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(ArgCmp)
    ]  # fmt: skip
    lib.seccomp_load.argtypes = lib.seccomp_release.argtypes = [ctypes.c_void_p]
    return lib


def directives(unit: Path) -> list[tuple[str, str]]:
    """The unit's ``Key=value`` lines in order (continuation lines joined)."""
    text = unit.read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if "=" in line and not line.startswith(("#", ";", "[")):
            key, value = line.split("=", 1)
            out.append((key.strip(), value.strip()))
    return out


def expand(name: str) -> set[str]:
    """A system call, or a group's calls (nested groups included)."""
    if not name.startswith("@"):
        return {name}
    cmd = ["systemd-analyze", "syscall-filter", name]
    lines = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()
    calls: set[str] = set()
    for line in lines[1:]:
        if line.strip() and not line.strip().startswith("#"):
            calls |= expand(line.strip())
    return calls


def allow_list(settings: list[tuple[str, str]]) -> set[str] | None:
    allowed: set[str] | None = None
    for key, value in settings:
        if key == "SystemCallFilter":
            calls = set().union(*(expand(n) for n in value.removeprefix("~").split()))
            if value.startswith("~"):
                assert allowed is not None, "a ~ list first is a deny list: not handled here"
                allowed -= calls
            else:
                allowed = (allowed or set()) | calls
    return allowed


def apply(unit: Path) -> None:
    """Load the unit's filters into this process (inherited by what it executes)."""
    lib = libseccomp()
    settings = directives(unit)
    last = dict(settings)

    def load(default: int, rules: list[tuple[int, str, tuple[tuple[int, int, int, int], ...]]]):
        ctx = lib.seccomp_init(default)
        for action, name, cmps in rules:
            nr = lib.seccomp_syscall_resolve_name(name.encode())
            if nr < 0:  # not a call of this architecture
                continue
            arr = (ArgCmp * max(len(cmps), 1))(*(ArgCmp(*c) for c in cmps))
            if lib.seccomp_rule_add_array(ctx, action, nr, len(cmps), arr) < 0:
                raise OSError(f"seccomp rule for {name}")
        if lib.seccomp_load(ctx) < 0:
            raise OSError("seccomp_load failed")
        lib.seccomp_release(ctx)

    if last.get("MemoryDenyWriteExecute") == "yes":  # systemd's rules for it
        eperm = errno_action(errno.EPERM)
        wx = (2, CMP_MASKED_EQ, PROT_WRITE | PROT_EXEC, PROT_WRITE | PROT_EXEC)
        x = (2, CMP_MASKED_EQ, PROT_EXEC, PROT_EXEC)
        shm = (2, CMP_MASKED_EQ, SHM_EXEC, SHM_EXEC)
        rules = [(eperm, "mmap", (wx,)), (eperm, "mprotect", (x,))]
        rules += [(eperm, "pkey_mprotect", (x,)), (eperm, "shmat", (shm,))]
        load(ALLOW, rules)
    if families := last.get("RestrictAddressFamilies"):
        keep = {getattr(socket, f) for f in families.split()}
        refuse = errno_action(errno.EAFNOSUPPORT)
        others = [f for f in range(1, 46) if f not in keep]  # AF_MAX is 46
        load(ALLOW, [(refuse, "socket", ((0, CMP_EQ, f, 0),)) for f in others])
    if (allowed := allow_list(settings)) is not None:  # last: it does not allow seccomp()
        code = last.get("SystemCallErrorNumber")
        default = errno_action(getattr(errno, code)) if code else KILL_PROCESS
        load(default, [(ALLOW, name, ()) for name in sorted(allowed)])


if __name__ == "__main__":
    split = sys.argv.index("--")
    apply(Path(sys.argv[1]))
    os.execvp(sys.argv[split + 1], sys.argv[split + 1 :])
