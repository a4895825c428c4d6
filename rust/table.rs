//! A flat open-addressing hash table from hashed keys to `u32` values, for the tables that grow
//! with the graph (node identities, name uniqueness, children by name). Unlike a general map it
//! can be asked to prefetch a key's slot ahead of use, which matters once a graph's tables
//! outgrow the caches, and it keeps equal keys side by side so callers can tell hash collisions
//! apart.

/// How a table stores keys: whole (`u64`, for keys that must match exactly), as a 32-bit tag
/// of a 64-bit hash (`u32`: half the memory, for callers whose `accept` compares the real keys
/// behind the values anyway), or as an address near a base ([`Near`], for [`AddrTable`]).
pub trait Key: Copy + Eq {
    /// Marks an empty slot; never a stored key.
    const EMPTY: Self;
    /// The stored form of key `k`.
    fn stored(k: u64) -> Self;
    /// The bits the home slot is computed from.
    fn bits(self) -> u64;
}

impl Key for u64 {
    const EMPTY: u64 = 0;
    #[inline]
    fn stored(k: u64) -> u64 {
        k.max(1)
    }
    #[inline]
    fn bits(self) -> u64 {
        self
    }
}

impl Key for u32 {
    const EMPTY: u32 = 0;
    #[inline]
    fn stored(k: u64) -> u32 {
        ((k >> 32) as u32).max(1)
    }
    #[inline]
    fn bits(self) -> u64 {
        u64::from(self)
    }
}

/// An address as a signed count of 8-byte steps from a base address, offset by 2^31 (so never
/// 0): the whole key in 32 bits while every address lies within 16 GiB of the base.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Near(u32);

impl Near {
    const BIAS: i64 = 1 << 31;

    /// `addr` as a key against `base`, if it is 8-byte aligned like it and near enough.
    #[inline(always)]
    fn of(base: usize, addr: usize) -> Option<u64> {
        let d = addr.wrapping_sub(base) as isize as i64;
        let steps = d >> 3;
        (d & 7 == 0 && steps > -Self::BIAS && steps < Self::BIAS)
            .then_some((steps + Self::BIAS) as u64)
    }

    fn addr(self, base: usize) -> usize {
        base.wrapping_add(((i64::from(self.0) - Self::BIAS) << 3) as usize)
    }
}

impl Key for Near {
    const EMPTY: Near = Near(0);
    #[inline]
    fn stored(k: u64) -> Near {
        Near(k as u32)
    }
    #[inline]
    fn bits(self) -> u64 {
        u64::from(self.0)
    }
}

/// Object address -> `u32`, one value per address: a [`Table`] of 8-byte slots holding
/// addresses as [`Near`] steps from the first address inserted, half the memory (and the
/// cache misses) of whole addresses; it moves to whole addresses if one lies too far away.
pub enum AddrTable {
    Near { base: usize, table: Table<Near> },
    Far(Table<u64>),
}

impl AddrTable {
    /// A table for `n` addresses without regrowing.
    pub fn with_capacity(n: usize) -> Self {
        AddrTable::Near {
            base: 0,
            table: Table::with_capacity(n),
        }
    }

    /// The value stored under `addr`.
    #[inline]
    pub fn get(&self, addr: usize) -> Option<u32> {
        match self {
            AddrTable::Near { base, table } => table.find(Near::of(*base, addr)?, |_| true),
            AddrTable::Far(table) => table.find(addr as u64, |_| true),
        }
    }

    /// Stores `v` under `addr`, which holds nothing yet.
    #[inline]
    pub fn insert(&mut self, addr: usize, v: u32) {
        match self {
            AddrTable::Near { base, table } => {
                if table.len == 0 {
                    *base = addr;
                }
                match Near::of(*base, addr) {
                    Some(k) => table.insert(k, v),
                    None => {
                        self.go_far();
                        self.insert(addr, v);
                    }
                }
            }
            AddrTable::Far(table) => table.insert(addr as u64, v),
        }
    }

