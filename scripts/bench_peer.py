#!/usr/bin/env python3
"""PyTorch and JAX peers for `hlat bench train`.

`hlat bench train` times one HLAT training step on several Rust backends. With `--with-pytorch`
or `--with-jax` it also runs this script as a child process, once per framework:

    python3 scripts/bench_peer.py --framework pytorch|jax --config CONFIG.json \\
        --batch B --seq-len S --warmup W --steps N --precision f32|bf16-mixed [--threads T]

and adds the one line of JSON this script prints on stdout as a row of the same table. Everything
else (progress, library warnings) goes to stderr.

CONFIG.json is the model config in the project's own layout (`HlatConfig`: vocab_size,
hidden_size, num_layers, num_heads, num_kv_heads, ffn_size, max_seq_len, rms_norm_eps, rope_theta,
init_std, ...). The model is a LLaMA decoder as Hugging Face `LlamaForCausalLM` builds it from that
config: untied embeddings, no biases, RMSNorm, rotate-half RoPE, grouped-query causal attention,
SwiGLU MLP, every weight matrix drawn from normal(0, init_std), norm weights ones.

The step is the same in both frameworks: on a fixed batch [B, S + 1] of token ids (the generator
of `batch_rows` in examples/src/commands/bench/train.rs, so every row of the table trains on the
same tokens), inputs = batch[:, :-1], targets = batch[:, 1:], mean next-token cross-entropy,
backward, global-norm gradient clipping to 1.0, then AdamW (constant lr 3e-4, betas 0.9/0.95,
eps 1e-8, weight decay 0.1 on every parameter) with f32 master weights.

- pytorch: `transformers.LlamaForCausalLM` with eager attention, `torch.optim.AdamW` and
  `torch.nn.utils.clip_grad_norm_`, in eager mode. `--threads T` calls torch.set_num_threads(T).
  bf16-mixed runs the forward pass under torch.autocast(dtype=torch.bfloat16) on the device.
  `--device cuda` trains on the GPU (attention by `scaled_dot_product_attention`, PyTorch's
  default there, and fused AdamW); `--compile 1` wraps the model in `torch.compile` (its
  compile happens in the warmup steps, whose time is reported as compile_seconds).
- jax: the same model written in jax.numpy, weights as a pytree, AdamW and clipping written out
  (the formulas of torch.optim.AdamW), and the whole step (loss, gradient, clipping, update) in
  one `jax.jit`, compiled ahead of the warmup steps and timed separately. bf16-mixed casts the
  parameters to bf16 inside the loss. `--threads T` pins the process to T CPUs before JAX starts
  (XLA's CPU thread pool follows the CPUs the process may run on).

Timing: W untimed warmup steps, then N timed steps; each timed region ends once the step's result
is materialised (`loss.item()` in torch; `jax.block_until_ready` on the new parameters, optimiser
state and loss in JAX), so asynchronous execution cannot hide work. The median is reported.

Output keys: backend, median_step_seconds, tokens_per_second (B * S / median), compiles (jax: 1,
the one compile of the step; pytorch: 0), compile_seconds, peak_rss_bytes (ru_maxrss),
resident_at_start_bytes (VmRSS before the first step, once the model and the batch exist, and
in JAX the optimizer state; PyTorch's AdamW makes its state in the first step), final_loss (the loss of the last step, computed before its update), version.

Generation (`hlat bench generate --with-transformers`): with `--task generate --framework pytorch
--new-tokens N`, the same model (f32, eval mode) runs `generate` greedily from the prompt of
`--seq-len` tokens (the first row of `batch_rows`, as the Rust backends use), with the KV cache,
exactly N new tokens (`min_new_tokens`), W untimed runs then `--steps` timed ones. A logits
processor records when each new token's logits arrive: prefill is the time to the first, decode
the time from the first to the last over N - 1. Output keys: backend, prefill_seconds,
decode_seconds_per_token (medians), peak_rss_bytes, version.

CNN (`hlat bench cnn --with-pytorch`): with `--task cnn --framework pytorch --batch B --seed S
--lr LR`, the network of `hlat::vision::SmallCnn` in torch.nn (Conv2d(1, 8, 3), ReLU,
MaxPool2d(2, 2), Conv2d(8, 16, 3), ReLU, AdaptiveAvgPool2d(4), Linear(256, 10); PyTorch's own
initialisation, so its losses differ from the Rust rows') trains with cross-entropy and Adam on
the images of `hlat::vision::generated_batch` (the same SplitMix64 stream): one first step, W
untimed, N timed. Output keys: backend, first_step_seconds, median_step_seconds, final_loss,
peak_rss_bytes, version. Only torch is needed.

Exit status: 0 on success, 2 for a bad argument or config, 3 when the framework is not installed
(stderr then names the missing package and the pip command that installs it).
"""

