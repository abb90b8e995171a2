// The CUDA bodies of adabatch-nn's fused row-wise ops (src/ops/rows.rs launches them).
//
// Each op is the arithmetic of its CPU twin (src/ops/norm.rs, src/ops/softmax.rs), in the
// same accumulation type: float for f32, f16 and bf16 inputs, double for f64. One
// block runs one row of the last dimension, its threads striding over the row and
// summing through warp shuffles. Backward ops that also return the parameters'
// gradients (summed over rows) first write each row's statistics to `stats`, then
// a second kernel sums every column over the rows in row order: no atomics, so a
// step's gradients are the same from run to run.
//
// Every kernel takes (in0, in1, in2, out, stats, RowArgs) so that the launcher is
// one function; an op ignores what it does not use. An index input (the
// cross-entropy's targets) is int64.

#include "common.cuh"

// The scalar arguments of every kernel (`RowArgs` in src/cuda/launch.rs, the same layout).
struct RowArgs {
    int rows;        // rows the launch covers (blocks of the row pass)
    int n;           // their length
    float eps;       // the norms' epsilon
    int has_ignore;  // the cross-entropy: whether `ignore` is an ignored target
    long long ignore;
    int h, t;        // the ropes: heads and positions of x
    int flags;       // the ropes: ROPE_* below
    int x_rows;      // the ropes' table backward: the rows of x (`rows` counts the table's)
};

// The ropes' layout and direction.
#define ROPE_INTERLEAVED 1  // pairs (2i, 2i + 1), else (i, i + d/2)
#define ROPE_THD 2          // x is [b, t, h, d], else [b, h, t, d]
#define ROPE_BATCHED 4      // one table per sequence, [b, t, d/2], else [t, d/2]
#define ROPE_NEGATE 8       // rotate the other way: the backward for x

// The sum (or maximum) of every thread's `v`, returned to all threads of the block.
// `shared` holds 32 slots; the leading barrier lets a block reduce twice in a row.
template <typename A, bool MAX> __device__ A block_reduce(A v, A *shared) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int warps = (blockDim.x + 31) >> 5;
    v = MAX ? warp_max(v) : warp_sum(v);
    __syncthreads();
    if (lane == 0) {
        shared[warp] = v;
    }
    __syncthreads();
    if (warp == 0) {
        v = lane < warps ? shared[lane] : (MAX ? shared[0] : A(0));
        v = MAX ? warp_max(v) : warp_sum(v);
        if (lane == 0) {
            shared[0] = v;
        }
    }
    __syncthreads();
    return shared[0];
}

template <typename A> __device__ A block_sum(A v, A *shared) {
    return block_reduce<A, false>(v, shared);
}

template <typename A> __device__ A block_max(A v, A *shared) {
    return block_reduce<A, true>(v, shared);
}

// y = x / rms(x) · alpha, the rms rounded to T first as candle-nn does.
template <typename T>
__device__ void rms_norm(const T *x, const T *alpha, T *y, int n, float eps) {
    typedef typename Acc<T>::type A;
    __shared__ A shared[32];
    const T *row = x + (size_t)blockIdx.x * n;
    T *out = y + (size_t)blockIdx.x * n;
    A sum2 = 0;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const A v = to_acc(row[j]);
        sum2 += v * v;
    }
    sum2 = block_sum(sum2, shared);
    const A m = to_acc(from_acc<T>(acc_sqrt(sum2 / A(n) + A(eps))));
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        out[j] = from_acc<T>(to_acc(row[j]) / m * to_acc(alpha[j]));
    }
}

// dx = r·(g·alpha − x·r²·Σ(g·alpha·x)/n), r = 1/sqrt(mean(x²) + eps); r per row
// into `stats` for the column sums.
template <typename T>
__device__ void rms_norm_bwd(const T *g, const T *x, const T *alpha, T *dx,
                             typename Acc<T>::type *stats, int n, float eps) {
    typedef typename Acc<T>::type A;
    __shared__ A shared[32];
    const size_t offset = (size_t)blockIdx.x * n;
    A sum2 = 0, dot = 0;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const A xv = to_acc(x[offset + j]);
        sum2 += xv * xv;
        dot += to_acc(g[offset + j]) * to_acc(alpha[j]) * xv;
    }
    sum2 = block_sum(sum2, shared);
    dot = block_sum(dot, shared);
    const A r = A(1) / acc_sqrt(sum2 / A(n) + A(eps));
    const A c = r * r * dot / A(n);
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const A gv = to_acc(g[offset + j]), xv = to_acc(x[offset + j]);
        dx[offset + j] = from_acc<T>(r * (gv * to_acc(alpha[j]) - xv * c));
    }
    if (threadIdx.x == 0) {
        stats[blockIdx.x] = r;
    }
}

