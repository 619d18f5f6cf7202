import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """The fits are tiny: one CPU thread avoids contention on shared machines (restored after)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
