"""FP8 E4M3 in its two variants, with per-tensor, per-group and per-row scaling (MODEL_SPEC §6.1).

| variant    | bias | max | NaN           | -0  | where               |
|------------|------|-----|---------------|-----|---------------------|
| e4m3fn     | 7    | 448 | S.1111.111    | yes | gfx950, NVIDIA (OCP) |
| e4m3fnuz   | 8    | 240 | 0x80 only     | no  | gfx942 (MI300)      |

A bit pattern other than 0x80 (and fn's NaNs) decodes in fnuz to half its fn value.

Quantization everywhere is ``q = e4m3(clamp(x / s, -max, max))`` with round-to-nearest-even
and saturation. torch's float32 -> float8 cast rounds to nearest even (tests/quant/test_fp8.py
pins it for every midpoint of both variants) but does not saturate for every variant and
build (fnuz overflow gives NaN), so the clamp always comes first. A scale is
``s = max(amax, min_amax) / max`` with the ``max`` of the variant in use.

Dims: ``T`` tokens (rows), ``n`` the last (reduced) dim, ``g`` the group size.
"""

import torch

FP8_VARIANTS: tuple[str, ...] = ("e4m3fn", "e4m3fnuz")

_FP8_DTYPES: dict[str, torch.dtype] = {
    "e4m3fn": torch.float8_e4m3fn,
    "e4m3fnuz": torch.float8_e4m3fnuz,
}
_FP8_MAX: dict[str, float] = {"e4m3fn": 448.0, "e4m3fnuz": 240.0}
_FNUZ_NAN_CODE = 0x80
# §6.5: the dynamic per-token activation scale floors amax at 1e-12.
PER_ROW_MIN_AMAX: float = 1e-12


def fp8_max(variant: str) -> float:
    """Largest finite magnitude of ``variant``: 448.0 for e4m3fn, 240.0 for e4m3fnuz."""
    _check_variant(variant)
    return _FP8_MAX[variant]


def fp8_dtype(variant: str) -> torch.dtype:
    """torch dtype of ``variant``: ``torch.float8_e4m3fn`` or ``torch.float8_e4m3fnuz``."""
    _check_variant(variant)
    return _FP8_DTYPES[variant]


def divide_exactly(x: torch.Tensor, divisor: torch.Tensor | float) -> torch.Tensor:
    """``x / divisor`` correctly rounded on every device.

    PyTorch's CUDA kernels turn a division by a host scalar (a Python float or a CPU 0-dim
    tensor) into a multiplication by its rounded reciprocal, which is one ulp off for some
    inputs (seen on the H200, 2026-11-29: scales of a few rows per thousand, then their FP8
    codes). A divisor on x's device keeps the true division; a Python number is filled there
    (no host-to-device copy, so the division may be captured in a CUDA graph)."""
    if not isinstance(divisor, torch.Tensor):
        divisor = torch.full((), divisor, dtype=torch.float32, device=x.device)
    elif divisor.device != x.device:
        divisor = divisor.to(x.device)
    return x / divisor


def fp8_scale(amax: torch.Tensor, variant: str, min_amax: float) -> torch.Tensor:
    """``s = max(amax, min_amax) / max`` (float32, same shape as ``amax``)."""
    return divide_exactly(amax.float().clamp_min(min_amax), fp8_max(variant))


