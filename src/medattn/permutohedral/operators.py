"""Splat, blur and slice of the permutohedral lattice as sparse (CSR) matrix products, with their backward.

With P points, each touching its d+1 simplex vertices, and U lattice vertices, the lattice filter is

    out = A(w) B_d ... B_1 B_0 A(w)^T v

where A(w) (P, U) is the slice matrix, ``A[p, id(p, r)] = w(p, r)`` (barycentric weights), A^T the
splat, and B_j (U, U) the [1 2 1] / 4 blur along lattice direction j (symmetric: the - neighbour of a
vertex's + neighbour is the vertex itself). Each product is one CSR times dense matrix (MKL on CPU,
cuSPARSE on CUDA), so no (P (d+1), C) temporary is formed in the forward pass; on CPU the blur reads the
neighbour ids directly (``cpu_kernels.blur_direction``, the same symmetric B_j without building it).
The gradient w.r.t. the values uses the transposed matrix, the gradient w.r.t. the weights
``dL/dw(p, r) = <g_p, x_id(p, r)>`` (slice) or ``<g_id(p, r), x_p>`` (splat); the blur has no parameters.
The backward is itself built from these products (the splat's backward is a slice and vice versa, the
blur's is the blur in reverse order) and differentiable torch ops (gather, batched dot), so autograd
differentiates it again: second derivatives (Hessian-vector products, double backward) are exact, checked
by ``gradgradcheck`` and against
a dense reference in the tests.
"""

from __future__ import annotations

import warnings

import torch


def _csr(crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    with warnings.catch_warnings():  # "sparse CSR support is in beta state"
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow, col, values, size=size)


