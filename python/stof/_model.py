"""Whole models: a Hugging Face model directory or a Lua script, run on the CPU reference (numpy)
or on the GPU (torch CUDA tensors), tuned, saved and loaded as plans."""
import ctypes
import json
import os
import sys

from ._lib import StofError, _check, _lib

_DTYPES = {0: "fp32", 1: "fp16", 2: "bf16", 3: "int32"}


class _TensorInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * 128), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int),
                ("shape", ctypes.c_int64 * 8), ("optional", ctypes.c_int)]


def _gpu_ordinal(device):
    """None for "cpu"; the GPU's ordinal for "cuda", "cuda:N", N or a torch.device."""
    text = str(device)
    if text == "cpu":
        return None
    if text == "cuda":
        return 0
    if text.startswith("cuda:") and text[5:].isdigit():
        return int(text[5:])
    if isinstance(device, int) and device >= 0:
        return device
    raise StofError(f"device {device!r}: \"cpu\", \"cuda\", \"cuda:N\" or a GPU's number")


class _GenerateOptions(ctypes.Structure):
    _fields_ = [("max_new_tokens", ctypes.c_int), ("temperature", ctypes.c_float),
                ("top_k", ctypes.c_int), ("top_p", ctypes.c_float), ("seed", ctypes.c_uint64),
                ("stop_tokens", ctypes.c_void_p), ("n_stop_tokens", ctypes.c_int),
                ("use_eos", ctypes.c_int), ("recompute", ctypes.c_int),
                ("tune_step_s", ctypes.c_double)]


class _Weight(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_char_p), ("ndim", ctypes.c_int),
                ("shape", ctypes.c_int64 * 8), ("data", ctypes.c_void_p)]


class _TensorRef(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("data", ctypes.c_void_p)]


class _TuneOptions(ctypes.Structure):
    _fields_ = [("time_limit_s", ctypes.c_double), ("budget", ctypes.c_long),
                ("seed", ctypes.c_uint64), ("reps", ctypes.c_int), ("check", ctypes.c_int)]


_PROGRESS = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_long, ctypes.c_double,
                             ctypes.c_void_p)


class TensorSpec:
    """An input or the output: name, dtype ("int32", "fp16", ...), shape, optional."""

    def __init__(self, info):
        self.name = info.name.decode()
        self.dtype = _DTYPES.get(info.dtype, "?")
        self.shape = tuple(info.shape[i] for i in range(info.ndim))
        self.optional = bool(info.optional)

    def __repr__(self):
        opt = ", optional" if self.optional else ""
        return f"TensorSpec({self.name!r}, {self.dtype}, {list(self.shape)}{opt})"


def _param_list(params):
    items = []
    for key, value in params.items():
        if value is None:
            continue
        if isinstance(value, bool):
            value = "true" if value else "false"
        items.append(f"{key}={value}".encode())
    arr = (ctypes.c_char_p * max(1, len(items)))(*items)
    return arr, len(items)


def _is_torch(x):
    return type(x).__module__.startswith("torch")


def _as_array(x, what):
    """x (a torch tensor on any device, an array or nested lists) as a numpy array."""
    import numpy as np
    if _is_torch(x):
        x = x.detach().cpu().numpy()
    try:
        return np.asarray(x)
    except ValueError as e:  # ragged nested lists
        raise StofError(f"{what}: not a rectangular array ({e})") from None


