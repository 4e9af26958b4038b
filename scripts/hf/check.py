"""Hugging Face folders written by `nerve export` against a reference written here in PyTorch the
way transformers' Llama/Qwen2/Qwen3 code computes (rotate_half RoPE on the stored rows, repeat_kv,
RMSNorm in fp32, SwiGLU, QK-norm before RoPE, Qwen2's biases), reading config.json and
model.safetensors with nothing of nerve's.

    python3 check.py NERVE FOLDER TOKENS.u32 [GOLDEN_IDS | --randomize | --lora ADAPTER_DIR]

Prints the perplexity of the token chunk (second half scored, as `nerve perplexity` scores it) by
the reference and by `nerve perplexity -m FOLDER`, and with GOLDEN_IDS (a greedy text's ids) checks
that the reference's argmax at every position is the next greedy token. --randomize first rewrites
the folder's weights (F32) with random values, norms, QK-norms and biases far from their trained
ones, so that every tensor's order matters. --lora merges a PEFT adapter folder the way PEFT does
(W + lora_alpha / r * B @ A; / sqrt(r) with use_rslora) and compares with `nerve perplexity --lora`.
Exits 1 on a mismatch.
"""
import json
import math
import struct
import subprocess
import sys

import torch


def load_safetensors(path):
    with open(path, 'rb') as f:
        raw = f.read()
    (hl,) = struct.unpack('<Q', raw[:8])
    header = json.loads(raw[8:8 + hl])
    data = raw[8 + hl:]
    out = {}
    for name, t in header.items():
        if name == '__metadata__':
            continue
        b, e = t['data_offsets']
        buf = bytearray(data[b:e])
        if t['dtype'] == 'F32':
            x = torch.frombuffer(buf, dtype=torch.float32)
        elif t['dtype'] == 'BF16':
            x = torch.frombuffer(buf, dtype=torch.bfloat16).float()
        elif t['dtype'] == 'F16':
            x = torch.frombuffer(buf, dtype=torch.float16).float()
        else:
            raise SystemExit(f'{name}: dtype {t["dtype"]}')
        out[name] = x.reshape(t['shape']).double()
    return out


def save_safetensors(path, tensors):
    header, blobs, off = {'__metadata__': {'format': 'pt'}}, [], 0
    for name, x in tensors.items():
        b = x.float().contiguous().numpy().tobytes()
        header[name] = {'dtype': 'F32', 'shape': list(x.shape), 'data_offsets': [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b' ' * (-(8 + len(h)) % 8)
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(h)) + h + b''.join(blobs))


