//! The serialized node list: a compact, versioned binary form of a [`Program`].
//!
//! Layout (all counts and indices are unsigned LEB128 varints, `str` is a varint length then
//! that many bytes):
//!
//! ```text
//! file    := "FXCG" version:u8(=1) n_consts submods graphs
//! submods := n { name:str kind:u8 (0 opaque | 1 inline graph:varint) }
//! graphs  := n { n_nodes { node } }                      graph 0 is the root
//! node    := op:u8 name:str target args:(n arg) kwargs:(n key:arg value:arg)
//!            (a key is a str arg, or a const for a key text cannot hold)
//!   op 0 placeholder  target = param:str
//!   op 1 call_module  target = submod:varint
//!   op 2 call_function target = 0 name:str | 1 (getitem) | 2 const:varint
//!   op 3 call_method  target = method:str
//!   op 4 get_attr     target = const:varint
//!   op 5 output       (no target)
//! arg     := 0 node:varint | 1 None | 2 False | 3 True | 4 int:zigzag-varint
//!          | 5 bigint:str | 6 float:f64-le | 7 str:str | 8 bytes:str | 9 const:varint
//!          | 10 tuple:(n arg) | 11 list:(n arg) | 12 dict:(n key:arg value:arg)
//! ```
//!
//! The tag bytes are [`SubmodTag`], [`CallTag`] and [`ArgTag`]; the op code is [`Op`]'s.
//!
//! Reading is for untrusted input: every count is bounded by the bytes left, every index is
//! checked, nesting is bounded, and the result goes through [`crate::validate`], so any input
//! either becomes a program the emitter can write safely or an [`Error`].

use crate::error::{Error, Reason, Result};
use crate::ir::{
    Arg, Graph, Node, Op, Program, Span, Submod, SubmodKind, Target, MAX_DEPTH, MAX_KWARGS,
};

pub const MAGIC: &[u8; 4] = b"FXCG";
pub const VERSION: u8 = 1;

/// Byte-coded choices of the format. Each byte is written here once: the writer writes
/// `tag as u8` and the reader decodes with `from_byte`, so the two cannot disagree.
macro_rules! byte_tags {
    ($($(#[$doc:meta])* $name:ident { $($variant:ident = $byte:literal),* $(,)? })*) => {$(
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(u8)]
        pub enum $name { $($variant = $byte),* }

        impl $name {
            pub fn from_byte(b: u8) -> Option<$name> {
                match b { $($byte => Some($name::$variant),)* _ => None }
            }
        }
    )*};
}

byte_tags! {
    /// How a submodule is called (`kind`).
    SubmodTag { Opaque = 0, Inline = 1 }
    /// What a call_function node's target is.
    CallTag { Name = 0, Getitem = 1, Const = 2 }
    /// The kind of an argument, the first byte of each.
    ArgTag {
        Node = 0, None = 1, False = 2, True = 3, Int = 4, BigInt = 5, Float = 6, Str = 7,
        Bytes = 8, Const = 9, Tuple = 10, List = 11, Dict = 12,
    }
}

// ---------------------------------------------------------------- writing

struct Writer<'a> {
    p: &'a Program,
    out: Vec<u8>,
}

