//! Programs built by hand, for the tests and benches: the in-crate tests, `serial_fuzz` and the
//! `emit` bench include this file as a module. It reaches the IR as `crate::ir`, so a crate
//! root outside the library names it with `use fxcodegen::ir;`.

// Each target that includes this file uses only part of the builder.
#![allow(dead_code)]

use crate::ir::{Arg, Graph, Node, Op, Program, Span, Submod, SubmodKind, Target};

/// Appends graphs, submodules, nodes and containers to a [`Program`].
pub trait Build {
    fn tuple(&mut self, items: &[Arg]) -> Arg;
    fn list(&mut self, items: &[Arg]) -> Arg;
    fn dict(&mut self, pairs: &[(Arg, Arg)]) -> Arg;
    fn add_graph(&mut self) -> u32;
    fn add_submod(&mut self, name: &str, kind: SubmodKind) -> u32;
    /// Appends a node to graph `g`; returns its index there.
    fn add_node(
        &mut self,
        g: u32,
        op: Op,
        name: &str,
        target: Target,
        args: &[Arg],
        kwargs: &[(&str, Arg)],
    ) -> u32;
    fn add_placeholder(&mut self, g: u32, name: &str, default: Option<Arg>) -> u32;
    fn add_output(&mut self, g: u32, value: Arg) -> u32;
}

impl Build for Program {
    fn tuple(&mut self, items: &[Arg]) -> Arg {
        let s = self.push_args(items);
        Arg::Tuple(self.add_span(s))
    }

    fn list(&mut self, items: &[Arg]) -> Arg {
        let s = self.push_args(items);
        Arg::List(self.add_span(s))
    }

    fn dict(&mut self, pairs: &[(Arg, Arg)]) -> Arg {
        let flat: Vec<Arg> = pairs.iter().flat_map(|&(k, v)| [k, v]).collect();
        let s = self.push_args(&flat);
        Arg::Dict(self.add_span(s))
    }

    fn add_graph(&mut self) -> u32 {
        self.graphs.push(Graph::default());
        self.graphs.len() as u32 - 1
    }

    fn add_submod(&mut self, name: &str, kind: SubmodKind) -> u32 {
        let name = self.push_str(name);
        self.submods.push(Submod { name, kind });
        self.submods.len() as u32 - 1
    }

    fn add_node(
        &mut self,
        g: u32,
        op: Op,
        name: &str,
        target: Target,
        args: &[Arg],
        kwargs: &[(&str, Arg)],
    ) -> u32 {
        let name = self.push_str(name);
        let mut all = args.to_vec();
        for &(k, v) in kwargs {
            all.push(self.str_arg(k));
            all.push(v);
        }
        let span = self.push_args(&all);
        let nodes = &mut self.graphs[g as usize].nodes;
        nodes.push(Node {
            name,
            args: Span {
                start: span.start,
                len: args.len() as u32,
            },
            target,
            kwargs: kwargs.len() as u16,
            op,
        });
        nodes.len() as u32 - 1
    }

    fn add_placeholder(&mut self, g: u32, name: &str, default: Option<Arg>) -> u32 {
        let param = self.push_str(name);
        let default: Vec<Arg> = default.into_iter().collect();
        let target = Target::Param(param);
        self.add_node(g, Op::Placeholder, name, target, &default, &[])
    }

    fn add_output(&mut self, g: u32, value: Arg) -> u32 {
        self.add_node(g, Op::Output, "output", Target::None, &[value], &[])
    }
}
