"""stof: sparse transformers, fast on NVIDIA GPUs.

    import stof
    m = stof.Model.from_pretrained("my-modernbert/", batch=8, seq=512)
    y = m(input_ids, attention_mask=mask)    # numpy: the CPU reference; torch CUDA: the GPU
    m.tune(time_limit=60); m.save_plan("plan.json")

Masks and fused masked attention for PyTorch tensors:

    ctx = stof.Context()
    mask = stof.Mask.pattern("bigbird", q_len=4096)
    attn = ctx.attention(batch=16, heads=12, head_dim=64, q_len=4096, mask=mask)
    out = attn(qkv)          # qkv: [B, S, 3*H*D] fp16/bf16 CUDA tensor (packed Q, K, V)
    # sequences of different lengths: one plan made with padded=True, then
    out = attn(qkv, attention_mask=mask)            # padded, int32 [B, S]
    out = attn.varlen(qkv_rows, cu_seqlens)         # ragged: [rows, 3*H*D], int32 [B + 1]

The library is the one installed with this package, else $STOF_LIB, else a build folder of the
source tree. Kernels compile in parallel in helper processes when the `stof` command is found
(beside the library or on PATH; $STOF_COMPILE_WORKER names one, "0" turns that off).
"""
from ._attention import Attention, Context, DeviceInfo, Mask, default_scale  # noqa: F401
from ._lib import LIBRARY_PATH, StofError, _lib  # noqa: F401
from ._model import Model, TensorSpec  # noqa: F401

__version__ = _lib.stof_version().decode()
__commit__ = _lib.stof_build_commit().decode()