def quantize_fp8(
    x: torch.Tensor, scale: torch.Tensor | float, variant: str = "e4m3fn"
) -> torch.Tensor:
    """``q = e4m3(clamp(x / scale, -max, max))``, round-to-nearest-even, saturating.

    Args:
        x: ``[...]`` any float dtype; divided in float32.
        scale: positive float32 scale broadcastable to ``x`` (a float, a 0-dim tensor,
            ``[T, 1]``, ...). Not checked for positivity: a zero scale yields NaN/``max``.
        variant: ``"e4m3fn"`` or ``"e4m3fnuz"``.

    Returns:
        ``[...]`` of ``fp8_dtype(variant)``. NaN stays NaN; +-inf saturates to +-max;
        -0.0 stays -0.0 in e4m3fn and becomes +0 in e4m3fnuz (which has no -0).
    """
    fmax = fp8_max(variant)
    scaled = divide_exactly(x.float(), scale)
    return scaled.clamp(-fmax, fmax).to(_FP8_DTYPES[variant])


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    """``q * scale`` in float32.

    Args:
        q: ``[...]`` ``torch.float8_e4m3fn`` or ``torch.float8_e4m3fnuz``. Stored bytes
            (uint8) are decoded with ``decode_e4m3(codes, variant)`` instead, since bytes do not
            say their variant.
        scale: float32 broadcastable to ``q``.

    Returns:
        ``[...]`` float32.
    """
    if q.dtype not in _FP8_DTYPES.values():
        raise ValueError(
            f"dequantize_fp8 expects a float8_e4m3fn or float8_e4m3fnuz tensor, got dtype "
            f"{q.dtype}; for uint8 bytes call decode_e4m3(codes, variant) and multiply by the scale"
        )
    return q.float() * scale


def encode_e4m3(x: torch.Tensor, variant: str = "e4m3fn") -> torch.Tensor:
    """Byte codes of ``e4m3(clamp(x, -max, max))`` (scale 1): ``[...]`` float -> ``[...]`` uint8."""
    return quantize_fp8(x, 1.0, variant).view(torch.uint8)


def decode_e4m3(codes: torch.Tensor, variant: str = "e4m3fn") -> torch.Tensor:
    """Values of byte codes in ``variant``: ``[...]`` uint8 -> ``[...]`` float32."""
    if codes.dtype != torch.uint8:
        raise ValueError(f"decode_e4m3 expects uint8 codes, got dtype {codes.dtype}")
    return codes.view(fp8_dtype(variant)).float()


def convert_e4m3fn_to_e4m3fnuz(
    q: torch.Tensor, scale: torch.Tensor | float
) -> tuple[torch.Tensor, torch.Tensor | float]:
    """Reinterpret stored e4m3fn data as e4m3fnuz for gfx942 (§6.1).

    Same bytes, except 0x80 (-0 in fn, NaN in fnuz) becomes 0x00; every other pattern is worth
    half as much in fnuz, so the scale doubles and ``q * scale`` is unchanged. fn's NaN codes
    (0x7F, 0xFF) would become +-240 * 2 * scale: stored weights and caches hold no NaN.

    Args:
        q: ``[...]`` ``torch.float8_e4m3fn`` (or its uint8 bytes).
        scale: the fn scale, broadcastable to ``q``.

    Returns:
        ``(q_fnuz, scale * 2)``: ``[...]`` ``torch.float8_e4m3fnuz`` and the doubled scale.
    """
    if q.dtype not in (torch.float8_e4m3fn, torch.uint8):
        raise ValueError(
            f"convert_e4m3fn_to_e4m3fnuz expects float8_e4m3fn data (or its uint8 bytes), "
            f"got dtype {q.dtype}"
        )
    codes = q.view(torch.uint8)
    codes = torch.where(codes == _FNUZ_NAN_CODE, torch.zeros_like(codes), codes)
    return codes.view(torch.float8_e4m3fnuz), scale * 2.0


