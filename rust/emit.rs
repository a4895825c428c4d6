//! The emitter: a validated [`Program`] in, Python source out, through one `String` buffer and
//! small `put*` helpers. It cannot fail: everything it relies on was checked by
//! [`crate::validate`] and [`check_layout`].

use std::rc::Rc;

use rustc_hash::FxHashMap;

use crate::error::{Error, Reason, Result};
use crate::ir::{Arg, Node, Op, Program, SubmodKind, Target};
use crate::literal;
use crate::liveness::{self, Liveness};
use crate::names::{self, Names, Reserved};
use crate::pyident;

/// The naming scheme of the generated module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    /// fxcodegen's own: submodules, constants and inlined children are module globals
    /// (`__fx_s{i}`, `__fx_c{k}`, `__fx_f{i}`).
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
    if !pyident::is_identifier(f) || pyident::is_taken(f) {
        return Err(Error::Invalid(Reason::BadFnName(f.into())));
    }
    for (gi, g) in p.graphs.iter().enumerate() {
        for node in &g.nodes {
            let (Op::CallModule, Target::Submod(i)) = (node.op, node.target) else {
                continue;
            };
            let opaque = p.submods[i as usize].kind == SubmodKind::Opaque;
            let root_banned = gi == 0 && !layout.with_submod;
            let inlined = gi > 0 && opaque && layout.style == Style::Vllm;
            if root_banned || inlined {
                let target = p.submod_name(i).into();
                let reason = Reason::CallModuleNotAllowed { target, inlined };
                return Err(Error::node(p, node, reason));
            }
        }
    }
    Ok(())
}

/// Per graph, the submodule its function is named after: the first that inlines it.
fn functions(p: &Program) -> Vec<Option<u32>> {
    let mut fn_of = vec![None; p.graphs.len()];
    for (i, sm) in p.submods.iter().enumerate() {
        if let SubmodKind::Inline(g) = sm.kind {
            fn_of[g as usize].get_or_insert(i as u32);
        }
    }
    fn_of
}

/// Emits the module source of a program that passed validation and [`check_layout`]: the
/// header, each inlined graph's function once, then the entry function.
pub fn emit(p: &Program, layout: &Layout) -> String {
    let mut e = Emitter::new(p, layout);
    if layout.header {
        e.out.push_str("import torch\nimport operator\n");
    }
    for g in 1..p.graphs.len() {
        if let Some(i) = e.fn_of[g] {
            e.out.push('\n');
            e.function(g, Some(i));
        }
    }
    e.out.push('\n');
    e.function(0, None);
    e.out
}

/// An upper bound on the length of [`emit`]'s source, found without writing it: what
/// untrusted input is checked against before any of its source is allocated.
pub fn size_bound(p: &Program, layout: &Layout) -> u64 {
    let fn_len = 40 + layout.fn_name.len() as u64;
    let mut total = 64;
    for (gi, g) in p.graphs.iter().enumerate() {
        let names = names::assign(p, &g.nodes, &layout.reserved());
        total += 2 * fn_len;
        for (j, node) in g.nodes.iter().enumerate() {
            // The statement and its `del`, at most twice the name each; the target.
            let name = names.get(j as u32).len() as u64;
            total += 24 + 3 * name;
            total += match node.target {
                Target::Param(s) | Target::Name(s) | Target::Method(s) => s.len as u64,
                _ => 40,
            };
            total += args_bound(p, p.slice(node.all_args()), &names);
            // Keys passed as identifiers of an inlined child's parameters.
            if node.op == Op::CallModule && gi + 1 < p.graphs.len() {
                total += node.kwargs as u64 * 4 * longest_name(p, layout);
            }
        }
    }
    total
}

/// About the length of a graph's statements, from its nodes alone (a pass over their
/// arguments would cost as much as writing them): more than most graphs need, and room
/// never written costs no memory.
fn size_hint(p: &Program, nodes: &[Node]) -> usize {
    let hint = |n: &Node| {
        let target = match n.target {
            Target::Param(s) | Target::Name(s) | Target::Method(s) => s.len as usize,
            _ => 12,
        };
        24 + 3 * n.name.len as usize + target + 10 * n.all_args().len as usize
    };
    let hint: usize = nodes.iter().map(hint).sum();
    hint + p.text.len() / p.graphs.len()
}

fn longest_name(p: &Program, layout: &Layout) -> u64 {
    let longest = p.graphs.iter().flat_map(|g| &g.nodes).map(|n| n.name.len);
    // Renaming adds at most a `v` or `_` and a suffix.
    longest.max().unwrap_or(0) as u64 + 24 + layout.style.prefix().len() as u64
}

