//! Last uses: which values to release after each statement.
//!
//! A value is released right after the statement that uses it last; a value nothing uses is
//! released right after it is made; a value the output returns is never released.

use crate::helper::discard;
use crate::ir::{Graph, Op, Program};

/// `list[start[j]..start[j + 1]]` are the nodes to `del` after node `j`, in node order; bit
/// `i % 64` of `once[i / 64]` is set when node `i` is referenced exactly once, by a node other
/// than the output.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Liveness {
    pub start: Vec<u32>,
    pub list: Vec<u32>,
    pub once: Vec<u64>,
}

impl Liveness {
    pub fn after(&self, j: usize) -> &[u32] {
        &self.list[self.start[j] as usize..self.start[j + 1] as usize]
    }

    /// Whether node `i` is referenced exactly once, by a node other than the output.
    #[inline]
    pub fn once(&self, i: usize) -> bool {
        self.once[i / 64] >> (i % 64) & 1 != 0
    }
}

/// `n` zeros in a vector with room for `cap`.
fn zeros(n: usize, cap: usize) -> Vec<u32> {
    let mut v = Vec::with_capacity(cap);
    v.resize(n, 0);
    v
}

const NEVER: u32 = u32::MAX;
const RETURNED: u32 = u32::MAX - 1;
/// Set in `last[i]` once node `i` is referenced a second time. (`NEVER` and `RETURNED` have it
/// too; node indices stay below it: a graph of 2^31 nodes would need 64 GiB for its nodes.)
const MANY: u32 = 1 << 31;

pub fn compute(p: &Program, g: &Graph) -> Liveness {
    let n = g.nodes.len();
    let mut b = Builder {
        last: vec![NEVER; n],
        start: zeros(n, n + 2),
        list: zeros(n, n),
        outputs: Vec::new(),
        now: 0,
    };
    for (j, node) in g.nodes.iter().enumerate() {
        b.begin(j as u32, node.op == Op::Output);
        p.for_each_ref(node.all_args(), &mut |i| b.mark(i));
    }
    b.finish()
}

/// [`compute`] for nodes handed over one at a time: [`Builder::push`] each node, then
/// [`Builder::mark`] every reference it makes (to earlier nodes), in any order.
#[derive(Debug, Default)]
pub struct Builder {
    /// last[i]: the last statement using node i, NEVER if none, RETURNED if the output uses
    /// it; with [`MANY`] set if more than one reference does.
    last: Vec<u32>,
    /// Zeros, one per node, that become [`Liveness::start`] and [`Liveness::list`]: written as
    /// the nodes come in, so a builder fed while a graph is read has their pages in by the time
    /// it finishes (faulting them in then cost most of `finish`: 0.4 ms at 100k nodes).
    start: Vec<u32>,
    list: Vec<u32>,
    /// Output nodes, in order.
    outputs: Vec<u32>,
    /// What a use by the node pushed last makes of the used node's `last`: the node's index,
    /// or RETURNED for an output.
    now: u32,
}

impl Builder {
    pub fn with_capacity(n: usize) -> Self {
        Builder {
            last: Vec::with_capacity(n),
            start: Vec::with_capacity(n + 2),
            list: Vec::with_capacity(n),
            outputs: Vec::new(),
            now: 0,
        }
    }

    pub fn push(&mut self, output: bool) {
        self.begin(self.last.len() as u32, output);
        self.last.push(NEVER);
        self.start.push(0);
        self.list.push(0);
    }

    /// Node `j`'s uses are marked next.
    #[inline]
    fn begin(&mut self, j: u32, output: bool) {
        if output {
            self.outputs.push(j);
            self.now = RETURNED;
        } else {
            self.now = j;
        }
    }

    /// The node pushed last uses node `i`.
    #[inline]
    pub fn mark(&mut self, i: u32) {
        let slot = &mut self.last[i as usize];
        // A value the output returns stays RETURNED whatever uses it later (`RETURNED | MANY`
        // is RETURNED).
        *slot = match *slot {
            NEVER => self.now,
            RETURNED => RETURNED,
            _ => self.now | MANY,
        };
    }

    /// The last uses. What remains in the builder is scratch: [`Builder::discard`] it.
    pub fn finish(&mut self) -> Liveness {
        let last = &mut self.last;
        let n = last.len();
        // An output node nothing uses is not released either.
        for &o in &self.outputs {
            if last[o as usize] == NEVER {
                last[o as usize] = RETURNED;
            }
        }
        let pos = |i: usize| -> Option<usize> {
            match last[i] {
                RETURNED => None,
                NEVER => Some(i),
                l => Some((l & !MANY) as usize),
            }
        };
        // Bucket by position: count into start[at + 2], sum up (start[at + 1] is then where
        // bucket `at` begins), then place using start[at + 1] as the cursor, which leaves it
        // where bucket `at + 1` begins.
        // The first pass also sets the `once` bits.
        let mut start = std::mem::take(&mut self.start);
        start.resize(n + 2, 0);
        let mut once = vec![0u64; n.div_ceil(64)];
        for i in 0..n {
            once[i / 64] |= ((last[i] & MANY == 0) as u64) << (i % 64);
            if let Some(at) = pos(i) {
                start[at + 2] += 1;
            }
        }
        for j in 2..n + 2 {
            start[j] += start[j - 1];
        }
        let mut list = std::mem::take(&mut self.list);
        list.resize(start[n + 1] as usize, 0);
        for i in 0..n {
            if let Some(at) = pos(i) {
                list[start[at + 1] as usize] = i as u32;
                start[at + 1] += 1;
            }
        }
        start.truncate(n + 1);
        Liveness { start, list, once }
    }

    /// Drops the scratch, handing its pages back to the system first.
    pub fn discard(self) {
        discard(self.last);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Arg, Target};

    #[test]
    fn once_marks_values_referenced_exactly_once_and_not_by_the_output() {
        let mut p = Program::default();
        let g = p.add_graph();
        let f = p.push_str("f");
        let call = |p: &mut Program, name: &str, args: &[Arg]| {
            p.add_node(g, Op::CallFunction, name, Target::Name(f), args, &[])
        };
        let x = p.add_placeholder(g, "x", None);
        let a = call(&mut p, "a", &[Arg::Node(x)]);
        let b = call(&mut p, "b", &[Arg::Node(a), Arg::Int(0)]);
        let dup = p.list(&[Arg::Node(b), Arg::Node(b)]);
        let c = call(&mut p, "c", &[dup]);
        let d = call(&mut p, "d", &[Arg::Node(c)]);
        let unused = call(&mut p, "unused", &[Arg::Node(d)]);
        let returned = call(&mut p, "returned", &[]);
        let also = call(&mut p, "also", &[Arg::Node(returned)]);
        let out = p.tuple(&[Arg::Node(returned), Arg::Node(also)]);
        p.add_output(g, out);
        let live = compute(&p, &p.graphs[0]);
        let once: Vec<u32> = (0..p.graphs[0].nodes.len() as u32)
            .filter(|&i| live.once(i as usize))
            .collect();
        // x, a and c once; b twice (in one list); d once too; `unused` never; `returned`
        // by `also` and the output; `also` by the output only.
        assert_eq!(once, vec![x, a, c, d]);
        assert_eq!(live.after(also as usize), &[] as &[u32]);
        assert_eq!(live.after(unused as usize), &[d, unused]);
        assert_eq!(live.after(c as usize), &[b]);
    }
}
