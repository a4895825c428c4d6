//! Criterion benches of the pure-Rust core: throughput in nodes/s of the emitter from an
//! in-memory node list (target: >= 20 M nodes/s), both as one `String` (`emit`) and as the
//! pieces of the threads' buffers that `generate` copies into its `str` (`emit_pieces`), the
//! same two on memory kept from the previous call (`*_resident`), of
//! `codegen` (validate + layout check + emit), of the serialized path (`serial::read` +
//! `codegen`, what `fxcodegen.emit` runs), and of the two passes over the largest function's nodes
//! that come before its statements, each alone on one thread and resident memory (`names`:
//! `names::assign`; `liveness`: `liveness::compute`).
//!
//!     cargo bench --bench emit --no-default-features
//!     cargo bench --bench emit --no-default-features -- --test     # smoke: each bench once
//!
//! The programs mirror the Python workloads of `fxcodegen.bench.workloads`: the stitching shape
//! (2 nodes per layer: `call_module` with args and kwargs, then `getitem`) and the inline-heavy
//! shape (one inlined child of aten ops, a quarter `_to_copy` with pool constants).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use fxcodegen::emit::{default_threads, emit, emit_with_threads, Layout};
use fxcodegen::ir::{Arg, Op, Program, SubmodKind, Target};
use fxcodegen::{alloc, codegen, liveness, names, serial};

const SIZES: [usize; 4] = [1_000, 10_000, 100_000, 1_000_000];

/// About `nodes` nodes: x, s0, then per layer `submod_i(prev, x, s0, scale=0.5, sizes=[s0, 16])`
/// and `[0]`, then the output.
fn stitch(nodes: usize) -> (Program, usize) {
    let layers = ((nodes.saturating_sub(3)) / 2).max(1);
    let mut p = Program::default();
    let g = p.add_graph();
    let x = p.add_placeholder(g, "x", None);
    let s0 = p.add_placeholder(g, "s0", None);
    // Keyword keys share one span each, as in programs the reader makes.
    let (scale, sizes) = (Arg::Str(p.push_str("scale")), Arg::Str(p.push_str("sizes")));
    let mut prev = x;
    for i in 0..layers {
        let name = format!("submod_{i}");
        let sm = p.add_submod(&name, SubmodKind::Opaque);
        let size_list = p.list(&[Arg::Node(s0), Arg::Int(16)]);
        let call = p.add_node_kw(
            g,
            Op::CallModule,
            &name,
            Target::Submod(sm),
            &[Arg::Node(prev), Arg::Node(x), Arg::Node(s0)],
            &[(scale, Arg::Float(0.5)), (sizes, size_list)],
        );
        prev = p.add_node(
            g,
            Op::CallFunction,
            &format!("getitem_{i}"),
            Target::Getitem,
            &[Arg::Node(call), Arg::Int(0)],
            &[],
        );
    }
    p.add_output(g, Arg::Node(prev));
    (p, 2 * layers + 3)
}

/// A root `x -> submod_0(x)[0] -> output` around one inlined child of about `nodes` aten ops:
/// op i is `_to_copy(prev, dtype=<const 0>, device=<const 1>)` when i % 4 == 0, else
/// `add(prev, x)`, `mul(prev, 0.5)` or `sub(prev, x)`.
fn inline(nodes: usize) -> (Program, usize) {
    let n_ops = nodes.saturating_sub(6).max(1);
    let mut p = Program::default();
    let root = p.add_graph();
    let child = p.add_graph();
    p.n_consts = 2;
    let sm = p.add_submod("submod_0", SubmodKind::Inline(child));
    let x = p.add_placeholder(root, "x", None);
    let call = p.add_node(
        root,
        Op::CallModule,
        "submod_0",
        Target::Submod(sm),
        &[Arg::Node(x)],
        &[],
    );
    let item = p.add_node(
        root,
        Op::CallFunction,
        "getitem",
        Target::Getitem,
        &[Arg::Node(call), Arg::Int(0)],
        &[],
    );
    p.add_output(root, Arg::Node(item));

    let to_copy = Target::Name(p.push_str("torch.ops.aten._to_copy.default"));
    let add = Target::Name(p.push_str("torch.ops.aten.add.Tensor"));
    let mul = Target::Name(p.push_str("torch.ops.aten.mul.Tensor"));
    let sub = Target::Name(p.push_str("torch.ops.aten.sub.Tensor"));
    let (dtype, device) = (
        Arg::Str(p.push_str("dtype")),
        Arg::Str(p.push_str("device")),
    );
    let cx = p.add_placeholder(child, "x", None);
    let mut prev = cx;
    for i in 0..n_ops {
        prev = match i % 4 {
            0 => p.add_node_kw(
                child,
                Op::CallFunction,
                &format!("to_{i}"),
                to_copy,
                &[Arg::Node(prev)],
                &[(dtype, Arg::Const(0)), (device, Arg::Const(1))],
            ),
            1 => p.add_node(
                child,
                Op::CallFunction,
                &format!("op_{i}"),
                add,
                &[Arg::Node(prev), Arg::Node(cx)],
                &[],
            ),
            2 => p.add_node(
                child,
                Op::CallFunction,
                &format!("mul_{i}"),
                mul,
                &[Arg::Node(prev), Arg::Float(0.5)],
                &[],
            ),
            _ => p.add_node(
                child,
                Op::CallFunction,
                &format!("op_{i}"),
                sub,
                &[Arg::Node(prev), Arg::Node(cx)],
                &[],
            ),
        };
    }
    let out = p.tuple(&[Arg::Node(prev)]);
    p.add_output(child, out);
    (p, n_ops + 2 + 4)
}

