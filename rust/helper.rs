//! A helper thread for the reader of a large graph.
//!
//! Reading Python objects cannot be split across threads, but two other costs of a large read
//! can go to a second one:
//!
//! - **Page faults.** The first write to a fresh page costs a fault: about 2–3 µs on the VMs
//!   fxcodegen is measured on, and a large graph's node list fills thousands of fresh pages.
//!   The reader hands the ranges it is about to fill to the helper, which maps them with
//!   `madvise(MADV_POPULATE_WRITE)`. That populates page tables without reading or writing the
//!   memory, so it never races with the writer, and it only ever runs a bounded distance ahead
//!   ([`CHUNK`]), so it adds at most a few hundred KiB of resident memory. Where the call is
//!   unsupported (not Linux, kernels before 5.14) population stops and everything behaves as
//!   without it.
//! - **Names and last uses** ([`crate::stream`]), from copies the reader hands over in
//!   batches, whose buffers come back for reuse; for a stitching root, its statements too,
//!   from its nodes handed over in full. At most [`in_flight`] batches are out at a time.
//!
//! Each side polls its channel for up to [`SPIN`] before blocking on it ([`poll`]): batches
//! come every few hundred µs, so the helper keeps its core busy while a graph is read instead
//! of being woken by a system call per batch (`FXCODEGEN_THREADS=1` reads without a helper).
//! A written root's helper stays on after its results to populate the pages of a large `str`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::stream::{Batch, Streamed, Streams};

/// How long either thread polls a channel before it blocks on it ([`poll`]).
const SPIN: std::time::Duration = std::time::Duration::from_millis(2);

/// How far ahead of a writer pages are populated, in bytes (requests go out in these steps).
pub const CHUNK: usize = 256 << 10;

enum Job {
    Populate(usize, usize),
    Nodes(Batch),
    /// Every batch is in: send the streams' results, then hand their scratch back.
    Finish,
}

/// The helper thread; joined on drop.
pub struct Helper {
    tx: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    off: Arc<AtomicBool>,
    /// Batches handed back, empty. What is left of them hands its pages back once the helper
    /// thread is joined (doing so while another thread runs would make the kernel interrupt
    /// it to flush its TLB, which cost 5-8% of `generate` at 10k-100k nodes); freed plainly,
    /// they stayed resident through the rest of the call (inline 10k: 3.72 against 3.38 times
    /// the source at peak).
    spare: Receiver<Batch>,
    /// The streams' results, once every batch is in.
    done: Receiver<Vec<Streamed>>,
    /// Signalled once the streams' scratch is handed back after [`Job::Finish`].
    settled: Receiver<()>,
    /// Whether [`Job::Finish`] went.
    closed: bool,
    streams: bool,
    /// Batches sent and not handed back yet.
    out: std::cell::Cell<usize>,
}

/// Graphs of at least this many nodes are read with a helper thread
/// (`FXCODEGEN_HELPER_MIN_NODES` sets another threshold), except a root whose statements the
/// helper writes ([`crate::stream`]), which has one from [`crate::emit::PARALLEL_MIN_NODES`] on:
/// without it the root's whole node list would be held (stitch 10k: 4.75 times the source at
/// peak, against 3.2-3.4).
///
/// Below this, a helper thread costs more than it saves. Repeated calls on inline graphs took
/// 0.83-1.02 of the floor with one at 10k nodes, 0.63-0.79 without it; at 20k 0.79-0.84
/// against 0.63-0.67; at 50k and 100k about level; at 200k and 400k 0.77-0.90 against
/// 0.70-0.76. At 600k and 1M it pays: there most of the node list and the emitter's buffers
/// come from fresh pages on every call, which the helper populates while the graph is read
/// (`benches/LOG.md`, seventeenth session).
/// (Reading stays on one thread either way; `generate`'s emitter still uses two from
/// [`crate::emit::ONCE_PARALLEL_MIN_NODES`] nodes.)
pub const HELPER_MIN_NODES: usize = 1 << 19;

/// [`HELPER_MIN_NODES`], or the threshold `FXCODEGEN_HELPER_MIN_NODES` sets.
pub fn helper_min_nodes() -> usize {
    static MIN: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| {
        let env = std::env::var("FXCODEGEN_HELPER_MIN_NODES").ok();
        env.and_then(|v| v.trim().parse().ok())
            .unwrap_or(HELPER_MIN_NODES)
    })
}

