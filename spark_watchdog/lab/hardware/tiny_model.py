"""Build a tiny random-weight Llama model and its tokenizer, offline.

Run with the python of the real-vLLM environment (scripts/real_vllm_env.py;
it has torch, transformers and tokenizers), not the project's;
:func:`spark_watchdog.lab.hardware.real_vllm.build_tiny_model` does. Nothing is
downloaded. The weights are random from a fixed seed: the model serves
nonsense at real vLLM speed on a CPU, which is all the real-vLLM tests and
the lab need (requests that progress, an engine that can be stopped).

    VLLM_PYTHON spark_watchdog/lab/hardware/tiny_model.py OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

# A few sentences to train the byte-level BPE on: the vocabulary is small and
# the same on every run.
_TEXT = (
    "The watchdog reads the engine's counters every two seconds. "
    "A node that stops answering is fenced before serving restarts. "
    "Tokens flow while requests run; a wedged engine stops the counters. "
    "Power is cut only when the host is frozen and the outlet reads off. "
) * 8

VOCAB_SIZE = 384
HIDDEN = 1024
LAYERS = 4
HEADS = 16
MAX_POSITIONS = 1024


def build(out: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([_TEXT], trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>")
    fast.model_max_length = MAX_POSITIONS

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=HIDDEN,
        intermediate_size=HIDDEN * 2,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        tie_word_embeddings=True,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    fast.save_pretrained(out)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: tiny_model.py OUT_DIR", file=sys.stderr)
        return 2
    build(Path(argv[0]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
