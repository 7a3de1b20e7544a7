"""peak_memory counts a CUDA graph's private pool (its free bytes between replays are the
graph's working memory, which the allocator's counters leave out); the loop's stage order."""

from __future__ import annotations

from gpushape.steps.measure import _private_pool_free, peak_memory


def test_private_pools_free_bytes_by_pool():
    segments = [
        {"segment_pool_id": (0, 0), "total_size": 100, "allocated_size": 10},  # default pool
        {"segment_pool_id": (1, 2), "total_size": 64, "allocated_size": 16},
        {"segment_pool_id": (1, 2), "total_size": 32, "allocated_size": 32},
        {"segment_pool_id": (3, 4), "total_size": 8, "allocated_size": 0},
        {"total_size": 5, "allocated_size": 0},  # no pool id: the default pool
    ]
    assert _private_pool_free(segments) == {(1, 2): 48, (3, 4): 8}


def test_without_cuda_nothing_is_measured():
    with peak_memory(cuda=False) as peaks:
        pass
    assert peaks == {}


def test_the_loop_times_graph_layers_first():
    """graph-layers changes the host's cost only: the loop puts it before the fixes whose GPU
    savings it lets reach the wall clock."""
    from types import SimpleNamespace

    from gpushape.steps.fix_by_fix import _applied_order

    report = SimpleNamespace(
        applied=[SimpleNamespace(transform=t) for t in
                 ("pad-channels", "fuse-norm-act", "fuse-norm-act", "graph-layers", "graph-layers")]
    )  # fmt: skip
    assert _applied_order(report) == ["graph-layers", "pad-channels", "fuse-norm-act"]
    assert _applied_order(None) == []
