"""Data sets for every input kind, patient-level splits, transforms and the synthetic benchmark.

>>> from medattn.data import build_datasets, collate
>>> bundle = build_datasets({"kind": "synthetic_cxr", "image_size": 64}, seed=0)
>>> bundle.task.input_shape, len(bundle.train)
((1, 64, 64), 256)
"""

from .base import DataBundle, TaskInfo, collate
from .build import available_data_kinds, build_datasets

__all__ = ["DataBundle", "TaskInfo", "available_data_kinds", "build_datasets", "collate"]
