//! Attention over the CPU backend's paged KV cache, one kernel per element type of the cache:
//! [`f16`](mod@f16) (and f32), [`bf16`] and [`int8`]. Each computes one row's scores, online softmax and
//! weighted sum of values in a single pass over the row's blocks; [`key_lanes`] holds the key
//! layout they share (a vector lane per key) and the score kernels over it.

pub mod bf16;
pub mod f16;
pub mod int8;
pub mod key_lanes;