import argparse
import importlib.util
import json
import math
import os
import resource
import statistics
import sys
import time

EXIT_USAGE = 2
EXIT_MISSING = 3

LR = 3e-4
BETAS = (0.9, 0.95)
EPS = 1e-8
WEIGHT_DECAY = 0.1
CLIP_NORM = 1.0
SEED = 0
CNN_IMAGE_SIZE = 28
CNN_CLASSES = 10

PRECISIONS = ("f32", "bf16-mixed")
# Python packages each framework needs, as pip names them (the import names are the same).
REQUIREMENTS = {"pytorch": ("torch", "transformers"), "jax": ("jax", "jaxlib")}

CONFIG_INTS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "ffn_size",
               "max_seq_len")
CONFIG_FLOATS = ("rms_norm_eps", "rope_theta", "init_std")


def fail(message, status=EXIT_USAGE):
    print(f"bench_peer: {message}", file=sys.stderr)
    sys.exit(status)


# arguments and config ------------------------------------------------------------------------


def int_at_least(minimum):
    """An argparse type: an integer >= minimum."""

    def parse(text):
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}")
        return value

    return parse


class Parser(argparse.ArgumentParser):
    def error(self, message):
        self.print_usage(sys.stderr)
        fail(message)


def parse_args():
    parser = Parser(description="Time one HLAT training step in PyTorch or JAX "
                                "(a peer of `hlat bench train`).")
    parser.add_argument("--framework", required=True, choices=sorted(REQUIREMENTS))
    parser.add_argument("--config", help="model config JSON (HlatConfig layout; train, generate)")
    parser.add_argument("--batch", required=True, type=int_at_least(1), help="sequences per step")
    parser.add_argument("--seq-len", type=int_at_least(1),
                        help="tokens per sequence (train, generate)")
    parser.add_argument("--warmup", required=True, type=int_at_least(0), help="untimed steps")
    parser.add_argument("--steps", required=True, type=int_at_least(1), help="timed steps")
    parser.add_argument("--precision", required=True,
                        help=f"one of {', '.join(PRECISIONS)}")
    parser.add_argument("--threads", type=int_at_least(1), help="CPU threads to use")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where PyTorch trains (--task train)")
    parser.add_argument("--compile", type=int, choices=(0, 1), default=0,
                        help="1: wrap PyTorch's model in torch.compile (--task train)")
    parser.add_argument("--task", choices=("train", "generate", "cnn"), default="train",
                        help="time a training step, greedy generation (pytorch only), or the "
                             "small CNN's training step (pytorch only)")
    parser.add_argument("--seed", type=int_at_least(0), default=5,
                        help="seed of the generated images (--task cnn)")
    parser.add_argument("--lr", type=float, default=1e-3, help="Adam's learning rate (--task cnn)")
    parser.add_argument("--new-tokens", type=int_at_least(2),
                        help="tokens generated per run (--task generate)")
    args = parser.parse_args()
    if args.task == "generate" and (args.framework != "pytorch" or args.new_tokens is None):
        fail("--task generate needs --framework pytorch and --new-tokens")
    if args.task == "cnn" and args.framework != "pytorch":
        fail("--task cnn needs --framework pytorch")
    if args.task != "cnn" and (args.config is None or args.seq_len is None):
        fail(f"--task {args.task} needs --config and --seq-len")
    if args.precision not in PRECISIONS:
        fail(f"--precision {args.precision!r} is not supported here "
             f"(the peers support {' and '.join(PRECISIONS)})")
    return args


