"""Multi-process data parallelism (PyTorch DDP) launched by ``torchrun``, and gathering across ranks.

``torchrun --nproc_per_node N -m medattn train CONFIG`` sets ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK`` and the rendezvous address; :func:`setup` then joins the process group with NCCL on
GPUs and gloo on CPU. Without those variables everything runs in one process and every function here
is a no-op. Gathering uses tensors only (no pickled objects).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch
import torch.distributed as dist

from medattn.errors import UserError


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def is_main() -> bool:
    return rank() == 0


def rank_and_world(env: Mapping[str, str] = os.environ) -> tuple[int, int]:
    """(RANK, WORLD_SIZE) as torchrun sets them, (0, 1) without, read from the environment (no process group:
    ``wsi tile``/``extract`` shard their slides by it); UserError when they do not make sense."""
    try:
        rank, world = int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1"))
    except ValueError:
        raise UserError(f"RANK={env.get('RANK')!r} and WORLD_SIZE={env.get('WORLD_SIZE')!r} must be integers") from None
    if world < 1 or not 0 <= rank < world:
        raise UserError(f"RANK={rank} must be in [0, WORLD_SIZE={world})")
    return rank, world


def setup(device: str = "auto") -> torch.device:
    """Join the process group if launched by torchrun; returns this process's device."""
    wanted = "cuda" if device == "auto" and torch.cuda.is_available() else ("cpu" if device == "auto" else device)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        backend = "nccl" if wanted.startswith("cuda") else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend=backend)
    if wanted.startswith("cuda") and world_size() > 1:
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device(wanted)


def cleanup() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()


def all_gather_rows(tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate (n_r, ...) tensors of every rank along dim 0 (ranks may hold different n_r)."""
    if world_size() == 1:
        return tensor
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    local = tensor.to(device)
    sizes = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(world_size())]
    dist.all_gather(sizes, torch.tensor([local.shape[0]], device=device))
    n_max = int(max(s.item() for s in sizes))
    padded = local.new_zeros(n_max, *local.shape[1:])
    padded[: local.shape[0]] = local
    parts = [torch.zeros_like(padded) for _ in sizes]
    dist.all_gather(parts, padded)
    return torch.cat([p[: int(s.item())] for p, s in zip(parts, sizes)]).to(tensor.device)


def all_gather_strings(strings: list[str]) -> list[str]:
    """Concatenate every rank's list of strings, in rank order (sent as UTF-8 byte tensors)."""
    if world_size() == 1:
        return list(strings)
    encoded = [s.encode("utf-8") for s in strings]
    width = max([len(b) for b in encoded] + [1])
    width = int(all_gather_rows(torch.tensor([width])).max())
    rows = torch.zeros(len(encoded), width + 1, dtype=torch.long)  # column 0: length
    for i, b in enumerate(encoded):
        rows[i, 0] = len(b)
        rows[i, 1 : 1 + len(b)] = torch.tensor(list(b), dtype=torch.long)
    gathered = all_gather_rows(rows)
    return [bytes(row[1 : 1 + int(row[0])].tolist()).decode("utf-8") for row in gathered]
