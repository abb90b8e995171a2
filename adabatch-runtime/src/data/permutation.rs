//! Seeded permutations of `0..N` in constant memory: a keyed bijection evaluated
//! position by position, so no rank ever materialises an epoch's order.
//!
//! # Construction
//!
//! [`Permutation`] is a Feistel network over `k = ceil(log2 N)` bits (the next
//! power of two `M >= N`) followed by *cycle-walking* back into `0..N`:
//!
//! - A value `x < M` is split into a high part `L` of `a` bits and a low part `R`
//!   of `b = k - a` bits (`a = ceil(k / 2)`; the halves are unbalanced when `k` is
//!   odd). One round maps `(L, R)` to `(R, L xor F_i(R))`, the new high part having
//!   `b` bits and the new low part `a` bits, so the widths alternate. Each round is
//!   a bijection of `0..M` whatever `F_i` is, hence so is the whole network.
//! - There are [`ROUNDS`] rounds. `F_i(R)` is the SplitMix64 finaliser (the
//!   murmur3-style `fmix64` with Stafford's constants) of `R xor key_i`, truncated
//!   to the width of the part it is xored into. The round keys come from the same
//!   finaliser applied to `(seed, source, epoch, i)`, so each `(seed, source,
//!   epoch)` gives an independent-looking permutation.
//! - Cycle-walking: the network is a permutation `P` of `0..M`, `M < 2N`. The
//!   image of position `p < N` is the first value of `P(p), P(P(p)), ...` that
//!   lies below `N`. The result is a permutation of `0..N` (walks from different
//!   positions never meet, because `P` is injective).
//!
//! # Cost
//!
//! Memory is a handful of words, whatever `N` is. One network evaluation is
//! [`ROUNDS`] rounds of a few multiplications. Cycle-walking needs more than one
//! evaluation only when it lands in `N..M`. Over all `N` positions the walks
//! together visit every value of `0..M` exactly once (each value in `N..M` lies on
//! exactly one walk), so the **average** number of evaluations per position is
//! exactly `M / N`, which is below 2 because `M < 2N` (1 when `N` is a power of
//! two). A single position may walk longer; the longest walk is bounded by
//! `M - N + 1` but for a pseudo-random `P` is short (the chance of needing more
//! than `j` evaluations is about `((M - N) / M)^j < 2^-j`).
//!
//! Without shuffling the permutation is the identity ([`Permutation::identity`]).

/// Feistel rounds per evaluation.
pub const ROUNDS: usize = 6;

/// The SplitMix64 finaliser: a bijection of `u64` with full avalanche.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// A seeded permutation of `0..len`, evaluated one position at a time in O(1)
/// memory (see the [module documentation](self) for the construction and cost).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Permutation {
    len: u64,
    /// `k`: bits of the power-of-two domain (0 when `len <= 1`).
    bits: u32,
    /// Bits of the high part before the first round.
    high_bits: u32,
    keys: [u64; ROUNDS],
    identity: bool,
}

impl Permutation {
    /// The permutation of `0..len` keyed by `(seed, source, epoch)`
    /// (`len <= 2^63`).
    pub fn new(len: usize, seed: u64, source: u64, epoch: u64) -> Self {
        let len = len as u64;
        let bits = if len <= 1 {
            0
        } else {
            u64::BITS - (len - 1).leading_zeros()
        };
        let mut h = mix64(seed ^ GOLDEN);
        for part in [source, epoch] {
            h = mix64(h ^ mix64(part.wrapping_add(GOLDEN)));
        }
        let mut keys = [0; ROUNDS];
        for (i, key) in keys.iter_mut().enumerate() {
            *key = mix64(h.wrapping_add(GOLDEN.wrapping_mul(i as u64 + 1)));
        }
        Self {
            len,
            bits,
            high_bits: bits.div_ceil(2),
            keys,
            identity: false,
        }
    }

    /// The identity of `0..len` (sampling without shuffle).
    pub fn identity(len: usize) -> Self {
        Self {
            len: len as u64,
            bits: 0,
            high_bits: 0,
            keys: [0; ROUNDS],
            identity: true,
        }
    }

    /// Elements permuted (`N`).
    #[cfg(any(test, feature = "internals"))]
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether it permutes nothing.
    #[cfg(feature = "internals")]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether this is the identity permutation.
    #[cfg(feature = "internals")]
    pub fn is_identity(&self) -> bool {
        self.identity
    }

    /// Size of the power-of-two domain the network runs on (`M`, `N <= M < 2N`).
    #[cfg(any(test, feature = "internals"))]
    pub fn domain(&self) -> u64 {
        1u64 << self.bits
    }

    /// The element at `position` (`position < len`), in O(1) memory and, on
    /// average over positions, fewer than two network evaluations.
    #[inline]
    pub fn at(&self, position: usize) -> usize {
        debug_assert!((position as u64) < self.len, "position out of range");
        if self.identity || self.bits == 0 {
            return position;
        }
        let mut x = self.forward(position as u64);
        while x >= self.len {
            x = self.forward(x);
        }
        x as usize
    }

