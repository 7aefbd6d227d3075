"""PyTorch reference for Qwen2-VL / Qwen2.5-VL (model_type qwen2_vl / qwen2_5_vl), written here in
plain torch from the transformers definitions (Qwen2VLImageProcessor, the vision transformers with
Qwen2.5-VL's window attention computed by reordering patches into windows and attending per
window as its cu_window_seqlens do, the patch merger, get_rope_index for images and the decoder
with multimodal rotary embeddings). Reads a Hugging Face directory's config.json and weights.
"""
from __future__ import annotations

import glob
import json
import math
import os
from typing import Dict, List, Tuple

import torch
import torch.nn.functional as F

from llama_ref import load_safetensors

Tensor = torch.Tensor
MEAN = (0.48145466, 0.4578275, 0.40821073)
STD = (0.26862954, 0.26130258, 0.27577711)


class QwenVL:
    def __init__(self, model_dir: str, requires_grad: bool = False):
        with open(os.path.join(model_dir, "config.json")) as f:
            j = json.load(f)
        if isinstance(j.get("text_config"), dict):
            j = {**j["text_config"], **j}
        self.j = j
        self.v25 = j["model_type"] == "qwen2_5_vl"
        vc = j["vision_config"]
        self.vc = vc
        self.E = vc["hidden_size"] if self.v25 else vc["embed_dim"]
        self.vh = vc["num_heads"]
        self.ps = vc.get("patch_size", 14)
        self.tp = vc.get("temporal_patch_size", 2)
        self.m = vc.get("spatial_merge_size", 2)
        self.window = vc.get("window_size", 112) if self.v25 else None
        self.fullatt = vc.get("fullatt_block_indexes", []) if self.v25 else None
        self.D = j["hidden_size"]
        self.H = j["num_attention_heads"]
        self.KVH = j["num_key_value_heads"]
        self.hd = self.D // self.H
        self.L = j["num_hidden_layers"]
        self.eps = j["rms_norm_eps"]
        self.theta = j.get("rope_theta", 10000.0)
        self.section = j["rope_scaling"]["mrope_section"]
        self.tied = j.get("tie_word_embeddings", False)
        self.image_token = j["image_token_id"]
        self.vision_start = j["vision_start_token_id"]
        p: Dict[str, Tensor] = {}
        for f in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
            p.update(load_safetensors(f))
        self.p = {k: v.to(torch.float32).clone().requires_grad_(requires_grad) for k, v in p.items()}

    # ── image processor (Qwen2VLImageProcessor after resizing) ──
    def pixels(self, img: Tensor) -> Tuple[Tensor, Tuple[int, int, int]]:
        """uint8 [H, W, 3] at the grid size → pixel_values [gh*gw, 3*tp*ps*ps], grid (1, gh, gw)."""
        H, W, _ = img.shape
        x = img.permute(2, 0, 1).float() * (1 / 255)
        x = (x - torch.tensor(MEAN).view(3, 1, 1)) / torch.tensor(STD).view(3, 1, 1)
        x = x.unsqueeze(0).repeat(self.tp, 1, 1, 1)  # one image = tp equal frames
        ps, m = self.ps, self.m
        gh, gw = H // ps, W // ps
        x = x.reshape(1, self.tp, 3, gh // m, m, ps, gw // m, m, ps)
        x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
        return x.reshape(gh * gw, 3 * self.tp * ps * ps), (1, gh, gw)

    # ── vision tower ──
    def _norm(self, x: Tensor, name: str) -> Tensor:
        if self.v25:
            var = x.pow(2).mean(-1, keepdim=True)
            return self.p[name + ".weight"] * (x * torch.rsqrt(var + 1e-6))
        return F.layer_norm(x, (x.shape[-1],), self.p[name + ".weight"], self.p[name + ".bias"], 1e-6)

    def _lin(self, x: Tensor, name: str) -> Tensor:
        return F.linear(x, self.p[name + ".weight"], self.p.get(name + ".bias"))

    def _rot(self, gh: int, gw: int) -> Tensor:
        m, hd = self.m, self.E // self.vh
        dim = hd // 2
        inv = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        hp = torch.arange(gh).unsqueeze(1).expand(-1, gw).reshape(gh // m, m, gw // m, m).permute(0, 2, 1, 3).flatten()
        wp = torch.arange(gw).unsqueeze(0).expand(gh, -1).reshape(gh // m, m, gw // m, m).permute(0, 2, 1, 3).flatten()
        full = torch.outer(torch.arange(max(gh, gw), dtype=torch.float), inv)
        return full[torch.stack([hp, wp], -1)].flatten(1)  # [P, hd/2]

    def _windows(self, gh: int, gw: int) -> Tuple[Tensor, List[int]]:
        """Merged-token order grouped by window and the windows' sizes in patches (get_window_index)."""
        ws = self.window // self.m // self.ps
        lh, lw = gh // self.m, gw // self.m
        idx = torch.arange(lh * lw).reshape(lh, lw)
        ph, pw = (-lh) % ws, (-lw) % ws
        padded = F.pad(idx, (0, pw, 0, ph), value=-1)
        nh, nw = (lh + ph) // ws, (lw + pw) // ws
        padded = padded.reshape(nh, ws, nw, ws).permute(0, 2, 1, 3).reshape(nh * nw, ws * ws)
        order, sizes = [], []
        for w in padded:
            keep = w[w >= 0]
            if len(keep):
                order.append(keep)
                sizes.append(len(keep) * self.m * self.m)
        return torch.cat(order), sizes

    def _attn(self, x: Tensor, l: int, cos: Tensor, sin: Tensor, segs: List[int]) -> Tensor:
        hd = self.E // self.vh
        q, k, v = self._lin(x, f"visual.blocks.{l}.attn.qkv").reshape(-1, 3, self.vh, hd).permute(1, 0, 2, 3).unbind(0)
        rot = lambda t: torch.cat([-t[..., hd // 2:], t[..., : hd // 2]], -1)
        q = q * cos + rot(q) * sin
        k = k * cos + rot(k) * sin
        outs, s = [], 0
        for n in segs:
            qs, ks, vs = (t[s:s + n].transpose(0, 1) for t in (q, k, v))
            a = torch.softmax(qs @ ks.transpose(-1, -2) / math.sqrt(hd), -1) @ vs
            outs.append(a.transpose(0, 1).reshape(n, -1))
            s += n
        return self._lin(torch.cat(outs), f"visual.blocks.{l}.attn.proj")

    def vision(self, pixel_values: Tensor, grid: Tuple[int, int, int]) -> Tensor:
        _, gh, gw = grid
        P, m2 = gh * gw, self.m * self.m
        w = self.p["visual.patch_embed.proj.weight"]
        x = F.conv3d(pixel_values.view(-1, 3, self.tp, self.ps, self.ps), w, stride=w.shape[2:]).view(P, self.E)
        rot = self._rot(gh, gw)
        if self.v25:
            order, wsizes = self._windows(gh, gw)
            x = x.view(P // m2, m2, -1)[order].reshape(P, -1)
            rot = rot.view(P // m2, m2, -1)[order].reshape(P, -1)
        emb = torch.cat([rot, rot], -1)
        cos, sin = emb.cos().unsqueeze(1), emb.sin().unsqueeze(1)
        for l in range(self.vc["depth"]):
            b = f"visual.blocks.{l}"
            segs = wsizes if self.v25 and l not in self.fullatt else [P]
            x = x + self._attn(self._norm(x, b + ".norm1"), l, cos, sin, segs)
            h = self._norm(x, b + ".norm2")
            if self.v25:
                h = self._lin(F.silu(self._lin(h, b + ".mlp.gate_proj")) * self._lin(h, b + ".mlp.up_proj"), b + ".mlp.down_proj")
            else:
                h = self._lin(h, b + ".mlp.fc1")
                h = self._lin(h * torch.sigmoid(1.702 * h), b + ".mlp.fc2")
            x = x + h
        h = self._norm(x, "visual.merger.ln_q").view(-1, m2 * self.E)
        h = self._lin(F.gelu(self._lin(h, "visual.merger.mlp.0")), "visual.merger.mlp.2")
        if self.v25:
            h = h[torch.argsort(order)]
        return h

    # ── decoder ──
    def rope_index(self, ids: Tensor, mask: Tensor, grids: List[Tuple[int, int, int]]) -> Tensor:
        """get_rope_index for images: position ids [3, B, T] (padding gets 1)."""
        B, T = ids.shape
        pos = torch.ones(3, B, T, dtype=torch.long)
        g = 0
        for b in range(B):
            row = ids[b][mask[b] == 1]
            parts: List[Tensor] = []
            st = 0
            starts = [i + 1 for i in range(len(row) - 1) if row[i] == self.vision_start and row[i + 1] == self.image_token]
            for ed in starts:
                _, gh, gw = grids[g]
                g += 1
                lh, lw = gh // self.m, gw // self.m
                base = parts[-1].max() + 1 if parts else 0
                n_text = ed - st
                parts.append(torch.arange(n_text).view(1, -1).expand(3, -1) + base)
                t_i = torch.zeros(lh * lw, dtype=torch.long)
                h_i = torch.arange(lh).view(-1, 1).expand(-1, lw).flatten()
                w_i = torch.arange(lw).view(1, -1).expand(lh, -1).flatten()
                parts.append(torch.stack([t_i, h_i, w_i]) + n_text + base)
                st = ed + lh * lw
            if st < len(row):
                base = parts[-1].max() + 1 if parts else 0
                parts.append(torch.arange(len(row) - st).view(1, -1).expand(3, -1) + base)
            pos[:, b, mask[b] == 1] = torch.cat(parts, 1)
        return pos

    def decoder(self, emb: Tensor, pos3: Tensor, mask: Tensor) -> Tensor:
        """Final-norm hidden [B, T, D] of embeddings [B, T, D], positions [3, B, T], key mask [B, T]."""
        B, T, _ = emb.shape
        hd = self.hd
        inv = 1.0 / (self.theta ** (torch.arange(0, hd, 2, dtype=torch.float) / hd))
        freqs = pos3.float().unsqueeze(-1) * inv  # [3, B, T, hd/2]
        e = torch.cat([freqs, freqs], -1)
        sec = self.section * 2
        pick = lambda t: torch.cat([c[i % 3] for i, c in enumerate(t.split(sec, -1))], -1).unsqueeze(1)  # [B, 1, T, hd]
        cos, sin = pick(e.cos()), pick(e.sin())
        rot = lambda t: torch.cat([-t[..., hd // 2:], t[..., : hd // 2]], -1)
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
        allowed = causal & mask.bool()[:, None, None, :]
        bias = torch.zeros(B, 1, T, T).masked_fill(~allowed, float("-inf"))
        # a padding query sees itself only (no row of -inf)
        bias = torch.where(torch.eye(T, dtype=torch.bool), torch.zeros(()), bias)
        x = emb
        rms = lambda t, w: w * (t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + self.eps))
        for l in range(self.L):
            pre = f"model.layers.{l}"
            h = rms(x, self.p[pre + ".input_layernorm.weight"])
            q = self._lin(h, pre + ".self_attn.q_proj").view(B, T, self.H, hd).transpose(1, 2)
            k = self._lin(h, pre + ".self_attn.k_proj").view(B, T, self.KVH, hd).transpose(1, 2)
            v = self._lin(h, pre + ".self_attn.v_proj").view(B, T, self.KVH, hd).transpose(1, 2)
            q = q * cos + rot(q) * sin
            k = k * cos + rot(k) * sin
            g = self.H // self.KVH
            k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
            a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + bias, -1) @ v
            x = x + self._lin(a.transpose(1, 2).reshape(B, T, -1), pre + ".self_attn.o_proj")
            h = rms(x, self.p[pre + ".post_attention_layernorm.weight"])
            x = x + self._lin(F.silu(self._lin(h, pre + ".mlp.gate_proj")) * self._lin(h, pre + ".mlp.up_proj"), pre + ".mlp.down_proj")
        return rms(x, self.p["model.norm.weight"])

    def logits(self, h: Tensor) -> Tensor:
        w = self.p["model.embed_tokens.weight"] if self.tied else self.p["lm_head.weight"]
        return h @ w.t()

    def forward(self, ids: Tensor, mask: Tensor, images: List[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
        """(logits [B, T, V], pixel_values of every image, image features)."""
        pix, grids, feats = [], [], []
        for im in images:
            pv, grid = self.pixels(im)
            pix.append(pv)
            grids.append(grid)
            feats.append(self.vision(pv, grid))
        emb = self.p["model.embed_tokens.weight"][ids]
        if feats:
            sel = (ids == self.image_token).unsqueeze(-1)
            emb = emb.masked_scatter(sel, torch.cat(feats).to(emb.dtype))
        h = self.decoder(emb, self.rope_index(ids, mask, grids), mask)
        return self.logits(h), torch.cat(pix) if pix else torch.zeros(0), torch.cat(feats) if feats else torch.zeros(0)
