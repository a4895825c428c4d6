//! The rules a program must meet before it is emitted. A program that passes emits source that
//! compiles; one read from untrusted bytes must also keep to the names untrusted input may call.

use rustc_hash::FxHashSet;

use crate::error::{Error, Reason, Result};
use crate::ir::{Arg, Node, Op, Program, Span, SubmodKind, Target, MAX_DEPTH};
use crate::pyident;

/// Checks `p`; with `untrusted`, call names are limited to `torch.ops`, safe `operator`
/// functions and safe builtins, and method names may not start with `_`.
pub fn validate(p: &Program, untrusted: bool) -> Result<()> {
    if p.graphs.is_empty() {
        return Err(Error::Invalid(Reason::NoGraph));
    }
    for sm in &p.submods {
        text(p, sm.name)?;
        if let SubmodKind::Inline(g) = sm.kind {
            if g == 0 || g as usize >= p.graphs.len() {
                return Err(Error::Invalid(Reason::index("inlined graph", g)));
            }
        }
    }
    let mut v = Validator {
        p,
        untrusted,
        good_names: FxHashSet::default(),
    };
    for gi in 0..p.graphs.len() {
        v.graph(gi as u32)?;
    }
    Ok(())
}

struct Validator<'a> {
    p: &'a Program,
    untrusted: bool,
    /// Call names already checked (targets repeat across nodes).
    good_names: FxHashSet<&'a str>,
}

fn text(p: &Program, s: Span) -> Result<&str> {
    p.text.get(s.range()).ok_or(Error::Invalid(Reason::BadSpan))
}

impl<'a> Validator<'a> {
    fn graph(&mut self, gi: u32) -> Result<()> {
        let p = self.p;
        let nodes = &p.graphs[gi as usize].nodes;
        let mut seen_default = false;
        for (j, node) in nodes.iter().enumerate() {
            let bad = |reason| Error::node(p, node, reason);
            text(p, node.name)?;
            if node.all_args().range().end > p.args.len() {
                return Err(bad(Reason::BadSpan));
            }
            self.target(gi, node, j + 1 == nodes.len())?;
            if node.op == Op::Placeholder {
                if node.args.len == 1 {
                    seen_default = true;
                    // A default is evaluated where the function is defined, before any node.
                    let mut named = None;
                    p.for_each_ref(p.slice(node.args), &mut |i| named = named.or(Some(i)));
                    if let Some(i) = named.filter(|&i| (i as usize) < nodes.len()) {
                        let name = p.str(nodes[i as usize].name).to_string();
                        return Err(bad(Reason::DefaultIsNode(name)));
                    }
                } else if seen_default {
                    return Err(bad(Reason::DefaultOrder));
                }
            }
            self.args(node, p.slice(node.all_args()), j as u32, nodes, 0)?;
            self.keys(node)?;
        }
        Ok(())
    }

    fn target(&mut self, gi: u32, node: &Node, last: bool) -> Result<()> {
        let p = self.p;
        let bad = |reason| Error::node(p, node, reason);
        match (node.op, node.target) {
            (Op::Placeholder, Target::Param(s)) => {
                if text(p, s)?.starts_with('*') {
                    return Err(bad(Reason::Variadic));
                }
                if node.args.len > 1 || node.kwargs > 0 {
                    return Err(bad(Reason::PlaceholderArity));
                }
            }
            (Op::CallModule, Target::Submod(i)) => match p.submods.get(i as usize) {
                None => return Err(bad(Reason::index("submodule", i))),
                Some(sm) if matches!(sm.kind, SubmodKind::Inline(c) if c <= gi) => {
                    return Err(bad(Reason::ChildOrder));
                }
                Some(_) => {}
            },
            (Op::CallFunction, Target::Name(s)) => {
                let name = text(p, s)?;
                if self.good_names.insert(name) {
                    let rule = match self.untrusted {
                        true => pyident::check_untrusted_call_name(name),
                        false => pyident::check_call_name(name),
                    };
                    rule.map_err(|r| bad(Reason::CallName(name.into(), r)))?;
                }
            }
            (Op::CallFunction, Target::Getitem) => {}
            (Op::CallFunction | Op::GetAttr, Target::Const(k)) => {
                if k >= p.n_consts {
                    return Err(bad(Reason::index("constant", k)));
                }
                if node.op == Op::GetAttr && (node.args.len > 0 || node.kwargs > 0) {
                    return Err(bad(Reason::GetAttrArgs));
                }
            }
            (Op::CallMethod, Target::Method(s)) => {
                let m = text(p, s)?;
                if !pyident::is_plain_name(m) || (self.untrusted && m.starts_with('_')) {
                    return Err(bad(Reason::BadMethodName));
                }
                if node.args.len == 0 {
                    return Err(bad(Reason::MethodWithoutObject));
                }
            }
            (Op::Output, Target::None) => {
                if !last {
                    return Err(bad(Reason::OutputNotLast));
                }
                if node.args.len > 1 || node.kwargs > 0 {
                    return Err(bad(Reason::OutputArity));
                }
            }
            _ => return Err(bad(Reason::TargetMismatch)),
        }
        Ok(())
    }

