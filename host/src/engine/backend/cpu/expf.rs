//! `exp` of f32 values eight at a time, bit for bit what the platform's `expf` returns.
//!
//! Attention's softmax and the gated activation (`silu`) call `expf` once per value: about
//! 280,000 calls per decoded row at a context of 1,024 tokens, a scalar libm call each, and
//! the largest single cost of long-context rows after the matrix products. candle (the
//! reference the engine's tests compare against token for token) calls the same libm `expf`,
//! and one rounding difference in a softmax weight grows into visible logit changes; so the
//! vector version must round exactly as libm does, not merely as accurately.
//!
//! glibc's `expf` (2.28 and later, the algorithm of Arm's optimized-routines) reduces
//! `x * 32 / ln 2 = k + r` in double precision, looks `2^(k/32)` up in a 32-entry table and
//! evaluates a cubic in `r`, then rounds the double result to f32 once. Doing the same
//! double-precision steps four lanes at a time, with the fused multiply-adds glibc's FMA build
//! uses (the reduction and the polynomial), gives the same f32 for every input: checked for
//! every f32 with |x| < 88 against glibc 2.36 (about 2.2 billion values; the command is in the
//! test module). Inputs of magnitude 88 or more, infinities and NaNs go to libm.
//!
//! A libm with another algorithm (musl, an older glibc) would round differently, so the vector
//! path is used only after [`exact`] has found it equal to `f32::exp` on a sample of inputs
//! covering every table entry; otherwise every value goes to libm.

use std::sync::OnceLock;

/// `2^(i/32)` as f64 bits, less `i << 47` (added back from the reduced exponent), `i < 32`:
/// glibc's `__exp2f_data.tab`.
const TABLE: [u64; 32] = [
    0x3ff0000000000000,
    0x3fefd9b0d3158574,
    0x3fefb5586cf9890f,
    0x3fef9301d0125b51,
    0x3fef72b83c7d517b,
    0x3fef54873168b9aa,
    0x3fef387a6e756238,
    0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715,
    0x3feef1a7373aa9cb,
    0x3feedea64c123422,
    0x3feece086061892d,
    0x3feebfdad5362a27,
    0x3feeb42b569d4f82,
    0x3feeab07dd485429,
    0x3feea47eb03a5585,
    0x3feea09e667f3bcd,
    0x3fee9f75e8ec5f74,
    0x3feea11473eb0187,
    0x3feea589994cce13,
    0x3feeace5422aa0db,
    0x3feeb737b0cdc5e5,
    0x3feec49182a3f090,
    0x3feed503b23e255d,
    0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47,
    0x3fef199bdd85529c,
    0x3fef3720dcef9069,
    0x3fef5818dcfba487,
    0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da,
    0x3fefd0765b6e4540,
];

/// `32 / ln 2` (glibc's `invln2_scaled`).
const INV_LN2_32: u64 = 0x4047_1547_652b_82fe;
/// `1.5 * 2^52`: adding it rounds a double to an integer held in the low mantissa bits.
const SHIFT: u64 = 0x4338_0000_0000_0000;
/// The cubic's coefficients for `r` in table units (glibc's `poly_scaled`, the coefficients
/// of `2^r` divided by 32^3, 32^2 and 32), highest power first.
const POLY: [u64; 3] = [0x3ebc_6af8_4b91_2394, 0x3f2e_bfce_50fa_c4f3, 0x3f96_2e42_ff0c_52d6];
/// `|x|` bits from which libm takes over: 88.0 (overflow, underflow, infinities, NaN).
const LARGE_BITS: u32 = 0x42b0_0000;

/// Replaces every value of `xs` by its `exp`, as `f32::exp` would.
pub fn exp_in_place(xs: &mut [f32]) {
    if exact() {
        // SAFETY: `exact` returned true only where the vector version can run.
        unsafe { exp_in_vectors(xs) };
    } else {
        xs.iter_mut().for_each(|x| *x = x.exp());
    }
}

/// [`exp_in_place`] through the vector version, eights it refuses and the tail by libm.
///
/// # Safety
/// The CPU has the instructions ([`vector::AVAILABLE`]).
unsafe fn exp_in_vectors(xs: &mut [f32]) {
    let mut eights = xs.chunks_exact_mut(8);
    for eight in &mut eights {
        let eight: &mut [f32; 8] = eight.try_into().expect("chunks of 8");
        // SAFETY: the caller's promise.
        if !unsafe { vector::exp8(eight) } {
            eight.iter_mut().for_each(|x| *x = x.exp());
        }
    }
    eights.into_remainder().iter_mut().for_each(|x| *x = x.exp());
}

/// Whether the vector version runs here and equals `f32::exp`: checked once, on inputs that
/// reach every table entry and both signs, small and near the limits.
pub fn exact() -> bool {
    static EXACT: OnceLock<bool> = OnceLock::new();
    *EXACT.get_or_init(|| {
        if !vector::AVAILABLE {
            return false;
        }
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let samples = (0..4096).map(|i| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            // Spread over (-88, 88), then a few exact table points and tiny values.
            match i % 4 {
                0 => (state >> 40) as f32 / (1u64 << 24) as f32 * 176.0 - 88.0,
                1 => -((state >> 40) as f32 / (1u64 << 24) as f32 * 20.0),
                2 => (i as f32 / 32.0) * std::f32::consts::LN_2 * if state & 1 == 0 { 1.0 } else { -1.0 },
                _ => f32::from_bits((state as u32) & 0x3fff_ffff) * if state & 2 == 0 { 1.0 } else { -1.0 },
            }
        });
        let mut values: Vec<f32> = samples.collect();
        let expected: Vec<u32> = values.iter().map(|x| x.exp().to_bits()).collect();
        // SAFETY: AVAILABLE says the build has the instructions.
        unsafe { exp_in_vectors(&mut values) };
        values.iter().zip(&expected).all(|(got, want)| got.to_bits() == *want)
    })
}

