# SPDX-License-Identifier: GPL-2.0
"""tshm.torch.spawn: a set's supervisor, and the forkserver zygote's,
hold none of the caller's memory, nor its fds, once the set runs.

The supervisor is a fork of the caller.  Before, it kept a copy-on-write
image of everything the caller had: each page the caller then wrote or
freed was held twice, for as long as the set ran, and for the zygote's
supervisor that is as long as the program.  A caller that loaded a
dataset, started a forkserver spawn and dropped the dataset kept it all;
a pipe it closed then never gave its reader end-of-file.

Each case runs in a fresh interpreter, so that the caller's memory is
known when the supervisor is forked (a zygote started by an earlier test
would not have it).  Host only: "spawn" and "forkserver" import torch in
a fresh interpreter (half a minute in the emulated VM); the library's own
test (test-spawn's supervisor_lets_go_of_caller_memory) runs in both."""

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")
from conftest import IN_VM  # noqa: E402

CALLER = textwrap.dedent("""
    import os, select, sys, time
    import torch
    import tshm.torch
    from tshm.torch import _zygote

    def _noop(rank):
        pass

    def _sleep(rank):
        time.sleep(60)

    def status_kb(pid, field):
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
        raise LookupError(f"no {field} in /proc/{pid}/status")

    if __name__ == "__main__":
        method = sys.argv[1]
        big = torch.ones(64 << 20)          # 256 MiB, every page written
        r, w = os.pipe()                    # and an fd
        ctx = None
        if method == "forkserver":
            tshm.torch.spawn(_noop, start_method="forkserver")
            worker = _zygote._zygote[1].pids()[0]
        else:
            ctx = tshm.torch.spawn(_sleep, join=False, start_method=method)
            worker = ctx.pids()[0]
        sup = status_kb(worker, "PPid")
        # It lets go just after saying the set runs: give it 10 s.  What
        # it keeps is the libraries' data: 16 MiB with Debian's torch.
        for _ in range(1000):
            anon = status_kb(sup, "RssAnon")
            if anon < 32 << 10:
                break
            time.sleep(0.01)
        os.close(w)     # its reader sees EOF unless another process has w
        eof = bool(select.select([r], [], [], 5)[0]) and os.read(r, 1) == b""
        print(status_kb(os.getpid(), "RssAnon"), anon, int(eof), flush=True)
        if ctx is not None:
            for p in ctx.processes:
                p.kill()
            ctx.processes[0].join()
""")


@pytest.mark.skipif(IN_VM, reason="host only: a fresh interpreter imports "
                    "torch (30 s in the VM)")
@pytest.mark.parametrize("method", ["spawn", "fork", "forkserver"])
def test_the_supervisor_holds_none_of_the_callers_memory(tmp_path, method):
    script = tmp_path / "caller.py"
    script.write_text(CALLER)
    out = subprocess.run([sys.executable, str(script), method],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    caller_kb, supervisor_kb, eof = map(int, out.stdout.split())
    print(f"{method}: caller RssAnon {caller_kb} kB, its set's supervisor "
          f"{supervisor_kb} kB")
    assert caller_kb > 256 << 10        # what there was to hold
    assert supervisor_kb < 32 << 10
    # "fork" workers inherit every fd, as fork()'s children do.
    assert eof == (method != "fork")
