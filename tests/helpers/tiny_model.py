"""A tiny Hugging Face model directory for `eagle-io generate` in the reliability tests.

Like tests/test_capture_session.py's ``tiny_model_dir`` (a random tiny Llama saved with a real chat
tokenizer), but the tokenizer is a byte-level BPE trained in a fraction of a second on the ShareGPT
fixture, with SmolLM2's ChatML turn format (without its default system prompt): loading SmolLM2's
tokenizer from its GGUF file takes ~15 s on a loaded 2-core machine, which the crash tests cannot
afford. The model's vocabulary is the tokenizer's (a few thousand ids), so a forward costs little.
"""

from __future__ import annotations

import json
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
FIXTURE = TESTS / "fixtures" / "data" / "sharegpt_real_slice.json"
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def tiny_llama_config(vocab_size: int, hidden_size: int, num_hidden_layers: int, **overrides):
    """The tests' tiny random Llama shape: 4 attention heads over 2 KV heads, an MLP of 128, 512 positions;
    ``overrides``: other ``LlamaConfig`` fields (``initializer_range``, ``attn_implementation``, ...)."""
    from transformers import LlamaConfig

    shape = {"intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2}
    shape["max_position_embeddings"] = 512
    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_hidden_layers, **{**shape, **overrides}
    )


def build_tiny_model_dir(out: str | Path, *, hidden: int = 32, layers: int = 8, vocab: int = 2000) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    texts = [t.get("value", "") for r in json.loads(FIXTURE.read_text()) for t in r.get("conversations", [])]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator([t for t in texts if isinstance(t, str)], trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None
    )
    tok.chat_template = CHATML
    tok.save_pretrained(out)
    torch.manual_seed(0)
    cfg = tiny_llama_config(len(tok), hidden, layers, intermediate_size=64)
    LlamaForCausalLM(cfg).eval().save_pretrained(out)
    return out