impl Writer<'_> {
    fn varint(&mut self, mut v: u64) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                self.out.push(b);
                return;
            }
            self.out.push(b | 0x80);
        }
    }

    fn text(&mut self, s: Span) {
        self.varint(s.len as u64);
        let p = self.p;
        self.out.extend_from_slice(p.str(s).as_bytes());
    }

    fn blob(&mut self, s: Span) {
        self.varint(s.len as u64);
        let p = self.p;
        self.out.extend_from_slice(p.raw(s));
    }

    fn args(&mut self, args: &[Arg]) {
        self.varint(args.len() as u64);
        for &a in args {
            self.arg(a);
        }
    }

    /// The tag, then the payload.
    fn arg(&mut self, a: Arg) {
        let p = self.p;
        let tag = match a {
            Arg::Node(_) => ArgTag::Node,
            Arg::None => ArgTag::None,
            Arg::Bool(false) => ArgTag::False,
            Arg::Bool(true) => ArgTag::True,
            Arg::Int(_) | Arg::Long(_) => ArgTag::Int,
            Arg::BigInt(_) => ArgTag::BigInt,
            Arg::Float(_) => ArgTag::Float,
            Arg::Str(_) => ArgTag::Str,
            Arg::Bytes(_) => ArgTag::Bytes,
            Arg::Const(_) => ArgTag::Const,
            Arg::Tuple(_) => ArgTag::Tuple,
            Arg::List(_) => ArgTag::List,
            Arg::Dict(_) => ArgTag::Dict,
        };
        self.out.push(tag as u8);
        match a {
            Arg::Node(k) | Arg::Const(k) => self.varint(k as u64),
            Arg::None | Arg::Bool(_) => {}
            Arg::Int(v) => self.int(v as i64),
            Arg::Long(k) => self.int(p.number(k) as i64),
            Arg::BigInt(k) | Arg::Str(k) => self.text(p.span(k)),
            Arg::Float(k) => self.out.extend_from_slice(&p.float_of(k).to_le_bytes()),
            Arg::Bytes(k) => self.blob(p.span(k)),
            Arg::Tuple(k) | Arg::List(k) => self.args(p.items(k)),
            Arg::Dict(k) => {
                let items = p.items(k);
                self.varint(items.len() as u64 / 2);
                for &a in items {
                    self.arg(a);
                }
            }
        }
    }

    /// Zigzag: small magnitudes of either sign take few bytes.
    fn int(&mut self, v: i64) {
        self.varint(((v << 1) ^ (v >> 63)) as u64);
    }
}

/// Writes a program in the serialized form.
pub fn write(p: &Program) -> Vec<u8> {
    let mut w = Writer {
        p,
        out: Vec::with_capacity(64 + p.text.len() + p.blobs.len() + p.args.len() * 2),
    };
    w.out.extend_from_slice(MAGIC);
    w.out.push(VERSION);
    w.varint(p.n_consts as u64);
    w.varint(p.submods.len() as u64);
    for sm in &p.submods {
        w.text(sm.name);
        match sm.kind {
            SubmodKind::Opaque => w.out.push(SubmodTag::Opaque as u8),
            SubmodKind::Inline(g) => {
                w.out.push(SubmodTag::Inline as u8);
                w.varint(g as u64);
            }
        }
    }
    w.varint(p.graphs.len() as u64);
    for g in &p.graphs {
        w.varint(g.nodes.len() as u64);
        for n in &g.nodes {
            w.out.push(n.op as u8);
            w.text(n.name);
            match n.target {
                Target::Param(s) | Target::Method(s) => w.text(s),
                Target::Submod(i) | Target::Const(i) if n.op != Op::CallFunction => {
                    w.varint(i as u64)
                }
                Target::Name(s) => {
                    w.out.push(CallTag::Name as u8);
                    w.text(s);
                }
                Target::Getitem => w.out.push(CallTag::Getitem as u8),
                Target::Const(k) => {
                    w.out.push(CallTag::Const as u8);
                    w.varint(k as u64);
                }
                Target::Submod(_) | Target::None => {}
            }
            w.args(p.slice(n.args));
            w.varint(n.kwargs as u64);
            for &a in p.slice(n.kwargs()) {
                w.arg(a);
            }
        }
    }
    w.out
}

// ---------------------------------------------------------------- reading

struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
    p: Program,
}

/// An error at byte `offset`.
fn err_at<T>(offset: usize, reason: Reason) -> Result<T> {
    Err(Error::Serial { offset, reason })
}

impl<'a> Reader<'a> {
    fn err<T>(&self, reason: Reason) -> Result<T> {
        err_at(self.pos, reason)
    }

    fn left(&self) -> usize {
        self.data.len() - self.pos
    }

    fn u8(&mut self) -> Result<u8> {
        match self.data.get(self.pos) {
            Some(&b) => {
                self.pos += 1;
                Ok(b)
            }
            None => self.err(Reason::UnexpectedEnd),
        }
    }