def load_config(path):
    try:
        with open(path, encoding="utf-8") as file:
            config = json.load(file)
    except OSError as error:
        fail(f"cannot read --config {path}: {error.strerror}")
    except json.JSONDecodeError as error:
        fail(f"--config {path} is not valid JSON: {error}")
    if not isinstance(config, dict):
        fail(f"--config {path}: expected a JSON object")
    for key in CONFIG_INTS:
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            fail(f"--config {path}: {key} must be a positive integer, got {value!r}")
    for key in CONFIG_FLOATS:
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            fail(f"--config {path}: {key} must be a positive number, got {value!r}")
    if config["hidden_size"] % config["num_heads"]:
        fail(f"--config {path}: hidden_size {config['hidden_size']} is not a multiple of "
             f"num_heads {config['num_heads']}")
    if config["num_heads"] % config["num_kv_heads"]:
        fail(f"--config {path}: num_heads {config['num_heads']} is not a multiple of "
             f"num_kv_heads {config['num_kv_heads']}")
    if (config["hidden_size"] // config["num_heads"]) % 2:
        fail(f"--config {path}: the head dimension must be even for RoPE")
    return config


def require(framework, task):
    needed = ("torch",) if task == "cnn" else REQUIREMENTS[framework]
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing:
        fail(f"the {framework} peer needs the Python package{'s' if len(missing) > 1 else ''} "
             f"{' and '.join(missing)}, not installed: python3 -m pip install {' '.join(missing)}",
             EXIT_MISSING)


class SplitMix64:
    """The project's one seeded generator (`hlat::rng::SplitMix64`), draw for draw."""

    MASK = (1 << 64) - 1

    def __init__(self, seed):
        self.state = seed & self.MASK

    def next_u64(self):
        self.state = (self.state + 0x9E37_79B9_7F4A_7C15) & self.MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58_476D_1CE4_E5B9) & self.MASK
        z = ((z ^ (z >> 27)) * 0x94D0_49BB_1331_11EB) & self.MASK
        return z ^ (z >> 31)

    def below(self, bound):
        """A uniform integer in 0..bound without modulo bias, as `SplitMix64::below`."""
        zone = self.MASK - self.MASK % bound
        while True:
            value = self.next_u64()
            if value < zone:
                return value % bound


ROWS_SEED = 0x2545_F491_4F6C_DD1D


def batch_rows(vocab_size, batch, seq_len):
    """Rows of seq_len + 1 token ids: the SplitMix64 stream of `hlat bench train`."""
    rng = SplitMix64(ROWS_SEED)
    return [[rng.below(vocab_size) for _ in range(seq_len + 1)] for _ in range(batch)]


