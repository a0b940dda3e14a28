"""One rank of a 2-epoch training feed under ``torchrun`` (gloo, CPU), for tests/test_feed_torchrun.py.

    torchrun --nproc-per-node 2 torchrun_feed.py DATASET OUT [--kill-at STEP]

Every rank reads DATASET through a ShardDataset, a LengthGroupedBatchSampler (``uneven="split"``: every sample once
per epoch, the same step count on every rank) and a torchdata StatefulDataLoader with one worker process; each step
all-reduces the batch's token count (the collective of a DDP step: ranks with different step counts would hang),
then checkpoints ``{"epoch", "loader": loader.state_dict(), "seen"}`` atomically to OUT/ckpt-rN.pt. An existing
checkpoint is resumed. ``--kill-at S``: rank 0 SIGKILLs itself right after checkpointing step S of epoch 0 (torchrun
then stops the job). At the end each rank writes OUT/seen-rN.json: ``{"epochs": {epoch: the sample ids it trained on,
in order}, "resumed_after": samples its checkpoint held when it started (0 for a fresh start)}``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
from pathlib import Path

import torch
import torch.distributed as dist
from torchdata.stateful_dataloader import StatefulDataLoader

from eagle_io.feed import LengthGroupedBatchSampler, PaddingCollator, ShardDataset
from eagle_io.store import layout

EPOCHS = 2


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("dataset")
    p.add_argument("out", type=Path)
    p.add_argument("--kill-at", type=int)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ds = ShardDataset(args.dataset, max_length=64)
    sampler = LengthGroupedBatchSampler(
        ds.lengths(), max_tokens=128, rank=rank, world_size=world, seed=17, uneven="split"
    )
    loader = StatefulDataLoader(
        ds, batch_sampler=sampler, collate_fn=PaddingCollator(), num_workers=1, multiprocessing_context="fork"
    )
    ckpt = args.out / f"ckpt-r{rank}.pt"
    start, seen, resumed_after = 0, {str(e): [] for e in range(EPOCHS)}, 0
    if ckpt.exists():
        saved = torch.load(ckpt, weights_only=True)
        start, seen = saved["epoch"], saved["seen"]
        resumed_after = sum(map(len, seen.values()))
        loader.load_state_dict(saved["loader"])
    for epoch in range(start, EPOCHS):
        sampler.set_epoch(epoch)
        for step, batch in enumerate(loader):
            tokens = torch.tensor([int(batch["attention_mask"].sum())])
            dist.all_reduce(tokens)
            seen[str(epoch)].extend(batch["sample_ids"])
            buf = io.BytesIO()
            torch.save({"epoch": epoch, "loader": loader.state_dict(), "seen": seen}, buf)
            layout.write_atomic(ckpt, buf.getvalue())
            if rank == 0 and epoch == 0 and step + 1 == args.kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
    result = {"epochs": seen, "resumed_after": resumed_after}
    layout.write_atomic(args.out / f"seen-r{rank}.json", json.dumps(result).encode())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
