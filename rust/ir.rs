//! The node list: a program of graphs (the root, then inlined children) whose names, texts and
//! arguments live in flat arenas, so reading a graph allocates per arena growth, not per node.

/// A range of one of the arenas: `start..start + len`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Span {
    pub start: u32,
    pub len: u32,
}

impl Span {
    pub fn new(start: u32, len: u32) -> Span {
        Span { start, len }
    }

    pub fn range(self) -> std::ops::Range<usize> {
        self.start as usize..self.start as usize + self.len as usize
    }
}

/// One argument value, 8 bytes. Payloads that do not fit are indices: `Long` and `Float` into
/// [`Program::numbers`], the others into [`Program::spans`] (text for `Str` and `BigInt`, blobs
/// for `Bytes`, [`Program::args`] for containers; a dict holds `key, value` pairs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arg {
    /// The value of an earlier node of the same graph.
    Node(u32),
    None,
    Bool(bool),
    Int(i32),
    Long(u32),
    /// An int beyond i64, as decimal text.
    BigInt(u32),
    Float(u32),
    Str(u32),
    Bytes(u32),
    /// A constant-pool slot.
    Const(u32),
    Tuple(u32),
    List(u32),
    Dict(u32),
}

/// The torch.fx node kinds. Each one's discriminant is its op code in [`crate::serial`]'s
/// format, which both the writer and the reader take from here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    Placeholder = 0,
    CallModule = 1,
    CallFunction = 2,
    CallMethod = 3,
    GetAttr = 4,
    Output = 5,
}

impl Op {
    pub const ALL: [Op; 6] = [
        Op::Placeholder,
        Op::CallModule,
        Op::CallFunction,
        Op::CallMethod,
        Op::GetAttr,
        Op::Output,
    ];

    /// The op whose code is `b`.
    pub fn from_byte(b: u8) -> Option<Op> {
        Op::ALL.into_iter().find(|&op| op as u8 == b)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Op::Placeholder => "placeholder",
            Op::CallModule => "call_module",
            Op::CallFunction => "call_function",
            Op::CallMethod => "call_method",
            Op::GetAttr => "get_attr",
            Op::Output => "output",
        }
    }
}

/// What a node calls or names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// output
    None,
    /// placeholder: the parameter's name in the traced signature.
    Param(Span),
    /// call_module: an index into [`Program::submods`].
    Submod(u32),
    /// call_function written by a dotted name that resolves where the code runs.
    Name(Span),
    /// call_function `operator.getitem`, written as a subscript.
    Getitem,
    /// call_function through the pool, or get_attr's object.
    Const(u32),
    /// call_method: the method name.
    Method(Span),
}

/// One node. Its keyword arguments follow its positional ones in [`Program::args`] as
/// `key, value` pairs, a key being `Str`, or `Const` for a key text cannot hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Node {
    pub name: Span,
    pub args: Span,
    pub target: Target,
    pub kwargs: u16,
    pub op: Op,
}

impl Node {
    /// The keyword pairs' slots, right after `args`.
    pub fn kwargs(&self) -> Span {
        Span::new(self.args.start + self.args.len, 2 * self.kwargs as u32)
    }

    /// Positional and keyword slots together.
    pub fn all_args(&self) -> Span {
        Span::new(self.args.start, self.args.len + 2 * self.kwargs as u32)
    }
}

/// The most keyword arguments a node may have.
pub const MAX_KWARGS: usize = u16::MAX as usize;

/// The deepest nesting of containers, and of graph modules, accepted anywhere.
pub const MAX_DEPTH: usize = 64;

/// How a child module is called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SubmodKind {
    /// An opaque callable bound at compile time.
    Opaque,
    /// A plain graph module inlined as a function: the index of its graph.
    Inline(u32),
}

/// A child called by `call_module`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Submod {
    pub name: Span,
    pub kind: SubmodKind,
}

/// One function's nodes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Graph {
    pub nodes: Vec<Node>,
}

/// Graphs, children and arenas: everything the emitter reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Program {
    /// Every text: names, targets, str values, decimal big ints.
    pub text: String,
    /// The contents of `bytes` values.
    pub blobs: Vec<u8>,
    pub spans: Vec<Span>,
    /// Bits of `Long` (i64) and `Float` (f64) values.
    pub numbers: Vec<u64>,
    /// Every node's arguments and every container's elements.
    pub args: Vec<Arg>,
    /// `graphs[0]` is the root; an inlined child's graph comes after its caller's.
    pub graphs: Vec<Graph>,
    /// Children in order of first call: `submod_names[i]` of the public API.
    pub submods: Vec<Submod>,
    /// The number of constant-pool slots.
    pub n_consts: u32,
}

