"""Record a replayssm trace: the per-step SSM inputs of one layer of a Hugging Face Mamba-2 or Gated DeltaNet model.

The script loads a model from a local directory (no download), hooks the input of one SSM mixer layer
(Mamba2Mixer / NemotronHMamba2Mixer, or Qwen3NextGatedDeltaNet / Qwen3_5GatedDeltaNet), generates
greedily, and rebuilds from the recorded mixer inputs, with the layer's own weights, exactly what its
recurrence consumes at every token: in_proj, the causal depthwise conv and its activation, then

    Mamba-2: x (T, H, P), raw dt (T, H), B and C (T, G, N), and the layer's A = -exp(A_log), D, dt_bias (H,)
    GDN:     q and k (T, H, K) L2-normalised (q not yet scaled by K^-1/2), v (T, HV, V),
             g = -exp(A_log) softplus(a + dt_bias) (T, HV), beta = sigmoid(b) (T, HV)

T counts the prompt tokens and then every generated token fed back to the model. The file is a NumPy
.npz (replayssm_cli.measure.trace): those arrays as float32, plus `meta`, a JSON string with format
"replayssm-trace", version 1, op ("mamba2" or "gdn"), model, layer (the index among SSM layers),
prompt_tokens, steps (T), dt_softplus and scale (GDN: K^-1/2). `replayssm tune --trace FILE` replays the
prompt in fp64 (as prefill writes the state once) and measures the error over the generated tokens.

    python benchmarks/record_trace.py /models/Nemotron-H-8B-Base-8K --layer 12 --new-tokens 4096 --out nemotron-h-8b-l12.npz
    python benchmarks/record_trace.py /models/Qwen3-Next-80B-A3B-Instruct --layer 0 --prompt-file prompt.txt --out qwen3-next-l0.npz
    replayssm tune --preset nemotron-h-8b --trace nemotron-h-8b-l12.npz --results runs/h200.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

MAMBA2_MIXERS = ("Mamba2Mixer", "NemotronHMamba2Mixer")
GDN_MIXERS = ("Qwen3NextGatedDeltaNet", "Qwen3_5GatedDeltaNet", "Qwen3_5MoeGatedDeltaNet")
DEFAULT_PROMPT = (
    "Write a long, detailed technical report on the history of numerical weather prediction, from Richardson's "
    "forecast factory to modern ensemble systems, with sections, equations and worked examples."
)


def find_mixers(model) -> list[tuple[str, object, str]]:
    """Every SSM mixer of the model in layer order: (module name, module, op)."""
    found = []
    for name, module in model.named_modules():
        cls = type(module).__name__
        if cls in MAMBA2_MIXERS:
            found.append((name, module, "mamba2"))
        elif cls in GDN_MIXERS:
            found.append((name, module, "gdn"))
    return found


def _causal_conv(mixer, xbc):
    """The mixer's depthwise causal conv over a whole sequence (T, C), then its activation, as decode applies them."""
    import torch.nn.functional as F

    T = xbc.shape[0]
    conv = mixer.conv1d
    y = F.conv1d(xbc.T[None], conv.weight, conv.bias, padding=conv.kernel_size[0] - 1, groups=conv.weight.shape[0])[0, :, :T]
    return F.silu(y.T)


def mamba2_inputs(mixer, hidden) -> dict:
    """The SSM inputs of a Mamba-2 mixer for mixer inputs `hidden` (T, hidden_size), as float32 arrays."""
    import torch

    H, P, N, G = mixer.num_heads, mixer.head_dim, mixer.ssm_state_size, mixer.n_groups
    if getattr(mixer, "activation", "silu") not in ("silu", "swish"):
        raise SystemExit(f"mixer activation {mixer.activation!r} is not silu; the trace format assumes silu")
    proj = mixer.in_proj(hidden)
    conv_dim = mixer.intermediate_size + 2 * G * N
    d_mlp = (proj.shape[-1] - 2 * mixer.intermediate_size - 2 * G * N - H) // 2
    _, _, _, xbc, dt = torch.split(proj, [d_mlp, d_mlp, mixer.intermediate_size, conv_dim, H], dim=-1)
    xbc = _causal_conv(mixer, xbc)
    x, B, C = torch.split(xbc, [mixer.intermediate_size, G * N, G * N], dim=-1)
    T = hidden.shape[0]
    return {
        "x": x.reshape(T, H, P),
        "dt": dt.reshape(T, H),
        "B": B.reshape(T, G, N),
        "C": C.reshape(T, G, N),
        "A": -torch.exp(mixer.A_log.float()),
        "D": mixer.D.float(),
        "dt_bias": mixer.dt_bias.float(),
    }


