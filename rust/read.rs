//! Reads torch.fx objects into the IR, one pass per graph: the only code that touches Python
//! objects besides the function list in `lib.rs`. Nodes are matched by identity; constants go
//! to a pool, interned by identity (and `torch.device`s by value).

use std::ffi::c_int;
use std::mem::size_of;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple, PyType};
use pyo3::{ffi, intern};
use rustc_hash::FxHashMap;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::error::{Error, Reason};
use crate::ir::{Arg, Graph, Node, Op, Program, Span, Submod, SubmodKind, Target};
use crate::ir::{MAX_DEPTH, MAX_KWARGS};
use crate::pyident;

/// The node fields the reader takes, in [`Slots::offsets`] order.
const FIELDS: [&str; 7] = [
    "op", "name", "target", "_args", "_kwargs", "_next", "_erased",
];
const OP: usize = 0;
const NAME: usize = 1;
const TARGET: usize = 2;
const ARGS: usize = 3;
const KWARGS: usize = 4;
const NEXT: usize = 5;
const ERASED: usize = 6;

/// Where `torch.fx.Node` keeps [`FIELDS`]: the byte offsets that the member descriptors of its
/// C base `torch._C._NodeBase` publish. Reading a slot there is what the descriptor does for
/// `getattr`, without the generic attribute lookup, which costs more than the rest of reading
/// a node.
struct Slots {
    base: Py<PyType>,
    offsets: [isize; 7],
    /// The descriptors, which `Node` must still resolve [`FIELDS`] to when a pass starts.
    descrs: Vec<Py<PyAny>>,
}

impl Slots {
    /// The slots, or None where `node` or its base is not laid out as expected.
    fn load(py: Python<'_>, node: &Bound<'_, PyType>) -> PyResult<Option<Slots>> {
        let base = py.import("torch._C")?.getattr("_NodeBase").ok();
        let Some(base) = base.and_then(|b| b.cast_into::<PyType>().ok()) else {
            return Ok(None);
        };
        // SAFETY: `base` is a live type object.
        let basicsize = unsafe { (*base.as_type_ptr()).tp_basicsize };
        let dict = base.getattr("__dict__")?;
        let mut offsets = [0; 7];
        let mut descrs = Vec::new();
        for (k, name) in FIELDS.into_iter().enumerate() {
            let Ok(d) = dict.get_item(name) else {
                return Ok(None);
            };
            let (code, size) = match k {
                ERASED => (ffi::Py_T_BOOL, 1),
                _ => (ffi::Py_T_OBJECT_EX, size_of::<*mut ()>() as isize),
            };
            match member_offset(&base, &d, code) {
                Some(at)
                    if at >= size_of::<ffi::PyObject>() as isize
                        && at + size <= basicsize
                        && at % size == 0 =>
                {
                    offsets[k] = at
                }
                _ => return Ok(None),
            }
            descrs.push(d.unbind());
        }
        let slots = Slots {
            base: base.unbind(),
            offsets,
            descrs,
        };
        Ok(slots.valid(node).then_some(slots))
    }

    /// Whether instances of `node` still read [`FIELDS`] through these descriptors, by the
    /// generic attribute lookup, and are laid out as `_NodeBase` first (a subclass): what makes
    /// a slot read the same as `getattr`, and in bounds.
    fn valid(&self, node: &Bound<'_, PyType>) -> bool {
        // SAFETY: `node` is a live type object.
        let getattro = unsafe { (*node.as_type_ptr()).tp_getattro };
        // An extern function's address: compared as a number (a miss only costs the fast path).
        getattro.map(|f| f as *const () as usize)
            == Some(ffi::PyObject_GenericGetAttr as *const () as usize)
            && node.is_subclass(self.base.bind(node.py())).unwrap_or(false)
            && FIELDS
                .into_iter()
                .zip(&self.descrs)
                .all(|(name, d)| node.getattr(name).is_ok_and(|v| v.is(d)))
    }
}

/// The byte offset that `d`, a member descriptor of `base`, publishes, if its C type is `code`
/// and it reads without an audit hook or a relative offset.
fn member_offset(base: &Bound<'_, PyType>, d: &Bound<'_, PyAny>, code: c_int) -> Option<isize> {
    let member_type = std::ptr::addr_of_mut!(ffi::PyMemberDescr_Type);
    if d.get_type_ptr() != member_type {
        return None;
    }
    // SAFETY: `d` is exactly a member_descriptor, so a live PyMemberDescrObject, whose
    // `d_member` (checked non-NULL) points at the PyMemberDef of the type that made it.
    let m = unsafe {
        let d = &*d.as_ptr().cast::<ffi::PyMemberDescrObject>();
        if d.d_common.d_type != base.as_type_ptr() || d.d_member.is_null() {
            return None;
        }
        &*d.d_member
    };
    (m.type_code == code && m.flags & !ffi::Py_READONLY == 0).then_some(m.offset)
}

