//! The node list: a program of graphs (the root plus inlined children) in flat arenas.
//!
//! Strings live in one byte arena and arguments in one arena of 4-byte slots, so reading a
//! graph allocates per arena growth, not per node. A `Program` that passed [`Program::validate`]
//! can always be emitted.

use crate::error::{Error, Result};
use crate::names;

/// A range in one of the arenas: `start..start + len`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Span {
    pub start: u32,
    pub len: u32,
}

impl Span {
    /// The span a [`Program::wide`] entry holds: start in the low half, length in the high.
    #[inline(always)]
    fn from_wide(w: u64) -> Span {
        Span {
            start: w as u32,
            len: (w >> 32) as u32,
        }
    }

    #[inline(always)]
    fn to_wide(self) -> u64 {
        self.start as u64 | (self.len as u64) << 32
    }

    pub fn range(self) -> std::ops::Range<usize> {
        self.start as usize..(self.start + self.len) as usize
    }
}

/// One argument value. Containers point at their elements in [`Program::args`]; a dict's span
/// holds `2 * n` entries, key then value. The arena stores each as a 4-byte [`Slot`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arg {
    /// The value of an earlier node of the same graph.
    Node(u32),
    None,
    Bool(bool),
    Int(i64),
    /// An int beyond i64, as decimal text (`-?[0-9]+`) in [`Program::text`].
    BigInt(Span),
    Float(f64),
    /// Text in [`Program::text`].
    Str(Span),
    /// Raw bytes in [`Program::blobs`].
    Bytes(Span),
    /// A constant-pool slot.
    Const(u32),
    Tuple(Span),
    List(Span),
    Dict(Span),
}

/// An argument as [`Program::args`] stores it: 4 bytes instead of [`Arg`]'s 16, a quarter of
/// the arena (the largest part of the node list: 5.5 arguments per node on a stitching graph).
///
/// The low 4 bits are a tag, the high 28 a payload: a node or constant index, a bool, an int
/// that fits in 28 bits, the top 28 bits of a float whose other 36 are zero (0.5, 1.0 and inf
/// are; 1e-3 is not), or an index into [`Program::wide`], which holds the rest: every span
/// (`start | len << 32`; a keyword's key is one span for all the nodes that use it), other ints
/// and floats, and indices of 2^28 or more. [`Program::arg`] turns a slot back into an [`Arg`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Slot(u32);

mod tag {
    /// Not 0: reserved slots are filled with `NONE`, and a fill of zeros became a `memset`
    /// call per container (slower than the store loop on one to four slots).
    pub const NONE: u32 = 1;
    pub const NODE: u32 = 0;
    pub const BOOL: u32 = 2;
    pub const INT: u32 = 3;
    pub const FLOAT: u32 = 4;
    pub const CONST: u32 = 5;
    // The payload of the tags below is an index into `wide`.
    /// An i64.
    pub const WIDE_INT: u32 = 6;
    /// An f64's bits.
    pub const WIDE_FLOAT: u32 = 7;
    pub const BIG_INT: u32 = 8;
    pub const STR: u32 = 9;
    pub const BYTES: u32 = 10;
    pub const TUPLE: u32 = 11;
    pub const LIST: u32 = 12;
    pub const DICT: u32 = 13;
    /// A node index of 2^28 or more.
    pub const WIDE_NODE: u32 = 14;
    /// A constant index of 2^28 or more.
    pub const WIDE_CONST: u32 = 15;
}

/// Payloads (and [`Program::wide`]'s length) stay under this.
pub const PAYLOAD_LIMIT: u32 = 1 << 28;

impl Slot {
    #[inline(always)]
    fn tag(self) -> u32 {
        self.0 & 15
    }

    #[inline(always)]
    fn payload(self) -> u32 {
        self.0 >> 4
    }

    /// `payload` must be under [`PAYLOAD_LIMIT`].
    #[inline(always)]
    fn of(tag: u32, payload: u32) -> Slot {
        Slot(tag | payload << 4)
    }

