#!/usr/bin/env python3
"""Writes small, exact fixtures for the klein sigma schedule, the Euler step and the initial noise,
computed with the real diffusers / torch code (no re-implementation here):

  tests/data/ref/sched_exact/   sigmas/timesteps of Flux2KleinPipeline for N = 1..8 at several sizes,
                                a few non-default scheduler configs, and FlowMatchEuler step outputs
  tests/data/ref/noise_exact/   torch.randn(shape, generator=torch.Generator("cpu").manual_seed(seed))
                                for float32 and bfloat16 (full arrays for small shapes, hashes
                                of the raw bytes for large ones)

Run with the oracle venv:  /work/oracle-venv/bin/python scripts/reference/dump_schedule_noise.py
Options: --out DIR (default tests/data/ref), --extra FILE (also write a large list of noise hashes
for many shapes/seeds to FILE, used by the env-gated test KLEIN_NOISE_EXTRA; not committed).

The noise depends on which ATen CPU kernel runs: x86 CPUs with AVX2 run the AVX2 kernel (AVX-512
CPUs too: normal_ is not dispatched to AVX-512); ATEN_CPU_CAPABILITY=default selects the scalar one.
Cases with kernel "default" are produced in a subprocess with that variable set.
"""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]

# FLUX.2 / klein scheduler config (same values as tests/data/tiny/scheduler/scheduler_config.json).
FLUX2_SCHED = {
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "invert_sigmas": False,
    "max_image_seq_len": 4096,
    "max_shift": 1.15,
    "num_train_timesteps": 1000,
    "shift": 3.0,
    "shift_terminal": None,
    "stochastic_sampling": False,
    "time_shift_type": "exponential",
    "use_beta_sigmas": False,
    "use_dynamic_shifting": True,
    "use_exponential_sigmas": False,
    "use_karras_sigmas": False,
}

SIZES = [(256, 256), (512, 512), (1024, 1024), (1360, 768), (1088, 1088), (64, 64), (1024, 1072)]
STEPS = list(range(1, 9))

VARIANTS = {
    # name: config overrides
    "static3": {"use_dynamic_shifting": False, "shift": 3.0},
    "static1": {"use_dynamic_shifting": False, "shift": 1.0},
    "linear": {"time_shift_type": "linear"},
    "terminal": {"shift_terminal": 0.02},
    "invert": {"invert_sigmas": True},
}
VARIANT_STEPS = [1, 2, 4, 7, 28]
VARIANT_SIZE = (512, 512)

NOISE_SEEDS = [0, 1, 42, 12345]
NOISE_FULL_SHAPES = [(1, 128, 4, 4), (1, 128, 3, 5), (3,), (17,), (1, 128, 1, 1), (1,), (2,), (15,),
                     (16,), (31,), (33,), (1, 3, 5, 7)]
NOISE_HASH_SHAPES = [(1, 128, 16, 16), (1, 128, 64, 64), (1, 128, 48, 85), (1, 128, 68, 68)]


def _splitmix64(x):
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def bits_hash(t: torch.Tensor) -> str:
    """Order-sensitive 64-bit hash of the element bit patterns (u32 for f32, u16 for bf16):
    h = splitmix64(n + sum_i (splitmix64(i) | 1) * (bits_i + 1)) mod 2^64. Any single changed element
    changes h (the weights are odd). Mirrored in tests/test_noise.cpp."""
    if t.dtype == torch.bfloat16:
        bits = t.contiguous().view(torch.int16).numpy().view(np.uint16).astype(np.uint64)
    else:
        bits = t.contiguous().numpy().view(np.uint32).astype(np.uint64)
    bits = bits.reshape(-1)
    with np.errstate(over="ignore"):
        w = _splitmix64(np.arange(bits.size, dtype=np.uint64)) | np.uint64(1)
        s = np.sum(w * (bits + np.uint64(1)), dtype=np.uint64)
        h = _splitmix64(np.uint64(bits.size) + s)
    return f"{int(h):016x}"


