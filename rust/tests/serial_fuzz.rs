//! The serialized node list as untrusted input: random valid programs round-trip exactly, and
//! mutated, truncated or random bytes never panic and never emit anything but the expected
//! statement shapes. `FXCODEGEN_FUZZ_ITERS` sets the mutation-loop length (`make fuzz`).

use fxcodegen::ir::{Arg, Op, Program, SubmodKind, Target};
use fxcodegen::{codegen, serial, Layout, Style};
use proptest::prelude::*;

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

const NAMES: &[&str] = &[
    "x",
    "y",
    "torch",
    "operator",
    "len",
    "class",
    "__fx_c0",
    "__vllm_submods__",
    "execution_fn",
    "a b",
    "9lives",
    "",
    "é",
    "x); import os; (",
    "getitem",
    "submod_0",
];
const STRS: &[&str] = &[
    "",
    "it's",
    "\"q\"",
    "\\",
    "\n",
    "\u{0}",
    "é€😀",
    "x); import os; (",
];

fn arg(r: &mut Rng, p: &mut Program, nodes: u32, n_consts: u32, depth: u32) -> Arg {
    match r.below(if depth > 2 { 10 } else { 13 }) {
        0 if nodes > 0 => Arg::Node(r.below(nodes as u64) as u32),
        1 => Arg::None,
        2 => Arg::Bool(r.below(2) == 1),
        3 => Arg::Int(r.next() as i64 >> r.below(63)),
        4 => Arg::BigInt(p.push_str("-98765432109876543210987654321")),
        5 => Arg::Float(f64::from_bits(r.next())),
        6 => Arg::Str(p.push_str(STRS[r.below(STRS.len() as u64) as usize])),
        7 => Arg::Bytes(p.push_bytes(&r.next().to_le_bytes()[..r.below(8) as usize])),
        8 | 9 if n_consts > 0 => Arg::Const(r.below(n_consts as u64) as u32),
        10 => {
            let items: Vec<Arg> = (0..r.below(3))
                .map(|_| arg(r, p, nodes, n_consts, depth + 1))
                .collect();
            p.tuple(&items)
        }
        11 => {
            let items: Vec<Arg> = (0..r.below(3))
                .map(|_| arg(r, p, nodes, n_consts, depth + 1))
                .collect();
            p.list(&items)
        }
        12 => {
            let items: Vec<(Arg, Arg)> = (0..r.below(3))
                .map(|_| {
                    (
                        Arg::Str(p.push_str("k")),
                        arg(r, p, nodes, n_consts, depth + 1),
                    )
                })
                .collect();
            p.dict(&items)
        }
        _ => Arg::Int(0),
    }
}

/// A random program that passes validation: a root, up to two inlined children, opaque children.
fn program(seed: u64) -> Program {
    let mut r = Rng(seed | 1);
    let mut p = Program {
        n_consts: r.below(4) as u32,
        ..Program::default()
    };
    let n_graphs = 1 + r.below(3) as u32;
    for _ in 0..n_graphs {
        p.add_graph();
    }
    let mut inline = Vec::new();
    for g in 1..n_graphs {
        inline.push(p.add_submod(&format!("child_{g}"), SubmodKind::Inline(g)));
    }
    let opaque = p.add_submod("piece", SubmodKind::Opaque);
    let n_consts = p.n_consts;
    for g in (0..n_graphs).rev() {
        let n_params = r.below(3) as u32;
        for k in 0..n_params {
            let name = NAMES[r.below(NAMES.len() as u64) as usize];
            let param = p.push_str(name);
            let _ = k;
            p.add_node(g, Op::Placeholder, name, Target::Param(param), &[], &[]);
        }
        let body = r.below(8) as u32;
        for j in 0..body {
            let nodes = n_params + j;
            let name = NAMES[r.below(NAMES.len() as u64) as usize];
            let n_args = 1 + r.below(3);
            let args: Vec<Arg> = (0..n_args)
                .map(|_| arg(&mut r, &mut p, nodes, n_consts, 0))
                .collect();
            let kw_val = arg(&mut r, &mut p, nodes, n_consts, 0);
            let key = NAMES[r.below(NAMES.len() as u64) as usize];
            let kwargs = [(key, kw_val)];
            let (op, target) = match r.below(5) {
                0 if g == 0 => (Op::CallModule, Target::Submod(opaque)),
                1 if !inline.is_empty() && g == 0 => (
                    Op::CallModule,
                    Target::Submod(inline[r.below(inline.len() as u64) as usize]),
                ),
                2 => (Op::CallFunction, Target::Getitem),
                3 => (Op::CallMethod, Target::Method(p.push_str("add"))),
                _ => (
                    Op::CallFunction,
                    Target::Name(p.push_str("torch.ops.aten.add.Tensor")),
                ),
            };
            p.add_node(g, op, name, target, &args, &kwargs);
        }
        let nodes = n_params + body;
        let out = arg(&mut r, &mut p, nodes, n_consts, 0);
        p.add_output(g, out);
    }
    p
}

/// Every line of emitted code has one of the shapes the emitter writes: no statement can have
/// been smuggled in through a name or a string.
fn assert_shapes(code: &str) {
    for line in code.lines() {
        let ok = line.is_empty()
            || line == "import torch"
            || line == "import operator"
            || (line.starts_with("def ") && line.ends_with("):"))
            || line.starts_with("    del ")
            || line.starts_with("    return ")
            || line
                .strip_prefix("    ")
                .and_then(|l| l.split_once(" = "))
                .is_some_and(|(lhs, _)| {
                    lhs.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_')
                });
        assert!(ok, "unexpected line {line:?} in\n{code}");
        assert_one_statement(line);
    }
}