    /// The node this slot refers to, if it does (read without unpacking: the common case).
    #[inline(always)]
    pub fn node(self) -> Option<u32> {
        (self.tag() == tag::NODE).then_some(self.payload())
    }

    /// The int this slot holds itself, if it does.
    #[inline(always)]
    pub fn int(self) -> Option<i64> {
        (self.tag() == tag::INT).then_some((self.0 as i32 >> 4) as i64)
    }
}

/// The torch.fx node kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Placeholder,
    CallModule,
    CallFunction,
    CallMethod,
    GetAttr,
    Output,
}

impl Op {
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Placeholder => "placeholder",
            Op::CallModule => "call_module",
            Op::CallFunction => "call_function",
            Op::CallMethod => "call_method",
            Op::GetAttr => "get_attr",
            Op::Output => "output",
        }
    }
}

/// What a node calls or names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// output
    None,
    /// placeholder: the parameter's name in the traced signature (text).
    Param(Span),
    /// call_module: an index into [`Program::submods`].
    Submod(u32),
    /// call_function written by a dotted name that resolves where the code runs (text).
    Name(Span),
    /// call_function `operator.getitem`, written as a subscript.
    Getitem,
    /// call_function through the pool, or get_attr's attribute object.
    Const(u32),
    /// call_method: the method name (text).
    Method(Span),
}

/// One node: 32 bytes. `args` is a span of [`Program::args`]; the keyword arguments follow it
/// there ([`Node::kwargs`]) as `key, value` pairs where a key is `Str`, or `Const` for a key
/// text cannot hold (a lone surrogate).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Node {
    pub op: Op,
    pub name: Span,
    pub target: Target,
    pub args: Span,
    /// How many keyword arguments follow `args` (at most [`MAX_KWARGS`]).
    pub n_kwargs: u16,
}

/// The most keyword arguments a node may have.
pub const MAX_KWARGS: usize = u16::MAX as usize;

impl Node {
    /// The keyword arguments' span: `2 * n_kwargs` slots right after `args`.
    #[inline(always)]
    pub fn kwargs(&self) -> Span {
        Span {
            start: self.args.start.wrapping_add(self.args.len),
            len: 2 * self.n_kwargs as u32,
        }
    }

    /// The positional and keyword arguments' slots together (`args`, then `kwargs`).
    #[inline(always)]
    pub fn all_args(&self) -> Span {
        Span {
            start: self.args.start,
            len: self.args.len.wrapping_add(2 * self.n_kwargs as u32),
        }
    }
}

/// How a child module is called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SubmodKind {
    /// An opaque callable bound at compile time.
    Opaque,
    /// A plain graph module inlined as a nested function: the index of its graph.
    Inline(u32),
}

/// A child called by `call_module`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Submod {
    pub name: Span,
    pub kind: SubmodKind,
}

/// One function's nodes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Graph {
    pub nodes: Vec<Node>,
}

/// The deepest container nesting accepted anywhere (live graphs and serialized input).
pub const MAX_DEPTH: usize = 64;

/// Graphs, children and arenas: everything the emitter reads.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Program {
    /// Every text of the program (names, targets, str values): valid UTF-8 by construction, so
    /// a text span needs only a bounds and char-boundary check.
    pub text: String,
    /// The contents of `bytes` values.
    pub blobs: Vec<u8>,
    /// Elements of every container and every node's args and kwargs (read them with
    /// [`Program::arg`], write them with [`Program::push_args`] or [`Program::set_arg`]).
    pub args: Vec<Slot>,
    /// What a [`Slot`] cannot hold itself: wide ints, most floats' bits, very long spans.
    pub wide: Vec<u64>,
    /// `graphs[0]` is the root; an inlined child's graph always has a larger index than its caller.
    pub graphs: Vec<Graph>,
    /// Children in order of first call; `submod_names[i]` of the public API.
    pub submods: Vec<Submod>,
    /// The number of constant-pool slots.
    pub n_consts: u32,
}

