"""An HF checkpoint hundreds of GB on paper and a few MB on disk: real safetensors headers and real head tensors
(embedding, final norm, lm_head), every decoder layer's weights a hole of a sparse file (``truncate`` past the
written bytes: reading them would return zeros, slowly; nothing in the head-only commands may read them).

Layer shapes are not the config's (one tall ``down_proj`` per layer holds the paper size), so a whole-model load
counts hundreds of GB from the headers while the head stays small enough to train a draft against on a CPU.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

#: the safetensors spelling of the dtypes written
_ST = {torch.bfloat16: "BF16", torch.float32: "F32", torch.float8_e4m3fn: "F8_E4M3"}
FP8_BLOCK = 128


def fp8_blocks(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(e4m3 weight, weight_scale_inv [ceil(r/128), ceil(c/128)], the bfloat16 values they stand for), block by
    block as DeepSeek-V3 / Kimi-K2 checkpoints store them."""
    rows, cols = w.shape
    nr, nc = -(-rows // FP8_BLOCK), -(-cols // FP8_BLOCK)
    q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    scale = torch.empty(nr, nc, dtype=torch.float32)
    back = torch.empty(rows, cols, dtype=torch.bfloat16)
    for i in range(nr):
        for j in range(nc):
            rs, cs = slice(i * FP8_BLOCK, (i + 1) * FP8_BLOCK), slice(j * FP8_BLOCK, (j + 1) * FP8_BLOCK)
            block = w[rs, cs].float()
            s = block.abs().max().clamp(min=1e-12) / 448.0
            scale[i, j] = s
            q[rs, cs] = (block / s).to(torch.float8_e4m3fn)
            back[rs, cs] = (q[rs, cs].float() * s).to(torch.bfloat16)
    return q, scale, back


def _write_file(path: Path, entries: list[tuple[str, torch.dtype, tuple[int, ...], torch.Tensor | None]]) -> int:
    """One safetensors file: the header of every entry; the data of those with a tensor; the rest left a hole.
    Returns the file's size."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, dtype, shape, _ in entries:
        n = torch.empty((), dtype=dtype).element_size()
        for d in shape:
            n *= d
        header[name] = {"dtype": _ST[dtype], "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    base = 8 + len(raw)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for name, _, _, t in entries:
            if t is not None:
                f.seek(base + header[name]["data_offsets"][0])
                f.write(t.contiguous().view(torch.uint8).numpy().tobytes())
        f.truncate(base + offset)
    return base + offset


def build_sparse_checkpoint(
    out: str | Path,
    *,
    hidden: int = 64,
    vocab: int = 256,
    layers: int = 4,
    paper_bytes: int = 300 << 30,
    sharded: bool = True,
    fp8: bool = False,
    tied: bool = False,
    lm_head: torch.Tensor | None = None,
    seed: int = 0,
) -> tuple[Path, dict[str, torch.Tensor]]:
    """Writes the checkpoint to ``out`` and returns ``(out, values)``: ``values["embed"]`` and
    ``values["lm_head"]`` as the checkpoint means them (bfloat16; an FP8 tensor dequantised block by block here),
    ``values["norm"]``.

    Args:
        paper_bytes: the layers' size on paper (bf16 ``down_proj`` tensors, one per layer).
        sharded: shards named by ``model.safetensors.index.json`` (the embedding first in the first shard, the norm and
            lm_head last in the last; each shard mostly holes), else one ``model.safetensors``.
        fp8: embedding and lm_head stored as float8_e4m3fn with 128 x 128 ``weight_scale_inv`` blocks.
        tied: no lm_head tensor (``tie_word_embeddings``): the embedding is the head.
        lm_head: the lm_head's values (default: random).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    values = {
        "embed": (torch.randn(vocab, hidden, generator=g) * 0.5).to(torch.bfloat16),
        "norm": (1 + 0.1 * torch.randn(hidden, generator=g)).to(torch.bfloat16),
    }
    head = lm_head if lm_head is not None else torch.randn(vocab, hidden, generator=g) * 0.5
    values["lm_head"] = values["embed"] if tied else head.to(torch.bfloat16)

    def weights(name: str, key: str) -> list:
        if not fp8:
            return [(name, torch.bfloat16, tuple(values[key].shape), values[key])]
        q, scale, back = fp8_blocks(values[key].float())
        values[key] = back
        scale_name = name + "_scale_inv"
        return [(name, torch.float8_e4m3fn, tuple(q.shape), q), (scale_name, torch.float32, tuple(scale.shape), scale)]

    first = weights("model.embed_tokens.weight", "embed")
    if tied:
        values["lm_head"] = values["embed"]
    cols = max(1, paper_bytes // layers // 2 // hidden)
    body = [(f"model.layers.{i}.mlp.down_proj.weight", torch.bfloat16, (hidden, cols), None) for i in range(layers)]
    body += [(f"model.layers.{i}.input_layernorm.weight", torch.bfloat16, (hidden,), None) for i in range(layers)]
    last = [("model.norm.weight", torch.bfloat16, (hidden,), values["norm"])]
    if not tied:
        last += weights("lm_head.weight", "lm_head")
    if sharded:
        half = layers // 2
        parts = [first + body[:half], body[half:layers] + body[layers:], last]
        names = [f"model-{i + 1:05d}-of-{len(parts):05d}.safetensors" for i in range(len(parts))]
        total = sum(_write_file(out / n, p) for n, p in zip(names, parts, strict=True))
        weight_map = {e[0]: n for n, p in zip(names, parts, strict=True) for e in p}
        (out / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1)
        )
    else:
        _write_file(out / "model.safetensors", first + body + last)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": 128,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": vocab,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": tied,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "dtype": "bfloat16",
    }
    if fp8:
        config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [FP8_BLOCK, FP8_BLOCK]}
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return out, values