def _prompt_rows(prompts, attention_mask):
    """Model.generate's prompts as lists of ints: a list of lists, one list, or a 1-D / 2-D
    array or tensor of token ids, each row cut to its tokens where attention_mask says so."""
    import numpy as np
    if attention_mask is None and not (_is_torch(prompts) or isinstance(prompts, np.ndarray)):
        if len(prompts) and isinstance(prompts[0], (int, np.integer)):
            return [prompts]
        return prompts
    ids = _as_array(prompts, "prompts")
    ids = ids[None, :] if ids.ndim == 1 else ids
    if ids.ndim != 2 or ids.dtype.kind not in "iu":
        raise StofError(f"prompts: [batch, seq] or [seq] integer token ids, got shape "
                        f"{list(ids.shape)} and dtype {ids.dtype}")
    if attention_mask is None:
        return ids.tolist()
    mask = _as_array(attention_mask, "attention_mask")
    mask = mask[None, :] if mask.ndim == 1 else mask
    if mask.shape != ids.shape:
        raise StofError(f"attention_mask: shape {list(mask.shape)}, expected the prompts' "
                        f"{list(ids.shape)}")
    if not np.isin(mask, (0, 1)).all():
        raise StofError("attention_mask: values other than 0 (padding) and 1 (token)")
    rows = []
    for b in range(ids.shape[0]):
        at = np.flatnonzero(mask[b])
        if at.size == 0:
            raise StofError(f"attention_mask: row {b} has no token")
        if at[-1] - at[0] + 1 != at.size:
            raise StofError(f"attention_mask: row {b}'s tokens are not one run (padding goes on "
                            f"the left or on the right)")
        rows.append(ids[b, at[0]:at[-1] + 1].tolist())
    return rows