// dalpha[j] = Σ_rows g·x·r, one thread per column, rows in order.
template <typename T>
__device__ void rms_norm_bwd_cols(const T *g, const T *x, T *dalpha,
                                  const typename Acc<T>::type *stats, int rows, int n) {
    typedef typename Acc<T>::type A;
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n) {
        return;
    }
    A sum = 0;
    for (int row = 0; row < rows; ++row) {
        const size_t at = (size_t)row * n + j;
        sum += to_acc(g[at]) * to_acc(x[at]) * stats[row];
    }
    dalpha[j] = from_acc<T>(sum);
}

// y = (x − mean)·inv_std·alpha + beta, with candle-nn's one-pass variance.
template <typename T>
__device__ void layer_norm(const T *x, const T *alpha, const T *beta, T *y, int n, float eps) {
    typedef typename Acc<T>::type A;
    __shared__ A shared[32];
    const size_t offset = (size_t)blockIdx.x * n;
    A sum = 0, sum2 = 0;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const A v = to_acc(x[offset + j]);
        sum += v;
        sum2 += v * v;
    }
    sum = block_sum(sum, shared);
    sum2 = block_sum(sum2, shared);
    const A mean = sum / A(n);
    const A inv_std = A(1) / acc_sqrt(sum2 / A(n) - mean * mean + A(eps));
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const A v = (to_acc(x[offset + j]) - mean) * inv_std;
        y[offset + j] = from_acc<T>(v * to_acc(alpha[j]) + to_acc(beta[j]));
    }
}

// dx = inv_std·(g·alpha − mean(g·alpha) − x̂·mean(g·alpha·x̂)), the variance from
// the deviations (two passes); mean and inv_std per row into `stats`.
template <typename T>
__device__ void layer_norm_bwd(const T *g, const T *x, const T *alpha, T *dx,
                               typename Acc<T>::type *stats, int n, float eps) {
    typedef typename Acc<T>::type A;
    __shared__ A shared[32];
    const size_t offset = (size_t)blockIdx.x * n;
    A sum = 0;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        sum += to_acc(x[offset + j]);
    }
    const A mean = block_sum(sum, shared) / A(n);
    A sum2 = 0;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const A d = to_acc(x[offset + j]) - mean;
        sum2 += d * d;
    }
    const A inv_std = A(1) / acc_sqrt(block_sum(sum2, shared) / A(n) + A(eps));
    A sum_ga = 0, sum_gax = 0;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const A ga = to_acc(g[offset + j]) * to_acc(alpha[j]);
        sum_ga += ga;
        sum_gax += ga * (to_acc(x[offset + j]) - mean) * inv_std;
    }
    const A mean_ga = block_sum(sum_ga, shared) / A(n);
    const A mean_gax = block_sum(sum_gax, shared) / A(n);
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const A xhat = (to_acc(x[offset + j]) - mean) * inv_std;
        const A gv = to_acc(g[offset + j]);
        dx[offset + j] = from_acc<T>(inv_std * (gv * to_acc(alpha[j]) - mean_ga - xhat * mean_gax));
    }
    if (threadIdx.x == 0) {
        stats[2 * blockIdx.x] = mean;
        stats[2 * blockIdx.x + 1] = inv_std;
    }
}

// dalpha[j] = Σ_rows g·x̂ and dbeta[j] = Σ_rows g, rows in order.
template <typename T>
__device__ void layer_norm_bwd_cols(const T *g, const T *x, T *dparams,
                                    const typename Acc<T>::type *stats, int rows, int n) {
    typedef typename Acc<T>::type A;
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n) {
        return;
    }
    A dalpha = 0, dbeta = 0;
    for (int row = 0; row < rows; ++row) {
        const size_t at = (size_t)row * n + j;
        const A gv = to_acc(g[at]);
        dalpha += gv * (to_acc(x[at]) - stats[2 * row]) * stats[2 * row + 1];
        dbeta += gv;
    }
    dparams[j] = from_acc<T>(dalpha);
    dparams[n + j] = from_acc<T>(dbeta);
}

// The row's maximum and Σ exp(x − max), to every thread of the block.
template <typename T, typename A>
__device__ void max_and_sum_exp(const T *row, int n, A *shared, A &max, A &sum) {
    max = to_acc(row[0]);
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const A v = to_acc(row[j]);
        max = v > max ? v : max;
    }
    max = block_max(max, shared);
    sum = 0;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        sum += acc_exp(to_acc(row[j]) - max);
    }
    sum = block_sum(sum, shared);
}

