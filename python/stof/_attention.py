"""Masks and fused masked attention for PyTorch tensors (see the package's docstring)."""
import ctypes
import math

from ._lib import StofError, _check, _lib

_F16, _BF16 = 1, 2


class DeviceInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * 256), ("ordinal", ctypes.c_int),
                ("cc_major", ctypes.c_int), ("cc_minor", ctypes.c_int),
                ("sm_count", ctypes.c_int), ("smem_per_sm", ctypes.c_int),
                ("smem_per_block_optin", ctypes.c_int), ("max_warps_per_sm", ctypes.c_int),
                ("regs_per_sm", ctypes.c_int), ("l2_bytes", ctypes.c_int),
                ("total_mem", ctypes.c_size_t)]


class _AttentionDesc(ctypes.Structure):
    _fields_ = [("batch", ctypes.c_int), ("heads", ctypes.c_int), ("head_dim", ctypes.c_int),
                ("q_len", ctypes.c_int), ("k_len", ctypes.c_int), ("dtype", ctypes.c_int),
                ("causal", ctypes.c_int), ("scale", ctypes.c_float), ("mask", ctypes.c_void_p),
                ("relpos_buckets", ctypes.c_int), ("relpos_max_distance", ctypes.c_int),
                ("relpos_bidirectional", ctypes.c_int), ("kernel", ctypes.c_int),
                ("block_m", ctypes.c_int), ("block_n", ctypes.c_int),
                ("num_warps", ctypes.c_int), ("measure", ctypes.c_int),
                ("wgmma", ctypes.c_int), ("tma", ctypes.c_int), ("padded", ctypes.c_int),
                ("kv_heads", ctypes.c_int)]


class _AttentionIO(ctypes.Structure):
    _fields_ = [("q", ctypes.c_void_p), ("k", ctypes.c_void_p), ("v", ctypes.c_void_p),
                ("o", ctypes.c_void_p), ("q_stride", ctypes.c_int64 * 2),
                ("k_stride", ctypes.c_int64 * 2), ("v_stride", ctypes.c_int64 * 2),
                ("o_stride", ctypes.c_int64 * 2), ("relpos_table", ctypes.c_void_p),
                ("attention_mask", ctypes.c_void_p), ("seq_start", ctypes.c_void_p),
                ("rows", ctypes.c_int64)]


class Mask:
    """A mask from its text form ("bigbird", "sliding_window{band=64}", ...) or a dense array."""

    def __init__(self, handle):
        self._h = ctypes.c_void_p(handle)

    @classmethod
    def pattern(cls, text, q_len, k_len=None, batch=1):
        h = ctypes.c_void_p()
        _check(_lib.stof_mask_from_pattern(text.encode(), batch, q_len, k_len or q_len,
                                           ctypes.byref(h)))
        return cls(h.value)

    @classmethod
    def dense(cls, array):
        """array: [q_len, k_len] or [batch, q_len, k_len] of bool/uint8 (numpy or torch CPU)."""
        import numpy as np
        a = np.ascontiguousarray(np.asarray(array), dtype=np.uint8)
        if a.ndim == 2:
            a = a[None]
        h = ctypes.c_void_p()
        _check(_lib.stof_mask_from_dense(a.ctypes.data_as(ctypes.c_void_p), a.shape[0],
                                         a.shape[1], a.shape[2], ctypes.byref(h)))
        return cls(h.value)

    def shape(self):
        b, q, k = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        _lib.stof_mask_shape(self._h, ctypes.byref(b), ctypes.byref(q), ctypes.byref(k))
        return b.value, q.value, k.value

    def to_dense(self, b=0):
        import numpy as np
        _, q, k = self.shape()
        out = np.empty((q, k), dtype=np.uint8)
        _check(_lib.stof_mask_to_dense(self._h, b, out.ctypes.data_as(ctypes.c_void_p)))
        return out

    def density(self):
        return _lib.stof_mask_density(self._h)

    def __del__(self):
        if getattr(self, "_h", None) and _lib:
            _lib.stof_mask_free(self._h)
            self._h = None


