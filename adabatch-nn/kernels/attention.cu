// The packed attention's CUDA bodies (src/attention/mod.rs; src/attention/cuda.rs
// launches them): FlashAttention-2's forward and backward, the arithmetic of the
// CPU twin (src/attention/cpu.rs) in the same accumulation type (float for f32,
// f16 and bf16, double for f64).
//
// Layout: queries [kv, b, g·t, d] (the g query heads of a key/value head stacked
// along time), keys and values [kv, b, t, d], document ids [b, t] (int64). A
// pair is one (kv head, row of the batch): pair = kv_head·b + row; query head
// `head` = pair·g + h owns query rows head·t .. head·t + t. Query i attends key j
// iff j ≤ i, i − j < window and (with documents) ids[i] == ids[j].
//
// Tiles: a block of 4 warps owns a tile of rows (query rows for the forward and
// dq, key rows for dk and dv), R per warp (rows warp + 4·r), copied once into
// shared memory in the accumulation type, zero-padded to 32·C columns
// (C = 1, 2, 4, 8: heads of up to 256). It streams the other side 32 rows at a
// time, one per lane, through shared memory in chunks of 32 columns. A lane's
// score against each of its warp's rows is a register, and so are the online
// softmax's running max and sum (warp shuffles, no block barrier) and each
// lane's columns (lane + 32·c) of the rows it accumulates. A 32-row tile that no
// (row, lane) pair of the block may attend (after the query, before the window,
// another document) is skipped. No atomics: a key's dk and dv sum its queries in
// one fixed order (heads, then query rows), so results repeat from run to run.
//
// Every kernel has one signature: (q, k, v, o, dout, ids, lse, dsum, out, args);
// a kernel ignores what it does not read.

#include "common.cuh"

// The scalar arguments (`AttnArgs` in src/attention/cuda.rs, the same layout).
struct AttnArgs {
    double scale;
    int t, d, g, b;
    int pairs;
    int window;    // i − j < window; t where there is none
    int has_docs;  // whether `ids` holds document ids
    int chunks;    // C, as the entry point's name says
};

#define WARPS 4
#define THREADS (WARPS * 32)
#define CHUNK_STRIDE 33  // a chunk row's stride: lanes reading a column hit distinct banks

// Rows per warp: R for the forward and dq, R_KV for dk and dv (which accumulate
// two sets). A thread's accumulators (R·C) stay at most 16 floats or 8 doubles,
// and R at most 8, so that a thread needs no more than about 128 registers
// (ptxas -v) and a block's shared memory stays under 48 KiB. src/attention/cuda.rs
// mirrors this.
template <typename A, int C> struct Tile {
    static constexpr int PER_THREAD = sizeof(A) == 8 ? 8 : 16;
    static constexpr int R = PER_THREAD / C < 8 ? PER_THREAD / C : 8;
    static constexpr int R_KV = R / 2 > 1 ? R / 2 : 1;
};

// Rows 0..n of `src` (rows of d) into `tile` [rows][32·C], as A, zeros elsewhere.
template <typename T, typename A, int C>
__device__ void load_rows(A *tile, int rows, const T *src, int n, int d) {
    const int width = 32 * C;
    for (int e = threadIdx.x; e < rows * width; e += THREADS) {
        const int r = e / width, c = e % width;
        tile[e] = (r < n && c < d) ? to_acc(src[(size_t)r * d + c]) : A(0);
    }
}

// Columns 32·c .. 32·c + 32 of the 32 streamed rows `src` (n of them real) into
// `chunk` [32][CHUNK_STRIDE], zeros elsewhere; between barriers, so that every
// reader of the previous chunk is done and every writer of this one.
template <typename T, typename A>
__device__ void load_chunk(A *chunk, const T *src, int n, int d, int c) {
    __syncthreads();
    for (int e = threadIdx.x; e < 32 * 32; e += THREADS) {
        const int r = e >> 5, col = 32 * c + (e & 31);
        chunk[r * CHUNK_STRIDE + (e & 31)] =
            (r < n && col < d) ? to_acc(src[(size_t)r * d + col]) : A(0);
    }
    __syncthreads();
}