def resident_bytes():
    """The resident memory of this process now, bytes (Linux `VmRSS`; 0 elsewhere)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def time_steps(step, warmup, steps):
    """Runs warmup + steps calls of step() (each returns the materialised loss).

    Returns the median seconds of the timed calls, the last loss and the seconds the warmup took
    (a compiled step compiles there)."""
    warmup_start = time.perf_counter()
    for _ in range(warmup):
        step()
    warmup_seconds = time.perf_counter() - warmup_start
    seconds = []
    for _ in range(steps):
        start = time.perf_counter()
        loss = step()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), float(loss), warmup_seconds


# pytorch -------------------------------------------------------------------------------------


def llama(config, args):
    """`LlamaForCausalLM` of the config (`MixtralForCausalLM` when it is a Mixtral mixture of
    experts), f32, eager attention, seeded; `--threads` applied."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(SEED)
    # What the dense decoder and the Mixtral share.
    shared = dict(
        vocab_size=config["vocab_size"],
        hidden_size=config["hidden_size"],
        num_hidden_layers=config["num_layers"],
        num_attention_heads=config["num_heads"],
        num_key_value_heads=config["num_kv_heads"],
        max_position_embeddings=config["max_seq_len"],
        rms_norm_eps=config["rms_norm_eps"],
        rope_theta=config["rope_theta"],
        initializer_range=config["init_std"],
        tie_word_embeddings=False,
        attention_dropout=0.0,
        attn_implementation="eager" if getattr(args, "device", "cpu") == "cpu" else "sdpa",
    )
    moe = config.get("moe")
    if moe is not None:
        if config.get("family") != "mixtral":
            fail(f"the peer builds Mixtral mixtures, not {config.get('family')}")
        hf_config = MixtralConfig(
            intermediate_size=moe["expert_ffn_size"],
            num_local_experts=moe["num_experts"],
            num_experts_per_tok=moe["experts_per_token"],
            router_aux_loss_coef=moe["router_aux_loss_coef"],
            sliding_window=None,
            **shared,
        )
        return MixtralForCausalLM(hf_config).float()
    hf_config = LlamaConfig(
        intermediate_size=config["ffn_size"],
        attention_bias=False,
        mlp_bias=False,
        **shared,
    )
    return LlamaForCausalLM(hf_config).float()


def run_pytorch(config, args):
    import torch
    import torch.nn.functional as F
    import transformers

    if args.device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda: PyTorch sees no CUDA device")
    device = torch.device(args.device)
    model = llama(config, args).to(device)
    params = list(model.train().parameters())
    optimizer = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY,
                                  fused=args.device == "cuda")
    forward = torch.compile(model) if args.compile else model

    batch = torch.tensor(batch_rows(config["vocab_size"], args.batch, args.seq_len), device=device)
    inputs, targets = batch[:, :-1], batch[:, 1:].reshape(-1)
    bf16 = args.precision == "bf16-mixed"
    resident_at_start = resident_bytes()

    # A mixture trains on the cross-entropy plus its weighted load-balancing loss, as hlat does.
    moe = config.get("moe")

    def step():
        with torch.autocast(device_type=args.device, dtype=torch.bfloat16, enabled=bf16):
            output = forward(input_ids=inputs, use_cache=False,
                             **({"output_router_logits": True} if moe else {}))
        logits = output.logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets)
        if moe:
            loss = loss + moe["router_aux_loss_coef"] * output.aux_loss.float()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, CLIP_NORM)
        optimizer.step()
        return loss.item()

    median, final_loss, warmup_seconds = time_steps(step, args.warmup, args.steps)
    return {
        "median_step_seconds": median,
        "compiles": 1 if args.compile else 0,
        "compile_seconds": warmup_seconds if args.compile else 0.0,
        "resident_at_start_bytes": resident_at_start,
        "final_loss": final_loss,
        "version": f"torch {torch.__version__} / transformers {transformers.__version__}",
    }


