"""A decode step's weight GEMV as one Triton kernel, with what comes before it in its prologue (issue 31).

Where the steps replay as CUDA graphs on a Hopper or later GPU, with a triton that has it, each fused GEMV is launched
with Programmatic Dependent Launch (the TP bench with --graphs and bench/tp_step.py ask for it: pdl_from_env(dev,
graphs=True); CCBRIDGE_GEMV_PDL=0 turns it off; =1 forces the PDL layout everywhere, without the wait where the GPU or
triton has none; launches_pdl() says where it is launched so): it may start while the kernel
ahead of it drains, reads its first weight tile, then waits for that kernel (griddepcontrol.wait) before any read of
x, the residual, the norm's weight or the bias and before any write (the graph may give y or s memory that kernel
still reads), and lets the next kernel launch. The op is then opaque to torch.compile (inductor launches a traced
triton_op's kernel by its own launcher, which drops launch_pdl), and CUDA graphs capture the PDL launch as a
programmatic edge. Measured (bench/RESULTS.md, 2026-11-27, one H200, `bench/tp_step.py --tp 4 --variants fused
fused-pdl` and the order swapped): a llama-8b TP4 rank's step 2.09-2.11 ms with PDL, 2.22-2.44 without; the same
bits. PDL off: the same op, launch and arithmetic as before it.

At batch 1 a tensor-parallel rank's decode step is a chain of matrix-vector products over its weight shards. cuBLAS
runs each as a split-K GEMM plus a reduce kernel, with the residual add and RMSNorm (or SiLU x up) a kernel of its
own before it: bench/tp_step.py found one llama-8b TP4 rank's step at 2.41x its HBM roofline, 532 kernels, the
GEMVs at 65% of the copy rate. Here one kernel per GEMV: each program reads BLOCK_N rows of the weight across K
once; the RMSNorm (of x plus the residual, which program 0 also writes back as the new residual stream) or SiLU x up
is computed in the prologue from x, which every program reads from L2. bench/gemv.py times it against the engine's
compiled prologue + cuBLAS over a grid of tiles, each weight read from HBM as in a step (one H200, llama-8b
TP4 shapes: a layer's four 52.3 us by cuBLAS, 39.5 us fused at the best tiles; the TP4 step 2.48x -> 1.96x its
roofline in bench/tp_step.py).

The rounding follows eager torch's ops, each rounding its output to the model's dtype: the residual sum before the
norm reads it, the norm once after its weight (as F.rms_norm), SiLU(gate) and then its product with up, the GEMV's
sums (fp32) once with the bias added (as addmm). Registered as a torch custom op (torch.library.triton_op) so
that torch.compile traces it inside the engine's compiled halves and CUDA graphs capture it. Needs triton (the GPU
machines have it with torch); on a CPU it runs under Triton's interpreter (TRITON_INTERPRET=1, the tests).

The tile (rows a program, K a step, warps) is shape- and GPU-dependent (at llama-8b's TP1 and TP4 shapes on one
H200 the best of a wider grid took 4-39% less time than rule()'s, and another H200 preferred others): the engine
times a few candidates per shape on its own GPU when it builds and caches the choice (serve/gemv_tune.py;
CCBRIDGE_GEMV_TUNE=0 keeps rule()'s tiles).
"""

from __future__ import annotations

import functools
import os

import torch

from ccbridge.errors import GpuError, UsageError

EPS = 1e-5  # the engine's RMS_EPS


TUNED: dict[tuple[int, int], tuple[int, int, int]] = {}  # (n, k) -> a measured tile (bench/tp_step.py --tiles)
ENV = "CCBRIDGE_GEMV_PDL"  # unset: PDL where the GPU runs griddepcontrol; 0 off; 1 the PDL layout everywhere
# Whether gemv() launches with PDL: None until prepare() takes it from ENV; the benches set it to compare
PDL: bool | None = None


def rule(n: int, k: int) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, warps) for an (n, k) weight by a fixed rule: bench/gemv.py's fastest tiles with HBM-cold
    weights at llama-8b's TP4 shapes on an H200 (qkv 1536x4096 4/512/4, o 4096x1024 2/512/4, gate-up 7168x4096
    8/512/4, down 4096x3584 8/512/8) over a grid of BLOCK_K <= 512: 512-wide K steps, and programs narrow enough to
    keep several on every SM streaming (2 or 4 rows a program where rows are few or short). The engine measures
    its own shapes' tiles instead (serve/gemv_tune.py) and falls back to this one."""
    bk = 512 if k >= 512 else 128
    bn = 2 if k < 2048 else 4 if n < 4096 else 8
    warps = 4
    return bn, bk, warps


