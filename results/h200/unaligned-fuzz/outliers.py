"""Issue 35's edge: per_token_head, 8/1, bf16 q with outliers, aligned cache. Kernel vs fp64 reference,
vs an emulation of the per-token lean path's roundings (fp16 q, fp16 K*ratio, fp16 P, fp16 V*ratio, fp32 acc,
bf16 out)."""
import torch
from codegen import cases
from tests.fuzz import oracle

torch.backends.cuda.matmul.allow_tf32 = False
LOG2E = 1.4426950408889634


def emulate(q, kv, topk_idx, bt, req, pos, sm_scale, ks, vs):
    T, Hq, D = q.shape
    Hkv, _, K = topk_idx.shape
    G = Hq // Hkv
    out = torch.zeros(T, Hq, D, dtype=torch.float64, device=q.device)
    slot = torch.arange(128, device=q.device)
    for g in range(Hkv):
        ids = topk_idx[g].long()
        nc = pos // 128 + 1
        live = (torch.arange(K, device=q.device)[None] < nc.clamp(max=K)[:, None]) & (ids >= 0) & (ids < nc[:, None])
        blocks = torch.where(live, ids, 0)
        pages = torch.where(live, bt[req[:, None], blocks].long(), 0)
        seen = live[..., None] & (blocks[..., None] * 128 + slot <= pos[:, None, None])
        k = kv[pages, g, :, :D].to(torch.float16)
        v = kv[pages, g, :, D:].to(torch.float16)
        slots = pages[..., None] * 128 + slot
        ksc, vsc = ks[g][slots], vs[g][slots]  # [T, K, 128] fp32
        ktop = ksc.abs().amax(-1, keepdim=True).clamp_min(1e-30)
        vtop = vsc.abs().amax(-1, keepdim=True).clamp_min(1e-30)
        kq = (k * (ksc / ktop).to(torch.float16)[..., None]).float()  # fp16 product, rounded
        vq = (v * (vsc / vtop).to(torch.float16)[..., None]).float()
        qg = q[:, g * G:(g + 1) * G].to(torch.float16).float()
        s = torch.einsum("tgd,tknd->tgkn", qg, kq) * (sm_scale * LOG2E) * ktop[:, None, :, :]
        s = s.masked_fill(~seen[:, None], float("-inf"))
        m = s.flatten(2).amax(-1)[..., None, None]
        p = torch.exp2(s - m)
        l = p.flatten(2).sum(-1)
        p16 = p.to(torch.float16).float()
        o = torch.einsum("tgkn,tknd->tgkd", p16, vq)  # per slice, fp32
        o = (o * vtop[:, None]).sum(2) / l[..., None]
        out[:, g * G:(g + 1) * G] = o.double()
    return out


def stats(a, b):
    d = (a.double() - b.double())
    return f"rel {float(d.norm() / b.double().norm()):.2e} max_abs {float(d.abs().max()):.3f}"


for seed in range(4):
    case = cases.prefill_case(arch="sm90", q_lens=[300], prefix_lens=[2000 + 500 * seed], num_q_heads=8, num_kv_heads=1,
                              kv_dtype="fp8", scale_mode="per_token_head", q_dtype=torch.bfloat16, device="cuda",
                              seed=100 + seed, pattern="correlated")
    q = case.args["q"].float()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    spots = torch.rand(q.shape, generator=gen, device="cuda") < 0.003
    q = torch.where(spots, q * (10 + 20 * torch.rand(q.shape, generator=gen, device="cuda")), q).to(torch.bfloat16)
    case.args["q"] = q
    a = case.args
    T = q.shape[0]
    pos = torch.arange(T, device="cuda") + a["prefix_lens"][0].long()
    req = torch.zeros(T, dtype=torch.long, device="cuda")
    ref = oracle.attention(q, a["kv_cache"], a["topk_idx"], a["block_table"], req, pos, a["sm_scale"], a["k_scale"], a["v_scale"])
    emu = emulate(q, a["kv_cache"], a["topk_idx"], a["block_table"], req, pos, a["sm_scale"], a["k_scale"], a["v_scale"])
    floor = ref.to(torch.bfloat16)
    print(f"seed {seed}: max|ref| {float(ref.abs().max()):.2f}; bf16(ref) vs ref: {stats(floor, ref)}; emulation vs ref: {stats(emu, ref)}")
    for sel in ("per_token", "tiled"):
        case.poison()
        out = cases.run_kernel(case, selection=sel)
        torch.cuda.synchronize()
        print(f"   {sel:9s}: kernel vs ref {stats(out, ref)}; kernel vs emulation {stats(out, emu)}")
