//! Last uses: which values to release after each statement.
//!
//! A value is released right after the statement that uses it last; a value nothing uses is
//! released right after it is made; a value the output returns is never released.

use crate::ir::{Graph, Op, Program};

/// `list[start[j]..start[j + 1]]` are the nodes to `del` after node `j`, in node order;
/// `uses[i]` counts the references to node `i` (the output's included).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Liveness {
    pub start: Vec<u32>,
    pub list: Vec<u32>,
    pub uses: Vec<u32>,
}

impl Liveness {
    pub fn after(&self, j: usize) -> &[u32] {
        &self.list[self.start[j] as usize..self.start[j + 1] as usize]
    }
}

const NEVER: u32 = u32::MAX;
const RETURNED: u32 = u32::MAX - 1;

pub fn compute(p: &Program, g: &Graph) -> Liveness {
    let n = g.nodes.len();
    // last[i]: the last statement using node i, NEVER if none, RETURNED if the output uses it.
    let mut last = vec![NEVER; n];
    let mut uses = vec![0u32; n];
    for (j, node) in g.nodes.iter().enumerate() {
        let j = j as u32;
        let mut mark = |i: u32| {
            uses[i as usize] += 1;
            let slot = &mut last[i as usize];
            if node.op == Op::Output {
                *slot = RETURNED;
            } else if *slot != RETURNED {
                *slot = j;
            }
        };
        p.for_each_ref(node.args, &mut mark);
        p.for_each_ref(node.kwargs, &mut mark);
    }
    let pos = |i: usize| -> Option<usize> {
        match last[i] {
            RETURNED => None,
            NEVER if g.nodes[i].op == Op::Output => None,
            NEVER => Some(i),
            l => Some(l as usize),
        }
    };
    let mut start = vec![0u32; n + 1];
    for i in 0..n {
        if let Some(at) = pos(i) {
            start[at + 1] += 1;
        }
    }
    for j in 0..n {
        start[j + 1] += start[j];
    }
    let mut fill = start.clone();
    let mut list = vec![0u32; start[n] as usize];
    for i in 0..n {
        if let Some(at) = pos(i) {
            list[fill[at] as usize] = i as u32;
            fill[at] += 1;
        }
    }
    Liveness { start, list, uses }
}
