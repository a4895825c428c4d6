//! The emitter: a validated [`Program`] in, Python source out. It cannot fail; everything it
//! relies on was checked by [`Program::validate`] and [`check_layout`].

use std::ops::Range;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::{panic, thread};

use rustc_hash::FxHashMap;

use crate::error::{Error, Result};
use crate::ir::{Arg, Graph, Node, Op, Program, Slot, Span, SubmodKind, Target};
use crate::literal;
use crate::liveness::{self, Liveness};
use crate::names::{self, Names, Reserved};
use crate::out::{Out, WINDOW};
use crate::stream::Streamed;

/// The naming scheme of the generated module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    /// fxcodegen's own: submodules, constants and inlined children are module globals
    /// (`__fx_s{i}`, `__fx_c{k}`, `__fx_f{i}`), the fastest lookups CPython has.
    Native,
    /// vLLM's: `execution_fn(..., *, __vllm_submods__)`, `__vllm_submods__[i]`,
    /// `__vllm_consts__[k]`, `__vllm_inlined_submods__{i}`.
    Vllm,
}

impl Style {
    /// Every generated global starts with this; node names that do are renamed.
    pub fn prefix(self) -> &'static str {
        match self {
            Style::Native => "__fx_",
            Style::Vllm => "__vllm_",
        }
    }
}

/// What to emit around the graphs.
#[derive(Clone, Copy, Debug)]
pub struct Layout<'a> {
    pub style: Style,
    /// The entry function's name.
    pub fn_name: &'a str,
    /// Whether the root may call submodules (vLLM's `with_submod`).
    pub with_submod: bool,
    /// Whether to start with `import torch` / `import operator`.
    pub header: bool,
}

impl<'a> Layout<'a> {
    pub fn native() -> Layout<'static> {
        Layout {
            style: Style::Native,
            fn_name: "execution_fn",
            with_submod: true,
            header: true,
        }
    }

    /// The names a generated identifier must avoid under this layout.
    pub fn reserved(&self) -> Reserved<'a> {
        Reserved {
            prefix: self.style.prefix(),
            fn_name: self.fn_name,
        }
    }
}

