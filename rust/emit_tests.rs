//! Golden tests of the emitter: small programs and their exact source.

use crate::emit::{Layout, Style};
use crate::ir::{Arg, Op, Program, SubmodKind, Target};

macro_rules! assert_emits {
    ($prog:expr, $layout:expr, $want:expr) => {{
        let got = crate::codegen(&$prog, &$layout).expect("codegen");
        assert_eq!(got, $want, "\n--- got ---\n{got}\n--- want ---\n{}", $want);
    }};
}

fn native() -> Layout<'static> {
    Layout::native()
}

fn vllm() -> Layout<'static> {
    Layout {
        style: Style::Vllm,
        ..Layout::native()
    }
}

/// x, s0 -> submod_0(x, s0, scale=0.5, sizes=[s0]) -> [0] -> submod_1(...) -> output
fn stitching() -> Program {
    let mut p = Program::default();
    let g = p.add_graph();
    let s0 = p.add_submod("submod_0", SubmodKind::Opaque);
    let s1 = p.add_submod("submod_1", SubmodKind::Opaque);
    let x = p.add_placeholder(g, "x", None);
    let n = p.add_placeholder(g, "s0", None);
    let sizes = p.list(&[Arg::Node(n)]);
    let a = p.add_node(
        g,
        Op::CallModule,
        "submod_0",
        Target::Submod(s0),
        &[Arg::Node(x), Arg::Node(n)],
        &[("scale", Arg::Float(0.5)), ("sizes", sizes)],
    );
    let b = p.add_node(
        g,
        Op::CallFunction,
        "getitem",
        Target::Getitem,
        &[Arg::Node(a), Arg::Int(0)],
        &[],
    );
    let c = p.add_node(
        g,
        Op::CallModule,
        "submod_1",
        Target::Submod(s1),
        &[Arg::Node(b), Arg::Node(x)],
        &[],
    );
    let out = p.tuple(&[Arg::Node(c)]);
    p.add_output(g, out);
    p
}

/// Native layout: a call whose only use is the getitem after it becomes `b = f(...)[0]`.
#[test]
fn stitching_native() {
    assert_emits!(
        stitching(),
        native(),
        "import torch\nimport operator\n\ndef execution_fn(x, s0):\n    getitem = __fx_s0(x, s0, scale=0.5, sizes=[s0])[0]\n    del s0\n    submod_1 = __fx_s1(getitem, x)\n    del x, getitem\n    return (submod_1,)\n"
    );
}

#[test]
fn stitching_vllm() {
    assert_emits!(
        stitching(),
        vllm(),
        "import torch\nimport operator\n\ndef execution_fn(x, s0, *, __vllm_submods__):\n    submod_0 = __vllm_submods__[0](x, s0, scale=0.5, sizes=[s0])\n    del s0\n    getitem = submod_0[0]\n    del submod_0\n    submod_1 = __vllm_submods__[1](getitem, x)\n    del x, getitem\n    return (submod_1,)\n"
    );
}

#[test]
fn inlined_child_with_renamed_params_and_keywords() {
    let mut p = Program::default();
    let root = p.add_graph();
    let child = p.add_graph();
    let sm = p.add_submod("submod_0", SubmodKind::Inline(child));
    // The child: def (torch, y=2): return torch.ops.aten.mul.Tensor(torch, y)
    let t = p.add_placeholder(child, "torch", None);
    let y = p.add_placeholder(child, "y", Some(Arg::Int(2)));
    let name = p.push_str("torch.ops.aten.mul.Tensor");
    let m = p.add_node(
        child,
        Op::CallFunction,
        "mul",
        Target::Name(name),
        &[Arg::Node(t), Arg::Node(y)],
        &[],
    );
    p.add_output(child, Arg::Node(m));
    let x = p.add_placeholder(root, "x", None);
    let c = p.add_node(
        root,
        Op::CallModule,
        "submod_0",
        Target::Submod(sm),
        &[],
        &[
            ("torch", Arg::Node(x)),
            ("y", Arg::Int(3)),
            ("not a param", Arg::None),
        ],
    );
    p.add_output(root, Arg::Node(c));
    assert_emits!(
        p,
        native(),
        "import torch\nimport operator\n\ndef __fx_f0(torch_1, y=2):\n    mul = torch.ops.aten.mul.Tensor(torch_1, y)\n    del torch_1, y\n    return mul\n\ndef execution_fn(x):\n    submod_0 = __fx_f0(**{'torch_1': x, 'y': 3, 'not a param': None})\n    del x\n    return submod_0\n"
    );
}

