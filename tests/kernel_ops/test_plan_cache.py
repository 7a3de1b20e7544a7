"""The launch-plan cache the kernel families share (`kernels/_plan_cache.py`)."""

from __future__ import annotations

import pytest

from gpushape.kernels._plan_cache import PlanCache


class Builder:
    """A build that records its calls and returns a fresh object each time."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, *args):
        self.calls.append(args)
        return object()


def test_builds_once_per_key():
    cache, build = PlanCache(8), Builder()
    a = cache.get(("a", 1), build, "a", 1)
    b = cache.get(("b", 2), build, "b", 2)
    assert cache.get(("a", 1), build, "a", 1) is a
    assert cache.get(("b", 2), build, "b", 2) is b
    assert a is not b
    assert build.calls == [("a", 1), ("b", 2)]
    assert len(cache) == 2
    assert ("a", 1) in cache and ("c", 3) not in cache


def test_build_without_arguments():
    cache = PlanCache(4)
    plan = cache.get("k", lambda: [1, 2])
    assert cache.get("k", lambda: pytest.fail("built twice")) is plan


def test_full_cache_clears_on_the_next_miss():
    cache, build = PlanCache(3), Builder()
    first = [cache.get(k, build, k) for k in range(3)]
    assert len(cache) == 3
    assert [cache.get(k, build, k) for k in range(3)] == first  # hits do not clear
    assert len(build.calls) == 3
    cache.get(3, build, 3)  # a miss at the bound: the old plans go, the new one stays
    assert len(cache) == 1 and 3 in cache
    assert cache.get(0, build, 0) is not first[0]  # rebuilt
    assert len(build.calls) == 5 and len(cache) == 2


def test_unbounded_cache_never_clears():
    cache, build = PlanCache(None), Builder()
    for k in range(5000):
        cache.get(k, build, k)
    assert len(cache) == 5000


def test_failing_build_caches_nothing():
    cache = PlanCache(2)

    def fail():
        raise RuntimeError("no plan")

    with pytest.raises(RuntimeError, match="no plan"):
        cache.get("k", fail)
    assert len(cache) == 0 and "k" not in cache
    assert cache.get("k", lambda: "plan") == "plan"  # the next lookup builds again
    cache.get("j", lambda: "other")
    with pytest.raises(RuntimeError):
        cache.get("x", fail)  # full: a failed build leaves the plans it had
    assert len(cache) == 2 and cache.get("k", fail) == "plan"


def test_clear():
    cache, build = PlanCache(4), Builder()
    cache.get(1, build, 1)
    cache.clear()
    assert len(cache) == 0
    cache.get(1, build, 1)
    assert len(build.calls) == 2


def test_bound_must_be_positive():
    with pytest.raises(ValueError):
        PlanCache(0)


def test_families_keep_their_bounds():
    from gpushape.kernels.attention import _qkv_assemble
    from gpushape.kernels.batch_norm import _launch as batch_norm
    from gpushape.kernels.grn import _launch as grn
    from gpushape.kernels.group_norm import _launch as group_norm
    from gpushape.kernels.pooling import _launch as pooling

    assert pooling._PLANS.max_plans == pooling._MAX_PLANS == 1024
    assert group_norm._PLANS.max_plans == group_norm._MAX_PLANS == 1024
    assert grn._PLANS.max_plans == grn._MAX_PLANS == 1024
    assert batch_norm._PLANS.max_plans == batch_norm._MAX_PLANS == 4096
    assert _qkv_assemble._PLANS.max_plans is None
