"""``Loader(cpu_affinity=...)``: the loader's threads confined, the training thread not.

Read from the kernel itself: each thread's ``Cpus_allowed_list`` in ``/proc/self/task``. The
loader's threads (named ``pushdown-loader``) must run only on the CPUs given (by argument or
by ``PUSHDOWN_LOADER_CPUS``), the calling thread must keep every CPU it had, the batches must
not change, and a CPU the process may not use is refused by name.
"""

import os
import pathlib

import pytest

import pushdown
from conftest import Served, generate

ARGS = dict(sql="SELECT id, label FROM images", batch_size=16, shuffle_buffer=64, seed=3)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("affinity")
    generate(root, rows=300)
    served = Served(root)
    yield f"http://{served.addr}"
    served.stop()


def threads():
    """{thread id: (name, allowed CPUs)} of every thread of this process."""
    out = {}
    for task in pathlib.Path("/proc/self/task").iterdir():
        try:
            status = (task / "status").read_text()
        except FileNotFoundError:  # the thread ended
            continue
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        out[task.name] = (fields["Name"].strip(), fields["Cpus_allowed_list"].strip())
    return out


def loader_cpus(before):
    """The CPU lists of the loader threads started since `before` (a `threads()`)."""
    new = {t: v for t, v in threads().items() if t not in before}
    cpus = {allowed for name, allowed in new.values() if name.startswith("pushdown-loade")}
    assert cpus, f"no loader thread started: {new}"
    return cpus


def test_loader_threads_run_only_on_the_cpus_given(server):
    allowed = sorted(os.sched_getaffinity(0))
    cpu = allowed[-1]
    want = [b["id"].tolist() for b in pushdown.Loader([server], **ARGS)]
    before = threads()
    loader = pushdown.Loader([server], cpu_affinity=[cpu], **ARGS)
    got = [b["id"].tolist() for b in loader]
    assert got == want, "confining the threads never changes the batches"
    assert loader_cpus(before) == {str(cpu)}
    assert sorted(os.sched_getaffinity(0)) == allowed, "the calling thread keeps its CPUs"


def test_the_environment_names_them_too(server, monkeypatch):
    cpu = sorted(os.sched_getaffinity(0))[0]
    monkeypatch.setenv("PUSHDOWN_LOADER_CPUS", f"{cpu}-{cpu}")
    before = threads()
    loader = pushdown.Loader([server], **ARGS)
    next(iter(loader))
    assert loader_cpus(before) == {str(cpu)}
    monkeypatch.setenv("PUSHDOWN_LOADER_CPUS", "1-0")
    with pytest.raises(pushdown.InvalidArgumentError, match="PUSHDOWN_LOADER_CPUS.*backwards"):
        pushdown.Loader([server], **ARGS)


def test_a_cpu_the_process_may_not_use_is_refused(server):
    outside = max(os.sched_getaffinity(0)) + 1
    with pytest.raises(pushdown.InvalidArgumentError, match=f"CPU.*{outside}.*outside the CPUs"):
        pushdown.Loader([server], cpu_affinity=[outside], **ARGS)
    with pytest.raises(pushdown.InvalidArgumentError, match="0-3,8"):
        pushdown.Loader([server], cpu_affinity="two", **ARGS)
    assert pushdown.Loader([server], cpu_affinity="0", **ARGS) is not None