impl Program {
    /// Drops the program, handing the pages of its arenas back to the system first (memory
    /// freed in the middle of a call would otherwise stay resident until its end).
    pub fn discard(self) {
        use crate::helper::discard;
        discard(self.text.into_bytes());
        discard(self.blobs);
        discard(self.args);
        discard(self.wide);
        discard(self.submods);
        for g in self.graphs {
            discard(g.nodes);
        }
    }

    /// Text of a span created by [`Program::push_str`] ("" for a span that is not one, which
    /// [`Program::validate`] rejects).
    pub fn str(&self, s: Span) -> &str {
        self.text.get(s.range()).unwrap_or("")
    }

    /// Bytes of a span created by [`Program::push_bytes`].
    pub fn raw(&self, s: Span) -> &[u8] {
        self.blobs.get(s.range()).unwrap_or(&[])
    }

    pub fn push_bytes(&mut self, b: &[u8]) -> Span {
        let start = self.blobs.len() as u32;
        self.blobs.extend_from_slice(b);
        Span {
            start,
            len: b.len() as u32,
        }
    }

    pub fn push_str(&mut self, s: &str) -> Span {
        let start = self.text.len() as u32;
        self.text.push_str(s);
        Span {
            start,
            len: s.len() as u32,
        }
    }

    /// Argument `k` of the arena (`None` for a slot [`Program::validate`] rejects).
    #[inline(always)]
    pub fn arg(&self, k: usize) -> Arg {
        self.unpack(self.args[k])
    }

    /// The slots of the arguments in `s`.
    #[inline(always)]
    pub fn slots(&self, s: Span) -> &[Slot] {
        &self.args[s.range()]
    }

    /// Sets argument `k` of the arena.
    #[inline(always)]
    pub fn set_arg(&mut self, k: usize, a: Arg) {
        self.args[k] = self.pack(a);
    }

    /// The slot that stores `a`, adding to [`Program::wide`] what does not fit. Nodes, ints
    /// and floats are packed inline in the caller, the rest out of line.
    #[inline(always)]
    pub fn pack(&mut self, a: Arg) -> Slot {
        match a {
            Arg::Node(i) if i < PAYLOAD_LIMIT => Slot::of(tag::NODE, i),
            Arg::Int(v) if (v << 36) >> 36 == v => Slot((v as u32) << 4 | tag::INT),
            Arg::Float(v) if v.to_bits() << 28 == 0 => {
                Slot((v.to_bits() >> 32) as u32 | tag::FLOAT)
            }
            _ => self.pack_rest(a),
        }
    }

    /// [`Program::pack`] for what it does not settle inline.
    #[inline(never)]
    fn pack_rest(&mut self, a: Arg) -> Slot {
        match a {
            Arg::None => Slot(tag::NONE),
            Arg::Bool(b) => Slot::of(tag::BOOL, b as u32),
            Arg::Const(k) if k < PAYLOAD_LIMIT => Slot::of(tag::CONST, k),
            Arg::Node(i) => self.wide_slot(tag::WIDE_NODE, i as u64),
            Arg::Const(k) => self.wide_slot(tag::WIDE_CONST, k as u64),
            Arg::Int(v) => self.wide_slot(tag::WIDE_INT, v as u64),
            Arg::Float(v) => self.wide_slot(tag::WIDE_FLOAT, v.to_bits()),
            Arg::BigInt(s) => self.wide_slot(tag::BIG_INT, s.to_wide()),
            Arg::Str(s) => self.wide_slot(tag::STR, s.to_wide()),
            Arg::Bytes(s) => self.wide_slot(tag::BYTES, s.to_wide()),
            Arg::Tuple(s) => self.wide_slot(tag::TUPLE, s.to_wide()),
            Arg::List(s) => self.wide_slot(tag::LIST, s.to_wide()),
            Arg::Dict(s) => self.wide_slot(tag::DICT, s.to_wide()),
        }
    }

    /// A slot of tag `t` for `w`, added to [`Program::wide`]. Its index is cut to 28 bits:
    /// [`Program::fits`] says whether any was.
    #[inline(never)]
    fn wide_slot(&mut self, t: u32, w: u64) -> Slot {
        self.wide.push(w);
        Slot::of(t, (self.wide.len() - 1) as u32 & (PAYLOAD_LIMIT - 1))
    }

