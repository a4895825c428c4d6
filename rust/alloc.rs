//! The global allocator: the system's, plus a bounded cache of large freed blocks.
//!
//! A call on a large graph allocates a few dozen blocks of 64 KiB to tens of MiB (the node
//! list, hash tables, output buffers) and frees them at its end. glibc hands such blocks
//! straight back to the kernel (they are `mmap`ed, or trimmed off the top of the heap), so the
//! next call takes a page fault on every 4 KiB it touches again: about 2–3 µs each on the VMs
//! fxcodegen is measured on, 90–100 ns per node in warm loops at 10k–100k nodes. Python's own
//! allocator keeps its arenas; this does the same for the core's large blocks, up to a bound.
//!
//! Blocks of at least [`MIN_BLOCK`] bytes freed while a [`Keep`] guard is alive are kept (up
//! to [`SLOTS`] blocks and the limit in bytes, [`set_limit`]); an allocation of a similar size
//! (an eighth larger at most, [`SLACK`]) takes the smallest kept block that fits, its written
//! pages already resident. Everything else goes to the system allocator unchanged. The kept
//! blocks stay allocated between calls: that is the price, bounded by the limit
//! (`FXCODEGEN_RETAIN_MB` in the Python module, 0 turns it off) and handed back by [`release`].
//!
//! [`adopt`] makes a `String` over another owner's memory (the data of a Python `str` being
//! filled), so that text written through it lands in place: this allocator recognises the
//! block and never frees it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Blocks smaller than this are left to the system allocator (its small-block arenas already
/// keep them).
pub const MIN_BLOCK: usize = 64 << 10;

/// How many blocks the cache keeps at most (and how many it lends out larger than asked).
pub const SLOTS: usize = 48;

/// A kept block serves requests it exceeds by at most `size / SLACK` bytes. Calls on one graph
/// ask for the same sizes again, so a tight fit leaves each block to the request it served
/// before. With up to twice the request, stitch 1M's text (24 MB) took the statements' block
/// (48 MB), which then came fresh from the system: 3.5k page faults more per call (270 more
/// at 100k; `benches/LOG.md`, twenty-second session).
pub const SLACK: usize = 8;

/// How many blocks of other owners [`adopt`] may note at once (one per call in progress).
pub const FOREIGN: usize = 8;

/// The retention limit until [`set_limit`] is called.
pub const DEFAULT_LIMIT: usize = 64 << 20;

/// Blocks no stricter than this alignment are cached (what `malloc` guarantees).
const MAX_ALIGN: usize = 16;

/// Kept blocks and lent ones, by address and real size. Plain arrays: the cache must not
/// allocate, and it is searched only for large blocks.
pub struct Cache {
    /// Freed blocks kept for reuse: `(address, size)`.
    kept: [(usize, usize); SLOTS],
    n_kept: usize,
    /// Kept blocks handed out for a smaller request: `(address, real size)`. Every such block
    /// is at least [`MIN_BLOCK`] bytes as its owner knows it, so its dealloc comes back here.
    lent: [(usize, usize); SLOTS],
    n_lent: usize,
    /// Addresses of other owners' blocks that Strings were made over ([`adopt`]).
    foreign: [usize; FOREIGN],
    n_foreign: usize,
    /// Bytes in `kept`.
    bytes: usize,
}

/// What [`Cache::take`] found.
#[derive(Debug, PartialEq, Eq)]
pub struct Taken {
    pub ptr: usize,
    pub size: usize,
}

impl Cache {
    pub const fn new() -> Cache {
        Cache {
            kept: [(0, 0); SLOTS],
            n_kept: 0,
            lent: [(0, 0); SLOTS],
            n_lent: 0,
            foreign: [0; FOREIGN],
            n_foreign: 0,
            bytes: 0,
        }
    }

