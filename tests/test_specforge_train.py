"""``specforge train`` on an eagle-io dataset with no export (``eagle-io specforge-train``), checked with SpecForge
0.2.0's own code: its config loader, ``resolve_run`` (the CLI's), its eagle3 offline provider's reader, normalizer
and collator, its ``_shard_offline_refs`` sampler, its ``LocalFeatureStore`` (as ``specforge.launch`` names it) and
its ``FeatureDataLoader`` built as its ``Trainer`` builds it. The batches on the dataset equal, bit for bit, the
batches the same path yields on ``export-specforge`` output of the dataset, plain and FP8.

Where the test stops: SpecForge's ``Trainer`` next wraps the draft in FSDP (``FSDPTrainingBackend``, device meshes
from ``init_distributed``) and its loss is a Triton kernel; neither runs on this CPU-only machine. The whole run
(``specforge train`` through this launcher, optimizer steps, checkpoint) is benches/gpu/specforge_train.sh.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

import eagle_io
from conftest import make_sample
from eagle_io.errors import InvalidArgumentError
from eagle_io.interop.specforge import export_specforge

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("specforge") is None, reason="SpecForge not installed (pip install --no-deps specforge)"
)

H = 32
#: Sample ids 0..22 (SpecForge orders the exported files data_0, data_1, data_10, ...: not the dataset's order),
#: lengths 1..40, two of them past max_length.
LENGTHS = {sid: (sid * 17) % 40 + 1 for sid in range(23)}


def write(root, precision):
    schema = eagle_io.eagle3_schema(H, precision=precision)
    with eagle_io.ShardWriter(root, schema, {"vocab_size": 49152}, shard_bytes=20_000, threads=1) as w:
        for sid, n in LENGTHS.items():
            w.write(sid, make_sample(sid, n, hidden=H))
    return root


def config(tmp_path, data, **training):
    cfg = {
        "model": {"target_model_path": str(tmp_path / "target"), "vocab_mapping_path": str(tmp_path / "v.pt")},
        "data": {"hidden_states_path": str(data), "max_length": 36, "dataloader_num_workers": 2},
        "training": {"batch_size": 2, "seed": 7, "ttt_length": 3, **training},
        "output_dir": str(tmp_path / "out"),
    }
    path = tmp_path / f"cfg-{len(list(tmp_path.glob('cfg-*')))}.json"
    path.write_text(json.dumps(cfg))
    return path


def batches(cfg_path, overrides=(), epoch=0):
    """The batches ``specforge train --config cfg_path`` feeds its trainer in ``epoch``: SpecForge's own objects,
    wired as ``build_offline_runtime`` and ``Trainer.__init__`` wire them."""
    import specforge.launch as launch
    from specforge.application import resolve_run
    from specforge.config import load_config
    from specforge.runtime.data_plane import FeatureDataLoader

    cfg = load_config(str(cfg_path), list(overrides))
    algorithm = resolve_run(cfg).algorithm
    provider = algorithm.providers.offline_for(cfg.model.input_modality)
    t = cfg.training
    source = provider.build_reader(
        cfg.data.hidden_states_path, run_id=cfg.run_id, ttt_length=t.ttt_length, max_len=cfg.data.max_length
    ).read()
    refs = launch._shard_offline_refs(source, use_usp_preprocess=False, seed=t.seed, epoch=epoch)
    collate_fn, transform = launch._offline_io(
        algorithm, cfg.model.input_modality, cfg.data.max_length, ttt_length=t.ttt_length, use_usp_preprocess=False
    )
    loader = FeatureDataLoader(
        launch.LocalFeatureStore(cfg.run_id),
        refs=refs,
        batch_size=t.batch_size,
        collate_fn=collate_fn,
        per_sample_transform=transform,
        drop_last=True,
        strategy=algorithm.name,
        num_workers=cfg.data.dataloader_num_workers,
    )
    return refs, list(loader)


def bits(t):
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


@pytest.mark.parametrize("precision", [None, "fp8"])
def test_specforge_train_data_path_yields_the_export_batches(tmp_path, precision):
    from eagle_io.interop.specforge_train import SCHEME, specforge_seams

    ds = write(tmp_path / "ds", precision)
    export_specforge(ds, tmp_path / "sf")
    cfg = config(tmp_path, ds)
    # SpecForge alone lists .ckpt files only: it finds no sample in an eagle-io dataset.
    assert batches(cfg)[0] == []
    with specforge_seams():
        for epoch in (0, 1):
            refs, ours = batches(cfg, epoch=epoch)
            export_refs, theirs = batches(cfg, [f"data.hidden_states_path={tmp_path / 'sf'}"], epoch=epoch)
            assert all(r.feature_store_uri.startswith(SCHEME) for r in refs)
            assert all(r.feature_store_uri.startswith("file://") for r in export_refs)
            assert len(ours) == len(theirs) == len(LENGTHS) // 2
            mismatches = 0
            for a, b in zip(ours, theirs, strict=True):
                assert a.sample_ids == b.sample_ids and a.metadata == b.metadata
                assert (
                    set(a.tensors)
                    == set(b.tensors)
                    == {
                        "input_ids",
                        "attention_mask",
                        "loss_mask",
                        "hidden_state",
                        "target",
                    }
                )
                for k in a.tensors:
                    x, y = a.tensors[k], b.tensors[k]
                    mismatches += x.dtype != y.dtype or x.shape != y.shape or not torch.equal(bits(x), bits(y))
            assert mismatches == 0
    # The states are the dataset's (dequantised by eagle-io when stored as FP8), not zeros or a constant.
    first = ours[0].tensors["hidden_state"]
    assert first.dtype == torch.bfloat16 and first.shape[-1] == 3 * H and first.float().std() > 1.0
    assert max(b.tensors["input_ids"].shape[1] for b in ours) == 36  # truncated to data.max_length


def test_seams_are_restored_and_other_paths_stay_specforge(tmp_path):
    import specforge.algorithms.builtin as builtin
    import specforge.launch as launch

    from eagle_io.interop.specforge_train import EagleIoFeatureStore, specforge_seams

    before = builtin.builtin_algorithm_registry, launch.LocalFeatureStore
    with specforge_seams():
        assert launch.LocalFeatureStore is EagleIoFeatureStore
        assert builtin.builtin_algorithm_registry().names == before[0]().names
    assert (builtin.builtin_algorithm_registry, launch.LocalFeatureStore) == before


def test_cli_plans_the_run_and_refuses_what_it_cannot_serve(tmp_path, capsys):
    from eagle_io.cli import main

    ds = write(tmp_path / "ds", None)
    assert main(["specforge-train", "--config", str(config(tmp_path, ds)), "--plan"]) == 0
    assert "worker" in capsys.readouterr().out
    cases = [
        (config(tmp_path, ds), ["model.vocab_mapping_path="], "eagle-io vocab-map"),
        (config(tmp_path, ds), ["deployment.trainer.nproc_per_node=2"], "torchrun --standalone --nproc_per_node 2"),
    ]
    for cfg, overrides, message in cases:
        assert main(["specforge-train", "--config", str(cfg), *overrides]) == 2
        assert message in capsys.readouterr().err


def test_a_bad_reference_is_named(tmp_path):
    from eagle_io.interop.specforge_train import read_ref

    ds = write(tmp_path / "ds", None)
    manifest = ds / "manifest.json"
    with pytest.raises(InvalidArgumentError, match="past the dataset's 23 samples"):
        read_ref(f"eagleio://{manifest}#23")
    with pytest.raises(InvalidArgumentError, match="not an eagleio://"):
        read_ref(f"file://{manifest}#1")
    rec = read_ref(f"eagleio://{manifest}#5")
    assert rec["aux_hidden_state"].shape == (1, LENGTHS[5], 3 * H) and rec["loss_mask"].dtype == torch.int64
