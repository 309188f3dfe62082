"""Write examples/logits.safetensors: two small tensors of pre-cap values (deterministic)."""

from pathlib import Path

import torch
from safetensors.torch import save_file


def main() -> None:
    gen = torch.Generator().manual_seed(2024)
    attention = (torch.randn(64, 256, generator=gen) * 25.0).to(torch.bfloat16)  # a few past 104
    final = torch.randn(32, 512, generator=gen) * 12.0
    final[:, 0] += 110.0  # one confident class per row, in the bf16 dead zone at c = 30
    save_file({"attn_scores": attention, "final_logits": final}, str(Path(__file__).with_name("logits.safetensors")))


if __name__ == "__main__":
    main()