    /// Bytes kept.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The smallest kept block of `size..=size + size / SLACK` bytes, removed from the cache
    /// (and noted as lent when larger than `size`; a larger block is not taken when no note can
    /// be made).
    pub fn take(&mut self, size: usize) -> Option<Taken> {
        let mut best: Option<usize> = None;
        for (i, &(_, s)) in self.kept[..self.n_kept].iter().enumerate() {
            if s >= size && s - size <= size / SLACK && best.is_none_or(|b| s < self.kept[b].1) {
                best = Some(i);
            }
        }
        let i = best?;
        let (ptr, real) = self.kept[i];
        if real != size {
            if self.n_lent == SLOTS {
                return None;
            }
            self.lent[self.n_lent] = (ptr, real);
            self.n_lent += 1;
        }
        self.n_kept -= 1;
        self.kept[i] = self.kept[self.n_kept];
        self.bytes -= real;
        Some(Taken { ptr, size: real })
    }

    /// The real size of the block at `ptr`, which its owner knows as `size` bytes (forgetting
    /// a lent block: its owner is giving it up or moving it).
    pub fn returned(&mut self, ptr: usize, size: usize) -> usize {
        match self.lent[..self.n_lent].iter().position(|&(p, _)| p == ptr) {
            Some(i) => {
                let real = self.lent[i].1;
                self.n_lent -= 1;
                self.lent[i] = self.lent[self.n_lent];
                real
            }
            None => size,
        }
    }

    /// The real size of a lent block at `ptr`, if it is one (the block stays lent).
    pub fn lent_size(&self, ptr: usize) -> Option<usize> {
        self.lent[..self.n_lent]
            .iter()
            .find(|&&(p, _)| p == ptr)
            .map(|&(_, s)| s)
    }

    /// Notes the block at `ptr` as another owner's; false when no note can be made.
    pub fn adopt(&mut self, ptr: usize) -> bool {
        if self.n_foreign == FOREIGN {
            return false;
        }
        self.foreign[self.n_foreign] = ptr;
        self.n_foreign += 1;
        true
    }

    /// Whether the block at `ptr` is another owner's.
    pub fn is_foreign(&self, ptr: usize) -> bool {
        self.foreign[..self.n_foreign].contains(&ptr)
    }

    /// Forgets the block at `ptr` if it is another owner's (its String is done with it), and
    /// says whether it was.
    pub fn disown(&mut self, ptr: usize) -> bool {
        match self.foreign[..self.n_foreign]
            .iter()
            .position(|&p| p == ptr)
        {
            Some(i) => {
                self.n_foreign -= 1;
                self.foreign[i] = self.foreign[self.n_foreign];
                true
            }
            None => false,
        }
    }

    /// Keeps a freed block of `size` real bytes if it fits under `limit`; false when the
    /// caller must free it.
    pub fn keep(&mut self, ptr: usize, size: usize, limit: usize) -> bool {
        if self.n_kept == SLOTS || self.bytes + size > limit {
            return false;
        }
        self.kept[self.n_kept] = (ptr, size);
        self.n_kept += 1;
        self.bytes += size;
        true
    }

    /// Removes one kept block, for the caller to free.
    pub fn pop(&mut self) -> Option<(usize, usize)> {
        (self.n_kept > 0).then(|| {
            self.n_kept -= 1;
            self.bytes -= self.kept[self.n_kept].1;
            self.kept[self.n_kept]
        })
    }
}

impl Default for Cache {
    fn default() -> Self {
        Cache::new()
    }
}

/// A spin lock around the cache: held for a scan of at most 2 × [`SLOTS`] entries, and only
/// by large allocations.
struct Locked {
    busy: AtomicBool,
    cache: std::cell::UnsafeCell<Cache>,
}

// SAFETY: `cache` is only reached through `with`, which holds `busy`.
unsafe impl Sync for Locked {}