def gdn_inputs(mixer, hidden) -> dict:
    """The delta-rule inputs of a Gated DeltaNet mixer for mixer inputs `hidden` (T, hidden_size), as float32 arrays."""
    import torch
    import torch.nn.functional as F

    T = hidden.shape[0]
    H, HV, K, V = mixer.num_k_heads, mixer.num_v_heads, mixer.head_k_dim, mixer.head_v_dim
    if getattr(mixer, "activation", "silu") not in ("silu", "swish"):
        raise SystemExit(f"mixer activation {mixer.activation!r} is not silu; the trace format assumes silu")
    if hasattr(mixer, "in_proj_qkv"):
        mixed = mixer.in_proj_qkv(hidden)
        b, a = mixer.in_proj_b(hidden), mixer.in_proj_a(hidden)
    else:
        # Qwen3-Next packs q, k, v, z per key head; the layer's own method unpacks them.
        q, k, v, _, b, a = mixer.fix_query_key_value_ordering(mixer.in_proj_qkvz(hidden[None]), mixer.in_proj_ba(hidden[None]))
        mixed = torch.cat([t.reshape(1, T, -1) for t in (q, k, v)], dim=-1)[0]
        b, a = b.reshape(T, HV), a.reshape(T, HV)
    mixed = _causal_conv(mixer, mixed)
    q, k, v = torch.split(mixed, [H * K, H * K, HV * V], dim=-1)

    def l2norm(t):
        t = t.float()
        return t / torch.sqrt((t * t).sum(-1, keepdim=True) + 1e-6)

    return {
        "q": l2norm(q.reshape(T, H, K)),
        "k": l2norm(k.reshape(T, H, K)),
        "v": v.reshape(T, HV, V),
        "g": -mixer.A_log.float().exp() * F.softplus(a.float() + mixer.dt_bias.float()),
        "beta": b.float().sigmoid(),
    }


def record(model_path: str, *, layer: int, prompt: str, new_tokens: int, device: str, dtype: str):
    """Generate with a hook on SSM layer `layer`; return (trace, number of SSM layers)."""
    import torch

    from replayssm_cli.measure.trace import Trace

    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        raise SystemExit("record_trace.py needs Hugging Face transformers: pip install transformers") from None

    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    tokenizer = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch_dtype, local_files_only=True).to(device).eval()
    mixers = find_mixers(model)
    if not mixers:
        names = ", ".join(MAMBA2_MIXERS + GDN_MIXERS)
        raise SystemExit(f"{model_path}: no SSM mixer found (looked for {names})")
    if not 0 <= layer < len(mixers):
        raise SystemExit(f"--layer {layer} is out of range: the model has {len(mixers)} SSM layers (0 to {len(mixers) - 1})")
    name, mixer, op = mixers[layer]
    chunks = []

    def hook(module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        if hidden.shape[0] != 1:
            raise RuntimeError("record_trace records one sequence; the batch has more")
        chunks.append(hidden[0].detach())

    handle = mixer.register_forward_pre_hook(hook, with_kwargs=True)
    ids = tokenizer(prompt, return_tensors="pt").input_ids.to(device)
    try:
        with torch.no_grad():
            model.generate(
                ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, use_cache=True,
                pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
            )
    finally:
        handle.remove()
    if len(chunks) < 2 or chunks[0].shape[0] != ids.shape[1] or any(c.shape[0] != 1 for c in chunks[1:]):
        lengths = [c.shape[0] for c in chunks[:4]]
        raise SystemExit(f"expected one prefill call of {ids.shape[1]} tokens and then one call per token, got lengths {lengths}...")
    hidden = torch.cat(chunks)
    with torch.no_grad():
        arrays = mamba2_inputs(mixer, hidden) if op == "mamba2" else gdn_inputs(mixer, hidden)
    K = arrays["q"].shape[-1] if op == "gdn" else None
    trace = Trace(
        op=op,
        arrays={k: v.detach().float().cpu().numpy() for k, v in arrays.items()},
        prompt_tokens=int(ids.shape[1]),
        model=Path(model_path).name,
        layer=layer,
        dt_softplus=True,
        scale=K**-0.5 if K else None,
        extra={"module": name, "dtype": dtype},
    )
    return trace, len(mixers)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="local directory of a Hugging Face Mamba-2 or GDN model (config, weights, tokenizer)")
    parser.add_argument("--layer", type=int, default=0, help="which SSM layer, counted among SSM layers only (default 0)")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, help="the prompt text")
    parser.add_argument("--prompt-file", type=Path, help="read the prompt from this file instead")
    parser.add_argument("--new-tokens", type=int, default=4096, help="tokens to generate (default 4096)")
    parser.add_argument("--device", default=None, help="torch device (default cuda when available)")
    parser.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16", help="model dtype (default bf16)")
    parser.add_argument("--out", type=Path, required=True, help="the .npz trace to write")
    args = parser.parse_args(argv)
    if args.new_tokens < 2:
        parser.error("--new-tokens must be at least 2")
    import torch

    from replayssm_cli.measure.trace import write

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    prompt = args.prompt_file.read_text() if args.prompt_file else args.prompt
    trace, n_layers = record(args.model, layer=args.layer, prompt=prompt, new_tokens=args.new_tokens, device=device, dtype=args.dtype)
    write(args.out, trace)
    print(
        f"{args.out}: {trace.op} layer {args.layer} of {n_layers} ({trace.shape.label()}), "
        f"{trace.prompt_tokens} prompt + {trace.generated} generated tokens",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