/// Each argument's bound and a separator.
fn args_bound(p: &Program, args: &[Arg], names: &Names) -> u64 {
    args.iter().map(|&a| 2 + arg_bound(p, a, names)).sum()
}

fn arg_bound(p: &Program, a: Arg, names: &Names) -> u64 {
    match a {
        Arg::Node(i) => names.get(i).len() as u64,
        Arg::BigInt(k) => p.span(k).len as u64,
        Arg::Str(k) | Arg::Bytes(k) => 3 + 4 * p.span(k).len as u64,
        Arg::Tuple(k) | Arg::List(k) | Arg::Dict(k) => 3 + args_bound(p, p.items(k), names),
        _ => 40,
    }
}

/// How a generated global is written, `prefix{i}close`: native, then vLLM.
type Global = [(&'static str, &'static str); 2];
const SUBMOD: Global = [("__fx_s", ""), ("__vllm_submods__[", "]")];
const CONST: Global = [("__fx_c", ""), ("__vllm_consts__[", "]")];
const INLINED: Global = [("__fx_f", ""), ("__vllm_inlined_submods__", "")];

struct Emitter<'a> {
    /// The program being written.
    p: &'a Program,
    layout: &'a Layout<'a>,
    reserved: Reserved<'a>,
    /// The source so far, which the `put*` helpers append to.
    out: String,
    fn_of: Vec<Option<u32>>,
    /// `(traced parameter name, identifier)` of an inlined child's placeholders, by graph.
    params: FxHashMap<u32, Rc<Vec<(String, String)>>>,
    /// Float texts by bits.
    floats: FxHashMap<u64, Box<str>>,
}

/// The identifier keyword `key` is passed under, or None to pass it through `**{...}`: for an
/// inlined child (`params`), the identifier of the parameter whose traced name is `key`.
fn key_ident<'s>(
    p: &'s Program,
    params: Option<&'s [(String, String)]>,
    key: Arg,
) -> Option<&'s str> {
    let Arg::Str(k) = key else { return None };
    let key = p.str(p.span(k));
    match params {
        Some(params) => params
            .iter()
            .find(|(param, _)| param == key)
            .map(|(_, id)| id.as_str()),
        None => pyident::is_plain_name(key).then_some(key),
    }
}

/// A number, which needs parentheses as a receiver (`(1).m()`, `(1)[i]`).
fn is_number(a: Arg) -> bool {
    matches!(
        a,
        Arg::Int(_) | Arg::Long(_) | Arg::BigInt(_) | Arg::Float(_)
    )
}

fn is_call(op: Op) -> bool {
    matches!(op, Op::CallModule | Op::CallFunction | Op::CallMethod)
}

/// The node whose item `node` takes, when it is a plain `v[i]` of a node.
fn item_of(p: &Program, node: &Node) -> Option<u32> {
    match (node.op, node.target, node.args.len, node.kwargs) {
        (Op::CallFunction, Target::Getitem, 2, 0) => match p.slice(node.args)[0] {
            Arg::Node(i) => Some(i),
            _ => None,
        },
        _ => None,
    }
}

impl<'a> Emitter<'a> {
    fn new(p: &'a Program, layout: &'a Layout<'a>) -> Self {
        Emitter {
            p,
            layout,
            reserved: layout.reserved(),
            out: String::new(),
            fn_of: functions(p),
            params: FxHashMap::default(),
            floats: FxHashMap::default(),
        }
    }

    /// Appends `s` to the source.
    fn put(&mut self, s: &str) {
        self.out.push_str(s);
    }

    /// Global `i` of a kind, in the layout's style.
    fn put_global(&mut self, global: Global, i: u32) {
        let (prefix, close) = global[(self.layout.style == Style::Vllm) as usize];
        self.put(prefix);
        self.put(itoa::Buffer::new().format(i));
        self.put(close);
    }

    /// The function of inlined graph `g`.
    fn put_inline_name(&mut self, g: u32) {
        let i = self.fn_of[g as usize].unwrap_or(g);
        self.put_global(INLINED, i);
    }

    /// `def name(params):`, the statements, and `return None` when the graph has no output.
    fn function(&mut self, gi: usize, inline: Option<u32>) {
        let p = self.p;
        let nodes = &p.graphs[gi].nodes;
        let names = names::assign(p, nodes, &self.reserved);
        let live = liveness::compute(p, nodes);
        // Room for the function's source, made once: growing it would copy the source so far.
        self.out.reserve(64 + size_hint(p, nodes));
        self.put("def ");
        match inline {
            Some(_) => self.put_inline_name(gi as u32),
            None => self.put(self.layout.fn_name),
        }
        self.put("(");
        let mut first = true;
        for (j, node) in nodes.iter().enumerate() {
            if node.op != Op::Placeholder {
                continue;
            }
            if !first {
                self.put(", ");
            }
            first = false;
            self.put(names.get(j as u32));
            if let [default] = p.slice(node.args) {
                self.put("=");
                self.put_arg(*default, &names);
            }
        }
        let vllm_root = inline.is_none() && self.layout.style == Style::Vllm;
        if vllm_root && self.layout.with_submod {
            self.put(if first { "" } else { ", " });
            self.put("*, __vllm_submods__");
        }
        self.put("):\n");
        self.statements(nodes, &names, &live);
        if nodes.last().is_none_or(|n| n.op != Op::Output) {
            self.put("    return None\n");
        }
    }

