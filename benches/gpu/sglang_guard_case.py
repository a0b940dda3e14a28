"""One case of the GPU check of the eagle-io SGLang serving guard (run by check_sglang_guard.sh).

    python sglang_guard_case.py make WORKDIR            # tiny random Llama target + EAGLE-3 draft (SpecForge layout)
    python sglang_guard_case.py serve WORKDIR ALGORITHM  # sglang.Engine with the draft; prints one JSON line
    python sglang_guard_case.py capture WORKDIR          # eagle-io capture through a capture-only Engine on the GPU

Checkpoints: target LlamaForCausalLM (hidden 512, 8 layers, vocab 32000, random bf16 weights, no tokenizer:
the engine runs with skip_tokenizer_init and token ids); EAGLE-3 draft with fc [512, 3 x 512], midlayer.*,
d2t/t2d, draft_vocab_size 8000 and eagle_config ids [1, 3, 4] (SGLang's Llama setter captures [2, 4, 5]).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

H, N, V, DV, FFN, HEADS, KV = 512, 8, 32000, 8000, 1024, 8, 4


def make(work: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    target = work / "target"
    cfg = LlamaConfig(
        hidden_size=H,
        intermediate_size=FFN,
        num_hidden_layers=N,
        num_attention_heads=HEADS,
        num_key_value_heads=KV,
        vocab_size=V,
        max_position_embeddings=4096,
        torch_dtype="bfloat16",
    )
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(target)
    draft = work / "draft"
    draft.mkdir(parents=True, exist_ok=True)
    hd = H // HEADS
    dcfg = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": H,
        "intermediate_size": FFN,
        "num_hidden_layers": 1,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV,
        "head_dim": hd,
        "vocab_size": V,
        "draft_vocab_size": DV,
        "target_hidden_size": H,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 4], "use_aux_hidden_state": True},
    }
    (draft / "config.json").write_text(json.dumps(dcfg, indent=2))

    def w(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape) * 0.02).to(torch.bfloat16)

    ones = lambda n: torch.ones(n, dtype=torch.bfloat16)  # noqa: E731
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[:DV] = True
    save_file(
        {
            "midlayer.self_attn.q_proj.weight": w(HEADS * hd, 2 * H),
            "midlayer.self_attn.k_proj.weight": w(KV * hd, 2 * H),
            "midlayer.self_attn.v_proj.weight": w(KV * hd, 2 * H),
            "midlayer.self_attn.o_proj.weight": w(H, HEADS * hd),
            "midlayer.mlp.gate_proj.weight": w(FFN, H),
            "midlayer.mlp.up_proj.weight": w(FFN, H),
            "midlayer.mlp.down_proj.weight": w(H, FFN),
            "midlayer.input_layernorm.weight": ones(H),
            "midlayer.hidden_norm.weight": ones(H),
            "midlayer.post_attention_layernorm.weight": ones(H),
            "norm.weight": ones(H),
            "fc.weight": w(H, 3 * H),
            "lm_head.weight": w(DV, H),
            "embed_tokens.weight": w(V, H),
            "d2t": torch.zeros(DV, dtype=torch.int64),  # draft index i -> target id i
            "t2d": t2d,
        },
        str(draft / "model.safetensors"),
    )
    print(json.dumps({"target": str(target), "draft": str(draft)}))


def serve(work: Path, algorithm: str) -> None:
    import sglang

    out: dict = {
        "algorithm": algorithm,
        "sglang": sglang.__version__,
        "env": {k: v for k, v in os.environ.items() if k.startswith("EAGLE_IO_")},
    }
    t0 = time.time()
    try:
        engine = sglang.Engine(
            model_path=str(work / "target"),
            speculative_algorithm=algorithm,
            speculative_draft_model_path=str(work / "draft"),
            speculative_num_steps=3,
            speculative_eagle_topk=1,
            speculative_num_draft_tokens=4,
            skip_tokenizer_init=True,
            mem_fraction_static=0.5,
            cuda_graph_max_bs=4,
            log_level="info",
        )
    except BaseException as e:  # the guard aborts startup: the engine raises in this (main) process
        out.update(started=False, error=f"{type(e).__name__}: {e}"[:2000], startup_s=round(time.time() - t0, 1))
        print(json.dumps(out), flush=True)
        return
    out.update(started=True, startup_s=round(time.time() - t0, 1))
    try:
        prompts = [[(7 * i + j) % 1000 + 10 for j in range(40)] for i in range(4)]
        res = engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": 48, "temperature": 0})
        out["generated"] = [len(r.get("output_ids", [])) for r in res]
        out["accept"] = [r.get("meta_info", {}).get("spec_accept_length") for r in res]
    except BaseException as e:
        out["generate_error"] = f"{type(e).__name__}: {e}"[:2000]
    finally:
        engine.shutdown()
    print(json.dumps(out), flush=True)


def capture(work: Path) -> None:
    """Capture-only Engine on the GPU (device tensors -> pinned ring -> shards), then verify and compare with the
    HF reference path on the same GPU."""
    from types import SimpleNamespace

    import sglang
    import torch
    from transformers import LlamaForCausalLM

    import eagle_io

    g = torch.Generator().manual_seed(1)
    samples = [
        SimpleNamespace(
            index=i,
            id=None,
            input_ids=torch.randint(10, V - 10, (n,), generator=g),
            loss_mask=(torch.rand(n, generator=g) > 0.5).to(torch.int64),
        )
        for i, n in enumerate([1, 7, 64, 300, 1000, 33, 129, 512])
    ]
    engine = sglang.Engine(
        model_path=str(work / "target"),
        enable_return_aux_hidden_states=True,
        speculative_algorithm="EAGLE3",
        chunked_prefill_size=-1,
        disable_radix_cache=True,
        skip_tokenizer_init=True,
        mem_fraction_static=0.5,
        dtype="bfloat16",
    )
    try:
        with eagle_io.capture(engine, work / "sglang-capture", target_info={"model_id": "tiny"}) as cap:
            for i in range(0, len(samples), 4):
                cap.submit(samples[i : i + 4])
        manifest = cap.manifest
    finally:
        engine.shutdown()
    bad = eagle_io.Dataset.verify(work / "sglang-capture")
    model = LlamaForCausalLM.from_pretrained(work / "target", torch_dtype=torch.float32).cuda().eval()
    info = {"num_layers": N, "hidden_size": H, "vocab_size": V, "model_id": "tiny"}
    ids = manifest["metadata"]["aux_layer_ids"]
    with torch.no_grad(), eagle_io.capture(model, work / "hf-capture", target_info=info, aux_layer_ids=ids) as cap:
        cap.submit(samples)
    a, b = eagle_io.Dataset(work / "sglang-capture"), eagle_io.Dataset(work / "hf-capture")
    rel = {}
    for s in samples:
        x, y = a[a.position(s.index)], b[b.position(s.index)]
        assert torch.equal(x["input_ids"], y["input_ids"]) and torch.equal(x["loss_mask"], y["loss_mask"])
        for k in ("aux_hidden_states", "hidden_states"):
            d = (x[k].float() - y[k].float()).abs().max() / y[k].float().abs().max()
            rel[k] = max(rel.get(k, 0.0), float(d))
    print(json.dumps({"samples": len(a), "verify_bad": len(bad), "aux_layer_ids": ids, "max_rel_diff": rel}))


if __name__ == "__main__":
    cmd, work = sys.argv[1], Path(sys.argv[2])
    if cmd == "make":
        make(work)
    elif cmd == "capture":
        capture(work)
    else:
        serve(work, sys.argv[3])