/// Reads [`FIELDS`] of nodes: from their slots for nodes of exactly `torch.fx.Node` while
/// [`Slots::valid`] held when the pass started, else by `getattr`.
#[derive(Clone, Copy)]
struct Fields {
    node_type: *mut ffi::PyTypeObject,
    slots: Option<&'static Slots>,
}

impl Fields {
    fn get<'py>(&self, node: &Bound<'py, PyAny>, k: usize) -> PyResult<Bound<'py, PyAny>> {
        // A slot left empty (`getattr` raises) and other node types: `getattr`.
        self.slot(node, k)
            .map_or_else(|| node.getattr(FIELDS[k]), Ok)
    }

    fn slot<'py>(&self, node: &Bound<'py, PyAny>, k: usize) -> Option<Bound<'py, PyAny>> {
        let slots = self.slots?;
        if k == ERASED || node.get_type_ptr() != self.node_type {
            return None;
        }
        // SAFETY: `node` is live and exactly a `torch.fx.Node`, and `k` names an object
        // member. The pointer is borrowed from `node`, which is held, and made a new reference
        // before any Python code can run.
        unsafe {
            let p = slot_ptr(node.as_ptr(), slots.offsets[k]);
            Bound::from_borrowed_ptr_or_opt(node.py(), p)
        }
    }

    /// Asks the CPU to load what reading the next nodes touches: the fields of the node after
    /// `node`, and the node after that one. Nodes and their fields lie scattered in memory,
    /// and a walk that loads each only when it reads it waits for them one by one.
    fn prefetch_after(&self, node: &Bound<'_, PyAny>) {
        let Some(slots) = self.slots else { return };
        if node.get_type_ptr() != self.node_type {
            return;
        }
        // SAFETY: `node` is live and exactly a `torch.fx.Node`; `_next` is an object member.
        let next = unsafe { slot_ptr(node.as_ptr(), slots.offsets[NEXT]) };
        // SAFETY: `next`, when not NULL, is live: `node`, which is held, references it, and no
        // Python code runs here. Its type is read from its header.
        if next.is_null() || unsafe { ffi::Py_TYPE(next) } != self.node_type {
            return;
        }
        for k in [NAME, TARGET, ARGS, KWARGS] {
            // SAFETY: `next` is live (above) and exactly a `torch.fx.Node`; the pointer read is
            // only a hint's address, never followed.
            prefetch(unsafe { slot_ptr(next, slots.offsets[k]) });
        }
        // SAFETY: as above, for the `_next` member.
        let after = unsafe { slot_ptr(next, slots.offsets[NEXT]) };
        for line in 0..4 {
            prefetch(after.wrapping_byte_add(64 * line));
        }
    }

    /// Whether `node` is erased (fx leaves an erased node linked while it changes a graph).
    fn erased(&self, node: &Bound<'_, PyAny>) -> PyResult<bool> {
        match self.slots {
            Some(slots) if node.get_type_ptr() == self.node_type => {
                // SAFETY: as in `slot`, for the `bool` member `_erased` (a C `char`).
                let at = unsafe { node.as_ptr().cast::<u8>().offset(slots.offsets[ERASED]) };
                // SAFETY: `at` is in bounds (above) and any byte value is valid.
                Ok(unsafe { at.read() } != 0)
            }
            _ => node.getattr(FIELDS[ERASED])?.is_truthy(),
        }
    }
}

/// The pointer in the object member at `offset` of `obj`.
///
/// # Safety
/// `obj` must be a live `torch.fx.Node` of exactly that type, with [`Slots::valid`], and
/// `offset` one of [`Slots::offsets`] other than `_erased`'s: then `obj` starts with
/// `_NodeBase`'s layout, where [`Slots::load`] checked that `offset` lies, aligned, in an
/// object member (a pointer or NULL).
unsafe fn slot_ptr(obj: *mut ffi::PyObject, offset: isize) -> *mut ffi::PyObject {
    obj.cast::<u8>()
        .offset(offset)
        .cast::<*mut ffi::PyObject>()
        .read()
}

/// A hint to load the cache line at `p` soon.
#[inline(always)]
fn prefetch(p: *const ffi::PyObject) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch changes no memory and never faults, whatever the address; SSE, which
    // provides it, is part of every x86_64 CPU.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// The torch.fx types and objects the reader compares against, loaded once per process.