fn bench_shape(c: &mut Criterion, shape: &str, make: fn(usize) -> (Program, usize)) {
    let layout = Layout::native();
    let mut group = c.benchmark_group(shape);
    for size in SIZES {
        let (p, nodes) = make(size);
        // The program must be one the emitter accepts, and emit what the workload describes.
        let code = codegen(&p, &layout).expect("valid program");
        assert!(
            code.contains("def execution_fn(x"),
            "unexpected source:\n{}",
            &code[..200.min(code.len())]
        );
        // The pieces the emitter leaves (what `generate` copies into its str) join to the same.
        let threads = default_threads();
        assert_eq!(emit_with_threads(&p, &layout, threads).concat(), code);
        let data = serial::write(&p);
        if size >= 100_000 {
            group.sample_size(10);
        }
        group.throughput(Throughput::Elements(nodes as u64));
        group.bench_with_input(BenchmarkId::new("emit", nodes), &p, |b, p| {
            b.iter(|| emit(black_box(p), &layout))
        });
        group.bench_with_input(BenchmarkId::new("emit_pieces", nodes), &p, |b, p| {
            b.iter(|| emit_with_threads(black_box(p), &layout, threads))
        });
        // The same two again on resident memory: the crate's allocator keeps what a call
        // freed for the next one (an `alloc::Keep` guard and a limit above a 1M call's ~0.3
        // GB), so the output and tables land on pages written before. That is the emitter's
        // own speed, without the kernel's cost of fresh memory, which decides it at 1M on a VM
        // (`python -m fxcodegen bench` reports what a fresh page costs). Kept blocks are freed
        // afterwards, so that no other bench is served from them.
        alloc::set_limit(1 << 30);
        let keep = alloc::Keep::new();
        group.bench_with_input(BenchmarkId::new("emit_resident", nodes), &p, |b, p| {
            b.iter(|| emit(black_box(p), &layout))
        });
        group.bench_with_input(
            BenchmarkId::new("emit_pieces_resident", nodes),
            &p,
            |b, p| b.iter(|| emit_with_threads(black_box(p), &layout, threads)),
        );
        // The largest function's names and last uses, which its statements wait for (above
        // 2^19 nodes the two are worked out side by side: the slower is on the critical path).
        let reserved = layout.reserved();
        let g = p
            .graphs
            .iter()
            .max_by_key(|g| g.nodes.len())
            .expect("a graph");
        group.throughput(Throughput::Elements(g.nodes.len() as u64));
        group.bench_with_input(BenchmarkId::new("names", nodes), &p, |b, p| {
            b.iter(|| names::assign(black_box(p), g, &reserved).all_own())
        });
        group.bench_with_input(BenchmarkId::new("liveness", nodes), &p, |b, p| {
            b.iter(|| liveness::compute(black_box(p), g))
        });
        group.throughput(Throughput::Elements(nodes as u64));
        drop(keep);
        alloc::set_limit(alloc::DEFAULT_LIMIT);
        alloc::release();
        group.bench_with_input(BenchmarkId::new("codegen", nodes), &p, |b, p| {
            b.iter(|| codegen(black_box(p), &layout).unwrap())
        });
        group.bench_with_input(
            BenchmarkId::new("serial_read+codegen", nodes),
            &data,
            |b, d| b.iter(|| codegen(&serial::read(black_box(d)).unwrap(), &layout).unwrap()),
        );
    }
    group.finish();
}

fn benches(c: &mut Criterion) {
    bench_shape(c, "stitch", stitch);
    bench_shape(c, "inline", inline);
}

criterion_group!(emit_benches, benches);
criterion_main!(emit_benches);
