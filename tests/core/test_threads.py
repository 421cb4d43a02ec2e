"""The default thread count leaves out cores that other processes keep busy; an explicit count wins."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from medattn import threads


@pytest.fixture
def machine(monkeypatch):
    """Pretend to run on ``cores`` cores with a 1-minute load average ``load``."""

    def set_up(cores: int, load: float, local_world_size: int | None = None) -> None:
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
        monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        if local_world_size is None:
            monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
        else:
            monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_world_size))
        threads.default_threads.cache_clear()

    yield set_up
    threads.default_threads.cache_clear()


@pytest.mark.parametrize("cores, load, ranks, expected", [
    (2, 0.1, None, 2),   # a quiet machine: every core
    (2, 1.2, None, 1),   # another process holds a core: do not oversubscribe
    (2, 9.0, None, 1),   # always at least one
    (8, 2.6, None, 5),   # three cores busy (rounded)
    (4, 0.0, 2, 2),      # torchrun with two processes on this machine share the cores
])
def test_default_threads(machine, cores, load, ranks, expected):
    machine(cores, load, ranks)
    count, note = threads.default_threads()
    assert count == expected
    assert (note is None) == (count == cores // (ranks or 1))
    if note:
        assert f"load average {load:.1f}" in note


def test_explicit_count_wins_and_is_applied(machine):
    machine(2, 1.5)
    before = torch.get_num_threads()
    notes = []
    try:
        assert threads.set_threads(2, notes.append) == 2 and torch.get_num_threads() == 2 and not notes
        assert threads.set_threads(None, notes.append) == 1 and torch.get_num_threads() == 1
        assert len(notes) == 1 and "oversubscribe" in notes[0]
    finally:
        torch.set_num_threads(before)


def test_omp_num_threads_is_the_user_s_setting(machine, monkeypatch):
    """docs use ``OMP_NUM_THREADS=1`` to pin one thread: it holds on a quiet machine too (explicit counts still win)."""
    machine(2, 0.0)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    threads.default_threads.cache_clear()
    assert threads.default_threads() == (1, None)
    monkeypatch.setenv("OMP_NUM_THREADS", "garbage")
    threads.default_threads.cache_clear()
    assert threads.default_threads()[0] == 2


def test_decided_once_per_process(machine, monkeypatch):
    machine(2, 0.0)
    assert threads.default_threads()[0] == 2
    monkeypatch.setattr(os, "getloadavg", lambda: (5.0, 5.0, 5.0))  # our own work raises the load later
    assert threads.default_threads()[0] == 2


def test_the_count_holds_in_a_fresh_process_where_numba_starts_its_threads():
    """Numba's OpenMP threading layer, started on first use, set the process's OpenMP count to NUMBA_NUM_THREADS
    under torch's: the first training run of a process ran on 2 threads with ``train.threads=1``."""
    script = ("import numba\nimport torch\nfrom medattn.threads import set_threads\n"  # numba: as the models load it
              "torch.randn(100_000).sum()\n"  # torch's OpenMP runtime already in use, as after loading the data
              "set_threads(1)\nprint(torch.get_num_threads())\n")
    env = {**os.environ, "NUMBA_NUM_THREADS": "2", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1"]