#[test]
fn literals_and_pool() {
    let mut p = Program {
        n_consts: 2,
        ..Program::default()
    };
    let g = p.add_graph();
    let big = p.push_str("-123456789012345678901234567890");
    let s = p.push_str("it's \"q\"\n");
    let b = p.push_bytes(b"\x00\xffab");
    let one = p.tuple(&[Arg::Int(1)]);
    let k = Arg::Str(p.push_str("k"));
    let d = p.dict(&[(k, Arg::Float(f64::NEG_INFINITY))]);
    let args = [
        Arg::None,
        Arg::Bool(true),
        Arg::Int(-7),
        Arg::BigInt(big),
        Arg::Float(-0.0),
        Arg::Float(f64::NAN),
        Arg::Float(1e-5),
        Arg::Str(s),
        Arg::Bytes(b),
        Arg::Const(1),
        one,
        d,
        // Repeats (the last float, an older one) and -0.0 against 0.0; ints of 1-3 digits.
        Arg::Float(1e-5),
        Arg::Float(0.0),
        Arg::Float(-0.0),
        Arg::Float(0.0),
        Arg::Float(1e-5),
        Arg::Int(0),
        Arg::Int(9),
        Arg::Int(10),
        Arg::Int(99),
        Arg::Int(100),
        Arg::Int(-10),
    ];
    let f = p.add_node(
        g,
        Op::CallFunction,
        "f",
        Target::Const(0),
        &args,
        &[("class", Arg::Int(1))],
    );
    p.add_output(g, Arg::Node(f));
    assert_emits!(
        p,
        native(),
        "import torch\nimport operator\n\ndef execution_fn():\n    f = __fx_c0(None, True, -7, -123456789012345678901234567890, -0.0, float('nan'), 1e-05, 'it\\'s \"q\"\\n', b'\\x00\\xffab', __fx_c1, (1,), {'k': float('-inf')}, 1e-05, 0.0, -0.0, 0.0, 1e-05, 0, 9, 10, 99, 100, -10, **{'class': 1})\n    return f\n"
    );
}

#[test]
fn unused_values_and_methods_and_get_attr() {
    let mut p = Program {
        n_consts: 1,
        ..Program::default()
    };
    let g = p.add_graph();
    let x = p.add_placeholder(g, "x", None);
    let _unused = p.add_placeholder(g, "unused", None);
    let w = p.add_node(g, Op::GetAttr, "w", Target::Const(0), &[], &[]);
    let m = p.push_str("add");
    let a = p.add_node(
        g,
        Op::CallMethod,
        "add",
        Target::Method(m),
        &[Arg::Node(x), Arg::Node(w)],
        &[],
    );
    let m2 = p.push_str("bit_length");
    let _dead = p.add_node(
        g,
        Op::CallMethod,
        "dead",
        Target::Method(m2),
        &[Arg::Int(5)],
        &[],
    );
    p.add_output(g, Arg::Node(x));
    let _ = a;
    assert_emits!(
        p,
        native(),
        "import torch\nimport operator\n\ndef execution_fn(x, unused):\n    del unused\n    w = __fx_c0\n    add = x.add(w)\n    del w, add\n    dead = (5).bit_length()\n    del dead\n    return x\n"
    );
}

#[test]
fn layout_errors() {
    let p = stitching();
    let no_submod = Layout {
        with_submod: false,
        ..vllm()
    };
    let e = crate::codegen(&p, &no_submod).unwrap_err().to_string();
    assert!(e.contains("call_module is not allowed"), "{e}");
    assert!(e.contains("submod_0"), "{e}");
    let bad_name = Layout {
        fn_name: "lambda",
        ..native()
    };
    assert!(crate::codegen(&p, &bad_name).is_err());
}

