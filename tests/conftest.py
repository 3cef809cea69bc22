import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _no_auto_compile(request, monkeypatch):
    """kernel="auto" stays eager outside tests marked ``compile`` (compiling takes seconds);
    the compiled kernel has its own tests against the eager one and the references."""
    if request.node.get_closest_marker("compile") is None:
        from posenc.rotary import functional

        monkeypatch.setattr(functional, "AUTO_COMPILE_MIN_NUMEL", None)
    yield