impl Locked {
    fn lock(&self) {
        let mut spins = 0u32;
        while self
            .busy
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            // The holder may have been descheduled: stop burning its core after a while.
            spins += 1;
            if spins % 64 == 0 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    fn unlock(&self) {
        self.busy.store(false, Ordering::Release);
    }

    fn with<R>(&self, f: impl FnOnce(&mut Cache) -> R) -> R {
        self.lock();
        // SAFETY: the lock is held: no other reference to the cache exists.
        let r = f(unsafe { &mut *self.cache.get() });
        self.unlock();
        r
    }
}

static CACHE: Locked = Locked {
    busy: AtomicBool::new(false),
    cache: std::cell::UnsafeCell::new(Cache::new()),
};
static LIMIT: AtomicUsize = AtomicUsize::new(DEFAULT_LIMIT);
/// How many allocations a kept block served.
static HITS: AtomicUsize = AtomicUsize::new(0);
/// How many [`Keep`] guards are alive.
static KEEPING: AtomicUsize = AtomicUsize::new(0);

/// While one is alive, large blocks freed (on any thread) are kept for reuse; otherwise they go
/// back to the system, so that what a call frees midway lowers its own peak.
pub struct Keep(());

impl Keep {
    pub fn new() -> Keep {
        KEEPING.fetch_add(1, Ordering::Relaxed);
        Keep(())
    }
}

impl Default for Keep {
    fn default() -> Self {
        Keep::new()
    }
}

impl Drop for Keep {
    fn drop(&mut self) {
        KEEPING.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Makes `fork` wait until no thread is inside the cache, so that a child process never
/// inherits it locked (as the C allocator does for its own locks). Call once, early.
#[cfg(target_os = "linux")]
pub fn guard_fork() {
    extern "C" fn before() {
        CACHE.lock();
    }
    extern "C" fn after() {
        CACHE.unlock();
    }
    // SAFETY: the handlers only take and release the spin lock; registering them has no other
    // effect. It can only fail for lack of memory, leaving forks unguarded as before.
    unsafe { libc::pthread_atfork(Some(before), Some(after), Some(after)) };
}

/// Sets how many bytes of freed blocks may be kept (0: none), freeing what is kept beyond it.
pub fn set_limit(bytes: usize) {
    LIMIT.store(bytes, Ordering::Relaxed);
    trim(bytes);
}

/// Frees every kept block (they stay cached again from the next call on); the bytes freed.
pub fn release() -> usize {
    trim(0)
}

/// A `String` of capacity `cap` over the `cap` bytes at `ptr`, which belong to another owner:
/// what is written through it lands there. This allocator never frees those bytes: dropping
/// the String forgets them, and growing or shrinking it moves its text into a block of its
/// own. None for fewer than [`MIN_BLOCK`] bytes (only blocks that large are looked up when
/// freed) or when [`FOREIGN`] blocks are noted already.
///
/// # Safety
/// The bytes are valid for writes, and used by nothing else, until the String is dropped or
/// has moved out of them.
pub unsafe fn adopt(ptr: *mut u8, cap: usize) -> Option<String> {
    if cap < MIN_BLOCK || ptr.is_null() || !CACHE.with(|c| c.adopt(ptr as usize)) {
        return None;
    }
    // SAFETY: the bytes are the caller's to lend. `from_raw_parts` asks for a block of the
    // global allocator because the String gives its block back there: its only ways to, the
    // `dealloc` and `realloc` of this allocator with its capacity (at least MIN_BLOCK bytes,
    // so both look the block up), find it noted as foreign and never pass it on to the system
    // allocator.
    Some(unsafe { String::from_raw_parts(ptr, 0, cap) })
}

/// How many allocations so far were served by a kept block.
pub fn hits() -> usize {
    HITS.load(Ordering::Relaxed)
}

/// Bytes of freed blocks kept now.
pub fn kept_bytes() -> usize {
    CACHE.with(|c| c.bytes())
}

/// Frees kept blocks until at most `limit` bytes are kept; the bytes freed.
fn trim(limit: usize) -> usize {
    let mut freed = 0;
    while let Some((ptr, size)) = CACHE.with(|c| if c.bytes() > limit { c.pop() } else { None }) {
        // SAFETY: a kept block came from the system allocator with this size and alignment.
        unsafe { System.dealloc(ptr as *mut u8, layout(size)) };
        freed += size;
    }
    freed
}

fn layout(size: usize) -> Layout {
    // Kept blocks have sizes that were valid layouts with an alignment of at most MAX_ALIGN.
    Layout::from_size_align(size, MAX_ALIGN).unwrap_or(Layout::new::<u8>())
}

fn cached(l: &Layout) -> bool {
    l.size() >= MIN_BLOCK && l.align() <= MAX_ALIGN
}

/// A kept block for `size` bytes, if one fits.
fn take(size: usize) -> Option<*mut u8> {
    let t = CACHE.with(|c| c.take(size))?;
    HITS.fetch_add(1, Ordering::Relaxed);
    Some(t.ptr as *mut u8)
}

/// The crate's global allocator.
pub struct Retaining;

unsafe impl GlobalAlloc for Retaining {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        take_for(&l).unwrap_or_else(|| System.alloc(l))
    }

    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        match take_for(&l) {
            Some(p) => {
                // Clearing resident memory costs less than faulting in fresh zero pages.
                std::ptr::write_bytes(p, 0, l.size());
                p
            }
            None => System.alloc_zeroed(l),
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, l: Layout) {
        if cached(&l) {
            let limit = if KEEPING.load(Ordering::Relaxed) > 0 {
                LIMIT.load(Ordering::Relaxed)
            } else {
                0
            };
            let (kept, real) = CACHE.with(|c| {
                if c.disown(ptr as usize) {
                    return (true, 0); // another owner's: not this allocator's to free
                }
                let real = c.returned(ptr as usize, l.size());
                (c.keep(ptr as usize, real, limit), real)
            });
            if !kept {
                System.dealloc(ptr, Layout::from_size_align_unchecked(real, l.align()));
            }
            return;
        }
        System.dealloc(ptr, l)
    }

    unsafe fn realloc(&self, ptr: *mut u8, l: Layout, new_size: usize) -> *mut u8 {
        let new = Layout::from_size_align_unchecked(new_size, l.align());
        // Only a block its owner knows as large can be lent (larger than it thinks) or foreign.
        let (lent, foreign) = if cached(&l) {
            CACHE.with(|c| (c.lent_size(ptr as usize), c.is_foreign(ptr as usize)))
        } else {
            (None, false)
        };
        let to = match (lent, foreign) {
            // A lent block already large enough stays where it is.
            (Some(real), _) if real >= new_size && cached(&new) => return ptr,
            // A lent block's real size is only known here, and another owner's block is left
            // (`dealloc` below forgets it): move it.
            (Some(_), _) | (None, true) => match take_for(&new) {
                Some(p) => p,
                None => System.alloc(new),
            },
            // Growing into a kept block saves its faults; otherwise the system moves the block
            // or resizes it in place.
            _ if new_size > l.size() => match take_for(&new) {
                Some(p) => p,
                None => return System.realloc(ptr, l, new_size),
            },
            _ => return System.realloc(ptr, l, new_size),
        };
        if to.is_null() {
            return to;
        }
        std::ptr::copy_nonoverlapping(ptr, to, l.size().min(new_size));
        self.dealloc(ptr, l);
        to
    }
}

/// A kept block for a block of layout `l`, if it is cached at all and one fits.
fn take_for(l: &Layout) -> Option<*mut u8> {
    if cached(l) {
        take(l.size())
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: usize = MIN_BLOCK;

    #[test]
    fn takes_the_smallest_fitting_block_and_tracks_lent_sizes() {
        let mut c = Cache::new();
        assert!(c.keep(0x1000, 4 * K, usize::MAX));
        assert!(c.keep(0x2000, 2 * K, usize::MAX));
        assert!(c.keep(0x3000, 8 * K, usize::MAX));
        assert_eq!(c.bytes(), 14 * K);
        // Exact fit: not lent.
        assert_eq!(
            c.take(2 * K),
            Some(Taken {
                ptr: 0x2000,
                size: 2 * K
            })
        );
        assert_eq!(c.lent_size(0x2000), None);
        // 3.75K fits the 4K block (within an eighth), not the 8K one first.
        assert_eq!(
            c.take(4 * K - K / 4),
            Some(Taken {
                ptr: 0x1000,
                size: 4 * K
            })
        );
        assert_eq!(c.lent_size(0x1000), Some(4 * K));
        // Nothing within an eighth of a smaller request: a block twice the size is left for
        // the request of its own size.
        assert_eq!(c.take(K), None);
        assert_eq!(c.take(4 * K), None);
        assert_eq!(c.take(7 * K), None);
        // Too large for anything kept.
        assert_eq!(c.take(9 * K), None);
        assert_eq!(c.bytes(), 8 * K);
        // The lent block comes back with its owner's size and is kept whole.
        assert_eq!(c.returned(0x1000, 4 * K - K / 4), 4 * K);
        assert_eq!(c.lent_size(0x1000), None);
        assert_eq!(c.returned(0x2000, 2 * K), 2 * K);
    }

    #[test]
    fn keeps_nothing_past_the_limit_or_the_slots() {
        let mut c = Cache::new();
        assert!(c.keep(1, 3 * K, 4 * K));
        assert!(!c.keep(2, 2 * K, 4 * K));
        assert!(c.keep(3, K, 4 * K));
        assert_eq!(c.bytes(), 4 * K);
        assert!(!c.keep(4, 1, 0));
        let mut c = Cache::new();
        for i in 0..SLOTS {
            assert!(c.keep(i + 1, K, usize::MAX));
        }
        assert!(!c.keep(SLOTS + 1, K, usize::MAX));
        let mut n = 0;
        while c.pop().is_some() {
            n += 1;
        }
        assert_eq!((n, c.bytes()), (SLOTS, 0));
    }

    #[test]
    fn no_larger_block_is_lent_when_no_note_can_be_made() {
        let mut c = Cache::new();
        for i in 0..SLOTS {
            assert!(c.keep(0x10_0000 * (i + 1), 2 * K, usize::MAX));
        }
        for _ in 0..SLOTS / 2 {
            assert_eq!(c.take(2 * K - 1).map(|t| t.size), Some(2 * K));
        }
        // Free the slots the loans left, and fill the lent list with notes from elsewhere.
        for i in 0..SLOTS / 2 {
            assert!(c.keep(0x1000 + i, 4 * K, usize::MAX));
            assert_eq!(c.take(4 * K - 1).map(|t| t.size), Some(4 * K));
        }
        assert_eq!(c.take(2 * K - 1), None);
        assert_eq!(c.take(2 * K).map(|t| t.size), Some(2 * K));
    }

    #[test]
    fn foreign_blocks_are_noted_up_to_the_slots_and_forgotten_once() {
        let mut c = Cache::new();
        for i in 0..FOREIGN {
            assert!(c.adopt(0x1000 * (i + 1)));
        }
        assert!(!c.adopt(0x9_9000));
        assert!(c.is_foreign(0x1000) && !c.is_foreign(0x9_9000));
        assert!(c.disown(0x1000));
        assert!(!c.disown(0x1000) && !c.is_foreign(0x1000));
        assert!(c.adopt(0x9_9000));
        assert_eq!(c.bytes(), 0);
    }

    /// A String made over another owner's bytes writes into them; dropping, growing or
    /// shrinking it never frees them (the owner frees them at the end: a double free would
    /// abort), even while freed blocks are being kept.
    #[test]
    fn an_adopted_string_writes_in_place_and_never_frees_its_bytes() {
        let _keep = Keep::new();
        let cap = 2 * MIN_BLOCK;
        let l = Layout::from_size_align(cap, 1).unwrap();
        let noted = |p: *mut u8| {
            CACHE.with(|c| {
                c.is_foreign(p as usize) || c.kept[..c.n_kept].iter().any(|k| k.0 == p as usize)
            })
        };
        for case in 0..3 {
            // SAFETY: a block of the test's own, freed below once no String uses it.
            let buf = unsafe { System.alloc(l) };
            assert!(!buf.is_null());
            // SAFETY: the block is valid and used by nothing else until freed below.
            let mut s = unsafe { adopt(buf, cap) }.expect("a large block is adopted");
            s.push_str("def f():\n");
            assert_eq!((s.as_ptr(), s.capacity()), (buf as *const u8, cap));
            match case {
                0 => drop(s),
                1 => {
                    let more = "x".repeat(cap);
                    s.push_str(&more);
                    assert_ne!(s.as_ptr(), buf as *const u8);
                    assert_eq!(s, format!("def f():\n{more}"));
                    drop(s);
                }
                _ => {
                    s.shrink_to_fit();
                    assert_ne!(s.as_ptr(), buf as *const u8);
                    assert_eq!(s, "def f():\n");
                    drop(s);
                }
            }
            assert!(
                !noted(buf),
                "the block is still noted, or was kept as this allocator's"
            );
            // SAFETY: the test's block, still valid (a block handed to the system would be
            // unmapped, at this size, and fault here).
            unsafe {
                assert_eq!(std::slice::from_raw_parts(buf, 9), b"def f():\n");
                std::ptr::write_bytes(buf, 1, cap);
                System.dealloc(buf, l);
            }
        }
        // SAFETY: never written: too small to be adopted.
        assert!(unsafe { adopt(std::ptr::NonNull::dangling().as_ptr(), MIN_BLOCK - 1) }.is_none());
    }

    /// A fork while another thread is inside the cache waits for it, so the child can
    /// allocate large blocks (unguarded, it would inherit the cache locked and spin forever).
    #[cfg(target_os = "linux")]
    #[test]
    fn a_fork_never_leaves_the_child_with_the_cache_locked() {
        guard_fork();
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let holder = std::thread::spawn(move || {
            CACHE.lock();
            held_tx.send(()).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(200));
            CACHE.unlock();
        });
        held_rx.recv().unwrap();
        // SAFETY: the child only allocates through this allocator and exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let v = vec![7u8; 4 * MIN_BLOCK];
            let ok = v.iter().all(|&b| b == 7);
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        assert!(pid > 0, "fork failed");
        holder.join().unwrap();
        let mut status = 0;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let done = loop {
            // SAFETY: waiting on our own child.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if r == pid {
                break true;
            }
            if std::time::Instant::now() > deadline {
                unsafe { libc::kill(pid, libc::SIGKILL) };
                unsafe { libc::waitpid(pid, &mut status, 0) };
                break false;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        assert!(done, "the child hung on the cache's lock");
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    }

    /// The global allocator under the patterns the core uses: vectors growing past and
    /// shrinking below the cached size, zeroed tables, blocks freed and taken again, from
    /// several threads; the contents survive every move.
    #[test]
    fn the_global_allocator_keeps_contents_through_growth_and_reuse() {
        let _keep = Keep::new();
        let hits = super::hits();
        let work = |seed: u64| {
            for round in 0..20u64 {
                let n = (1 << 12) + (seed * 7919 + round * 104_729) as usize % (1 << 18);
                let mut v: Vec<u64> = Vec::new();
                for i in 0..n as u64 {
                    v.push(i ^ seed);
                }
                let z = vec![0u64; n / 2 + 1];
                assert!(z.iter().all(|&x| x == 0));
                v.truncate(n / 3);
                v.shrink_to_fit();
                v.extend(0..n as u64);
                assert!(v[..n / 3]
                    .iter()
                    .enumerate()
                    .all(|(i, &x)| x == i as u64 ^ seed));
                assert!(v[n / 3..].iter().enumerate().all(|(i, &x)| x == i as u64));
                v.truncate(100);
                v.shrink_to_fit();
                assert!(v.iter().enumerate().all(|(i, &x)| x == i as u64 ^ seed));
            }
        };
        let threads: Vec<_> = (0..4)
            .map(|s| std::thread::spawn(move || work(s)))
            .collect();
        work(9);
        for t in threads {
            t.join().unwrap();
        }
        assert!(kept_bytes() <= LIMIT.load(Ordering::Relaxed));
        assert!(super::hits() > hits, "no allocation reused a kept block");
    }
}
