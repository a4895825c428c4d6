//! Names and last uses of a large graph's nodes, worked out on the helper thread while the
//! graph is still being read: the reader hands over, in batches, each node's name (a copy) and
//! the nodes it references, which is all [`crate::names::assign`] and
//! [`crate::liveness::compute`] look at. Their results are the same as if computed after the
//! read; the emitter then only writes statements.
//!
//! The root of a native module that calls no inlined child (a stitching graph) goes further:
//! its nodes go over in full ([`Full`]), with their arguments and the program text added since
//! the batch before, and the helper writes each node's right-hand side as well ([`Body`]). The
//! reader then keeps none of the root's nodes (its arenas start over with every batch), and
//! the source is assembled from the right-hand sides, names and last uses once the read ends,
//! byte for byte what the emitter writes from the whole node list.

use crate::emit::{Body, Layout, Style};
use crate::ir::{Graph, Node, Op, Program, Slot, Span};
use crate::liveness::{Builder, Liveness};
use crate::names::{hash_bytes, NameParts, Namer, Reserved};

/// How many nodes go to the helper at a time.
pub const BATCH: usize = 4096;

/// How many nodes go at a time when they go in full ([`Full`]): a batch then holds about 100
/// bytes a node on a stitching graph (the node, its arguments, its text), and up to
/// [`crate::helper::in_flight`] batches are out at once. Smaller batches hold less memory and
/// make the reader wait on the helper more: at stitch 100k, 1,024 nodes and two out peaked at
/// 2.83 times the source, four out at 2.89, 4,096 nodes and four out at 3.08.
pub const FULL_BATCH: usize = 1024;

/// Consecutive nodes of one graph.
#[derive(Debug, Default)]
pub struct Batch {
    pub graph: u32,
    /// How many nodes the graph has (a capacity hint).
    pub size: u32,
    /// The nodes' names, one after another.
    pub text: String,
    pub nodes: Vec<Summary>,
    /// The nodes each node references, one node after another.
    pub refs: Vec<u32>,
    /// The nodes themselves, for a root whose statements the helper writes ([`Body`]).
    pub full: Option<Full>,
}

/// A batch of the root's nodes in full: their arguments (spans count from the start of
/// `args`, which the reader empties after each batch) and what the program's text and blobs
/// gained since the previous batch (names are then spans of the whole text, not copies in
/// [`Batch::text`]).
#[derive(Debug, Default)]
pub struct Full {
    pub nodes: Vec<Node>,
    pub args: Vec<Slot>,
    pub wide: Vec<u64>,
    pub text: String,
    pub blobs: Vec<u8>,
}

impl Full {
    /// Drops the buffers, handing their pages back to the system first.
    fn discard(self) {
        use crate::helper::discard;
        discard(self.nodes);
        discard(self.args);
        discard(self.wide);
        discard(self.text.into_bytes());
        discard(self.blobs);
    }

    fn clear(&mut self) {
        self.nodes.clear();
        self.args.clear();
        self.wide.clear();
        self.text.clear();
        self.blobs.clear();
    }
}

/// What the helper needs of one node.
#[derive(Clone, Copy, Debug)]
pub struct Summary {
    /// Where the name is in the program text (the copy in [`Batch::text`] is as long).
    pub name: Span,
    /// How many entries of [`Batch::refs`] are this node's.
    pub refs: u32,
    pub output: bool,
}

impl Batch {
    /// Empties the batch for reuse by `graph` (of `size` nodes), keeping its buffers.
    pub fn reset(&mut self, graph: u32, size: usize) {
        self.graph = graph;
        self.size = size as u32;
        self.text.clear();
        self.nodes.clear();
        self.refs.clear();
        if let Some(f) = &mut self.full {
            f.clear();
        }
    }

    /// Drops the batch, handing its buffers' pages back to the system first.
    pub fn discard(self) {
        use crate::helper::discard;
        discard(self.text.into_bytes());
        discard(self.nodes);
        discard(self.refs);
        if let Some(f) = self.full {
            f.discard();
        }
    }

