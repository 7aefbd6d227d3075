"""PyTorch reference for rlstream's Llama-family ONNX model (parity tests and benchmarks).

Plain torch, no transformers: token embedding, pre-norm decoder blocks (RMSNorm -> causal GQA
attention with HF rotate_half RoPE (rope_scaling linear / llama3; Qwen3: per-head RMSNorm of q and
k before RoPE) -> residual, RMSNorm -> SwiGLU MLP -> residual), final RMSNorm,
lm_head (tied to the embedding when tie_word_embeddings) and an optional value head
`score.weight [1, D]` applied to the final-norm hidden states.

Weights use Hugging Face names and are read from `.safetensors` with the small reader below
(struct + json; the `safetensors` package is not assumed). Shapes follow torch.nn.Linear: a
projection weight is [out, in] and y = x @ W^T (+ b).
"""
from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch

Tensor = torch.Tensor

# ---------------------------------------------------------------------------------------------
# safetensors: 8-byte little-endian header length, JSON header {name: {dtype, shape,
# data_offsets:[begin,end]}} (+ optional "__metadata__"), then the raw little-endian bytes.
# ---------------------------------------------------------------------------------------------

_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}
_NAMES = {v: k for k, v in _DTYPES.items()}


def load_safetensors(path: str) -> Dict[str, Tensor]:
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ValueError(f"{path}: header length {n} runs past the end of the file")
    header = json.loads(data[8:8 + n].decode("utf-8"))
    base = 8 + n
    out: Dict[str, Tensor] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _DTYPES:
            raise ValueError(f"{path}: tensor {name} has unsupported dtype {info['dtype']}")
        dt = _DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        shape = list(info["shape"])
        numel = math.prod(shape)
        if end - begin != numel * torch.empty(0, dtype=dt).element_size():
            raise ValueError(f"{path}: tensor {name} byte range {begin}..{end} does not match shape {shape}")
        if numel == 0:
            out[name] = torch.empty(shape, dtype=dt)
            continue
        buf = bytearray(data[base + begin:base + end])
        out[name] = torch.frombuffer(buf, dtype=dt).reshape(shape)
    return out


def save_safetensors(path: str, tensors: Dict[str, Tensor], metadata: Optional[Dict[str, str]] = None) -> None:
    header: Dict[str, object] = {}
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    blobs: List[bytes] = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        if t.dtype not in _NAMES:
            raise ValueError(f"tensor {name}: unsupported dtype {t.dtype}")
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for b in blobs:
            f.write(b)


# ---------------------------------------------------------------------------------------------
# Config (HF config.json keys)
# ---------------------------------------------------------------------------------------------

