//! State-key helpers: a stable 64-bit hash (the same in every build and instance, unlike
//! `std`'s randomly seeded hasher) and mixing of key parts.

use std::hash::{Hash, Hasher};

/// The key of a matcher that has committed EOS.
pub const EOS_KEY: u64 = 0xE05E_05E0_5E05_E05E;

/// A stable FNV-1a hasher with a final avalanche, for state keys.
#[derive(Clone, Copy, Debug)]
pub struct KeyHasher(u64);

impl Default for KeyHasher {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= b as u64;
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn finish(&self) -> u64 {
        mix(self.0, 0)
    }
}

/// A hasher for keys that are already well mixed (the results of [`of`] and [`mix`]): it
/// passes the `u64` through, so a map over such keys costs no hashing.
#[derive(Clone, Copy, Debug, Default)]
pub struct PassThrough(u64);

impl Hasher for PassThrough {
    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is expected; anything else still hashes, just slowly.
        for &b in bytes {
            self.0 = mix(self.0, b as u64);
        }
    }

    #[inline]
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

/// A map keyed by mixed 64-bit keys, hashed by [`PassThrough`].
pub type KeyMap<V> = std::collections::HashMap<u64, V, std::hash::BuildHasherDefault<PassThrough>>;

/// The key of any hashable value.
pub fn of<T: Hash + ?Sized>(value: &T) -> u64 {
    let mut h = KeyHasher::default();
    value.hash(&mut h);
    h.finish()
}

/// Combines two key parts (e.g. a sub-state id and a counter) into one key.
#[inline]
pub fn mix(a: u64, b: u64) -> u64 {
    // splitmix64 finaliser over a combination that is not symmetric in a and b.
    let mut z = a ^ b.wrapping_add(0x9e37_79b9_7f4a_7c15).rotate_left(17);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    #[test]
    fn keys_are_stable_and_order_sensitive() {
        assert_eq!(super::of("abc"), super::of("abc"));
        assert_ne!(super::of("abc"), super::of("acb"));
        assert_ne!(super::mix(1, 2), super::mix(2, 1));
    }
}
