//! One namespace per function hands out every identifier: unique, a valid identifier, never a
//! keyword, builtin, module global, the entry function's name or a name with the layout prefix.

use rustc_hash::FxHashSet;

use crate::ir::{Node, Program, Span};
use crate::pyident;

/// What names must avoid besides keywords, builtins and module globals.
#[derive(Clone, Copy, Debug)]
pub struct Reserved<'a> {
    /// Every generated global starts with it (`__fx_`, `__vllm_`).
    pub prefix: &'a str,
    pub fn_name: &'a str,
}

impl Reserved<'_> {
    pub fn is_reserved(&self, s: &str) -> bool {
        s.starts_with(self.prefix) || s == self.fn_name || pyident::is_taken(s)
    }
}

/// The identifiers of one function's nodes, by node index.
#[derive(Debug, Default)]
pub struct Names<'a> {
    text: &'a str,
    nodes: &'a [Node],
    /// Per node, `(start, len)` in `text`, or in `extra` when `len` has [`EXTRA`] set; empty
    /// when every node keeps its own name.
    spans: Vec<(u32, u32)>,
    extra: String,
}

const EXTRA: u32 = 1 << 31;

impl<'a> Names<'a> {
    pub fn get(&self, i: u32) -> &str {
        let Some(&(start, len)) = self.spans.get(i as usize) else {
            let name = self
                .nodes
                .get(i as usize)
                .map_or(Span::default(), |n| n.name);
            return self.text.get(name.range()).unwrap_or("");
        };
        let (base, len) = match len & EXTRA {
            0 => (self.text, len),
            _ => (self.extra.as_str(), len & !EXTRA),
        };
        &base[start as usize..(start + len) as usize]
    }

    /// Names given in full (vLLM's `_node_ref` names loose nodes by their own names).
    pub fn from_list(list: &[String]) -> Names<'static> {
        let mut n = Names::default();
        list.iter().for_each(|s| n.push_extra(s));
        n
    }

    /// Appends a name kept in `extra`.
    fn push_extra(&mut self, s: &str) {
        self.spans
            .push((self.extra.len() as u32, s.len() as u32 | EXTRA));
        self.extra.push_str(s);
    }
}

/// Names every node of `nodes` (whose names are spans of `p.text`): its own name when that is
/// an identifier, not reserved and not taken by an earlier node; else the name with invalid
/// characters as `_` (a `_` before a leading digit, a `v` before a reserved prefix) and the
/// first free `_N` suffix.
pub fn assign<'a>(p: &'a Program, nodes: &'a [Node], reserved: &Reserved) -> Names<'a> {
    let mut used: FxHashSet<&'a str> = FxHashSet::default();
    used.reserve(nodes.len());
    let mut renamed: FxHashSet<String> = FxHashSet::default();
    let mut names = Names {
        text: &p.text,
        nodes,
        ..Names::default()
    };
    for (j, node) in nodes.iter().enumerate() {
        let raw = p.str(node.name);
        let own = pyident::is_identifier(raw)
            && !reserved.is_reserved(raw)
            && !renamed.contains(raw)
            && used.insert(raw);
        if own {
            if !names.spans.is_empty() {
                names.spans.push((node.name.start, node.name.len));
            }
            continue;
        }
        if names.spans.is_empty() {
            names.spans = nodes[..j]
                .iter()
                .map(|n| (n.name.start, n.name.len))
                .collect();
        }
        let name = fresh(raw, reserved, |s| used.contains(s) || renamed.contains(s));
        names.push_extra(&name);
        renamed.insert(name);
    }
    names
}

fn fresh(raw: &str, reserved: &Reserved, used: impl Fn(&str) -> bool) -> String {
    let mut base = String::with_capacity(raw.len() + 1);
    for (k, c) in raw.chars().enumerate() {
        if c.is_ascii_alphanumeric() || c == '_' {
            if k == 0 && c.is_ascii_digit() {
                base.push('_');
            }
            base.push(c);
        } else {
            base.push('_');
        }
    }
    // A suffix cannot un-reserve a name that starts with the layout prefix.
    if base.is_empty() || base.starts_with(reserved.prefix) {
        base.insert(0, 'v');
    }
    let mut name = base.clone();
    let mut k = 0u64;
    while reserved.is_reserved(&name) || used(&name) {
        k += 1;
        name = format!("{base}_{k}");
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::Build;
    use crate::ir::{Op, Target};

    fn names_of(list: &[&str], reserved: &Reserved) -> Vec<String> {
        let mut p = Program::default();
        let g = p.add_graph();
        for n in list {
            p.add_node(g, Op::CallFunction, n, Target::Getitem, &[], &[]);
        }
        let nodes = &p.graphs[0].nodes;
        let names = assign(&p, nodes, reserved);
        (0..list.len() as u32)
            .map(|i| names.get(i).to_string())
            .collect()
    }

    #[test]
    fn names_are_unique_identifiers() {
        let r = Reserved {
            prefix: "__fx_",
            fn_name: "execution_fn",
        };
        let got = names_of(
            &[
                "x",
                "x",
                "len",
                "len_1",
                "a b",
                "a_b",
                "1x",
                "",
                "__fx_c0",
                "class",
                "é",
                "execution_fn",
                "torch",
                "x_1",
            ],
            &r,
        );
        let want = [
            "x",
            "x_1",
            "len_1",
            "len_1_1",
            "a_b",
            "a_b_1",
            "_1x",
            "v",
            "v__fx_c0",
            "class_1",
            "_",
            "execution_fn_1",
            "torch_1",
            "x_1_1",
        ];
        assert_eq!(got, want);
        assert_eq!(names_of(&["a", "b"], &r), ["a", "b"]);
    }
}
