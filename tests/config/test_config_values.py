"""Any value of any key of a generated data kind is either accepted and builds data one can read, or refused in
one line (a UserError): never a traceback. Values come from Hypothesis; the keys from each kind's ``KEYS``."""

from __future__ import annotations

import importlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from medattn.catalogue import DATA_KINDS
from medattn.data import build_datasets
from medattn.errors import UserError

#: Kinds that need no files: their settings are the whole input. Small defaults keep each example fast.
SMALL = {
    "synthetic_cxr": {"image_size": 16, "num_samples": [2, 2, 2]},
    "synthetic_breast_mri": {"volume_size": [8, 8, 8], "num_samples": [2, 2, 2]},
    "synthetic_wsi": {"num_instances": [3, 5], "feature_dim": 4, "num_samples": [2, 2, 2]},
    "synthetic_vertebrae": {"volume_size": [8, 8, 40], "num_samples": [1, 1, 1]},
    "synthetic_mri_slices": {"volume_size": [8, 8, 8], "num_patients": [1, 1, 1]},
    "synthetic_brain": {"size": [8, 8, 8], "num_samples": [1, 1, 1]},
}
SIZE_KEYS = {"image_size", "volume_size", "num_samples", "num_patients", "num_instances", "feature_dim",
             "num_blobs", "slice_size", "size"}

scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 64), st.floats(allow_nan=True, allow_infinity=True),
                    st.text(max_size=6), st.sampled_from(["strong", "true", "zscore", "1e3"]))
values = st.one_of(scalars, st.lists(scalars, max_size=4), st.dictionaries(st.text(max_size=4), scalars, max_size=2))


def test_every_generated_kind_is_covered():
    assert {k for k in DATA_KINDS if k.startswith("synthetic_")} == set(SMALL)


@pytest.mark.parametrize("kind", sorted(SMALL))
@settings(max_examples=25, deadline=None, derandomize=True)
@given(data=st.data())
def test_any_value_is_accepted_and_works_or_refused_in_one_line(kind, data):
    _accepted_and_works_or_refused(kind, data)


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(SMALL))
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_value_full_sweep(kind, data):
    """The same property over many more (random) examples: ``make test-slow``."""
    _accepted_and_works_or_refused(kind, data)


def _accepted_and_works_or_refused(kind: str, data) -> None:
    module = importlib.import_module(DATA_KINDS[kind][0])
    key = data.draw(st.sampled_from(sorted(module.KEYS)), label="key")
    value = data.draw(values, label="value")
    cfg = {"kind": kind, **SMALL[kind], key: value}
    if key in SIZE_KEYS and isinstance(value, int) and value > 16:  # sizes stay small; large ones are other tests'
        cfg[key] = 16
    try:
        bundle = build_datasets(cfg, seed=0)
        for split in (bundle.train, bundle.val, bundle.test):
            if len(split):
                sample = split[0]
                assert sample["input"].isfinite().all()
    except UserError as error:
        assert "\n" not in str(error)
