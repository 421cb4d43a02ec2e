"""Gaussian filtering on the permutohedral lattice (Adams, Baek & Davis, Eurographics 2010), pure PyTorch.

Approximates, in O(N) time and memory, the high-dimensional Gaussian filter

    v'_i = sum_j exp(-|f_i - f_j|^2 / 2) v_j                          (unnormalised)
    v'_i = sum_j w_ij v_j / sum_j w_ij,  w_ij = exp(-|f_i - f_j|^2 / 2)  (``normalize=True``)

with features f (N, d) and values v (N, C), in four steps:

1. Elevate: f is mapped by a scaled isometry E into the hyperplane H_d = {x in R^{d+1}: sum x = 0},
   scaled by ``sqrt(2/3) (d+1)`` so that the total blur (splat + blur + slice) has unit standard deviation
   in feature units. The nearest remainder-0 lattice point is found by rounding, the enclosing simplex by
   ranking the differential, and the d+1 barycentric weights follow.
2. Splat: each point adds its weighted value to the d+1 vertices of its simplex.
3. Blur: the [1 2 1] / 4 kernel is applied along each of the d+1 lattice directions in turn.
4. Slice: each point reads back the barycentric-weighted sum of its vertices' blurred values.

Vertices are identified exactly, without hashing: their d integer coordinates (the last one is minus
their sum) and the batch index are packed into one int64 (mixed radix over the observed range, padded
so every blur neighbour also fits); one sort and ``unique_consecutive`` give dense ids. The + neighbour
along each lattice direction is found by one ``torch.searchsorted`` into the sorted unique keys (its
packed key is the vertex key plus a constant, so the queries are sorted too); the - neighbours follow by
inverting that map; missing neighbours contribute zero. When the packed key would not fit into 62 bits,
ids are built column by column (one ``unique`` per coordinate), still exact. Splat, blur and slice are
then sparse (CSR) matrix products, see ``operators.py``; before them the points are put in the order of
their remainder-0 vertex, so that the products read memory nearly sequentially. On CPU the integer work
(simplices, the sort, the neighbour search) and the blur run in Numba kernels (``cpu_kernels.py``).

Gradients w.r.t. the values flow through the transposed products (splat and slice are each other's
transpose, each blur is symmetric), w.r.t. the features through the barycentric weights (hand-written
backward of the products, autograd for the rest). The vertex assignment (rounding and ranking) is
piecewise constant, so it carries no gradient; the filter is continuous across simplex boundaries and
its gradient is that of the piecewise-smooth function, checked by ``gradcheck`` in the tests; the backward
is differentiable again, so second derivatives are exact too (``gradgradcheck``). This is
not the paper's eqs. 6-7 (which use filtered gradients instead).

The unnormalised output is multiplied by ``sqrt(d+1) (4 pi / 3)^(d/2)``: the splat, blur and slice keep
the total mass, so on a uniform cloud of density rho the raw lattice returns ``rho V v`` with
``V = (3/2)^(d/2) / sqrt(d+1)`` the feature-space volume per lattice vertex, while the Gaussian sum is
``rho (2 pi)^(d/2) v``.
"""

from __future__ import annotations

import math

import torch

from .operators import LatticeStructure, blur, slice_points, splat

_MAX_BITS = 62
_CHUNK = 1 << 16  # points per chunk of the per-point arithmetic


def gaussian_scale(dim: int) -> float:
    """Factor that turns the mass-preserving lattice output into the Gaussian sum (unnormalised form)."""
    return math.sqrt(dim + 1) * (4.0 * math.pi / 3.0) ** (dim / 2)