    /// The position of `index` (`index < len`): the inverse of [`Permutation::at`].
    #[cfg(any(test, feature = "internals"))]
    pub fn position_of(&self, index: usize) -> usize {
        debug_assert!((index as u64) < self.len, "index out of range");
        if self.identity || self.bits == 0 {
            return index;
        }
        let mut x = self.backward(index as u64);
        while x >= self.len {
            x = self.backward(x);
        }
        x as usize
    }

    /// The elements at `positions`, in order.
    pub fn range(
        &self,
        positions: std::ops::Range<usize>,
    ) -> impl ExactSizeIterator<Item = usize> + '_ {
        positions.map(move |p| self.at(p))
    }

    /// The whole permutation as a vector (O(N) memory: for tests and small N).
    #[cfg(any(test, feature = "internals"))]
    pub fn to_vec(self) -> Vec<usize> {
        self.range(0..self.len()).collect()
    }

    #[inline]
    fn round_fn(key: u64, low: u64, width: u32) -> u64 {
        mix64(low ^ key) & mask(width)
    }

    /// One pass of the network over `0..M`.
    #[inline]
    fn forward(&self, x: u64) -> u64 {
        let (mut a, mut b) = (self.high_bits, self.bits - self.high_bits);
        let mut x = x;
        for &key in &self.keys {
            // x = L (a bits) | R (b bits)  ->  R (b bits) | L ^ F(R) (a bits)
            let (l, r) = (x >> b, x & mask(b));
            x = (r << a) | (l ^ Self::round_fn(key, r, a));
            std::mem::swap(&mut a, &mut b);
        }
        x
    }

    /// The inverse of [`Permutation::forward`].
    #[inline]
    #[cfg(any(test, feature = "internals"))]
    fn backward(&self, x: u64) -> u64 {
        // Widths after all rounds: they swap once per round.
        let (mut a, mut b) = if ROUNDS % 2 == 0 {
            (self.high_bits, self.bits - self.high_bits)
        } else {
            (self.bits - self.high_bits, self.high_bits)
        };
        let mut x = x;
        for &key in self.keys.iter().rev() {
            // Widths of this round's input: L of `a` bits, R of `b` bits; its output
            // is R (b bits) | L ^ F(R) (a bits).
            std::mem::swap(&mut a, &mut b);
            let (r, masked) = (x >> a, x & mask(a));
            let l = masked ^ Self::round_fn(key, r, a);
            x = (l << b) | r;
        }
        x
    }
}

#[inline]
fn mask(width: u32) -> u64 {
    if width >= 64 {
        u64::MAX
    } else {
        (1u64 << width) - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_permutation(p: &Permutation) -> bool {
        let mut seen = vec![false; p.len()];
        for i in p.range(0..p.len()) {
            if i >= p.len() || std::mem::replace(&mut seen[i], true) {
                return false;
            }
        }
        true
    }

    #[test]
    fn small_sizes_are_bijections() {
        for n in 1..300 {
            for seed in 0..4 {
                let p = Permutation::new(n, seed, 0, seed * 7 + 1);
                assert!(is_permutation(&p), "n = {n}, seed = {seed}");
                assert!(p.domain() >= n as u64 && p.domain() < 2 * n as u64 || n == 1);
                for pos in 0..n {
                    assert_eq!(p.position_of(p.at(pos)), pos);
                }
            }
        }
    }

    #[test]
    fn network_is_invertible_on_the_whole_domain() {
        let p = Permutation::new(1000, 3, 1, 2);
        for x in 0..p.domain() {
            assert_eq!(p.backward(p.forward(x)), x);
        }
    }

    #[test]
    fn keys_differ_by_seed_source_and_epoch() {
        let base = Permutation::new(100, 1, 0, 0).to_vec();
        assert_ne!(base, Permutation::new(100, 2, 0, 0).to_vec());
        assert_ne!(base, Permutation::new(100, 1, 1, 0).to_vec());
        assert_ne!(base, Permutation::new(100, 1, 0, 1).to_vec());
        assert_eq!(base, Permutation::new(100, 1, 0, 0).to_vec());
        assert_ne!(base, (0..100).collect::<Vec<_>>());
    }

    #[test]
    fn identity_is_the_identity() {
        let p = Permutation::identity(17);
        assert_eq!(p.to_vec(), (0..17).collect::<Vec<_>>());
        assert_eq!(p.position_of(5), 5);
    }

    #[test]
    fn cycle_walking_averages_domain_over_len_evaluations() {
        // Over all positions the walks visit each of the M domain values once.
        let p = Permutation::new(1025, 9, 0, 4);
        let mut evaluations = 0u64;
        for pos in 0..p.len() {
            let mut x = p.forward(pos as u64);
            evaluations += 1;
            while x >= p.len {
                x = p.forward(x);
                evaluations += 1;
            }
        }
        assert_eq!(evaluations, p.domain());
    }

    #[test]
    fn large_lengths_stay_in_range() {
        let n = 1_000_000_007usize;
        let p = Permutation::new(n, 42, 0, 3);
        for pos in [0, 1, n / 2, n - 2, n - 1] {
            let i = p.at(pos);
            assert!(i < n);
            assert_eq!(p.position_of(i), pos);
        }
    }
}