// y = exp(x − max) / Σ exp(x − max).
template <typename T> __device__ void softmax(const T *x, T *y, int n) {
    typedef typename Acc<T>::type A;
    __shared__ A shared[32];
    const size_t offset = (size_t)blockIdx.x * n;
    A max, sum;
    max_and_sum_exp(x + offset, n, shared, max, sum);
    const A inv = A(1) / sum;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        y[offset + j] = from_acc<T>(acc_exp(to_acc(x[offset + j]) - max) * inv);
    }
}

// dx = y·(g − Σ g·y).
template <typename T> __device__ void softmax_bwd(const T *g, const T *y, T *dx, int n) {
    typedef typename Acc<T>::type A;
    __shared__ A shared[32];
    const size_t offset = (size_t)blockIdx.x * n;
    A dot = 0;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        dot += to_acc(g[offset + j]) * to_acc(y[offset + j]);
    }
    dot = block_sum(dot, shared);
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const A yv = to_acc(y[offset + j]);
        dx[offset + j] = from_acc<T>(yv * (to_acc(g[offset + j]) - dot));
    }
}

// loss = logsumexp(x) − x[target] per row; 0 where the target is the ignored
// index; NaN where it lies outside 0..n (the CPU twin's error, found without
// reading the targets back to the host: the engine stops on the non-finite loss).
template <typename T>
__device__ void cross_entropy(const T *x, const int64_t *targets, T *loss, int n,
                              long long ignore, int has_ignore) {
    typedef typename Acc<T>::type A;
    __shared__ A shared[32];
    const size_t offset = (size_t)blockIdx.x * n;
    const int64_t target = targets[blockIdx.x];
    // The whole block takes the same branch: no barrier is left waiting.
    if (has_ignore && target == ignore) {
        if (threadIdx.x == 0) {
            loss[blockIdx.x] = from_acc<T>(A(0));
        }
        return;
    }
    if (target < 0 || target >= n) {
        if (threadIdx.x == 0) {
            loss[blockIdx.x] = from_acc<T>(acc_nan<A>());
        }
        return;
    }
    A max, sum;
    max_and_sum_exp(x + offset, n, shared, max, sum);
    if (threadIdx.x == 0) {
        loss[blockIdx.x] = from_acc<T>(max + acc_log(sum) - to_acc(x[offset + target]));
    }
}

// dx = g·(softmax(x) − onehot(target)), the softmax as exp(x − lse) with
// lse = loss + x[target]; `losses_and_grads` holds the rows' losses, then their
// upstream gradients. Ignored rows get zeros, out-of-range ones NaN.
template <typename T>
__device__ void cross_entropy_bwd(const T *x, const T *losses_and_grads, const int64_t *targets,
                                  T *dx, int rows, int n, long long ignore, int has_ignore) {
    typedef typename Acc<T>::type A;
    const size_t offset = (size_t)blockIdx.x * n;
    const int64_t target = targets[blockIdx.x];
    const bool ignored = has_ignore && target == ignore;
    const bool outside = !ignored && (target < 0 || target >= n);
    if (ignored || outside) {
        const T fill = from_acc<T>(ignored ? A(0) : acc_nan<A>());
        for (int j = threadIdx.x; j < n; j += blockDim.x) {
            dx[offset + j] = fill;
        }
        return;
    }
    const A lse = to_acc(losses_and_grads[blockIdx.x]) + to_acc(x[offset + target]);
    const A g = to_acc(losses_and_grads[rows + blockIdx.x]);
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const A p = acc_exp(to_acc(x[offset + j]) - lse);
        dx[offset + j] = from_acc<T>(g * p - (j == target ? g : A(0)));
    }
}

// The table row (of d/2 angles) of x's row `row`.
__device__ __forceinline__ size_t rope_table_row(size_t row, const RowArgs &a) {
    const size_t h = a.h, t = a.t;
    const size_t b_i = row / (h * t);
    const size_t t_i = (a.flags & ROPE_THD) ? (row / h) % t : row % t;
    return (a.flags & ROPE_BATCHED) ? b_i * t + t_i : t_i;
}

// y = x rotated by the row's angles, pairs (x1, x2) -> (x1·c − x2·s, x1·s + x2·c).
template <typename T>
__device__ void rope(const T *x, const T *cos, const T *sin, T *y, const RowArgs &a) {
    typedef typename Acc<T>::type A;
    const int half = a.n / 2;
    const size_t offset = (size_t)blockIdx.x * a.n;
    const size_t table = rope_table_row(blockIdx.x, a) * half;
    const bool interleaved = a.flags & ROPE_INTERLEAVED;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const int i1 = interleaved ? 2 * i : i, i2 = interleaved ? 2 * i + 1 : i + half;
        const A x1 = to_acc(x[offset + i1]), x2 = to_acc(x[offset + i2]);
        const A c = to_acc(cos[table + i]);
        const A s = (a.flags & ROPE_NEGATE) ? -to_acc(sin[table + i]) : to_acc(sin[table + i]);
        y[offset + i1] = from_acc<T>(x1 * c - x2 * s);
        y[offset + i2] = from_acc<T>(x1 * s + x2 * c);
    }
}