class Model:
    """A model ready to run.

        m = stof.Model.from_pretrained("my-bert/", batch=8, seq=512)   # config.json + safetensors
        y = m(input_ids, attention_mask=mask)   # numpy in: CPU reference; torch CUDA in: the GPU
        m.tune(time_limit=60); m.save_plan("bert.plan.json")
        m2 = stof.Model.from_plan("bert.plan.json")

    Inputs are [batch, seq] token ids (int) and, for the encoders read from a directory, an
    optional attention_mask of the same shape (1 = token, 0 = padding; each row right-padded).
    The output has the model's (batch, seq, hidden) whatever the padding; it is zero at padded
    positions. On the GPU a padded batch runs padding-free: everything but the attention on its
    real tokens alone (STOF_PACK=0 in the environment keeps the padded pass). Other inputs go
    by name: token_type_ids (BERT's sentence pairs), global_attention_mask (Longformer's global
    tokens, 1 = global; from_pretrained(..., global=False) builds the model without them)."""

    def __init__(self, path, **params):
        arr, n = _param_list(params)
        h = ctypes.c_void_p()
        _check(_lib.stof_model_open(os.fsencode(path), arr, n, ctypes.byref(h)))
        self._h = h
        self.path = path
        self.params = {k: v for k, v in params.items() if v is not None}

    @classmethod
    def from_pretrained(cls, path, batch=8, seq=512, mask=None, dtype="fp16", weights=None,
                        **params):
        """A Hugging Face model directory (config.json and model.safetensors, or shards with
        their index), with its own weights; the sizes to run it at. mask: a sparse pattern
        for the attention (the model's own when None); other keys as `stof run --set`.
        weights: instead of the directory's (which may then have none): a live model (a
        torch module, e.g. transformers'), a dict of tensors or arrays, or a file."""
        model = cls(path, batch=batch, seq=seq, mask=mask, dtype=dtype, **params)
        if weights is not None:
            model.set_weights(weights)
        return model

    @classmethod
    def from_script(cls, path, **params):
        """A Lua model script (scripts/bert.lua, or one of yours) with its parameters."""
        return cls(path, **params)

    @classmethod
    def from_plan(cls, path, weights=None):
        """The model a plan (from `stof tune` or Model.save_plan) was made for, with the plan:
        its script or model directory and parameters. weights: a model directory or a
        safetensors file to take the weights from instead."""
        with open(path) as f:
            script = json.load(f).get("script", {})
        source = script.get("model_dir") or script.get("path")
        if not source:
            raise StofError(f"{path}: the plan names no model directory or script path")
        model = cls(source, **script.get("params", {}))
        if weights is not None:
            model.set_weights(weights)
        model.load_plan(path)
        return model

    # ---- what it takes and gives ----

    @property
    def inputs(self):
        out = []
        for i in range(_lib.stof_model_num_inputs(self._h)):
            info = _TensorInfo()
            _check(_lib.stof_model_input_info(self._h, i, ctypes.byref(info)))
            out.append(TensorSpec(info))
        return out

    @property
    def output(self):
        info = _TensorInfo()
        _check(_lib.stof_model_output_info(self._h, ctypes.byref(info)))
        return TensorSpec(info)

    @property
    def script(self):
        return _lib.stof_model_script(self._h).decode()

    def __repr__(self):
        ins = ", ".join(f"{t.name} {list(t.shape)}" for t in self.inputs)
        return f"stof.Model({self.path!r}: {ins} -> {list(self.output.shape)} {self.output.dtype})"

    # ---- weights, plans, tuning ----

    def set_weights(self, source):
        """Weights from a live model (a torch module: its state_dict), a dict of name ->
        tensor or array (float32, float16, bfloat16; names as the checkpoint's), a
        safetensors file, or a model directory's. Live tensors are read in place on the host
        (CUDA ones copied there once): no file is written."""
        if not isinstance(source, (str, bytes, os.PathLike)):
            self._set_weights_memory(source)
            return
        path = source
        if os.path.isdir(path):
            single = os.path.join(path, "model.safetensors")
            if not os.path.exists(single):
                raise StofError(f"{path}: weights from a directory are read from its "
                                "model.safetensors (open the directory itself for shards)")
            path = single
        _check(_lib.stof_model_set_weights(self._h, os.fsencode(path)))

    def _set_weights_memory(self, source):
        if hasattr(source, "state_dict"):
            source = source.state_dict()
        keep, entries = [], []
        for name, t in source.items():
            if _is_torch(t):
                import torch
                code = {torch.float32: b"F32", torch.float16: b"F16",
                        torch.bfloat16: b"BF16"}.get(t.dtype)
                if code is None:
                    continue  # integer buffers (position ids): not weights
                t = t.detach().to("cpu").contiguous()
                ptr, shape = t.data_ptr(), tuple(t.shape)
            else:
                import numpy as np
                a = np.asarray(t)
                code = {np.dtype(np.float32): b"F32", np.dtype(np.float16): b"F16"}.get(a.dtype)
                if code is None:
                    continue
                t = np.ascontiguousarray(a)
                ptr, shape = t.ctypes.data, t.shape
            if len(shape) > 8:
                raise StofError(f"weight '{name}' has {len(shape)} dims (at most 8)")
            keep.append(t)
            entries.append(_Weight(name.encode(), code, len(shape),
                                   (ctypes.c_int64 * 8)(*shape), ptr))
        arr = (_Weight * max(1, len(entries)))(*entries)
        _check(_lib.stof_model_set_weights_memory(self._h, arr, len(entries)))
        self._weights = keep  # read again by every run: kept alive with the model

    def load_plan(self, path):
        _check(_lib.stof_model_load_plan(self._h, os.fsencode(path)))

    def save_plan(self, path):
        _check(_lib.stof_model_save_plan(self._h, os.fsencode(path)))

    def tune(self, time_limit=60.0, device=0, progress=True, budget=0, seed=0, reps=0,
             check=None):
        """Searches fusion schemes and kernel settings on the GPU for up to time_limit
        seconds (as `stof tune`: budget, seed, reps; check True/False forces the end-to-end
        CPU check on or off); the plan is kept for the next runs (and save_plan). progress: a
        line that updates as it goes (on stderr), False for none, or a function(stage,
        measured, best_ms)."""
        if progress is True:
            def show(stage, measured, best_ms):
                best = f"{best_ms:.3f} ms" if best_ms > 0 else "-"
                sys.stderr.write(f"\rtuning: {stage:8s} {measured:6d} settings measured, "
                                 f"best forward {best}\033[K")
                sys.stderr.flush()
            fn = show
        else:
            fn = progress or None
        cb = _PROGRESS(lambda s, n, b, ud: fn(s.decode(), n, b)) if fn else _PROGRESS()
        try:
            opt = _TuneOptions(float(time_limit or 0), int(budget), int(seed), int(reps),
                               0 if check is None else (1 if check else -1))
            _check(_lib.stof_model_tune(self._h, device, ctypes.byref(opt), cb, None))
        finally:
            if progress is True:
                sys.stderr.write("\n")

    def generate(self, prompts, max_new_tokens=32, temperature=0.0, top_k=0, top_p=1.0,
                 seed=1, stop_tokens=(), use_eos=True, recompute=False, device="cpu",
                 tune_step=0.0, attention_mask=None):
        """Token ids generated after each prompt, as a list of lists (the new tokens only).
        prompts: a list of token id lists, one list, or a [batch, seq] (or [seq]) array or
        torch tensor, such as a tokenizer's input_ids; attention_mask (its shape, 1 = token,
        0 = padding, padded on the left or on the right) leaves each row's padding out of its
        prompt, so that prompts of different lengths run as they are (ragged, no pad token
        attended to). The prompts' prefill comes first, then a decode step a token against a
        KV cache (a sliding window keeps its window). Greedy when temperature is 0, else sampled
        (top_k, top_p) from seed, the same on every run. A sequence ends at one of stop_tokens
        or, with use_eos, at the model directory's eos_token_id. The model must output logits
        (a *ForCausalLM directory, or head=True). device: "cpu", the fp32 CPU reference, or
        "cuda" / "cuda:N" / N, a GPU (fp16 or bf16 models; a prefill pass fills the KV caches,
        then a decode step a token). recompute (CPU): no cache, the whole pass for every
        token. tune_step (GPU): seconds to tune the decode step first (the measurements are
        cached beside the kernel cache, so a second call is quick); 0: the decode step of the
        model's plan for this batch (`stof tune --decode-batch`, Model.from_plan) when it has
        one whose caches hold the prompts and new tokens, else its default scheme."""
        gpu = _gpu_ordinal(device)
        prompts = _prompt_rows(prompts, attention_mask)
        rows = [(ctypes.c_int32 * len(p))(*[int(t) for t in p]) for p in prompts]
        n = len(rows)
        if n == 0:
            raise StofError("generate needs at least one prompt")
        ptrs = (ctypes.POINTER(ctypes.c_int32) * n)(
            *[ctypes.cast(r, ctypes.POINTER(ctypes.c_int32)) for r in rows])
        lens = (ctypes.c_int * n)(*[len(p) for p in prompts])
        stops = (ctypes.c_int32 * max(1, len(stop_tokens)))(*[int(t) for t in stop_tokens])
        opt = _GenerateOptions(int(max_new_tokens), float(temperature), int(top_k),
                               float(top_p), int(seed), ctypes.cast(stops, ctypes.c_void_p),
                               len(stop_tokens), 1 if use_eos else 0, 1 if recompute else 0,
                               float(tune_step))
        out = (ctypes.c_int32 * (n * max(1, int(max_new_tokens))))()
        out_lens = (ctypes.c_int * n)()
        if gpu is None:
            _check(_lib.stof_model_generate_cpu(self._h, ptrs, lens, n, ctypes.byref(opt), out,
                                                out_lens))
        else:
            _check(_lib.stof_model_generate(self._h, gpu, ptrs, lens, n, ctypes.byref(opt), out,
                                            out_lens))
        return [list(out[b * max_new_tokens:b * max_new_tokens + out_lens[b]])
                for b in range(n)]

    def plan_offline(self, arch="sm_90"):
        """Without a GPU: a plan for arch (default settings, unmeasured, its kernels compiled
        into the cache), to save_plan and run or tune on that GPU later."""
        _check(_lib.stof_model_plan_offline(self._h, arch.encode()))

    def to(self, device=0):
        """Prepares the model on a GPU (kernels compiled, weights uploaded); the first GPU
        call does it on device 0 otherwise."""
        if not isinstance(device, int):  # "cuda:1", torch.device("cuda", 1)
            text = str(device)
            device = int(text.split(":")[1]) if ":" in text else 0
        _check(_lib.stof_model_to_device(self._h, device))
        self._device = device
        return self

    # ---- running ----

    def __call__(self, input_ids, attention_mask=None, **inputs):
        given = {"input_ids": input_ids, **inputs}
        if attention_mask is not None:
            given["attention_mask"] = attention_mask
        if any(_is_torch(v) and v.is_cuda for v in given.values()):
            return self._run_gpu(given)
        return self._run_cpu(given)

    def _specs(self, given):
        specs = {t.name: t for t in self.inputs}
        for name in given:
            if name not in specs:
                raise StofError(f"'{name}' is not an input of the model (its inputs: "
                                f"{', '.join(specs)})")
        for name, spec in specs.items():
            if name in given and tuple(given[name].shape) != spec.shape:
                raise StofError(f"input '{name}' has shape {list(given[name].shape)}, the "
                                f"model takes {list(spec.shape)} (its batch and seq)")
        return specs

    def _run_cpu(self, given):
        import numpy as np
        torch_out = any(_is_torch(v) for v in given.values())
        arrays = {k: _as_array(v, f"input '{k}'") for k, v in given.items()}
        specs = self._specs(arrays)
        keep, refs = [], []
        for name, a in arrays.items():
            want = np.int32 if specs[name].dtype == "int32" else np.float32
            a = np.ascontiguousarray(a, dtype=want)
            keep.append(a)
            refs.append(_TensorRef(name.encode(), a.ctypes.data))
        out = np.empty(self.output.shape, dtype=np.float32)
        arr = (_TensorRef * len(refs))(*refs)
        _check(_lib.stof_model_run_cpu(self._h, arr, len(refs),
                                       out.ctypes.data_as(ctypes.POINTER(ctypes.c_float))))
        if torch_out:
            import torch
            return torch.from_numpy(out)
        return out

    def _run_gpu(self, given):
        import torch
        specs = self._specs(given)
        device = next(v.device for v in given.values() if _is_torch(v) and v.is_cuda)
        if getattr(self, "_device", None) is None:
            if torch.cuda.is_current_stream_capturing():
                raise StofError("the model is not on the GPU yet and torch's stream is being "
                                "captured: call model.to(device) (or run it once) before the "
                                "capture")
            self.to(device.index or 0)  # the inputs' GPU
        keep, refs = [], []
        torch_dtypes = {"int32": torch.int32, "fp16": torch.float16, "bf16": torch.bfloat16}
        for name, t in given.items():
            want = torch_dtypes.get(specs[name].dtype)
            if want is None:
                raise StofError(f"input '{name}' is {specs[name].dtype}: the GPU runs fp16 or "
                                "bf16 models (give dtype='fp16' or 'bf16')")
            t = torch.as_tensor(t).to(device=device, dtype=want).contiguous()
            keep.append(t)
            refs.append(_TensorRef(name.encode(), t.data_ptr()))
        spec = self.output
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(spec.dtype)
        if dtype is None:
            raise StofError(f"the GPU runs fp16 or bf16 models, this one is {spec.dtype} "
                            "(give dtype='fp16' or 'bf16')")
        out = torch.empty(spec.shape, dtype=dtype, device=device)
        stream = torch.cuda.current_stream(device).cuda_stream
        arr = (_TensorRef * len(refs))(*refs)
        _check(_lib.stof_model_run(self._h, arr, len(refs), ctypes.c_void_p(out.data_ptr()),
                                   ctypes.c_void_p(stream)))
        return out

    def __del__(self):
        if getattr(self, "_h", None) and _lib:
            _lib.stof_model_free(self._h)
            self._h = None