    /// Adds a node whose name, at `at` in the program text, was copied to [`Batch::text`] first.
    pub fn push(&mut self, at: Span, output: bool, refs: &[u32]) {
        self.nodes.push(Summary {
            name: at,
            refs: refs.len() as u32,
            output,
        });
        self.refs.extend_from_slice(refs);
    }
}

/// One graph's names and last uses.
#[derive(Debug)]
pub struct Streamed {
    pub graph: u32,
    /// Spans of the program text, or of [`Root::text`] for a written root.
    pub names: NameParts,
    pub live: Liveness,
    /// The root's statements, when the batches came [`Full`].
    pub root: Option<Root>,
}

/// A root function the helper wrote: its statements, the program text its names point into,
/// and the length of the module [`Body::module`] assembles around them.
#[derive(Debug)]
pub struct Root {
    pub body: Body,
    pub text: String,
    pub len: usize,
    /// A statement about halfway ([`Body::split`]), and where it starts in the module.
    pub mid: usize,
    pub at: usize,
}

/// One graph the helper is handed.
struct Stream {
    graph: u32,
    namer: Namer,
    live: Builder,
    /// For a root handed over in full.
    writer: Option<Writer>,
}

/// A root's statements written so far.
struct Writer {
    body: Body,
    /// How many nodes `body` covers.
    first: u32,
    /// A copy of the program's blobs (the namer holds the copy of its text).
    blobs: Vec<u8>,
}

/// How many nodes ahead [`Streams::take`] loads a name's uniqueness-table slot.
const AHEAD: usize = 8;

/// Per graph, the names and last uses of the nodes handed over so far.
pub struct Streams {
    prefix: &'static str,
    fn_name: String,
    /// Whether a written root's module starts with the imports ([`Layout::header`]).
    header: bool,
    graphs: Vec<Stream>,
    /// Scratch: the hashes of a batch's names.
    hashes: Vec<u64>,
}

impl Streams {
    /// Streams for a layout whose names start with `prefix`, whose entry is `fn_name` and
    /// whose module starts with the imports if `header`.
    pub fn new(prefix: &'static str, fn_name: &str, header: bool) -> Streams {
        Streams {
            prefix,
            fn_name: fn_name.to_string(),
            header,
            graphs: Vec::new(),
            hashes: Vec::new(),
        }
    }

    pub fn take(&mut self, b: &mut Batch) {
        // A test hook: `FXCODEGEN_FAILPOINT=helper` makes the helper fail here, so the tests
        // can see `generate` recover from a helper thread that ends early.
        static FAIL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let fail = || std::env::var("FXCODEGEN_FAILPOINT").is_ok_and(|v| v == "helper");
        assert!(!*FAIL.get_or_init(fail), "FXCODEGEN_FAILPOINT=helper");
        let at = match self.graphs.iter().position(|g| g.graph == b.graph) {
            Some(at) => at,
            None => {
                let n = b.size as usize;
                let full = b.full.is_some();
                self.graphs.push(Stream {
                    graph: b.graph,
                    namer: match full {
                        true => Namer::mirrored(n),
                        false => Namer::new(n),
                    },
                    live: Builder::with_capacity(n),
                    writer: full.then(|| Writer {
                        body: Body::with_capacity(n),
                        first: 0,
                        blobs: Vec::new(),
                    }),
                });
                self.graphs.len() - 1
            }
        };
        let reserved = Reserved {
            prefix: self.prefix,
            fn_name: &self.fn_name,
        };
        let g = &mut self.graphs[at];
        // The names' hashes first, so that each one's slot in the uniqueness table can be
        // loaded a few nodes ahead: at a million nodes that table outgrows the caches, and
        // without it the helper fell behind the reader.
        let mut hashes = std::mem::take(&mut self.hashes);
        hashes.clear();
        match (&mut b.full, &mut g.writer) {
            (Some(f), Some(w)) => {
                g.namer.extend(&f.text);
                w.blobs.extend_from_slice(&f.blobs);
                let text = g.namer.text().as_bytes();
                for node in &f.nodes {
                    hashes.push(hash_bytes(text.get(node.name.range()).unwrap_or(&[])));
                }
                name_all(&mut g.namer, &hashes, |namer, k, h| {
                    namer.add_at(f.nodes[k].name, h, &reserved)
                });
                let layout = root_layout(&self.fn_name, self.header);
                write(&mut g.namer, &mut g.live, w, f, &layout);
            }
            _ => {
                let mut t = 0;
                for node in &b.nodes {
                    let len = node.name.len as usize;
                    hashes.push(hash_bytes(&b.text.as_bytes()[t..t + len]));
                    t += len;
                }
                let mut t = 0;
                name_all(&mut g.namer, &hashes, |namer, k, h| {
                    let node = &b.nodes[k];
                    let len = node.name.len as usize;
                    namer.add(&b.text[t..t + len], h, node.name.start, &reserved);
                    t += len;
                });
                let mut r = 0;
                for node in &b.nodes {
                    g.live.push(node.output);
                    for &i in &b.refs[r..r + node.refs as usize] {
                        g.live.mark(i);
                    }
                    r += node.refs as usize;
                }
            }
        }
        self.hashes = hashes;
    }