def _elevation_matrix(dim: int, dtype, device) -> torch.Tensor:
    """E (d, d+1): rows orthogonal, each of norm ``sqrt(2/3) (d+1)``; f @ E lies in sum-zero plane."""
    rows = torch.zeros(dim, dim + 1, dtype=torch.float64)
    for j in range(dim):  # row j: (1, ..., 1 [j+1 times], -(j+1), 0, ...) / sqrt((j+1)(j+2))
        rows[j, : j + 1] = 1.0
        rows[j, j + 1] = -(j + 1)
        rows[j] /= math.sqrt((j + 1) * (j + 2))
    return (rows * math.sqrt(2.0 / 3.0) * (dim + 1)).to(dtype=dtype, device=device)


class _Simplices:
    """Enclosing simplex of each of P points with features (P, d), in "sorted" order.

    Position k of a row is the coordinate with the k-th largest differential (``order[:, k]``); after
    the wrap-around its rank is ``(k + shift) mod (d+1)``. Attributes: ``order`` (P, d+1),
    ``rem0`` (P, d+1) int64 coordinates of the remainder-0 vertex in sorted order, ``to_rank`` (P, d+1)
    with ``to_rank[:, j]`` the position holding rank d-j, and ``weights`` (P, d+1), the barycentric weight
    of the vertex of remainder r in column r (they sum to one and carry the gradient).
    """

    def __init__(self, features: torch.Tensor) -> None:
        dim = features.shape[-1]
        self.dim = dim
        elevated = features @ _elevation_matrix(dim, features.dtype, features.device)  # (P, d+1)
        chunks = range(0, elevated.shape[0], _CHUNK)
        if elevated.device.type == "cpu":  # one Numba pass, O(d^2) per point (the torch path sorts rows)
            from .cpu_kernels import simplex_integers

            self.order, self.rem0, self.to_rank, self.coord_low, self.coord_high = simplex_integers(elevated.detach())
        else:
            parts = [self._chunk_integers(elevated[start:start + _CHUNK].detach()) for start in chunks]
            order, rem0, to_rank, low, high = zip(*parts, strict=True)
            self.order, self.rem0, self.to_rank = torch.cat(order), torch.cat(rem0), torch.cat(to_rank)
            self.coord_low = torch.stack(low).amin(dim=0)  # (d+1,) of the remainder-0 points, before the wrap
            self.coord_high = torch.stack(high).amax(dim=0)
        self.weights = torch.cat([self._chunk_weights(elevated, slice(start, start + _CHUNK)) for start in chunks])

    def _chunk_integers(self, elevated: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """order, rem0, to_rank of a chunk of elevated points, and the chunk's low / high remainder-0 coordinates
        (small temporaries stay in cache and are reused)."""
        dim, d1 = self.dim, self.dim + 1
        # small-integer arithmetic in floating point (exact): fewer, smaller temporaries
        rounded = torch.round(elevated / d1)  # nearest remainder-0 point, divided by d+1
        shift = rounded.sum(dim=1, keepdim=True)  # (P, 1): off-plane excess
        order = torch.sort(elevated - rounded * d1, dim=1, descending=True, stable=True).indices
        rank = torch.arange(d1, device=elevated.device, dtype=elevated.dtype) + shift  # off by a wrap
        wrap = (rank > dim).to(elevated.dtype) - (rank < 0).to(elevated.dtype)  # rank in [-d, 2d]
        rem0 = (rounded.gather(1, order) - wrap) * d1  # (P, d+1), sorted order, wrapped
        to_rank = (dim - rank + d1 * wrap).to(torch.int64)  # = (d - rank) mod (d+1)
        low, high = (rounded.amin(dim=0) * d1).to(torch.int64), (rounded.amax(dim=0) * d1).to(torch.int64)
        return order, rem0.to(torch.int64), to_rank, low, high

    def _chunk_weights(self, elevated: torch.Tensor, rows: slice) -> torch.Tensor:
        """Barycentric weights (p, d+1) of the points ``rows``, differentiable in ``elevated``."""
        dim, d1 = self.dim, self.dim + 1
        order, rem0, to_rank = self.order[rows], self.rem0[rows].to(elevated.dtype), self.to_rank[rows]
        y = (elevated[rows].gather(1, order) - rem0) / d1  # (P, d+1), sorted order
        z = y.gather(1, to_rank)  # z[:, j]: y of the coordinate of rank d - j
        # barycentric weights (Adams et al. 2010, p. 10): b_r = z_r - z_{r-1}, b_0 = 1 + z_0 - z_d
        return torch.cat([1.0 + z[:, :1] - z[:, dim:], z[:, 1:] - z[:, :-1]], dim=1)

    def vertex_coords(self) -> torch.Tensor:
        """Lattice coordinates (P, d+1, d) of the d+1 vertices (the last coordinate is implied)."""
        d1 = self.dim + 1
        remainder = torch.arange(d1, device=self.rem0.device).view(1, d1, 1)
        position_rank = torch.empty_like(self.to_rank).scatter_(
            1, self.to_rank, (self.dim - torch.arange(d1, device=self.rem0.device)).expand_as(self.to_rank))
        wrapped = position_rank[:, None, :] > self.dim - remainder
        sorted_coords = self.rem0[:, None, :] + remainder - d1 * wrapped
        coords = torch.empty_like(sorted_coords).scatter_(2, self.order[:, None, :].expand_as(sorted_coords),
                                                          sorted_coords)
        return coords[:, :, : self.dim]

    def packed_keys(self, low: torch.Tensor, strides: torch.Tensor) -> torch.Tensor:
        """Mixed-radix keys (P, d+1) of the vertices, ``sum_k (c_k - low_k) strides_k`` (strides_d = 0)."""
        return torch.cat([self._chunk_keys(slice(start, start + _CHUNK), low, strides)
                          for start in range(0, self.order.shape[0], _CHUNK)])

    def _chunk_keys(self, rows: slice, low: torch.Tensor, strides: torch.Tensor) -> torch.Tensor:
        d1 = self.dim + 1
        order, rem0, to_rank = self.order[rows], self.rem0[rows], self.to_rank[rows]
        flat_order = order.reshape(-1)
        low_sorted = low.index_select(0, flat_order).view_as(order)  # (p, d+1)
        strides_sorted = strides.index_select(0, flat_order).view_as(order)
        base = ((rem0 - low_sorted) * strides_sorted).sum(dim=1, keepdim=True)  # remainder-0 vertex
        # vertex r adds r to every coordinate and subtracts d+1 from those of rank > d - r
        dropped = strides_sorted.gather(1, to_rank[:, :-1]).cumsum(dim=1)  # (p, d)
        remainder = torch.arange(1, d1, device=base.device)
        return torch.cat([base, base + remainder * int(strides.sum()) - d1 * dropped], dim=1)


class _VertexIndex:
    """Exact map from (batch, lattice vertex) to dense ids, with neighbour lookup along lattice directions.

    Built from the simplices of P points and their batch indices (P,); ``ids`` (P (d+1),) are the dense
    ids of the points' vertices (remainder-minor: row p (d+1) + r is vertex r of point p), ``num`` the
    number of distinct vertices, ``perm`` the order that sorts ``ids`` and ``counts`` (U,) the number of
    rows of each vertex (together they give the splat matrix in CSR form).
    In the packed case the points are first put in the order of their remainder-0 vertex keys
    (``point_order``, (P,), else None): ``ids`` then refer to that order, in which nearby points are
    nearby in memory, so the gathers of the splat and slice hit the cache far more often.
    ``neighbours(direction)`` returns, for every vertex, the ids of the vertices one step along
    +direction and -direction, or ``num`` when absent.
    """

    def __init__(self, simplices: _Simplices, batch: torch.Tensor, num_batches: int) -> None:
        dim = simplices.dim
        self.dim = dim
        margin = 3 * dim + 2  # vertices lie within [rem0 - 2(d+1), rem0 + 2d + 1]; neighbours move by d
        low = simplices.coord_low - margin
        low[dim] = 0
        radix = (simplices.coord_high[:dim] + margin - low[:dim] + 1).tolist()
        self.packed = num_batches * math.prod(radix) <= 2**_MAX_BITS
        if self.packed:
            strides = [0] * (dim + 1)
            strides[dim - 1] = 1
            for k in range(dim - 2, -1, -1):
                strides[k] = strides[k + 1] * radix[k + 1]
            self.strides = torch.tensor(strides, dtype=torch.int64, device=batch.device)  # (d+1,), last 0
            keys = simplices.packed_keys(low, self.strides) + (batch * strides[0] * radix[0])[:, None]
            self.point_order = keys[:, 0].argsort()  # points by remainder-0 vertex: local gathers later
            keys = keys.index_select(0, self.point_order).reshape(-1)
            if keys.device.type == "cpu":  # radix sort and dense ids in Numba
                from .cpu_kernels import dense_ids

                self.keys, self.ids, self.perm, self.counts = dense_ids(keys)
            else:
                sorted_keys, self.perm = keys.sort(stable=True)
                self.keys, sorted_ids, self.counts = torch.unique_consecutive(sorted_keys, return_inverse=True,
                                                                              return_counts=True)
                self.ids = torch.empty_like(sorted_ids).scatter_(0, self.perm, sorted_ids)
            self.num = self.keys.numel()
        else:
            self.point_order = None
            coords = simplices.vertex_coords().reshape(-1, dim)
            self._build_columns(coords, batch.repeat_interleave(dim + 1))
            self.perm = self.ids.sort().indices
            self.counts = torch.bincount(self.ids, minlength=self.num)

    def _build_columns(self, coords: torch.Tensor, batch: torch.Tensor) -> None:
        """Column-by-column ids: prefix id of (prefix, c_k) via unique, exact for any coordinate range."""
        self.column_values, self.column_keys = [], []
        prefix = batch
        for column in coords.t().contiguous():
            values = torch.unique(column, sorted=True)
            key = prefix * values.numel() + torch.searchsorted(values, column)
            keys, prefix = torch.unique(key, sorted=True, return_inverse=True)
            self.column_values.append(values)
            self.column_keys.append(keys)
        self.ids = prefix
        self.num = self.column_keys[-1].numel()
        self.vertex_coords = coords.new_zeros(self.num, self.dim).index_copy_(0, prefix, coords)
        self.vertex_batch = batch.new_zeros(self.num).index_copy_(0, prefix, batch)

    @staticmethod
    def _find(table: torch.Tensor, query: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Position of each query in the sorted ``table`` and whether it is present."""
        pos = torch.searchsorted(table, query)
        found = table.index_select(0, pos.clamp_max(table.numel() - 1)) == query
        return pos, found

    def _lookup_columns(self, coords: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        found = torch.ones_like(batch, dtype=torch.bool)
        prefix = batch
        columns = coords.t().contiguous()
        for values, keys, column in zip(self.column_values, self.column_keys, columns, strict=True):
            rank, hit = self._find(values, column)
            prefix, hit_key = self._find(keys, prefix * values.numel() + rank.clamp_max(values.numel() - 1))
            found &= hit & hit_key
        return torch.where(found, prefix, torch.full_like(prefix, self.num))

    def neighbours(self, direction: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Ids (U,) of the +/- neighbours along lattice direction ``direction`` (0..d); ``num`` if absent.

        Only the + neighbours are searched: the - neighbour of vertex k is the vertex whose + neighbour is k.
        """
        step = torch.ones(self.dim, dtype=torch.int64, device=self.ids.device)
        if direction < self.dim:
            step[direction] = -self.dim  # direction vector (1, ..., -d, ..., 1); last coordinate implied
        if self.packed and self.keys.device.type == "cpu":  # sorted keys: one merge per direction, O(U)
            from .cpu_kernels import shifted_positions

            offset = int((step * self.strides[: self.dim]).sum())
            return shifted_positions(self.keys, offset), shifted_positions(self.keys, -offset)
        if self.packed:
            offset = int((step * self.strides[: self.dim]).sum())
            pos, found = self._find(self.keys, self.keys + offset)
            plus = torch.where(found, pos, torch.full_like(pos, self.num))
        else:
            plus = self._lookup_columns(self.vertex_coords + step, self.vertex_batch)
        minus = torch.full((self.num + 1,), self.num, dtype=plus.dtype, device=plus.device)
        minus.scatter_(0, plus, torch.arange(self.num, dtype=plus.dtype, device=plus.device))
        return plus, minus[: self.num]


def _check(values: torch.Tensor, features: torch.Tensor) -> None:
    if not torch.is_floating_point(values) or not torch.is_floating_point(features):
        raise ValueError(f"values and features must be floating point, got {values.dtype}, {features.dtype}")
    if values.dim() not in (2, 3) or features.dim() != values.dim():
        raise ValueError(
            "expected values (B, N, C) and features (B, N, d), or (N, C) and (N, d); "
            f"got shapes {tuple(values.shape)} and {tuple(features.shape)}"
        )
    if values.shape[:-1] != features.shape[:-1]:
        raise ValueError(f"values {tuple(values.shape)} and features {tuple(features.shape)}: B, N differ")
    if features.shape[-1] < 1 or values.shape[-2] < 1:
        raise ValueError(f"need at least one point and one feature, got features {tuple(features.shape)}")
    if values.device != features.device:
        raise ValueError(f"values on {values.device} but features on {features.device}")
    if not bool(torch.isfinite(features).all()):
        raise ValueError("features contain NaN or infinity")


def permutohedral_filter(values: torch.Tensor, features: torch.Tensor, normalize: bool = False,
                         eps: float = 1e-12) -> torch.Tensor:
    """Gaussian filter of ``values`` in the space of ``features`` on the permutohedral lattice.

    Args:
        values: (B, N, C) or (N, C) floating point.
        features: (B, N, d) or (N, d) floating point, in units of the Gaussian's standard deviation
            (scale them to set the kernel width). Each batch item gets its own lattice.
        normalize: divide by the filtered ones, so the output is a weighted mean of the values.
        eps: floor of the normaliser (``normalize=True`` only).

    Returns:
        Tensor shaped like ``values``: ``sum_j exp(-|f_i - f_j|^2 / 2) v_j`` (approximately), or its
        normalised form. Half-precision inputs are computed in float32 and cast back.
    """
    _check(values, features)
    squeeze = values.dim() == 2
    if squeeze:
        values, features = values.unsqueeze(0), features.unsqueeze(0)
    out_dtype = values.dtype
    dtype = torch.promote_types(torch.promote_types(values.dtype, features.dtype), torch.float32)
    batch_size, num_points, channels = values.shape
    dim = features.shape[-1]
    d1 = dim + 1

    simplices = _Simplices(features.reshape(-1, dim).to(dtype))
    weights = simplices.weights  # (BN, d+1)
    batch = torch.arange(batch_size, device=values.device).repeat_interleave(num_points)
    index = _VertexIndex(simplices, batch, batch_size)

    payload = values.reshape(-1, channels).to(dtype)
    if normalize:
        payload = torch.cat([payload, payload.new_ones(payload.shape[0], 1)], dim=1)
    order = index.point_order
    if order is not None:
        payload, weights = payload.index_select(0, order), weights.index_select(0, order)
    structure = LatticeStructure(index.ids, index.perm, index.counts, [index.neighbours(j) for j in range(d1)])
    flat_weights = weights.reshape(-1)
    sliced = slice_points(flat_weights, blur(splat(flat_weights, payload, structure), structure), structure)
    if order is not None:
        sliced = sliced.index_select(0, torch.empty_like(order).scatter_(0, order, torch.arange(
            order.numel(), device=order.device)))
    if normalize:
        out = sliced[:, :channels] / sliced[:, channels:].clamp_min(eps)
    else:
        out = sliced * gaussian_scale(dim)
    out = out.view(batch_size, num_points, channels).to(out_dtype)
    return out.squeeze(0) if squeeze else out