// The tables' gradients: a block per table row, a thread per angle, summing over
// the rows of x that use it in a fixed order. Out: [2, table rows, d/2], dcos
// then dsin. `a.rows` is the table's rows here, `a.n` x's row length.
template <typename T>
__device__ void rope_table_bwd(const T *g, const T *x, T *out, const RowArgs &a) {
    typedef typename Acc<T>::type A;
    const int half = a.n / 2;
    const size_t h = a.h, t = a.t, tr = blockIdx.x;
    const size_t batches = (size_t)a.x_rows / (h * t);
    const bool interleaved = a.flags & ROPE_INTERLEAVED, thd = a.flags & ROPE_THD;
    const size_t first_b = (a.flags & ROPE_BATCHED) ? tr / t : 0;
    const size_t last_b = (a.flags & ROPE_BATCHED) ? first_b + 1 : batches;
    const size_t t_i = (a.flags & ROPE_BATCHED) ? tr % t : tr;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const int i1 = interleaved ? 2 * i : i, i2 = interleaved ? 2 * i + 1 : i + half;
        A dc = 0, ds = 0;
        for (size_t b_i = first_b; b_i < last_b; ++b_i) {
            for (size_t h_i = 0; h_i < h; ++h_i) {
                const size_t row = thd ? (b_i * t + t_i) * h + h_i : (b_i * h + h_i) * t + t_i;
                const size_t at = row * a.n;
                const A g1 = to_acc(g[at + i1]), g2 = to_acc(g[at + i2]);
                const A x1 = to_acc(x[at + i1]), x2 = to_acc(x[at + i2]);
                dc += g1 * x1 + g2 * x2;
                ds += g2 * x1 - g1 * x2;
            }
        }
        out[tr * half + i] = from_acc<T>(dc);
        out[((size_t)a.rows + tr) * half + i] = from_acc<T>(ds);
    }
}

// The entry points, one per op and dtype, all of one signature:
// (in0, in1, in2, out, stats, args).
#define ENTRY(NAME, SUFFIX, T, BODY)                                                               \
    extern "C" __global__ void adabatch_##NAME##_##SUFFIX(const T *in0, const T *in1,              \
                                                          const T *in2, T *out,                    \
                                                          Acc<T>::type *stats, RowArgs a) {        \
        BODY;                                                                                      \
    }

#define ROW_KERNELS(T, SUFFIX)                                                                     \
    ENTRY(rms_norm, SUFFIX, T, rms_norm<T>(in0, in1, out, a.n, a.eps))                             \
    ENTRY(rms_norm_bwd, SUFFIX, T, rms_norm_bwd<T>(in0, in1, in2, out, stats, a.n, a.eps))         \
    ENTRY(rms_norm_bwd_cols, SUFFIX, T,                                                            \
          rms_norm_bwd_cols<T>(in0, in1, out + (size_t)a.rows * a.n, stats, a.rows, a.n))          \
    ENTRY(layer_norm, SUFFIX, T, layer_norm<T>(in0, in1, in2, out, a.n, a.eps))                    \
    ENTRY(layer_norm_bwd, SUFFIX, T, layer_norm_bwd<T>(in0, in1, in2, out, stats, a.n, a.eps))     \
    ENTRY(layer_norm_bwd_cols, SUFFIX, T,                                                          \
          layer_norm_bwd_cols<T>(in0, in1, out + (size_t)a.rows * a.n, stats, a.rows, a.n))        \
    ENTRY(softmax, SUFFIX, T, softmax<T>(in0, out, a.n))                                           \
    ENTRY(softmax_bwd, SUFFIX, T, softmax_bwd<T>(in0, in1, out, a.n))                              \
    ENTRY(cross_entropy, SUFFIX, T,                                                                \
          cross_entropy<T>(in0, (const int64_t *)in1, out, a.n, a.ignore, a.has_ignore))           \
    ENTRY(cross_entropy_bwd, SUFFIX, T,                                                            \
          cross_entropy_bwd<T>(in0, in1, (const int64_t *)in2, out, a.rows, a.n, a.ignore,         \
                               a.has_ignore))                                                      \
    ENTRY(rope, SUFFIX, T, rope<T>(in0, in1, in2, out, a))                                         \
    ENTRY(rope_table_bwd, SUFFIX, T, rope_table_bwd<T>(in0, in1, out, a))

ROW_KERNELS(float, f32)
ROW_KERNELS(double, f64)
ROW_KERNELS(__half, f16)
ROW_KERNELS(__nv_bfloat16, bf16)