    /// Whether every slot's index into [`Program::wide`] is whole (the wide table has at most
    /// 2^28 entries: 2 GiB of them). Readers check it before handing a program on.
    pub fn fits(&self) -> bool {
        self.wide.len() <= PAYLOAD_LIMIT as usize
    }

    /// The span a wide entry holds.
    #[inline(always)]
    fn wide_span(&self, s: Slot) -> Option<Span> {
        self.wide
            .get(s.payload() as usize)
            .map(|&w| Span::from_wide(w))
    }

    /// The argument `s` stores; `None` for a slot [`Program::validate`] rejects.
    #[inline(always)]
    pub fn unpack(&self, s: Slot) -> Arg {
        match s.tag() {
            tag::NODE => Arg::Node(s.payload()),
            tag::INT => Arg::Int((s.0 as i32 >> 4) as i64),
            tag::FLOAT => Arg::Float(f64::from_bits(((s.0 & !15) as u64) << 32)),
            tag::CONST => Arg::Const(s.payload()),
            tag::BOOL => Arg::Bool(s.payload() != 0),
            tag::NONE => Arg::None,
            _ => self.unpack_wide(s),
        }
    }

    /// The elements of the tuple, list or dict `s` holds, if it holds one.
    #[inline(always)]
    pub fn container(&self, s: Slot) -> Option<Span> {
        match s.tag() {
            tag::TUPLE | tag::LIST | tag::DICT => self.wide_span(s),
            _ => None,
        }
    }

    /// The text span of the str `s` holds, if it holds one.
    #[inline(always)]
    pub fn str_span(&self, s: Slot) -> Option<Span> {
        match s.tag() {
            tag::STR => self.wide_span(s),
            _ => None,
        }
    }

    #[inline(never)]
    fn unpack_wide(&self, s: Slot) -> Arg {
        let Some(&w) = self.wide.get(s.payload() as usize) else {
            return Arg::None;
        };
        let span = Span::from_wide(w);
        match s.tag() {
            tag::WIDE_INT => Arg::Int(w as i64),
            tag::WIDE_FLOAT => Arg::Float(f64::from_bits(w)),
            tag::BIG_INT => Arg::BigInt(span),
            tag::STR => Arg::Str(span),
            tag::BYTES => Arg::Bytes(span),
            tag::TUPLE => Arg::Tuple(span),
            tag::LIST => Arg::List(span),
            tag::DICT => Arg::Dict(span),
            tag::WIDE_NODE => u32::try_from(w).map_or(Arg::None, Arg::Node),
            tag::WIDE_CONST => u32::try_from(w).map_or(Arg::None, Arg::Const),
            _ => Arg::None,
        }
    }

    /// Whether `a`, which [`Program::unpack`] read from `s`, is what `s` was packed from: an
    /// unknown tag or an index past [`Program::wide`] unpacks to a `None` not packed as one.
    fn unpacked_ok(s: Slot, a: Arg) -> bool {
        a != Arg::None || s.tag() == tag::NONE
    }

    /// Reserves `n` argument slots (filled later with [`Program::set_arg`]).
    pub fn reserve_args(&mut self, n: usize) -> Span {
        let start = self.args.len() as u32;
        self.args.resize(self.args.len() + n, Slot(tag::NONE));
        Span {
            start,
            len: n as u32,
        }
    }

    pub fn push_args(&mut self, items: &[Arg]) -> Span {
        let start = self.args.len() as u32;
        self.args.reserve(items.len());
        for &a in items {
            let slot = self.pack(a);
            self.args.push(slot);
        }
        Span {
            start,
            len: items.len() as u32,
        }
    }

    pub fn tuple(&mut self, items: &[Arg]) -> Arg {
        Arg::Tuple(self.push_args(items))
    }

    pub fn list(&mut self, items: &[Arg]) -> Arg {
        Arg::List(self.push_args(items))
    }

    pub fn dict(&mut self, items: &[(Arg, Arg)]) -> Arg {
        let flat: Vec<Arg> = items.iter().flat_map(|(k, v)| [*k, *v]).collect();
        Arg::Dict(self.push_args(&flat))
    }

