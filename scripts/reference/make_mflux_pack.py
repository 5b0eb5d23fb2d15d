"""Writes tests/data/mflux/{q4,q8}/: the tiny model (tests/data/tiny) saved as mflux saves a
quantized FLUX.2 [klein] (mflux's ModelSaver._save_weights: per component folder, shards
0.safetensors, 1.safetensors, ... with header metadata quantization_level / mflux_version, and a
model.safetensors.index.json; no config.json), with mflux's own parameter names and layouts:

  * names: Flux2WeightMapping (mflux/models/flux2/weights/flux2_weight_mapping.py) maps the
    diffusers / transformers names to mflux's; this script applies it forwards:
    time_guidance_embed.timestep_embedder.linear_{1,2} -> time_guidance_embed.linear_{1,2},
    transformer_blocks.N.attn.to_out.0 -> ...attn.to_out, the VAE's attentions.0.to_out.0 ->
    attentions.0.to_out, the text encoder without its "model." prefix (and no lm_head);
  * VAE conv weights OIHW -> OHWI (WeightTransforms.transpose_conv2d_weight: transpose(0, 2, 3, 1));
    bn.num_batches_tracked is not an mflux parameter;
  * quantization as mflux does it (nn.quantize with the defaults: affine, groups of 64) of every
    Linear and Embedding weight, with mx.quantize: U32 words + bf16 scales + bf16 biases. mflux
    quantizes every such layer; the tiny model's layers narrower than 64 inputs cannot be
    quantized in groups of 64 and stay bf16 here.

Departures from a real pack, for a small fixture: q4 holds all three components, q8 only the
transformer (the tiny VAE and text encoder have no layer of 64 or more inputs, so they would be
the same bytes again; the tests add the tiny model's with --vae / --text-encoder); the transformer is split over two
shards to exercise sharding; no tokenizer folder (the built-in one is used); vae/config.json is
copied from the tiny model, because its 4 GroupNorm groups cannot be read from the tensor shapes
(FLUX.2's VAE has 32, the preset's value).

Reference outputs (diffusers in /work/oracle, fp32, on the weights MLX dequantizes with
mx.dequantize): ref_transformer.npy (Flux2Transformer2DModel on fixed inputs, as
make_fp8_files.py), ref_vae_decode.npy (AutoencoderKLFlux2.decode of a fixed latent), and the
same with the full-precision weights (full_*.npy) for the PSNR the tests print.

    /work/venv-mlx/bin/python scripts/reference/make_mflux_pack.py    # writes packs + dequantized weights
    /work/oracle/bin/python scripts/reference/make_mflux_pack.py --reference   # diffusers outputs

Made with mlx 0.32.4 (CPU), diffusers 0.42.1 and torch 2.15.0 (CPU). Deterministic.
"""
import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TINY = os.path.join(HERE, "..", "..", "tests", "data", "tiny")
OUT = os.path.join(HERE, "..", "..", "tests", "data", "mflux")
WORK = os.environ.get("MFLUX_WORK", "/tmp/mflux_pack_work")  # dequantized weights (not committed)
GROUP = 64
MFLUX_VERSION = "0.13.0"


def to_mflux_name(component, k):
    """diffusers / transformers name -> mflux parameter name (Flux2WeightMapping, forwards)."""
    if component == "transformer":
        k = k.replace("time_guidance_embed.timestep_embedder.linear_", "time_guidance_embed.linear_")
        if k.startswith("transformer_blocks.") and ".attn.to_out.0." in k:
            k = k.replace(".attn.to_out.0.", ".attn.to_out.")
        return k
    if component == "vae":
        return k.replace(".attentions.0.to_out.0.", ".attentions.0.to_out.")
    assert k.startswith("model."), k
    return k[len("model."):]