# ----------------------------------------------------------------------------------------------
# schedule
# ----------------------------------------------------------------------------------------------
def klein_schedule(config, W, H, N):
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.flux2.pipeline_flux2_klein import compute_empirical_mu, retrieve_timesteps
    sched = FlowMatchEulerDiscreteScheduler.from_config(config)
    seq_len = (H // 16) * (W // 16)  # latents.shape[1] in the pipeline (H, W floored to /16)
    # exactly the pipeline's lines (pipeline_flux2_klein.py, "6. Prepare timesteps")
    sigmas = np.linspace(1.0, 1 / N, N)
    mu = compute_empirical_mu(image_seq_len=seq_len, num_steps=N)
    timesteps, n = retrieve_timesteps(sched, N, torch.device("cpu"), sigmas=sigmas, mu=mu)
    assert n == N
    return sched, seq_len, mu


def dump_schedule(out: Path):
    out.mkdir(parents=True, exist_ok=True)
    (out / "scheduler_config.json").write_text(json.dumps(FLUX2_SCHED, indent=2) + "\n")
    cases = []
    for (W, H) in SIZES:
        for N in STEPS:
            sched, seq_len, mu = klein_schedule(FLUX2_SCHED, W, H, N)
            s = sched.sigmas.numpy().astype(np.float32)
            t = sched.timesteps.numpy().astype(np.float32)
            assert s.shape == (N + 1,) and t.shape == (N,)
            np.save(out / f"sigmas_{W}x{H}_{N}.npy", s)
            np.save(out / f"timesteps_{W}x{H}_{N}.npy", t)
            cases.append(dict(width=W, height=H, steps=N, image_seq_len=seq_len, mu=mu))
    variants = []
    for name, over in VARIANTS.items():
        cfg = dict(FLUX2_SCHED, **over)
        W, H = VARIANT_SIZE
        for N in VARIANT_STEPS:
            sched, seq_len, mu = klein_schedule(cfg, W, H, N)
            np.save(out / f"var_{name}_sigmas_{N}.npy", sched.sigmas.numpy().astype(np.float32))
            np.save(out / f"var_{name}_timesteps_{N}.npy", sched.timesteps.numpy().astype(np.float32))
        variants.append(dict(name=name, config=cfg, width=W, height=H, steps=VARIANT_STEPS))

    # Euler step: scheduler.step exactly as the pipeline calls it, fp32 and bf16 model dtype.
    steps = []
    from diffusers import FlowMatchEulerDiscreteScheduler
    g = torch.Generator("cpu").manual_seed(7)
    shape = (1, 15, 128)  # packed latents (B, S, C)
    x32 = torch.randn(shape, generator=g) * 1.3
    v32 = torch.randn(shape, generator=g) * 0.9
    for dtype_name, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        sched, _, _ = klein_schedule(FLUX2_SCHED, 1024, 1024, 4)
        sched.set_begin_index(0)
        lat = x32.to(dtype)
        v = v32.to(dtype)
        np.save(out / f"step_x0_{dtype_name}.npy", lat.float().numpy())
        np.save(out / f"step_v_{dtype_name}.npy", v.float().numpy())
        for i, t in enumerate(sched.timesteps):
            lat = sched.step(v, t, lat, return_dict=False)[0]
            assert lat.dtype == dtype
            np.save(out / f"step_x{i + 1}_{dtype_name}.npy", lat.float().numpy())
        steps.append(dict(dtype=dtype_name, shape=list(shape), width=1024, height=1024, steps=4,
                          sigmas=[float(s) for s in sched.sigmas]))
    meta = dict(
        generator="scripts/reference/dump_schedule_noise.py",
        versions=dict(torch=torch.__version__, numpy=np.__version__,
                      diffusers=__import__("diffusers").__version__),
        note="sigmas_<W>x<H>_<N>.npy (N+1, float32, trailing 0) and timesteps_<W>x<H>_<N>.npy (N, float32) "
             "from Flux2KleinPipeline's own code path: np.linspace(1, 1/N, N), compute_empirical_mu, "
             "retrieve_timesteps(scheduler, sigmas=..., mu=...). mu is the Python float passed.",
        cases=cases, variants=variants, euler_steps=steps)
    (out / "cases.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"schedule: {len(cases)} cases + {len(variants)} variants -> {out}")


# ----------------------------------------------------------------------------------------------
# noise
# ----------------------------------------------------------------------------------------------
def draw(shape, seed, dtype):
    from diffusers.utils.torch_utils import randn_tensor
    t = randn_tensor(tuple(shape), generator=torch.Generator("cpu").manual_seed(seed),
                     device=torch.device("cpu"), dtype=dtype)
    # randn_tensor with a CPU generator is exactly torch.randn on the CPU
    assert torch.equal(t, torch.randn(tuple(shape), generator=torch.Generator("cpu").manual_seed(seed),
                                      dtype=dtype))
    return t


def noise_hash_entries(shapes, seeds, kernel):
    out = []
    for seed in seeds:
        for shape in shapes:
            for dname, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
                t = draw(shape, seed, dtype)
                out.append(dict(seed=seed, shape=list(shape), dtype=dname, kernel=kernel,
                                hash=bits_hash(t),
                                head=[float(x) for x in t.flatten()[:8].float()]))
    return out


def child_default(args):
    """Runs in a subprocess with ATEN_CPU_CAPABILITY=default; prints JSON to stdout."""
    assert torch.backends.cpu.get_cpu_capability() == "DEFAULT", torch.backends.cpu.get_cpu_capability()
    spec = json.loads(args.child_default)
    res = dict(full=[], hashes=noise_hash_entries([tuple(s) for s in spec["hash_shapes"]], spec["seeds"],
                                                  "default"))
    for seed in spec["full_seeds"]:
        for shape in spec["full_shapes"]:
            for dname, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
                res["full"].append(dict(seed=seed, shape=shape, dtype=dname,
                                        values=draw(shape, seed, dtype).float().flatten().tolist()))
    print(json.dumps(res))


def run_default_child(spec):
    env = dict(os.environ, ATEN_CPU_CAPABILITY="default")
    r = subprocess.run([sys.executable, __file__, "--child-default", json.dumps(spec)], env=env,
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def shape_name(shape):
    return "x".join(str(s) for s in shape)


def dump_noise(out: Path):
    out.mkdir(parents=True, exist_ok=True)
    cap = torch.backends.cpu.get_cpu_capability()
    assert cap in ("AVX2", "AVX512"), f"fixtures are for the AVX2 kernel; this CPU runs {cap}"
    full = []
    for seed in NOISE_SEEDS:
        for shape in NOISE_FULL_SHAPES:
            for dname, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
                t = draw(shape, seed, dtype)
                fn = f"seed{seed}_{shape_name(shape)}_{dname}.npy"
                np.save(out / fn, t.float().numpy())  # bf16 values are exact in float32
                full.append(dict(seed=seed, shape=list(shape), dtype=dname, kernel="avx2", file=fn))
    # one large array in full for a direct elementwise check
    t = draw((1, 128, 16, 16), 42, torch.float32)
    np.save(out / "seed42_1x128x16x16_f32.npy", t.numpy())
    full.append(dict(seed=42, shape=[1, 128, 16, 16], dtype="f32", kernel="avx2",
                     file="seed42_1x128x16x16_f32.npy"))
    hashes = noise_hash_entries(NOISE_HASH_SHAPES, NOISE_SEEDS, "avx2")
    hashes += noise_hash_entries([(1, 128, 16, 16)], [2**32 + 5, 2**40 + 1], "avx2")

    # the scalar (DEFAULT capability) kernel, for a few cases
    spec = dict(seeds=[0, 42], hash_shapes=[(1, 128, 16, 16), (1, 128, 3, 5)], full_seeds=[0, 42],
                full_shapes=[[1, 128, 3, 5], [17], [3]])
    child = run_default_child(spec)
    hashes += child["hashes"]
    for e in child["full"]:
        fn = f"default_seed{e['seed']}_{shape_name(e['shape'])}_{e['dtype']}.npy"
        np.save(out / fn, np.asarray(e["values"], dtype=np.float32).reshape(e["shape"]))
        full.append(dict(seed=e["seed"], shape=e["shape"], dtype=e["dtype"], kernel="default", file=fn))

    # facts worth recording
    f32 = draw((1, 128, 3, 5), 0, torch.float32)
    b16 = draw((1, 128, 3, 5), 0, torch.bfloat16)
    odd32 = draw((17,), 0, torch.float32)
    odd16 = draw((17,), 0, torch.bfloat16)
    facts = dict(
        bf16_equals_rounded_f32_when_numel_multiple_of_16=bool(torch.equal(f32.to(torch.bfloat16), b16)),
        bf16_equals_rounded_f32_numel17=bool(torch.equal(odd32.to(torch.bfloat16), odd16)),
    )
    meta = dict(generator="scripts/reference/dump_schedule_noise.py", cpu_capability=cap,
                versions=dict(torch=torch.__version__, numpy=np.__version__),
                note="torch.randn(shape, generator=torch.Generator('cpu').manual_seed(seed), dtype) "
                     "(= diffusers randn_tensor with a CPU generator). .npy files hold float32 "
                     "(bf16 values upcast exactly). hash = bits_hash() over the element bit patterns "
                     "(u32 for f32, u16 for bf16), see the script. kernel: avx2 = ATen "
                     "AVX2 CPU kernel (any x86 CPU with AVX2), default = ATEN_CPU_CAPABILITY=default.",
                facts=facts, full=full, hashes=hashes)
    (out / "cases.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"noise: {len(full)} arrays + {len(hashes)} hashes -> {out}; facts {facts}")


def dump_extra(path: Path):
    """Many shapes and seeds (hashes only), for the env-gated test. Not committed."""
    rng = np.random.default_rng(1234)
    shapes = [(n,) for n in list(range(1, 70)) + [100, 127, 128, 129, 255, 256, 257, 1000, 4095, 4097]]
    shapes += [(1, 128, h, w) for h, w in [(1, 1), (2, 3), (5, 7), (8, 8), (32, 32), (45, 80), (80, 45),
                                            (85, 48), (96, 96), (128, 128)]]
    shapes += [tuple(int(x) for x in rng.integers(1, 40, size=3)) for _ in range(30)]
    seeds = [0, 1, 2, 3, 42, 12345, 2**31 - 1, 2**32 - 1, 987654321] + \
        [int(x) for x in rng.integers(0, 2**63 - 1, size=8)]
    hashes = []
    for shape in shapes:
        for seed in seeds[:4] + [int(rng.choice(seeds))]:
            hashes += noise_hash_entries([shape], [seed], "avx2")
    big = [(1, 128, 128, 128), (1, 128, 64, 64), (7, 1000, 3)]
    hashes += noise_hash_entries(big, seeds, "avx2")
    spec = dict(seeds=[0, 1, 42], hash_shapes=[list(s) for s in shapes[::4]], full_seeds=[], full_shapes=[])
    hashes += run_default_child(spec)["hashes"]
    path.write_text(json.dumps(dict(hashes=hashes)) + "\n")
    print(f"extra: {len(hashes)} hashes -> {path}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "data" / "ref")
    ap.add_argument("--extra", type=Path, default=None)
    ap.add_argument("--only", choices=["sched", "noise", "extra"], default=None)
    ap.add_argument("--child-default", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_default:
        child_default(args)
        return
    if args.only in (None, "sched"):
        dump_schedule(args.out / "sched_exact")
    if args.only in (None, "noise"):
        dump_noise(args.out / "noise_exact")
    if args.extra is not None:
        dump_extra(args.extra)


if __name__ == "__main__":
    main()