    /// Every graph's names and last uses, and a written root's length (counted here, while
    /// the reader hands its program back); what remains is scratch: [`Streams::discard`] it.
    pub fn finish(&mut self) -> Vec<Streamed> {
        let layout = root_layout(&self.fn_name, self.header);
        let graphs = self.graphs.iter_mut();
        graphs
            .map(|g| {
                let names = g.namer.finish();
                let live = g.live.finish();
                let (names, root) = match g.writer.take() {
                    Some(w) => {
                        let text = g.namer.take_text();
                        let over = names.over(&text);
                        let mid = w.body.split(&live);
                        let (len, at) = w.body.count(&layout, &over, &live, mid);
                        let names = over.into_parts();
                        let root = Root {
                            body: w.body,
                            text,
                            len,
                            mid,
                            at,
                        };
                        (names, Some(root))
                    }
                    None => (names, None),
                };
                Streamed {
                    graph: g.graph,
                    names,
                    live,
                    root,
                }
            })
            .collect()
    }

    /// Drops the scratch, handing its pages back to the system first.
    pub fn discard(self) {
        for g in self.graphs {
            g.namer.discard();
            g.live.discard();
        }
    }
}

/// The layout of a root written on the helper: only a native module's is.
fn root_layout(fn_name: &str, header: bool) -> Layout<'_> {
    Layout {
        style: Style::Native,
        fn_name,
        with_submod: true,
        header,
    }
}

/// Names the nodes whose name hashes are `hashes` with `add(namer, k, hash)`, loading each
/// one's uniqueness-table slot a few nodes ahead.
fn name_all(namer: &mut Namer, hashes: &[u64], mut add: impl FnMut(&mut Namer, usize, u64)) {
    for &h in hashes.iter().take(AHEAD) {
        namer.prefetch(h);
    }
    for (k, &h) in hashes.iter().enumerate() {
        if let Some(&ahead) = hashes.get(k + AHEAD) {
            namer.prefetch(ahead);
        }
        add(namer, k, h);
    }
}