#[test]
fn validation_names_the_node() {
    let mut p = Program::default();
    let g = p.add_graph();
    let bad = p.push_str("x); import os; (");
    p.add_node(
        g,
        Op::CallMethod,
        "evil",
        Target::Method(bad),
        &[Arg::None],
        &[],
    );
    let e = p.validate().unwrap_err().to_string();
    assert!(e.contains("\"evil\"") && e.contains("call_method"), "{e}");
    let mut p = Program::default();
    let g = p.add_graph();
    p.add_node(
        g,
        Op::CallFunction,
        "fwd",
        Target::Getitem,
        &[Arg::Node(3)],
        &[],
    );
    assert!(p
        .validate()
        .unwrap_err()
        .to_string()
        .contains("not an earlier value"));
}

/// A function of about `n` nodes mixing every statement kind the split must keep intact:
/// fused call/getitem pairs, getitem chains, values used far ahead (their `del` crosses the
/// chunk boundaries), floats, keywords, methods and an inlined child called with keywords.
/// `lead` extra nodes come first (moving the pattern against the chunk boundaries); with
/// `rename`, one node in the middle is named `input`, a builtin that must be renamed.
fn mixed(n: usize, lead: usize, rename: bool) -> Program {
    let mut p = Program::default();
    let g = p.add_graph();
    let child = p.add_graph();
    let add = p.push_str("operator.add");
    let cat = p.push_str("torch.cat");
    let relu = p.push_str("relu");
    let view = p.push_str("view");
    let cx = p.add_placeholder(child, "x", None);
    let cy = p.add_placeholder(child, "y", Some(Arg::Int(1)));
    let args = [Arg::Node(cx), Arg::Node(cy)];
    let sum = p.add_node(
        child,
        Op::CallFunction,
        "add",
        Target::Name(add),
        &args,
        &[],
    );
    p.add_output(child, Arg::Node(sum));
    let inl = p.add_submod("inl", SubmodKind::Inline(child));
    let piece = p.add_submod("piece", SubmodKind::Opaque);
    let x = p.add_placeholder(g, "x", None);
    let first = p.add_node(
        g,
        Op::CallMethod,
        "first",
        Target::Method(relu),
        &[Arg::Node(x)],
        &[],
    );
    let mut prev = first;
    for i in 0..lead {
        let args = [Arg::Node(prev)];
        let name = format!("lead_{i}");
        prev = p.add_node(g, Op::CallMethod, &name, Target::Method(relu), &args, &[]);
    }
    let mut k = 0;
    let mut renamed = !rename;
    while p.graphs[0].nodes.len() < n {
        let middle = !renamed && p.graphs[0].nodes.len() >= n / 2;
        renamed |= middle;
        let name = |s: &str| match middle {
            true => "input".to_string(),
            false => format!("{s}_{k}"),
        };
        let item = |p: &mut Program, of: u32, i: i64, nm: &str| {
            let args = [Arg::Node(of), Arg::Int(i)];
            p.add_node(g, Op::CallFunction, nm, Target::Getitem, &args, &[])
        };
        prev = match k % 5 {
            0 => {
                let args = [Arg::Node(prev), Arg::Node(x)];
                let kw = [("scale", Arg::Float(0.25 * k as f64))];
                let c = p.add_node(
                    g,
                    Op::CallModule,
                    &name("c"),
                    Target::Submod(piece),
                    &args,
                    &kw,
                );
                item(&mut p, c, 0, &name("g"))
            }
            1 => {
                let args = [Arg::Node(prev)];
                let c = p.add_node(
                    g,
                    Op::CallModule,
                    &name("c"),
                    Target::Submod(piece),
                    &args,
                    &[],
                );
                let a = item(&mut p, c, 0, &name("g"));
                item(&mut p, a, 1, &name("h"))
            }
            2 => {
                let kw = [("y", Arg::Node(first))];
                let args = [Arg::Node(prev)];
                p.add_node(
                    g,
                    Op::CallModule,
                    &name("i"),
                    Target::Submod(inl),
                    &args,
                    &kw,
                )
            }
            3 => {
                let args = [Arg::Node(prev), Arg::Int(-1)];
                p.add_node(
                    g,
                    Op::CallMethod,
                    &name("m"),
                    Target::Method(view),
                    &args,
                    &[],
                )
            }
            _ => {
                let l = p.list(&[Arg::Node(prev), Arg::Node(x), Arg::Float(1e-5)]);
                let kw = [("dim", Arg::Int(0))];
                p.add_node(
                    g,
                    Op::CallFunction,
                    &name("cat"),
                    Target::Name(cat),
                    &[l],
                    &kw,
                )
            }
        };
        k += 1;
    }
    let out = p.tuple(&[Arg::Node(prev), Arg::Node(first)]);
    p.add_output(g, out);
    p
}

