//! The node list: a program of graphs (the root plus inlined children) in flat arenas.
//!
//! Strings live in one byte arena and container arguments in one argument arena, so reading a
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
    pub fn range(self) -> std::ops::Range<usize> {
        self.start as usize..(self.start + self.len) as usize
    }
}

/// One argument value. Containers point at their elements in [`Program::args`]; a dict's span
/// holds `2 * n` entries, key then value.
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

/// One node; `args` and `kwargs` are spans of [`Program::args`], kwargs as `key, value` pairs
/// where a key is `Str`, or `Const` for a key text cannot hold (a lone surrogate).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Node {
    pub op: Op,
    pub name: Span,
    pub target: Target,
    pub args: Span,
    pub kwargs: Span,
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
    /// Elements of every container and every node's args and kwargs.
    pub args: Vec<Arg>,
    /// `graphs[0]` is the root; an inlined child's graph always has a larger index than its caller.
    pub graphs: Vec<Graph>,
    /// Children in order of first call; `submod_names[i]` of the public API.
    pub submods: Vec<Submod>,
    /// The number of constant-pool slots.
    pub n_consts: u32,
}

impl Program {
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

    /// Reserves `n` argument slots (filled later with [`Program::args`] writes).
    pub fn reserve_args(&mut self, n: usize) -> Span {
        let start = self.args.len() as u32;
        self.args.resize(self.args.len() + n, Arg::None);
        Span {
            start,
            len: n as u32,
        }
    }

    pub fn push_args(&mut self, items: &[Arg]) -> Span {
        let start = self.args.len() as u32;
        self.args.extend_from_slice(items);
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
    /// may share (the reader gives every key object one span), or a `Const` slot.
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
        let kwargs = self.push_args(&kw);
        let nodes = &mut self.graphs[g as usize].nodes;
        nodes.push(Node {
            op,
            name,
            target,
            args,
            kwargs,
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
        for a in &self.args[span.range()] {
            match *a {
                Arg::Node(i) => f(i),
                Arg::Tuple(s) | Arg::List(s) | Arg::Dict(s) => self.for_each_nested_ref(s, f),
                _ => {}
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
            for k in (node.kwargs.start..node.kwargs.start + node.kwargs.len).step_by(2) {
                match self.args[k as usize] {
                    Arg::Str(s) => check_span(self, s)?,
                    Arg::Const(c) if c < self.n_consts => {}
                    _ => {
                        return Err(
                            self.node_error(node, "a keyword argument's key is not a string")
                        )
                    }
                }
            }
            self.validate_args(node, node.kwargs, j as u32, &g.nodes, 0)?;
        }
        Ok(())
    }

    /// The per-node rules that do not look inside arguments: op/target agreement, names,
    /// placeholder defaults, output position, spans in range. A reader that builds arguments
    /// only from earlier nodes, existing pool slots and its own strings (the torch.fx reader)
    /// needs only this; [`Program::validate`] adds the argument checks.
    pub fn check_shapes(&self, gi: u32) -> Result<()> {
        let g = &self.graphs[gi as usize];
        let mut seen_default = false;
        // Call names repeat across nodes: check each distinct text once. Readers share one span
        // per call target, so spans checked lately are recognised without hashing the text.
        let mut good_names: rustc_hash::FxHashSet<&str> = rustc_hash::FxHashSet::default();
        let mut good_spans = [Span::default(); 16];
        for (j, node) in g.nodes.iter().enumerate() {
            check_span(self, node.name)?;
            let bad = |why: String| self.node_error(node, why);
            if node.args.range().end > self.args.len()
                || node.kwargs.range().end > self.args.len()
                || node.kwargs.len % 2 != 0
            {
                return Err(bad("argument span out of range".into()));
            }
            match (node.op, node.target) {
                (Op::Placeholder, Target::Param(p)) => {
                    check_span(self, p)?;
                    if self.str(p).starts_with('*') {
                        return Err(bad("variadic placeholders are not supported".into()));
                    }
                    if node.args.len > 1 || node.kwargs.len > 0 {
                        return Err(bad("a placeholder takes at most one default".into()));
                    }
                    if node.args.len == 1 {
                        seen_default = true;
                    } else if seen_default {
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
                    if j + 1 != g.nodes.len() {
                        return Err(bad("the output node must be the last node".into()));
                    }
                    if node.args.len > 1 || node.kwargs.len > 0 {
                        return Err(bad("the output node takes one argument".into()));
                    }
                }
                (op, _) => {
                    return Err(bad(format!("target kind does not fit op {}", op.as_str())));
                }
            }
            if node.op == Op::GetAttr && (node.args.len > 0 || node.kwargs.len > 0) {
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
        for a in &self.args[span.range()] {
            match *a {
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