    /// Keyword keys: text or pooled, and no text key twice (`f(k=1, k=2)` does not compile).
    fn keys(&self, node: &Node) -> Result<()> {
        let p = self.p;
        let pairs = p.slice(node.kwargs());
        // Most calls have a few keywords: compared pairwise up to 8, through a set beyond.
        let mut seen: FxHashSet<&str> = FxHashSet::default();
        for (i, pair) in pairs.chunks_exact(2).enumerate() {
            let key = match pair[0] {
                Arg::Str(k) => text(p, p.span(k))?,
                Arg::Const(c) if c < p.n_consts => continue,
                _ => return Err(Error::node(p, node, Reason::KeyNotStr)),
            };
            let repeated = match pairs.len() <= 16 {
                true => pairs[..2 * i]
                    .chunks_exact(2)
                    .any(|q| matches!(q[0], Arg::Str(k) if p.str(p.span(k)) == key)),
                false => !seen.insert(key),
            };
            if repeated {
                return Err(Error::node(p, node, Reason::DuplicateKeyword(key.into())));
            }
        }
        Ok(())
    }

    fn args(
        &self,
        node: &Node,
        args: &[Arg],
        pos: u32,
        nodes: &[Node],
        depth: usize,
    ) -> Result<()> {
        let p = self.p;
        let bad = |reason| Error::node(p, node, reason);
        if depth > MAX_DEPTH {
            return Err(bad(Reason::TooDeep));
        }
        for &a in args {
            match a {
                Arg::Node(i) => {
                    if i >= pos || nodes[i as usize].op == Op::Output {
                        return Err(bad(Reason::NotEarlierNode(format!("#{i}"))));
                    }
                }
                Arg::None | Arg::Bool(_) | Arg::Int(_) => {}
                Arg::Long(k) | Arg::Float(k) => {
                    if k as usize >= p.numbers.len() {
                        return Err(bad(Reason::BadSpan));
                    }
                }
                Arg::BigInt(k) => {
                    let t = text(p, self.span(node, k)?)?;
                    if !pyident::is_int_literal(t) {
                        return Err(bad(Reason::BadInt));
                    }
                }
                Arg::Str(k) => {
                    text(p, self.span(node, k)?)?;
                }
                Arg::Bytes(k) => {
                    if self.span(node, k)?.range().end > p.blobs.len() {
                        return Err(bad(Reason::BadSpan));
                    }
                }
                Arg::Const(k) => {
                    if k >= p.n_consts {
                        return Err(bad(Reason::index("constant", k)));
                    }
                }
                Arg::Tuple(k) | Arg::List(k) | Arg::Dict(k) => {
                    let s = self.span(node, k)?;
                    let odd = matches!(a, Arg::Dict(_)) && s.len % 2 != 0;
                    let Some(items) = p.args.get(s.range()).filter(|_| !odd) else {
                        return Err(bad(Reason::BadSpan));
                    };
                    self.args(node, items, pos, nodes, depth + 1)?;
                }
            }
        }
        Ok(())
    }

    fn span(&self, node: &Node, k: u32) -> Result<Span> {
        match self.p.spans.get(k as usize) {
            Some(&s) => Ok(s),
            None => Err(Error::node(self.p, node, Reason::BadSpan)),
        }
    }
}