/// How many batches may be on their way to the helper or back before [`Helper::batch`] waits
/// for one: a helper falling behind would otherwise have the reader fill new buffers for every
/// batch (one of 1,024 nodes handed over in full holds about 100 KiB). With two, the reader
/// waited more: stitch 1M took 0.602 of the floor against 0.559 with four (alternating runs).
pub const IN_FLIGHT: usize = 4;

/// Below this many nodes a graph has two batches out at most, not [`IN_FLIGHT`]: four of them
/// were 40% of a 10k-node stitching graph's node list, at the call's peak. Two took stitch
/// 10k from 2.84–3.36 to 2.80–2.95 times the source at peak, 20k from 2.67–2.81 to 2.63–2.65
/// and 30k from 2.67–2.71 to 2.58–2.59, at the same speed (`benches/LOG.md`, twenty-eighth
/// session).
pub const SMALL_GRAPH_NODES: usize = 32_768;

/// How many batches a graph of `size` nodes may have out at once.
pub fn in_flight(size: usize) -> usize {
    match size < SMALL_GRAPH_NODES {
        true => 2,
        false => IN_FLIGHT,
    }
}

impl Helper {
    /// Starts the helper, or None where no thread can be started. With `streams` it also takes
    /// batches of nodes ([`Helper::send`]).
    pub fn start(streams: Option<Streams>) -> Option<Helper> {
        let (tx, rx) = channel::<Job>();
        let (back, spare) = channel::<Batch>();
        let (results, done) = channel::<Vec<Streamed>>();
        let (settle, settled) = channel::<()>();
        let off = Arc::new(AtomicBool::new(false));
        let flag = off.clone();
        let has_streams = streams.is_some();
        let thread = std::thread::Builder::new()
            .name("fxcodegen-helper".into())
            .spawn(move || {
                let mut streams = streams;
                while let Some(job) = poll(&rx) {
                    match job {
                        Job::Populate(start, end) => {
                            if !flag.load(Ordering::Relaxed) && !populate(start, end) {
                                flag.store(true, Ordering::Relaxed);
                            }
                        }
                        Job::Nodes(mut b) => {
                            if let Some(s) = &mut streams {
                                s.take(&mut b);
                            }
                            // The reader may be gone: the batch is then simply freed.
                            let _ = back.send(b);
                        }
                        Job::Finish => {
                            // The results go first; the scratch is handed back while they are
                            // used. The thread stays for populating until it is dropped.
                            if let Some(mut s) = streams.take() {
                                let _ = results.send(s.finish());
                                s.discard();
                            }
                            let _ = settle.send(());
                        }
                    }
                }
            })
            .ok()?;
        Some(Helper {
            tx: Some(tx),
            thread: Some(thread),
            off,
            spare,
            done,
            settled,
            closed: false,
            streams: has_streams,
            out: 0.into(),
        })
    }

    /// Asks for the whole pages inside `start..end` (addresses) to be populated.
    pub fn request(&self, start: usize, end: usize) {
        if self.off.load(Ordering::Relaxed) {
            return;
        }
        if let Some(tx) = &self.tx {
            // A helper that is gone only means no more help.
            let _ = tx.send(Job::Populate(start, end));
        }
    }

    /// Asks for the pages of the `len` bytes at `ptr` (a buffer about to be written in random
    /// order, such as a hash table).
    pub fn request_all<T>(&self, ptr: *const T, len: usize) {
        self.request(ptr as usize, ptr as usize + len);
    }

    /// Whether the helper takes batches of nodes.
    pub fn streams(&self) -> bool {
        self.streams
    }

    /// An empty batch for `graph` (of `size` nodes): one handed back if any, waiting for one
    /// while [`in_flight`] are out.
    pub fn batch(&self, graph: u32, size: usize) -> Batch {
        let back = match self.out.get() >= in_flight(size) {
            // A helper that is gone hands nothing back.
            true => self.spare.recv().ok(),
            false => self.spare.try_recv().ok(),
        };
        if back.is_some() {
            self.out.set(self.out.get() - 1);
        }
        let mut b = back.unwrap_or_default();
        b.reset(graph, size);
        b
    }

