"""A tiny GPT: nanoGPT's model (``model.py``) shrunk, its attention written out (explicit
matmuls, which ``FlopCounterMode`` counts on every device), no biases, no dropout. Shared
by the Throughput tests and the nanoGPT port (pytest puts this folder on ``sys.path``)."""

from __future__ import annotations

import math

import torch
from torch import nn

# the model: vocabulary, block size (T), layers (L), heads (H), embedding; a batch of B
VOCAB, T, L, H, EMBD, B = 32, 8, 2, 2, 16, 4
Q = EMBD // H


class Block(nn.Module):
    """nanoGPT's block without biases, its attention the non-flash path (explicit
    matmuls, which FlopCounterMode counts on every device)."""

    def __init__(self) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(EMBD, bias=False), nn.LayerNorm(EMBD, bias=False)
        self.c_attn = nn.Linear(EMBD, 3 * EMBD, bias=False)
        self.attn_proj = nn.Linear(EMBD, EMBD, bias=False)
        self.c_fc = nn.Linear(EMBD, 4 * EMBD, bias=False)
        self.mlp_proj = nn.Linear(4 * EMBD, EMBD, bias=False)
        self.register_buffer("mask", torch.tril(torch.ones(T, T)).view(1, 1, T, T))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.size()
        q, k, v = self.c_attn(self.ln_1(x)).split(EMBD, dim=2)
        q, k, v = (z.view(b, t, H, c // H).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.attn_proj(y)
        return x + self.mlp_proj(nn.functional.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, EMBD), nn.Embedding(T, EMBD)
        self.h = nn.ModuleList(Block() for _ in range(L))
        self.ln_f = nn.LayerNorm(EMBD, bias=False)
        self.lm_head = nn.Linear(EMBD, VOCAB, bias=False)
        self.wte.weight = self.lm_head.weight  # tied, as in nanoGPT

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x)).view(-1, VOCAB)

    def get_num_params(self) -> int:
        """nanoGPT's: every parameter but the position embeddings."""
        return sum(p.numel() for p in self.parameters()) - self.wpe.weight.numel()

    def estimate_mfu(self, fwdbwd_per_iter: int, dt: float, peak: float) -> float:
        """nanoGPT's ``estimate_mfu``, its peak (A100's 312e12) a parameter."""
        N = self.get_num_params()
        flops_per_token = 6 * N + 12 * L * H * Q * T
        flops_per_fwdbwd = flops_per_token * T
        flops_per_iter = flops_per_fwdbwd * fwdbwd_per_iter
        flops_achieved = flops_per_iter * (1.0 / dt)  # per second
        return flops_achieved / peak


def matmul_parameters(module: nn.Module) -> int:
    """The parameters that take part in matmuls: all but the LayerNorms' weights and the
    position embeddings (the token embeddings are the tied lm_head's)."""
    norms = sum(
        p.numel() for m in module.modules() if isinstance(m, nn.LayerNorm) for p in m.parameters()
    )
    return module.get_num_params() - norms  # type: ignore[operator]