// s[r] = tile row (warp + 4r) · streamed row `lane`, for the 32 rows at `src`.
template <typename T, typename A, int C, int R>
__device__ void dots(A (&s)[R], const A *tile, A *chunk, const T *src, int n, int d) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int r = 0; r < R; ++r) {
        s[r] = A(0);
    }
#pragma unroll
    for (int c = 0; c < C; ++c) {
        load_chunk(chunk, src, n, d, c);
#pragma unroll 8
        for (int x = 0; x < 32; ++x) {
            const A y = chunk[lane * CHUNK_STRIDE + x];
#pragma unroll
            for (int r = 0; r < R; ++r) {
                s[r] += tile[(warp + WARPS * r) * 32 * C + 32 * c + x] * y;
            }
        }
    }
}

// acc[r][c] += Σ_j coef[row (warp + 4r)][j] · src[j][32c + lane] over the 32
// streamed rows j; `coef` [rows][32] holds each warp's own rows.
template <typename T, typename A, int C, int R>
__device__ void accumulate(A (&acc)[R][C], const A *coef, A *chunk, const T *src, int n, int d) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int c = 0; c < C; ++c) {
        load_chunk(chunk, src, n, d, c);
#pragma unroll 4
        for (int j = 0; j < 32; ++j) {
            const A y = chunk[j * CHUNK_STRIDE + lane];
#pragma unroll
            for (int r = 0; r < R; ++r) {
                acc[r][c] += coef[(warp + WARPS * r) * 32 + j] * y;
            }
        }
    }
}

// Whether query i may attend key j (both inside 0..t), with their documents.
__device__ __forceinline__ bool allowed(int i, int j, int64_t doc_i, int64_t doc_j,
                                        const AttnArgs &a) {
    return i < a.t && j < a.t && j <= i && i - j < a.window && (!a.has_docs || doc_i == doc_j);
}

// The document of position i of a row (`doc` that row's ids), 0 without documents.
__device__ __forceinline__ int64_t doc_of(const int64_t *doc, int i, const AttnArgs &a) {
    return a.has_docs && i < a.t ? doc[i] : 0;
}