    /// Hands a batch of nodes over.
    pub fn send(&self, b: Batch) {
        if let Some(tx) = &self.tx {
            if tx.send(Job::Nodes(b)).is_ok() {
                self.out.set(self.out.get() + 1);
            }
        }
    }

    /// Tells the helper no more batches are coming: it finishes the names and last uses of
    /// every graph streamed, then hands its scratch back (it still populates what is asked).
    pub fn close(&mut self) {
        if let (Some(tx), false) = (&self.tx, self.closed) {
            let _ = tx.send(Job::Finish);
            self.closed = true;
        }
    }

    /// The names and last uses of every graph streamed, once finished, or none if the thread
    /// failed (whose work the emitter then does itself). The thread may still be handing
    /// scratch memory back ([`Helper::settle`]).
    pub fn finish(&mut self) -> Vec<Streamed> {
        self.close();
        poll(&self.done).unwrap_or_default()
    }

    /// Waits until the helper has handed its scratch back after [`Helper::finish`] (false if
    /// it never will: the thread failed).
    pub fn settle(&self) -> bool {
        poll(&self.settled).is_some()
    }
}

/// The next message on `rx`, or None once its sender is gone. The sender is usually a fraction
/// of a millisecond from sending, and waking a thread blocked on a channel costs the sender a
/// system call (2-3% of `generate` at stitch 100k, from the reader's batches) and the woken
/// thread 50-60 µs on the VMs fxcodegen is measured on: so it polls for up to [`SPIN`] first.
fn poll<T>(rx: &Receiver<T>) -> Option<T> {
    let start = std::time::Instant::now();
    let mut polls = 0u32;
    loop {
        match rx.try_recv() {
            Ok(v) => return Some(v),
            Err(TryRecvError::Disconnected) => return None,
            Err(TryRecvError::Empty) => {}
        }
        polls += 1;
        if polls % 64 == 0 && start.elapsed() >= SPIN {
            return rx.recv().ok();
        }
        std::hint::spin_loop();
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // The helper has ended: the spare batches' pages can go back (see `spare`).
        while let Ok(b) = self.spare.try_recv() {
            b.discard();
        }
    }
}

/// Keeps the pages just past a growing buffer's end populated, [`CHUNK`] at a time, while a
/// graph is read, but not past where the buffer is heading: populated pages the buffer never
/// fills would stay resident through the call (up to a chunk per buffer, as much as the whole
/// source of a graph of ten thousand nodes).
#[derive(Default)]
pub struct Ahead {
    base: usize,
    /// Bytes from `base` already requested.
    done: usize,
    /// `(nodes read, bytes used)` at the first call.
    start: Option<(usize, usize)>,
}

impl Ahead {
    /// Called as the buffer at `base` (capacity `cap` bytes) fills up to `used` bytes with `read`
    /// of the graph's `n` nodes read; a moved buffer starts over.
    #[inline]
    pub fn track(
        &mut self,
        pf: &Helper,
        base: *const u8,
        used: usize,
        cap: usize,
        read: (usize, usize),
    ) {
        let base = base as usize;
        if base != self.base {
            self.base = base;
            self.done = used;
        }
        if used + CHUNK <= self.done || self.done >= cap {
            return;
        }
        // The end the buffer is heading for: its growth per node so far, over the nodes left,
        // with half and 32 KiB to spare; a whole chunk before it has grown.
        let (i, n) = read;
        let (i0, u0) = *self.start.get_or_insert((i, used));
        let grown = used.saturating_sub(u0);
        let heading = match i.checked_sub(i0) {
            Some(d) if d > 0 && grown > 0 => {
                used + grown * n.saturating_sub(i) / d * 3 / 2 + (32 << 10)
            }
            _ => used + CHUNK,
        };
        let end = (self.done + CHUNK).min(cap).min(heading);
        if end > self.done {
            pf.request(base + self.done, base + end);
            self.done = end;
        }
    }

    /// [`Ahead::track`] for a vector.
    #[inline]
    pub fn track_vec<T>(&mut self, pf: &Helper, v: &Vec<T>, read: (usize, usize)) {
        let size = std::mem::size_of::<T>();
        self.track(
            pf,
            v.as_ptr() as *const u8,
            v.len() * size,
            v.capacity() * size,
            read,
        );
    }
}

