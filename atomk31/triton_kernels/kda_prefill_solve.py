"""KDA chunked prefill, stage 1a's shared pieces: the blockwise solve of ``(I + L)^-1`` over its
[16, 16] tiles, the score products, and the stage's output buffers (kda_prefill_scores_wide.py
uses them).

The solve: 16x16 diagonal inverses by the exact nilpotent series (A^16 = 0 for a strictly
lower-triangular 16x16 tile), then block forward substitution, in IEEE fp32 or (an option for
16-bit inputs, as fla's solve_tril) TF32. L goes to the inverse buffer first and the program
reads its ten [16, 16] tiles back (``solve_stored_l``: a barrier between, other threads wrote
them), so the inverse may overwrite L in place.
"""

import torch
import triton
import triton.language as tl

from atomk31.triton_kernels.kda_prefill_intra import CHUNK_SIZE


@triton.jit
def _unit_lower_inverse(b_a, BC: tl.constexpr, PRECISION: tl.constexpr):
    """(I + A)^-1 for a strictly lower-triangular [BC, BC] tile with BC = 16: A^16 = 0, so
    (I - A)(I + A^2)(I + A^4)(I + A^8) is the exact inverse."""
    o_c = tl.arange(0, BC)
    b_p = (o_c[:, None] == o_c[None, :]).to(tl.float32) - b_a
    b_power = tl.dot(b_a, b_a, input_precision=PRECISION)
    b_p = b_p + tl.dot(b_p, b_power, input_precision=PRECISION)
    b_power = tl.dot(b_power, b_power, input_precision=PRECISION)
    b_p = b_p + tl.dot(b_p, b_power, input_precision=PRECISION)
    b_power = tl.dot(b_power, b_power, input_precision=PRECISION)
    return b_p + tl.dot(b_p, b_power, input_precision=PRECISION)


@triton.jit
def _dot(b_a, b_b, PRECISION: tl.constexpr):
    return tl.dot(b_a, b_b, input_precision=PRECISION)


@triton.jit
def _store_tile(out_ptr, base, i_i: tl.constexpr, i_j: tl.constexpr, b_tile, BT: tl.constexpr,
                BC: tl.constexpr):
    o_c = tl.arange(0, BC)
    p_tile = (base * BT + i_i * BC + o_c)[:, None] * BT + (i_j * BC + o_c)[None, :]
    tl.store(out_ptr + p_tile, b_tile.to(out_ptr.dtype.element_ty))


@triton.jit
def _solve_and_store(inverse_ptr, base, a00, a10, a11, a20, a21, a22, a30, a31, a32, a33,
                     BT: tl.constexpr, BC: tl.constexpr, pr: tl.constexpr):
    """(I + L)^-1: 16x16 diagonal inverses, then block forward substitution
    P_ij = -P_ii Σ_{j<=m<i} L_im P_mj, products in precision pr."""
    p00 = _unit_lower_inverse(a00, BC, pr)
    p11 = _unit_lower_inverse(a11, BC, pr)
    p22 = _unit_lower_inverse(a22, BC, pr)
    p33 = _unit_lower_inverse(a33, BC, pr)
    p10 = -_dot(p11, _dot(a10, p00, pr), pr)
    p21 = -_dot(p22, _dot(a21, p11, pr), pr)
    p20 = -_dot(p22, _dot(a20, p00, pr) + _dot(a21, p10, pr), pr)
    p32 = -_dot(p33, _dot(a32, p22, pr), pr)
    p31 = -_dot(p33, _dot(a31, p11, pr) + _dot(a32, p21, pr), pr)
    p30 = -_dot(p33, _dot(a30, p00, pr) + _dot(a31, p10, pr) + _dot(a32, p20, pr), pr)
    _store_tile(inverse_ptr, base, 0, 0, p00, BT, BC)
    _store_tile(inverse_ptr, base, 1, 0, p10, BT, BC)
    _store_tile(inverse_ptr, base, 1, 1, p11, BT, BC)
    _store_tile(inverse_ptr, base, 2, 0, p20, BT, BC)
    _store_tile(inverse_ptr, base, 2, 1, p21, BT, BC)
    _store_tile(inverse_ptr, base, 2, 2, p22, BT, BC)
    _store_tile(inverse_ptr, base, 3, 0, p30, BT, BC)
    _store_tile(inverse_ptr, base, 3, 1, p31, BT, BC)
    _store_tile(inverse_ptr, base, 3, 2, p32, BT, BC)
    _store_tile(inverse_ptr, base, 3, 3, p33, BT, BC)


@triton.jit
def score_product(b_left, b_right_t, b_acc, BF16_SCORES: tl.constexpr,
                   DOT_PRECISION: tl.constexpr):
    if BF16_SCORES:
        return tl.dot(b_left.to(tl.bfloat16), b_right_t.to(tl.bfloat16), b_acc)
    return tl.dot(b_left, b_right_t, b_acc, input_precision=DOT_PRECISION)


@triton.jit
def _tile(p_matrix, i_i: tl.constexpr, i_j: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    o_c = tl.arange(0, BC)
    return tl.load(p_matrix + (i_i * BC + o_c)[:, None] * BT + (i_j * BC + o_c)[None, :])


@triton.jit
def solve_stored_l(l_ptr, inverse_ptr, base, BT: tl.constexpr, BC: tl.constexpr,
                   SOLVE_PRECISION: tl.constexpr):
    """L's [16, 16] tiles back from l_ptr (written by other threads of this program), then
    solved into inverse_ptr: every tile is read before the second barrier, so the inverse may
    overwrite L in place."""
    tl.debug_barrier()
    p_l = l_ptr + base * BT * BT
    t00, t10, t11 = _tile(p_l, 0, 0, BT, BC), _tile(p_l, 1, 0, BT, BC), _tile(p_l, 1, 1, BT, BC)
    t20, t21, t22 = _tile(p_l, 2, 0, BT, BC), _tile(p_l, 2, 1, BT, BC), _tile(p_l, 2, 2, BT, BC)
    t30, t31 = _tile(p_l, 3, 0, BT, BC), _tile(p_l, 3, 1, BT, BC)
    t32, t33 = _tile(p_l, 3, 2, BT, BC), _tile(p_l, 3, 3, BT, BC)
    tl.debug_barrier()
    _solve_and_store(inverse_ptr, base, t00, t10, t11, t20, t21, t22, t30, t31, t32, t33,
                     BT, BC, SOLVE_PRECISION)


def empty_scores(q: torch.Tensor, num_chunks: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Stage 1a's outputs for ``num_chunks`` chunks of q's heads: aqk and inverse in ``dtype``,
    the norms in fp32 (one chunk's worth when there are none, so the pointers are valid)."""
    rows = (max(num_chunks, 1), q.shape[1], CHUNK_SIZE)
    out = {name: torch.empty(*rows, CHUNK_SIZE, dtype=dtype, device=q.device)
           for name in ("aqk", "inverse")}
    out.update({name: torch.empty(rows, dtype=torch.float32, device=q.device)
                for name in ("inv_norm_q", "inv_norm_k")})
    return out