def run_pytorch_generate(config, args):
    import torch
    import transformers
    from transformers import LogitsProcessor, LogitsProcessorList

    model = llama(config, args).eval()
    prompt = torch.tensor(batch_rows(config["vocab_size"], 1, args.seq_len - 1))

    class Arrivals(LogitsProcessor):
        """Records when the logits of each new token arrive; changes nothing."""

        def __init__(self):
            self.times = []

        def __call__(self, input_ids, scores):
            self.times.append(time.perf_counter())
            return scores

    def once():
        arrivals = Arrivals()
        start = time.perf_counter()
        with torch.no_grad():
            model.generate(prompt, max_new_tokens=args.new_tokens,
                           min_new_tokens=args.new_tokens, do_sample=False, use_cache=True,
                           logits_processor=LogitsProcessorList([arrivals]), pad_token_id=0)
        first, last = arrivals.times[0], arrivals.times[-1]
        return first - start, (last - first) / (len(arrivals.times) - 1)

    for _ in range(args.warmup):
        once()
    timed = [once() for _ in range(args.steps)]
    return {
        "prefill_seconds": statistics.median(prefill for prefill, _ in timed),
        "decode_seconds_per_token": statistics.median(decode for _, decode in timed),
        "version": f"torch {torch.__version__} / transformers {transformers.__version__}",
    }


# jax -----------------------------------------------------------------------------------------


