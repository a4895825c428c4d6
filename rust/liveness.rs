//! Last uses: which values to release after each statement. A value is released right after the
//! statement that uses it last, a value nothing uses right after it is made, and a value the
//! output returns never.

use crate::ir::{Node, Op, Program};

/// `list[start[j]..start[j + 1]]` are the nodes to `del` after node `j`, in node order.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Liveness {
    start: Vec<u32>,
    list: Vec<u32>,
    /// Bit `i % 64` of `once[i / 64]`: node `i` is used exactly once, by a node other than the
    /// output.
    once: Vec<u64>,
}

const NEVER: u32 = u32::MAX;
const RETURNED: u32 = u32::MAX - 1;
/// Set in a last use once a second use is seen (node indices stay below it).
const MANY: u32 = 1 << 31;

impl Liveness {
    pub fn after(&self, j: usize) -> &[u32] {
        &self.list[self.start[j] as usize..self.start[j + 1] as usize]
    }

    pub fn once(&self, i: usize) -> bool {
        self.once[i / 64] >> (i % 64) & 1 != 0
    }
}

pub fn compute(p: &Program, nodes: &[Node]) -> Liveness {
    let n = nodes.len();
    let mut last = vec![NEVER; n];
    for (j, node) in nodes.iter().enumerate() {
        let now = match node.op {
            Op::Output => RETURNED,
            _ => j as u32,
        };
        p.for_each_ref(p.slice(node.all_args()), &mut |i| {
            let slot = &mut last[i as usize];
            *slot = match *slot {
                NEVER => now,
                RETURNED => RETURNED,
                _ => now | MANY,
            };
        });
        if node.op == Op::Output && last[j] == NEVER {
            last[j] = RETURNED;
        }
    }
    let mut once = vec![0u64; n.div_ceil(64)];
    let mut start = vec![0u32; n + 1];
    let release_at = |i: usize, l: u32| match l {
        RETURNED => None,
        NEVER => Some(i),
        l => Some((l & !MANY) as usize),
    };
    for (i, &l) in last.iter().enumerate() {
        if l < MANY {
            once[i / 64] |= 1 << (i % 64);
        }
        if let Some(at) = release_at(i, l) {
            start[at + 1] += 1;
        }
    }
    for j in 0..n {
        start[j + 1] += start[j];
    }
    let mut fill = start.clone();
    let mut list = vec![0u32; start[n] as usize];
    for (i, &l) in last.iter().enumerate() {
        if let Some(at) = release_at(i, l) {
            list[fill[at] as usize] = i as u32;
            fill[at] += 1;
        }
    }
    Liveness { start, list, once }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::Build;
    use crate::ir::{Arg, Target};

    #[test]
    fn releases_after_last_use() {
        let mut p = Program::default();
        let g = p.add_graph();
        let x = p.add_placeholder(g, "x", None);
        let unused = p.add_placeholder(g, "u", None);
        let a = p.add_node(
            g,
            Op::CallFunction,
            "a",
            Target::Getitem,
            &[Arg::Node(x)],
            &[],
        );
        let b = p.add_node(
            g,
            Op::CallFunction,
            "b",
            Target::Getitem,
            &[Arg::Node(a), Arg::Node(a)],
            &[],
        );
        let t = p.tuple(&[Arg::Node(b), Arg::Node(x)]);
        p.add_output(g, t);
        let live = compute(&p, &p.graphs[0].nodes);
        assert_eq!(live.after(unused as usize), [unused]);
        assert_eq!(live.after(b as usize), [a]);
        assert!(live.after(x as usize).is_empty() && live.after(4).is_empty());
        assert!(!live.once(x as usize) && !live.once(a as usize) && !live.once(b as usize));
    }
}