struct Types {
    slots: Option<Slots>,
    /// The op strings, interned: fx's own op strings are these objects.
    ops: Vec<(Py<PyString>, Op)>,
    node: Py<PyType>,
    ilist: Py<PyType>,
    idict: Py<PyType>,
    device: Py<PyType>,
    graph_module: Py<PyType>,
    getitem: Py<PyAny>,
    /// `torch.fx.Graph.nodes`, the property.
    nodes_property: Py<PyAny>,
}

static TYPES: PyOnceLock<Types> = PyOnceLock::new();

impl Types {
    fn get(py: Python<'_>) -> PyResult<&'static Types> {
        TYPES.get_or_try_init(py, || {
            let attr = |module: &str, name: &str| py.import(module)?.getattr(name);
            let ty = |module: &str, name: &str| -> PyResult<Py<PyType>> {
                Ok(attr(module, name)?.cast_into::<PyType>()?.unbind())
            };
            let node = ty("torch.fx", "Node")?;
            let ops = Op::ALL.map(|op| (PyString::intern(py, op.as_str()).unbind(), op));
            Ok(Types {
                slots: Slots::load(py, node.bind(py))?,
                ops: ops.into(),
                node,
                ilist: ty("torch.fx.immutable_collections", "immutable_list")?,
                idict: ty("torch.fx.immutable_collections", "immutable_dict")?,
                device: ty("torch", "device")?,
                graph_module: ty("torch.fx", "GraphModule")?,
                getitem: attr("operator", "getitem")?.unbind(),
                nodes_property: attr("torch.fx", "Graph")?.getattr("nodes")?.unbind(),
            })
        })
    }
}

/// Hashes an object's address so that objects allocated near each other land in nearby
/// buckets: a graph's nodes are allocated in order and mostly looked up soon after they are
/// read, so an index keyed this way is written and read along a few warm cache lines, where a
/// mixing hash touches a random line of a table of megabytes for every node. The top seven bits,
/// which the table compares first, come from higher address bits.
#[derive(Default)]
struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ b as u64;
        }
    }

    fn write_usize(&mut self, addr: usize) {
        let a = addr as u64 >> 4;
        self.0 = a ^ (a >> 10).wrapping_mul(0x9e37_79b9_7f4a_7c15) & (0x7f << 57);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A table keyed by object address ([`AddrHasher`]).
type ByAddr<V> = HashMap<usize, V, BuildHasherDefault<AddrHasher>>;

/// The constant pool being built: slots in order of first appearance.
#[derive(Default)]
pub struct Pool<'py> {
    pub objects: Vec<Bound<'py, PyAny>>,
    /// Slot by object id; only ids of objects the pool holds, so none is reused meanwhile.
    by_id: FxHashMap<usize, u32>,
    /// Device slots by the device's hash (equal devices are one slot).
    devices: FxHashMap<isize, Vec<u32>>,
    /// Slots that existed before this pass (a vLLM-style pool continued).
    pub preexisting: usize,
}

impl<'py> Pool<'py> {
    /// Continues an external pool: `consts` plus its `id(obj) -> slot` index.
    pub fn seeded(consts: &Bound<'py, PyList>, index: &Bound<'py, PyDict>) -> PyResult<Self> {
        let mut p = Pool::default();
        p.objects.extend(consts.iter());
        for (k, v) in index.iter() {
            p.by_id.insert(k.extract::<usize>()?, v.extract::<u32>()?);
        }
        p.preexisting = p.objects.len();
        Ok(p)
    }

    fn intern(&mut self, obj: &Bound<'py, PyAny>) -> u32 {
        let next = self.objects.len() as u32;
        let k = *self.by_id.entry(obj.as_ptr() as usize).or_insert(next);
        if k == next {
            self.objects.push(obj.clone());
        }
        k
    }

    fn intern_device(&mut self, obj: &Bound<'py, PyAny>) -> PyResult<u32> {
        if let Some(&k) = self.by_id.get(&(obj.as_ptr() as usize)) {
            return Ok(k);
        }
        let h = obj.hash()?;
        for &k in self.devices.get(&h).into_iter().flatten() {
            if self.objects[k as usize].eq(obj)? {
                return Ok(k);
            }
        }
        let k = self.intern(obj);
        self.devices.entry(h).or_default().push(k);
        Ok(k)
    }

