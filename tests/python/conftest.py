# SPDX-License-Identifier: GPL-2.0
"""Shared fixtures of the Python suites, and the kselftest totals line that
scripts/run-tests counts.

The suites run against whatever backend tshm picks: the memfd fallback on
the host (make check sets TSHM_BACKEND=memfd), the module in the VM.
"""

import gc
import os
import re
import signal
import time

import pytest

import tshm

IN_VM = "TSHM_MODULE" in os.environ  # set by scripts/vm-run

# A shell starts its background jobs with SIGINT ignored, and an ignored
# signal stays ignored across exec: the Ctrl-C tests need it as a
# terminal delivers it, here and in the processes they start.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def backend():
    return tshm.default_context().backend


def memfd_fds():
    """Our open fds that are memfds (the fallback's segments and rings)."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:"):
                n += 1
        except OSError:
            pass
    return n


def proc_tshm_ids():
    """Ids of the live segments /proc/tshm lists (module backend)."""
    with open("/proc/tshm") as f:
        return {int(m.group(1)) for m in
                (re.match(r"\s*(\d+)\s", line) for line in f) if m}


def shmem_kb():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Shmem:"):
                return int(line.split()[1])
    raise RuntimeError("no Shmem in /proc/meminfo")


def settle(check, timeout=10.0):
    """Poll check() (collecting garbage first) until it is true."""
    deadline = time.monotonic() + timeout
    while True:
        gc.collect()
        if check():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


@pytest.fixture
def kmod_only():
    if backend() != "kmod":
        pytest.skip("needs the tshm module (/dev/tshm); this run is memfd")


def pytest_report_header(config):
    return f"tshm backend: {backend()}"


def pytest_terminal_summary(terminalreporter):
    stats = terminalreporter.stats
    count = {k: len(stats.get(k, ())) for k in
             ("passed", "failed", "skipped", "error", "xfailed", "xpassed")}
    terminalreporter.write_line(
        "# Totals: pass:{passed} fail:{failed} xfail:{xfailed} "
        "xpass:{xpassed} skip:{skipped} error:{error}".format(**count))
