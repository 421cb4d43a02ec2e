"""Alias of ``medattn bench diffusion`` (:mod:`medattn.diffusion.benchmark`): time and peak memory of the 3D
absorbing-diffusion transformer versus token count, per mechanism.

Kept for the command lines quoted before the bench joined ``medattn bench``; it takes the same options (and, like
every bench, refuses earlier results in ``--out`` unless given ``--overwrite``).

    .venv/bin/python benchmarks/diffusion_scaling.py --grids 5x7x6,10x7x6,10x14x6,10x14x12 --dim 128 --depth 2
"""

from __future__ import annotations

import sys

from medattn.cli import main as medattn


def main(argv: list[str] | None = None) -> int:
    return medattn(["bench", "diffusion", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