def run_jax(config, args):
    if args.threads is not None:
        cpus = sorted(os.sched_getaffinity(0))
        if args.threads > len(cpus):
            fail(f"--threads {args.threads}: this process may only run on {len(cpus)} CPUs")
        # Before JAX starts: XLA sizes its CPU thread pool from the CPUs available.
        os.sched_setaffinity(0, cpus[:args.threads])

    import jax
    import jax.numpy as jnp

    vocab, hidden, ffn = config["vocab_size"], config["hidden_size"], config["ffn_size"]
    heads, kv_heads = config["num_heads"], config["num_kv_heads"]
    head_dim = hidden // heads
    eps, theta, std = config["rms_norm_eps"], config["rope_theta"], config["init_std"]
    compute_dtype = jnp.bfloat16 if args.precision == "bf16-mixed" else jnp.float32

    def init_params(key):
        keys = iter(jax.random.split(key, 2 + 7 * config["num_layers"]))

        def normal(shape):
            return std * jax.random.normal(next(keys), shape, jnp.float32)

        # Matrices are stored [in, out], so a linear layer is `x @ w`.
        layers = [
            {
                "attn_norm": jnp.ones(hidden, jnp.float32),
                "wq": normal((hidden, heads * head_dim)),
                "wk": normal((hidden, kv_heads * head_dim)),
                "wv": normal((hidden, kv_heads * head_dim)),
                "wo": normal((heads * head_dim, hidden)),
                "mlp_norm": jnp.ones(hidden, jnp.float32),
                "w_gate": normal((hidden, ffn)),
                "w_up": normal((hidden, ffn)),
                "w_down": normal((ffn, hidden)),
            }
            for _ in range(config["num_layers"])
        ]
        return {
            "embed": normal((vocab, hidden)),
            "layers": layers,
            "norm": jnp.ones(hidden, jnp.float32),
            "lm_head": normal((hidden, vocab)),
        }

    def rms_norm(x, weight):
        # As transformers' LlamaRMSNorm: normalise in f32, scale in the input's dtype.
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
        return weight * x32.astype(x.dtype)

    def rope_tables(seq_len):
        inv_freq = 1.0 / theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)
        freqs = jnp.arange(seq_len, dtype=jnp.float32)[:, None] * inv_freq[None, :]
        angles = jnp.concatenate([freqs, freqs], axis=-1)  # [S, head_dim]
        return jnp.cos(angles), jnp.sin(angles)

    def apply_rope(x, cos, sin):  # x: [B, S, heads, head_dim]
        cos, sin = cos[:, None, :].astype(x.dtype), sin[:, None, :].astype(x.dtype)
        first, second = jnp.split(x, 2, axis=-1)
        return x * cos + jnp.concatenate([-second, first], axis=-1) * sin

    def attention(layer, x, cos, sin, causal):
        b, s, _ = x.shape
        q = apply_rope((x @ layer["wq"]).reshape(b, s, heads, head_dim), cos, sin)
        k = apply_rope((x @ layer["wk"]).reshape(b, s, kv_heads, head_dim), cos, sin)
        v = (x @ layer["wv"]).reshape(b, s, kv_heads, head_dim)
        # Grouped-query attention: KV head i serves query heads i * group .. (i + 1) * group.
        group = heads // kv_heads
        k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(head_dim)
        scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
        probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(q.dtype)
        out = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, heads * head_dim)
        return out @ layer["wo"]

    def mlp(layer, x):
        return (jax.nn.silu(x @ layer["w_gate"]) * (x @ layer["w_up"])) @ layer["w_down"]

    def forward(params, tokens):
        seq_len = tokens.shape[1]
        cos, sin = rope_tables(seq_len)
        causal = jnp.tril(jnp.ones((seq_len, seq_len), dtype=bool))
        x = params["embed"][tokens]
        for layer in params["layers"]:
            x = x + attention(layer, rms_norm(x, layer["attn_norm"]), cos, sin, causal)
            x = x + mlp(layer, rms_norm(x, layer["mlp_norm"]))
        return rms_norm(x, params["norm"]) @ params["lm_head"]

    def loss_fn(params, inputs, targets):
        # bf16-mixed: the f32 master weights are cast here, so their gradients stay f32.
        params = jax.tree_util.tree_map(lambda p: p.astype(compute_dtype), params)
        logits = forward(params, inputs).astype(jnp.float32)
        log_probs = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.take_along_axis(log_probs, targets[..., None], axis=-1).mean()

    def train_step(params, opt_state, inputs, targets):
        loss, grads = jax.value_and_grad(loss_fn)(params, inputs, targets)
        leaves = jax.tree_util.tree_leaves(grads)
        # torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when below 1.
        norm = jnp.sqrt(sum(jnp.sum(g * g) for g in leaves))
        scale = jnp.minimum(1.0, CLIP_NORM / (norm + 1e-6))
        grads = jax.tree_util.tree_map(lambda g: g * scale, grads)

        # torch.optim.AdamW: decoupled weight decay, then the bias-corrected Adam update.
        beta1, beta2 = BETAS
        count = opt_state["count"] + 1
        m = jax.tree_util.tree_map(lambda m, g: beta1 * m + (1 - beta1) * g,
                                   opt_state["m"], grads)
        v = jax.tree_util.tree_map(lambda v, g: beta2 * v + (1 - beta2) * g * g,
                                   opt_state["v"], grads)
        correction1 = 1 - beta1 ** count.astype(jnp.float32)
        correction2 = 1 - beta2 ** count.astype(jnp.float32)

        def update(p, m, v):
            p = p * (1 - LR * WEIGHT_DECAY)
            return p - (LR / correction1) * m / (jnp.sqrt(v) / jnp.sqrt(correction2) + EPS)

        params = jax.tree_util.tree_map(update, params, m, v)
        return params, {"count": count, "m": m, "v": v}, loss

    params = init_params(jax.random.PRNGKey(SEED))
    opt_state = {
        "count": jnp.zeros((), jnp.int32),
        # Two separate sets of buffers: the state is donated to the step.
        "m": jax.tree_util.tree_map(jnp.zeros_like, params),
        "v": jax.tree_util.tree_map(jnp.zeros_like, params),
    }
    batch = jnp.asarray(batch_rows(vocab, args.batch, args.seq_len), dtype=jnp.int32)
    inputs, targets = batch[:, :-1], batch[:, 1:]
    jax.block_until_ready((params, opt_state, inputs, targets))
    resident_at_start = resident_bytes()

    start = time.perf_counter()
    compiled = jax.jit(train_step, donate_argnums=(0, 1)).lower(
        params, opt_state, inputs, targets).compile()
    compile_seconds = time.perf_counter() - start

    state = {"params": params, "opt_state": opt_state}

    def step():
        params, opt_state, loss = compiled(state["params"], state["opt_state"], inputs, targets)
        jax.block_until_ready((params, opt_state, loss))
        state["params"], state["opt_state"] = params, opt_state
        return loss

    median, final_loss, _ = time_steps(step, args.warmup, args.steps)
    return {
        "median_step_seconds": median,
        "compiles": 1,
        "compile_seconds": compile_seconds,
        "resident_at_start_bytes": resident_at_start,
        "final_loss": final_loss,
        "version": f"jax {jax.__version__}",
    }


