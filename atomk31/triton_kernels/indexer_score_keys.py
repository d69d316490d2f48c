"""indexer_score's key operand: the @triton.jit helpers that turn a tile of cached index keys
into the matrix product's operand, and the small pieces around that product.

Used by `indexer_score_kernel` (triton_kernels/indexer_score.py, which owns the numbers in its
docstring): MXFP4 keys dequantized to fp32 (`mxfp4_dequantize_keys`); e4m3fn keys converted,
or read from their bits as the value x 2^-120 per byte or per int32 word of 4 bytes
(`e4m3fn_bits_as_float`, `e4m3fn_words_as_float`, chosen by KEY_CONVERT in
`fp8_key_columns`); the tile product (`key_tile_product`), the query split for K_SPLIT 4
(`split_columns_in_4`) and the epilogue's weighted head sum (`weighted_head_sum`). On the
host, `key_words` views fp8 key pages as the int32 words KEY_CONVERT 2 reads.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def mxfp4_dequantize_keys(b_packed, b_scale_bytes, BLOCK_N: tl.constexpr):
    """[BLOCK_N, 64] uint8 E2M1 pairs + [BLOCK_N, 4] uint8 E8M0 -> [BLOCK_N, 128] fp32."""
    codes = tl.join(b_packed & 0xF, b_packed >> 4)  # [BLOCK_N, 64, 2]: the even value is low
    codes = tl.reshape(codes, (BLOCK_N, 4, 32)).to(tl.int32)
    index = codes & 7
    magnitude = tl.where(index < 4, index.to(tl.float32) * 0.5,
                         tl.where(index == 7, 6.0, (index - 2).to(tl.float32)))
    value = tl.where((codes & 8) != 0, -magnitude, magnitude)
    scale_byte = b_scale_bytes.to(tl.int32)
    scale_bits = tl.where(scale_byte == 0, 1 << 22, scale_byte << 23)
    scale_bits = tl.where(scale_byte == 255, 0x7FC00000, scale_bits)
    scale = scale_bits.to(tl.float32, bitcast=True)
    return tl.reshape(value * scale[:, :, None], (BLOCK_N, 128))


@triton.jit
def e4m3fn_bits_as_float(codes, DTYPE: tl.constexpr):
    """e4m3fn bytes (uint8) -> DTYPE (bf16 or fp32) values equal to the e4m3 value x 2^-120,
    exactly.

    The 7 exponent-mantissa bits move under DTYPE's exponent field (bf16: shift 4), the sign
    to the top bit: a normal code 2^(e-7)(1 + m/8) reads as 2^(e-127)(1 + m/8), a subnormal
    m 2^-9 as the subnormal m 2^-129. Two shifts, two masks and an or, no conversion
    instruction. NaN codes (0x7F, 0xFF) become finite: the cache holds none (saturating
    quantizer). fp32 is for the interpreter, whose bf16 -> fp32 loses bf16 subnormals."""
    if DTYPE == tl.float32:
        wide = codes.to(tl.uint32)
        return (((wide & 0x7F) << 20) | ((wide & 0x80) << 24)).to(tl.float32, bitcast=True)
    else:
        wide = codes.to(tl.uint16)
        return (((wide & 0x7F) << 4) | ((wide & 0x80) << 8)).to(tl.bfloat16, bitcast=True)


@triton.jit
def e4m3fn_words_as_float(words, DTYPE: tl.constexpr, BLOCK_N: tl.constexpr):
    """[BLOCK_N, 32] int32 words of 4 e4m3fn bytes -> [BLOCK_N, 128] DTYPE, the e4m3 values
    x 2^-120 in byte order (`e4m3fn_bits_as_float` on 4 bytes at once: 5 integer operations
    per word, 2 bf16 values per 32-bit result)."""
    words = words.to(tl.uint32, bitcast=True)
    even = ((words << 4) & 0x07F007F0) | ((words << 8) & 0x80008000)  # bytes 0, 2 as bf16
    odd = ((words >> 4) & 0x07F007F0) | (words & 0x80008000)  # bytes 1, 3
    if DTYPE == tl.float32:  # a bf16 in the top half of 32 bits is that value in fp32
        byte_0, byte_2 = even << 16, even & 0xFFFF0000
        byte_1, byte_3 = odd << 16, odd & 0xFFFF0000
    else:
        byte_0, byte_2 = (even & 0xFFFF).to(tl.uint16), (even >> 16).to(tl.uint16)
        byte_1, byte_3 = (odd & 0xFFFF).to(tl.uint16), (odd >> 16).to(tl.uint16)
    # join adds a last axis: [BLOCK_N, 32, 2 (byte // 2), 2 (byte % 2)] after the outer one
    values = tl.join(tl.join(byte_0, byte_2), tl.join(byte_1, byte_3))
    return tl.reshape(values, (BLOCK_N, 128)).to(DTYPE, bitcast=True)


@triton.jit
def weighted_head_sum(b_logits, b_weight, ROWS: tl.constexpr, HEADS_PAD: tl.constexpr,
                      BLOCK_N: tl.constexpr):
    """[BLOCK_N, ROWS * HEADS_PAD] logits -> [BLOCK_N, ROWS]: sum_h w_h relu(logit_h)."""
    b_logits = tl.maximum(b_logits, 0.0) * b_weight[None, :]
    return tl.sum(tl.reshape(b_logits, (BLOCK_N, ROWS, HEADS_PAD)), axis=2)


@triton.jit
def split_columns_in_4(x, R: tl.constexpr):
    """[R, 128] -> its four [R, 32] column groups, in order."""
    x = tl.reshape(tl.permute(tl.reshape(x, (R, 4, 32)), (0, 2, 1)), (R, 32, 2, 2))
    even_groups, odd_groups = tl.split(x)  # the last axis is group % 2
    group_0, group_2 = tl.split(even_groups)
    group_1, group_3 = tl.split(odd_groups)
    return group_0, group_1, group_2, group_3


@triton.jit
def key_tile_product(b_k, b_q_t, USE_FP8_DOT: tl.constexpr, FP8_ACC_INTERVAL: tl.constexpr):
    """[BLOCK_N, K] x [K, M] -> fp32. FP8_ACC_INTERVAL > 0 has Triton add the fp8 tensor
    cores' partial sums into fp32 registers every that many K (Hopper accumulates fp8
    products with ~14 bits in between)."""
    if USE_FP8_DOT and FP8_ACC_INTERVAL > 0:
        return tl.dot(b_k, b_q_t, max_num_imprecise_acc=FP8_ACC_INTERVAL)
    else:
        return tl.dot(b_k, b_q_t, input_precision="ieee")


@triton.jit
def fp8_key_columns(p_key, m_s, FIRST: tl.constexpr, o_columns, USE_FP8_DOT: tl.constexpr,
                    DOT_DTYPE: tl.constexpr, KEY_CONVERT: tl.constexpr):
    """Columns FIRST + o_columns of a tile of FP8 keys, as the product's operand. KEY_CONVERT
    0: fp8 -> DOT_DTYPE conversion; 1: p_key points to the bytes, 2: to int32 words of 4
    bytes (all 128 columns), and the operand is the keys x 2^-120 from their bits."""
    p_columns = p_key[:, None] + FIRST + o_columns[None, :]
    if KEY_CONVERT == 1:
        b_codes = tl.load(p_columns, mask=m_s[:, None], other=0)
        return e4m3fn_bits_as_float(b_codes, DOT_DTYPE)
    if KEY_CONVERT == 2:
        b_words = tl.load(p_key[:, None] + tl.arange(0, 32)[None, :], mask=m_s[:, None],
                          other=0)
        return e4m3fn_words_as_float(b_words, DOT_DTYPE, p_key.shape[0])
    b_k = tl.load(p_columns, mask=m_s[:, None], other=0.0)
    if USE_FP8_DOT:
        return b_k
    else:
        return b_k.to(DOT_DTYPE)


def _has_aligned_words(index_values: torch.Tensor) -> bool:
    """Whether the fp8 key rows start on 4-byte boundaries (key_words can view them)."""
    as_bytes = index_values.view(torch.uint8)
    return as_bytes.storage_offset() % 4 == 0 and all(s % 4 == 0 for s in as_bytes.stride()[:-1])


def key_words(index_values: torch.Tensor) -> torch.Tensor:
    """The fp8 key pages as int32 words of 4 keys' bytes, [num_blocks, block_size, 32]."""
    as_bytes = index_values.view(torch.uint8)
    if not _has_aligned_words(index_values):
        raise ValueError(f"key_convert 'words' needs 4-byte aligned key rows, got strides "
                         f"{as_bytes.stride()} at offset {as_bytes.storage_offset()}")
    return as_bytes.view(torch.int32)