// The forward: a block per (query head, tile of query rows), looping over the key
// tiles its rows may see; out = softmax(q·kᵀ·scale + mask)·v, lse = the rows'
// log-sum-exp of their scores.
template <typename T, int C>
__device__ void attention_fwd(const T *q, const T *k, const T *v, const T *, const T *,
                              const int64_t *ids, typename Acc<T>::type *lse,
                              typename Acc<T>::type *, T *out, const AttnArgs &a) {
    typedef typename Acc<T>::type A;
    constexpr int R = Tile<A, C>::R, ROWS = WARPS * R;
    __shared__ A queries[ROWS * 32 * C];
    __shared__ A chunk[32 * CHUNK_STRIDE];
    __shared__ A coef[ROWS * 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const size_t head = blockIdx.x, pair = head / a.g;
    const T *keys = k + pair * a.t * a.d, *values = v + pair * a.t * a.d;
    const int64_t *doc = ids + (a.has_docs ? (pair % a.b) * a.t : 0);
    const A scale = A(a.scale), neg_inf = A(-INFINITY);
    for (int i0 = blockIdx.y * ROWS; i0 < a.t; i0 += gridDim.y * ROWS) {
        const int n = min(ROWS, a.t - i0);
        const size_t first = head * a.t + i0;
        __syncthreads();
        load_rows<T, A, C>(queries, ROWS, q + first * a.d, n, a.d);
        int qi[R];
        int64_t qdoc[R];
        A m[R], l[R], o[R][C];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            qi[r] = i0 + warp + WARPS * r;
            qdoc[r] = doc_of(doc, qi[r], a);
            m[r] = neg_inf;
            l[r] = A(0);
#pragma unroll
            for (int c = 0; c < C; ++c) {
                o[r][c] = A(0);
            }
        }
        for (int j0 = max(0, i0 - a.window + 1); j0 < i0 + n; j0 += 32) {
            const int j = j0 + lane;
            const int64_t kdoc = doc_of(doc, j, a);
            bool mask[R];
            bool any = false;
#pragma unroll
            for (int r = 0; r < R; ++r) {
                mask[r] = allowed(qi[r], j, qdoc[r], kdoc, a);
                any |= mask[r];
            }
            if (!__syncthreads_or(any)) {
                continue;
            }
            const int keys_here = min(32, a.t - j0);
            A s[R];
            dots<T, A, C, R>(s, queries, chunk, keys + (size_t)j0 * a.d, keys_here, a.d);
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const A x = mask[r] ? s[r] * scale : neg_inf;
                const A m_new = max(m[r], warp_max(x));
                // Every key so far masked: nothing to rescale (o and l are 0).
                const A alpha = m_new == neg_inf ? A(1) : acc_exp(m[r] - m_new);
                const A p = mask[r] ? acc_exp(x - m_new) : A(0);
                l[r] = l[r] * alpha + warp_sum(p);
                m[r] = m_new;
#pragma unroll
                for (int c = 0; c < C; ++c) {
                    o[r][c] *= alpha;
                }
                coef[(warp + WARPS * r) * 32 + lane] = p;
            }
            accumulate<T, A, C, R>(o, coef, chunk, values + (size_t)j0 * a.d, keys_here, a.d);
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
            if (qi[r] >= a.t) {
                continue;
            }
            const size_t row = head * a.t + qi[r];
            const A inv = A(1) / l[r];
#pragma unroll
            for (int c = 0; c < C; ++c) {
                const int col = 32 * c + lane;
                if (col < a.d) {
                    out[row * a.d + col] = from_acc<T>(o[r][c] * inv);
                }
            }
            if (lane == 0) {
                lse[row] = m[r] + acc_log(l[r]);
            }
        }
    }
}

// dq = scale·dS·K with P = exp(s − lse), dS = P∘(dO·vᵀ − D): a block per (query
// head, tile of query rows), as the forward. It also leaves D = Σ dO·O of its
// rows in `dsum` for dk and dv (launched after it).
template <typename T, int C>
__device__ void attention_dq(const T *q, const T *k, const T *v, const T *o, const T *dout,
                             const int64_t *ids, typename Acc<T>::type *lse,
                             typename Acc<T>::type *dsum, T *dq, const AttnArgs &a) {
    typedef typename Acc<T>::type A;
    constexpr int R = Tile<A, C>::R, ROWS = WARPS * R;
    __shared__ A queries[ROWS * 32 * C];
    __shared__ A grads[ROWS * 32 * C];
    __shared__ A chunk[32 * CHUNK_STRIDE];
    __shared__ A coef[ROWS * 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const size_t head = blockIdx.x, pair = head / a.g;
    const T *keys = k + pair * a.t * a.d, *values = v + pair * a.t * a.d;
    const int64_t *doc = ids + (a.has_docs ? (pair % a.b) * a.t : 0);
    const A scale = A(a.scale);
    for (int i0 = blockIdx.y * ROWS; i0 < a.t; i0 += gridDim.y * ROWS) {
        const int n = min(ROWS, a.t - i0);
        const size_t first = head * a.t + i0;
        __syncthreads();
        load_rows<T, A, C>(queries, ROWS, q + first * a.d, n, a.d);
        load_rows<T, A, C>(grads, ROWS, dout + first * a.d, n, a.d);
        int qi[R];
        int64_t qdoc[R];
        A row_lse[R], delta[R], acc[R][C];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            qi[r] = i0 + warp + WARPS * r;
            qdoc[r] = doc_of(doc, qi[r], a);
            const size_t row = head * a.t + qi[r];
            A part = A(0);
            for (int col = lane; qi[r] < a.t && col < a.d; col += 32) {
                part += to_acc(dout[row * a.d + col]) * to_acc(o[row * a.d + col]);
            }
            delta[r] = warp_sum(part);
            row_lse[r] = qi[r] < a.t ? lse[row] : A(0);
            if (lane == 0 && qi[r] < a.t) {
                dsum[row] = delta[r];
            }
#pragma unroll
            for (int c = 0; c < C; ++c) {
                acc[r][c] = A(0);
            }
        }
        for (int j0 = max(0, i0 - a.window + 1); j0 < i0 + n; j0 += 32) {
            const int j = j0 + lane;
            const int64_t kdoc = doc_of(doc, j, a);
            bool mask[R];
            bool any = false;
#pragma unroll
            for (int r = 0; r < R; ++r) {
                mask[r] = allowed(qi[r], j, qdoc[r], kdoc, a);
                any |= mask[r];
            }
            if (!__syncthreads_or(any)) {
                continue;
            }
            const int keys_here = min(32, a.t - j0);
            A s[R], dp[R];
            dots<T, A, C, R>(s, queries, chunk, keys + (size_t)j0 * a.d, keys_here, a.d);
            dots<T, A, C, R>(dp, grads, chunk, values + (size_t)j0 * a.d, keys_here, a.d);
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const A p = mask[r] ? acc_exp(s[r] * scale - row_lse[r]) : A(0);
                coef[(warp + WARPS * r) * 32 + lane] = p * (dp[r] - delta[r]);
            }
            accumulate<T, A, C, R>(acc, coef, chunk, keys + (size_t)j0 * a.d, keys_here, a.d);
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
#pragma unroll
            for (int c = 0; c < C; ++c) {
                const int col = 32 * c + lane;
                if (qi[r] < a.t && col < a.d) {
                    dq[(head * a.t + qi[r]) * a.d + col] = from_acc<T>(scale * acc[r][c]);
                }
            }
        }
    }
}