def randomize(w):
    g = torch.Generator().manual_seed(7)
    for name, x in w.items():
        r = torch.randn(x.shape, generator=g, dtype=torch.float64)
        if name.endswith('norm.weight'):
            w[name] = 1 + 0.3 * r
        elif name.endswith('.bias'):
            w[name] = 0.5 * r
        else:
            w[name] = r / math.sqrt(x.shape[-1])
    return {k: v.float().double() for k, v in w.items()}


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def forward(cfg, w, ids):
    """Logits [T, vocab] in float64."""
    d, nh = cfg['hidden_size'], cfg['num_attention_heads']
    nkv = cfg.get('num_key_value_heads', nh)
    hd = cfg.get('head_dim') or d // nh
    eps, theta = cfg['rms_norm_eps'], cfg.get('rope_theta', 10000.0)
    qk_norm = cfg['model_type'] == 'qwen3'
    T = len(ids)
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    ang = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((ang, ang), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    x = w['model.embed_tokens.weight'][torch.tensor(ids)]
    mask = torch.full((T, T), float('-inf'), dtype=torch.float64).triu(1)
    for l in range(cfg['num_hidden_layers']):
        p = f'model.layers.{l}.'
        h = rms_norm(x, w[p + 'input_layernorm.weight'], eps)

        def proj(name):
            y = h @ w[p + f'self_attn.{name}.weight'].T
            if p + f'self_attn.{name}.bias' in w:
                y = y + w[p + f'self_attn.{name}.bias']
            return y
        q = proj('q_proj').view(T, nh, hd).transpose(0, 1)
        k = proj('k_proj').view(T, nkv, hd).transpose(0, 1)
        v = proj('v_proj').view(T, nkv, hd).transpose(0, 1)
        if qk_norm:
            q = rms_norm(q, w[p + 'self_attn.q_norm.weight'], eps)
            k = rms_norm(k, w[p + 'self_attn.k_norm.weight'], eps)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(nh // nkv, dim=0)
        v = v.repeat_interleave(nh // nkv, dim=0)
        att = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(hd) + mask, dim=-1)
        o = (att @ v).transpose(0, 1).reshape(T, nh * hd)
        x = x + o @ w[p + 'self_attn.o_proj.weight'].T
        h = rms_norm(x, w[p + 'post_attention_layernorm.weight'], eps)
        g = h @ w[p + 'mlp.gate_proj.weight'].T
        u = h @ w[p + 'mlp.up_proj.weight'].T
        x = x + (torch.nn.functional.silu(g) * u) @ w[p + 'mlp.down_proj.weight'].T
    x = rms_norm(x, w['model.norm.weight'], eps)
    head = w['model.embed_tokens.weight'] if cfg.get('tie_word_embeddings') or 'lm_head.weight' not in w else w['lm_head.weight']
    return x @ head.T


def main():
    nerve, folder, tokens_path = sys.argv[1:4]
    opt = sys.argv[4] if len(sys.argv) > 4 else None
    golden = opt if opt not in (None, '--randomize', '--lora') else None
    cfg = json.load(open(f'{folder}/config.json'))
    w = load_safetensors(f'{folder}/model.safetensors')
    if opt == '--randomize':
        w = randomize(w)
        save_safetensors(f'{folder}/model.safetensors', w)
    extra = []
    if opt == '--lora':
        adapter = sys.argv[5]
        acfg = json.load(open(f'{adapter}/adapter_config.json'))
        r, alpha = acfg['r'], acfg['lora_alpha']
        scale = alpha / math.sqrt(r) if acfg.get('use_rslora') else alpha / r
        a = load_safetensors(f'{adapter}/adapter_model.safetensors')
        for name, x in a.items():
            if '.lora_A.' not in name:
                continue
            target = name.replace('base_model.model.', '', 1).replace('.lora_A.weight', '.weight')
            w[target] = w[target] + scale * (a[name.replace('lora_A', 'lora_B')] @ x)
        extra = ['--lora', adapter]
    raw = open(tokens_path, 'rb').read()
    ids = list(struct.unpack(f'<{len(raw) // 4}I', raw))
    logits = forward(cfg, w, ids)
    first = len(ids) // 2
    logp = torch.log_softmax(logits, dim=-1)
    nll = -sum(logp[i, ids[i + 1]].item() for i in range(first, len(ids) - 1)) / (len(ids) - 1 - first)
    out = subprocess.run([nerve, 'perplexity', '-m', folder, '-f', tokens_path, '--ctx', str(len(ids)), '--json'] + extra,
                         capture_output=True, text=True, check=True).stdout
    got = json.loads(out)['nll']
    ok = abs(got - nll) < 1e-4 * max(1.0, abs(nll))
    print(f'{folder}{" + " + extra[1] if extra else ""}: reference nll {nll:.6f}, nerve perplexity nll {got:.6f} ({cfg["model_type"]}, {len(ids)} tokens): '
          f'{"same" if ok else "DIFFERENT"}')
    if golden:
        g = [int(x) for x in open(golden).read().split()]
        top = forward(cfg, w, g).argmax(-1).tolist()
        agree = sum(top[i] == g[i + 1] for i in range(len(g) - 1))
        print(f'{folder}: the reference\'s argmax is the greedy text\'s next token at {agree} of {len(g) - 1} positions')
        ok = ok and agree == len(g) - 1
    sys.exit(0 if ok else 1)


main()
