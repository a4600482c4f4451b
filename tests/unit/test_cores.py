"""evalq.workers.cores: the CPUs of a gpu worker's idle processes lent to the ones scoring, with
real processes sharing the table. A prefork pool's children inherit it by forking; here they are
spawned and handed it (a fork of pytest-xdist's worker, which has threads, can hang in the child)."""

import multiprocessing
import os
import signal
import time

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture
def shared(monkeypatch):
    from evalq.workers import cores

    monkeypatch.setenv("EVALQ_GPU_CPUS", "4")  # as gpu_environment sets them for two processes on 4 CPUs
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setattr(cores, "_table", None)
    monkeypatch.setattr(cores, "_threads", [])
    monkeypatch.setattr(cores, "_said", set())
    before = torch.get_num_threads()
    yield cores
    torch.set_num_threads(before)


def _score_until_stopped(table, started, stop) -> None:
    from evalq.workers import cores

    cores._table = table
    with cores.scoring():
        started.set()
        stop.wait(60)


def _sibling(ctx, cores):
    """A process of the same pool that scores until told to stop: (process, stop event)."""
    started, stop = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_score_until_stopped, args=(cores._table, started, stop), daemon=True)
    proc.start()
    assert started.wait(60)
    return proc, stop


def test_a_process_scoring_alone_gets_the_idle_ones_cpus(shared):
    cores = shared
    cores.prepare(2)
    assert len(cores._table) == 8  # room for replacements of processes that die
    ctx = multiprocessing.get_context("spawn")
    cores._table = ctx.Array("i", 8)  # the same table, of the context its processes start in here
    with cores.scoring():
        torch.set_num_threads(3)
        cores.fit("cuda")  # a GPU's threads are not the CPU's to share
        assert torch.get_num_threads() == 3
        cores.fit("cpu")
        assert (cores.busy(), torch.get_num_threads()) == (1, 4)  # the other is idle: every CPU
        sibling, stop = _sibling(ctx, cores)
        cores.fit("cpu")
        assert (cores.busy(), torch.get_num_threads()) == (2, 2)  # both scoring: its own share
        stop.set()
        sibling.join(30)
        cores.fit("cpu")
        assert (cores.busy(), torch.get_num_threads()) == (1, 4)
        # one killed while scoring (its slot still says so) counts no more, reaped or not yet
        sibling, _ = _sibling(ctx, cores)
        assert cores.busy() == 2
        os.kill(sibling.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while open(f"/proc/{sibling.pid}/stat").read().rsplit(")", 1)[-1].split()[0] != "Z":
            assert time.monotonic() < deadline, "the killed process never became a zombie"
            time.sleep(0.01)
        assert cores.busy() == 1  # a zombie
        sibling.join(30)
        assert cores.busy() == 1
        # and its slot goes to the process that replaces it
        replacement, stop = _sibling(ctx, cores)
        assert cores.busy() == 2
        stop.set()
        replacement.join(30)
    assert cores.busy() == 1  # this one, asking, counts itself


def test_an_operators_thread_setting_is_kept(shared, monkeypatch):
    cores = shared
    monkeypatch.delenv("EVALQ_GPU_CPUS")  # gpu_environment left OMP_NUM_THREADS as the operator set it
    cores.prepare(2)
    torch.set_num_threads(3)
    with cores.scoring():
        cores.fit("cpu")
    assert cores._table is None and torch.get_num_threads() == 3
    monkeypatch.setenv("EVALQ_GPU_CPUS", "4")
    cores.prepare(1)  # one process: nothing to lend
    assert cores._table is None
