#!/usr/bin/env python3
"""PyTorch CPU reference for `nerve bench train`: the same Llama shape, batch and sequence,
one training step (forward, cross-entropy, backward, AdamW) timed after a warm-up step.

usage: torch_ref.py --dim D --hidden H --layers L --heads N --kv-heads K --vocab V --batch B --seq S
                    --threads T --steps N --mode fp32|bf16 [--head-dim HD] [--qk-norm 1] [--gemma 1]
                    [--window W --window-period P] [--theta X] [--theta-swa X]
--gemma 1: Gemma's block (GELU gating, embeddings times sqrt(dim), RMSNorm after the attention and
the FFN); --window: a sliding window on the layers l with l % P != P - 1 (every layer when P is 0),
their RoPE base --theta-swa.
Prints one JSON object: {"ok": true, "ms_per_step": ..., "torch": version, "threads": T}.
"""
import argparse
import json
import math
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    for name in ("dim", "hidden", "layers", "heads", "kv-heads", "vocab", "batch", "seq", "threads", "steps"):
        ap.add_argument("--" + name, type=int, required=True)
    for name in ("head-dim", "qk-norm", "gemma", "window", "window-period"):
        ap.add_argument("--" + name, type=int, default=0)
    ap.add_argument("--theta", type=float, default=10000.0)
    ap.add_argument("--theta-swa", type=float, default=0.0)
    ap.add_argument("--mode", choices=("fp32", "bf16"), required=True)
    a = ap.parse_args()
    try:
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
    except Exception as e:  # the peer is optional: say why it was not measured
        print(json.dumps({"ok": False, "why": "python3-torch not installed (scripts/deps.sh --bench): %s" % e}))
        return
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    hd = a.head_dim or a.dim // a.heads

    class RMSNorm(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.w = nn.Parameter(torch.ones(d))

        def forward(self, x):
            return self.w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)

    def table(theta):
        pos = torch.arange(a.seq, dtype=torch.float32)
        freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        ang = torch.outer(pos, freq)
        return torch.cos(ang), torch.sin(ang)

    def rope(x, cs):  # x: B, T, H, hd, interleaved pairs as llama2.c
        x0, x1 = x[..., 0::2], x[..., 1::2]
        c, s = cs[0][None, :, None, :], cs[1][None, :, None, :]
        return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)

    full = torch.full((a.seq, a.seq), float("-inf")).triu(1)
    windowed = full.clone()
    if a.window:  # a query sees itself and the window - 1 positions before it
        windowed = windowed + torch.full((a.seq, a.seq), float("-inf")).tril(-a.window)
    tables = (table(a.theta), table(a.theta_swa or a.theta))

    def layer_windowed(l):
        return a.window > 0 and (a.window_period == 0 or l % a.window_period != a.window_period - 1)

    class Block(nn.Module):
        def __init__(self, l):
            super().__init__()
            self.win = layer_windowed(l)
            self.n1, self.n2 = RMSNorm(a.dim), RMSNorm(a.dim)
            if a.gemma:
                self.p1, self.p2 = RMSNorm(a.dim), RMSNorm(a.dim)
            if a.qk_norm:
                self.qn, self.kn = RMSNorm(hd), RMSNorm(hd)
            self.wq = nn.Linear(a.dim, a.heads * hd, bias=False)
            self.wk = nn.Linear(a.dim, a.kv_heads * hd, bias=False)
            self.wv = nn.Linear(a.dim, a.kv_heads * hd, bias=False)
            self.wo = nn.Linear(a.heads * hd, a.dim, bias=False)
            self.w1 = nn.Linear(a.dim, a.hidden, bias=False)
            self.w2 = nn.Linear(a.hidden, a.dim, bias=False)
            self.w3 = nn.Linear(a.dim, a.hidden, bias=False)

        def forward(self, x):
            B, T, _ = x.shape
            h = self.n1(x)
            q, k = self.wq(h).view(B, T, a.heads, hd), self.wk(h).view(B, T, a.kv_heads, hd)
            if a.qk_norm:
                q, k = self.qn(q), self.kn(k)
            cs = tables[1] if self.win else tables[0]
            q, k = rope(q, cs), rope(k, cs)
            v = self.wv(h).view(B, T, a.kv_heads, hd)
            rep = a.heads // a.kv_heads
            k = k.repeat_interleave(rep, dim=2)
            v = v.repeat_interleave(rep, dim=2)
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
            att = (q @ k.transpose(-1, -2)) / math.sqrt(hd) + (windowed if self.win else full)[:T, :T]
            o = (F.softmax(att.float(), dim=-1).type_as(v) @ v).transpose(1, 2).reshape(B, T, -1)
            if not a.gemma:
                x = x + self.wo(o)
                h = self.n2(x)
                return x + self.w2(F.silu(self.w1(h)) * self.w3(h))
            x = x + self.p1(self.wo(o))
            h = self.n2(x)
            return x + self.p2(self.w2(F.gelu(self.w1(h), approximate="tanh") * self.w3(h)))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(a.vocab, a.dim)
            self.blocks = nn.ModuleList(Block(l) for l in range(a.layers))
            self.norm = RMSNorm(a.dim)

        def forward(self, idx, tgt):
            x = self.emb(idx)
            if a.gemma:
                x = x * math.sqrt(a.dim)
            for b in self.blocks:
                x = b(x)
            logits = F.linear(self.norm(x), self.emb.weight)  # tied classifier, as the stories presets
            return F.cross_entropy(logits.float().view(-1, a.vocab), tgt.view(-1))

    model = Model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    idx = torch.randint(0, a.vocab, (a.batch, a.seq))
    tgt = torch.randint(0, a.vocab, (a.batch, a.seq))

    def step():
        opt.zero_grad(set_to_none=True)
        if a.mode == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(idx, tgt)
        else:
            loss = model(idx, tgt)
        loss.backward()
        opt.step()

    step()  # warm-up
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    ms = (time.perf_counter() - t0) * 1e3 / a.steps
    print(json.dumps({"ok": True, "ms_per_step": ms, "torch": torch.__version__, "threads": a.threads}))


if __name__ == "__main__":
    sys.exit(main())
