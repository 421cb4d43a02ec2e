import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """The decoded-files cache of medattn.data.validate in a folder of this test session, not the user's."""
    import os

    os.environ["MEDATTN_CACHE_DIR"] = str(tmp_path_factory.mktemp("medattn_cache"))
