"""The names the command line offers and the code that runs them accepts, each list defined once.

No torch here: argparse refuses an unknown name, and `--help` answers, without importing it.
"""

from __future__ import annotations

# bench decode's and bench kv's models: the shapes of published models (each one's config.json); weights are random.
DECODE_PRESETS: dict[str, dict] = {
    "tiny": dict(arch="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512, max_position_embeddings=4096, rope_theta=10000.0,
                 tie_word_embeddings=False),
    "llama-1b": dict(arch="llama", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,  # Llama 3.2 1B
                     num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                     max_position_embeddings=131072, rope_theta=500000.0, tie_word_embeddings=True),
    "tinyllama-1.1b": dict(arch="llama", hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                           num_attention_heads=32, num_key_value_heads=4, vocab_size=32000,
                           max_position_embeddings=2048, rope_theta=10000.0, tie_word_embeddings=False),
    "llama-3b": dict(arch="llama", hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,  # Llama 3.2 3B
                     num_attention_heads=24, num_key_value_heads=8, vocab_size=128256,
                     max_position_embeddings=131072, rope_theta=500000.0, tie_word_embeddings=True),
    "llama-8b": dict(arch="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,  # Llama 3.1 8B
                     num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                     max_position_embeddings=131072, rope_theta=500000.0, tie_word_embeddings=False),
    "qwen2.5-0.5b": dict(arch="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                         max_position_embeddings=32768, rope_theta=1000000.0, tie_word_embeddings=True),
    "qwen2.5-3b": dict(arch="qwen2", hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                       num_attention_heads=16, num_key_value_heads=2, vocab_size=151936,
                       max_position_embeddings=32768, rope_theta=1000000.0, tie_word_embeddings=True),
    # Llama 3.1 70B: too large for one GPU (141 GB of bf16 weights): tensor-parallel only, each rank builds only
    # its own shard (serve/engine.py); TP_ONLY names it
    "llama-70b": dict(arch="llama", hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                      num_attention_heads=64, num_key_value_heads=8, vocab_size=128256,
                      max_position_embeddings=131072, rope_theta=500000.0, tie_word_embeddings=False),
}
TP_ONLY = ("llama-70b",)  # presets bench decode builds only shard by shard (--tp): transformers' build is whole

# bench decode's ways to schedule a step, in the order its tables list them (serve/decode.py says what each does)
DECODE_MODES = ("sync", "async", "staged", "drain")
KV_MODES = ("sync", "async")  # bench kv's: each restore and spill crossing waited for, or not

# collectives' element types: the name on the command line and the torch dtype (its attribute name) it stands for
SECURE_DTYPES = {"float": "float32", "half": "float16", "bfloat16": "bfloat16", "double": "float64",
                 "int32": "int32", "int64": "int64", "uint8": "uint8"}

# bench ddp's models (secure/bench.py builds each, randomly initialised)
DDP_MODELS = ("resnet50", "bert-large", "gpt2-large")