    /// Appends a graph and returns its index (the first one added is the root).
    pub fn add_graph(&mut self) -> u32 {
        self.graphs.push(Graph::default());
        self.graphs.len() as u32 - 1
    }

    /// Appends a child module and returns its submodule index.
    pub fn add_submod(&mut self, name: &str, kind: SubmodKind) -> u32 {
        let name = self.push_str(name);
        self.submods.push(Submod { name, kind });
        self.submods.len() as u32 - 1
    }

    /// Appends a node to graph `g` and returns its index in that graph.
    pub fn add_node(
        &mut self,
        g: u32,
        op: Op,
        name: &str,
        target: Target,
        args: &[Arg],
        kwargs: &[(&str, Arg)],
    ) -> u32 {
        let kwargs: Vec<(Arg, Arg)> = kwargs
            .iter()
            .map(|(k, v)| (Arg::Str(self.push_str(k)), *v))
            .collect();
        self.add_node_kw(g, op, name, target, args, &kwargs)
    }

    /// [`Program::add_node`] with the keyword keys given as arguments: `Str` spans, which nodes
    /// may share (the reader gives every key object one span), or a `Const` slot. Panics beyond
    /// [`MAX_KWARGS`] keyword arguments (the readers refuse such nodes with an error).
    pub fn add_node_kw(
        &mut self,
        g: u32,
        op: Op,
        name: &str,
        target: Target,
        args: &[Arg],
        kwargs: &[(Arg, Arg)],
    ) -> u32 {
        let name = self.push_str(name);
        let args = self.push_args(args);
        let kw: Vec<Arg> = kwargs.iter().flat_map(|&(k, v)| [k, v]).collect();
        self.push_args(&kw);
        let nodes = &mut self.graphs[g as usize].nodes;
        nodes.push(Node {
            op,
            name,
            target,
            args,
            n_kwargs: u16::try_from(kwargs.len()).expect("at most MAX_KWARGS keyword arguments"),
        });
        nodes.len() as u32 - 1
    }

    /// Appends a placeholder named `name` (its parameter name too), with an optional default.
    pub fn add_placeholder(&mut self, g: u32, name: &str, default: Option<Arg>) -> u32 {
        let param = self.push_str(name);
        let args: &[Arg] = match &default {
            Some(d) => std::slice::from_ref(d),
            None => &[],
        };
        self.add_node(g, Op::Placeholder, name, Target::Param(param), args, &[])
    }

    /// Appends graph `g`'s output node, returning `value`.
    pub fn add_output(&mut self, g: u32, value: Arg) -> u32 {
        self.add_node(g, Op::Output, "output", Target::None, &[value], &[])
    }

    pub fn submod_name(&self, i: u32) -> &str {
        self.str(self.submods[i as usize].name)
    }

    /// A human-readable target, for error messages.
    pub fn target_text(&self, t: Target) -> String {
        match t {
            Target::None => "None".into(),
            Target::Param(s) | Target::Name(s) | Target::Method(s) => self.str(s).into(),
            Target::Submod(i) => self
                .submods
                .get(i as usize)
                .map(|s| self.str(s.name).to_string())
                .unwrap_or_else(|| format!("<submodule {i}>")),
            Target::Getitem => "operator.getitem".into(),
            Target::Const(k) => format!("<constant {k}>"),
        }
    }

    /// The error naming `node`.
    pub fn node_error(&self, node: &Node, reason: impl Into<String>) -> Error {
        Error::Node {
            op: node.op.as_str().into(),
            name: self.str(node.name).into(),
            target: self.target_text(node.target),
            reason: reason.into(),
        }
    }

    /// Calls `f` on every node reference inside `span` (containers included): the top level
    /// inline in the caller, containers out of line.
    #[inline(always)]
    pub fn for_each_ref(&self, span: Span, f: &mut impl FnMut(u32)) {
        for &a in self.slots(span) {
            if let Some(i) = a.node() {
                f(i);
            } else if let Some(s) = self.container(a) {
                self.for_each_nested_ref(s, f);
            }
        }
    }