class LatticeStructure:
    """Index structure of one lattice: which vertices each point touches, and the blur neighbours.

    Args:
        ids: (P (d+1),) dense vertex ids, point-major (row p (d+1) + r is vertex r of point p).
        perm: (P (d+1),) the permutation that sorts ``ids`` (stable order within a vertex).
        counts: (U,) number of (point, vertex) rows of each vertex.
        neighbours: d+1 pairs (plus, minus) of (U,) ids of the neighbours along each lattice direction
            (``num`` where absent); the ids must be ordered so that minus < vertex < plus for every
            direction but the first, and the reverse for the first (lexicographic vertex order).
    """

    def __init__(self, ids: torch.Tensor, perm: torch.Tensor, counts: torch.Tensor,
                 neighbours: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        d1 = len(neighbours)
        num = counts.numel()
        self.num, self.d1 = num, d1
        self.num_points = ids.numel() // d1
        self.ids, self.perm = ids, perm
        device = ids.device
        self.neighbours = neighbours
        self.slice_crow = torch.arange(0, ids.numel() + 1, d1, device=device)
        self.splat_crow = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
        self.splat_col = perm // d1  # point of each (point, vertex) row in vertex order
        self._blur_csr: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None

    @property
    def blur_cols(self) -> list[torch.Tensor]:
        """Per direction, the (3 U,) CSR columns of B_j: (first neighbour, self, last), self where absent."""
        return self._blur_structure()[0]

    def _blur_structure(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        if self._blur_csr is not None:
            return self._blur_csr
        num = self.num
        own = torch.arange(num, device=self.ids.device)
        blur_cols, blur_found = [], []
        for direction, (plus, minus) in enumerate(self.neighbours):
            has_plus, has_minus = plus < num, minus < num
            first, last = (minus, plus) if direction > 0 else (plus, minus)
            has_first, has_last = (has_minus, has_plus) if direction > 0 else (has_plus, has_minus)
            cols = torch.stack([torch.where(has_first, first, own), own, torch.where(has_last, last, own)], dim=1)
            blur_cols.append(cols.reshape(-1))
            blur_found.append(torch.stack([has_first, torch.ones_like(has_first), has_last], dim=1))
        self._blur_csr = blur_cols, blur_found
        return self._blur_csr

    def slice_matrix(self, weights: torch.Tensor) -> torch.Tensor:
        """A(w) (P, U) from the point-major weights (P (d+1),)."""
        return _csr(self.slice_crow, self.ids, weights, (self.num_points, self.num))

    def splat_matrix(self, weights: torch.Tensor) -> torch.Tensor:
        """A(w)^T (U, P) from the point-major weights (P (d+1),)."""
        return _csr(self.splat_crow, self.splat_col, weights.index_select(0, self.perm), (self.num, self.num_points))

    def blur_matrices(self, dtype: torch.dtype) -> list[torch.Tensor]:
        """B_0, ..., B_d (U, U): 1/2 on the diagonal, 1/4 for each present neighbour."""
        kernel = torch.tensor([0.25, 0.5, 0.25], dtype=dtype, device=self.ids.device)
        crow = torch.arange(0, 3 * self.num + 1, 3, device=self.ids.device)
        return [_csr(crow, cols, (found * kernel).reshape(-1), (self.num, self.num))
                for cols, found in zip(*self._blur_structure(), strict=True)]

    def blur_step(self, lattice: torch.Tensor, direction: int, matrices: list[torch.Tensor] | None) -> torch.Tensor:
        """B_direction applied to the (U, C) lattice values: Numba on CPU, else the CSR product."""
        if matrices is None:
            from .cpu_kernels import blur_direction

            return blur_direction(lattice, *self.neighbours[direction])
        return matrices[direction] @ lattice

    def gathered_dot(self, per_vertex: torch.Tensor, per_point: torch.Tensor) -> torch.Tensor:
        """(P (d+1),) point-major ``<per_vertex[id(p, r)], per_point[p]>``."""
        gathered = per_vertex.index_select(0, self.ids).view(self.num_points, self.d1, -1)
        return torch.bmm(gathered, per_point.unsqueeze(2)).reshape(-1)


class _Product(torch.autograd.Function):
    """A splat ``A(w)^T v`` (``transposed``: point values v to the lattice) or a slice ``A(w) L`` (lattice values L
    to the points). Backward, each the other's transpose: a splat's ``dL/dv = A(w) g`` (a slice) and
    ``dL/dw(p, r) = <g_id(p, r), v_p>``; a slice's ``dL/dL = A(w)^T g`` (a splat) and ``dL/dw(p, r) = <L_id(p, r),
    g_p>``: the lattice side at vertex id(p, r) times the point side at p."""

    @staticmethod
    def forward(ctx, weights, x, structure, transposed):
        ctx.structure, ctx.transposed = structure, transposed
        ctx.save_for_backward(weights, x)
        return (structure.splat_matrix(weights) if transposed else structure.slice_matrix(weights)) @ x

    @staticmethod
    def backward(ctx, grad):
        weights, x = ctx.saved_tensors
        structure, grad = ctx.structure, grad.contiguous()
        lattice_side, point_side = (grad, x) if ctx.transposed else (x, grad)
        grad_weights = structure.gathered_dot(lattice_side, point_side) if ctx.needs_input_grad[0] else None
        grad_x = _Product.apply(weights, grad, structure, not ctx.transposed) if ctx.needs_input_grad[1] else None
        return grad_weights, grad_x, None, None


class _Blur(torch.autograd.Function):
    """``B_(j_k) ... B_(j_1) L`` for the symmetric blurs along ``directions`` j_1..j_k; backward: the same in
    reverse order. ``matrices`` are the CSR B_j (None on CPU, where the Numba blur reads the neighbours)."""

    @staticmethod
    def forward(ctx, lattice, structure, directions, matrices):
        ctx.structure, ctx.directions, ctx.matrices = structure, directions, matrices
        for direction in directions:
            lattice = structure.blur_step(lattice, direction, matrices)
        return lattice

    @staticmethod
    def backward(ctx, grad):
        return _Blur.apply(grad.contiguous(), ctx.structure, ctx.directions[::-1], ctx.matrices), None, None, None


def splat(weights: torch.Tensor, values: torch.Tensor, structure: LatticeStructure) -> torch.Tensor:
    """(U, C) lattice values ``A(w)^T v`` from point values (P, C) and point-major weights (P (d+1),)."""
    return _Product.apply(weights, values.contiguous(), structure, True)


def blur(lattice: torch.Tensor, structure: LatticeStructure) -> torch.Tensor:
    """(U, C) lattice values blurred along the d+1 lattice directions in turn."""
    matrices = None if lattice.device.type == "cpu" else structure.blur_matrices(lattice.dtype)
    return _Blur.apply(lattice.contiguous(), structure, tuple(range(structure.d1)), matrices)


def slice_points(weights: torch.Tensor, lattice: torch.Tensor, structure: LatticeStructure) -> torch.Tensor:
    """(P, C) point values ``A(w) L`` read back from the lattice (U, C)."""
    return _Product.apply(weights, lattice.contiguous(), structure, False)
