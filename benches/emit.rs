//! Criterion benches of the pure-Rust core, in nodes/s: `emit` from an in-memory node list,
//! `codegen` (validation, layout check, emission), the serialized path (`codegen_serialized`,
//! what `fxcodegen.emit` runs), and the two passes before a function's statements (`names`,
//! `liveness`).
//!
//!     cargo bench --bench emit --no-default-features
//!     cargo bench --bench emit --no-default-features -- --test     # smoke: each bench once
//!
//! The programs mirror the Python workloads of `fxcodegen.bench.workloads`: the stitching shape
//! (2 nodes per layer: `call_module` with args and kwargs, then `getitem`) and the inline-heavy
//! shape (one inlined child of aten ops, a quarter `_to_copy` with pool constants).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use fxcodegen::emit::{emit, Layout};
use fxcodegen::ir::{self, Arg, Op, Program, SubmodKind, Target};
use fxcodegen::{codegen, codegen_serialized, liveness, names, serial};

#[path = "../rust/tests/builder.rs"]
mod builder;

use builder::Build;

const SIZES: [usize; 3] = [1_000, 100_000, 1_000_000];

/// About `nodes` nodes: x, s0, then per layer `submod_i(prev, x, s0, scale=0.5, sizes=[s0])`
/// and `[0]`, then the output.
fn stitch(nodes: usize) -> Program {
    let mut p = Program::default();
    let g = p.add_graph();
    let x = p.add_placeholder(g, "x", None);
    let s0 = p.add_placeholder(g, "s0", None);
    let mut prev = x;
    for i in 0..(nodes.saturating_sub(3) / 2).max(1) {
        let sm = p.add_submod(&format!("submod_{i}"), SubmodKind::Opaque);
        let (half, sizes) = (p.float(0.5), p.list(&[Arg::Node(s0)]));
        let args = [Arg::Node(prev), Arg::Node(x), Arg::Node(s0)];
        let kw = [("scale", half), ("sizes", sizes)];
        let name = format!("submod_{i}");
        let call = p.add_node(g, Op::CallModule, &name, Target::Submod(sm), &args, &kw);
        let item = [Arg::Node(call), Arg::Int(0)];
        let name = format!("getitem_{i}");
        prev = p.add_node(g, Op::CallFunction, &name, Target::Getitem, &item, &[]);
    }
    p.add_output(g, Arg::Node(prev));
    p
}

/// `x -> child(x)`, the child `nodes` aten ops: a quarter `_to_copy(dtype=, device=)`.
fn inline(nodes: usize) -> Program {
    let mut p = Program {
        n_consts: 2,
        ..Program::default()
    };
    let root = p.add_graph();
    let child = p.add_graph();
    let sm = p.add_submod("submod_0", SubmodKind::Inline(child));
    let cx = p.add_placeholder(child, "x", None);
    let add = p.push_str("torch.ops.aten.add.Tensor");
    let copy = p.push_str("torch.ops.aten._to_copy.default");
    let mut prev = cx;
    for i in 0..nodes {
        let name = format!("op_{i}");
        prev = match i % 4 {
            0 => {
                let kw = [("dtype", Arg::Const(0)), ("device", Arg::Const(1))];
                let args = [Arg::Node(prev)];
                p.add_node(
                    child,
                    Op::CallFunction,
                    &name,
                    Target::Name(copy),
                    &args,
                    &kw,
                )
            }
            _ => {
                let args = [Arg::Node(prev), Arg::Node(cx)];
                p.add_node(
                    child,
                    Op::CallFunction,
                    &name,
                    Target::Name(add),
                    &args,
                    &[],
                )
            }
        };
    }
    p.add_output(child, Arg::Node(prev));
    let x = p.add_placeholder(root, "x", None);
    let c = p.add_node(
        root,
        Op::CallModule,
        "submod_0",
        Target::Submod(sm),
        &[Arg::Node(x)],
        &[],
    );
    p.add_output(root, Arg::Node(c));
    p
}

fn bench_shape(c: &mut Criterion, shape: &str, make: fn(usize) -> Program) {
    let layout = Layout::native();
    let mut group = c.benchmark_group(shape);
    for size in SIZES {
        let p = make(size);
        let nodes: usize = p.graphs.iter().map(|g| g.nodes.len()).sum();
        let code = codegen(&p, &layout).expect("valid program");
        assert!(
            code.contains("def execution_fn(x"),
            "{}",
            &code[..200.min(code.len())]
        );
        let data = serial::write(&p);
        if size >= 100_000 {
            group.sample_size(10);
        }
        group.throughput(Throughput::Elements(nodes as u64));
        group.bench_with_input(BenchmarkId::new("emit", nodes), &p, |b, p| {
            b.iter(|| emit(black_box(p), &layout))
        });
        group.bench_with_input(BenchmarkId::new("codegen", nodes), &p, |b, p| {
            b.iter(|| codegen(black_box(p), &layout).unwrap())
        });
        group.bench_with_input(
            BenchmarkId::new("codegen_serialized", nodes),
            &data,
            |b, d| b.iter(|| codegen_serialized(black_box(d), &layout).unwrap()),
        );
        let g = &p
            .graphs
            .iter()
            .max_by_key(|g| g.nodes.len())
            .expect("a graph")
            .nodes;
        group.throughput(Throughput::Elements(g.len() as u64));
        group.bench_with_input(BenchmarkId::new("names", nodes), &p, |b, p| {
            b.iter(|| {
                names::assign(black_box(p), g, &layout.reserved())
                    .get(0)
                    .len()
            })
        });
        group.bench_with_input(BenchmarkId::new("liveness", nodes), &p, |b, p| {
            b.iter(|| liveness::compute(black_box(p), g))
        });
    }
    group.finish();
}

fn benches(c: &mut Criterion) {
    bench_shape(c, "stitch", stitch);
    bench_shape(c, "inline", inline);
}

criterion_group!(emit_benches, benches);
criterion_main!(emit_benches);
