//! Last uses: which values to release after each statement.
//!
//! A value is released right after the statement that uses it last; a value nothing uses is
//! released right after it is made; a value the output returns is never released.

use crate::helper::discard;
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

/// `n` zeros in a vector with room for `cap`.
fn zeros(n: usize, cap: usize) -> Vec<u32> {
    let mut v = Vec::with_capacity(cap);
    v.resize(n, 0);
    v
}

const NEVER: u32 = u32::MAX;
const RETURNED: u32 = u32::MAX - 1;

pub fn compute(p: &Program, g: &Graph) -> Liveness {
    let n = g.nodes.len();
    let mut b = Builder {
        last: vec![NEVER; n],
        uses: vec![0; n],
        start: zeros(n, n + 2),
        list: zeros(n, n),
        outputs: Vec::new(),
        now: 0,
    };
    for (j, node) in g.nodes.iter().enumerate() {
        b.begin(j as u32, node.op == Op::Output);
        p.for_each_ref(node.args, &mut |i| b.mark(i));
        p.for_each_ref(node.kwargs(), &mut |i| b.mark(i));
    }
    b.finish()
}

/// [`compute`] for nodes handed over one at a time: [`Builder::push`] each node, then
/// [`Builder::mark`] every reference it makes (to earlier nodes), in any order.
#[derive(Debug, Default)]
pub struct Builder {
    /// last[i]: the last statement using node i, NEVER if none, RETURNED if the output uses it.
    last: Vec<u32>,
    uses: Vec<u32>,
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
            uses: Vec::with_capacity(n),
            start: Vec::with_capacity(n + 2),
            list: Vec::with_capacity(n),
            outputs: Vec::new(),
            now: 0,
        }
    }

    pub fn push(&mut self, output: bool) {
        self.begin(self.last.len() as u32, output);
        self.last.push(NEVER);
        self.uses.push(0);
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
        self.uses[i as usize] += 1;
        let slot = &mut self.last[i as usize];
        // A value the output returns stays RETURNED whatever uses it later.
        *slot = if *slot == RETURNED {
            RETURNED
        } else {
            self.now
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
                l => Some(l as usize),
            }
        };
        // Bucket by position: count into start[at + 2], sum up (start[at + 1] is then where
        // bucket `at` begins), then place using start[at + 1] as the cursor, which leaves it
        // where bucket `at + 1` begins.
        let mut start = std::mem::take(&mut self.start);
        start.resize(n + 2, 0);
        for i in 0..n {
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
        let uses = std::mem::take(&mut self.uses);
        Liveness { start, list, uses }
    }

    /// Drops the scratch, handing its pages back to the system first.
    pub fn discard(self) {
        discard(self.last);
    }
}