#[test]
fn two_threads_emit_the_same_source_on_large_functions() {
    use crate::emit::{emit_with_threads, SPECULATE_MAX_NODES};
    // Large enough that both threads take chunks of the statements: with the guessed names
    // (kept or dropped), and past the guessing limit, where the names and last uses are
    // worked out side by side first.
    for (n, rename) in [
        (100_000, false),
        (100_000, true),
        (SPECULATE_MAX_NODES + 1_000, false),
    ] {
        let p = mixed(n, 5, rename);
        p.validate().expect("valid");
        let layout = native();
        let one = emit_with_threads(&p, &layout, 1).concat();
        let two = emit_with_threads(&p, &layout, 2);
        assert!(one.len() > 10 * n);
        assert_eq!(one, two.concat(), "{n} nodes, rename {rename}");
        assert_eq!(one, two.into_string(), "{n} nodes, rename {rename}");
    }
}

/// `Source::into_string` joins the pieces in the first buffer: pieces of it that stay, move up
/// over their old place, or come from other buffers; a piece that would have to move down
/// falls back to a copy. Each way gives the joined text.
#[test]
fn a_source_joins_in_its_first_buffer() {
    use crate::emit::Source;
    type Pieces<'a> = &'a [(usize, std::ops::Range<usize>)];
    let source = |buffers: &[&str], pieces: Pieces| Source {
        buffers: buffers.iter().map(|b| b.to_string()).collect(),
        pieces: pieces.to_vec(),
    };
    let cases: [(&[&str], Pieces, &str); 6] = [
        (&[], &[], ""),
        (&["abc"], &[(0, 0..3)], "abc"),
        // Whole pieces in place, with text past the last piece dropped.
        (&["abcdef"], &[(0, 0..2), (0, 2..4)], "abcd"),
        // Interleaved chunks of two threads: the first buffer's move up, over themselves.
        (
            &["head|A1A1|A3|tail", "B2B2B2|B4"],
            &[
                (0, 0..5),
                (0, 5..9),
                (1, 0..6),
                (0, 9..12),
                (1, 6..9),
                (0, 12..17),
            ],
            "head|A1A1B2B2B2|A3|B4|tail",
        ),
        // Pieces of the first buffer out of order: a copy.
        (
            &["abcd", "xy"],
            &[(0, 2..4), (1, 0..2), (0, 0..2)],
            "cdxyab",
        ),
        // A piece that would move down (text before it is in no piece): a copy.
        (
            &["--abcd", "xy"],
            &[(0, 2..4), (1, 0..2), (0, 4..6)],
            "abxycd",
        ),
    ];
    for (buffers, pieces, want) in cases {
        let s = source(buffers, pieces);
        assert_eq!(s.concat(), want);
        let joined = s.into_string();
        assert_eq!(joined, want, "{buffers:?} {pieces:?}");
    }
    // The first buffer itself, grown in place when it has room.
    let mut first = String::with_capacity(64);
    first.push_str("ab");
    let at = first.as_ptr();
    let s = Source {
        buffers: vec![first, "cd".to_string()],
        pieces: vec![(0, 0..2), (1, 0..2)],
    };
    let joined = s.into_string();
    assert_eq!((joined.as_str(), joined.as_ptr()), ("abcd", at));
}

