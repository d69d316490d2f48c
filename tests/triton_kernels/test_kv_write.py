"""kv_write_triton against kv_write_torch: bit-exact cache bytes, on strided views of a uint8
pool row; under Triton's interpreter on the CPU and on a GPU at a real token count."""

import pytest
import torch

from atomk31.ops.kv_write import kv_write_torch

KERNEL_MODULE = "atomk31.triton_kernels.kv_write"
LATENT_DTYPES = [torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e4m3fnuz]
KEY_FORMATS = [("fp8", "e4m3fn"), ("fp8", "e4m3fnuz"), ("mxfp4", "e4m3fn")]
FP8_DTYPES = {"e4m3fn": torch.float8_e4m3fn, "e4m3fnuz": torch.float8_e4m3fnuz}


def pool_caches(num_blocks: int, block_size: int, latent_dtype: torch.dtype, index_format: str,
                fp8_variant: str, device: str):
    """(pool, latent_cache, index_values, index_scales): strided views of one poisoned uint8
    row per block, [pad | latent | pad | values | scales | pad] like the cache package's."""
    latent_bytes = block_size * 576 * latent_dtype.itemsize
    value_bytes = block_size * (128 if index_format == "fp8" else 64)
    scale_bytes = block_size * 4
    row_bytes = 16 + latent_bytes + 32 + value_bytes + scale_bytes + 48
    pool = torch.full((num_blocks, row_bytes), 0x5A, dtype=torch.uint8, device=device)
    start = 16
    latent = pool[:, start:start + latent_bytes].view(latent_dtype)
    latent = latent.view(num_blocks, block_size, 576)
    start += latent_bytes + 32
    if index_format == "fp8":
        values = pool[:, start:start + value_bytes].view(FP8_DTYPES[fp8_variant])
        values = values.view(num_blocks, block_size, 128)
        scales = pool[:, start + value_bytes:start + value_bytes + scale_bytes]
        scales = scales.view(torch.float32)
    else:
        values = pool[:, start:start + value_bytes].view(num_blocks, block_size, 64)
        scales = pool[:, start + value_bytes:start + value_bytes + scale_bytes]
        scales = scales.view(num_blocks, block_size, 4)
    return pool, latent, values, scales


def make_tokens(num_tokens: int, num_slots: int, seed: int, device: str):
    """Latents with a few values far past the fp8 range and exact E2M1 / fp8 ties, keys with one
    all-zero row, distinct slots with every fourth token skipped (-1)."""
    generator = torch.Generator().manual_seed(seed)
    latent = torch.randn(num_tokens, 576, generator=generator)
    keys = torch.randn(num_tokens, 128, generator=generator) * 3.0
    if num_tokens > 1:
        latent[0, :4] = torch.tensor([1e4, -1e4, 0.0, -0.0])
        keys[1] = 0.0
        keys[-1, :8] = torch.tensor([6.0, 5.0, 3.5, 2.5, 1.75, 1.25, 0.75, 0.25])  # MXFP4 ties
    slots = torch.randperm(num_slots, generator=generator)[:num_tokens]
    slots[3::4] = -1
    return latent.to(device), keys.to(device), slots.to(device)


def run_both(write, num_tokens, num_blocks, block_size, latent_dtype, key_format, device,
             seed, latent_scale=0.5):
    """Write the same tokens with `write` on `device` and with torch on the CPU; both pools."""
    index_format, fp8_variant = key_format
    latent, keys, slots = make_tokens(num_tokens, num_blocks * block_size, seed, device)
    pools = []
    for fn, dev in ((write, device), (kv_write_torch, "cpu")):
        pool, cache, values, scales = pool_caches(num_blocks, block_size, latent_dtype,
                                                  index_format, fp8_variant, dev)
        fn(latent.to(dev), keys.to(dev), slots.to(dev), cache, latent_scale, values, scales,
           index_format, fp8_variant)
        pools.append(pool.cpu())
    return pools


@pytest.mark.parametrize("key_format", KEY_FORMATS, ids=lambda f: "keys_" + "_".join(f))
@pytest.mark.parametrize("latent_dtype", LATENT_DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_kv_write_triton_interpreter_bit_exact(interpreted, latent_dtype, key_format):
    if latent_dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz) and \
            latent_dtype != FP8_DTYPES[key_format[1]] and key_format[0] == "fp8":
        pytest.skip("one device speaks one fp8 variant (§6.1)")
    # 21 tokens: not a multiple of the 16-token program; block size 8: many blocks.
    got, want = run_both(interpreted.kv_write_triton, 21, 6, 8, latent_dtype, key_format,
                         "cpu", seed=7)
    assert torch.equal(got, want), f"{int((got != want).sum())} cache bytes differ"


@pytest.mark.parametrize("num_tokens", [0, 1], ids=lambda n: f"Nt{n}")
def test_kv_write_triton_interpreter_tiny_batches(interpreted, num_tokens):
    got, want = run_both(interpreted.kv_write_triton, num_tokens, 2, 4, torch.float8_e4m3fn,
                         ("fp8", "e4m3fn"), "cpu", seed=3)
    assert torch.equal(got, want)


def test_kv_write_triton_rejects_strided_last_dim(interpreted):
    _, cache, values, scales = pool_caches(2, 4, torch.bfloat16, "fp8", "e4m3fn", "cpu")
    wide = torch.zeros(2, 4, 1152, dtype=torch.bfloat16)[:, :, ::2]
    with pytest.raises(ValueError, match="latent_cache must have a contiguous last dim"):
        interpreted.kv_write_triton(torch.zeros(1, 576), torch.zeros(1, 128),
                                    torch.zeros(1, dtype=torch.int64), wide, 1.0, values,
                                    scales, "fp8", "e4m3fn")


@pytest.mark.gpu
@pytest.mark.parametrize("key_format", [("fp8", "e4m3fn"), ("mxfp4", "e4m3fn")],
                         ids=lambda f: "keys_" + f[0])
@pytest.mark.parametrize("latent_dtype", [torch.bfloat16, torch.float8_e4m3fn],
                         ids=lambda d: str(d).split(".")[-1])
def test_kv_write_triton_gpu_bit_exact(latent_dtype, key_format):
    from atomk31.triton_kernels.kv_write import kv_write_triton

    # A 1000-token prefill chunk into 128-token blocks, against torch on the CPU.
    got, want = run_both(kv_write_triton, 1000, 16, 128, latent_dtype, key_format, "cuda",
                         seed=11, latent_scale=1.0)
    assert torch.equal(got, want), f"{int((got != want).sum())} cache bytes differ"