    fn statements(&mut self, nodes: &[Node], names: &Names, live: &Liveness) {
        let p = self.p;
        let native = self.layout.style == Style::Native;
        let mut j = 0;
        while j < nodes.len() {
            let node = &nodes[j];
            let next = nodes.get(j + 1);
            let fuses = native
                && is_call(node.op)
                && live.once(j)
                && next.and_then(|n| item_of(p, n)) == Some(j as u32);
            if let (true, Some(next)) = (fuses, next) {
                // `b = f(...)[i]`: the call's only use is the getitem right after it, so its
                // value never gets a name (nor a `del`).
                self.put_lhs(names.get(j as u32 + 1));
                self.put_expr(node, names);
                self.put("[");
                self.put_arg(p.slice(next.args)[1], names);
                self.put("]\n");
                self.put_dels(
                    live.after(j).iter().chain(live.after(j + 1)),
                    j as u32,
                    names,
                );
                j += 2;
                continue;
            }
            match node.op {
                Op::Placeholder => {}
                Op::Output => {
                    self.put("    return ");
                    match p.slice(node.args) {
                        [value] => self.put_arg(*value, names),
                        _ => self.put("None"),
                    }
                    self.put("\n");
                }
                _ => {
                    self.put_lhs(names.get(j as u32));
                    self.put_expr(node, names);
                    self.put("\n");
                }
            }
            self.put_dels(live.after(j).iter(), u32::MAX, names);
            j += 1;
        }
    }

    fn put_lhs(&mut self, name: &str) {
        self.put("    ");
        self.put(name);
        self.put(" = ");
    }

