"""A small decoder-only transformer used by the demo, the tests and the benchmarks.

``make_decoder(num_layers, hidden, heads, seed)`` builds it with random weights made locally
(no downloads). ``forward(x)`` takes ``x`` of shape ``[num_tokens, hidden]``; ``num_tokens``
is the dynamic size. Attention is the custom op ``fxcodegen_toy::attention`` (registered
with :func:`torch.library.custom_op`, with a fake impl), so Dynamo keeps it as one opaque
node and graphs split at ``"fxcodegen_toy::attention"``.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["ATTENTION_OP", "Decoder", "DecoderLayer", "attention", "make_decoder"]

ATTENTION_OP = "fxcodegen_toy::attention"
"""The splitting op name of the toy decoder."""


def _attention_impl(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_heads: int
) -> torch.Tensor:
    tokens, width = q.shape
    head_dim = width // num_heads

    def heads(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(tokens, num_heads, head_dim).transpose(0, 1)

    out = torch.nn.functional.scaled_dot_product_attention(
        heads(q), heads(k), heads(v), is_causal=True
    )
    return out.transpose(0, 1).reshape(tokens, width)


def _register() -> object:
    # Re-importing this module (e.g. importlib.reload) must not register the op twice.
    try:
        return torch.ops.fxcodegen_toy.attention
    except (AttributeError, RuntimeError):
        pass

    @torch.library.custom_op(ATTENTION_OP, mutates_args=())
    def attention(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_heads: int
    ) -> torch.Tensor:
        """Causal multi-head attention over ``[tokens, heads * head_dim]`` inputs."""
        return _attention_impl(q, k, v, num_heads)

    @attention.register_fake
    def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_heads: int) -> torch.Tensor:
        if q.dim() != 2 or q.shape[1] % num_heads != 0:
            raise ValueError(f"attention expects [tokens, heads * head_dim], got {tuple(q.shape)}")
        return torch.empty_like(q)

    return torch.ops.fxcodegen_toy.attention


attention = _register()
"""``torch.ops.fxcodegen_toy.attention``: ``attention(q, k, v, num_heads) -> Tensor``."""


class RMSNorm(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # eps is a literal on purpose: with ``dynamic=True`` Dynamo turns float attributes and
        # globals into tensor inputs read with ``.item()``; a code constant stays a literal.
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class DecoderLayer(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.attn_norm = RMSNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.out = nn.Linear(hidden, hidden, bias=False)
        self.mlp_norm = RMSNorm(hidden)
        self.gate_up = nn.Linear(hidden, 4 * hidden, bias=False)
        self.down = nn.Linear(2 * hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.attn_norm(x)).chunk(3, dim=-1)
        x = x + self.out(attention(q, k, v, self.heads))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(torch.nn.functional.silu(gate) * up)


class Decoder(nn.Module):
    def __init__(self, num_layers: int, hidden: int, heads: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.layers = nn.ModuleList(DecoderLayer(hidden, heads) for _ in range(num_layers))
        self.norm = RMSNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


def make_decoder(num_layers: int = 4, hidden: int = 64, heads: int = 4, seed: int = 0) -> Decoder:
    """A :class:`Decoder` in eval mode with deterministic random weights (made locally)."""
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    if hidden < 1 or heads < 1 or hidden % heads != 0:
        raise ValueError(f"hidden ({hidden}) must be a positive multiple of heads ({heads})")
    gen = torch.Generator().manual_seed(seed)
    model = Decoder(num_layers, hidden, heads)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
    return model.eval().requires_grad_(False)
