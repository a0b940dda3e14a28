"""Shared fixtures: small EAGLE-3-shaped samples with deterministic contents."""

from __future__ import annotations

import signal

import pytest
import torch

import eagle_io


def pytest_configure(config: pytest.Config) -> None:
    """Gives SIGINT back its default Python handler where the run inherited it ignored (a shell's background job
    starts with SIGINT set to SIG_IGN, and Python keeps an ignored SIGINT ignored), in this process and so in every
    child it spawns: the interrupt tests send real SIGINTs and would otherwise wait out their timeouts."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Runs the files holding ``slow`` tests first (a stable reorder, the same in every pytest-xdist worker): the
    Makefile runs the files on two workers (``--dist loadfile``), and a 5-minute file taken last would leave one
    worker idle for those minutes."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)


def make_sample(sample_id: int, n_tokens: int, hidden: int = 32, k: int = 3) -> dict[str, torch.Tensor]:
    """A sample of the EAGLE-3 schema with hidden-state-like bf16 values, seeded by ``sample_id``."""
    g = torch.Generator().manual_seed(sample_id)
    return {
        "input_ids": torch.randint(0, 49152, (n_tokens,), generator=g),
        "loss_mask": (torch.rand(n_tokens, generator=g) > 0.4).to(torch.uint8),
        "aux_hidden_states": (torch.randn(n_tokens, k * hidden, generator=g) * 3).to(torch.bfloat16),
        "hidden_states": torch.randn(n_tokens, hidden, generator=g).to(torch.bfloat16),
    }


def same(a, b) -> None:
    """Equal structure, and every tensor equal in dtype, shape and bits."""
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            same(x, y)
    else:
        assert a == b


#: Token counts of the feed tests' samples: 1..23, deterministic.
FEED_LENGTHS = [(i * 37) % 23 + 1 for i in range(60)]


def write_samples(root, first_id: int, lengths, hidden: int) -> dict[int, dict[str, torch.Tensor]]:
    """Writes ``make_sample(first_id + i, lengths[i])`` for every length into a dataset at ``root`` (several shards
    of 20 kB); returns ``{sample_id: sample}``."""
    samples = {first_id + i: make_sample(first_id + i, n, hidden=hidden) for i, n in enumerate(lengths)}
    with eagle_io.ShardWriter(root, eagle_io.eagle3_schema(hidden), {}, shard_bytes=20_000, threads=1) as w:
        w.write_batch([(sid, s, "") for sid, s in samples.items()])
    return samples


@pytest.fixture(scope="module")
def feed_dataset(tmp_path_factory):
    """40 samples (ids 1000+i, lengths 1..23, hidden 8) in several shards; returns (root, {sample_id: sample})."""
    root = tmp_path_factory.mktemp("feed")
    return root, write_samples(root, 1000, FEED_LENGTHS[:40], 8)


def flat(batches):
    """The items of a list of batches, in order."""
    return [i for b in batches for i in b]


@pytest.fixture
def small_dataset(tmp_path):
    """A closed 12-sample dataset over several shards; returns (root, {sample_id: sample})."""
    root = tmp_path / "ds"
    samples = {i * 3 + 1: make_sample(i * 3 + 1, [0, 1, 5, 40][i % 4]) for i in range(12)}
    with eagle_io.ShardWriter(
        root, eagle_io.eagle3_schema(32), {"target_model": "tiny"}, shard_bytes=8_000, chunk_bytes=2_048, threads=2
    ) as w:
        for sid, s in samples.items():
            w.write(sid, s, key=f"conv-{sid}")
    return root, samples