class Context:
    def __init__(self, device=0):
        self._h = ctypes.c_void_p()
        _check(_lib.stof_ctx_create(device, ctypes.byref(self._h)))

    def device(self):
        info = DeviceInfo()
        _check(_lib.stof_ctx_device(self._h, ctypes.byref(info)))
        return info

    def attention(self, **kw):
        return Attention(self, **kw)

    def __del__(self):
        if getattr(self, "_h", None) and _lib:
            _lib.stof_ctx_free(self._h)
            self._h = None


_KERNELS = {None: -1, "auto": -1, "row": 0, "block": 1}


class Attention:
    """Fused masked multi-head attention planned for one shape."""

    def __init__(self, ctx, batch, heads, head_dim, q_len, k_len=None, dtype="fp16",
                 mask=None, causal=False, scale=0.0, relpos=None, kernel=None,
                 block_m=0, block_n=0, num_warps=0, measure=0, wgmma=None, tma=None,
                 padded=False, kv_heads=0):
        """padded: sequences of different lengths up to q_len, given with each run by an
        attention_mask or, in the ragged layout, seq_start (see run). kv_heads: grouped-query
        attention, K and V with this many heads (0: heads)."""
        d = _AttentionDesc()
        d.batch, d.heads, d.head_dim = batch, heads, head_dim
        d.q_len, d.k_len = q_len, k_len or q_len
        d.dtype = {"fp16": _F16, "bf16": _BF16}[dtype]
        d.causal, d.scale = int(causal), scale
        d.mask = mask._h.value if mask is not None else None
        if relpos:
            d.relpos_buckets = relpos.get("buckets", 32)
            d.relpos_max_distance = relpos.get("max_distance", 128)
            d.relpos_bidirectional = int(relpos.get("bidirectional", True))
        d.kernel = _KERNELS[kernel]
        d.block_m, d.block_n, d.num_warps = block_m, block_n, num_warps
        # > 0: time the analytical choice, that many of Eq. 2's best settings (+ a few) at plan
        # time, and remember the fastest; 0: a remembered measured choice, else the analytical
        # one (the calibrated cost model; Eq. 1, 2 without costs for the GPU); -1: analytical
        # only
        d.measure = measure
        # the Hopper (warpgroup MMA) build: True, False (mma.sync) or None (automatic)
        d.wgmma = 0 if wgmma is None else (1 if wgmma else -1)
        # K, V tiles by the tensor memory accelerator (sm_90+): True, False (cp.async) or
        # None (automatic)
        d.tma = 0 if tma is None else (1 if tma else -1)
        d.padded, d.kv_heads = int(padded), kv_heads
        self.desc, self._ctx, self._mask = d, ctx, mask
        self._h = ctypes.c_void_p()
        _check(_lib.stof_attention_plan(ctx._h, ctypes.byref(d), ctypes.byref(self._h)))

    def describe(self):
        buf = ctypes.create_string_buffer(512)
        _check(_lib.stof_attention_describe(self._h, buf, len(buf)))
        return buf.value.decode()

    def _lengths(self, name, t, shape):
        """The device address of an int32 tensor of this shape (a padded plan's lengths)."""
        if not self.desc.padded:
            raise StofError(f"{name}: this attention was planned without padded=True")
        if (not t.is_cuda or str(t.dtype) != "torch.int32" or not t.is_contiguous() or
                tuple(t.shape) != shape):
            raise StofError(f"{name}: a contiguous int32 CUDA tensor of shape {shape} was "
                            f"expected, not {str(t.dtype)} {tuple(t.shape)}")
        return t.data_ptr()

    def _io(self, q, k, v, out, relpos_table, attention_mask=None, seq_start=None):
        io = _AttentionIO()
        ragged = seq_start is not None
        for name, t in (("q", q), ("k", k), ("v", v), ("o", out)):
            if t.stride(-1) != 1:
                raise StofError(f"{name}: the last dimension must be contiguous")
            if ragged and t.dim() != 2:
                raise StofError(f"{name}: the ragged layout takes [rows, columns] tensors, "
                                f"not {tuple(t.shape)}")
            setattr(io, name, t.data_ptr())
            getattr(io, f"{name}_stride")[0] = 0 if ragged else t.stride(0)
            getattr(io, f"{name}_stride")[1] = t.stride(0) if ragged else t.stride(1)
        io.relpos_table = relpos_table.data_ptr() if relpos_table is not None else None
        d = self.desc
        if attention_mask is not None:
            io.attention_mask = self._lengths("attention_mask", attention_mask,
                                              (d.batch, d.q_len))
        if ragged:
            io.seq_start = self._lengths("seq_start", seq_start, (d.batch + 1,))
            io.rows = q.shape[0]
        return io

    def run(self, q, k, v, out, relpos_table=None, stream=None, attention_mask=None,
            seq_start=None):
        """q, k, v, out: CUDA tensors [B, S, ...] whose head h sits at columns h*D..h*D+D-1
        of each row (views into a packed QKV tensor work: only the last dim must be dense).
        A padded plan takes attention_mask (int32 [B, S], 1 = token, right padding: padded
        rows of out are zeros) or, in the ragged layout, seq_start (int32 [B + 1], as
        FlashAttention's cu_seqlens) with q, k, v, out [rows, ...]: sequence b is rows
        seq_start[b] .. seq_start[b + 1] - 1, and rows outside every sequence are not written."""
        io = self._io(q, k, v, out, relpos_table, attention_mask, seq_start)
        if stream is None:
            import torch
            stream = torch.cuda.current_stream()
        _check(_lib.stof_attention_run(self._h, ctypes.byref(io),
                                       ctypes.c_void_p(stream.cuda_stream)))
        return out

    def _split(self, qkv):
        """Q, K and V of a packed projection output [..., (H + 2 KVH) D]."""
        d = self.desc
        hd, kvd = d.heads * d.head_dim, (d.kv_heads or d.heads) * d.head_dim
        return qkv[..., :hd], qkv[..., hd:hd + kvd], qkv[..., hd + kvd:]

    def bind(self, qkv, out, stream=None):
        """A launcher with the pointers and strides of (qkv, out) fixed: each call costs one
        C call, for loops that run the same buffers many times (benchmarks, CUDA graphs)."""
        io = self._io(*self._split(qkv), out, None)
        if stream is None:
            import torch
            stream = torch.cuda.current_stream()
        handle, ref, s = self._h, ctypes.byref(io), ctypes.c_void_p(stream.cuda_stream)
        run = _lib.stof_attention_run

        def launch():
            rc = run(handle, ref, s)
            if rc:
                _check(rc)
            return out

        launch.keep = (io, qkv, out)  # the struct and tensors must outlive the launcher
        return launch

    def __call__(self, qkv, out=None, attention_mask=None):
        """qkv: [B, S, (H + 2 KVH) D] packed projection output -> [B, S, H*D]."""
        d = self.desc
        if out is None:
            import torch
            out = torch.empty(qkv.shape[0], qkv.shape[1], d.heads * d.head_dim,
                              dtype=qkv.dtype, device=qkv.device)
        return self.run(*self._split(qkv), out, attention_mask=attention_mask)

    def varlen(self, qkv, seq_start, out=None):
        """The ragged layout: qkv [rows, (H + 2 KVH) D], sequences one after another as
        seq_start (int32 [B + 1], cu_seqlens) says -> out [rows, H*D] (zeros where no sequence
        is, when out is made here)."""
        if out is None:
            import torch
            out = torch.zeros(qkv.shape[0], self.desc.heads * self.desc.head_dim,
                              dtype=qkv.dtype, device=qkv.device)
        return self.run(*self._split(qkv), out, seq_start=seq_start)

    def __del__(self):
        if getattr(self, "_h", None) and _lib:
            _lib.stof_attention_free(self._h)
            self._h = None


def default_scale(head_dim):
    return 1.0 / math.sqrt(head_dim)