def tile(n: int, k: int) -> tuple[int, int, int]:
    """The tile gemv() takes where its caller names none: TUNED's (measured tiles, an override) first, else the
    rule's."""
    return TUNED.get((n, k)) or rule(n, k)


def pdl_from_env(dev: torch.device | None = None, graphs: bool = False) -> bool:
    """CCBRIDGE_GEMV_PDL: 0 off, 1 on (the PDL layout even where the GPU has no griddepcontrol: the same bits),
    unset or empty on where the steps replay as CUDA graphs (graphs) and a kernel on dev can be launched with PDL
    (launches_pdl(): a Hopper or later GPU and a triton that has it; no device: off). Not by default outside
    graphs: there the PDL op (a custom op, opaque to torch.compile) costs each call a dispatcher and Python launch
    that inductor's launcher does not, which a host-bound eager step would pay 4 times a layer. Anything else a
    UsageError."""
    v = os.environ.get(ENV, "").strip()
    if v not in ("", "0", "1"):
        raise UsageError(f"{ENV}={v!r}: 0 (off), 1 (on) or unset (on in CUDA graphs where the GPU has PDL)")
    return graphs and launches_pdl(dev) if v == "" and dev is not None else v == "1"


def launches_pdl(dev: torch.device) -> bool:
    """Whether the PDL layout on dev is launched with PDL and waits by griddepcontrol: dev runs it (hopper()) and
    this triton emits it (tl.extra.cuda.gdc_wait and launch_pdl: an older triton has neither, and a kernel calling
    gdc_wait would not compile). Elsewhere the PDL layout is launched plainly."""
    if not hopper(dev):
        return False
    import triton.language.extra.cuda as tl_cuda  # deferred: triton (its import costs start-up only GPUs need)
    return hasattr(tl_cuda, "gdc_wait") and hasattr(tl_cuda, "gdc_launch_dependents")


def prepare(dev: torch.device | None = None) -> None:
    """Registers the kernel's custom ops (torch.ops.ccbridge.gemv and .gemv_pdl) once, and takes PDL from the
    environment (for dev's GPU) where nothing set it. On first use: importing triton costs start-up that only the
    GPU path needs, and a machine without triton gets a clear error, not an ImportError at import. Call it before
    torch.compile traces gemv() (the engine does, when it builds): the trace reads PDL, not the environment."""
    global PDL
    if PDL is None:
        PDL = pdl_from_env(dev)
    register()


@functools.cache
def register() -> None:
    """prepare()'s registering, once."""
    try:  # triton is imported by the kernel's module; its import costs start-up that only the GPU path needs
        from ccbridge.serve.gemv_kernel import gemv_kernel  # deferred: triton
    except ImportError as e:  # pragma: no cover - the message is the point
        raise GpuError("the fused GEMV needs triton (installed with torch on a GPU machine)") from e

    @torch.library.triton_op("ccbridge::gemv", mutates_args=())
    def _gemv(w: torch.Tensor, x: torch.Tensor, res: torch.Tensor | None, norm_w: torch.Tensor | None,
              bias: torch.Tensor | None, silu: bool, bn: int, bk: int,
              warps: int) -> tuple[torch.Tensor, torch.Tensor]:
        return launch(torch.library.wrap_triton(gemv_kernel), w, x, res, norm_w, bias, silu, bn, bk, warps, False)

    # Opaque to torch.compile (a custom_op, not a triton_op): inductor launches a traced triton_op's kernel by its
    # own launcher, which drops launch_pdl; this op launches the kernel itself, as CUDA graphs then capture it.
    @torch.library.custom_op("ccbridge::gemv_pdl", mutates_args=())
    def _gemv_pdl(w: torch.Tensor, x: torch.Tensor, res: torch.Tensor | None, norm_w: torch.Tensor | None,
                  bias: torch.Tensor | None, silu: bool, bn: int, bk: int,
                  warps: int) -> tuple[torch.Tensor, torch.Tensor]:
        return launch(gemv_kernel, w, x, res, norm_w, bias, silu, bn, bk, warps, True)

    _gemv.register_fake(fake_gemv)
    _gemv_pdl.register_fake(fake_gemv)


