"""glibc malloc settings (medattn.allocator): chosen from the environment, honouring the user's, and acting.

The acting tests count page faults of a repeated 64 MiB elementwise op in a fresh process: with glibc's
defaults every repetition maps and faults its result in again (16,384 pages of 4 KiB); with freed memory
kept for reuse the heap grows for the first few (posix_memalign's request is a little larger than the block
just freed) and then the repetitions reuse its pages: the least faults of the last four is counted.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from medattn import allocator

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc malloc settings")

FAULTS_OF_REPEATS = """
import resource, sys, torch
{setup}
x = torch.randn(4096, 4096)  # 64 MiB: above glibc's largest mmap threshold (32 MiB)
faults = []
for _ in range(16):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    y = x * 2
    del y
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(min(faults[-4:]))
"""


def _faults(env: dict, setup: str = "") -> int:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k not in ("GLIBC_TUNABLES",
                                                                                              "LD_PRELOAD")}
    done = subprocess.run([sys.executable, "-c", FAULTS_OF_REPEATS.format(setup=setup)], capture_output=True,
                          text=True, timeout=120, env={**clean, **env})
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


@pytest.fixture
def clean_env(monkeypatch):
    for name in [n for n in os.environ if n.startswith("MALLOC_")] + ["GLIBC_TUNABLES", "LD_PRELOAD",
                                                                      allocator.MODE_VARIABLE]:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@glibc_only
def test_startup_tunables_follow_the_mode(clean_env):
    reuse = allocator.startup_tunables()
    assert reuse.split(":") == ["glibc.malloc.hugetlb=1", "glibc.malloc.mmap_max=0",
                                f"glibc.malloc.trim_threshold={1 << 40}"]
    assert allocator.startup_tunables("hugepages") == "glibc.malloc.hugetlb=1"
    clean_env.setenv(allocator.MODE_VARIABLE, "hugepages")
    assert allocator.startup_tunables() == "glibc.malloc.hugetlb=1"
    clean_env.setenv(allocator.MODE_VARIABLE, "reuse")  # the user's mode wins over a command's default
    assert allocator.startup_tunables("hugepages") == reuse
    clean_env.setenv(allocator.MODE_VARIABLE, "default")
    assert allocator.startup_tunables() is None
    clean_env.setenv(allocator.MODE_VARIABLE, "fast")
    with pytest.raises(ValueError, match="reuse, hugepages, default"):
        allocator.startup_tunables()


@glibc_only
def test_tunables_already_set_or_the_users_own_are_left_alone(clean_env):
    clean_env.setenv("GLIBC_TUNABLES", "glibc.rtld.optional_static_tls=2048")  # not malloc's: kept and extended
    assert allocator.startup_tunables().startswith("glibc.rtld.optional_static_tls=2048:glibc.malloc.hugetlb=1:")
    clean_env.setenv("GLIBC_TUNABLES", allocator.startup_tunables())
    assert allocator.startup_tunables() is None  # the restarted process does not restart again
    for name, value in (("GLIBC_TUNABLES", "glibc.malloc.arena_max=2"), ("MALLOC_ARENA_MAX", "2"),
                        ("LD_PRELOAD", "/usr/lib/libjemalloc.so.2")):
        clean_env.delenv("GLIBC_TUNABLES", raising=False)
        clean_env.setenv(name, value)
        assert allocator.user_allocator_settings() is not None
        assert allocator.startup_tunables() is None
        assert "jemalloc" in allocator.describe() or "user's settings" in allocator.describe()
        clean_env.delenv(name)


@glibc_only
def test_entry_restarts_once_with_the_tunables_for_commands_that_compute(clean_env):
    """The console entry re-executes itself with its mode's tunables, reuse for the commands that train and huge
    pages for those that only run models (execv recorded instead of run)."""
    script = ("import os, sys\nsys.argv = ['medattn', {command}]\n"
              "os.execv = lambda path, args: (print('RESTART', os.environ['GLIBC_TUNABLES'], args[1:]), sys.exit(0))\n"
              "from medattn.cli import entry\nentry()\n")
    cases = (("'train', 'x'", "reuse"), ("'bench', 'scaling'", "reuse"), ("'predict', 'x'", "hugepages"),
             ("'models'", None), ("'train', '--help'", None))
    for command, mode in cases:
        done = subprocess.run([sys.executable, "-c", script.format(command=command)], capture_output=True, text=True,
                              timeout=60, env=dict(os.environ))
        restarted = done.stdout.split()[1] if done.stdout.startswith("RESTART") else None
        assert restarted == (":".join(allocator.TUNABLES[mode]) if mode else None), done.stdout + done.stderr
        if mode:
            assert f"['-m', 'medattn', {command}]" in done.stdout


@glibc_only
def test_tunables_make_repeated_large_tensors_reuse_their_pages(clean_env):
    assert _faults({}) >= 16_000  # glibc's defaults: every 64 MiB result is faulted in anew
    assert _faults({"GLIBC_TUNABLES": allocator.startup_tunables()}) < 100


@glibc_only
def test_keep_freed_memory_acts_on_a_running_process_unless_turned_off(clean_env):
    setup = "from medattn.allocator import keep_freed_memory\nassert keep_freed_memory() is {expected}"
    assert _faults({}, setup.format(expected=True)) < 100
    assert _faults({allocator.MODE_VARIABLE: "default"}, setup.format(expected=False)) >= 16_000
    assert _faults({"MALLOC_ARENA_MAX": "4"}, setup.format(expected=False)) >= 16_000


@glibc_only
def test_keep_freed_memory_leaves_a_process_started_with_reuse_as_it_is(clean_env):
    """The command line starts training with a 1 TiB trim threshold; ``mallopt`` (an int) would lower it to 2 GiB."""
    clean_env.setenv("GLIBC_TUNABLES", allocator.startup_tunables())

    def no_mallopt(*args):
        raise AssertionError("mallopt called in a process that started with reuse")

    clean_env.setattr(allocator.ctypes, "CDLL", no_mallopt)
    assert allocator.keep_freed_memory.__wrapped__() is True
    clean_env.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")  # started otherwise: mallopt is what applies it
    with pytest.raises(AssertionError, match="mallopt called"):
        allocator.keep_freed_memory.__wrapped__()