    /// One `del` line for the values in `values`, all but `skip` (a value never bound).
    fn put_dels<'v>(&mut self, values: impl Iterator<Item = &'v u32>, skip: u32, names: &Names) {
        let mut first = true;
        for &i in values.filter(|&&i| i != skip) {
            self.put(if first { "    del " } else { ", " });
            self.put(names.get(i));
            first = false;
        }
        if !first {
            self.put("\n");
        }
    }

    /// The value a call or get_attr node computes.
    fn put_expr(&mut self, node: &Node, names: &Names) {
        let p = self.p;
        let args = p.slice(node.args);
        let kwargs = p.slice(node.kwargs());
        match (node.op, node.target) {
            (Op::GetAttr, Target::Const(k)) => self.put_global(CONST, k),
            (Op::CallModule, Target::Submod(i)) => match p.submods[i as usize].kind {
                SubmodKind::Opaque => {
                    self.put_global(SUBMOD, i);
                    self.put_call(args, kwargs, None, names);
                }
                SubmodKind::Inline(g) => {
                    self.put_inline_name(g);
                    self.put_call(args, kwargs, Some(g), names);
                }
            },
            // `None[0]`, `1[0]` compile with a SyntaxWarning: those stay calls.
            (Op::CallFunction, Target::Getitem)
                if args.len() == 2
                    && kwargs.is_empty()
                    && !matches!(args[0], Arg::None | Arg::Bool(_))
                    && !is_number(args[0]) =>
            {
                self.put_receiver(args[0], names);
                self.put("[");
                self.put_arg(args[1], names);
                self.put("]");
            }
            (Op::CallFunction, t) => {
                match t {
                    Target::Name(s) => self.put(p.str(s)),
                    Target::Const(k) => self.put_global(CONST, k),
                    _ => self.put("operator.getitem"),
                }
                self.put_call(args, kwargs, None, names);
            }
            (Op::CallMethod, Target::Method(m)) => {
                self.put_receiver(args[0], names);
                self.put(".");
                self.put(p.str(m));
                self.put_call(&args[1..], kwargs, None, names);
            }
            // Unreachable for validated programs; the output stays well-formed regardless.
            _ => self.put("None"),
        }
    }

    /// An object in receiver position (`x.m()`, `x[i]`).
    fn put_receiver(&mut self, a: Arg, names: &Names) {
        let number = is_number(a);
        if number {
            self.put("(");
        }
        self.put_arg(a, names);
        if number {
            self.put(")");
        }
    }

    /// `(a, b, k=v)`, or `(a, b, **{'k': v, 'not ident': w})` when any key cannot be passed
    /// as `k=` (all keys then go through `**{...}` in graph order). Keywords to an inlined child
    /// are renamed the way its parameters were; a key naming no parameter needs the `**` form.
    fn put_call(&mut self, args: &[Arg], kwargs: &[Arg], callee: Option<u32>, names: &Names) {
        self.put("(");
        for (k, &a) in args.iter().enumerate() {
            if k > 0 {
                self.put(", ");
            }
            self.put_arg(a, names);
        }
        if kwargs.is_empty() {
            self.put(")");
            return;
        }
        let params = callee.map(|g| self.params(g));
        let params = params.as_deref().map(Vec::as_slice);
        let p = self.p;
        let plain = kwargs
            .chunks_exact(2)
            .all(|kv| key_ident(p, params, kv[0]).is_some());
        if !plain {
            self.put(if args.is_empty() { "**{" } else { ", **{" });
        }
        for (k, kv) in kwargs.chunks_exact(2).enumerate() {
            if k > 0 || (plain && !args.is_empty()) {
                self.put(", ");
            }
            match (plain, key_ident(p, params, kv[0])) {
                (true, Some(id)) => {
                    self.put(id);
                    self.put("=");
                }
                (_, Some(id)) => {
                    literal::str_repr(&mut self.out, id);
                    self.put(": ");
                }
                (_, None) => {
                    self.put_arg(kv[0], names);
                    self.put(": ");
                }
            }
            self.put_arg(kv[1], names);
        }
        self.put(if plain { ")" } else { "})" });
    }

    fn params(&mut self, g: u32) -> Rc<Vec<(String, String)>> {
        let (p, reserved) = (self.p, self.reserved);
        self.params
            .entry(g)
            .or_insert_with(|| {
                let nodes = &p.graphs[g as usize].nodes;
                let names = names::assign(p, nodes, &reserved);
                let params = nodes
                    .iter()
                    .enumerate()
                    .filter_map(|(j, n)| match n.target {
                        Target::Param(s) => Some((p.str(s).into(), names.get(j as u32).into())),
                        _ => None,
                    });
                Rc::new(params.collect())
            })
            .clone()
    }

    /// One argument value as generated code writes it.
    fn put_arg(&mut self, a: Arg, names: &Names) {
        let p = self.p;
        match a {
            Arg::Node(i) => self.put(names.get(i)),
            Arg::None => self.put("None"),
            Arg::Bool(b) => self.put(if b { "True" } else { "False" }),
            Arg::Int(v) => literal::int(&mut self.out, v as i64),
            Arg::Long(k) => literal::int(&mut self.out, p.number(k) as i64),
            Arg::BigInt(k) => self.put(p.str(p.span(k))),
            Arg::Float(k) => {
                // Floats repeat (scales, epsilons): each distinct one is formatted once.
                let v = p.float_of(k);
                let text = self.floats.entry(v.to_bits()).or_insert_with(|| {
                    let mut t = String::new();
                    literal::float(&mut t, v);
                    t.into_boxed_str()
                });
                self.out.push_str(text);
            }
            Arg::Str(k) => literal::str_repr(&mut self.out, p.str(p.span(k))),
            Arg::Bytes(k) => literal::bytes_repr(&mut self.out, p.raw(p.span(k))),
            Arg::Const(k) => self.put_global(CONST, k),
            Arg::Tuple(k) | Arg::List(k) => {
                let items = p.items(k);
                let tuple = matches!(a, Arg::Tuple(_));
                self.put(if tuple { "(" } else { "[" });
                for (n, &item) in items.iter().enumerate() {
                    if n > 0 {
                        self.put(", ");
                    }
                    self.put_arg(item, names);
                }
                self.put(match (tuple, items.len()) {
                    (true, 1) => ",)",
                    (true, _) => ")",
                    _ => "]",
                });
            }
            Arg::Dict(k) => {
                self.put("{");
                for (n, kv) in p.items(k).chunks_exact(2).enumerate() {
                    if n > 0 {
                        self.put(", ");
                    }
                    self.put_arg(kv[0], names);
                    self.put(": ");
                    self.put_arg(kv[1], names);
                }
                self.put("}");
            }
        }
    }
}

/// One value as it would appear in generated code (vLLM's `_node_ref`).
pub fn format_arg(p: &Program, a: Arg, names: &Names, style: Style) -> String {
    let layout = Layout {
        style,
        ..Layout::native()
    };
    let mut e = Emitter::new(p, &layout);
    e.put_arg(a, names);
    e.out
}

#[cfg(test)]
#[path = "emit_tests.rs"]
mod tests;