/// The last uses and right-hand sides of a batch handed over in full (named already), in a
/// program built around the batch and the text copy; its buffers go back into the batch, for
/// the reader to fill again.
fn write(
    namer: &mut Namer,
    live: &mut Builder,
    Writer { body, first, blobs }: &mut Writer,
    f: &mut Full,
    layout: &Layout,
) {
    namer.lend(|text, parts| {
        let p = Program {
            text,
            blobs: std::mem::take(blobs),
            args: std::mem::take(&mut f.args),
            wide: std::mem::take(&mut f.wide),
            graphs: vec![Graph {
                nodes: std::mem::take(&mut f.nodes),
            }],
            ..Program::default()
        };
        let nodes = &p.graphs[0].nodes;
        for node in nodes {
            live.push(node.op == Op::Output);
            p.for_each_ref(node.all_args(), &mut |i| live.mark(i));
        }
        let names = parts.over(&p.text);
        body.write(&p, layout, &names, nodes, *first);
        *first += nodes.len() as u32;
        let parts = names.into_parts();
        let Program {
            text,
            blobs: b,
            args,
            wide,
            mut graphs,
            ..
        } = p;
        *blobs = b;
        (f.args, f.wide) = (args, wide);
        f.nodes = graphs.pop().map(|g| g.nodes).unwrap_or_default();
        (text, parts, ())
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emit::Style;
    use crate::ir::{Arg, Op, Program, Target};
    use crate::names::{self, Reserved};
    use crate::{liveness, Layout};

    /// Two graphs whose names need every kind of renaming: taken, reserved, keywords,
    /// builtins, the entry function, the layout prefix, non-identifiers, empty, repeats (also of
    /// an earlier rename's result); values used far ahead and by the output.
    fn awkward() -> Program {
        let mut p = Program::default();
        let odd = [
            "x",
            "torch",
            "del",
            "sum",
            "execution_fn",
            "__fx_s0",
            "__vllm_a",
            "a-b",
            "1st",
            "",
            "é",
            "x",
            "torch_1",
            "v",
            "v",
            "x_1",
            "operator",
            "None",
            "match",
            "ok",
        ];
        for _ in 0..2 {
            let g = p.add_graph();
            let x = p.add_placeholder(g, "x", None);
            let mut prev = x;
            let mut nodes = vec![x];
            for (k, name) in odd.iter().cycle().take(300).enumerate() {
                let far = nodes[k * 7 % nodes.len()];
                let l = p.list(&[Arg::Node(far), Arg::Int(k as i64)]);
                let kw = [("to", Arg::Node(prev))];
                let t = Target::Name(p.push_str("operator.add"));
                prev = p.add_node(g, Op::CallFunction, name, t, &[Arg::Node(prev), l], &kw);
                nodes.push(prev);
            }
            p.add_output(g, Arg::Node(prev));
        }
        p
    }

    /// The batches the reader would hand over: graphs interleaved, of varying sizes.
    fn batches(p: &Program) -> Vec<Batch> {
        let mut out = Vec::new();
        let mut at = vec![0usize; p.graphs.len()];
        let mut step = 1;
        while at.iter().zip(&p.graphs).any(|(&a, g)| a < g.nodes.len()) {
            for (gi, g) in p.graphs.iter().enumerate() {
                let mut b = Batch::default();
                b.reset(gi as u32, g.nodes.len());
                for node in g.nodes.iter().skip(at[gi]).take(step) {
                    b.text.push_str(p.str(node.name));
                    let mut refs = Vec::new();
                    p.for_each_ref(node.all_args(), &mut |i| refs.push(i));
                    b.push(node.name, node.op == Op::Output, &refs);
                    at[gi] += 1;
                }
                if !b.nodes.is_empty() {
                    out.push(b);
                }
            }
            step = step % 97 + 13;
        }
        out
    }

    #[test]
    fn streamed_names_and_last_uses_equal_the_computed_ones() {
        let p = awkward();
        p.validate().expect("valid");
        for style in [Style::Native, Style::Vllm] {
            let layout = Layout {
                style,
                ..Layout::native()
            };
            let reserved = Reserved {
                prefix: style.prefix(),
                fn_name: layout.fn_name,
            };
            let mut s = Streams::new(style.prefix(), layout.fn_name, layout.header);
            for mut b in batches(&p) {
                s.take(&mut b);
            }
            let streamed = s.finish();
            assert_eq!(streamed.len(), p.graphs.len());
            for st in streamed {
                let g = &p.graphs[st.graph as usize];
                let want = names::assign(&p, g, &reserved);
                let got = st.names.over(&p.text);
                let all = |n: &names::Names| -> Vec<String> {
                    (0..g.nodes.len() as u32)
                        .map(|i| n.get(i).to_string())
                        .collect()
                };
                assert_eq!(all(&got), all(&want));
                assert!(
                    all(&got).contains(&"torch_1_1".to_string()),
                    "renames happened"
                );
                assert_eq!(st.live, liveness::compute(&p, g));
            }
        }
    }
}