    fn varint(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            let bits = (b & 0x7f) as u64;
            if shift == 63 && bits > 1 {
                return self.err(Reason::VarintOverflow);
            }
            v |= bits << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        self.err(Reason::VarintOverflow)
    }

    /// A byte that `decode` knows, else an error naming `what` the byte tags.
    fn tag<T>(&mut self, decode: fn(u8) -> Option<T>, what: &'static str) -> Result<T> {
        let b = self.u8()?;
        match decode(b) {
            Some(t) => Ok(t),
            None => self.err(Reason::UnknownTag(what, b)),
        }
    }

    fn index(&mut self, limit: u64, what: &'static str) -> Result<u32> {
        let v = self.varint()?;
        if v >= limit {
            return self.err(Reason::index(what, v));
        }
        Ok(v as u32)
    }

    /// A count of items that take at least `min_bytes` each: bounded by the bytes left.
    fn count(&mut self, min_bytes: usize) -> Result<usize> {
        let v = self.varint()?;
        if v > (self.left() / min_bytes.max(1)) as u64 {
            return self.err(Reason::Exceeds(v));
        }
        Ok(v as usize)
    }

    /// The next `n` bytes, or `error` where fewer are left.
    fn take(&mut self, n: u64, error: Reason) -> Result<&'a [u8]> {
        if n > self.left() as u64 {
            return self.err(error);
        }
        let b = &self.data[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(b)
    }

    /// A length, then that many bytes.
    fn slice(&mut self) -> Result<&'a [u8]> {
        let n = self.varint()?;
        self.take(n, Reason::Exceeds(n))
    }

    fn text(&mut self) -> Result<Span> {
        let at = self.pos;
        let b = self.slice()?;
        match std::str::from_utf8(b) {
            Ok(s) => Ok(self.p.push_str(s)),
            Err(_) => err_at(at, Reason::NotUtf8),
        }
    }

    /// A container at `depth`: its count of items, `width` arguments each, then the arguments,
    /// into consecutive slots (nested containers take slots after them as they are read).
    fn items(&mut self, width: usize, ctx: &Ctx, depth: usize) -> Result<u32> {
        let n = width * self.count(width)?;
        let span = self.p.reserve_args(n);
        for k in 0..n {
            self.p.args[span.start as usize + k] = self.arg(ctx, depth + 1)?;
        }
        Ok(self.p.add_span(span))
    }

    fn arg(&mut self, ctx: &Ctx, depth: usize) -> Result<Arg> {
        if depth > MAX_DEPTH {
            return self.err(Reason::TooDeep);
        }
        Ok(match self.tag(ArgTag::from_byte, "argument tag")? {
            ArgTag::Node => Arg::Node(self.index(ctx.node as u64, "node")?),
            ArgTag::None => Arg::None,
            ArgTag::False => Arg::Bool(false),
            ArgTag::True => Arg::Bool(true),
            ArgTag::Int => {
                let z = self.varint()?;
                self.p.int(((z >> 1) as i64) ^ -((z & 1) as i64))
            }
            ArgTag::BigInt => {
                let s = self.text()?;
                Arg::BigInt(self.p.add_span(s))
            }
            ArgTag::Float => {
                let mut b = [0u8; 8];
                b.copy_from_slice(self.take(8, Reason::UnexpectedEnd)?);
                self.p.float(f64::from_le_bytes(b))
            }
            ArgTag::Str => {
                let s = self.text()?;
                Arg::Str(self.p.add_span(s))
            }
            ArgTag::Bytes => {
                let b = self.slice()?;
                let s = self.p.push_bytes(b);
                Arg::Bytes(self.p.add_span(s))
            }
            ArgTag::Const => Arg::Const(self.index(ctx.n_consts, "constant")?),
            ArgTag::Tuple => Arg::Tuple(self.items(1, ctx, depth)?),
            ArgTag::List => Arg::List(self.items(1, ctx, depth)?),
            ArgTag::Dict => Arg::Dict(self.items(2, ctx, depth)?),
        })
    }
}

struct Ctx {
    node: u32,
    n_consts: u64,
}