def quantize_fp8_per_tensor(
    x: torch.Tensor, variant: str, min_amax: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale for the whole tensor.

    Args:
        x: ``[...]`` any float dtype.
        variant: ``"e4m3fn"`` or ``"e4m3fnuz"``.
        min_amax: floor on amax, keeping the scale positive for all-zero (or empty) tensors.

    Returns:
        ``(q, scale)``: ``[...]`` float8 of ``variant`` and a 0-dim float32 scale.
    """
    amax = x.float().abs().amax() if x.numel() > 0 else torch.zeros((), device=x.device)
    scale = fp8_scale(amax, variant, min_amax)
    return quantize_fp8(x, scale, variant), scale


def quantize_fp8_per_group(
    x: torch.Tensor, group_size: int, variant: str, min_amax: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale per contiguous group of ``group_size`` values along the last dim.

    The index keys use ``group_size=128`` and ``min_amax=1e-4`` (§9 #4).

    Args:
        x: ``[..., n]`` any float dtype; ``n`` a multiple of ``group_size``.
        group_size: positive group length ``g``.
        variant: ``"e4m3fn"`` or ``"e4m3fnuz"``.
        min_amax: floor on each group's amax.

    Returns:
        ``(q, scales)``: ``q [..., n]`` float8 of ``variant``; ``scales [..., n/g]`` float32.
    """
    if group_size <= 0 or x.dim() == 0 or x.shape[-1] % group_size != 0:
        raise ValueError(
            f"quantize_fp8_per_group needs a positive group_size dividing the last dim, got "
            f"group_size {group_size} and shape {tuple(x.shape)}; pad the last dim"
        )
    n = x.shape[-1]
    groups = x.float().reshape(*x.shape[:-1], n // group_size, group_size)
    scales = fp8_scale(groups.abs().amax(dim=-1), variant, min_amax)
    q = quantize_fp8(groups, scales.unsqueeze(-1), variant)
    return q.reshape(x.shape), scales


def dequantize_fp8_per_group(
    q: torch.Tensor, scales: torch.Tensor, group_size: int
) -> torch.Tensor:
    """Inverse of ``quantize_fp8_per_group``.

    ``q [..., n]`` float8 and ``scales [..., n/g]`` float32 -> ``[..., n]`` float32.
    """
    if (
        group_size <= 0
        or q.dim() == 0
        or q.shape[:-1] != scales.shape[:-1]
        or q.shape[-1] != group_size * scales.shape[-1]
    ):
        raise ValueError(
            f"dequantize_fp8_per_group expects q [..., n] and scales [..., n/{group_size}] with "
            f"equal leading dims, got q {tuple(q.shape)} and scales {tuple(scales.shape)}"
        )
    groups = q.reshape(*q.shape[:-1], scales.shape[-1], group_size)
    return dequantize_fp8(groups, scales.unsqueeze(-1)).reshape(q.shape)


def quantize_fp8_per_row(
    x: torch.Tensor, variant: str = "e4m3fn", min_amax: float = PER_ROW_MIN_AMAX
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-row (per-token) quantization (§6.5).

    ``s[t] = max(amax_i |x[t, i]|, min_amax) / max``, ``q[t] = e4m3(clamp(x[t] / s[t]))``.

    Args:
        x: ``[..., n]`` (``[T, D]`` for activations) any float dtype.
        variant: ``"e4m3fn"`` or ``"e4m3fnuz"``.
        min_amax: floor on each row's amax (§6.5: 1e-12).

    Returns:
        ``(q, scales)``: ``q [..., n]`` float8 of ``variant``; ``scales [...]`` float32 (``[T]``),
        so ``x ~ dequantize_fp8(q, scales[..., None])``.
    """
    if x.dim() == 0:
        raise ValueError("quantize_fp8_per_row needs at least one dim, got a 0-dim tensor")
    if x.shape[-1] == 0:
        amax = torch.zeros(x.shape[:-1], device=x.device)
    else:
        amax = x.float().abs().amax(dim=-1)
    scales = fp8_scale(amax, variant, min_amax)
    return quantize_fp8(x, scales.unsqueeze(-1), variant), scales


def _check_variant(variant: str) -> None:
    if variant not in FP8_VARIANTS:
        raise ValueError(
            f"FP8 variant must be one of {FP8_VARIANTS}, got {variant!r}; use 'e4m3fn' on "
            f"gfx950/NVIDIA and 'e4m3fnuz' on gfx942"
        )