/// A source one thread writes is the whole text of its first buffer: the one it was given
/// while it has room (so a caller's memory can hold it), a new one when it outgrows that.
/// Written by two threads, it is not.
#[test]
fn a_source_one_thread_writes_is_its_first_buffer_whole() {
    use crate::emit::{
        emit_streamed, emit_with_threads, expected_size, one_writer, PARALLEL_MIN_NODES,
    };
    let layout = native();
    let p = mixed(2_000, 3, true);
    p.validate().expect("valid");
    let want = emit_with_threads(&p, &layout, 1).concat();
    assert!(one_writer(&p, 2, PARALLEL_MIN_NODES));
    for cap in [expected_size(&p).1, 64] {
        let into = String::with_capacity(cap);
        let at = into.as_ptr();
        let code = emit_streamed(&p, &layout, 2, PARALLEL_MIN_NODES, Vec::new(), Some(into));
        let whole = code.whole().expect("one buffer");
        assert_eq!(whole, want);
        assert_eq!(whole.as_ptr() == at, cap > 64, "{cap}");
    }
    let p = mixed(PARALLEL_MIN_NODES + 100, 3, false);
    assert!(!one_writer(&p, 2, PARALLEL_MIN_NODES) && one_writer(&p, 1, PARALLEL_MIN_NODES));
    assert!(emit_with_threads(&p, &layout, 2).whole().is_none());
    let one = emit_with_threads(&p, &layout, 1);
    assert_eq!(one.whole(), Some(one.concat().as_str()));
}

#[test]
fn two_threads_emit_the_same_source() {
    use crate::emit::{emit_with_threads, PARALLEL_MIN_NODES};
    // Leads that put the chunk boundaries on each node of the eight-node cycle of `mixed`,
    // with every name kept (the statements are started before the names are known) and with
    // one renamed (that start is thrown away).
    for lead in 0..12 {
        for rename in [false, true] {
            let n = PARALLEL_MIN_NODES + 3 * lead;
            let p = mixed(n, lead, rename);
            p.validate().expect("valid");
            for layout in [native(), vllm()] {
                let one = emit_with_threads(&p, &layout, 1).concat();
                let two = emit_with_threads(&p, &layout, 2);
                assert!(one.len() > 100 * PARALLEL_MIN_NODES / 10);
                assert_eq!(one.contains("input_"), rename);
                assert_eq!(one, two.concat(), "lead {lead}, rename {rename}");
                assert_eq!(one.len(), two.len());
                assert_eq!(one, two.into_string(), "lead {lead}, rename {rename}");
            }
        }
    }
}

/// Long items in every place the emitter writes in windows of unchecked appends (`crate::out`):
/// names, keys, call targets and method names of 16, 17, 32, 33 and more bytes, long strings,
/// containers, a long `del` line, and statements in both layouts. The expected source is what
/// the emitter wrote before it had windows (every append checked).
fn long_items() -> Program {
    let mut p = Program::default();
    let g = p.add_graph();
    let s = p.add_submod("a_submodule_whose_name_is_long_too", SubmodKind::Opaque);
    let names = [
        "a_placeholder_name_longer_than_32_b",
        "b_sixteen_bytes_",
        "c_seventeen_bytes",
        "d_thirty_two_bytes_long_exactly_",
        "e_thirty_three_bytes_long_exactly",
    ];
    let ps: Vec<u32> = names
        .iter()
        .map(|n| p.add_placeholder(g, n, None))
        .collect();
    let refs: Vec<Arg> = (0..12).map(|k| Arg::Node(ps[k % ps.len()])).collect();
    let many = p.list(&refs);
    let text = "it's \"quoted\"\\ and\nlong é€ ".repeat(2);
    let long_str = Arg::Str(p.push_str(&text));
    let big = Arg::BigInt(p.push_str("-98765432109876543210987654321"));
    let strs = p.tuple(&[long_str, big, Arg::Float(-2.2250738585072014e-308)]);
    let pairs: Vec<(Arg, Arg)> = (0..3)
        .map(|k| {
            let key = format!("key number {k} with spaces and a long tail");
            (Arg::Str(p.push_str(&key)), Arg::Node(ps[k % ps.len()]))
        })
        .collect();
    let dict = p.dict(&pairs);
    let target =
        Target::Name(p.push_str("torch.ops.aten.an_operator_with_a_very_long_name.default"));
    let c = p.add_node(
        g,
        Op::CallFunction,
        "c_call_result_named_at_length_40_bytes__",
        target,
        &[Arg::Node(ps[0]), Arg::Node(ps[1]), many, strs],
        &[
            ("k", Arg::Int(1)),
            ("a_keyword_that_is_long_enough_40_chars__", Arg::Node(ps[2])),
            ("sixteen_char_key", Arg::Float(0.5)),
            ("key_of_thirty_three_bytes_exactly", dict),
        ],
    );
    let m = Target::Method(p.push_str("a_method_name_that_is_quite_long_too"));
    let d = p.add_node(
        g,
        Op::CallMethod,
        "d",
        m,
        &[Arg::Node(c), Arg::Node(ps[3]), Arg::Node(ps[4])],
        &[("not an identifier", Arg::Node(ps[0]))],
    );
    let e = p.add_node(
        g,
        Op::CallModule,
        "e_fused_call_of_a_long_named_child",
        Target::Submod(s),
        &[Arg::Node(d)],
        &[],
    );
    let f = p.add_node(
        g,
        Op::CallFunction,
        "getitem",
        Target::Getitem,
        &[Arg::Node(e), Arg::Int(0)],
        &[],
    );
    let out = p.tuple(&[Arg::Node(f), Arg::Node(ps[1])]);
    p.add_output(g, out);
    p
}

