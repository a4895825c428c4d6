//! Page population ahead of a single-threaded writer, on another thread.
//!
//! The first write to a fresh page costs a page fault: about 2–3 µs on the VMs fxcodegen is
//! measured on, and a large graph's node list fills thousands of fresh pages. Reading Python
//! objects cannot be split across threads, but the faults can: the reader hands the ranges it
//! is about to fill to a helper thread, which maps them with `madvise(MADV_POPULATE_WRITE)`.
//! That populates page tables without reading or writing the memory, so it never races with
//! the writer, and it only ever runs a bounded distance ahead ([`CHUNK`]), so it adds at most
//! a few hundred KiB of resident memory. Where the call is unsupported (not Linux, kernels
//! before 5.14) the helper stops and everything behaves as without it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

/// How far ahead of a writer pages are populated, in bytes (requests go out in these steps).
pub const CHUNK: usize = 256 << 10;

/// A helper thread populating the page ranges sent to it; joined on drop.
pub struct Prefaulter {
    tx: Option<Sender<(usize, usize)>>,
    thread: Option<JoinHandle<()>>,
    off: Arc<AtomicBool>,
}

impl Prefaulter {
    /// Starts the helper, or None where no thread can be started.
    pub fn start() -> Option<Prefaulter> {
        let (tx, rx) = channel::<(usize, usize)>();
        let off = Arc::new(AtomicBool::new(false));
        let flag = off.clone();
        let thread = std::thread::Builder::new()
            .name("fxcodegen-prefault".into())
            .spawn(move || {
                for (start, end) in rx {
                    if !flag.load(Ordering::Relaxed) && !populate(start, end) {
                        flag.store(true, Ordering::Relaxed);
                    }
                }
            })
            .ok()?;
        Some(Prefaulter {
            tx: Some(tx),
            thread: Some(thread),
            off,
        })
    }

    /// Asks for the whole pages inside `start..end` (addresses) to be populated.
    pub fn request(&self, start: usize, end: usize) {
        if self.off.load(Ordering::Relaxed) {
            return;
        }
        if let Some(tx) = &self.tx {
            // A helper that is gone only means no more help.
            let _ = tx.send((start, end));
        }
    }

    /// Asks for the pages of the `len` bytes at `ptr` (a buffer about to be written in random
    /// order, such as a hash table).
    pub fn request_all<T>(&self, ptr: *const T, len: usize) {
        self.request(ptr as usize, ptr as usize + len);
    }
}

impl Drop for Prefaulter {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Keeps the pages just past a growing buffer's end populated, [`CHUNK`] at a time.
#[derive(Default)]
pub struct Ahead {
    base: usize,
    /// Bytes from `base` already requested.
    done: usize,
}

impl Ahead {
    /// Called as the buffer at `base` (capacity `cap` bytes) fills up to `used` bytes; a moved
    /// buffer starts over.
    #[inline]
    pub fn track(&mut self, pf: &Prefaulter, base: *const u8, used: usize, cap: usize) {
        let base = base as usize;
        if base != self.base {
            self.base = base;
            self.done = used;
        }
        if used + CHUNK > self.done && self.done < cap {
            let end = (self.done + CHUNK).min(cap);
            pf.request(base + self.done, base + end);
            self.done = end;
        }
    }

    /// [`Ahead::track`] for a vector.
    #[inline]
    pub fn track_vec<T>(&mut self, pf: &Prefaulter, v: &Vec<T>) {
        let size = std::mem::size_of::<T>();
        self.track(
            pf,
            v.as_ptr() as *const u8,
            v.len() * size,
            v.capacity() * size,
        );
    }
}

/// Populates the whole pages inside `start..end`; false where the kernel does not support it.
#[cfg(target_os = "linux")]
fn populate(start: usize, end: usize) -> bool {
    use std::sync::OnceLock;
    static PAGE: OnceLock<usize> = OnceLock::new();
    let page = *PAGE.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if p > 0 {
            p as usize
        } else {
            4096
        }
    });
    let start = start.next_multiple_of(page);
    let end = end - end % page;
    if start >= end {
        return true;
    }
    // SAFETY: MADV_POPULATE_WRITE only maps pages (as a write fault would) and never changes
    // their contents; a range that is not (or no longer) mapped fails with ENOMEM, and one that
    // was freed and mapped again meanwhile only gets its pages mapped: harmless either way.
    let rc = unsafe {
        libc::madvise(
            start as *mut libc::c_void,
            end - start,
            libc::MADV_POPULATE_WRITE,
        )
    };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL)
}

#[cfg(not(target_os = "linux"))]
fn populate(_start: usize, _end: usize) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ahead_requests_stay_within_capacity_and_restart_on_a_moved_buffer() {
        let pf = Prefaulter::start().expect("a helper thread");
        let mut v: Vec<u64> = Vec::with_capacity(1 << 20);
        let mut ahead = Ahead::default();
        for i in 0..(1u64 << 20) {
            v.push(i);
            ahead.track_vec(&pf, &v);
            assert!(ahead.done <= v.capacity() * 8);
            assert!(ahead.done >= v.len() * 8);
        }
        let mut w: Vec<u64> = Vec::with_capacity(16);
        w.push(1);
        ahead.track_vec(&pf, &w);
        assert_eq!(ahead.base, w.as_ptr() as usize);
        assert_eq!(ahead.done, 16 * 8, "a small buffer is requested whole");
        drop(pf);
        // The contents are untouched by population.
        assert!(v.iter().enumerate().all(|(i, &x)| x == i as u64));
    }
}