    /// The `(id, slot)` pairs added by this pass, to write back into an external index.
    pub fn new_ids(&self) -> impl Iterator<Item = (usize, u32)> + '_ {
        let old = self.preexisting as u32;
        self.by_id
            .iter()
            .filter(move |(_, &k)| k >= old)
            .map(|(&id, &k)| (id, k))
    }
}

/// `str()` of an object, or "?" where getting the object or its text raised.
fn shown(obj: PyResult<Bound<'_, PyAny>>) -> String {
    obj.and_then(|v| v.str())
        .map_or_else(|_| "?".into(), |s| s.to_string())
}

/// An error naming `node` (read back from the object, so it needs no IR).
fn node_error(node: &Bound<'_, PyAny>, reason: Reason) -> PyErr {
    let field = |name: &str| shown(node.getattr(name));
    let op = Op::ALL
        .into_iter()
        .find(|op| op.as_str() == field("op"))
        .map_or("?", Op::as_str);
    let e = Error::Node {
        op,
        name: field("name"),
        target: field("target"),
        reason,
    };
    e.into()
}

fn hash(s: &str) -> u64 {
    use std::hash::BuildHasher;
    rustc_hash::FxBuildHasher.hash_one(s)
}

/// A graph's nodes in order: fx's linked list walked with checks, or another iterator.
enum Nodes<'py> {
    Iter(Bound<'py, pyo3::types::PyIterator>),
    Links(Links<'py>),
}

/// fx's linked list, from the root round to it again.
struct Links<'py> {
    fields: Fields,
    node_type: Bound<'py, PyType>,
    root: Bound<'py, PyAny>,
    /// The node returned last (the root before the first).
    at: Bound<'py, PyAny>,
    /// Links left to follow before the list counts as broken.
    left: usize,
}

impl<'py> Iterator for Nodes<'py> {
    type Item = PyResult<Bound<'py, PyAny>>;

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Nodes::Iter(it) => it.next(),
            Nodes::Links(links) => links.follow().transpose(),
        }
    }
}

impl<'py> Links<'py> {
    /// The next node that is not erased; None back at the root.
    fn follow(&mut self) -> PyResult<Option<Bound<'py, PyAny>>> {
        let fields = self.fields;
        loop {
            let next = fields.get(&self.at, NEXT)?;
            if next.is(&self.root) {
                return Ok(None);
            }
            let is_node =
                next.get_type_ptr() == fields.node_type || next.is_instance(&self.node_type)?;
            if !is_node || self.left == 0 {
                return Err(Error::Invalid(Reason::BrokenNodeList).into());
            }
            self.left -= 1;
            self.at = next.clone();
            // A node erased while still linked (as while fx changes a graph) is skipped.
            if !fields.erased(&next)? {
                fields.prefetch_after(&next);
                return Ok(Some(next));
            }
        }
    }
}

/// The node being read and the nodes before it.
struct Ctx<'a, 'py> {
    node: &'a Bound<'py, PyAny>,
    /// Node object address -> index in its graph (the graph holds the nodes meanwhile).
    index: &'a ByAddr<u32>,
}

