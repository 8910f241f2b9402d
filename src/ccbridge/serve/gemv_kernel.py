"""The fused GEMV's Triton kernel (serve/gemv.py registers and launches it; its docstring says what it does).

A module of its own so that triton is imported only where the GPU path runs (serve/gemv.py imports this one on
first use), and so that the kernel's jit helpers are module globals, where Triton (and its interpreter) find a
callee.
"""

import triton
import triton.language as tl


@triton.jit
def x_step(X, R, NW, S, Y, ks, K, scale, pid, HAS_NORM: tl.constexpr, HAS_RES: tl.constexpr,
           SILU: tl.constexpr):
    """One K step of x' (fp32): X's values at ks, through the prologue; program 0 writes x + R's to S."""
    km = ks < K
    if SILU:
        g = tl.load(X + ks, mask=km, other=0.0).to(tl.float32)
        u = tl.load(X + K + ks, mask=km, other=0.0).to(tl.float32)
        g = (g / (1.0 + tl.exp(-g))).to(Y.dtype.element_ty).to(tl.float32)
        xk = (g * u).to(Y.dtype.element_ty).to(tl.float32)
    else:
        xk = tl.load(X + ks, mask=km, other=0.0).to(tl.float32)
        if HAS_RES:
            xs = (xk + tl.load(R + ks, mask=km, other=0.0).to(tl.float32)).to(Y.dtype.element_ty)
            if pid == 0:
                tl.store(S + ks, xs, mask=km)
            xk = xs.to(tl.float32)
        if HAS_NORM:
            nw = tl.load(NW + ks, mask=km, other=0.0).to(tl.float32)
            xk = (xk * scale * nw).to(Y.dtype.element_ty).to(tl.float32)
    return xk

@triton.jit
def w_step(W, rows, rmask, ks, K):
    """One K step of the program's weight rows."""
    return tl.load(W + rows[:, None] * K + ks[None, :], mask=rmask[:, None] & (ks < K)[None, :], other=0.0)

@triton.jit
def gemv_kernel(W, X, R, NW, B, Y, S, N, K, eps, HAS_NORM: tl.constexpr, HAS_RES: tl.constexpr,
                HAS_BIAS: tl.constexpr, SILU: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                PDL: tl.constexpr, GDC: tl.constexpr):
    """Y[n] = sum_k W[n, k] x[k] (+ B[n]); x: X (+ R, written to S by program 0) RMS-normalized times NW, or
    SiLU(X[:K]) * X[K:]. PDL: the first K step's weight tile read first, then (GDC: launched with PDL on a
    Hopper) the wait for the kernel before, which everything else (every read of X, R, NW, B; the writes to S
    and Y, whose memory that kernel may still read) follows; the weights no kernel writes."""
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N
    if PDL:
        w0 = w_step(W, rows, rmask, tl.arange(0, BLOCK_K), K)
        if GDC:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()  # the next kernel may launch; its own wait waits for this
    scale = 1.0
    if HAS_NORM:  # every program sums the squares of the whole x (K values, from L2): no kernel before it
        ss = tl.zeros([BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            xk = tl.load(X + ks, mask=ks < K, other=0.0).to(tl.float32)
            if HAS_RES:
                xk += tl.load(R + ks, mask=ks < K, other=0.0).to(tl.float32)
                xk = xk.to(Y.dtype.element_ty).to(tl.float32)
            ss += xk * xk
        scale = 1.0 / tl.sqrt(tl.sum(ss, 0) / K + eps)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    start = 0
    if PDL:  # the first step's sums, from the tile read before the wait
        xk = x_step(X, R, NW, S, Y, tl.arange(0, BLOCK_K), K, scale, pid, HAS_NORM, HAS_RES, SILU)
        acc += w0.to(tl.float32) * xk[None, :]
        start = BLOCK_K
    for k0 in range(start, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        xk = x_step(X, R, NW, S, Y, ks, K, scale, pid, HAS_NORM, HAS_RES, SILU)
        acc += w_step(W, rows, rmask, ks, K).to(tl.float32) * xk[None, :]
    y = tl.sum(acc, 1)
    if HAS_BIAS:
        y += tl.load(B + rows, mask=rmask, other=0.0).to(tl.float32)
    tl.store(Y + rows, y.to(Y.dtype.element_ty), mask=rmask)
