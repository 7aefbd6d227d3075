"""PyTorch reference for rlstream's vision-language policy (lib/model/vision.ts): Qwen2-VL's
vision tower and image-token placement, written from the Qwen2-VL paper / HF layout in plain torch.

The image processor step (rescale 1/255, CLIP mean/std, frame repeated over temporal_patch_size,
patches flattened channel-major in merge-window order) works on the raw 8-bit pixels, and the 2-D
rotary positions are built from each image's grid, so both check rlstream's host-side layout as
well as the graph. Attention is bidirectional within each image (block-diagonal, as Qwen2-VL's
cu_seqlens). Decoder positions are 1-D (rlstream does not model M-RoPE).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Tuple

import torch

from llama_ref import load_safetensors, rotate_half

Tensor = torch.Tensor

IMAGE_MEAN = (0.48145466, 0.4578275, 0.40821073)
IMAGE_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass
class VisionConfig:
    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int
    patch_size: int
    temporal_patch_size: int
    spatial_merge_size: int
    layer_norm_eps: float
    rope: str
    rope_theta: float
    image_token_id: int

    @staticmethod
    def from_config(d: Dict[str, object]) -> "VisionConfig":
        v = d["vision_config"]
        return VisionConfig(int(v["depth"]), int(v["hidden_size"]), int(v["intermediate_size"]), int(v["num_heads"]), int(v["out_hidden_size"]),
                            int(v["patch_size"]), int(v["temporal_patch_size"]), int(v["spatial_merge_size"]), float(v["layer_norm_eps"]),
                            str(v["rope"]), float(v["rope_theta"]), int(d["image_token_id"]))


def load_vision_params(path: str, requires_grad: bool = False) -> Dict[str, Tensor]:
    return {k: v.to(torch.float32).clone().requires_grad_(requires_grad) for k, v in load_safetensors(path).items() if k.startswith("visual.")}


def preprocess(img: Tensor, vc: VisionConfig) -> Tuple[Tensor, Tuple[int, int]]:
    """8-bit image [H, W, 3] -> patches [gh*gw, 3*tp*ps*ps] (merge-window order) and (gh, gw)."""
    H, W, _ = img.shape
    ps, tp, m = vc.patch_size, vc.temporal_patch_size, vc.spatial_merge_size
    mean = torch.tensor(IMAGE_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGE_STD).view(3, 1, 1)
    x = (img.permute(2, 0, 1).float() / 255.0 - mean) / std  # [3, H, W]
    x = x.unsqueeze(0).expand(tp, 3, H, W)  # the frame repeated over the temporal patch
    gh, gw = H // ps, W // ps
    x = x.reshape(tp, 3, gh // m, m, ps, gw // m, m, ps)
    x = x.permute(2, 5, 3, 6, 1, 0, 4, 7)  # (gh/m, gw/m, m, m, C, tp, ps, ps)
    return x.reshape(gh * gw, 3 * tp * ps * ps), (gh, gw)


def rotary(vc: VisionConfig, gh: int, gw: int) -> Tensor:
    """Rotary angles [gh*gw, hd/2] in merge-window order: 2d = (row freqs, column freqs), 1d = index."""
    hd = vc.hidden_size // vc.num_heads
    m = vc.spatial_merge_size
    if vc.rope == "2d":
        dim = hd // 2
        inv = 1.0 / (vc.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        hpos = torch.arange(gh).unsqueeze(1).expand(gh, gw).reshape(gh // m, m, gw // m, m).permute(0, 2, 1, 3).flatten()
        wpos = torch.arange(gw).unsqueeze(0).expand(gh, gw).reshape(gh // m, m, gw // m, m).permute(0, 2, 1, 3).flatten()
        return torch.cat([torch.outer(hpos.float(), inv), torch.outer(wpos.float(), inv)], dim=-1)
    inv = 1.0 / (vc.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    return torch.outer(torch.arange(gh * gw).float(), inv)


def layer_norm(x: Tensor, w: Tensor, b: Tensor, eps: float) -> Tensor:
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps)


def vision_tower(p: Dict[str, Tensor], vc: VisionConfig, images: List[Tensor]) -> Tensor:
    """Image tokens [Σ gh*gw/m², out_hidden_size] of the images, in order."""
    E, H = vc.hidden_size, vc.num_heads
    hd = E // H
    outs = []
    for img in images:
        patches, (gh, gw) = preprocess(img, vc)
        w = p["visual.patch_embed.proj.weight"]  # Conv3d [E, 3, tp, ps, ps], stride = kernel
        x = torch.nn.functional.conv3d(patches.view(-1, 3, vc.temporal_patch_size, vc.patch_size, vc.patch_size), w, stride=w.shape[2:]).view(-1, E)
        ang = rotary(vc, gh, gw)
        emb = torch.cat([ang, ang], dim=-1)
        cos, sin = emb.cos().unsqueeze(1), emb.sin().unsqueeze(1)  # [P, 1, hd]
        for i in range(vc.depth):
            b = f"visual.blocks.{i}."
            h = layer_norm(x, p[b + "norm1.weight"], p[b + "norm1.bias"], vc.layer_norm_eps)
            q, k, v = (h @ p[b + "attn.qkv.weight"].t() + p[b + "attn.qkv.bias"]).reshape(-1, 3, H, hd).permute(1, 0, 2, 3).unbind(0)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            att = torch.softmax((q.transpose(0, 1) @ k.transpose(0, 1).transpose(-1, -2)) / math.sqrt(hd), dim=-1) @ v.transpose(0, 1)  # [H, P, hd]
            x = x + att.transpose(0, 1).reshape(-1, E) @ p[b + "attn.proj.weight"].t() + p[b + "attn.proj.bias"]
            h = layer_norm(x, p[b + "norm2.weight"], p[b + "norm2.bias"], vc.layer_norm_eps)
            h = h @ p[b + "mlp.fc1.weight"].t() + p[b + "mlp.fc1.bias"]
            h = h * torch.sigmoid(1.702 * h)  # quick_gelu
            x = x + h @ p[b + "mlp.fc2.weight"].t() + p[b + "mlp.fc2.bias"]
        m2 = vc.spatial_merge_size ** 2
        h = layer_norm(x, p["visual.merger.ln_q.weight"], p["visual.merger.ln_q.bias"], vc.layer_norm_eps).view(-1, m2 * E)
        h = torch.nn.functional.gelu(h @ p["visual.merger.mlp.0.weight"].t() + p["visual.merger.mlp.0.bias"])
        outs.append(h @ p["visual.merger.mlp.2.weight"].t() + p["visual.merger.mlp.2.bias"])
    return torch.cat(outs, dim=0)


def place_images(embeds: Tensor, input_ids: Tensor, image_token_id: int, tokens: Tensor) -> Tensor:
    """Token embeddings [B, T, D] with the <|image_pad|> positions (row-major order) replaced by `tokens`."""
    mask = input_ids == image_token_id
    if int(mask.sum()) != tokens.shape[0]:
        raise ValueError(f"{int(mask.sum())} image pads for {tokens.shape[0]} image tokens")
    return embeds.masked_scatter(mask.unsqueeze(-1), tokens)
