//! Golden tests of the emitter: small programs and their exact source.

use crate::builder::Build;
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
    let half = p.float(0.5);
    let a = p.add_node(
        g,
        Op::CallModule,
        "submod_0",
        Target::Submod(s0),
        &[Arg::Node(x), Arg::Node(n)],
        &[("scale", half), ("sizes", sizes)],
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
    let big = p.big_int("-123456789012345678901234567890");
    let s = p.str_arg("it's \"q\"\n");
    let b = p.bytes(b"\x00\xffab");
    let one = p.tuple(&[Arg::Int(1)]);
    let k = p.str_arg("k");
    let ninf = p.float(f64::NEG_INFINITY);
    let d = p.dict(&[(k, ninf)]);
    let mut f = |v: f64| p.float(v);
    let (m0, nan, tiny, z) = (f(-0.0), f(f64::NAN), f(1e-5), f(0.0));
    let args = [
        Arg::None,
        Arg::Bool(true),
        Arg::Int(-7),
        big,
        m0,
        nan,
        tiny,
        s,
        b,
        Arg::Const(1),
        one,
        d,
        // Repeats (the last float, an older one) and -0.0 against 0.0; ints of 1-3 digits.
        tiny,
        z,
        m0,
        z,
        tiny,
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
    let e = crate::codegen(&p, &native()).unwrap_err().to_string();
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
    let e = crate::codegen(&p, &native()).unwrap_err().to_string();
    assert!(e.contains("not a node defined earlier"), "{e}");
}

/// Long items in every place the emitter writes: names, keys, call targets and method names of
/// 16, 17, 32, 33 and more bytes, long strings, containers, a long `del` line, and statements in
/// both layouts.
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
    let long_str = p.str_arg(&text);
    let big = p.big_int("-98765432109876543210987654321");
    let small = p.float(-2.2250738585072014e-308);
    let strs = p.tuple(&[long_str, big, small]);
    let pairs: Vec<(Arg, Arg)> = (0..3)
        .map(|k| {
            let key = format!("key number {k} with spaces and a long tail");
            (p.str_arg(&key), Arg::Node(ps[k % ps.len()]))
        })
        .collect();
    let dict = p.dict(&pairs);
    let target =
        Target::Name(p.push_str("torch.ops.aten.an_operator_with_a_very_long_name.default"));
    let half = p.float(0.5);
    let c = p.add_node(
        g,
        Op::CallFunction,
        "c_call_result_named_at_length_40_bytes__",
        target,
        &[Arg::Node(ps[0]), Arg::Node(ps[1]), many, strs],
        &[
            ("k", Arg::Int(1)),
            ("a_keyword_that_is_long_enough_40_chars__", Arg::Node(ps[2])),
            ("sixteen_char_key", half),
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

/// Getitems of getitems (fused and not, the receiver a call or a getitem), values used twice,
/// a parameter default and a nested output.
fn items() -> Program {
    let mut p = Program::default();
    let g = p.add_graph();
    let piece = p.add_submod("piece", SubmodKind::Opaque);
    let x = p.add_placeholder(g, "x", None);
    let tiny = p.float(1e-5);
    let s = p.add_placeholder(g, "s", Some(tiny));
    let item = |p: &mut Program, of: u32, i: i32, nm: &str| {
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
fn getitems_fuse_with_the_call_they_take_an_item_of() {
    let code = crate::codegen(&items(), &native()).expect("codegen");
    assert!(
        code.contains("    a0 = __fx_s0(x, d={0: s})[0]\n"),
        "{code}"
    );
    assert!(code.contains("    b1 = c1[0][2]\n"), "{code}");
}

/// The size bound holds for every program here, in both layouts.
#[test]
fn the_size_bound_bounds_the_source() {
    for p in [stitching(), long_items(), items(), shared_child()] {
        for layout in [native(), vllm()] {
            let code = crate::codegen(&p, &layout).expect("codegen");
            let bound = crate::emit::size_bound(&p, &layout);
            assert!(code.len() as u64 <= bound, "{} > {bound}", code.len());
        }
    }
}

/// One child graph inlined under three names (two of them called twice).
fn shared_child() -> Program {
    let mut p = Program::default();
    let root = p.add_graph();
    let child = p.add_graph();
    let x = p.add_placeholder(child, "x", None);
    let neg = p.push_str("operator.neg");
    let n = p.add_node(
        child,
        Op::CallFunction,
        "neg",
        Target::Name(neg),
        &[Arg::Node(x)],
        &[],
    );
    p.add_output(child, Arg::Node(n));
    let mut prev = p.add_placeholder(root, "x", None);
    let subs: Vec<u32> = (0..3)
        .map(|i| p.add_submod(&format!("sub{i}"), SubmodKind::Inline(child)))
        .collect();
    for (k, &sm) in subs.iter().chain(&subs[1..]).enumerate() {
        let name = format!("c{k}");
        let args = [Arg::Node(prev)];
        prev = p.add_node(root, Op::CallModule, &name, Target::Submod(sm), &args, &[]);
    }
    p.add_output(root, Arg::Node(prev));
    p
}

#[test]
fn each_inlined_graph_is_defined_once() {
    assert_emits!(
        shared_child(),
        native(),
        "import torch\nimport operator\n\ndef __fx_f0(x):\n    neg = operator.neg(x)\n    del x\n    return neg\n\ndef execution_fn(x):\n    c0 = __fx_f0(x)\n    del x\n    c1 = __fx_f0(c0)\n    del c0\n    c2 = __fx_f0(c1)\n    del c1\n    c3 = __fx_f0(c2)\n    del c2\n    c4 = __fx_f0(c3)\n    del c3\n    return c4\n"
    );
    let code = crate::codegen(&shared_child(), &vllm()).expect("codegen");
    assert_eq!(
        code.matches("def __vllm_inlined_submods__").count(),
        1,
        "{code}"
    );
}

#[test]
fn a_keyword_given_twice_is_rejected() {
    let mut p = Program::default();
    let g = p.add_graph();
    let name = p.push_str("operator.add");
    let kw = [("k", Arg::Int(1)), ("k", Arg::Int(2))];
    p.add_node(g, Op::CallFunction, "twice", Target::Name(name), &[], &kw);
    let e = crate::codegen(&p, &native()).unwrap_err().to_string();
    assert!(
        e.contains("\"k\" is given twice") && e.contains("twice"),
        "{e}"
    );
}

#[test]
fn a_placeholder_default_that_is_a_node_is_rejected() {
    let mut p = Program::default();
    let g = p.add_graph();
    let x = p.add_placeholder(g, "x", None);
    p.add_placeholder(g, "y", Some(Arg::Node(x)));
    let e = crate::codegen(&p, &native()).unwrap_err().to_string();
    assert!(
        e.contains("refers to node \"x\"") && e.contains("\"y\""),
        "{e}"
    );
    // Also inside a container.
    let mut p = Program::default();
    let g = p.add_graph();
    let x = p.add_placeholder(g, "x", None);
    let t = p.tuple(&[Arg::Int(1), Arg::Node(x)]);
    p.add_placeholder(g, "y", Some(t));
    assert!(crate::codegen(&p, &native()).is_err());
}

#[test]
fn int_text_python_would_not_read_is_rejected() {
    for (text, ok) in [("-7", true), ("-007", false), ("00", false), ("12a", false)] {
        let mut p = Program::default();
        let g = p.add_graph();
        let v = p.big_int(text);
        p.add_output(g, v);
        assert_eq!(crate::codegen(&p, &native()).is_ok(), ok, "{text}");
    }
    let mut p = Program::default();
    let g = p.add_graph();
    let v = p.big_int(&"9".repeat(4301));
    p.add_output(g, v);
    assert!(crate::codegen(&p, &native()).is_err());
}