@dataclass
class LlamaConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    head_dim: int = 0
    model_type: str = "llama"
    rope_scaling: Optional[Dict[str, object]] = None

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_attention_heads {self.num_attention_heads}")
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads {self.num_attention_heads} is not a multiple of num_key_value_heads {self.num_key_value_heads}")

    @staticmethod
    def from_dict(d: Dict[str, object]) -> "LlamaConfig":
        need = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size"]
        missing = [k for k in need if k not in d]
        if missing:
            raise ValueError(f"config.json is missing {missing}")
        return LlamaConfig(
            hidden_size=int(d["hidden_size"]),
            intermediate_size=int(d["intermediate_size"]),
            num_hidden_layers=int(d["num_hidden_layers"]),
            num_attention_heads=int(d["num_attention_heads"]),
            num_key_value_heads=int(d.get("num_key_value_heads") or d["num_attention_heads"]),
            vocab_size=int(d["vocab_size"]),
            max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=float(d.get("rope_theta", 10000.0)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            # Qwen2 always has q/k/v biases; the others follow attention_bias
            attention_bias=bool(d.get("attention_bias", d.get("model_type") == "qwen2")),
            head_dim=int(d.get("head_dim") or 0),
            model_type=str(d.get("model_type", "llama")),
            rope_scaling=d.get("rope_scaling"),  # type: ignore[arg-type]
        )

    @staticmethod
    def load(path: str) -> "LlamaConfig":
        with open(path, "r", encoding="utf-8") as f:
            return LlamaConfig.from_dict(json.load(f))


def param_shapes(cfg: LlamaConfig, value_head: bool = False) -> Dict[str, List[int]]:
    """Every weight the model reads, by HF name. A value model (value_head) has `score.weight`
    [1, D] instead of an LM head."""
    D, F, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    qd, kvd = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    s: Dict[str, List[int]] = {"model.embed_tokens.weight": [V, D]}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        s[p + "input_layernorm.weight"] = [D]
        s[p + "self_attn.q_proj.weight"] = [qd, D]
        s[p + "self_attn.k_proj.weight"] = [kvd, D]
        s[p + "self_attn.v_proj.weight"] = [kvd, D]
        if cfg.attention_bias:
            s[p + "self_attn.q_proj.bias"] = [qd]
            s[p + "self_attn.k_proj.bias"] = [kvd]
            s[p + "self_attn.v_proj.bias"] = [kvd]
        s[p + "self_attn.o_proj.weight"] = [D, qd]
        if cfg.model_type == "qwen3":
            s[p + "self_attn.q_norm.weight"] = [cfg.head_dim]
            s[p + "self_attn.k_norm.weight"] = [cfg.head_dim]
        s[p + "post_attention_layernorm.weight"] = [D]
        s[p + "mlp.gate_proj.weight"] = [F, D]
        s[p + "mlp.up_proj.weight"] = [F, D]
        s[p + "mlp.down_proj.weight"] = [D, F]
    s["model.norm.weight"] = [D]
    if value_head:
        s["score.weight"] = [1, D]
    elif not cfg.tie_word_embeddings:
        s["lm_head.weight"] = [V, D]
    return s


def load_params(cfg: LlamaConfig, path: str, value_head: bool = False, requires_grad: bool = False) -> Dict[str, Tensor]:
    raw = load_safetensors(path)
    out: Dict[str, Tensor] = {}
    for name, shape in param_shapes(cfg, value_head).items():
        if name not in raw:
            raise ValueError(f"{path}: missing weight {name} (expected shape {shape})")
        t = raw[name].to(torch.float32)
        if list(t.shape) != shape:
            raise ValueError(f"{path}: weight {name} has shape {list(t.shape)}, expected {shape}")
        out[name] = t.clone().requires_grad_(requires_grad)
    return out


def random_params(cfg: LlamaConfig, seed: int, value_head: bool = False, std: float = 0.02) -> Dict[str, Tensor]:
    g = torch.Generator().manual_seed(seed)
    out: Dict[str, Tensor] = {}
    for name, shape in param_shapes(cfg, value_head).items():
        if name.endswith("norm.weight"):
            out[name] = 1.0 + 0.1 * torch.randn(shape, generator=g)
        else:
            out[name] = std * torch.randn(shape, generator=g)
    return out


# ---------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------

def rms_norm(x: Tensor, w: Tensor, eps: float) -> Tensor:
    # y = x / sqrt(mean(x^2) + eps) * w
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_cos_sin(cfg: LlamaConfig, positions: Tensor) -> Tuple[Tensor, Tensor]:
    """positions [B, T] (int) -> cos, sin [B, 1, T, dh]; HF layout: frequencies duplicated halves."""
    dh = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dh, 2, dtype=torch.float32) / dh))
    rs = cfg.rope_scaling or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "linear":
        inv_freq = inv_freq / float(rs["factor"])
    elif kind == "llama3":
        # Llama 3.1: low frequencies divided by factor, high ones kept, a smooth ramp between
        factor, lo, hi = float(rs["factor"]), float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
        old = float(rs["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        smooth = (old / wavelen - lo) / (hi - lo)
        scaled = torch.where(wavelen > old / lo, inv_freq / factor, inv_freq)
        mid = (wavelen >= old / hi) & (wavelen <= old / lo)
        inv_freq = torch.where(mid, (1 - smooth) * inv_freq / factor + smooth * inv_freq, scaled)
    elif kind != "default":
        raise ValueError(f"rope_scaling type {kind} is not implemented here")
    freqs = positions.to(torch.float32)[..., None] * inv_freq  # [B, T, dh/2]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos()[:, None], emb.sin()[:, None]


def rotate_half(x: Tensor) -> Tensor:
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def linear(x: Tensor, w: Tensor, b: Optional[Tensor] = None) -> Tensor:
    y = x @ w.t()
    return y + b if b is not None else y


KV = List[Tuple[Tensor, Tensor]]


def forward(params: Dict[str, Tensor], cfg: LlamaConfig, input_ids: Tensor,
            positions: Optional[Tensor] = None, key_mask: Optional[Tensor] = None,
            past: Optional[KV] = None, inputs_embeds: Optional[Tensor] = None) -> Tuple[Tensor, KV]:
    """Hidden states after the final norm.

    inputs_embeds [B, T, D] replaces the token embeddings when given (a VLM's image tokens placed:
    vision_ref.py).

    input_ids [B, T] int64. positions [B, T] (default: past length + arange(T)). key_mask [B, S]
    bool over all keys (past + new; default: all valid). The new tokens are the last T of the S
    keys; query i sees key j when key_mask[b, j] and j <= S - T + i. Returns (h [B, T, D], kv) with
    kv[l] = (k, v) each [B, Hkv, S, dh] (RoPE already applied to k).
    """
    B, T = input_ids.shape
    H, Hkv, dh = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    P = past[0][0].shape[2] if past else 0
    S = P + T
    if positions is None:
        positions = (P + torch.arange(T)).unsqueeze(0).expand(B, T)
    if key_mask is None:
        key_mask = torch.ones(B, S, dtype=torch.bool)
    allowed = key_mask[:, None, None, :].bool() & (torch.arange(S)[None, :] <= (P + torch.arange(T))[:, None])[None, None]
    neg = torch.finfo(torch.float32).min
    bias = torch.zeros(B, 1, T, S).masked_fill(~allowed, neg)
    cos, sin = rope_cos_sin(cfg, positions)
    x = params["model.embed_tokens.weight"][input_ids] if inputs_embeds is None else inputs_embeds
    new_kv: KV = []
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        h = rms_norm(x, params[p + "input_layernorm.weight"], cfg.rms_norm_eps)
        q = linear(h, params[p + "self_attn.q_proj.weight"], params.get(p + "self_attn.q_proj.bias"))
        k = linear(h, params[p + "self_attn.k_proj.weight"], params.get(p + "self_attn.k_proj.bias"))
        v = linear(h, params[p + "self_attn.v_proj.weight"], params.get(p + "self_attn.v_proj.bias"))
        q = q.view(B, T, H, dh)
        k = k.view(B, T, Hkv, dh)
        if cfg.model_type == "qwen3":  # per-head RMSNorm of q and k before RoPE
            q = rms_norm(q, params[p + "self_attn.q_norm.weight"], cfg.rms_norm_eps)
            k = rms_norm(k, params[p + "self_attn.k_norm.weight"], cfg.rms_norm_eps)
        q = q.transpose(1, 2)
        k = k.transpose(1, 2)
        v = v.view(B, T, Hkv, dh).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if past:
            k = torch.cat([past[i][0], k], dim=2)
            v = torch.cat([past[i][1], v], dim=2)
        new_kv.append((k, v))
        rep = H // Hkv  # query head j uses kv head j // rep
        kr = k.repeat_interleave(rep, dim=1) if rep > 1 else k
        vr = v.repeat_interleave(rep, dim=1) if rep > 1 else v
        scores = (q @ kr.transpose(-1, -2)) / math.sqrt(dh) + bias
        att = torch.softmax(scores, dim=-1) @ vr  # [B, H, T, dh]
        att = att.transpose(1, 2).reshape(B, T, H * dh)
        x = x + linear(att, params[p + "self_attn.o_proj.weight"])
        h = rms_norm(x, params[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
        gate = linear(h, params[p + "mlp.gate_proj.weight"])
        up = linear(h, params[p + "mlp.up_proj.weight"])
        x = x + linear(torch.nn.functional.silu(gate) * up, params[p + "mlp.down_proj.weight"])
    return rms_norm(x, params["model.norm.weight"], cfg.rms_norm_eps), new_kv


def lm_head(params: Dict[str, Tensor], cfg: LlamaConfig, h: Tensor) -> Tensor:
    w = params["model.embed_tokens.weight"] if cfg.tie_word_embeddings else params["lm_head.weight"]
    return h @ w.t()


def value_head(params: Dict[str, Tensor], h: Tensor) -> Tensor:
    return (h @ params["score.weight"].t()).squeeze(-1)


def positions_from_mask(mask: Tensor) -> Tensor:
    """Per-row positions for left- or right-padded rows: cumsum(mask) - 1, clamped at 0."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def token_logprobs(params: Dict[str, Tensor], cfg: LlamaConfig, input_ids: Tensor,
                   attention_mask: Optional[Tensor] = None, temperature: float = 1.0) -> Tuple[Tensor, Tensor]:
    """log p(x_{t+1} | x_{<=t}) and the entropy of that distribution, both [B, T-1].

    Logits are divided by `temperature` first. Padding (attention_mask 0) may be on either side.
    """
    positions = positions_from_mask(attention_mask) if attention_mask is not None else None
    key_mask = attention_mask.bool() if attention_mask is not None else None
    h, _ = forward(params, cfg, input_ids, positions, key_mask)
    logits = lm_head(params, cfg, h[:, :-1]) / temperature
    logp = torch.log_softmax(logits, dim=-1)
    lp = logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1)
    return lp, ent


# ---------------------------------------------------------------------------------------------
# Losses and optimiser (what the ONNX training graph computes)
# ---------------------------------------------------------------------------------------------

def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def ppo_clip_loss(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor,
                  clip_low: float = 0.2, clip_high: float = 0.2, clip_c: float = 3.0) -> Tensor:
    """verl's vanilla PPO policy loss (Schulman et al. 2017; dual clip, Ye et al. 2020), token-mean.

    x = clamp(logp - old, -20, 20), r = e^x; L1 = -A r, L2 = -A clamp(r, 1-eps_lo, 1+eps_hi),
    Lc = max(L1, L2); for A < 0: min(-A c, Lc), else Lc.
    """
    ratio = torch.exp((logp - old_logp).clamp(-20.0, 20.0))
    pg1 = -adv * ratio
    pg2 = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    lc = torch.maximum(pg1, pg2)
    loss = torch.where(adv < 0, torch.minimum(-adv * clip_c, lc), lc)
    return masked_mean(loss, mask)


def ce_loss(logp: Tensor, mask: Tensor) -> Tensor:
    """Cross-entropy, token-mean over mask."""
    return masked_mean(-logp, mask)


@dataclass
class AdamWConfig:
    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0  # <= 0 disables clipping
    clip_eps: float = 1e-6  # coef = min(1, max_norm / (norm + clip_eps)), as torch.nn.utils.clip_grad_norm_


class AdamW:
    """Decoupled-weight-decay Adam (Loshchilov & Hutter 2019) with bias correction, after
    global-norm gradient clipping; the same update as torch.optim.AdamW + clip_grad_norm_."""

    def __init__(self, params: Dict[str, Tensor], cfg: AdamWConfig) -> None:
        self.params = params
        self.cfg = cfg
        self.m = {k: torch.zeros_like(v) for k, v in params.items()}
        self.v = {k: torch.zeros_like(v) for k, v in params.items()}
        self.t = 0

    @torch.no_grad()
    def step(self) -> float:
        c = self.cfg
        grads = {k: (p.grad if p.grad is not None else torch.zeros_like(p)) for k, p in self.params.items()}
        norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads.values()))
        coef = min(1.0, c.max_grad_norm / (norm + c.clip_eps)) if c.max_grad_norm > 0 else 1.0
        self.t += 1
        bc1 = 1.0 - c.beta1 ** self.t
        bc2 = 1.0 - c.beta2 ** self.t
        for k, p in self.params.items():
            g = grads[k] * coef
            p.mul_(1.0 - c.lr * c.weight_decay)
            self.m[k].mul_(c.beta1).add_(g, alpha=1.0 - c.beta1)
            self.v[k].mul_(c.beta2).addcmul_(g, g, value=1.0 - c.beta2)
            denom = (self.v[k] / bc2).sqrt().add_(c.eps)
            p.addcdiv_(self.m[k], denom, value=-c.lr / bc1)
            p.grad = None
        return norm


# ---------------------------------------------------------------------------------------------
# Generation with a KV cache (benchmark reference; sampling semantics as lib/model/sample.ts)
# ---------------------------------------------------------------------------------------------

def truncate_logits(z: Tensor, top_k: int, top_p: float) -> Tensor:
    """Top-k, then top-p (nucleus, Holtzman et al. 2020) masking of logits [B, V] with -inf."""
    if 0 < top_k < z.shape[-1]:
        kth = torch.topk(z, top_k, dim=-1).values[:, -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    if top_p < 1.0:
        asc, idx = torch.sort(z, dim=-1, descending=False)
        cum = torch.softmax(asc, -1).cumsum(-1)
        drop = cum <= (1.0 - top_p)
        drop[:, -1] = False  # always keep the most likely token
        z = z.masked_fill(drop.scatter(1, idx, drop), float("-inf"))
    return z


@torch.no_grad()
def generate(params: Dict[str, Tensor], cfg: LlamaConfig, prompts: Tensor, prompt_mask: Tensor,
             max_new: int, uniforms: Tensor, temperature: float = 1.0, eos: Optional[List[int]] = None,
             pad_id: int = 0, top_k: int = 0, top_p: float = 1.0) -> Tuple[Tensor, Tensor, Tensor]:
    """Left-padded prompts [B, P] -> (tokens [B, max_new], logprobs [B, max_new], lengths [B]).

    Inverse-CDF sampling (in vocabulary order) from softmax(logits / temperature) after top-k then
    top-p truncation (HF logits-warper formulation), with the given uniforms [B, max_new]; argmax
    when temperature == 0. The log-prob is that of the temperature-scaled distribution before
    truncation. Finished rows emit pad_id with log-prob 0. Stops early once every row has emitted
    an EOS.
    """
    B, P = prompts.shape
    eos_t = torch.tensor(eos or [], dtype=torch.long)
    mask = prompt_mask.bool()
    pos = positions_from_mask(mask)
    h, kv = forward(params, cfg, prompts, pos, mask)
    last_pos = pos[:, -1]
    logits = lm_head(params, cfg, h[:, -1])
    toks = torch.full((B, max_new), pad_id, dtype=torch.long)
    lps = torch.zeros(B, max_new)
    done = torch.zeros(B, dtype=torch.bool)
    lengths = torch.zeros(B, dtype=torch.long)
    for t in range(max_new):
        if temperature > 0:
            z = logits / temperature
            logp = torch.log_softmax(z, -1)
            z = truncate_logits(z, top_k, top_p)
            cdf = torch.softmax(z, -1).cumsum(-1)
            u = uniforms[:, t:t + 1] * cdf[:, -1:]
            tok = (cdf < u).sum(-1).clamp(max=cfg.vocab_size - 1)
        else:
            logp = torch.log_softmax(logits, -1)
            tok = logits.argmax(-1)
        lp = logp.gather(-1, tok[:, None]).squeeze(-1)
        tok = torch.where(done, torch.full_like(tok, pad_id), tok)
        toks[:, t] = tok
        lps[:, t] = torch.where(done, torch.zeros_like(lp), lp)
        lengths += (~done).long()
        if eos_t.numel():
            done = done | (~done & (tok[:, None] == eos_t[None]).any(-1))
            if bool(done.all()):
                break
        if t + 1 == max_new:
            break
        mask = torch.cat([mask, torch.ones(B, 1, dtype=torch.bool)], dim=1)
        last_pos = last_pos + 1
        h, kv = forward(params, cfg, tok[:, None], last_pos[:, None], mask, kv)
        logits = lm_head(params, cfg, h[:, -1])
    return toks, lps, lengths
