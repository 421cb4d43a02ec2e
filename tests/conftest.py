import pytest
import torch


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` need a CUDA GPU: skipped where torch sees none (``pytest -m cuda`` on a GPU machine)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """The decoded-files cache of medattn.data.validate in a folder of this test session, not the user's."""
    import os

    os.environ["MEDATTN_CACHE_DIR"] = str(tmp_path_factory.mktemp("medattn_cache"))