    #[inline(never)]
    fn for_each_nested_ref(&self, span: Span, f: &mut impl FnMut(u32)) {
        self.for_each_ref(span, f);
    }

    /// [`Program::validate`] plus the rules for programs from untrusted bytes: call names
    /// limited to `torch.ops`, safe `operator` functions and safe builtins, and no method whose
    /// name starts with `_` (no dunder access).
    pub fn validate_untrusted(&self) -> Result<()> {
        self.validate()?;
        for g in &self.graphs {
            for node in &g.nodes {
                match node.target {
                    Target::Name(s) => {
                        names::check_untrusted_call_name(self.str(s))
                            .map_err(|why| self.node_error(node, why))?;
                    }
                    Target::Method(s) if self.str(s).starts_with('_') => {
                        return Err(self.node_error(
                            node,
                            "methods starting with '_' are not allowed in untrusted input",
                        ));
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// Checks every rule the emitter relies on; a program that passes emits valid Python.
    pub fn validate(&self) -> Result<()> {
        if self.graphs.is_empty() {
            return Err(Error::Invalid("the program has no graph".into()));
        }
        for sm in &self.submods {
            check_span(self, sm.name)?;
            if let SubmodKind::Inline(g) = sm.kind {
                if g == 0 || g as usize >= self.graphs.len() {
                    return Err(Error::Invalid(format!(
                        "submodule {:?} inlines graph {g}, which does not exist",
                        self.str(sm.name)
                    )));
                }
            }
        }
        for (gi, g) in self.graphs.iter().enumerate() {
            self.validate_graph(gi as u32, g)?;
        }
        Ok(())
    }

    fn validate_graph(&self, gi: u32, g: &Graph) -> Result<()> {
        self.check_shapes(gi)?;
        for (j, node) in g.nodes.iter().enumerate() {
            self.validate_args(node, node.args, j as u32, &g.nodes, 0)?;
            for k in node.kwargs().range().step_by(2) {
                match self.arg(k) {
                    Arg::Str(s) => check_span(self, s)?,
                    Arg::Const(c) if c < self.n_consts => {}
                    _ => {
                        return Err(
                            self.node_error(node, "a keyword argument's key is not a string")
                        )
                    }
                }
            }
            self.validate_args(node, node.kwargs(), j as u32, &g.nodes, 0)?;
        }
        Ok(())
    }

    /// The per-node rules that do not look inside arguments: op/target agreement, names,
    /// placeholder defaults, output position, spans in range. A reader that builds arguments
    /// only from earlier nodes, existing pool slots and its own strings (the torch.fx reader)
    /// needs only this; [`Program::validate`] adds the argument checks.
    pub fn check_shapes(&self, gi: u32) -> Result<()> {
        self.check_nodes(gi, &self.graphs[gi as usize].nodes, &mut false, true)
    }

    /// [`Program::check_shapes`] for `nodes`, the next nodes of graph `gi` (whose arguments
    /// are in this program), read in batches: `seen_default` carries over from the batch
    /// before, and `last` says whether this is the last batch.
    pub fn check_nodes(
        &self,
        gi: u32,
        nodes: &[Node],
        seen_default: &mut bool,
        last: bool,
    ) -> Result<()> {
        if !self.fits() {
            return Err(Error::Invalid(
                "out-of-line arguments: more than 2^28 in a graph".into(),
            ));
        }
        // Call names repeat across nodes: check each distinct text once. Readers share one span
        // per call target, so spans checked lately are recognised without hashing the text.
        let mut good_names: rustc_hash::FxHashSet<&str> = rustc_hash::FxHashSet::default();
        let mut good_spans = [Span::default(); 16];
        for (j, node) in nodes.iter().enumerate() {
            check_span(self, node.name)?;
            let bad = |why: String| self.node_error(node, why);
            if node.args.start as usize + node.args.len as usize + 2 * node.n_kwargs as usize
                > self.args.len()
            {
                return Err(bad("argument span out of range".into()));
            }
            match (node.op, node.target) {
                (Op::Placeholder, Target::Param(p)) => {
                    check_span(self, p)?;
                    if self.str(p).starts_with('*') {
                        return Err(bad("variadic placeholders are not supported".into()));
                    }
                    if node.args.len > 1 || node.n_kwargs > 0 {
                        return Err(bad("a placeholder takes at most one default".into()));
                    }
                    if node.args.len == 1 {
                        *seen_default = true;
                    } else if *seen_default {
                        return Err(bad(
                            "a placeholder without default follows one with a default".into(),
                        ));
                    }
                }
                (Op::CallModule, Target::Submod(i)) => match self.submods.get(i as usize) {
                    None => return Err(bad(format!("submodule index {i} does not exist"))),
                    Some(Submod {
                        kind: SubmodKind::Inline(c),
                        ..
                    }) if *c <= gi => {
                        return Err(bad("an inlined child must come after its caller".into()))
                    }
                    _ => {}
                },
                (Op::CallFunction, Target::Name(s)) => {
                    let recent = &mut good_spans[s.start as usize % 16];
                    if *recent != s || s.len == 0 {
                        check_span(self, s)?;
                        let text = self.str(s);
                        if !good_names.contains(text) {
                            names::check_call_name(text).map_err(bad)?;
                            good_names.insert(text);
                        }
                        *recent = s;
                    }
                }
                (Op::CallFunction, Target::Getitem) => {}
                (Op::CallFunction | Op::GetAttr, Target::Const(k)) => {
                    if k >= self.n_consts {
                        return Err(bad(format!("constant {k} is outside the pool")));
                    }
                }
                (Op::CallMethod, Target::Method(s)) => {
                    check_span(self, s)?;
                    if !names::is_identifier(self.str(s).as_bytes())
                        || names::is_keyword(self.str(s))
                    {
                        return Err(bad("the method name is not a Python identifier".into()));
                    }
                    if node.args.len == 0 {
                        return Err(bad("call_method needs the object as first argument".into()));
                    }
                }
                (Op::Output, Target::None) => {
                    if j + 1 != nodes.len() || !last {
                        return Err(bad("the output node must be the last node".into()));
                    }
                    if node.args.len > 1 || node.n_kwargs > 0 {
                        return Err(bad("the output node takes one argument".into()));
                    }
                }
                (op, _) => {
                    return Err(bad(format!("target kind does not fit op {}", op.as_str())));
                }
            }
            if node.op == Op::GetAttr && (node.args.len > 0 || node.n_kwargs > 0) {
                return Err(bad("get_attr takes no arguments".into()));
            }
        }
        Ok(())
    }

    fn validate_args(
        &self,
        node: &Node,
        span: Span,
        pos: u32,
        nodes: &[Node],
        depth: usize,
    ) -> Result<()> {
        if depth > MAX_DEPTH {
            return Err(self.node_error(node, "arguments nest too deeply"));
        }
        for &slot in self.slots(span) {
            let a = self.unpack(slot);
            if !Self::unpacked_ok(slot, a) {
                return Err(self.node_error(node, "malformed argument slot"));
            }
            match a {
                Arg::Node(i) if i >= pos || nodes[i as usize].op == Op::Output => {
                    return Err(self.node_error(
                        node,
                        format!("argument refers to node #{i}, which is not an earlier value"),
                    ));
                }
                Arg::BigInt(s) => {
                    check_span(self, s)?;
                    let t = self.str(s).as_bytes();
                    let digits = t.strip_prefix(b"-").unwrap_or(t);
                    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
                        return Err(self.node_error(node, "malformed integer text"));
                    }
                }
                Arg::Str(s) => check_span(self, s)?,
                Arg::Bytes(s) if s.range().end > self.blobs.len() => {
                    return Err(self.node_error(node, "bytes span out of range"))
                }
                Arg::Const(k) if k >= self.n_consts => {
                    return Err(self.node_error(node, format!("constant {k} is outside the pool")))
                }
                Arg::Tuple(s) | Arg::List(s) | Arg::Dict(s) => {
                    if s.range().end > self.args.len()
                        || (matches!(a, Arg::Dict(_)) && s.len % 2 != 0)
                    {
                        return Err(self.node_error(node, "container span out of range"));
                    }
                    self.validate_args(node, s, pos, nodes, depth + 1)?;
                }
                _ => {}
            }
        }
        Ok(())
    }
}

fn check_span(p: &Program, s: Span) -> Result<()> {
    match p.text.get(s.range()) {
        Some(_) => Ok(()),
        None => Err(Error::Invalid(
            "text span out of range or not on character boundaries".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bits of a float, so NaNs compare.
    fn same(a: Arg, b: Arg) -> bool {
        match (a, b) {
            (Arg::Float(x), Arg::Float(y)) => x.to_bits() == y.to_bits(),
            _ => a == b,
        }
    }

    #[test]
    fn slots_hold_every_argument() {
        assert_eq!(std::mem::size_of::<Slot>(), 4);
        assert_eq!(std::mem::size_of::<Node>(), 32);
        let span = |start, len| Span { start, len };
        let mut args = vec![Arg::None, Arg::Bool(false), Arg::Bool(true)];
        for i in [0, 1, PAYLOAD_LIMIT - 1, PAYLOAD_LIMIT, u32::MAX] {
            args.extend([Arg::Node(i), Arg::Const(i)]);
        }
        let limit = 1i64 << 27;
        for v in [
            0,
            -1,
            7,
            limit - 1,
            -limit,
            limit,
            -limit - 1,
            i64::MAX,
            i64::MIN,
        ] {
            args.push(Arg::Int(v));
        }
        for v in [0.0, -0.0, 0.5, 1e-5, 1e300, f64::INFINITY, f64::NAN] {
            args.extend([Arg::Float(v), Arg::Float(-v)]);
        }
        args.extend(
            [
                f64::from_bits(1),
                f64::from_bits(1 << 36),
                f64::from_bits(1 << 35),
                f64::from_bits(u64::MAX),
            ]
            .map(Arg::Float),
        );
        for s in [span(0, 0), span(u32::MAX, u32::MAX)] {
            args.extend([
                Arg::BigInt(s),
                Arg::Str(s),
                Arg::Bytes(s),
                Arg::Tuple(s),
                Arg::List(s),
                Arg::Dict(s),
            ]);
        }
        let mut p = Program::default();
        let at = p.push_args(&args);
        for (k, &slot) in p.slots(at).iter().enumerate() {
            let a = p.unpack(slot);
            assert!(same(a, args[k]), "{:?} came back as {a:?}", args[k]);
            assert!(Program::unpacked_ok(slot, a));
        }
        // Node and constant indices of 2^28 or more (2 each), ints beyond 28 bits (4), floats
        // with any of their low 36 bits set (±1e-5, ±1e300, three bit patterns; ±NaN's
        // quiet bit is the top mantissa bit), every span (two of each of six kinds).
        assert_eq!(p.wide.len(), 4 + 4 + 7 + 2 * 6);
        assert!(p.fits());
    }

    #[test]
    fn malformed_slots_are_rejected() {
        // An index past `wide`, and wide entries that do not hold an index.
        for (bad, w) in [
            (Slot::of(tag::WIDE_INT, 1), 0),
            (Slot::of(tag::STR, 1), 0),
            (Slot::of(tag::WIDE_NODE, 0), u64::MAX),
            (Slot::of(tag::WIDE_CONST, 0), 1 << 32),
        ] {
            let mut p = Program::default();
            p.wide.push(w);
            let g = p.add_graph();
            let node = p.add_node(g, Op::CallFunction, "f", Target::Getitem, &[], &[]);
            let start = p.args.len() as u32;
            p.args.extend([Slot(tag::NONE), bad, Slot(tag::NONE)]);
            p.graphs[g as usize].nodes[node as usize].args = Span { start, len: 3 };
            let e = p.validate().unwrap_err().to_string();
            assert!(
                e.contains("malformed argument") && e.contains("\"f\""),
                "{e}"
            );
            assert_eq!(p.unpack(bad), Arg::None);
        }
    }
}