#[test]
fn long_items_in_every_window() {
    assert_emits!(
        long_items(),
        native(),
        r#"import torch
import operator

def execution_fn(a_placeholder_name_longer_than_32_b, b_sixteen_bytes_, c_seventeen_bytes, d_thirty_two_bytes_long_exactly_, e_thirty_three_bytes_long_exactly):
    c_call_result_named_at_length_40_bytes__ = torch.ops.aten.an_operator_with_a_very_long_name.default(a_placeholder_name_longer_than_32_b, b_sixteen_bytes_, [a_placeholder_name_longer_than_32_b, b_sixteen_bytes_, c_seventeen_bytes, d_thirty_two_bytes_long_exactly_, e_thirty_three_bytes_long_exactly, a_placeholder_name_longer_than_32_b, b_sixteen_bytes_, c_seventeen_bytes, d_thirty_two_bytes_long_exactly_, e_thirty_three_bytes_long_exactly, a_placeholder_name_longer_than_32_b, b_sixteen_bytes_], ('it\'s "quoted"\\ and\nlong \xe9\u20ac it\'s "quoted"\\ and\nlong \xe9\u20ac ', -98765432109876543210987654321, -2.2250738585072014e-308), k=1, a_keyword_that_is_long_enough_40_chars__=c_seventeen_bytes, sixteen_char_key=0.5, key_of_thirty_three_bytes_exactly={'key number 0 with spaces and a long tail': a_placeholder_name_longer_than_32_b, 'key number 1 with spaces and a long tail': b_sixteen_bytes_, 'key number 2 with spaces and a long tail': c_seventeen_bytes})
    del c_seventeen_bytes
    d = c_call_result_named_at_length_40_bytes__.a_method_name_that_is_quite_long_too(d_thirty_two_bytes_long_exactly_, e_thirty_three_bytes_long_exactly, **{'not an identifier': a_placeholder_name_longer_than_32_b})
    del a_placeholder_name_longer_than_32_b, d_thirty_two_bytes_long_exactly_, e_thirty_three_bytes_long_exactly, c_call_result_named_at_length_40_bytes__
    getitem = __fx_s0(d)[0]
    del d
    return (getitem, b_sixteen_bytes_)
"#
    );
    assert_emits!(
        long_items(),
        vllm(),
        r#"import torch
import operator

def execution_fn(a_placeholder_name_longer_than_32_b, b_sixteen_bytes_, c_seventeen_bytes, d_thirty_two_bytes_long_exactly_, e_thirty_three_bytes_long_exactly, *, __vllm_submods__):
    c_call_result_named_at_length_40_bytes__ = torch.ops.aten.an_operator_with_a_very_long_name.default(a_placeholder_name_longer_than_32_b, b_sixteen_bytes_, [a_placeholder_name_longer_than_32_b, b_sixteen_bytes_, c_seventeen_bytes, d_thirty_two_bytes_long_exactly_, e_thirty_three_bytes_long_exactly, a_placeholder_name_longer_than_32_b, b_sixteen_bytes_, c_seventeen_bytes, d_thirty_two_bytes_long_exactly_, e_thirty_three_bytes_long_exactly, a_placeholder_name_longer_than_32_b, b_sixteen_bytes_], ('it\'s "quoted"\\ and\nlong \xe9\u20ac it\'s "quoted"\\ and\nlong \xe9\u20ac ', -98765432109876543210987654321, -2.2250738585072014e-308), k=1, a_keyword_that_is_long_enough_40_chars__=c_seventeen_bytes, sixteen_char_key=0.5, key_of_thirty_three_bytes_exactly={'key number 0 with spaces and a long tail': a_placeholder_name_longer_than_32_b, 'key number 1 with spaces and a long tail': b_sixteen_bytes_, 'key number 2 with spaces and a long tail': c_seventeen_bytes})
    del c_seventeen_bytes
    d = c_call_result_named_at_length_40_bytes__.a_method_name_that_is_quite_long_too(d_thirty_two_bytes_long_exactly_, e_thirty_three_bytes_long_exactly, **{'not an identifier': a_placeholder_name_longer_than_32_b})
    del a_placeholder_name_longer_than_32_b, d_thirty_two_bytes_long_exactly_, e_thirty_three_bytes_long_exactly, c_call_result_named_at_length_40_bytes__
    e_fused_call_of_a_long_named_child = __vllm_submods__[0](d)
    del d
    getitem = e_fused_call_of_a_long_named_child[0]
    del e_fused_call_of_a_long_named_child
    return (getitem, b_sixteen_bytes_)
"#
    );
}

