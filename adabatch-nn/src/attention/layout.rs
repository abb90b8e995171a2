//! The shape of one packed attention, which its CPU and CUDA bodies read alike:
//! the heads-first layout and which keys a query may see.

/// Queries `[kv, b, g·t, d]` (the `g` query heads that share a key/value head
/// stacked along time), keys and values `[kv, b, t, d]`, document ids `[b, t]`.
/// A *pair* is one `(kv head, row)`: its `g·t` query rows read its `t` key rows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Geometry {
    pub(crate) kv: usize,
    pub(crate) b: usize,
    pub(crate) g: usize,
    pub(crate) t: usize,
    pub(crate) d: usize,
    /// The sliding window; `t` when there is none (then `i − j < t` always holds).
    pub(crate) window: usize,
    pub(crate) scale: f64,
}

/// The CUDA kernels (`adabatch_<kernel>_c<C>_<dtype>` of `kernels/attention.cu`):
/// the forward, then the backward's dq (and `D`), then its dk and dv.
#[cfg(any(feature = "cuda", test))]
pub(crate) const KERNELS: [&str; 3] = ["attention_fwd", "attention_dq", "attention_dkdv"];

/// The widest head the CUDA kernels take.
#[cfg(any(feature = "cuda", test))]
pub(crate) const MAX_HEAD_DIM: usize = 256;

impl Geometry {
    /// `(kv head, row)` pairs, pair `p` being kv head `p / b` of row `p % b`.
    pub(crate) fn pairs(&self) -> usize {
        self.kv * self.b
    }

    /// Query rows: `kv·b·g·t`.
    pub(crate) fn q_rows(&self) -> usize {
        self.pairs() * self.g * self.t
    }

    /// Elements of the queries (and of the output).
    pub(crate) fn q_len(&self) -> usize {
        self.q_rows() * self.d
    }

    /// Elements of the keys (and of the values).
    pub(crate) fn kv_len(&self) -> usize {
        self.pairs() * self.t * self.d
    }

    /// Column chunks of 32 a head takes in the CUDA kernels (`C` of
    /// `kernels/attention.cu`): a power of two, 8 for heads of up to 256.
    #[cfg(any(feature = "cuda", test))]
    pub(crate) fn chunks(&self) -> usize {
        self.d.div_ceil(32).next_power_of_two()
    }

    /// The keys query position `i` may see, before documents: `j ≤ i` within the
    /// window.
    pub(crate) fn keys_of(&self, i: usize) -> std::ops::Range<usize> {
        (i + 1).saturating_sub(self.window)..i + 1
    }
}