// dk = scale·dSᵀ·Q and dv = Pᵀ·dO: a block per (pair, tile of key rows), looping
// over the g query heads in order and, in each, over the query tiles that may see
// its keys in order. `grads` is the backward's output [dq | dk | dv]; `dsum` holds
// D from attention_dq.
template <typename T, int C>
__device__ void attention_dkdv(const T *q, const T *k, const T *v, const T *, const T *dout,
                               const int64_t *ids, typename Acc<T>::type *lse,
                               typename Acc<T>::type *dsum, T *grads, const AttnArgs &a) {
    typedef typename Acc<T>::type A;
    constexpr int R = Tile<A, C>::R_KV, ROWS = WARPS * R;
    __shared__ A keys[ROWS * 32 * C];
    __shared__ A values[ROWS * 32 * C];
    __shared__ A chunk[32 * CHUNK_STRIDE];
    __shared__ A coef[ROWS * 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const size_t pair = blockIdx.x, kv_len = (size_t)a.pairs * a.t * a.d;
    const size_t q_len = kv_len * a.g, pair_at = pair * a.t * a.d;
    T *dk = grads + q_len + pair_at, *dv = grads + q_len + kv_len + pair_at;
    const int64_t *doc = ids + (a.has_docs ? (pair % a.b) * a.t : 0);
    const A scale = A(a.scale);
    for (int j0 = blockIdx.y * ROWS; j0 < a.t; j0 += gridDim.y * ROWS) {
        const int n = min(ROWS, a.t - j0);
        __syncthreads();
        load_rows<T, A, C>(keys, ROWS, k + pair_at + (size_t)j0 * a.d, n, a.d);
        load_rows<T, A, C>(values, ROWS, v + pair_at + (size_t)j0 * a.d, n, a.d);
        int kj[R];
        int64_t kdoc[R];
        A dk_acc[R][C], dv_acc[R][C];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            kj[r] = j0 + warp + WARPS * r;
            kdoc[r] = doc_of(doc, kj[r], a);
#pragma unroll
            for (int c = 0; c < C; ++c) {
                dk_acc[r][c] = A(0);
                dv_acc[r][c] = A(0);
            }
        }
        // The last query that may see a key of the tile.
        const long long last = min((long long)a.t - 1, (long long)j0 + n - 2 + a.window);
        for (int h = 0; h < a.g; ++h) {
            const size_t head = pair * a.g + h;
            const T *queries = q + head * a.t * a.d, *out_grads = dout + head * a.t * a.d;
            for (int i0 = j0; i0 <= last; i0 += 32) {
                const int i = i0 + lane;
                const int64_t qdoc = doc_of(doc, i, a);
                const A row_lse = i < a.t ? lse[head * a.t + i] : A(0);
                const A delta = i < a.t ? dsum[head * a.t + i] : A(0);
                bool mask[R];
                bool any = false;
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    mask[r] = allowed(i, kj[r], qdoc, kdoc[r], a);
                    any |= mask[r];
                }
                if (!__syncthreads_or(any)) {
                    continue;
                }
                const int queries_here = min(32, a.t - i0);
                const T *q_tile = queries + (size_t)i0 * a.d, *g_tile = out_grads + (size_t)i0 * a.d;
                A s[R], dp[R], ds[R];
                dots<T, A, C, R>(s, keys, chunk, q_tile, queries_here, a.d);
                dots<T, A, C, R>(dp, values, chunk, g_tile, queries_here, a.d);
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    const A p = mask[r] ? acc_exp(s[r] * scale - row_lse) : A(0);
                    ds[r] = p * (dp[r] - delta);
                    coef[(warp + WARPS * r) * 32 + lane] = p;
                }
                accumulate<T, A, C, R>(dv_acc, coef, chunk, g_tile, queries_here, a.d);
                // The warp's own rows of `coef`, read above, are rewritten.
                __syncwarp();
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    coef[(warp + WARPS * r) * 32 + lane] = ds[r];
                }
                accumulate<T, A, C, R>(dk_acc, coef, chunk, q_tile, queries_here, a.d);
            }
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
#pragma unroll
            for (int c = 0; c < C; ++c) {
                const int col = 32 * c + lane;
                if (kj[r] < a.t && col < a.d) {
                    const size_t at = (size_t)kj[r] * a.d + col;
                    dk[at] = from_acc<T>(scale * dk_acc[r][c]);
                    dv[at] = from_acc<T>(dv_acc[r][c]);
                }
            }
        }
    }
}