/// Walks graph modules into a [`Program`].
pub struct Reader<'py> {
    py: Python<'py>,
    t: &'static Types,
    fields: Fields,
    resolver: Bound<'py, PyAny>,
    pub prog: Program,
    pub pool: Pool<'py>,
    /// Resolved call_function targets by object (held, so no id is reused meanwhile).
    targets: FxHashMap<usize, (Target, Bound<'py, PyAny>)>,
    /// Keyword keys by str object (held).
    keys: FxHashMap<usize, (Arg, Bound<'py, PyAny>)>,
    /// Submodules by the hash of their qualified name (names compared on a hit; a 64-bit
    /// collision of two names falls back to a search).
    submods: FxHashMap<u64, u32>,
    /// Whether a child of this type is a GraphModule, by type (the children hold the types).
    child_types: FxHashMap<usize, bool>,
    /// Inlined children's graphs by child object (held): one function however often it is
    /// called, under whatever names.
    inlined: FxHashMap<usize, (u32, Bound<'py, PyAny>)>,
    /// Per submodule, the str object that spells its name, where the root's node has one.
    pub submod_names: Vec<Option<Bound<'py, PyAny>>>,
    /// The float object read last and its value (held, so no id is reused meanwhile).
    last_float: Option<(Bound<'py, PyAny>, Arg)>,
    /// For `_node_ref`: nodes met outside any graph, in order.
    pub loose: Option<Vec<Bound<'py, PyAny>>>,
}

impl<'py> Reader<'py> {
    pub fn new(py: Python<'py>, resolver: Bound<'py, PyAny>, pool: Pool<'py>) -> PyResult<Self> {
        let t = Types::get(py)?;
        let node_type = t.node.bind(py);
        let slots = t.slots.as_ref().filter(|s| s.valid(node_type));
        Ok(Reader {
            py,
            t,
            fields: Fields {
                node_type: node_type.as_type_ptr(),
                slots,
            },
            resolver,
            prog: Program::default(),
            pool,
            targets: FxHashMap::default(),
            keys: FxHashMap::default(),
            submods: FxHashMap::default(),
            child_types: FxHashMap::default(),
            inlined: FxHashMap::default(),
            submod_names: Vec::new(),
            last_float: None,
            loose: None,
        })
    }

    /// Reads `gm` as the root graph, and every plain GraphModule child it calls.
    pub fn read(&mut self, gm: &Bound<'py, PyAny>) -> PyResult<()> {
        if gm.getattr(intern!(self.py, "graph")).is_err() {
            let ty = gm.get_type().name()?;
            return Err(PyTypeError::new_err(format!(
                "expected a torch.fx.GraphModule, got an object of type {ty}"
            )));
        }
        self.graph(gm, "", 0)?;
        self.prog.n_consts = self.pool.objects.len() as u32;
        // Only the program, the pool and the names' objects are needed from here on.
        self.submods = FxHashMap::default();
        self.targets = FxHashMap::default();
        self.keys = FxHashMap::default();
        Ok(())
    }

    fn graph(&mut self, gm: &Bound<'py, PyAny>, prefix: &str, depth: usize) -> PyResult<u32> {
        let py = self.py;
        if depth > MAX_DEPTH {
            return Err(Error::Invalid(Reason::TooDeep).into());
        }
        let gi = self.prog.graphs.len() as u32;
        self.prog.graphs.push(Graph::default());
        let (list, n) = self.nodes(&gm.getattr(intern!(py, "graph"))?)?;
        let modules = gm.getattr(intern!(py, "_modules")).ok();
        let modules = modules.and_then(|d| d.cast_into::<PyDict>().ok());
        let mut nodes: Vec<Node> = Vec::with_capacity(n);
        let mut index: ByAddr<u32> = ByAddr::default();
        index.reserve(n);
        // Room for typical nodes, so the arenas seldom grow (a copy into fresh memory); room
        // never written costs no memory.
        self.prog.args.reserve(8 * n);
        self.prog.text.reserve(24 * n);
        self.prog.spans.reserve(n);
        self.prog.numbers.reserve(n);
        self.submods.reserve(n / 2);
        self.prog.submods.reserve(n / 2);
        self.submod_names.reserve(n / 2);
        for node in list {
            let node = &node?;
            let ctx = Ctx {
                node,
                index: &index,
            };
            // The fields first, then their contents: their loads overlap.
            let f = self.fields;
            let op_obj = f.get(node, OP)?;
            let name_obj = f.get(node, NAME)?;
            let target_obj = f.get(node, TARGET)?;
            let args_obj = f.get(node, ARGS)?;
            let kwargs_obj = f.get(node, KWARGS)?;
            let ops = &self.t.ops;
            let interned = ops.iter().find(|(s, _)| s.as_ptr() == op_obj.as_ptr());
            let op = interned.map(|&(_, op)| op).or_else(|| {
                let s = op_obj.cast::<PyString>().ok()?.to_str().ok()?;
                Op::ALL.into_iter().find(|op| op.as_str() == s)
            });
            let op =
                op.ok_or_else(|| node_error(node, Reason::UnknownOp(shown(Ok(op_obj.clone())))))?;
            let name = match name_obj.cast::<PyString>().map(|s| s.to_str()) {
                Ok(Ok(s)) => self.prog.push_str(s),
                _ => return Err(node_error(node, Reason::NameNotStr)),
            };
            let target = self.target(
                gm,
                modules.as_ref(),
                node,
                target_obj,
                op,
                name,
                prefix,
                depth,
            )?;
            let args = args_obj
                .cast::<PyTuple>()
                .map_err(|_| node_error(node, Reason::ArgsNotTuple))?;
            let kwargs = kwargs_obj
                .cast::<PyDict>()
                .map_err(|_| node_error(node, Reason::KwargsNotDict))?;
            if kwargs.len() > MAX_KWARGS {
                return Err(node_error(node, Reason::TooManyKwargs));
            }
            // Keyword pairs follow the positional arguments' slots.
            let all = self.prog.reserve_args(args.len() + 2 * kwargs.len());
            for (k, a) in args.iter().enumerate() {
                self.prog.args[all.start as usize + k] = self.value(&a, &ctx, 0)?;
            }
            let mut at = all.start as usize + args.len();
            for (key, value) in kwargs.iter() {
                self.prog.args[at] = self.key(&key, &ctx)?;
                self.prog.args[at + 1] = self.value(&value, &ctx, 0)?;
                at += 2;
            }
            index.insert(node.as_ptr() as usize, nodes.len() as u32);
            nodes.push(Node {
                name,
                args: Span::new(all.start, args.len() as u32),
                target,
                kwargs: kwargs.len() as u16,
                op,
            });
        }
        self.prog.graphs[gi as usize] = Graph { nodes };
        Ok(gi)
    }

    /// A graph's nodes and their count. fx's own linked list is walked here, not by fx's
    /// iterator, which follows any object as a link (a str in `_next` crashes it) and loops
    /// forever on a cycle; a graph whose `nodes` is not fx's property is iterated.
    fn nodes(&self, graph: &Bound<'py, PyAny>) -> PyResult<(Nodes<'py>, usize)> {
        let py = self.py;
        let nodes = graph.getattr(intern!(py, "nodes"))?;
        let n = nodes.len().unwrap_or(0);
        let own = graph.get_type().getattr(intern!(py, "nodes"))?;
        if !own.is(self.t.nodes_property.bind(py)) {
            return Ok((Nodes::Iter(nodes.try_iter()?), n));
        }
        let root = graph.getattr(intern!(py, "_root"))?;
        let walk = Nodes::Links(Links {
            fields: self.fields,
            node_type: self.t.node.bind(py).clone(),
            at: root.clone(),
            root,
            // Far more links than the graph's nodes and any erased ones still linked.
            left: 4 * n + 1024,
        });
        Ok((walk, n))
    }

    fn key(&mut self, key: &Bound<'py, PyAny>, ctx: &Ctx<'_, 'py>) -> PyResult<Arg> {
        if let Some((arg, _)) = self.keys.get(&(key.as_ptr() as usize)) {
            return Ok(*arg);
        }
        let Ok(text) = key.cast::<PyString>() else {
            return Err(node_error(ctx.node, Reason::KeyNotStr));
        };
        let arg = match text.to_str() {
            Ok(s) => self.prog.str_arg(s),
            // A key text cannot hold (a lone surrogate) is passed as a pooled str.
            Err(_) => Arg::Const(self.pool.intern(key)),
        };
        self.keys.insert(key.as_ptr() as usize, (arg, key.clone()));
        Ok(arg)
    }

    /// The target of a node; may run Python code (the resolver, attribute walks, child graphs).
    #[allow(clippy::too_many_arguments)]
    fn target(
        &mut self,
        gm: &Bound<'py, PyAny>,
        modules: Option<&Bound<'py, PyDict>>,
        node: &Bound<'py, PyAny>,
        t: Bound<'py, PyAny>,
        op: Op,
        name: Span,
        prefix: &str,
        depth: usize,
    ) -> PyResult<Target> {
        let text = t.cast::<PyString>().ok().and_then(|s| s.to_str().ok());
        let text = || text.ok_or_else(|| node_error(node, Reason::TargetNotStr));
        Ok(match op {
            Op::Output => Target::None,
            Op::Placeholder => Target::Param(self.prog.push_str(text()?)),
            Op::CallMethod => Target::Method(self.prog.push_str(text()?)),
            Op::GetAttr => {
                let path = text()?.to_string();
                let mut obj = gm.clone();
                for part in path.split('.') {
                    obj = obj
                        .getattr(part)
                        .map_err(|_| node_error(node, Reason::MissingAttr(path.clone())))?;
                }
                Target::Const(self.pool.intern(&obj))
            }
            Op::CallModule => {
                let local = text()?;
                let qual = match prefix {
                    "" => std::borrow::Cow::Borrowed(local),
                    _ => std::borrow::Cow::Owned(format!("{prefix}{local}")),
                };
                let i = self.prog.submods.len() as u32;
                // One probe finds a submodule met before or claims the name's hash for `i`.
                let known = match self.submods.entry(hash(&qual)) {
                    Entry::Occupied(e) => Some(*e.get()),
                    Entry::Vacant(e) => {
                        e.insert(i);
                        None
                    }
                };
                if let Some(k) = known.and_then(|k| self.find_submod(k, &qual)) {
                    return Ok(Target::Submod(k));
                }
                let child = child(gm, modules, &t, local)
                    .ok_or_else(|| node_error(node, Reason::MissingChild(local.into())))?;
                // Split graphs name a call after its child: share the node's text then.
                let span = match self.prog.str(name) == qual {
                    true => name,
                    false => self.prog.push_str(&qual),
                };
                // Registered before an inlined child's graph is read, which adds its own.
                self.prog.submods.push(Submod {
                    name: span,
                    kind: SubmodKind::Opaque,
                });
                let same = prefix.is_empty() && t.is_exact_instance_of::<PyString>();
                self.submod_names.push(same.then(|| t.clone()));
                if self.is_graph_module(&child)? {
                    let g = self.inline(&child, &qual, depth)?;
                    self.prog.submods[i as usize].kind = SubmodKind::Inline(g);
                }
                Target::Submod(i)
            }
            Op::CallFunction => {
                if let Some((known, _)) = self.targets.get(&(t.as_ptr() as usize)) {
                    return Ok(*known);
                }
                if let Ok(s) = t.cast::<PyString>() {
                    return Err(node_error(node, Reason::StringCallTarget(s.to_string())));
                }
                let resolved = if t.is(self.t.getitem.bind(self.py)) {
                    Target::Getitem
                } else {
                    let answer = self.resolver.call1((&t,))?;
                    let name = match answer.cast::<PyString>().map(|s| s.to_str()) {
                        Ok(Ok(s)) if pyident::check_untrusted_call_name(s).is_ok() => Some(s),
                        _ => None,
                    };
                    match name {
                        Some(name) => Target::Name(self.prog.push_str(name)),
                        None => Target::Const(self.pool.intern(&t)),
                    }
                };
                self.targets.insert(t.as_ptr() as usize, (resolved, t));
                resolved
            }
        })
    }

    /// Whether `child` is a GraphModule (inlined), by its type: split graphs have many children
    /// of few types.
    fn is_graph_module(&mut self, child: &Bound<'py, PyAny>) -> PyResult<bool> {
        let ty = child.get_type_ptr() as usize;
        if let Some(&known) = self.child_types.get(&ty) {
            return Ok(known);
        }
        let known = child.is_instance(self.t.graph_module.bind(self.py))?;
        self.child_types.insert(ty, known);
        Ok(known)
    }

    /// The submodule named `qual`, whose name's hash is that of submodule `i`'s: `i`, or on a
    /// collision of two names' hashes, a search.
    fn find_submod(&self, i: u32, qual: &str) -> Option<u32> {
        let p = &self.prog;
        match p.submod_name(i) == qual {
            true => Some(i),
            false => (0..p.submods.len() as u32).find(|&i| p.submod_name(i) == qual),
        }
    }

    /// The graph of an inlined child, read once per child object.
    fn inline(&mut self, child: &Bound<'py, PyAny>, qual: &str, depth: usize) -> PyResult<u32> {
        if let Some((g, _)) = self.inlined.get(&(child.as_ptr() as usize)) {
            return Ok(*g);
        }
        let g = self.graph(child, &format!("{qual}."), depth + 1)?;
        self.inlined
            .insert(child.as_ptr() as usize, (g, child.clone()));
        Ok(g)
    }

    /// One argument value.
    fn value(&mut self, a: &Bound<'py, PyAny>, ctx: &Ctx<'_, 'py>, depth: usize) -> PyResult<Arg> {
        let py = self.py;
        if depth > MAX_DEPTH {
            return Err(node_error(ctx.node, Reason::TooDeep));
        }
        let ty = a.get_type_ptr();
        if ty == self.t.node.bind(py).as_type_ptr() {
            return self.node_ref(a, ctx);
        }
        if a.is_none() {
            return Ok(Arg::None);
        }
        if let Ok(f) = a.cast_exact::<PyFloat>() {
            // Graphs built in a loop pass one float object over and over (a scale, an eps).
            if let Some((_, arg)) = self.last_float.as_ref().filter(|(last, _)| last.is(a)) {
                return Ok(*arg);
            }
            let arg = self.prog.float(f.value());
            self.last_float = Some((a.clone(), arg));
            return Ok(arg);
        }
        if a.is_exact_instance_of::<PyInt>() {
            if let Ok(v) = a.extract::<i64>() {
                return Ok(self.prog.int(v));
            }
            // Beyond i64: decimal text, or the int itself when Python would not read it back
            // (over 4,300 digits).
            return Ok(match a.str().map(|s| s.to_string()) {
                Ok(s) if pyident::is_int_literal(&s) => self.prog.big_int(&s),
                _ => Arg::Const(self.pool.intern(a)),
            });
        }
        if let Ok(b) = a.cast_exact::<PyBool>() {
            return Ok(Arg::Bool(b.is_true()));
        }
        if let Ok(s) = a.cast_exact::<PyString>() {
            return Ok(match s.to_str() {
                Ok(text) => self.prog.str_arg(text),
                // Lone surrogates cannot be UTF-8: keep the object itself.
                Err(_) => Arg::Const(self.pool.intern(a)),
            });
        }
        if let Ok(b) = a.cast_exact::<PyBytes>() {
            return Ok(self.prog.bytes(b.as_bytes()));
        }
        if let Ok(t) = a.cast_exact::<PyTuple>() {
            return Ok(Arg::Tuple(self.values(t.len(), t.iter(), ctx, depth)?));
        }
        if ty == self.t.ilist.bind(py).as_type_ptr() || a.is_exact_instance_of::<PyList>() {
            let list = a.cast::<PyList>()?;
            let k = self.values(list.len(), list.iter(), ctx, depth)?;
            return Ok(Arg::List(k));
        }
        if ty == self.t.idict.bind(py).as_type_ptr() || a.is_exact_instance_of::<PyDict>() {
            let dict = a.cast::<PyDict>()?;
            let items = dict.iter().flat_map(|(key, value)| [key, value]);
            return Ok(Arg::Dict(self.values(2 * dict.len(), items, ctx, depth)?));
        }
        if ty == self.t.device.bind(py).as_type_ptr() {
            return Ok(Arg::Const(self.pool.intern_device(a)?));
        }
        if a.is_instance(self.t.node.bind(py))? {
            return self.node_ref(a, ctx);
        }
        Ok(Arg::Const(self.pool.intern(a)))
    }

    /// The first `n` of `items` (a container's, nested at `depth`) into fresh consecutive
    /// slots, which nested containers' slots follow; the span's index.
    fn values(
        &mut self,
        n: usize,
        items: impl Iterator<Item = Bound<'py, PyAny>>,
        ctx: &Ctx<'_, 'py>,
        depth: usize,
    ) -> PyResult<u32> {
        let span = self.prog.reserve_args(n);
        for (k, item) in items.take(n).enumerate() {
            self.prog.args[span.start as usize + k] = self.value(&item, ctx, depth + 1)?;
        }
        Ok(self.prog.add_span(span))
    }

    fn node_ref(&mut self, a: &Bound<'py, PyAny>, ctx: &Ctx<'_, 'py>) -> PyResult<Arg> {
        if let Some(&i) = ctx.index.get(&(a.as_ptr() as usize)) {
            return Ok(Arg::Node(i));
        }
        if let Some(loose) = &mut self.loose {
            loose.push(a.clone());
            return Ok(Arg::Node(loose.len() as u32 - 1));
        }
        let name = shown(a.getattr(intern!(self.py, "name")));
        Err(node_error(ctx.node, Reason::NotEarlierNode(name)))
    }

    /// One loose value (vLLM's `_node_ref`): nodes are named by their own names.
    pub fn loose_arg(&mut self, a: &Bound<'py, PyAny>) -> PyResult<Arg> {
        self.loose = Some(Vec::new());
        let index = ByAddr::default();
        let ctx = Ctx {
            node: a,
            index: &index,
        };
        let v = self.value(a, &ctx, 0)?;
        self.prog.n_consts = self.pool.objects.len() as u32;
        Ok(v)
    }
}

/// The child module at dotted path `path` (the str `key`) of `gm`, whose `_modules` is
/// `modules`: through `_modules` dicts, else `get_submodule` (for modules that keep children
/// elsewhere); None if there is none.
fn child<'py>(
    gm: &Bound<'py, PyAny>,
    modules: Option<&Bound<'py, PyDict>>,
    key: &Bound<'py, PyAny>,
    path: &str,
) -> Option<Bound<'py, PyAny>> {
    let py = gm.py();
    let lookup = |m: &Bound<'py, PyAny>, part: &str| -> Option<Bound<'py, PyAny>> {
        let d = m.getattr(intern!(py, "_modules")).ok()?;
        d.cast_into::<PyDict>().ok()?.get_item(part).ok().flatten()
    };
    let found = match (modules, path.contains('.')) {
        // The key str object keeps its hash: no new str per lookup.
        (Some(d), false) => d.get_item(key).ok().flatten(),
        _ => path
            .split('.')
            .try_fold(gm.clone(), |m, part| lookup(&m, part)),
    };
    match found {
        Some(c) if !c.is_none() => Some(c),
        _ => gm
            .call_method1(intern!(py, "get_submodule"), (path,))
            .ok()
            .filter(|c| !c.is_none()),
    }
}
