# SPDX-License-Identifier: GPL-2.0
"""tshm.torch where torch's own strategies break (issue 14), each case
shown side by side with torch's strategy in the test output:

* a DataLoader with 4 workers and 32 MiB items under a 64 MiB /dev/shm
  (a private tmpfs in a mount namespace): torch's default strategy fails
  (1.13: a worker dies with a Bus error; 2.x: a worker's shm allocation
  is refused), tshm delivers every batch;
* a consumer with RLIMIT_NOFILE 256 keeping 5000 received tensors:
  file_descriptor runs out of fds; tshm keeps them all on the module (a
  received segment is held by its mapping, no fd);
* DataLoader workers and their consumer SIGKILLed mid-epoch, with the
  rest of the job (file_system's torch_shm_manager daemons) as an OOM
  kill of a container does: file_system leaves /dev/shm/torch_* files,
  tshm leaves nothing (/dev/shm empty; on the module /proc/tshm back to
  its baseline; in the VM Shmem too).

The scenarios run in processes of their own (torch_scenarios.py)."""

import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from conftest import IN_VM, backend, proc_tshm_ids, settle, shmem_kb  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SCENARIOS = os.path.join(HERE, "torch_scenarios.py")


def needs_unshare():
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a private /dev/shm")


def in_small_shm(script, size="64m", timeout=600):
    """Run the sh script with /dev/shm a private tmpfs of size."""
    cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c",
           f"mount -t tmpfs -o size={size} tshm-test /dev/shm && {script}"]
    return subprocess.run(cmd, cwd=HERE, capture_output=True, text=True,
                          timeout=timeout)


def show(capsys, title, text):
    with capsys.disabled():
        print(f"\n--- {title} ---\n{text.rstrip()}", flush=True)


def summary(out):
    return "\n".join(line for line in out.splitlines()
                     if line.startswith(("file_", "tshm", "ERROR", "left")))


def test_dataloader_64mib_dev_shm(capsys):
    needs_unshare()
    py = sys.executable
    # 4 workers x 32 MiB in flight is twice /dev/shm already; the
    # emulated VM copies slowly, so fewer items there.
    n = 6 if IN_VM else 16
    r = in_small_shm(f"{py} {SCENARIOS} dataloader file_descriptor {n}; "
                     f"echo status=$?; "
                     f"{py} {SCENARIOS} dataloader tshm {n}; echo status=$?")
    out = r.stdout + r.stderr
    show(capsys, "DataLoader, 4 workers, 32 MiB items, /dev/shm 64 MiB",
         summary(out))
    assert "file_descriptor: failed" in out
    # torch 1.13's worker dies of SIGBUS as it writes the full tmpfs;
    # torch 2.x allocates the file's blocks first and raises instead.
    assert ("bus error" in out.lower() or "exited unexpectedly" in out or
            "unable to allocate shared memory" in out), out
    assert f"tshm: delivered {n} of {n} batches intact" in out
    assert out.count("status=") == 2 and "status=0" in out.split(
        "tshm:")[-1]


def test_keep_5000_tensors_with_256_fds(capsys):
    py = sys.executable
    torch_run = subprocess.run([py, SCENARIOS, "keep", "file_descriptor",
                                "5000"], cwd=HERE, capture_output=True,
                               text=True, timeout=600)
    tshm_run = None
    if backend() == "kmod":
        tshm_run = subprocess.run([py, SCENARIOS, "keep", "tshm", "5000"],
                                  cwd=HERE, capture_output=True, text=True,
                                  timeout=600)
    show(capsys, "keep 5000 received tensors with RLIMIT_NOFILE 256",
         summary(torch_run.stdout) + "\n" +
         (summary(tshm_run.stdout) if tshm_run else
          "tshm: (memfd backend: a received segment costs fds; the "
          "module's case runs in the VM)"))
    assert torch_run.returncode != 0 and "file_descriptor: failed" in \
        torch_run.stdout
    if tshm_run is None:
        pytest.skip("tshm's half needs the module (/dev/tshm); this run "
                    "is memfd, where every received segment holds an fd")
    assert tshm_run.returncode == 0, tshm_run.stdout + tshm_run.stderr
    assert "tshm: kept 5000 tensors, 0 corrupt" in tshm_run.stdout


# The scenario's output goes to a dot file in the private tmpfs: writable
# wherever the test runs (the VM's / is read-only), and out of ls's view.
KILL = """
out=/dev/shm/.tshm-kill-out
{py} {scenarios} killed {strategy} > $out 2>&1 &
pid=$!
i=0
until grep -q ready $out; do
    i=$((i + 1)); [ $i -gt 3000 ] && {{ cat $out; exit 3; }}
    kill -0 $pid 2>/dev/null || {{ cat $out; exit 4; }}
    sleep 0.1
done
# The whole job dies at once, as in an OOM kill of its container: the
# process group and file_system's cleanup daemons (torch_shm_manager, in
# sessions of their own) in this mount namespace.
ns=$(readlink /proc/self/ns/mnt)
managers=
for d in /proc/[0-9]*; do
    [ "$(readlink $d/ns/mnt 2>/dev/null)" = "$ns" ] || continue
    # comm holds 15 characters of "torch_shm_manager"
    [ "$(cat $d/comm 2>/dev/null)" = torch_shm_manag ] && \
        managers="$managers ${{d#/proc/}}"
done
kill -KILL -$pid $managers
wait $pid
sleep 2
rm -f $out
echo "left in /dev/shm: $(ls /dev/shm | tr '\\n' ' ')"
"""


def run_killed(strategy):
    r = in_small_shm(KILL.format(py=sys.executable, scenarios=SCENARIOS,
                                 strategy=strategy),
                     size="1g")
    assert r.returncode == 0, r.stdout + r.stderr
    line = [x for x in r.stdout.splitlines() if x.startswith("left in")]
    assert line, r.stdout + r.stderr
    return line[-1].split(":", 1)[1].split()


def test_sigkilled_dataloader_leaves_nothing(capsys):
    needs_unshare()
    base_ids = proc_tshm_ids() if backend() == "kmod" else set()
    base_shmem = shmem_kb() if IN_VM else None
    leaked = run_killed("file_system")
    left = run_killed("tshm")
    text = (f"file_system: {len(leaked)} files left in /dev/shm "
            f"{leaked[:3]}\ntshm: {len(left)} files left in /dev/shm")
    if backend() == "kmod":
        ok = settle(lambda: proc_tshm_ids() <= base_ids)
        text += f"\ntshm: /proc/tshm back to baseline: {ok}"
    show(capsys, "DataLoader workers and consumer SIGKILLed mid-epoch",
         text)
    if not IN_VM:
        # In the VM file_system left nothing in the one run made there
        # (why is not known yet); the host shows the leak.
        assert any(f.startswith("torch_") for f in leaked), leaked
    assert left == []
    if backend() == "kmod":
        assert ok, f"segments left: {proc_tshm_ids() - base_ids}"
    if IN_VM:
        # file_system's leak went away with the private tmpfs; tshm's
        # memory never was in it.
        assert settle(lambda: shmem_kb() <= base_shmem), \
            f"Shmem {shmem_kb()} kB, baseline {base_shmem} kB"
