"""``RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6`` as systemd applies it, for a child: a
seccomp filter (built with gcc at test time) that makes ``socket(AF_NETLINK, ...)`` fail with
``EAFNOSUPPORT``, then ``execv`` of the command."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

_SOURCE = r"""
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <unistd.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>

int main(int argc, char **argv) {
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_socket, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AF_NETLINK, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EAFNOSUPPORT & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog program = {sizeof filter / sizeof filter[0], filter};
    if (argc < 2) return 2;
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program)) {
        perror("seccomp");
        return 126;
    }
    execv(argv[1], argv + 1);
    perror("execv");
    return 127;
}
"""


def build(folder: Path) -> Path:
    """The helper, compiled into ``folder``; skips without gcc or off x86-64."""
    import platform

    if shutil.which("gcc") is None or platform.machine() != "x86_64":
        pytest.skip("needs gcc on x86-64 for the seccomp helper")
    source = folder / "restrict_families.c"
    source.write_text(_SOURCE)
    binary = folder / "restrict-families"
    subprocess.run(
        ["gcc", "-O2", "-o", str(binary), str(source)], check=True, capture_output=True, timeout=60
    )
    return binary