/// `p`'s root as the helper writes a root read in batches of `batch` nodes ([`Body`]): each
/// batch in a program of its own (its arguments copied, spans counting from the batch's start,
/// no submodules), then assembled around the names and last uses of the whole graph.
fn written_in_batches(p: &Program, layout: &Layout, batch: usize) -> String {
    use crate::emit::{Body, Count, Fill};
    use crate::ir::{Node, Span};
    use crate::names::{self, Reserved};

    fn copy_args(p: &Program, b: &mut Program, s: Span) -> Span {
        let items: Vec<Arg> = s
            .range()
            .map(|k| match p.arg(k) {
                Arg::Tuple(s) => Arg::Tuple(copy_args(p, b, s)),
                Arg::List(s) => Arg::List(copy_args(p, b, s)),
                Arg::Dict(s) => Arg::Dict(copy_args(p, b, s)),
                other => other,
            })
            .collect();
        b.push_args(&items)
    }

    let g = &p.graphs[0];
    let reserved = Reserved {
        prefix: layout.style.prefix(),
        fn_name: layout.fn_name,
    };
    let names = names::assign(p, g, &reserved);
    let live = crate::liveness::compute(p, g);
    let mut body = Body::default();
    for (k, chunk) in g.nodes.chunks(batch).enumerate() {
        let mut b = Program {
            text: p.text.clone(),
            blobs: p.blobs.clone(),
            ..Program::default()
        };
        let nodes: Vec<Node> = chunk
            .iter()
            .map(|n| {
                let start = copy_args(p, &mut b, n.all_args()).start;
                Node {
                    args: Span { start, ..n.args },
                    ..*n
                }
            })
            .collect();
        body.write(&b, layout, &names, &nodes, (k * batch) as u32);
    }
    let mut count = Count::default();
    body.module(layout, &names, &live, &mut count);
    let mut buf = vec![0; count.0];
    let mut fill = Fill::new(&mut buf);
    body.module(layout, &names, &live, &mut fill);
    assert!(fill.full() && fill.ascii);
    // Written in two parts, on two threads, from any statement on: the same bytes.
    let n = body.nodes();
    assert_eq!(
        body.split(&live),
        body.statement_from(body.split(&live), &live)
    );
    for j in 0..=n {
        let mid = body.statement_from(j, &live);
        let (len, at) = body.count(layout, &names, &live, mid);
        assert_eq!(len, count.0);
        let mut halves = vec![0; len];
        let mut fill = Fill::new(&mut halves);
        fill.split(
            at,
            |w| {
                body.head(layout, &names, w);
                body.statements(0..mid, &names, &live, w);
            },
            |w| {
                body.statements(mid..n, &names, &live, w);
                body.tail(w);
            },
        );
        assert!(fill.full() && fill.ascii, "split at node {mid}");
        assert_eq!(halves, buf, "split at node {mid}");
    }
    String::from_utf8(buf).expect("UTF-8")
}

