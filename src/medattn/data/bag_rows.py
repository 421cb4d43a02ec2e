"""Rows of a feature bag as stored: read in chunks, and checked to be stored in full.

What a model streaming one bag (:meth:`medattn.models.wsi.WSITransformer.forward_streaming`) needs from the data
layer, and all it may import from it (``docs/architecture.md``): numpy and torch, h5py on use, no reader.
"""

from __future__ import annotations

import numpy as np
import torch


def stored_rows(dataset) -> int | None:
    """None when every element of an HDF5 dataset is stored, else the rows (axis 0) that hold data.

    A dataset declared larger than what was written (a crashed writer, a resized dataset never filled)
    reads its unwritten part as the fill value, zeros that look like real patches. HDF5 tracks the
    allocation (``H5Dget_space_status``): compact and written contiguous data are allocated whole,
    chunked data per chunk. For a partly allocated chunked dataset the stored rows are the end of the
    last allocated chunk along axis 0 (rows before it in unallocated chunks are not counted back).
    """
    import h5py

    status = dataset.id.get_space_status()
    if status == h5py.h5d.SPACE_STATUS_ALLOCATED or dataset.size == 0:
        return None
    if dataset.chunks is None or status == h5py.h5d.SPACE_STATUS_NOT_ALLOCATED:
        return 0
    chunks = (dataset.id.get_chunk_info(i) for i in range(dataset.id.get_num_chunks()))
    return min(dataset.shape[0], max((c.chunk_offset[0] + dataset.chunks[0] for c in chunks), default=0))


def check_stored(name: str, dataset) -> None:
    """ValueError naming ``name`` unless the HDF5 ``dataset`` is stored in full (:func:`stored_rows`)."""
    rows = stored_rows(dataset)
    if rows is not None:
        raise ValueError(f"dataset {name!r} declares {dataset.shape[0]} rows but the file stores data for "
                         f"{rows} (the rest would read as fill values); rewrite the file with its real length")


def read_rows(source, start: int, stop: int) -> torch.Tensor:
    """Rows [start, stop) of a bag held as a tensor, a NumPy array or memory map, or an ``h5py`` dataset read
    straight from disk, as a float32 tensor (streamed inference reads a bag so, chunk by chunk)."""
    if torch.is_tensor(source):
        return source[start:stop].float()
    return torch.from_numpy(np.array(source[start:stop], dtype=np.float32))