/// Outside string literals a line has no `;` or `#` and its brackets balance: it is exactly one
/// statement, so nothing can have been appended to it.
fn assert_one_statement(line: &str) {
    let b = line.as_bytes();
    let mut depth = 0i32;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            q @ (b'\'' | b'"') => {
                i += 1;
                while i < b.len() && b[i] != q {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                assert!(i < b.len(), "unterminated string in {line:?}");
            }
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => {
                depth -= 1;
                assert!(depth >= 0, "unbalanced brackets in {line:?}");
            }
            b';' | b'#' => panic!("statement separator or comment outside a string in {line:?}"),
            _ => {}
        }
        i += 1;
    }
    assert_eq!(depth, 0, "unbalanced brackets in {line:?}");
}

#[test]
fn random_programs_round_trip() {
    for seed in 0..3000u64 {
        let p = program(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        p.validate()
            .unwrap_or_else(|e| panic!("seed {seed}: generator made an invalid program: {e}"));
        let data = serial::write(&p);
        let q = serial::read(&data).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        for style in [Style::Native, Style::Vllm] {
            let layout = Layout {
                style,
                ..Layout::native()
            };
            let a = codegen(&p, &layout);
            let b = codegen(&q, &layout);
            assert_eq!(a, b, "seed {seed}");
            if let Ok(code) = a {
                assert_shapes(&code);
            }
        }
        assert_eq!(
            serial::write(&q),
            data,
            "seed {seed}: re-serialization differs"
        );
    }
}

fn mutate(r: &mut Rng, data: &mut Vec<u8>) {
    for _ in 0..1 + r.below(4) {
        if data.is_empty() {
            data.push(r.next() as u8);
            continue;
        }
        let at = r.below(data.len() as u64) as usize;
        match r.below(6) {
            0 => data[at] ^= 1 << r.below(8),
            1 => data[at] = r.next() as u8,
            2 => data.truncate(at),
            3 => data.insert(at, r.next() as u8),
            4 => {
                data.remove(at);
            }
            _ => {
                // A huge varint where a count may be.
                let tail = data.split_off(at);
                data.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f]);
                data.extend_from_slice(&tail);
            }
        }
    }
}

fn check_untrusted(data: &[u8]) {
    if let Ok(p) = serial::read(data) {
        for style in [Style::Native, Style::Vllm] {
            let layout = Layout {
                style,
                ..Layout::native()
            };
            if let Ok(code) = codegen(&p, &layout) {
                assert_shapes(&code);
            }
        }
    }
}

#[test]
fn mutated_input_never_panics() {
    let iters: u64 = std::env::var("FXCODEGEN_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let seeds: Vec<Vec<u8>> = (0..64u64)
        .map(|s| serial::write(&program(s * 7919 + 1)))
        .collect();
    let mut r = Rng(0x1234_5678_9abc_def1);
    let mut accepted = 0u64;
    for _ in 0..iters {
        let mut data = seeds[r.below(seeds.len() as u64) as usize].clone();
        mutate(&mut r, &mut data);
        check_untrusted(&data);
        accepted += serial::read(&data).is_ok() as u64;
    }
    eprintln!("fuzz loop: {iters} mutated inputs, {accepted} accepted as valid programs");
}

#[test]
fn every_truncation_is_an_error() {
    let data = serial::write(&program(42));
    for cut in 0..data.len() {
        assert!(serial::read(&data[..cut]).is_err(), "cut at {cut} accepted");
    }
}

#[test]
fn injection_attempts_are_rejected_or_escaped() {
    let mut p = Program::default();
    let g = p.add_graph();
    let x = p.add_placeholder(g, "x); import os; (", None);
    let s = Arg::Str(p.push_str("'); import os; ('"));
    let m = p.push_str("torch.ops.aten.add.Tensor");
    let n = p.add_node(
        g,
        Op::CallFunction,
        "y\nimport os",
        Target::Name(m),
        &[Arg::Node(x), s],
        &[("a); import os; (", Arg::None)],
    );
    p.add_output(g, Arg::Node(n));
    let code = codegen(&p, &Layout::native()).unwrap();
    assert_shapes(&code);
    for bad in [
        "os.system",
        "eval",
        "torch.x;y",
        "__import__",
        "exec",
        "torch.os.system",
        "torch.load",
        "getattr",
        "operator.attrgetter",
        "operator.call",
        "torch.ops.aten.__class__",
    ] {
        let mut q = Program::default();
        let g = q.add_graph();
        let m = q.push_str(bad);
        q.add_node(g, Op::CallFunction, "f", Target::Name(m), &[], &[]);
        assert!(serial::read(&serial::write(&q)).is_err(), "{bad} accepted");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        check_untrusted(&data);
    }

    #[test]
    fn arbitrary_bodies_after_a_valid_header_never_panic(
        body in proptest::collection::vec(any::<u8>(), 0..512),
    ) {
        let mut data = b"FXCG\x01".to_vec();
        data.extend_from_slice(&body);
        check_untrusted(&data);
    }
}