/// Getitems of getitems (fused and not, the receiver a call or a getitem), values used twice,
/// a parameter default and a nested output.
fn items() -> Program {
    let mut p = Program::default();
    let g = p.add_graph();
    let piece = p.add_submod("piece", SubmodKind::Opaque);
    let x = p.add_placeholder(g, "x", None);
    let s = p.add_placeholder(g, "s", Some(Arg::Float(1e-5)));
    let item = |p: &mut Program, of: u32, i: i64, nm: &str| {
        let args = [Arg::Node(of), Arg::Int(i)];
        p.add_node(g, Op::CallFunction, nm, Target::Getitem, &args, &[])
    };
    let mut prev = x;
    for k in 0..6 {
        let kw = [("d", p.dict(&[(Arg::Int(k), Arg::Node(s))]))];
        let c = p.add_node(
            g,
            Op::CallModule,
            &format!("c{k}"),
            Target::Submod(piece),
            &[Arg::Node(prev)],
            &kw,
        );
        let a = item(&mut p, c, 0, &format!("a{k}"));
        prev = match k % 3 {
            // `c` fuses with `a` (used once), so the item of `a` does not.
            0 => item(&mut p, a, 1, &format!("b{k}")),
            // An item of `a` right after it, which fuses with it; `c` used twice: no fusing.
            1 => {
                let b = item(&mut p, a, 2, &format!("b{k}"));
                let other = item(&mut p, c, 1, &format!("o{k}"));
                let l = p.list(&[Arg::Node(b), Arg::Node(other)]);
                let t = p.push_str("torch.stack");
                p.add_node(
                    g,
                    Op::CallFunction,
                    &format!("t{k}"),
                    Target::Name(t),
                    &[l],
                    &[],
                )
            }
            _ => a,
        };
    }
    let out = p.tuple(&[Arg::Node(prev), Arg::Node(x)]);
    p.add_output(g, out);
    p
}

#[test]
fn a_root_written_in_batches_equals_the_emitted_one() {
    let fused = |p: Program| {
        let code = crate::codegen(&p, &native()).expect("codegen");
        assert!(
            code.contains("    a0 = __fx_s0(x, d={0: s})[0]\n"),
            "{code}"
        );
        assert!(code.contains("    b1 = c1[0][2]\n"), "{code}");
        p
    };
    for p in [stitching(), long_items(), fused(items())] {
        p.validate().expect("valid");
        let want = crate::codegen(&p, &native()).expect("codegen");
        for batch in [1, 2, 3, 7, p.graphs[0].nodes.len()] {
            let got = written_in_batches(&p, &native(), batch);
            assert_eq!(got, want, "batches of {batch}");
        }
    }
}

#[test]
fn a_fill_given_more_than_counted_stops_and_is_not_full() {
    use crate::emit::{Fill, Sink};
    let mut buf = [0u8; 4];
    let mut fill = Fill::new(&mut buf);
    fill.put(b"abc");
    assert!(!fill.full());
    fill.put(b"de");
    fill.put(b"f");
    assert!(!fill.full(), "more came than was counted");
    assert_eq!(&buf, b"abc\0");
    let mut buf = [0u8; 4];
    let mut fill = Fill::new(&mut buf);
    fill.put(b"abcd");
    assert!(fill.full() && fill.ascii);
    // Split: either part given more (or less) than its share is not full; non-ASCII shows.
    let parts = |first: &'static [u8], rest: &'static [u8]| {
        let mut buf = [0u8; 4];
        let mut fill = Fill::new(&mut buf);
        fill.put(b"a");
        fill.split(2, |w| w.put(first), |w| w.put(rest));
        (fill.full(), fill.ascii, buf)
    };
    assert_eq!(parts(b"bc", b"d"), (true, true, *b"abcd"));
    assert!(!parts(b"b", b"cd").0, "the first part fell short");
    assert!(!parts(b"bcd", b"").0, "the first part ran over");
    assert!(!parts(b"bc", b"de").0, "the second part ran over");
    assert!(!parts(b"bc", &[0xc3]).1, "a byte that is not ASCII");
}