def launch(run, w, x, res, norm_w, bias, silu, bn, bk, warps, pdl):
    """y, s by the kernel as run launches it (wrap_triton's, or the kernel itself), PDL's layout or not."""
    n, k = w.shape
    y = torch.empty(n, device=w.device, dtype=w.dtype)
    s = torch.empty(k if res is not None else 0, device=w.device, dtype=w.dtype)
    gdc = pdl and launches_pdl(w.device)  # griddepcontrol: sm_90 on; the interpreter (a CPU) has no such op
    run[(-(-n // bn),)](
        w, x, x if res is None else res, x if norm_w is None else norm_w, x if bias is None else bias, y,
        s if res is not None else y, n, k, EPS, HAS_NORM=norm_w is not None, HAS_RES=res is not None,
        HAS_BIAS=bias is not None, SILU=silu, BLOCK_N=bn, BLOCK_K=bk, PDL=pdl, GDC=gdc, num_warps=warps,
        **({"launch_pdl": True} if gdc else {}))
    return y, s


def fake_gemv(w, x, res, norm_w, bias, silu, bn, bk, warps):  # the shapes alone, for torch.compile's tracing
    return w.new_empty(w.shape[0]), w.new_empty(w.shape[1] if res is not None else 0)


@functools.cache
def hopper(dev: torch.device) -> bool:
    """Whether dev runs griddepcontrol (PDL's wait and trigger): a CUDA GPU of compute capability 9 on."""
    dev = torch.device(dev)
    return dev.type == "cuda" and torch.cuda.get_device_capability(dev)[0] >= 9


def available() -> bool:
    """Whether this machine can run the fused GEMV: triton importable, and a torch with triton_op (2.6 on)."""
    try:
        import triton  # noqa: F401 - deferred: triton's import is the check
    except ImportError:
        return False
    return hasattr(torch.library, "triton_op")


def gemv(w: torch.Tensor, x: torch.Tensor, res: torch.Tensor | None = None, norm_w: torch.Tensor | None = None,
         bias: torch.Tensor | None = None, silu: bool = False,
         tile_nkw: tuple[int, int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One sequence's y = w @ x' (+ bias), w (N, K) row-major and contiguous; x' is x (K values, any shape) as it
    is, or rms_norm(x + res) * norm_w (res optional), or silu(x[:K]) * x[K:] for x of 2K values; every vector of
    w's dtype and device. Returns y (N,) and, where res is given, x + res (K,) (the new residual stream), else
    None. With PDL (PDL, launches_pdl()) w's first tile is read before the wait for the kernel ahead of it: w must
    not be written by that kernel (the engine's weights are written by none of a step's)."""
    n, k = w.shape
    if silu and (norm_w is not None or res is not None):
        raise UsageError("the fused GEMV's prologue is a norm or SiLU x up, not both")
    if res is not None and norm_w is None:
        raise UsageError("the fused GEMV adds a residual only before its norm: res needs norm_w")
    flat = lambda t: None if t is None else t.reshape(-1).contiguous()  # noqa: E731
    x, res, norm_w, bias = flat(x), flat(res), flat(norm_w), flat(bias)
    sizes = {"x": (x, 2 * k if silu else k), "res": (res, k), "norm_w": (norm_w, k), "bias": (bias, n)}
    for name, (t, want) in sizes.items():
        if t is not None and (t.numel() != want or t.dtype != w.dtype or t.device != w.device):
            raise UsageError(f"fused GEMV: weight {tuple(w.shape)} {w.dtype} takes {name} of {want} values of its "
                             f"dtype on {w.device}, not {t.numel()} {t.dtype} on {t.device}")
    if not w.is_contiguous() or n * k >= 2 ** 31:
        raise UsageError(f"fused GEMV: weight {tuple(w.shape)} must be contiguous (it is: {w.is_contiguous()}) and "
                         "under 2^31 values (int32 offsets)")
    bn, bk, warps = tile_nkw or tile(n, k)
    if any(v < 1 or v & (v - 1) for v in (bn, bk, warps)):
        raise UsageError(f"fused GEMV: tile {bn}/{bk}/{warps}: each a power of 2")
    if not torch.compiler.is_compiling():
        prepare(w.device)
    op = torch.ops.ccbridge.gemv_pdl if PDL else torch.ops.ccbridge.gemv
    y, s = op(w, x, res, norm_w, bias, silu, bn, bk, warps)
    return y, (s if res is not None else None)