# cnn -----------------------------------------------------------------------------------------


def generated_images(batch, seed):
    """The images and labels of `hlat::vision::generated_batch`: a bright 6x5 square on noise,
    its position telling the class, from the same SplitMix64 stream."""
    rng = SplitMix64(seed)

    pixels, labels = [], []
    for _ in range(batch):
        label = rng.below(CNN_CLASSES)
        row, column = 2 + 2 * (label // 5) * 6, 2 + (label % 5) * 5
        for y in range(CNN_IMAGE_SIZE):
            for x in range(CNN_IMAGE_SIZE):
                noise = rng.below(256) / 1024.0
                inside = row <= y < row + 6 and column <= x < column + 5
                pixels.append(0.75 + noise if inside else noise)
        labels.append(label)
    return pixels, labels


def run_pytorch_cnn(args):
    """`hlat::vision::SmallCnn` in torch.nn, trained with Adam on the same generated images."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(SEED)
    model = nn.Sequential(
        nn.Conv2d(1, 8, 3), nn.ReLU(), nn.MaxPool2d(2, 2),
        nn.Conv2d(8, 16, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
        nn.Flatten(), nn.Linear(16 * 4 * 4, CNN_CLASSES),
    ).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    pixels, labels = generated_images(args.batch, args.seed)
    images = torch.tensor(pixels).reshape(args.batch, 1, CNN_IMAGE_SIZE, CNN_IMAGE_SIZE)
    labels = torch.tensor(labels)

    def step():
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.item()

    start = time.perf_counter()
    step()
    first_step_seconds = time.perf_counter() - start
    median, final_loss, _ = time_steps(step, args.warmup, args.steps)
    return {
        "first_step_seconds": first_step_seconds,
        "median_step_seconds": median,
        "final_loss": final_loss,
        "version": f"torch {torch.__version__}",
    }


# main ----------------------------------------------------------------------------------------


def main():
    args = parse_args()
    config = load_config(args.config) if args.config is not None else None
    require(args.framework, args.task)

    # Only the result line goes to stdout: send everything else, the frameworks' own output
    # included (even from native code), to stderr.
    result_fd = os.dup(sys.stdout.fileno())
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

    if args.task == "cnn":
        measured = run_pytorch_cnn(args)
        measured["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        sys.stdout.flush()
        with os.fdopen(result_fd, "w") as out:
            out.write(json.dumps({"backend": "pytorch", **measured}) + "\n")
        return

    if args.task == "generate":
        measured = run_pytorch_generate(config, args)
        result = {
            "backend": "transformers",
            "prefill_seconds": measured["prefill_seconds"],
            "decode_seconds_per_token": measured["decode_seconds_per_token"],
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "version": measured["version"],
        }
        sys.stdout.flush()
        with os.fdopen(result_fd, "w") as out:
            out.write(json.dumps(result) + "\n")
        return

    run = run_pytorch if args.framework == "pytorch" else run_jax
    measured = run(config, args)
    result = {
        "backend": args.framework,
        "median_step_seconds": measured["median_step_seconds"],
        "tokens_per_second": args.batch * args.seq_len / measured["median_step_seconds"],
        "compiles": measured["compiles"],
        "compile_seconds": measured["compile_seconds"],
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "resident_at_start_bytes": measured["resident_at_start_bytes"],
        "final_loss": measured["final_loss"],
        "version": measured["version"],
    }
    sys.stdout.flush()
    with os.fdopen(result_fd, "w") as out:
        out.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