// The entry points: adabatch_<kernel>_c<C>_<dtype>, all of one signature.
#define ATTENTION_ENTRY(NAME, C, SUFFIX, T)                                                        \
    extern "C" __global__ void __launch_bounds__(THREADS) adabatch_##NAME##_c##C##_##SUFFIX(       \
        const T *q, const T *k, const T *v, const T *o, const T *dout, const int64_t *ids,        \
        Acc<T>::type *lse, Acc<T>::type *dsum, T *out, AttnArgs a) {                               \
        NAME<T, C>(q, k, v, o, dout, ids, lse, dsum, out, a);                                      \
    }

#define ATTENTION_WIDTHS(NAME, SUFFIX, T)                                                          \
    ATTENTION_ENTRY(NAME, 1, SUFFIX, T)                                                            \
    ATTENTION_ENTRY(NAME, 2, SUFFIX, T)                                                            \
    ATTENTION_ENTRY(NAME, 4, SUFFIX, T)                                                            \
    ATTENTION_ENTRY(NAME, 8, SUFFIX, T)

#define ATTENTION_KERNELS(T, SUFFIX)                                                               \
    ATTENTION_WIDTHS(attention_fwd, SUFFIX, T)                                                     \
    ATTENTION_WIDTHS(attention_dq, SUFFIX, T)                                                      \
    ATTENTION_WIDTHS(attention_dkdv, SUFFIX, T)

ATTENTION_KERNELS(float, f32)
ATTENTION_KERNELS(double, f64)
ATTENTION_KERNELS(__half, f16)
ATTENTION_KERNELS(__nv_bfloat16, bf16)