def write_packs():
    import mlx.core as mx
    import numpy as np

    files = {"transformer": "transformer/diffusion_pytorch_model.safetensors",
             "vae": "vae/diffusion_pytorch_model.safetensors",
             "text_encoder": "text_encoder/model.safetensors"}
    os.makedirs(WORK, exist_ok=True)
    for bits in (4, 8):
        pack = os.path.join(OUT, f"q{bits}")
        shutil.rmtree(pack, ignore_errors=True)
        comps = ["transformer", "vae", "text_encoder"] if bits == 4 else ["transformer"]
        for comp in comps:
            src = mx.load(os.path.join(TINY, files[comp]))
            saved, deq = {}, {}
            for k in sorted(src):
                v = src[k]
                if k.endswith("num_batches_tracked"):  # not an mflux parameter; diffusers wants it
                    deq[k] = v
                    continue
                if k.startswith("lm_head."):
                    continue
                m = to_mflux_name(comp, k)
                if v.ndim == 2 and k.endswith(".weight") and v.shape[-1] % GROUP == 0:
                    q, s, b = mx.quantize(v, group_size=GROUP, bits=bits)
                    base = m[: -len("weight")]
                    saved[m], saved[base + "scales"], saved[base + "biases"] = q, s, b
                    # In float32, as klein computes it.
                    deq[k] = mx.dequantize(q, s.astype(mx.float32), b.astype(mx.float32), group_size=GROUP, bits=bits)
                elif comp == "vae" and v.ndim == 4:
                    saved[m] = v.transpose(0, 2, 3, 1)  # WeightTransforms.transpose_conv2d_weight
                    deq[k] = v.astype(mx.float32)
                else:
                    saved[m] = v
                    deq[k] = v.astype(mx.float32) if v.dtype == mx.bfloat16 else v
            d = os.path.join(pack, comp)
            os.makedirs(d, exist_ok=True)
            keys = list(saved)
            # mflux splits at 2 GB; the transformer is split in two here to exercise sharding.
            shards = [keys[: len(keys) // 2], keys[len(keys) // 2:]] if comp == "transformer" else [keys]
            meta = {"quantization_level": str(bits), "mflux_version": MFLUX_VERSION}
            weight_map = {}
            for i, ks in enumerate(shards):
                mx.save_safetensors(os.path.join(d, f"{i}.safetensors"), {k: saved[k] for k in ks}, meta)
                weight_map.update({k: f"{i}.safetensors" for k in ks})
            with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
                json.dump({"metadata": meta, "weight_map": weight_map}, f, indent=2)
            if comp == "vae":
                shutil.copy(os.path.join(TINY, "vae", "config.json"), os.path.join(d, "config.json"))
            mx.save_safetensors(os.path.join(WORK, f"q{bits}_{comp}.safetensors"), deq)
            nq = sum(1 for k in saved if k.endswith(".scales"))
            print(f"q{bits} {comp}: {len(saved)} tensors, {nq} quantized")


def write_reference():
    import numpy as np
    import torch
    from diffusers import AutoencoderKLFlux2, Flux2Transformer2DModel
    from diffusers.pipelines.flux2.pipeline_flux2_klein import Flux2KleinPipeline
    from safetensors.torch import load_file

    def cfg_of(comp):
        c = json.load(open(os.path.join(TINY, comp, "config.json")))
        return {k: v for k, v in c.items() if not k.startswith("_")}

    tcfg, vcfg = cfg_of("transformer"), cfg_of("vae")
    g = torch.Generator().manual_seed(4242)
    lat = torch.randn(1, tcfg["in_channels"], 4, 4, generator=g)
    hs = lat.flatten(2).transpose(1, 2).contiguous()
    ehs = torch.randn(1, 8, tcfg["joint_attention_dim"], generator=g)
    timestep = torch.tensor([0.625], dtype=torch.float32)
    img_ids = Flux2KleinPipeline._prepare_latent_ids(lat)
    txt_ids = Flux2KleinPipeline._prepare_text_ids(ehs)
    z = torch.randn(1, vcfg["latent_channels"], 4, 4, generator=g)

    def run_dit(sd):
        model = Flux2Transformer2DModel.from_config(tcfg)
        model.load_state_dict({k: v.float() for k, v in sd.items()}, strict=True)
        with torch.no_grad():
            return model.float().eval()(hidden_states=hs, encoder_hidden_states=ehs, timestep=timestep,
                                        img_ids=img_ids, txt_ids=txt_ids, guidance=None, return_dict=False)[0]

    def run_vae(sd):
        model = AutoencoderKLFlux2.from_config(vcfg)
        model.load_state_dict({k: (v.float() if v.is_floating_point() else v) for k, v in sd.items()}, strict=True)
        with torch.no_grad():
            return model.float().eval().decode(z).sample

    np.save(os.path.join(OUT, "hidden_states.npy"), hs.numpy())
    np.save(os.path.join(OUT, "encoder_hidden_states.npy"), ehs.numpy())
    np.save(os.path.join(OUT, "timestep.npy"), timestep.numpy())
    np.save(os.path.join(OUT, "img_ids.npy"), img_ids.numpy().astype(np.int64))
    np.save(os.path.join(OUT, "txt_ids.npy"), txt_ids.numpy().astype(np.int64))
    np.save(os.path.join(OUT, "z.npy"), z.numpy())
    full_dit = run_dit(load_file(os.path.join(TINY, "transformer/diffusion_pytorch_model.safetensors")))
    full_vae = run_vae(load_file(os.path.join(TINY, "vae/diffusion_pytorch_model.safetensors")))
    np.save(os.path.join(OUT, "full_transformer.npy"), full_dit.numpy())
    np.save(os.path.join(OUT, "full_vae_decode.npy"), full_vae.numpy())
    for bits in (4, 8):
        d = os.path.join(OUT, f"q{bits}")
        out = run_dit(load_file(os.path.join(WORK, f"q{bits}_transformer.safetensors")))
        np.save(os.path.join(d, "ref_transformer.npy"), out.numpy())
        if bits == 4:
            img = run_vae(load_file(os.path.join(WORK, f"q{bits}_vae.safetensors")))
            np.save(os.path.join(d, "ref_vae_decode.npy"), img.numpy())
        cos = torch.nn.functional.cosine_similarity(out.flatten(), full_dit.flatten(), dim=0).item()
        print(f"q{bits}: transformer cosine vs full precision {cos:.6f}")


if __name__ == "__main__":
    write_reference() if "--reference" in sys.argv else write_packs()
