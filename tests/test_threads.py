"""The default thread count leaves out cores that other processes keep busy; an explicit count wins."""

from __future__ import annotations

import os

import pytest
import torch

from medattn import threads


@pytest.fixture
def machine(monkeypatch):
    """Pretend to run on ``cores`` cores with a 1-minute load average ``load``."""

    def set_up(cores: int, load: float, local_world_size: int | None = None) -> None:
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
        monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
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


def test_decided_once_per_process(machine, monkeypatch):
    machine(2, 0.0)
    assert threads.default_threads()[0] == 2
    monkeypatch.setattr(os, "getloadavg", lambda: (5.0, 5.0, 5.0))  # our own work raises the load later
    assert threads.default_threads()[0] == 2
