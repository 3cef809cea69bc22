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


@pytest.fixture
def spy(monkeypatch):
    """``spy(module, name)``: a list that gets one entry per call of ``module.name``, which
    still runs (to assert that a fast path is taken)."""

    def install(module, name):
        calls, real = [], getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, **kw: calls.append(1) or real(*a, **kw))
        return calls

    return install


@pytest.fixture(scope="session")
def cpu_kernel():
    """The fused CPU kernel library (posenc.rotary.cpu_rope), built here when `make install-test`
    has not; the test is skipped where it cannot be built (no compiler)."""
    from posenc.rotary import cpu_rope

    try:
        return cpu_rope.kernel() or cpu_rope.build()
    except RuntimeError as e:
        pytest.skip(str(e))


@pytest.fixture
def no_cpu_kernel(monkeypatch):
    """A process in which the fused CPU rotary kernel (posenc.rotary.cpu_rope) is not built: small
    CPU steps rotate with the eager rolled form, whatever this machine's kernel cache holds."""
    from posenc.rotary import cpu_rope

    monkeypatch.setattr(cpu_rope, "_module", None)
    monkeypatch.setattr(cpu_rope, "_looked", True)


@pytest.fixture
def plans(monkeypatch):
    """A list that gets the :class:`posenc.backends.Plan` of every attention call made while
    the test runs (``backends.run`` asks ``planner.plan``; wrapped here, production code keeps
    no record)."""
    from posenc.backends import planner

    taken, real = [], planner.plan
    monkeypatch.setattr(planner, "plan", lambda *a, **kw: taken.append(real(*a, **kw)) or taken[-1])
    return taken