/// The layout rules a valid program can still break.
pub fn check_layout(p: &Program, layout: &Layout) -> Result<()> {
    let f = layout.fn_name;
    if !names::is_identifier(f.as_bytes())
        || names::is_keyword(f)
        || names::is_builtin(f)
        || f == "torch"
        || f == "operator"
    {
        return Err(Error::Invalid(format!(
            "function name {f:?} is not a usable identifier"
        )));
    }
    for (gi, g) in p.graphs.iter().enumerate() {
        for node in &g.nodes {
            if let (Op::CallModule, Target::Submod(i)) = (node.op, node.target) {
                let opaque = p.submods[i as usize].kind == SubmodKind::Opaque;
                if gi == 0 && !layout.with_submod {
                    return Err(p.node_error(
                        node,
                        format!(
                            "call_module is not allowed for codegen target {}",
                            p.submod_name(i)
                        ),
                    ));
                }
                if gi > 0 && opaque && layout.style == Style::Vllm {
                    return Err(p.node_error(
                        node,
                        format!(
                            "call_module is not allowed for codegen target {} inside an inlined \
                             child (vLLM layout passes submodules to the entry function only)",
                            p.submod_name(i)
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Functions with at least this many nodes are emitted by two threads (see
/// `Emitter::speculate` and `Emitter::shared`): thread start-up costs about as much as
/// emitting a few hundred nodes.
pub const PARALLEL_MIN_NODES: usize = 4_096;

/// [`PARALLEL_MIN_NODES`] for `generate`, which emits a program once, right after reading it.
/// There a second thread starts cold and writes into pages its own allocator arena has not
/// touched yet: below about this many nodes it saves little, and it raises the peak (inline
/// 10k: 2.83 times the source at peak with one thread, 3.13 with two; level in repeated calls,
/// 3-4% slower in one process's alternating calls, 6% in a fresh process's first call; level
/// at 16k; two threads faster at 24k: `benches/LOG.md`, eighteenth session).
pub const ONCE_PARALLEL_MIN_NODES: usize = 1 << 14;

/// Threads the emitter may use: 2 where the machine has them, 1 with `FXCODEGEN_THREADS=1`.
pub fn default_threads() -> usize {
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS.get_or_init(|| {
        let env = std::env::var("FXCODEGEN_THREADS").ok();
        match env.and_then(|v| v.trim().parse::<usize>().ok()) {
            Some(n) => n.clamp(1, 2),
            None => std::thread::available_parallelism().map_or(1, |n| n.get().min(2)),
        }
    })
}

/// Emits the module source for a program that passed [`Program::validate`] and [`check_layout`].
pub fn emit(p: &Program, layout: &Layout) -> String {
    emit_with_threads(p, layout, default_threads()).into_string()
}

/// Generated source as pieces of the buffers the threads wrote, in order, so a caller copying
/// it elsewhere never holds a joined copy as well.
#[derive(Debug, Default)]
pub struct Source {
    buffers: Vec<String>,
    /// `(buffer, byte range)` of each piece.
    pieces: Vec<(usize, Range<usize>)>,
}

impl Source {
    pub fn pieces(&self) -> impl Iterator<Item = &str> + Clone {
        self.pieces
            .iter()
            .map(|(b, r)| &self.buffers[*b][r.clone()])
    }

    pub fn len(&self) -> usize {
        self.pieces.iter().map(|(_, r)| r.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn concat(&self) -> String {
        let mut out = String::with_capacity(self.len());
        out.extend(self.pieces());
        out
    }

    /// The joined source, assembled in the first buffer rather than a new one: the first
    /// buffer's pieces move up to where they belong, last first, and the other buffers' are
    /// copied in between. That is [`Source::concat`]'s copying without its second block of the
    /// source's size (55-83 MB of fresh pages at 1M nodes; `benches/LOG.md`, 27th session).
    /// Falls back to `concat` if a piece of the first buffer would have to move down.
    pub fn into_string(mut self) -> String {
        let total = self.len();
        if self.buffers.is_empty() {
            return String::new();
        }
        // Where each piece goes; the first buffer's pieces may only move up (or stay), and
        // are in order in it (each written after the one before).
        let mut at = 0;
        let mut end0 = 0;
        for (b, r) in &self.pieces {
            if *b == 0 {
                if r.start < end0 || r.start > at {
                    return self.concat();
                }
                end0 = r.end;
            }
            at += r.len();
        }
        let (first, others) = self.buffers.split_first_mut().expect("not empty");
        // SAFETY: the bytes written are whole pieces of valid UTF-8, and `total` of them end
        // up at the start of the buffer, so the result is valid UTF-8 (see below).
        let buf = unsafe { first.as_mut_vec() };
        buf.reserve(total.saturating_sub(buf.len()));
        let base = buf.as_mut_ptr();
        let mut at = total;
        for (b, r) in self.pieces.iter().rev() {
            at -= r.len();
            // SAFETY: `at + r.len() <= total <= capacity`. A first-buffer piece moves up from
            // `r.start <= at` (checked above): the pieces after it are already in place above
            // `at + r.len()`, and those before it lie below `r.start`, so nothing still to be
            // moved is overwritten (`copy` allows the overlap with its own old place). Another
            // buffer's piece comes from a separate allocation.
            unsafe {
                match b {
                    0 if r.start == at => {}
                    0 => std::ptr::copy(base.add(r.start), base.add(at), r.len()),
                    _ => {
                        let src = others[b - 1].as_ptr().add(r.start);
                        std::ptr::copy_nonoverlapping(src, base.add(at), r.len());
                    }
                }
            }
        }
        // SAFETY: bytes `..total` are now all written, in order, and are the joined pieces.
        unsafe { buf.set_len(total) };
        self.buffers.swap_remove(0)
    }

    /// The source, when it is the whole text of the first buffer (one thread wrote it all).
    pub fn whole(&self) -> Option<&str> {
        let first = self.buffers.first()?;
        let mut at = 0;
        for (b, r) in &self.pieces {
            if *b != 0 || r.start != at {
                return None;
            }
            at = r.end;
        }
        (at == first.len()).then_some(first.as_str())
    }
}

/// Bytes of source to expect per node of `p`, and a buffer size for all of its source:
/// generous (untouched capacity costs address space, not memory), since regrowing copies the
/// source (inline 1k: 74 bytes a node, 6.5 of text).
pub fn expected_size(p: &Program) -> (usize, usize) {
    let nodes: usize = p.graphs.iter().map(|g| g.nodes.len()).sum();
    let per_node = 64 + 2 * p.text.len() / nodes.max(1);
    (per_node, 256 + nodes * per_node)
}

/// Whether [`emit_streamed`] with these `threads` and `parallel_min` writes all of `p`'s source
/// on one thread, into its first buffer ([`Source::whole`]).
pub fn one_writer(p: &Program, threads: usize, parallel_min: usize) -> bool {
    threads < 2 || p.graphs.iter().all(|g| g.nodes.len() < parallel_min)
}

/// The source in pieces; `threads` is 1 or 2 and the joined source does not depend on it.
pub fn emit_with_threads(p: &Program, layout: &Layout, threads: usize) -> Source {
    emit_streamed(p, layout, threads, PARALLEL_MIN_NODES, Vec::new(), None)
}

/// [`emit_with_threads`] for a program some of whose graphs already have their names and last
/// uses, worked out for this layout while they were read, with the second thread only for
/// functions of `parallel_min` nodes or more; the source is the same. The first buffer is
/// `into` when given (empty, [`expected_size`] its capacity; it moves if the source outgrows
/// it), else a new one.
pub fn emit_streamed(
    p: &Program,
    layout: &Layout,
    threads: usize,
    parallel_min: usize,
    streamed: Vec<Streamed>,
    into: Option<String>,
) -> Source {
    let (per_node, size) = expected_size(p);
    let mut e = Emitter::new(p, layout, 0);
    e.out = Out::over(into.unwrap_or_else(|| String::with_capacity(size)));
    e.threads = threads;
    e.parallel_min = parallel_min;
    e.per_node = per_node;
    e.streamed = streamed;
    if layout.header {
        e.out.put("import torch\nimport operator\n");
    }
    let reserved = layout.reserved();
    for (i, sm) in p.submods.iter().enumerate() {
        if let SubmodKind::Inline(g) = sm.kind {
            e.out.put("\n");
            e.function(g, Head::Inline(i as u32), &reserved);
        }
    }
    e.out.put("\n");
    e.function(0, Head::Root, &reserved);
    e.cut();
    let mut buffers = vec![e.out.into_string()];
    buffers.append(&mut e.others);
    Source {
        buffers,
        pieces: e.pieces,
    }
}

/// The root function of a native module written while its graph is read ([`crate::stream`]):
/// each node's right-hand side as its batch comes in, then, once names and last uses are
/// known, the whole function assembled around them ([`Body::module`]): the same text
/// [`emit`] writes for the root, without ever holding the whole node list.
#[derive(Debug, Default)]
pub struct Body {
    /// The right-hand sides, one after another.
    rhs: Out,
    /// Where each node's right-hand side ends in `rhs`.
    ends: Vec<u32>,
    /// Per node, its [`kind`] bits.
    kinds: Vec<u8>,
}

/// What [`Body::module`] needs to know of a node besides its text.
mod kind {
    /// A parameter: its right-hand side is its default, if [`DEFAULT`].
    pub const PLACEHOLDER: u8 = 1;
    /// `return` and its right-hand side.
    pub const OUTPUT: u8 = 2;
    pub const DEFAULT: u8 = 4;
    /// A call, which may fuse with a getitem of it right after it (see [`super::fuses`]).
    pub const CALL: u8 = 8;
    /// `v[i]` of the node right before: its right-hand side is `[i]`, which follows that
    /// node's name, or its call when the two fuse.
    pub const ITEM_OF_PREV: u8 = 16;
}

/// Where [`Body::module`] writes: first counted, then copied into a buffer of that length.
pub trait Sink {
    fn put(&mut self, s: &[u8]);
}

/// Counts the bytes a [`Sink`] would receive.
#[derive(Default)]
pub struct Count(pub usize);

impl Sink for Count {
    #[inline(always)]
    fn put(&mut self, s: &[u8]) {
        self.0 += s.len();
    }
}

/// Fills a buffer of the counted length, noting whether everything written is ASCII. Should
/// more come than was counted, it stops writing and is never [`Fill::full`].
pub struct Fill<'b> {
    ptr: *mut u8,
    len: usize,
    at: usize,
    pub ascii: bool,
    over: bool,
    _buf: std::marker::PhantomData<&'b mut [u8]>,
}

impl<'b> Fill<'b> {
    pub fn new(buf: &'b mut [u8]) -> Self {
        // SAFETY: a slice is valid for writes of its length, for its lifetime.
        unsafe { Fill::raw(buf.as_mut_ptr(), buf.len()) }
    }

    /// A fill of the `len` bytes at `ptr`, which need not be initialized yet.
    ///
    /// # Safety
    /// They are valid for writes, and nothing else reads or writes them, for `'b`.
    pub unsafe fn raw(ptr: *mut u8, len: usize) -> Self {
        Fill {
            ptr,
            len,
            at: 0,
            ascii: true,
            over: false,
            _buf: std::marker::PhantomData,
        }
    }

    /// Whether exactly the whole buffer was written.
    pub fn full(&self) -> bool {
        self.at == self.len && !self.over
    }

    /// Writes the next `at` bytes with `first` on this thread while another (this one, should
    /// none start) writes the rest of the buffer with `rest`.
    pub fn split(
        &mut self,
        at: usize,
        first: impl FnOnce(&mut Fill),
        rest: impl Fn(&mut Fill) + Sync,
    ) {
        let left = self.len - self.at;
        let at = at.min(left);
        // The part of the buffer this fill has left, as an address another thread can take.
        let start = self.ptr as usize + self.at;
        // SAFETY (both): `start..start + at` and `start + at..start + left` are disjoint parts of
        // the part of the buffer this fill has left, each written through one fill only, and
        // both fills are done with before this one is used again.
        let mut head = unsafe { Fill::raw(start as *mut u8, at) };
        let write_rest = || {
            let mut f = unsafe { Fill::raw((start + at) as *mut u8, left - at) };
            rest(&mut f);
            (f.at, f.ascii, f.over)
        };
        let (at_rest, ascii, over) = thread::scope(|s| {
            let other = thread::Builder::new().spawn_scoped(s, write_rest);
            first(&mut head);
            match other {
                Ok(h) => h.join().unwrap_or_else(|e| panic::resume_unwind(e)),
                Err(_) => write_rest(),
            }
        });
        self.ascii &= head.ascii && ascii;
        self.over |= head.over || over || head.at != at;
        self.at += head.at + at_rest;
    }
}

impl Sink for Fill<'_> {
    #[inline(always)]
    fn put(&mut self, s: &[u8]) {
        if self.over || s.len() > self.len - self.at {
            self.over = true;
            return;
        }
        // SAFETY: in bounds (checked above) of the buffer this fill may write.
        unsafe { std::ptr::copy_nonoverlapping(s.as_ptr(), self.ptr.add(self.at), s.len()) };
        self.ascii &= s.is_ascii();
        self.at += s.len();
    }
}

impl Body {
    /// A body for a function of about `n` nodes (untouched capacity costs address space only).
    pub fn with_capacity(n: usize) -> Body {
        Body {
            rhs: Out::with_capacity(n * 48),
            ends: Vec::with_capacity(n),
            kinds: Vec::with_capacity(n),
        }
    }

    /// Writes the right-hand sides of `nodes`, the root graph's nodes from `first` on, whose
    /// arguments are in `p` (a program holding this batch: see [`crate::stream::Streams`]);
    /// `names` names every node up to the last of them.
    pub fn write(
        &mut self,
        p: &Program,
        layout: &Layout,
        names: &Names,
        nodes: &[Node],
        first: u32,
    ) {
        let mut e = Emitter::new(p, layout, 0);
        std::mem::swap(&mut e.out, &mut self.rhs);
        for (k, node) in nodes.iter().enumerate() {
            let j = first + k as u32;
            let mut bits = match node.op {
                Op::Placeholder => kind::PLACEHOLDER,
                Op::Output => kind::OUTPUT,
                op if is_call(op) => kind::CALL,
                _ => 0,
            };
            let item_of_prev = j > 0 && item_of(p, node) == Some(j - 1);
            match node.op {
                _ if item_of_prev => {
                    bits |= kind::ITEM_OF_PREV;
                    e.out.room(1 + 16 + 1);
                    // SAFETY: room for '[', an argument and ']'.
                    unsafe {
                        e.out.byte(b'[');
                        e.arg(p.args[node.args.start as usize + 1], names);
                        e.out.byte(b']');
                    }
                }
                Op::Placeholder if node.args.len == 1 => {
                    bits |= kind::DEFAULT;
                    e.out.room(16);
                    // SAFETY: room for an argument.
                    unsafe { e.arg(p.args[node.args.start as usize], names) };
                }
                Op::Placeholder => {}
                Op::Output if node.args.len == 0 => e.out.put("None"),
                Op::Output => {
                    e.out.room(16);
                    // SAFETY: room for an argument.
                    unsafe { e.arg(p.args[node.args.start as usize], names) };
                }
                _ => e.expr(node, names),
            }
            self.ends.push(e.out.len() as u32);
            self.kinds.push(bits);
        }
        std::mem::swap(&mut e.out, &mut self.rhs);
    }

    /// What node `j` computes: its right-hand side, after the name of the node it takes an
    /// item of.
    fn expr(&self, w: &mut impl Sink, j: usize, names: &Names) {
        if self.kinds[j] & kind::ITEM_OF_PREV != 0 {
            w.put(names.get(j as u32 - 1).as_bytes());
        }
        w.put(self.rhs(j));
    }

    /// Node `j`'s right-hand side as written.
    fn rhs(&self, j: usize) -> &[u8] {
        let start = match j {
            0 => 0,
            _ => self.ends[j - 1] as usize,
        };
        &self.rhs.as_str().as_bytes()[start..self.ends[j] as usize]
    }

    /// The module: the header [`emit`] writes, then the root function (`def` line, statements,
    /// `del`s, fused getitems), byte for byte as [`emit`] writes it from the whole program.
    pub fn module(&self, layout: &Layout, names: &Names, live: &Liveness, w: &mut impl Sink) {
        self.head(layout, names, w);
        self.statements(0..self.kinds.len(), names, live, w);
        self.tail(w);
    }

    /// The module's header and `def` line.
    pub fn head(&self, layout: &Layout, names: &Names, w: &mut impl Sink) {
        if layout.header {
            w.put(b"import torch\nimport operator\n");
        }
        w.put(b"\ndef ");
        w.put(layout.fn_name.as_bytes());
        w.put(b"(");
        let mut first = true;
        for (j, &bits) in self.kinds.iter().enumerate() {
            if bits & kind::PLACEHOLDER == 0 {
                continue;
            }
            if !first {
                w.put(b", ");
            }
            first = false;
            w.put(names.get(j as u32).as_bytes());
            if bits & kind::DEFAULT != 0 {
                w.put(b"=");
                w.put(self.rhs(j));
            }
        }
        w.put(b"):\n");
    }

    /// The statements of the nodes in `nodes`, which starts at a statement ([`Body::split`]).
    pub fn statements(
        &self,
        nodes: std::ops::Range<usize>,
        names: &Names,
        live: &Liveness,
        w: &mut impl Sink,
    ) {
        let mut j = nodes.start;
        while j < nodes.end {
            let bits = self.kinds[j];
            if self.fuses(j, live) {
                // `b = f(...)[i]`: the call's value never gets a name (nor a `del`).
                w.put(b"    ");
                w.put(names.get(j as u32 + 1).as_bytes());
                w.put(b" = ");
                self.expr(w, j, names);
                w.put(self.rhs(j + 1));
                w.put(b"\n");
                dels(w, live.after(j), live.after(j + 1), j as u32, names);
                j += 2;
                continue;
            }
            if bits & kind::OUTPUT != 0 {
                w.put(b"    return ");
                w.put(self.rhs(j));
                w.put(b"\n");
            } else if bits & kind::PLACEHOLDER == 0 {
                w.put(b"    ");
                w.put(names.get(j as u32).as_bytes());
                w.put(b" = ");
                self.expr(w, j, names);
                w.put(b"\n");
            }
            dels(w, live.after(j), &[], u32::MAX, names);
            j += 1;
        }
    }

    /// What ends the module: `return None` when the graph has no output.
    pub fn tail(&self, w: &mut impl Sink) {
        if self.kinds.last().is_none_or(|&b| b & kind::OUTPUT == 0) {
            w.put(b"    return None\n");
        }
    }

    /// How many nodes the body has.
    pub fn nodes(&self) -> usize {
        self.kinds.len()
    }

    /// The module's length, and where statement `mid` ([`Body::split`]) starts in it.
    pub fn count(
        &self,
        layout: &Layout,
        names: &Names,
        live: &Liveness,
        mid: usize,
    ) -> (usize, usize) {
        let mut c = Count::default();
        self.head(layout, names, &mut c);
        self.statements(0..mid, names, live, &mut c);
        let at = c.0;
        self.statements(mid..self.nodes(), names, live, &mut c);
        self.tail(&mut c);
        (c.0, at)
    }

    /// Whether node `j` is a call written together with the getitem of it right after it.
    fn fuses(&self, j: usize, live: &Liveness) -> bool {
        self.kinds[j] & kind::CALL != 0
            && live.once(j)
            && self
                .kinds
                .get(j + 1)
                .is_some_and(|&b| b & kind::ITEM_OF_PREV != 0)
    }

    /// A node about halfway through the right-hand sides at which a statement starts, so the
    /// statements can be written in two parts there.
    pub fn split(&self, live: &Liveness) -> usize {
        let half = self.ends.last().map_or(0, |&e| e / 2);
        self.statement_from(self.ends.partition_point(|&e| e < half), live)
    }

    /// The first node from `j` on that starts a statement: one that cannot be the getitem of a
    /// fused pair, because the node before it does not fuse with it (or the end).
    pub fn statement_from(&self, mut j: usize, live: &Liveness) -> usize {
        while j > 0 && j < self.kinds.len() && self.fuses(j - 1, live) {
            j += 1;
        }
        j.min(self.kinds.len())
    }
}

/// [`Emitter::dels`] into a [`Sink`].
#[inline(always)]
fn dels(w: &mut impl Sink, a: &[u32], b: &[u32], skip: u32, names: &Names) {
    let mut first = true;
    for &i in a.iter().chain(b) {
        if i == skip {
            continue;
        }
        w.put(if first { b"    del " } else { b", " });
        w.put(names.get(i).as_bytes());
        first = false;
    }
    if !first {
        w.put(b"\n");
    }
}

/// Writes one argument as it would appear inside the given function's names (used for
/// vLLM's `_node_ref`).
pub fn format_arg(p: &Program, arg: Arg, names: &Names, style: Style) -> String {
    let layout = Layout {
        style,
        fn_name: "execution_fn",
        with_submod: true,
        header: false,
    };
    let mut e = Emitter::new(p, &layout, 0);
    e.out.room(16);
    // SAFETY: room for an argument.
    unsafe { e.value(arg, names) };
    e.out.into_string()
}

/// Whether node `j` is a call whose only use is as the object of the getitem at `j + 1`
/// (native layout only; vLLM's layout keeps one statement per node).
fn fuses(p: &Program, style: Style, g: &Graph, live: &Liveness, j: usize) -> bool {
    style == Style::Native
        && is_call(g.nodes[j].op)
        && live.once(j)
        && g.nodes.get(j + 1).and_then(|next| item_of(p, next)) == Some(j as u32)
}

fn is_call(op: Op) -> bool {
    matches!(op, Op::CallModule | Op::CallFunction | Op::CallMethod)
}

/// The node whose item `node` takes, when it is a plain `v[i]` of a node (what a call before
/// it may fuse with).
fn item_of(p: &Program, node: &Node) -> Option<u32> {
    match (node.op, node.target, node.args.len, node.n_kwargs) {
        (Op::CallFunction, Target::Getitem, 2, 0) => p.args[node.args.start as usize].node(),
        _ => None,
    }
}

/// Names and last uses of `g`, worked out side by side by this thread and one more.
fn side_by_side<'p>(p: &'p Program, g: &'p Graph, reserved: &Reserved) -> (Names<'p>, Liveness) {
    thread::scope(|s| {
        // A thread that cannot be started means doing its part here.
        let other = thread::Builder::new()
            .spawn_scoped(s, || liveness::compute(p, g))
            .ok();
        let names = names::assign(p, g, reserved);
        let live = match other {
            Some(h) => h.join().unwrap_or_else(|e| panic::resume_unwind(e)),
            None => liveness::compute(p, g),
        };
        (names, live)
    })
}

/// Functions with more nodes than this are not [`Emitter::speculate`]d: their tables outgrow
/// the caches, and two threads then contend for memory more than they gain (measured on
/// stitching graphs: 10% faster at 300k nodes, 7% at 500k, 22% slower at 1M).
pub(crate) const SPECULATE_MAX_NODES: usize = 1 << 19;

/// Two threads share a function's statements in about this many chunks: enough to keep both
/// busy to the end, few enough that taking one costs nothing...
const CHUNKS: usize = 64;
/// ...unless that makes chunks smaller than this many nodes.
const MIN_CHUNK_NODES: usize = 256;

/// Where the chunks of `g`'s statements start, followed by the node count: every chunk's
/// length of nodes, moved past the getitem of a fused pair so each starts a statement.
fn chunk_starts(p: &Program, style: Style, g: &Graph, live: &Liveness) -> Vec<usize> {
    let n = g.nodes.len();
    let step = (n / CHUNKS).max(MIN_CHUNK_NODES);
    let mut starts = vec![0];
    let mut j = step;
    while j < n {
        if !fuses(p, style, g, live, j - 1) {
            starts.push(j);
        }
        j += step;
    }
    starts.push(n);
    starts
}

/// Chunks of statements as pieces of the source, in order: `(buffer, range)` (buffers as in
/// [`Emitter::pieces`]).
type Chunks = Vec<(usize, Range<usize>)>;

#[derive(Clone, Copy)]
enum Head {
    Root,
    Inline(u32),
}

const PLAIN_KEYS: usize = 16;

struct Emitter<'a> {
    p: &'a Program,
    layout: &'a Layout<'a>,
    out: Out,
    floats: FxHashMap<u64, (u32, u32)>,
    float_text: String,
    /// `(bits, start, len)` of the float written last, found without hashing.
    last_float: Option<(u64, u32, u32)>,
    /// `(key span, its text when it passes as key=)` of recently seen keyword keys (callee-free
    /// calls).
    plain_keys: [(Span, Option<&'a str>); PLAIN_KEYS],
    /// Parameters of inlined children called with keywords, by graph.
    params: FxHashMap<u32, Rc<Vec<(String, String)>>>,
    threads: usize,
    /// Functions with fewer nodes are emitted by one thread.
    parallel_min: usize,
    /// Bytes of source to expect per node (for sizing buffers).
    per_node: usize,
    /// Names and last uses worked out before, by graph.
    streamed: Vec<Streamed>,
    /// The source so far: `(buffer, range)`, buffer 0 being `out` and `i > 0` being
    /// `others[i - 1]`.
    pieces: Vec<(usize, Range<usize>)>,
    /// Where the text of `out` not yet in `pieces` starts.
    mark: usize,
    /// Buffers other threads wrote.
    others: Vec<String>,
}

/// The identifier a keyword argument is passed under, or None to pass it through `**{...}`:
/// for an inlined child, the (possibly renamed) parameter whose traced name is `key`.
fn kw_ident<'s>(key: &'s str, callee: Option<&'s [(String, String)]>) -> Option<&'s str> {
    match callee {
        Some(params) => params
            .iter()
            .find(|(param, _)| param == key)
            .map(|(_, ident)| ident.as_str()),
        None => (names::is_identifier(key.as_bytes()) && !names::is_keyword(key)).then_some(key),
    }
}

impl<'a> Emitter<'a> {
    fn new(p: &'a Program, layout: &'a Layout<'a>, capacity: usize) -> Self {
        Emitter {
            p,
            layout,
            out: Out::with_capacity(capacity),
            floats: FxHashMap::default(),
            float_text: String::new(),
            last_float: None,
            plain_keys: [(
                Span {
                    start: 0,
                    len: u32::MAX,
                },
                None,
            ); PLAIN_KEYS],
            params: FxHashMap::default(),
            threads: 1,
            parallel_min: PARALLEL_MIN_NODES,
            per_node: 0,
            streamed: Vec::new(),
            pieces: Vec::new(),
            mark: 0,
            others: Vec::new(),
        }
    }

    /// `prefix`, `v` in decimal, then `close` (at most 30 bytes with `prefix`).
    #[inline(always)]
    fn indexed(&mut self, prefix: &'static str, v: u32, close: &'static str) {
        debug_assert!(prefix.len() + close.len() <= 30);
        self.out.room(40);
        // SAFETY: room for `prefix` and `close` and at most 10 digits.
        unsafe {
            self.out.raw(prefix);
            self.out.raw(itoa::Buffer::new().format(v));
            self.out.raw(close);
        }
    }

    fn inline_name(&mut self, i: u32) {
        match self.layout.style {
            Style::Native => self.indexed("__fx_f", i, ""),
            Style::Vllm => self.indexed("__vllm_inlined_submods__", i, ""),
        }
    }

    fn submod_ref(&mut self, i: u32) {
        match self.layout.style {
            Style::Native => self.indexed("__fx_s", i, ""),
            Style::Vllm => self.indexed("__vllm_submods__[", i, "]"),
        }
    }

    fn const_ref(&mut self, k: u32) {
        match self.layout.style {
            Style::Native => self.indexed("__fx_c", k, ""),
            Style::Vllm => self.indexed("__vllm_consts__[", k, "]"),
        }
    }

    fn function(&mut self, gi: u32, head: Head, reserved: &Reserved) {
        let p = self.p;
        let g = &p.graphs[gi as usize];
        let n = g.nodes.len();
        let parallel = self.threads > 1 && n >= self.parallel_min;
        let at = self.streamed.iter().position(|s| s.graph == gi);
        let streamed = at.map(|at| self.streamed.swap_remove(at));
        // Names and last uses, and the statements too when two threads could write them while
        // the names were worked out.
        let (names, live, mut written) = match streamed {
            Some(s) => (s.names.over(&p.text), Arc::new(s.live), None),
            None if parallel && n <= SPECULATE_MAX_NODES => self.speculate(g, reserved),
            None if parallel => {
                let (names, live) = side_by_side(p, g, reserved);
                (names, Arc::new(live), None)
            }
            None => (
                names::assign(p, g, reserved),
                Arc::new(liveness::compute(p, g)),
                None,
            ),
        };
        self.out.put("def ");
        match head {
            Head::Root => self.out.put(self.layout.fn_name),
            Head::Inline(i) => self.inline_name(i),
        }
        self.out.put("(");
        let mut first = true;
        for (j, node) in g.nodes.iter().enumerate() {
            if node.op != Op::Placeholder {
                continue;
            }
            if !first {
                self.out.put(", ");
            }
            first = false;
            self.out.put(names.get(j as u32));
            if node.args.len == 1 {
                self.out.room(1 + 16);
                // SAFETY: room for '=' and an argument.
                unsafe {
                    self.out.byte(b'=');
                    self.arg(p.args[node.args.start as usize], &names);
                }
            }
        }
        if matches!(head, Head::Root) && self.layout.style == Style::Vllm && self.layout.with_submod
        {
            if !first {
                self.out.put(", ");
            }
            self.out.put("*, __vllm_submods__");
        }
        self.out.put("):\n");
        if parallel && written.is_none() {
            written = self.shared(g, &names, &live);
        }
        match written {
            Some(chunks) => {
                self.cut();
                self.pieces.extend(chunks);
            }
            None => self.statements(g, &names, &live, 0..n),
        }
        if g.nodes.last().is_none_or(|node| node.op != Op::Output) {
            self.out.put("    return None\n");
        }
    }

    /// Names and last uses of `g`, and its statements, by two threads: one works out the names
    /// while the other works out the last uses and then starts on the statements, guessing that
    /// every node keeps its own name ([`Names::own`]); once the names are known, both share
    /// the rest. When the guess was wrong (some name had to change) the statements are left
    /// unwritten (None) and nothing written with the guess is kept.
    fn speculate(
        &mut self,
        g: &'a Graph,
        reserved: &Reserved,
    ) -> (Names<'a>, Arc<Liveness>, Option<Chunks>) {
        let (p, layout, per_node) = (self.p, self.layout, self.per_node);
        let (next, stop) = (AtomicUsize::new(0), AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        thread::scope(|s| {
            let (next, stop) = (&next, &stop);
            let other = thread::Builder::new().spawn_scoped(s, move || {
                let live = Arc::new(liveness::compute(p, g));
                let starts = chunk_starts(p, layout.style, g, &live);
                // The receiver outlives this thread: sending cannot fail.
                let _ = tx.send((live.clone(), starts.clone()));
                let own = Names::own(p, g);
                Emitter::new(p, layout, g.nodes.len() * per_node)
                    .into_chunks(g, &own, &live, &starts, next, stop)
            });
            let names = names::assign(p, g, reserved);
            let Ok(other) = other else {
                // A thread that cannot be started means doing its part here.
                return (names, Arc::new(liveness::compute(p, g)), None);
            };
            let guessed = names.all_own();
            stop.store(!guessed, Ordering::Relaxed);
            let Ok((live, starts)) = rx.recv() else {
                // The other thread ended without last uses: it panicked.
                let e = other.join().err();
                panic::resume_unwind(e.unwrap_or_else(|| Box::new("liveness thread ended")));
            };
            let mine = match guessed {
                true => self.take_chunks(g, &names, &live, &starts, next, stop),
                false => Vec::new(),
            };
            let theirs = other.join().unwrap_or_else(|e| panic::resume_unwind(e));
            let chunks = guessed.then(|| self.merge(mine, theirs));
            (names, live, chunks)
        })
    }

    /// The statements of `g` in chunks written by this thread and one more; None if no thread
    /// could be started.
    fn shared(&mut self, g: &Graph, names: &Names, live: &Liveness) -> Option<Chunks> {
        let (p, layout, per_node) = (self.p, self.layout, self.per_node);
        let starts = chunk_starts(p, layout.style, g, live);
        let (next, stop) = (AtomicUsize::new(0), AtomicBool::new(false));
        thread::scope(|s| {
            let (starts, next, stop) = (&starts, &next, &stop);
            let other = thread::Builder::new()
                .spawn_scoped(s, move || {
                    Emitter::new(p, layout, g.nodes.len() * per_node)
                        .into_chunks(g, names, live, starts, next, stop)
                })
                .ok()?;
            let mine = self.take_chunks(g, names, live, starts, next, stop);
            let theirs = other.join().unwrap_or_else(|e| panic::resume_unwind(e));
            Some(self.merge(mine, theirs))
        })
    }

    /// Writes chunks of statements (chunk `k` is nodes `starts[k]..starts[k + 1]`) into `out`,
    /// taking the next one from `next` until none is left or `stop` is set: `(k, where it is
    /// in out)`. They are not pieces of the source yet: see [`Emitter::merge`].
    fn take_chunks(
        &mut self,
        g: &Graph,
        names: &Names,
        live: &Liveness,
        starts: &[usize],
        next: &AtomicUsize,
        stop: &AtomicBool,
    ) -> Vec<(usize, Range<usize>)> {
        self.cut();
        let mut written = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let k = next.fetch_add(1, Ordering::Relaxed);
            let Some(range) = starts.get(k..k + 2).map(|s| s[0]..s[1]) else {
                break;
            };
            let at = self.out.len();
            self.statements(g, names, live, range);
            written.push((k, at..self.out.len()));
        }
        self.mark = self.out.len();
        written
    }

    /// [`Emitter::take_chunks`] by an emitter of another thread: its buffer and its chunks.
    fn into_chunks(
        mut self,
        g: &Graph,
        names: &Names,
        live: &Liveness,
        starts: &[usize],
        next: &AtomicUsize,
        stop: &AtomicBool,
    ) -> (String, Vec<(usize, Range<usize>)>) {
        let chunks = self.take_chunks(g, names, live, starts, next, stop);
        (self.out.into_string(), chunks)
    }

    /// The chunks this thread wrote and those another wrote into its buffer (kept among
    /// `others`), as pieces in chunk order.
    fn merge(
        &mut self,
        mine: Vec<(usize, Range<usize>)>,
        (buffer, theirs): (String, Vec<(usize, Range<usize>)>),
    ) -> Chunks {
        self.others.push(buffer);
        let other = self.others.len();
        let mut chunks: Vec<_> = mine
            .into_iter()
            .map(|(k, r)| (k, 0, r))
            .chain(theirs.into_iter().map(|(k, r)| (k, other, r)))
            .collect();
        chunks.sort_unstable_by_key(|c| c.0);
        chunks.into_iter().map(|(_, b, r)| (b, r)).collect()
    }

    /// Ends the current piece of `out` (if it has text).
    fn cut(&mut self) {
        if self.mark < self.out.len() {
            self.pieces.push((0, self.mark..self.out.len()));
            self.mark = self.out.len();
        }
    }

    /// The statements of nodes `range` (which starts at a statement, see [`fuses`]).
    ///
    /// Statements are written in windows of [`Out`]: each `room` call below makes room for the
    /// unchecked appends right after it, counting 16 bytes for each [`Emitter::arg`] and
    /// [`Out::name`], 32 for each [`Out::text`].
    fn statements(&mut self, g: &Graph, names: &Names, live: &Liveness, range: Range<usize>) {
        let p = self.p;
        let mut j = range.start;
        while j < range.end {
            let node = &g.nodes[j];
            if fuses(p, self.layout.style, g, live, j) {
                // `b = f(...)[i]`: the call's only use is the getitem right after it, so its
                // value never needs a name (nor a `del`).
                let next = &g.nodes[j + 1];
                self.lhs(j as u32 + 1, names);
                self.expr(node, names);
                self.out.room(1 + 16 + 2);
                // SAFETY: room for '[', an argument and "]\n".
                unsafe {
                    self.out.byte(b'[');
                    self.arg(p.args[next.args.start as usize + 1], names);
                    self.out.raw("]\n");
                }
                self.dels(live.after(j), live.after(j + 1), j as u32, names);
                j += 2;
                continue;
            }
            self.statement(node, j as u32, names);
            self.dels(live.after(j), &[], u32::MAX, names);
            j += 1;
        }
    }

    /// One `del` line for the values in `a` and then `b` (all but `skip`, a value that was
    /// never bound).
    #[inline(always)]
    fn dels(&mut self, a: &[u32], b: &[u32], skip: u32, names: &Names) {
        if a.len() + b.len() == 0 {
            return;
        }
        let mut first = true;
        for &i in a.iter().chain(b) {
            if i == skip {
                continue;
            }
            self.out.room(8 + 16 + 1);
            // SAFETY: room for "    del " (or ", "), a name and the line's end, which the last
            // name's window leaves for below.
            unsafe {
                self.out.raw(if first { "    del " } else { ", " });
                self.out.name(names, i);
            }
            first = false;
        }
        if !first {
            // SAFETY: the last window's byte.
            unsafe { self.out.byte(b'\n') };
        }
    }

    fn lhs(&mut self, j: u32, names: &Names) {
        self.out.room(4 + 16 + 3);
        // SAFETY: room for the indent, a name and " = ".
        unsafe {
            self.out.raw("    ");
            self.out.name(names, j);
            self.out.raw(" = ");
        }
    }

    fn statement(&mut self, node: &Node, j: u32, names: &Names) {
        match node.op {
            Op::Placeholder => {}
            Op::Output => {
                self.out.room(11 + 16 + 1);
                // SAFETY: room for "    return ", an argument (or "None") and a newline.
                unsafe {
                    self.out.raw("    return ");
                    match node.args.len {
                        0 => self.out.raw("None"),
                        _ => self.arg(self.p.args[node.args.start as usize], names),
                    }
                    self.out.byte(b'\n');
                }
            }
            _ => {
                self.lhs(j, names);
                self.expr(node, names);
                self.out.room(1);
                // SAFETY: room for the newline.
                unsafe { self.out.byte(b'\n') };
            }
        }
    }

    /// The value a non-placeholder, non-output node computes.
    fn expr(&mut self, node: &Node, names: &Names) {
        let p = self.p;
        match (node.op, node.target) {
            (Op::GetAttr, Target::Const(k)) => self.const_ref(k),
            (Op::CallModule, Target::Submod(i)) => {
                // A program holding one batch of a root written while it is read has no
                // submodules: they are all opaque there ([`Body`]).
                let kind = p
                    .submods
                    .get(i as usize)
                    .map_or(SubmodKind::Opaque, |s| s.kind);
                let callee = match kind {
                    SubmodKind::Opaque => {
                        self.submod_ref(i);
                        None
                    }
                    SubmodKind::Inline(g) => {
                        self.inline_name(i);
                        Some(g)
                    }
                };
                self.call_args(node.args, node.kwargs(), callee, names);
            }
            (Op::CallFunction, Target::Getitem)
                if node.args.len == 2
                    && node.n_kwargs == 0
                    // `None[0]`, `True[0]`, `1[0]` compile with a SyntaxWarning: call instead.
                    && !matches!(
                        p.arg(node.args.start as usize),
                        Arg::None | Arg::Bool(_) | Arg::Int(_) | Arg::BigInt(_) | Arg::Float(_)
                    ) =>
            {
                let at = node.args.start as usize;
                self.out.room(18 + 18);
                // SAFETY: room for a receiver, then '[', an argument and ']'.
                unsafe {
                    self.receiver(p.args[at], names);
                    self.out.byte(b'[');
                    self.arg(p.args[at + 1], names);
                    self.out.byte(b']');
                }
            }
            (Op::CallFunction, t) => {
                match t {
                    Target::Name(s) => {
                        self.out.room(32);
                        // SAFETY: room for a text.
                        unsafe { self.out.text(p.str(s)) };
                    }
                    Target::Const(k) => self.const_ref(k),
                    _ => self.out.put("operator.getitem"),
                }
                self.call_args(node.args, node.kwargs(), None, names);
            }
            (Op::CallMethod, Target::Method(m)) => {
                self.out.room(18 + 1 + 32);
                // SAFETY: room for a receiver, '.' and a text.
                unsafe {
                    self.receiver(p.args[node.args.start as usize], names);
                    self.out.byte(b'.');
                    self.out.text(p.str(m));
                }
                let rest = Span {
                    start: node.args.start + 1,
                    len: node.args.len - 1,
                };
                self.call_args(rest, node.kwargs(), None, names);
            }
            // Unreachable for validated programs; keep the output well-formed regardless.
            _ => self.out.put("None"),
        }
    }

    /// An object in receiver position (`x.m()`, `x[i]`): numbers get parentheses (`(1).m()`,
    /// `(-1)[0]`).
    ///
    /// # Safety
    /// There is room for 18 bytes.
    #[inline(always)]
    unsafe fn receiver(&mut self, a: Slot, names: &Names) {
        // SAFETY: room for '(', an argument and ')'.
        unsafe {
            if !matches!(
                self.p.unpack(a),
                Arg::Int(_) | Arg::BigInt(_) | Arg::Float(_)
            ) {
                self.arg(a, names);
            } else {
                self.out.byte(b'(');
                self.arg(a, names);
                self.out.byte(b')');
            }
        }
    }

    /// `(a, b, k=v)` or `(a, b, **{'k': v, 'not ident': w})`. Keywords to an inlined child are
    /// renamed the way its parameters were; keys that are not identifiers (or name no parameter)
    /// need the `**` form.
    fn call_args(&mut self, args: Span, kwargs: Span, callee: Option<u32>, names: &Names) {
        let p = self.p;
        self.out.room(1);
        // SAFETY: room for '('.
        unsafe { self.out.byte(b'(') };
        let mut first = true;
        for &a in p.slots(args) {
            self.out.room(2 + 16);
            // SAFETY: room for ", " and an argument.
            unsafe {
                if !first {
                    self.out.raw(", ");
                }
                self.arg(a, names);
            }
            first = false;
        }
        if kwargs.len == 0 {
            self.out.room(1);
            // SAFETY: room for ')'.
            unsafe { self.out.byte(b')') };
            return;
        }
        let params = callee.map(|g| self.params(g));
        let callee = params.as_deref().map(Vec::as_slice);
        // Each key's identifier, found once (for the first `KEYS` keys; the rest are looked up
        // again below).
        const KEYS: usize = 8;
        let mut idents: [Option<&str>; KEYS] = [None; KEYS];
        // All keys pass as `key=value`, or (when one cannot) all go through one `**{...}` in
        // graph order, so a callee taking `**kwargs` sees the traced order either way.
        let mut all_plain = true;
        let kw = p.slots(kwargs);
        for (k, pair) in kw.chunks_exact(2).enumerate() {
            let id = self.key_ident(pair[0], callee);
            if let Some(slot) = idents.get_mut(k) {
                *slot = id;
            }
            all_plain &= id.is_some();
        }
        if !all_plain {
            self.out.put(if first { "**{" } else { ", **{" });
        }
        for (k, pair) in kw.chunks_exact(2).enumerate() {
            let ident = match idents.get(k) {
                Some(&id) => id,
                None => self.key_ident(pair[0], callee),
            };
            self.out.room(2 + 32 + 2 + 16);
            // SAFETY: room for ", ", a key (a text, or an argument), ": " (or '=') and a value.
            unsafe {
                if k > 0 || (all_plain && !first) {
                    self.out.raw(", ");
                }
                match (all_plain, ident) {
                    (true, Some(id)) => {
                        self.out.text(id);
                        self.out.byte(b'=');
                    }
                    (_, Some(id)) => {
                        self.out.with(|s| literal::str_repr(s, id));
                        self.out.raw(": ");
                    }
                    (_, None) => {
                        self.arg(pair[0], names);
                        self.out.raw(": ");
                    }
                }
                self.arg(pair[1], names);
            }
        }
        self.out.room(2);
        // SAFETY: room for "})".
        unsafe {
            if !all_plain {
                self.out.byte(b'}');
            }
            self.out.byte(b')');
        }
    }

    /// The identifier keyword `key` is passed under (see [`kw_ident`]); None for a key that is
    /// not text. Keys repeat with one span per distinct key object, so plain keys are
    /// remembered in a small direct-mapped table.
    #[inline(always)]
    fn key_ident<'s>(
        &mut self,
        key: Slot,
        callee: Option<&'s [(String, String)]>,
    ) -> Option<&'s str>
    where
        'a: 's,
    {
        let p = self.p;
        let key = p.str_span(key)?;
        if callee.is_some() {
            return kw_ident(p.str(key), callee);
        }
        let slot = &mut self.plain_keys[key.start as usize % PLAIN_KEYS];
        if slot.0 != key {
            *slot = (key, kw_ident(p.str(key), None));
        }
        slot.1
    }

    /// `(traced parameter name, identifier)` of an inlined child's placeholders, computed once
    /// per child however often it is called with keywords.
    fn params(&mut self, g: u32) -> Rc<Vec<(String, String)>> {
        let p = self.p;
        let reserved = self.layout.reserved();
        self.params
            .entry(g)
            .or_insert_with(|| {
                let graph = &p.graphs[g as usize];
                let names = names::assign(p, graph, &reserved);
                let list = graph
                    .nodes
                    .iter()
                    .enumerate()
                    .filter_map(|(j, n)| match n.target {
                        Target::Param(s) if n.op == Op::Placeholder => {
                            Some((p.str(s).to_string(), names.get(j as u32).to_string()))
                        }
                        _ => None,
                    })
                    .collect();
                Rc::new(list)
            })
            .clone()
    }

    /// Floats repeat (scales, epsilons): each distinct bit pattern is formatted once.
    fn float(&mut self, v: f64) {
        let bits = v.to_bits();
        let (s, l) = match self.last_float {
            Some((b, s, l)) if b == bits => (s, l),
            _ => match self.floats.get(&bits) {
                Some(&(s, l)) => (s, l),
                None => {
                    let start = self.float_text.len() as u32;
                    literal::float(&mut self.float_text, v);
                    let l = self.float_text.len() as u32 - start;
                    self.floats.insert(bits, (start, l));
                    (start, l)
                }
            },
        };
        self.last_float = Some((bits, s, l));
        self.out.room(32);
        // SAFETY: room for a text.
        unsafe {
            self.out
                .text(&self.float_text[s as usize..(s + l) as usize])
        };
    }

    /// The items of a tuple or list, comma-separated, leaving room for 2 bytes behind them.
    ///
    /// # Safety
    /// There is room for 2 bytes.
    unsafe fn items(&mut self, s: Span, names: &Names) {
        for (k, &a) in self.p.slots(s).iter().enumerate() {
            self.out.room(2 + 16 + 2);
            // SAFETY: room for ", ", an argument and the 2 bytes.
            unsafe {
                if k > 0 {
                    self.out.raw(", ");
                }
                self.arg(a, names);
            }
        }
    }

    /// One argument. Node references (most arguments) and small ints are written here, inline
    /// in the caller, unchecked; everything else goes through [`Emitter::value`].
    ///
    /// # Safety
    /// There is room for 16 bytes.
    #[inline(always)]
    unsafe fn arg(&mut self, a: Slot, names: &Names) {
        // SAFETY: room for a name, two digits, or what `value` needs.
        unsafe {
            if let Some(i) = a.node() {
                self.out.name(names, i);
            } else if let Some(v @ 0..=99) = a.int() {
                self.out.small(v as u8);
            } else {
                self.value(self.p.unpack(a), names);
            }
        }
    }

    /// Any argument; it leaves room for a window behind it, as checked appends do.
    ///
    /// # Safety
    /// There is room for 16 bytes.
    #[inline(never)]
    unsafe fn value(&mut self, a: Arg, names: &Names) {
        let p = self.p;
        // SAFETY (the unchecked appends): room for 16 bytes on entry; `items` and the dict's
        // windows leave room for the closing bytes.
        unsafe {
            match a {
                Arg::Node(i) => self.out.name(names, i),
                Arg::None => self.out.raw("None"),
                Arg::Bool(b) => self.out.raw(if b { "True" } else { "False" }),
                Arg::Int(v) => self.out.with(|s| literal::int(s, v)),
                Arg::BigInt(s) => self.out.put(p.str(s)),
                Arg::Float(v) => self.float(v),
                Arg::Str(s) => self.out.with(|o| literal::str_repr(o, p.str(s))),
                Arg::Bytes(s) => self.out.with(|o| literal::bytes_repr(o, p.raw(s))),
                Arg::Const(k) => self.const_ref(k),
                Arg::Tuple(s) => {
                    self.out.byte(b'(');
                    self.items(s, names);
                    self.out.raw(if s.len == 1 { ",)" } else { ")" });
                }
                Arg::List(s) => {
                    self.out.byte(b'[');
                    self.items(s, names);
                    self.out.byte(b']');
                }
                Arg::Dict(s) => {
                    self.out.byte(b'{');
                    for (k, pair) in p.slots(s).chunks_exact(2).enumerate() {
                        self.out.room(2 + 16 + 2 + 16 + 1);
                        // SAFETY: room for ", ", a key, ": ", a value and, after the last, '}'.
                        if k > 0 {
                            self.out.raw(", ");
                        }
                        self.arg(pair[0], names);
                        self.out.raw(": ");
                        self.arg(pair[1], names);
                    }
                    self.out.byte(b'}');
                }
            }
        }
        self.out.room(WINDOW);
    }
}

#[cfg(test)]
#[path = "emit_tests.rs"]
mod tests;