mod vector {
    /// Whether the build has the instructions (x86-64-v3, see `.cargo/config.toml`).
    pub const AVAILABLE: bool = cfg!(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"));

    /// `exp` of eight values in place; `false` (values untouched) when one of them is out of
    /// the vector range (|x| >= 88, infinite or NaN), for the caller to hand to libm.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA ([`AVAILABLE`]).
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
    pub unsafe fn exp8(xs: &mut [f32; 8]) -> bool {
        use super::{INV_LN2_32, LARGE_BITS, POLY, SHIFT, TABLE};
        use std::arch::x86_64::*;
        // SAFETY: the features are the build's; every load and store covers `xs` or `TABLE`
        // (indices are masked to 0..32).
        unsafe {
            let x = _mm256_loadu_ps(xs.as_ptr());
            let magnitude = _mm256_and_si256(_mm256_castps_si256(x), _mm256_set1_epi32(0x7fff_ffff));
            let large = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(LARGE_BITS as i32 - 1));
            if _mm256_movemask_epi8(large) != 0 {
                return false;
            }
            let inv = _mm256_set1_pd(f64::from_bits(INV_LN2_32));
            let shift = _mm256_set1_pd(f64::from_bits(SHIFT));
            let [c0, c1, c2] = POLY.map(|c| _mm256_set1_pd(f64::from_bits(c)));
            let one = _mm256_set1_pd(1.0);
            let half = |xd: __m256d| {
                // x * 32 / ln 2 = k + r, k rounded to nearest in the low bits of `kd`.
                let kd = _mm256_fmadd_pd(inv, xd, shift);
                let k = _mm256_sub_pd(kd, shift);
                let r = _mm256_fmsub_pd(inv, xd, k);
                let ki = _mm256_castpd_si256(kd);
                let index = _mm256_and_si256(ki, _mm256_set1_epi64x(31));
                let t = _mm256_i64gather_epi64::<8>(TABLE.as_ptr().cast(), index);
                let s = _mm256_castsi256_pd(_mm256_add_epi64(t, _mm256_slli_epi64::<47>(ki)));
                // s * (c0 r^3 + c1 r^2 + c2 r + 1), in glibc's order of fused steps.
                let z = _mm256_fmadd_pd(c0, r, c1);
                let r2 = _mm256_mul_pd(r, r);
                let y = _mm256_fmadd_pd(c2, r, one);
                let y = _mm256_fmadd_pd(z, r2, y);
                _mm256_cvtpd_ps(_mm256_mul_pd(y, s))
            };
            let low = half(_mm256_cvtps_pd(_mm256_castps256_ps128(x)));
            let high = half(_mm256_cvtps_pd(_mm256_extractf128_ps::<1>(x)));
            _mm256_storeu_ps(xs.as_mut_ptr(), _mm256_set_m128(high, low));
            true
        }
    }

    /// Never called: [`AVAILABLE`] is false without the instructions.
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma")))]
    pub unsafe fn exp8(_: &mut [f32; 8]) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `exp_in_place` against `f32::exp` on `values`, bit for bit.
    fn assert_equal_to_libm(values: &[f32]) {
        let mut got = values.to_vec();
        exp_in_place(&mut got);
        for (x, got) in values.iter().zip(&got) {
            let want = x.exp();
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "exp({x:e}) = {got:e}, libm says {want:e}"
            );
        }
    }

    #[test]
    fn the_vector_exp_runs_and_equals_libm_here() {
        // The build's baseline has AVX2 and FMA, and this machine's libm is glibc: the fast
        // path must be taken, or the attention speed-up is silently lost.
        if vector::AVAILABLE && cfg!(target_env = "gnu") {
            assert!(exact(), "the vector exp differs from this glibc's expf");
        }
    }

    #[test]
    fn every_sampled_value_and_edge_equals_libm() {
        // A stride over every f32 bit pattern (about 540,000 values, both signs, subnormals,
        // infinities and NaNs included), then the edges of the vector range.
        let strided: Vec<f32> = (0..u32::MAX / 7919).map(|i| f32::from_bits(i * 7919)).collect();
        assert_equal_to_libm(&strided);
        let edges = [
            0.0,
            -0.0,
            f32::MIN_POSITIVE,
            -f32::MIN_POSITIVE,
            1e-30,
            88.0,
            -88.0,
            f32::from_bits(LARGE_BITS - 1),
            -f32::from_bits(LARGE_BITS - 1),
            88.72,
            -103.9,
            -104.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            1.0,
            -1.0,
            std::f32::consts::LN_2,
        ];
        assert_equal_to_libm(&edges);
        // Lengths that leave a tail, with a large value inside a vector of eight.
        let mixed: Vec<f32> = (0..29).map(|i| if i == 11 { 95.0 } else { i as f32 * -0.37 }).collect();
        assert_equal_to_libm(&mixed);
    }

    /// Every f32 with |x| < 88 (about 2.2 billion values, minutes in release):
    /// `cargo test --release -p dspark-host --lib expf -- --ignored`.
    #[test]
    #[ignore]
    fn every_value_in_the_vector_range_equals_libm() {
        let mut chunk = Vec::with_capacity(1 << 20);
        let mut bits = 0u32;
        loop {
            let x = f32::from_bits(bits);
            if x.abs() < 88.0 {
                chunk.push(x);
            }
            if chunk.len() == chunk.capacity() || bits == u32::MAX {
                assert_equal_to_libm(&chunk);
                chunk.clear();
            }
            if bits == u32::MAX {
                break;
            }
            bits += 1;
        }
    }
}