/// Reads a serialized node list and validates it as untrusted input. Never panics; bad input is
/// an error naming the offset or the node.
pub fn read(data: &[u8]) -> Result<Program> {
    let mut r = Reader {
        data,
        pos: 0,
        p: Program::default(),
    };
    if data.len() >= u32::MAX as usize {
        return r.err(Reason::Exceeds(data.len() as u64));
    }
    if data.len() < 5 || &data[..4] != MAGIC {
        return r.err(Reason::BadMagic);
    }
    r.pos = 4;
    let version = r.u8()?;
    if version != VERSION {
        return r.err(Reason::Version(version, VERSION));
    }
    let n_consts = r.varint()?;
    if n_consts > u32::MAX as u64 {
        return r.err(Reason::Exceeds(n_consts));
    }
    r.p.n_consts = n_consts as u32;
    let n_submods = r.count(2)?;
    let mut inline_graphs = Vec::new();
    for _ in 0..n_submods {
        let name = r.text()?;
        let kind = match r.tag(SubmodTag::from_byte, "submodule kind")? {
            SubmodTag::Opaque => SubmodKind::Opaque,
            SubmodTag::Inline => {
                let g = r.varint()?;
                if g > u32::MAX as u64 {
                    return r.err(Reason::index("graph", g));
                }
                inline_graphs.push(g);
                SubmodKind::Inline(g as u32)
            }
        };
        r.p.submods.push(Submod { name, kind });
    }
    let n_graphs = r.count(1)?;
    if n_graphs == 0 {
        return r.err(Reason::NoGraph);
    }
    if let Some(&g) = inline_graphs.iter().find(|&&g| g >= n_graphs as u64) {
        return r.err(Reason::index("inlined graph", g));
    }
    // A node's arguments, positional then keyword, before they are stored.
    let mut top: Vec<Arg> = Vec::new();
    for _ in 0..n_graphs {
        let n_nodes = r.count(4)?;
        let mut nodes = Vec::with_capacity(n_nodes);
        for j in 0..n_nodes {
            let op = r.tag(Op::from_byte, "op code")?;
            let name = r.text()?;
            let target = match op {
                Op::Placeholder => Target::Param(r.text()?),
                Op::CallModule => Target::Submod(r.index(n_submods as u64, "submodule")?),
                Op::CallFunction => match r.tag(CallTag::from_byte, "call target tag")? {
                    CallTag::Name => Target::Name(r.text()?),
                    CallTag::Getitem => Target::Getitem,
                    CallTag::Const => Target::Const(r.index(n_consts, "constant")?),
                },
                Op::CallMethod => Target::Method(r.text()?),
                Op::GetAttr => Target::Const(r.index(n_consts, "constant")?),
                Op::Output => Target::None,
            };
            let ctx = Ctx {
                node: j as u32,
                n_consts,
            };
            // Read first, stored after: the keyword arguments' slots must follow the positional
            // ones' (`Node::kwargs`), and containers take slots as they are read.
            top.clear();
            let n_args = r.count(1)?;
            for _ in 0..n_args {
                top.push(r.arg(&ctx, 0)?);
            }
            let at = r.pos;
            let n_kw = r.count(2)?;
            if n_kw > MAX_KWARGS {
                return err_at(at, Reason::TooManyKwargs);
            }
            for _ in 0..n_kw {
                let at = r.pos;
                let key = r.arg(&ctx, 0)?;
                if !matches!(key, Arg::Str(_) | Arg::Const(_)) {
                    return err_at(at, Reason::KeyNotStr);
                }
                top.push(key);
                top.push(r.arg(&ctx, 0)?);
            }
            let all = r.p.push_args(&top);
            nodes.push(Node {
                op,
                name,
                target,
                args: Span::new(all.start, n_args as u32),
                kwargs: n_kw as u16,
            });
        }
        r.p.graphs.push(Graph { nodes });
    }
    if r.left() != 0 {
        return r.err(Reason::Trailing(r.left()));
    }
    crate::validate::validate(&r.p, true)?;
    Ok(r.p)
}