    #[cold]
    fn go_far(&mut self) {
        if let AddrTable::Near { base, table } = self {
            let mut far = Table::with_capacity(table.slots.len());
            for &(k, v) in table.slots.iter().filter(|(k, _)| *k != Near::EMPTY) {
                far.insert(k.addr(*base) as u64, v);
            }
            *self = AddrTable::Far(far);
        }
    }

    /// Asks the CPU to start loading the slot where `addr` lives or would go.
    #[inline]
    pub fn prefetch(&self, addr: usize) {
        match self {
            AddrTable::Near { base, table } => {
                if let Some(k) = Near::of(*base, addr) {
                    table.prefetch(k);
                }
            }
            AddrTable::Far(table) => table.prefetch(addr as u64),
        }
    }

    /// The slot storage, as `(address, bytes)` (for populating its pages ahead of use).
    pub fn memory(&self) -> (*const u8, usize) {
        match self {
            AddrTable::Near { table, .. } => table.memory(),
            AddrTable::Far(table) => table.memory(),
        }
    }

    /// Drops the table, handing its pages back to the system first.
    pub fn discard(self) {
        match self {
            AddrTable::Near { table, .. } => table.discard(),
            AddrTable::Far(table) => table.discard(),
        }
    }
}

/// Slots hold `(stored key, value)`.
pub struct Table<K: Key = u64> {
    slots: Vec<(K, u32)>,
    len: usize,
}

impl<K: Key> Table<K> {
    /// Drops the table, handing its pages back to the system first ([`crate::helper::discard`]).
    pub fn discard(self) {
        crate::helper::discard(self.slots);
    }

