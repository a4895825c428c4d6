//! A flat open-addressing hash table from `u64` keys to `u32` values, for the two tables that
//! grow with the graph (node identities and name uniqueness). Unlike a general map it can be
//! asked to prefetch a key's slot ahead of use, which matters once a graph's tables outgrow the
//! caches, and it keeps equal keys side by side so callers can tell hash collisions apart.

/// Slots hold `(key, value)`; key 0 marks an empty slot (keys are stored as `max(key, 1)`).
pub struct Table {
    slots: Vec<(u64, u32)>,
    len: usize,
}

impl Table {
    /// A table for `n` keys without regrowing (at most 3/4 full). The slot count is not rounded
    /// to a power of two (which would double the memory of an unlucky size, such as 100k).
    pub fn with_capacity(n: usize) -> Self {
        Table {
            slots: vec![(0, 0); (n + n / 3 + 1).max(8)],
            len: 0,
        }
    }

    /// The slot storage, as `(address, bytes)` (for populating its pages ahead of use).
    pub fn memory(&self) -> (*const u8, usize) {
        (
            self.slots.as_ptr() as *const u8,
            std::mem::size_of_val(self.slots.as_slice()),
        )
    }

    #[inline]
    fn key(k: u64) -> u64 {
        k.max(1)
    }

    #[inline]
    fn home(&self, k: u64) -> usize {
        // Fibonacci hashing mixes every bit of the key into the product's high bits; scaling
        // the product to the slot count (a multiply, not a modulo) keeps those bits.
        let h = k.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        ((u128::from(h) * self.slots.len() as u128) >> 64) as usize
    }

    #[inline]
    fn next(&self, i: usize) -> usize {
        if i + 1 == self.slots.len() {
            0
        } else {
            i + 1
        }
    }

    /// Asks the CPU to start loading the slot where `k` lives or would go.
    #[inline]
    pub fn prefetch(&self, k: u64) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the address is inside `slots`; prefetching has no architectural effect.
        unsafe {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let p = self.slots.as_ptr().add(self.home(Self::key(k)));
            _mm_prefetch::<_MM_HINT_T0>(p as *const i8);
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = k;
    }

    /// The first value stored under `k` for which `accept` holds.
    #[inline]
    pub fn find(&self, k: u64, mut accept: impl FnMut(u32) -> bool) -> Option<u32> {
        let k = Self::key(k);
        let mut i = self.home(k);
        loop {
            let (sk, v) = self.slots[i];
            if sk == 0 {
                return None;
            }
            if sk == k && accept(v) {
                return Some(v);
            }
            i = self.next(i);
        }
    }

    /// Adds `v` under `k` (beside any values already there).
    pub fn insert(&mut self, k: u64, v: u32) {
        if 4 * (self.len + 1) > 3 * self.slots.len() {
            let bigger = vec![(0, 0); 2 * self.slots.len()];
            let old = std::mem::replace(&mut self.slots, bigger);
            self.len = 0;
            for (k, v) in old.into_iter().filter(|&(k, _)| k != 0) {
                self.insert(k, v);
            }
        }
        let k = Self::key(k);
        let mut i = self.home(k);
        while self.slots[i].0 != 0 {
            i = self.next(i);
        }
        self.slots[i] = (k, v);
        self.len += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::Table;

    #[test]
    fn finds_every_value_through_growth_and_equal_keys() {
        let mut t = Table::with_capacity(0);
        for i in 0..10_000u32 {
            // Keys 0 and 1 share a slot class; every key appears twice.
            t.insert(u64::from(i / 2), i);
        }
        for i in 0..10_000u32 {
            assert_eq!(t.find(u64::from(i / 2), |v| v == i), Some(i));
        }
        assert_eq!(
            t.find(0, |v| v == 2),
            Some(2),
            "0 and 1 share storage, values tell"
        );
        assert_eq!(t.find(99_999, |_| true), None);
    }
}
