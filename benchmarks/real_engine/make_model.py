"""Build a tiny randomly initialised Llama (2 layers, hidden 256, ~1.8M parameters) and a
byte-level BPE tokenizer trained locally with ``tokenizers`` — no model hub. Run with the vLLM
venv's python (needs torch, transformers, tokenizers):

    python make_model.py OUT_DIR
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

WORDS = ("the model router replica cache token batch queue serve prefix decode prefill latency "
         "request answer question document system user assistant fleet telemetry stale").split()
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def corpus(n: int = 4000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 60))) for _ in range(n)]


def main(out: str) -> int:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    dest = Path(out)
    if (dest / "config.json").is_file() and (dest / "tokenizer.json").is_file():
        print(f"model already built in {dest}")
        return 0
    dest.mkdir(parents=True, exist_ok=True)
    specials = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1024, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", model_max_length=512)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(dest)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(fast), hidden_size=256, intermediate_size=512,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                      max_position_embeddings=512, bos_token_id=fast.bos_token_id,
                      eos_token_id=fast.eos_token_id, tie_word_embeddings=False,
                      torch_dtype="float32")
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(dest, safe_serialization=True)
    n = sum(p.numel() for p in model.parameters())
    print(f"tiny Llama with {n / 1e6:.2f}M parameters and a {len(fast)}-token BPE in {dest}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_model.py OUT_DIR")
    sys.exit(main(sys.argv[1]))