    /// A table for `n` keys without regrowing (at most 3/4 full). The slot count is not rounded
    /// to a power of two (which would double the memory of an unlucky size, such as 100k).
    pub fn with_capacity(n: usize) -> Self {
        Table {
            slots: vec![(K::EMPTY, 0); (n + n / 3 + 1).max(8)],
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
    fn home(&self, k: K) -> usize {
        // Fibonacci hashing mixes every bit of the key into the product's high bits; scaling
        // the product to the slot count (a multiply, not a modulo) keeps those bits.
        let h = k.bits().wrapping_mul(0x9E37_79B9_7F4A_7C15);
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
            let p = self.slots.as_ptr().add(self.home(K::stored(k)));
            _mm_prefetch::<_MM_HINT_T0>(p as *const i8);
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = k;
    }

    /// The first value stored under `k` for which `accept` holds.
    #[inline]
    pub fn find(&self, k: u64, mut accept: impl FnMut(u32) -> bool) -> Option<u32> {
        let k = K::stored(k);
        let mut i = self.home(k);
        loop {
            let (sk, v) = self.slots[i];
            if sk == K::EMPTY {
                return None;
            }
            if sk == k && accept(v) {
                return Some(v);
            }
            i = self.next(i);
        }
    }

    /// The first value stored under `k` for which `accept` holds; if there is none, stores `v`
    /// under `k` (one probe sequence for both, where `find` then `insert` would walk it twice).
    #[inline]
    pub fn claim(&mut self, k: u64, v: u32, mut accept: impl FnMut(u32) -> bool) -> Option<u32> {
        self.reserve_one();
        let k = K::stored(k);
        let mut i = self.home(k);
        loop {
            let (sk, old) = self.slots[i];
            if sk == K::EMPTY {
                self.slots[i] = (k, v);
                self.len += 1;
                return None;
            }
            if sk == k && accept(old) {
                return Some(old);
            }
            i = self.next(i);
        }
    }

    /// Adds `v` under `k` (beside any values already there).
    pub fn insert(&mut self, k: u64, v: u32) {
        self.reserve_one();
        self.put(K::stored(k), v);
    }

    /// Grows the table if one more key would make it more than 3/4 full.
    #[inline]
    fn reserve_one(&mut self) {
        if 4 * (self.len + 1) > 3 * self.slots.len() {
            self.grow();
        }
    }

    #[cold]
    fn grow(&mut self) {
        let bigger = vec![(K::EMPTY, 0); 2 * self.slots.len()];
        let old = std::mem::replace(&mut self.slots, bigger);
        self.len = 0;
        for (k, v) in old.into_iter().filter(|&(k, _)| k != K::EMPTY) {
            self.put(k, v);
        }
    }

    fn put(&mut self, k: K, v: u32) {
        let mut i = self.home(k);
        while self.slots[i].0 != K::EMPTY {
            i = self.next(i);
        }
        self.slots[i] = (k, v);
        self.len += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::{AddrTable, Key, Table};

    /// Every value is found through growth, among equal keys, and among keys that share a
    /// stored form (`u32` tags keep only the high half).
    fn finds_every_value<K: Key>(key: impl Fn(u32) -> u64) {
        let mut t = Table::<K>::with_capacity(0);
        for i in 0..10_000u32 {
            t.insert(key(i / 2), i);
        }
        for i in 0..10_000u32 {
            assert_eq!(t.find(key(i / 2), |v| v == i), Some(i));
        }
        // `claim` finds the same values, and stores only what is new.
        for i in 0..10_000u32 {
            assert_eq!(t.claim(key(i / 2), u32::MAX, |v| v == i), Some(i));
        }
        assert_eq!(t.claim(key(77_777), 5, |v| key(v / 2) == key(77_777)), None);
        assert_eq!(t.claim(key(77_777), 6, |v| v == 5), Some(5));
        // Callers of tagged tables compare the real keys behind the values.
        assert_eq!(t.find(key(99_999), |v| key(v / 2) == key(99_999)), None);
    }

    #[test]
    fn whole_keys() {
        // Keys 0 and 1 share storage: values tell them apart.
        finds_every_value::<u64>(u64::from);
        let mut t = Table::<u64>::with_capacity(4);
        t.insert(0, 7);
        t.insert(1, 8);
        assert_eq!(t.find(0, |v| v == 8), Some(8));
    }

    #[test]
    fn tagged_keys() {
        // High halves spread out, and every tag is shared by four keys.
        finds_every_value::<u32>(|k| (u64::from(k / 4) << 40) | u64::from(k % 4));
        // Every key has tag 1.
        finds_every_value::<u32>(u64::from);
    }

    /// Addresses near each other, then ones too far (or misaligned) for 32-bit steps: every
    /// value is found before and after the table moves to whole addresses.
    #[test]
    fn address_tables() {
        let base = 0x7f00_0000_0000usize;
        let near: Vec<usize> = (0..5_000).map(|i| base + 208 * i).collect();
        // Below the first address too, up to just inside the 16 GiB bound.
        let edge = [base - 8, base - (16 << 30) + 8, base + (16 << 30) - 8];
        let mut t = AddrTable::with_capacity(10);
        for (i, &a) in near.iter().chain(&edge).enumerate() {
            t.insert(a, i as u32);
        }
        assert!(matches!(t, AddrTable::Near { .. }));
        assert_eq!(t.get(base + 4), None, "misaligned");
        assert_eq!(t.get(base + (16 << 30)), None, "out of reach");
        assert_eq!(t.get(base + 208 * 5_000), None);
        let far = [base + (16 << 30), base - (16 << 30), 12345, usize::MAX - 7];
        for (i, &a) in far.iter().enumerate() {
            t.insert(a, 10_000 + i as u32);
        }
        assert!(matches!(t, AddrTable::Far(_)));
        for (i, &a) in near.iter().chain(&edge).enumerate() {
            assert_eq!(t.get(a), Some(i as u32));
        }
        for (i, &a) in far.iter().enumerate() {
            assert_eq!(t.get(a), Some(10_000 + i as u32));
        }
        assert_eq!(t.get(base + 4), None);
    }
}