impl Program {
    /// Text of a span ("" for one out of range, which validation rejects).
    pub fn str(&self, s: Span) -> &str {
        self.text.get(s.range()).unwrap_or("")
    }

    /// Bytes of a span of [`Program::blobs`].
    pub fn raw(&self, s: Span) -> &[u8] {
        self.blobs.get(s.range()).unwrap_or(&[])
    }

    /// The span behind an index payload (an empty one if out of range).
    pub fn span(&self, k: u32) -> Span {
        self.spans.get(k as usize).copied().unwrap_or_default()
    }

    /// The arguments in `s` (none if out of range).
    pub fn slice(&self, s: Span) -> &[Arg] {
        self.args.get(s.range()).unwrap_or(&[])
    }

    /// The elements of a container's span index.
    pub fn items(&self, k: u32) -> &[Arg] {
        self.slice(self.span(k))
    }

    pub fn number(&self, k: u32) -> u64 {
        self.numbers.get(k as usize).copied().unwrap_or(0)
    }

    pub fn float_of(&self, k: u32) -> f64 {
        f64::from_bits(self.number(k))
    }

    pub fn push_str(&mut self, s: &str) -> Span {
        let span = Span::new(self.text.len() as u32, s.len() as u32);
        self.text.push_str(s);
        span
    }

    pub fn push_bytes(&mut self, b: &[u8]) -> Span {
        let span = Span::new(self.blobs.len() as u32, b.len() as u32);
        self.blobs.extend_from_slice(b);
        span
    }

    /// Records `s` in [`Program::spans`]: the payload of an argument that refers to it.
    pub fn add_span(&mut self, s: Span) -> u32 {
        self.spans.push(s);
        self.spans.len() as u32 - 1
    }

    pub fn int(&mut self, v: i64) -> Arg {
        match i32::try_from(v) {
            Ok(small) => Arg::Int(small),
            Err(_) => {
                self.numbers.push(v as u64);
                Arg::Long(self.numbers.len() as u32 - 1)
            }
        }
    }

    pub fn float(&mut self, v: f64) -> Arg {
        self.numbers.push(v.to_bits());
        Arg::Float(self.numbers.len() as u32 - 1)
    }

    pub fn str_arg(&mut self, s: &str) -> Arg {
        let span = self.push_str(s);
        Arg::Str(self.add_span(span))
    }

    pub fn big_int(&mut self, digits: &str) -> Arg {
        let span = self.push_str(digits);
        Arg::BigInt(self.add_span(span))
    }

    pub fn bytes(&mut self, b: &[u8]) -> Arg {
        let span = self.push_bytes(b);
        Arg::Bytes(self.add_span(span))
    }

    /// `n` slots at the end of [`Program::args`], to be filled in place.
    pub fn reserve_args(&mut self, n: usize) -> Span {
        let span = Span::new(self.args.len() as u32, n as u32);
        self.args.resize(self.args.len() + n, Arg::None);
        span
    }

    pub fn push_args(&mut self, items: &[Arg]) -> Span {
        let span = Span::new(self.args.len() as u32, items.len() as u32);
        self.args.extend_from_slice(items);
        span
    }

    /// The name of submodule `i` ("" if out of range).
    pub fn submod_name(&self, i: u32) -> &str {
        self.submods
            .get(i as usize)
            .map_or("", |s| self.str(s.name))
    }

    /// How a node's target reads in an error message.
    pub fn target_text(&self, t: Target) -> String {
        match t {
            Target::None => "None".into(),
            Target::Param(s) | Target::Name(s) | Target::Method(s) => self.str(s).into(),
            Target::Submod(i) => self.submod_name(i).into(),
            Target::Getitem => "operator.getitem".into(),
            Target::Const(k) => format!("<constant {k}>"),
        }
    }

    /// Calls `f` on every node reference in `args`, containers included (validated programs:
    /// nesting is bounded).
    pub fn for_each_ref(&self, args: &[Arg], f: &mut impl FnMut(u32)) {
        for &a in args {
            match a {
                Arg::Node(i) => f(i),
                Arg::Tuple(k) | Arg::List(k) | Arg::Dict(k) => self.for_each_ref(self.items(k), f),
                _ => {}
            }
        }
    }
}