#[cfg(target_os = "linux")]
fn page_size() -> usize {
    use std::sync::OnceLock;
    static PAGE: OnceLock<usize> = OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if p > 0 {
            p as usize
        } else {
            4096
        }
    })
}

/// Populates the whole pages inside `start..end`; false where the kernel does not support it.
#[cfg(target_os = "linux")]
fn populate(start: usize, end: usize) -> bool {
    let (start, end) = page_interior(start, end.saturating_sub(start));
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

/// Frees a large scratch buffer and hands its whole pages back to the system first. A helper
/// thread's allocations come from an allocator arena of their own, whose freed memory would
/// stay resident through the rest of the call (and count towards its peak).
pub fn discard<T>(v: Vec<T>) {
    #[cfg(target_os = "linux")]
    {
        let (start, end) = page_interior(v.as_ptr() as usize, v.capacity() * size_of::<T>());
        if end - start >= 16 << 10 {
            // SAFETY: the range lies inside the buffer's allocation (whole pages, so never the
            // allocator's own bookkeeping around it), whose contents are not read again.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
        }
    }
    drop(v);
}

/// The whole pages inside `len` bytes at `start`, as an address range (empty, anywhere, if
/// there are none).
#[cfg(target_os = "linux")]
fn page_interior(start: usize, len: usize) -> (usize, usize) {
    let page = page_size();
    let (s, e) = (start.next_multiple_of(page), (start + len) / page * page);
    (s, e.max(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_os = "linux")]
    fn discarded_pages_are_whole_pages_inside_the_buffer() {
        let page = page_size();
        for (start, len) in [
            (page * 3 + 8, page * 5),
            (page * 4, page * 2),
            (17, 100),
            (0, 0),
        ] {
            let (s, e) = page_interior(start, len);
            assert!(s <= e && (s == e || (s >= start && e <= start + len)));
            assert!(s % page == 0 && e % page == 0);
            assert!(e - s + 2 * page > len, "no whole page left out");
        }
        // Buffers of any size, including ones of less than a page, are freed normally.
        for n in [0usize, 10, 4096, 1 << 20] {
            let v: Vec<u64> = (0..n as u64).collect();
            discard(v);
        }
    }

    #[test]
    fn ahead_stops_near_where_a_steadily_growing_buffer_ends() {
        let pf = Helper::start(None).expect("a helper thread");
        // 800 KB filled over 100k nodes in a buffer with room for four times that.
        let n = 100_000usize;
        let mut v: Vec<u64> = Vec::with_capacity(4 * n);
        let mut ahead = Ahead::default();
        for i in 0..n {
            v.push(i as u64);
            if i % 64 == 0 {
                ahead.track_vec(&pf, &v, (i + 1, n));
            }
        }
        ahead.track_vec(&pf, &v, (n, n));
        assert!(ahead.done >= n * 8);
        // Requesting a chunk ahead whatever the end leaves up to two chunks (512 KiB) past it.
        assert!(
            ahead.done <= n * 8 + (192 << 10),
            "{} bytes past the end",
            ahead.done - n * 8
        );
    }

    #[test]
    fn ahead_requests_stay_within_capacity_and_restart_on_a_moved_buffer() {
        let pf = Helper::start(None).expect("a helper thread");
        let mut v: Vec<u64> = Vec::with_capacity(1 << 20);
        let mut ahead = Ahead::default();
        let n = 1usize << 20;
        for i in 0..n {
            v.push(i as u64);
            ahead.track_vec(&pf, &v, (i + 1, n));
            assert!(ahead.done <= v.capacity() * 8);
            assert!(ahead.done >= v.len() * 8);
        }
        let mut w: Vec<u64> = Vec::with_capacity(16);
        w.push(1);
        ahead.track_vec(&pf, &w, (0, 16));
        assert_eq!(ahead.base, w.as_ptr() as usize);
        assert_eq!(ahead.done, 16 * 8, "a small buffer is requested whole");
        drop(pf);
        // The contents are untouched by population.
        assert!(v.iter().enumerate().all(|(i, &x)| x == i as u64));
    }
}
