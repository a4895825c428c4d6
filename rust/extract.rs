//! Reads torch.fx objects into the IR: the only module that touches Python objects, besides
//! the thin function layer in `lib.rs`. One pass per graph; nodes are matched by identity.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyIterator, PyList, PyString, PyType};
use pyo3::{ffi, intern};
use rustc_hash::FxHashMap;

use crate::emit::{default_threads, Layout, Style, PARALLEL_MIN_NODES};
use crate::error::Error;
use crate::helper::{helper_min_nodes, Ahead, Helper};
use crate::ir::{
    Arg, Graph, Node, Op, Program, Slot, Span, Submod, SubmodKind, Target, MAX_DEPTH, MAX_KWARGS,
};
use crate::names::{self, hash_bytes};
use crate::stream::{Batch, Full, Streamed, Streams, BATCH, FULL_BATCH};
use crate::table::{AddrTable, Table};

/// The text of a compact ASCII str (nearly every fx name), read in place; None for other
/// strings.
///
/// # Safety
/// `obj` must be a live str (or subclass), kept alive for the returned lifetime.
unsafe fn ascii_bytes<'s>(obj: *mut ffi::PyObject) -> Option<&'s [u8]> {
    (ffi::PyUnicode_IS_COMPACT_ASCII(obj) != 0).then(|| {
        let data = ffi::PyUnicode_DATA(obj) as *const u8;
        std::slice::from_raw_parts(data, ffi::PyUnicode_GET_LENGTH(obj) as usize)
    })
}

fn type_ptr(obj: &Bound<'_, PyAny>) -> usize {
    // SAFETY: `obj` is a live object; reading its type pointer takes no reference.
    unsafe { ffi::Py_TYPE(obj.as_ptr()) as usize }
}

/// The node fields read per node, in [`Slots`] order.
const FIELD_NAMES: [&str; 5] = ["op", "name", "target", "_args", "_kwargs"];
const F_OP: usize = 0;
const F_NAME: usize = 1;
const F_TARGET: usize = 2;
const F_ARGS: usize = 3;
const F_KWARGS: usize = 4;

/// The op names torch.fx uses.
const OPS: [(&str, Op); 6] = [
    ("call_function", Op::CallFunction),
    ("call_module", Op::CallModule),
    ("placeholder", Op::Placeholder),
    ("call_method", Op::CallMethod),
    ("get_attr", Op::GetAttr),
    ("output", Op::Output),
];

/// Byte offsets of `torch.fx.Node`'s C member slots for [`FIELD_NAMES`], read directly instead
/// of through `getattr` when a node's type is exactly `Node` and the members are plain object
/// slots.
#[derive(Clone, Copy)]
struct Slots {
    fields: [isize; 5],
    /// `_next`, for prefetching the nodes ahead.
    next: isize,
}

impl Slots {
    fn load(py: Python<'_>, node_type: &Bound<'_, PyType>) -> Option<Slots> {
        let base = py.import("torch._C").ok()?.getattr("_NodeBase").ok()?;
        let offset = |name: &str| -> Option<isize> {
            let (d, offset, code) = member(py, &base, name)?;
            // The descriptor `Node` resolves must be this very member of the C base.
            let own = node_type.getattr(name).ok()?.is(&d);
            (own && code == ffi::Py_T_OBJECT_EX).then_some(offset)
        };
        let mut fields = [0; 5];
        for (o, name) in fields.iter_mut().zip(FIELD_NAMES) {
            *o = offset(name)?;
        }
        Some(Slots {
            fields,
            next: offset("_next")?,
        })
    }
}

/// Member `name` of the C type `base`: its descriptor, offset and C type code.
fn member<'py>(
    py: Python<'py>,
    base: &Bound<'py, PyAny>,
    name: &str,
) -> Option<(Bound<'py, PyAny>, isize, std::ffi::c_int)> {
    let member_type = py
        .import("types")
        .ok()?
        .getattr("MemberDescriptorType")
        .ok()?;
    let d = base.getattr("__dict__").ok()?.get_item(name).ok()?;
    if !d.get_type().is(&member_type) {
        return None;
    }
    // SAFETY: `d` is a live member_descriptor, whose C layout is PyMemberDescrObject.
    let (offset, code) = unsafe {
        let member = (*(d.as_ptr() as *const ffi::PyMemberDescrObject)).d_member;
        if member.is_null() {
            return None;
        }
        ((*member).offset, (*member).type_code)
    };
    Some((d, offset, code))
}

/// Reads an object slot of `obj` at `offset`: a borrowed pointer, NULL when unset.
///
/// # Safety
/// `obj` must be an instance of the type whose member slot lives at `offset`, holding an
/// object pointer or NULL (checked by [`Slots::load`] and the caller's exact type check).
unsafe fn read_slot(obj: *mut ffi::PyObject, offset: isize) -> *mut ffi::PyObject {
    *((obj as *const u8).offset(offset) as *const *mut ffi::PyObject)
}

/// Asks the CPU to start loading the cache line at `p` (a hint: never faults, any address).
#[inline(always)]
fn prefetch(p: *const ffi::PyObject) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetching has no architectural effect and accepts any address.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(p as *const i8);
        _mm_prefetch::<_MM_HINT_T0>((p as *const i8).wrapping_add(64));
    }
}

/// The torch.fx types and objects the reader compares against, loaded once per process.
struct Types {
    slots: Option<Slots>,
    /// Pointers of the interned op strings fx uses (held in `_held`).
    ops: [(usize, Op); 6],
    /// The interned `"call_module"`.
    call_module: usize,
    node: usize,
    ilist: usize,
    idict: usize,
    device: usize,
    /// Where a `torch.device` keeps its value (see [`device_value_at`]).
    device_at: Option<usize>,
    graph_module: Py<PyType>,
    getitem: usize,
    walk: Option<Walk>,
    /// Owned references behind every pointer above.
    _held: Vec<Py<PyAny>>,
}

static TYPES: PyOnceLock<Types> = PyOnceLock::new();

impl Types {
    fn get(py: Python<'_>) -> PyResult<&'static Types> {
        TYPES.get_or_try_init(py, || Types::load(py))
    }

    fn load(py: Python<'_>) -> PyResult<Types> {
        let import = |module: &str, name: &str| -> PyResult<Bound<'_, PyAny>> {
            py.import(module)?.getattr(name)
        };
        let node_type = import("torch.fx", "Node")?.cast_into::<PyType>()?;
        let ilist = import("torch.fx.immutable_collections", "immutable_list")?;
        let idict = import("torch.fx.immutable_collections", "immutable_dict")?;
        let device = import("torch", "device")?;
        let graph_module = import("torch.fx", "GraphModule")?.cast_into::<PyType>()?;
        let getitem = import("operator", "getitem")?;
        let mut held = vec![];
        let mut ops = [(0, Op::Output); 6];
        for (slot, (name, op)) in ops.iter_mut().zip(OPS) {
            let s = PyString::intern(py, name);
            *slot = (s.as_ptr() as usize, op);
            held.push(s.into_any().unbind());
        }
        let slots = Slots::load(py, &node_type);
        let node_type = node_type.into_any();
        held.extend([&node_type, &ilist, &idict, &device, &getitem].map(|o| o.clone().unbind()));
        let ptr = |o: &Bound<'_, PyAny>| o.as_ptr() as usize;
        Ok(Types {
            slots,
            call_module: ops
                .iter()
                .find(|(_, o)| *o == Op::CallModule)
                .map_or(0, |p| p.0),
            ops,
            node: ptr(&node_type),
            ilist: ptr(&ilist),
            idict: ptr(&idict),
            device: ptr(&device),
            device_at: device_value_at(&device).ok().flatten(),
            graph_module: graph_module.unbind(),
            getitem: ptr(&getitem),
            walk: Walk::load(py).ok().flatten(),
            _held: held,
        })
    }
}

/// The offset of a `torch.device`'s value in the object, checked on sample devices. torch
/// keeps it as two bytes, type and index (`at::Device`), right after the object header; two
/// devices are equal exactly when those bytes are. Reading them replaces a hash and an
/// equality test through Python's protocols (each wrapped in torch's error handling) per
/// device. None, and devices are hashed and compared, if the samples do not bear it out.
fn device_value_at(device: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
    let at = std::mem::size_of::<ffi::PyObject>();
    if device.getattr("__basicsize__")?.extract::<usize>()? < at + 2 {
        return Ok(None);
    }
    // Devices differing in type only, in index only, by no index against index 0, and one
    // made twice.
    let mut samples = Vec::new();
    for (kind, index) in [
        ("cpu", None),
        ("cpu", Some(0)),
        ("cuda", None),
        ("cuda", Some(0)),
        ("cuda", Some(3)),
        ("meta", None),
        ("cuda", Some(3)),
    ] {
        samples.push(match index {
            None => device.call1((kind,))?,
            Some(i) => device.call1((kind, i))?,
        });
    }
    for a in &samples {
        for b in &samples {
            // SAFETY: exact torch.device objects, at least `at + 2` bytes long.
            if unsafe { device_value(a.as_ptr(), at) == device_value(b.as_ptr(), at) } != a.eq(b)? {
                return Ok(None);
            }
        }
    }
    Ok(Some(at))
}

/// The two value bytes of a `torch.device` at offset `at` ([`device_value_at`]).
///
/// # Safety
/// `obj` must be a live exact `torch.device` and `at` its checked offset.
unsafe fn device_value(obj: *mut ffi::PyObject, at: usize) -> u16 {
    (obj as *const u8).add(at).cast::<u16>().read_unaligned()
}

/// What `gm.graph.nodes` does in torch.fx, done without its Python-level steps: the `graph`
/// and `nodes` properties, the `_node_list` object and its `__len__` and `__iter__` are five
/// Python calls per graph, a good part of the cost of a program of many small graphs. Used
/// only while the properties are torch.fx's own and a sample graph walks the same way.
struct Walk {
    graph_prop: Py<PyAny>,
    nodes_prop: Py<PyAny>,
    links: Links,
}

/// Where fx's C node base keeps the links of its doubly linked node list. Following them here
/// is what `_NodeIter` does, without creating one per graph: on a call that finds the caches
/// cold, creating it cost ~12 µs (a sixth of a 16-node `generate`).
#[derive(Clone, Copy)]
struct Links {
    /// `torch._C._NodeBase` (a type object's address): every object followed must be an
    /// instance.
    base: usize,
    /// `_next`, an object slot.
    next: isize,
    /// `_erased`, a C bool.
    erased: isize,
}

impl Links {
    fn load(py: Python<'_>) -> Option<Links> {
        let base = py.import("torch._C").ok()?.getattr("_NodeBase").ok()?;
        let (_, next, next_code) = member(py, &base, "_next")?;
        let (_, erased, erased_code) = member(py, &base, "_erased")?;
        if next_code != ffi::Py_T_OBJECT_EX || erased_code != ffi::Py_T_BOOL {
            return None;
        }
        let base = base.cast_into::<PyType>().ok()?;
        Some(Links {
            // The type object lives as long as torch._C, which is never unloaded.
            base: base.as_ptr() as usize,
            next,
            erased,
        })
    }

    /// Whether `obj` (a live object, or NULL) is a `_NodeBase`, whose links can be read.
    fn is_node(&self, obj: *mut ffi::PyObject) -> bool {
        // SAFETY: `base` is a live type object (see `Links::base`); `obj` is live if not NULL.
        !obj.is_null() && unsafe { ffi::PyObject_TypeCheck(obj, self.base as *mut _) } != 0
    }
}

/// A graph's nodes in order: fx's own iterator, or its walk done here ([`Links`]).
enum Nodes<'py> {
    Fx(Bound<'py, PyIterator>),
    Links {
        links: Links,
        root: Bound<'py, PyAny>,
        /// The node returned last (the root before the first).
        at: Bound<'py, PyAny>,
        /// Links left to follow before the list counts as broken: a cycle that misses the root
        /// would otherwise be followed forever (as fx's own iterator does).
        left: usize,
    },
}

impl<'py> Iterator for Nodes<'py> {
    type Item = PyResult<Bound<'py, PyAny>>;

    fn next(&mut self) -> Option<Self::Item> {
        let (links, root, at, left) = match self {
            Nodes::Fx(it) => return it.next(),
            Nodes::Links {
                links,
                root,
                at,
                left,
            } => (*links, root, at, left),
        };
        let py = root.py();
        loop {
            let Some(l) = left.checked_sub(1) else {
                let why = "the graph's node list is broken: its links do not lead back to its root";
                return Some(Err(Error::Invalid(why.into()).into()));
            };
            *left = l;
            // SAFETY: `at` is held and is a `_NodeBase` instance (the root was checked by the
            // caller, every node since below), so its `_next` slot is at `links.next`. The
            // pointer read is borrowed from `at` and taken over (a new reference) before any
            // Python code can run.
            let next = unsafe { read_slot(at.as_ptr(), links.next) };
            if !links.is_node(next) {
                let why = "a node's _next link is not a node: the graph's node list is broken";
                return Some(Err(Error::Invalid(why.into()).into()));
            }
            if next == root.as_ptr() {
                return None;
            }
            *at = unsafe { Bound::from_borrowed_ptr(py, next) };
            // SAFETY: `at` is a `_NodeBase` instance (checked above); `_erased` is a C bool.
            let erased = unsafe { *(at.as_ptr() as *const u8).offset(links.erased) } != 0;
            if !erased {
                return Some(Ok(at.clone()));
            }
        }
    }
}

impl Walk {
    fn load(py: Python<'_>) -> PyResult<Option<Walk>> {
        let fx = py.import("torch.fx")?;
        let Some(links) = Links::load(py) else {
            return Ok(None);
        };
        let walk = Walk {
            graph_prop: fx.getattr("GraphModule")?.getattr("graph")?.unbind(),
            nodes_prop: fx.getattr("Graph")?.getattr("nodes")?.unbind(),
            links,
        };
        // A sample graph with an erased node left linked (as while its graph is being
        // changed) must walk as fx walks it.
        let g = fx.getattr("Graph")?.call0()?;
        let x = g.call_method1("placeholder", ("x",))?;
        let y = g.call_method1("placeholder", ("y",))?;
        g.call_method1("output", (&x,))?;
        let m = fx.getattr("GraphModule")?.call1((PyDict::new(py), &g))?;
        y.setattr("_erased", true)?;
        let Some((n, walked)) = walk.nodes(&m)? else {
            return Ok(None);
        };
        let expected = m.getattr("graph")?.getattr("nodes")?.try_iter()?;
        let walked = walked.collect::<PyResult<Vec<_>>>()?;
        let expected = expected.collect::<PyResult<Vec<_>>>()?;
        y.setattr("_erased", false)?;
        let same =
            walked.len() == expected.len() && walked.iter().zip(&expected).all(|(a, b)| a.is(b));
        Ok((n == 3 && same && walked.len() == 2).then_some(walk))
    }

    /// `(len(gm.graph.nodes), iter(gm.graph.nodes))`, or None where `gm` or its graph is of a
    /// type that replaces those properties.
    fn nodes<'py>(&self, gm: &Bound<'py, PyAny>) -> PyResult<Option<(usize, Nodes<'py>)>> {
        let py = gm.py();
        // Whether `obj`'s type still takes attribute `name` from fx (`prop`).
        let fx_own = |obj: &Bound<'py, PyAny>, name: &Bound<'py, PyString>, prop: &Py<PyAny>| {
            obj.get_type().getattr(name).map(|p| p.is(prop))
        };
        if !fx_own(gm, intern!(py, "graph"), &self.graph_prop)? {
            return Ok(None);
        }
        let graph = gm.getattr(intern!(py, "_graph"))?;
        if !fx_own(&graph, intern!(py, "nodes"), &self.nodes_prop)? {
            return Ok(None);
        }
        let n = graph.getattr(intern!(py, "_len"))?.extract::<usize>()?;
        let root = graph.getattr(intern!(py, "_root"))?;
        if !self.links.is_node(root.as_ptr()) {
            return Ok(None);
        }
        let nodes = Nodes::Links {
            links: self.links,
            at: root.clone(),
            root,
            // Far more than the graph's nodes and any erased ones still linked.
            left: 4 * n + 1024,
        };
        Ok(Some((n, nodes)))
    }
}

/// The constant pool being built: slots in order of first appearance, interned by identity and,
/// for `torch.device` (the immutable torch type that is not a singleton), by value.
pub struct Pool<'py> {
    pub objects: Vec<Bound<'py, PyAny>>,
    /// The slot of each pooled object by id, and so only of objects the pool holds: it is
    /// exported to an external index, where the id of an object held by nobody could be reused.
    by_id: FxHashMap<usize, u32>,
    /// Devices by value bytes ([`device_value_at`])...
    device_values: FxHashMap<u16, u32>,
    /// ...or, where those cannot be read, by hash.
    devices: FxHashMap<isize, Vec<u32>>,
    /// Slots that existed before this pass (an external vLLM-style pool).
    pub preexisting: usize,
}

impl<'py> Pool<'py> {
    pub fn new() -> Self {
        Pool {
            objects: Vec::new(),
            by_id: FxHashMap::default(),
            device_values: FxHashMap::default(),
            devices: FxHashMap::default(),
            preexisting: 0,
        }
    }

    /// Continues an external pool: `consts` plus its `id(obj) -> slot` index.
    pub fn seeded(consts: &Bound<'py, PyList>, index: &Bound<'py, PyDict>) -> PyResult<Self> {
        let mut p = Pool::new();
        for obj in consts.iter() {
            p.objects.push(obj);
        }
        for (k, v) in index.iter() {
            p.by_id.insert(k.extract::<usize>()?, v.extract::<u32>()?);
        }
        p.preexisting = p.objects.len();
        Ok(p)
    }

    fn intern(&mut self, obj: &Bound<'py, PyAny>) -> u32 {
        let id = obj.as_ptr() as usize;
        if let Some(&k) = self.by_id.get(&id) {
            return k;
        }
        let k = self.objects.len() as u32;
        self.objects.push(obj.clone());
        self.by_id.insert(id, k);
        k
    }

    /// A `torch.device` (exactly), merged with an equal one met before; `value_at` is
    /// [`Types::device_at`].
    fn intern_device(&mut self, obj: &Bound<'py, PyAny>, value_at: Option<usize>) -> PyResult<u32> {
        let id = obj.as_ptr() as usize;
        if let Some(&k) = self.by_id.get(&id) {
            return Ok(k);
        }
        if let Some(at) = value_at {
            // SAFETY: an exact torch.device (the caller checked its type), `at` checked.
            let v = unsafe { device_value(obj.as_ptr(), at) };
            if let Some(&k) = self.device_values.get(&v) {
                return Ok(k);
            }
            let k = self.intern(obj);
            self.device_values.insert(v, k);
            return Ok(k);
        }
        // torch.device hashes and compares in C: no string is built per device.
        let h = obj.hash()?;
        if let Some(slots) = self.devices.get(&h) {
            for &k in slots {
                if self.objects[k as usize].eq(obj)? {
                    return Ok(k);
                }
            }
        }
        let k = self.intern(obj);
        self.devices.entry(h).or_default().push(k);
        Ok(k)
    }

    /// The new `(id, slot)` pairs, to write back into an external index.
    pub fn new_ids(&self) -> impl Iterator<Item = (usize, u32)> + '_ {
        self.by_id
            .iter()
            .filter(|(_, &k)| k as usize >= self.preexisting)
            .map(|(&id, &k)| (id, k))
    }
}

/// The names resolvers gave call targets, kept across calls: (resolver, target) -> name. A
/// small graph has a few distinct targets, and calling the Python resolver for each, with its
/// code out of the cache after the caller's own work, was about 8% of `generate` on inline 1k
/// (measured by warming only the resolver before a call).
///
/// A kept name is used again only if walking its path from `torch`, `operator` or `builtins`
/// still gives the very target (rebinding a module attribute is seen); otherwise, and for
/// targets the resolver sent to the pool, the resolver is asked, so the answer never depends
/// on what the process generated before.
struct Answers(std::sync::Mutex<Option<FxHashMap<(usize, usize), Answer>>>);

struct Answer {
    /// Held, so that neither id is reused while the entry lives.
    _keys: [Py<PyAny>; 2],
    name: String,
    /// The attributes that lead from `root` to the target.
    root: Py<PyAny>,
    path: Vec<Py<PyString>>,
}

/// Entries kept at most (all are dropped when full: a process has few resolvers and targets).
const ANSWERS_MAX: usize = 4096;

static ANSWERS: Answers = Answers(std::sync::Mutex::new(None));

impl Answers {
    /// The kept name of `t`, if its path still leads to `t`.
    fn get(&self, resolver: &Bound<'_, PyAny>, t: &Bound<'_, PyAny>) -> Option<String> {
        let py = t.py();
        let key = (resolver.as_ptr() as usize, t.as_ptr() as usize);
        let (name, root, path) = {
            let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
            let a = map.as_ref()?.get(&key)?;
            let path: Vec<_> = a.path.iter().map(|p| p.clone_ref(py)).collect();
            (a.name.clone(), a.root.clone_ref(py), path)
        };
        // Outside the lock: an attribute lookup may run Python code.
        Self::walk(root.bind(py), &path, t).then_some(name)
    }

    /// Keeps the name the resolver gave `t` (one that passed
    /// [`names::check_untrusted_call_name`]) if its path leads to `t`.
    fn put(&self, resolver: &Bound<'_, PyAny>, t: &Bound<'_, PyAny>, name: &str) {
        let py = t.py();
        let mut parts = name.split('.').peekable();
        let root = match parts.peek() {
            Some(&m @ ("torch" | "operator")) if name.contains('.') => {
                parts.next();
                py.import(m)
            }
            _ => py.import("builtins"),
        };
        let Ok(root) = root else { return };
        let path: Vec<_> = parts.map(|p| PyString::intern(py, p).unbind()).collect();
        if !Self::walk(root.as_any(), &path, t) {
            return;
        }
        let answer = Answer {
            _keys: [resolver.clone().unbind(), t.clone().unbind()],
            name: name.to_string(),
            root: root.into_any().unbind(),
            path,
        };
        let key = (resolver.as_ptr() as usize, t.as_ptr() as usize);
        let _dropped = {
            let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
            let map = map.get_or_insert_with(FxHashMap::default);
            let full = map.len() >= ANSWERS_MAX;
            let evicted = if full {
                std::mem::take(map)
            } else {
                FxHashMap::default()
            };
            (evicted, map.insert(key, answer))
        };
        // Dropped here, outside the lock: a last reference may run Python code.
    }

    /// Whether the attributes `path` lead from `root` to `t`.
    fn walk(root: &Bound<'_, PyAny>, path: &[Py<PyString>], t: &Bound<'_, PyAny>) -> bool {
        let py = t.py();
        let mut at = root.clone();
        for part in path {
            match at.getattr(part.bind(py)) {
                Ok(next) => at = next,
                Err(_) => return false,
            }
        }
        at.is(t)
    }
}

/// Walks graph modules into a [`Program`].
pub struct Extractor<'py> {
    py: Python<'py>,
    pub prog: Program,
    pub pool: Pool<'py>,
    t: &'static Types,
    resolver: Bound<'py, PyAny>,
    /// Resolved call_function targets by object (held, so an id is never reused meanwhile).
    targets: FxHashMap<usize, (Target, Bound<'py, PyAny>)>,
    /// Hash of a qualified child name -> its submodule index (names compared on hit). None
    /// while every child came as the entry after the last one found in its module's
    /// `_modules` ([`Children::next_if`]), as in split graphs: no name can repeat then, and
    /// the table is made only when one does not come that way.
    submods: Option<Table<u32>>,
    /// Keyword keys' text spans, packed, by str object (held); emptied with the wide table.
    key_spans: FxHashMap<usize, (Slot, Bound<'py, PyAny>)>,
    /// Whether a child of this type is a plain GraphModule (inlined), by type pointer.
    inline_types: FxHashMap<usize, bool>,
    /// Per submodule, a str object equal to its qualified name when one exists (the target).
    pub submod_names: Vec<Option<Bound<'py, PyAny>>>,
    /// For `_node_ref`: nodes met outside any graph, in order (named by their own names).
    pub loose: Option<Vec<Bound<'py, PyAny>>>,
    /// Populates the arenas' next pages on another thread while large graphs are read (see
    /// [`helper_min_nodes`]), and works out their names and last uses when `stream` is set.
    helper: Option<Helper>,
    /// The layout's name prefix, entry function and header, when names are worked out while
    /// reading.
    stream: Option<(&'static str, String, bool)>,
    /// Whether a large root's statements are written on the helper while it is read (native
    /// layouts that allow submodules): its nodes then go to the helper in full, batch by batch,
    /// and the program keeps none of them ([`crate::emit::Body`]).
    statements: bool,
    /// While such a root is read.
    writing_root: bool,
    /// Whether reading stopped because the root written on the helper calls an inlined child
    /// (whose function the program would need, and whose nodes share the root's arenas):
    /// read again with [`Extractor::without_statements`].
    pub abandoned: bool,
    /// Whether a root's nodes went to the helper in full (the program then holds none of them).
    pub handed_over: bool,
    /// The nodes the current node references, in order.
    refs: Vec<u32>,
}

/// Node object -> index in its graph, for the nodes read so far.
type NodeIndex = AddrTable;

/// A graph module's `_modules`, read in insertion order before it is hashed into: split graphs
/// call their children in the order they were added, so the entry after the last one found is
/// nearly always the one wanted. Taking it that way reads the entries in memory order and lets
/// the next entry's key and child be prefetched, where a hashed lookup misses the cache on the
/// index, the entry and the key of a large dict.
struct Children<'a, 'py> {
    dict: Option<&'a Bound<'py, PyDict>>,
    /// The `PyDict_Next` position of the entry expected next.
    next: std::cell::Cell<ffi::Py_ssize_t>,
}

impl<'py> Children<'_, 'py> {
    /// The child named `key` (a str whose text is `text`) when it is the entry expected next.
    ///
    /// # Safety
    /// `key` must be a live object.
    unsafe fn next_if(
        &self,
        py: Python<'py>,
        key: *mut ffi::PyObject,
        text: &str,
    ) -> Option<Bound<'py, PyAny>> {
        let d = self.dict?.as_ptr();
        let mut pos = self.next.get();
        let (mut k, mut v) = (std::ptr::null_mut(), std::ptr::null_mut());
        // Safe on any dict, mutated or not: the position is bounds-checked.
        if ffi::PyDict_Next(d, &mut pos, &mut k, &mut v) == 0 {
            return None;
        }
        // An exact str key equals `key` exactly when their texts are equal.
        let same = k == key
            || (ffi::PyUnicode_CheckExact(k) != 0 && ascii_bytes(k) == Some(text.as_bytes()));
        if !same {
            return None;
        }
        // Owned before anything else runs: the dict only lends it.
        let child = Bound::from_borrowed_ptr(py, v);
        self.next.set(pos);
        let (mut k, mut v) = (std::ptr::null_mut(), std::ptr::null_mut());
        if ffi::PyDict_Next(d, &mut pos, &mut k, &mut v) != 0 {
            prefetch(k);
            prefetch(v);
        }
        Some(child)
    }
}

struct NodeCtx<'a, 'py> {
    index: &'a NodeIndex,
    node: &'a Bound<'py, PyAny>,
}

fn node_error(node: &Bound<'_, PyAny>, reason: impl Into<String>) -> PyErr {
    let get = |a: &str| {
        node.getattr(a)
            .and_then(|v| v.str().map(|s| s.to_string()))
            .unwrap_or_else(|_| "?".into())
    };
    Error::Node {
        op: get("op"),
        name: get("name"),
        target: get("target"),
        reason: reason.into(),
    }
    .into()
}

impl<'py> Extractor<'py> {
    pub fn new(py: Python<'py>, resolver: Bound<'py, PyAny>, pool: Pool<'py>) -> PyResult<Self> {
        Ok(Extractor {
            py,
            prog: Program::default(),
            pool,
            t: Types::get(py)?,
            resolver,
            targets: FxHashMap::default(),
            submods: None,
            key_spans: FxHashMap::default(),
            inline_types: FxHashMap::default(),
            submod_names: Vec::new(),
            loose: None,
            helper: None,
            stream: None,
            statements: false,
            writing_root: false,
            abandoned: false,
            handed_over: false,
            refs: Vec::new(),
        })
    }

    /// Has the names and last uses of large graphs worked out on the helper thread while they
    /// are read, for emitting with `layout` ([`Extractor::take_streamed`]).
    pub fn stream_for(&mut self, layout: &Layout) {
        self.stream = Some((
            layout.style.prefix(),
            layout.fn_name.to_string(),
            layout.header,
        ));
        self.statements = layout.style == Style::Native && layout.with_submod;
    }

    /// Keeps every node in the program (after [`Extractor::abandoned`]).
    pub fn without_statements(&mut self) {
        self.statements = false;
    }

    /// Extracts `gm` as the root graph and every plain GraphModule child it calls. With
    /// [`Extractor::stream_for`], the helper may still be finishing the names and last uses:
    /// [`Extractor::take_streamed`] waits for them.
    pub fn run(&mut self, gm: &Bound<'py, PyAny>) -> PyResult<()> {
        // After an error the helper is joined when the extractor is dropped.
        self.graph(gm, "", 0)?;
        // Every node is in: the helper finishes while this thread checks the nodes (and the
        // caller the layout). It lives on, handing scratch memory back, until the extractor is
        // dropped.
        if let Some(h) = &mut self.helper {
            h.close();
        }
        self.prog.n_consts = self.pool.objects.len() as u32;
        // Arguments are valid by construction (earlier nodes of the same graph, slots of this
        // pool, strings from Python); the per-node rules still need checking.
        for gi in 0..self.prog.graphs.len() as u32 {
            self.prog.check_shapes(gi)?;
        }
        debug_assert!(self.prog.validate().is_ok());
        Ok(())
    }

    /// Empties the program and the child table, handing their pages back to the system first
    /// (see [`Program::discard`]); the pool and the helper stay.
    pub fn discard_program(&mut self) {
        std::mem::take(&mut self.prog).discard();
        if let Some(t) = self.submods.take() {
            t.discard();
        }
    }

    /// The names and last uses the helper worked out for the graphs it was handed (none
    /// without [`Extractor::stream_for`] or a helper), once it has finished them.
    pub fn take_streamed(&mut self) -> Vec<Streamed> {
        match &mut self.helper {
            Some(h) => h.finish(),
            None => Vec::new(),
        }
    }

    /// Waits for the helper thread to end (it hands its scratch memory back first).
    pub fn end_helper(&mut self) {
        drop(self.helper.take());
    }

    /// The helper, once it has handed its scratch memory back after
    /// [`Extractor::take_streamed`] (None if there is none or its thread failed).
    pub fn settled_helper(&mut self) -> Option<Helper> {
        self.helper.take().filter(Helper::settle)
    }

    fn graph(&mut self, gm: &Bound<'py, PyAny>, prefix: &str, depth: usize) -> PyResult<u32> {
        let py = self.py;
        if depth > MAX_DEPTH {
            return Err(Error::Invalid("graph modules nest too deeply".into()).into());
        }
        let gi = self.prog.graphs.len() as u32;
        self.prog.graphs.push(Graph::default());
        let modules = gm
            .getattr(intern!(py, "_modules"))
            .ok()
            .and_then(|d| d.cast_into::<PyDict>().ok());
        let children = Children {
            dict: modules.as_ref(),
            next: 0.into(),
        };
        let fast = match &self.t.walk {
            Some(w) => w.nodes(gm).ok().flatten(),
            None => None,
        };
        let (n_nodes, node_iter) = match fast {
            Some(found) => found,
            None => {
                let list = gm
                    .getattr(intern!(py, "graph"))?
                    .getattr(intern!(py, "nodes"))?;
                (list.len().unwrap_or(0), Nodes::Fx(list.try_iter()?))
            }
        };
        let mut index = NodeIndex::with_capacity(n_nodes);
        let large = n_nodes >= PARALLEL_MIN_NODES;
        // Whether the root's statements can be written on the helper while it is read: its
        // nodes and arguments then go there batch by batch (the arenas start empty, so spans
        // count from a batch's start).
        let whole_root = depth == 0 && self.statements && self.prog.args.is_empty();
        let threaded = whole_root || n_nodes >= helper_min_nodes();
        if large && threaded && self.helper.is_none() && default_threads() > 1 {
            let streams = self.stream.as_ref().map(|(p, f, h)| Streams::new(p, f, *h));
            self.helper = Helper::start(streams);
        }
        let mut batch = match &self.helper {
            Some(h) if large && h.streams() => Some(h.batch(gi, n_nodes)),
            _ => None,
        };
        let full = whole_root && batch.is_some();
        self.writing_root = full;
        let per_batch = match full {
            true => FULL_BATCH,
            false => n_nodes,
        };
        // Generous: untouched capacity costs address space, not memory; regrowing copies.
        self.prog.args.reserve(per_batch * 8);
        self.prog.wide.reserve(per_batch);
        self.prog.text.reserve(n_nodes * 24);
        if depth == 0 {
            // Split graphs call a child every other node or so; growing the lists from
            // nothing would write (and fault in) twice their final memory.
            self.prog.submods.reserve(n_nodes / 2);
            self.submod_names.reserve(n_nodes / 2);
        }
        let mut nodes: Vec<Node> = Vec::with_capacity(per_batch);
        // Nodes handed over in full so far, and how much of the text and blobs went with them.
        let (mut base, mut sent) = (0u32, (0usize, 0usize));
        let mut seen_default = false;
        // The identity table is written all over from the first node: populate it whole.
        let mut ahead = [(); 5].map(|_| Ahead::default());
        if let (Some(pf), true) = (&self.helper, large) {
            let (ptr, len) = index.memory();
            pf.request_all(ptr, len);
        }
        // Owned references for fields read through getattr (nodes that are not exactly `Node`).
        let mut keep: Vec<Bound<'py, PyAny>> = Vec::new();
        for node in node_iter {
            let node = node?;
            if full && nodes.len() == FULL_BATCH {
                let b = batch.as_mut().expect("a batch for every full graph");
                base += self.hand_over(gi, &mut nodes, b, &mut sent, &mut seen_default, false)?;
            }
            self.prefetch_ahead(&node, &index, prefix.is_empty());
            // 64 nodes fill a few KiB of the arenas, far less than a chunk (the arenas of a
            // root handed over in full are reused, batch after batch).
            if let (Some(pf), 0) = (&self.helper, nodes.len() % 64) {
                let [a, t, n, s, sn] = &mut ahead;
                let read = (base as usize + nodes.len(), n_nodes);
                if !full {
                    a.track_vec(pf, &self.prog.args, read);
                    n.track_vec(pf, &nodes, read);
                }
                t.track(
                    pf,
                    self.prog.text.as_ptr(),
                    self.prog.text.len(),
                    self.prog.text.capacity(),
                    read,
                );
                s.track_vec(pf, &self.prog.submods, read);
                sn.track_vec(pf, &self.submod_names, read);
            }
            let [op_obj, name_obj, target_obj, ..] = self.fields(&node, &mut keep)?;
            // SAFETY (here and below): field pointers are borrowed from `node` (held) or `keep`,
            // and stay valid until Python code runs, which only `target` may do: the argument
            // fields are read again after it.
            let op = unsafe { self.op(op_obj, &node)? };
            let name = unsafe { self.text_of(name_obj) }
                .map_err(|_| node_error(&node, "the name is not a str"))?;
            if let (Some(b), false) = (&mut batch, full) {
                b.text.push_str(name);
            }
            let name = self.prog.push_str(name);
            let target =
                unsafe { self.target(op, target_obj, gm, prefix, &children, &node, name, depth)? };
            let [.., args_obj, kwargs_obj] = self.fields(&node, &mut keep)?;
            let ctx = NodeCtx {
                index: &index,
                node: &node,
            };
            // SAFETY: no Python code runs while the argument objects are walked (`arg` calls
            // only C functions of exact builtin types), so the borrowed pointers stay valid.
            self.refs.clear();
            let (args, n_kwargs) = unsafe {
                if ffi::PyTuple_Check(args_obj) == 0 {
                    return Err(node_error(&node, "args is not a tuple"));
                }
                if ffi::PyDict_Check(kwargs_obj) == 0 {
                    return Err(node_error(&node, "kwargs is not a dict"));
                }
                let n = ffi::PyTuple_GET_SIZE(args_obj) as usize;
                let n_kw = ffi::PyDict_Size(kwargs_obj) as usize;
                if n_kw > MAX_KWARGS {
                    return Err(node_error(
                        &node,
                        format!("more than {MAX_KWARGS} keyword arguments"),
                    ));
                }
                // The keyword arguments' slots follow the positional ones' (`Node::kwargs`).
                let all = self.prog.reserve_args(n + 2 * n_kw);
                let args = Span {
                    start: all.start,
                    len: n as u32,
                };
                self.fill(args, |k| ffi::PyTuple_GET_ITEM(args_obj, k), &ctx, 0)?;
                self.kwargs(kwargs_obj, all.start as usize + n, n_kw, &ctx)?;
                (args, n_kw as u16)
            };
            index.insert(node.as_ptr() as usize, base + nodes.len() as u32);
            nodes.push(Node {
                op,
                name,
                target,
                args,
                n_kwargs,
            });
            // (The helper finds what it needs of a node handed over in full in the node.)
            if let (Some(b), Some(h), false) = (&mut batch, &self.helper, full) {
                b.push(name, op == Op::Output, &self.refs);
                if b.nodes.len() == BATCH {
                    h.send(std::mem::replace(b, h.batch(gi, n_nodes)));
                }
            }
        }
        if full {
            // Its pages are handed back, or they would stay resident through the rest of the
            // call (stitch 100k: 3.10 against 2.89 times the source at peak). Other graphs drop
            // it plainly: the emitter's buffers then reuse its pages instead of faulting in
            // fresh ones (inline 100k: 2.46 times the source at peak with the pages handed
            // back, 2.76 without; 0.70 of the floor against the previous build's 0.65 with
            // them handed back, 0.62 against 0.74 without, in alternating runs).
            index.discard();
            let b = batch.as_mut().expect("a batch for every full graph");
            self.hand_over(gi, &mut nodes, b, &mut sent, &mut seen_default, true)?;
            self.writing_root = false;
        } else if let (Some(b), Some(h)) = (batch, &self.helper) {
            h.send(b);
        }
        self.prog.graphs[gi as usize] = Graph { nodes };
        Ok(gi)
    }

    /// Hands the nodes read since the last call to the helper in full, with their arguments,
    /// after checking them (as [`Program::check_shapes`] would the whole graph); the arenas
    /// start over with the buffers of a batch handed back. `sent` is how much of the text and
    /// blobs the helper has. Returns how many nodes went.
    fn hand_over(
        &mut self,
        gi: u32,
        nodes: &mut Vec<Node>,
        b: &mut Batch,
        sent: &mut (usize, usize),
        seen_default: &mut bool,
        last: bool,
    ) -> PyResult<u32> {
        let Some(h) = &self.helper else {
            return Ok(0);
        };
        self.prog.n_consts = self.pool.objects.len() as u32;
        self.prog.check_nodes(gi, nodes, seen_default, last)?;
        let mut next = h.batch(gi, b.size as usize);
        let spare = next.full.take().unwrap_or_default();
        let p = &mut self.prog;
        let mut f = Full {
            nodes: std::mem::replace(nodes, spare.nodes),
            args: std::mem::replace(&mut p.args, spare.args),
            wide: std::mem::replace(&mut p.wide, spare.wide),
            text: spare.text,
            blobs: spare.blobs,
        };
        f.text.push_str(&p.text[sent.0..]);
        f.blobs.extend_from_slice(&p.blobs[sent.1..]);
        *sent = (p.text.len(), p.blobs.len());
        nodes.reserve(FULL_BATCH);
        p.args.reserve(FULL_BATCH * 8);
        p.wide.reserve(FULL_BATCH);
        // The keys' slots index the wide table just handed over.
        self.key_spans.clear();
        let count = f.nodes.len() as u32;
        let mut done = std::mem::replace(b, next);
        done.full = Some(f);
        h.send(done);
        self.handed_over = true;
        Ok(count)
    }

    /// Reading a large graph waits on memory: each node, its name, target, args and kwargs are
    /// separate objects. While node `i` is read, this prefetches the fields of node `i + 3`, its
    /// slot in the node index and node `i + 4` itself (loaded by the previous steps' prefetches),
    /// following `_next` links between exact `Node` objects only. In the root graph it also
    /// prefetches node `i + 1`'s slot in the child table when it calls a child (its target's
    /// text was loaded two steps before).
    fn prefetch_ahead(&self, node: &Bound<'py, PyAny>, index: &NodeIndex, root: bool) {
        const AHEAD: usize = 3;
        let Some(sl) = self.t.slots else { return };
        let is_node = |p: *mut ffi::PyObject| {
            // SAFETY: `p` is NULL or a live object linked from a live node.
            !p.is_null() && unsafe { ffi::Py_TYPE(p) } as usize == self.t.node
        };
        let mut n = node.as_ptr();
        // SAFETY: every pointer dereferenced here is an exact `Node` linked from `node` (held),
        // or one of its fields checked to be an exact str, read while no Python code runs; the
        // other field objects are only prefetched.
        unsafe {
            let next = read_slot(n, sl.next);
            if let (true, Some(submods)) = (root, &self.submods) {
                if is_node(next) && read_slot(next, sl.fields[F_OP]) as usize == self.t.call_module
                {
                    let t = read_slot(next, sl.fields[F_TARGET]);
                    if !t.is_null() && ffi::PyUnicode_CheckExact(t) != 0 {
                        if let Some(text) = ascii_bytes(t) {
                            submods.prefetch(hash_bytes(text));
                        }
                    }
                }
            }
            for _ in 0..AHEAD {
                if !is_node(n) {
                    return;
                }
                n = read_slot(n, sl.next);
            }
            if !is_node(n) {
                return;
            }
            for f in [F_NAME, F_TARGET, F_ARGS, F_KWARGS] {
                prefetch(read_slot(n, sl.fields[f]));
            }
            prefetch(read_slot(n, sl.next));
            index.prefetch(n as usize);
        }
    }

    /// The fields of a node ([`FIELD_NAMES`]), borrowed: its member slots when it is exactly
    /// `torch.fx.Node`, else `getattr` results (owned, kept in `keep`).
    #[inline(always)]
    fn fields(
        &self,
        node: &Bound<'py, PyAny>,
        keep: &mut Vec<Bound<'py, PyAny>>,
    ) -> PyResult<[*mut ffi::PyObject; 5]> {
        if let Some(sl) = self.t.slots {
            if type_ptr(node) == self.t.node {
                // SAFETY: the node's type is exactly torch.fx.Node, whose slots `Slots::load`
                // checked; the pointers are borrowed from the node.
                let f = sl.fields.map(|o| unsafe { read_slot(node.as_ptr(), o) });
                if f.iter().all(|p| !p.is_null()) {
                    return Ok(f);
                }
            }
        }
        Self::fields_by_name(node, keep)
    }

    /// [`Extractor::fields`] through `getattr`.
    #[inline(never)]
    fn fields_by_name(
        node: &Bound<'py, PyAny>,
        keep: &mut Vec<Bound<'py, PyAny>>,
    ) -> PyResult<[*mut ffi::PyObject; 5]> {
        keep.clear();
        let mut out = [std::ptr::null_mut(); 5];
        for (o, name) in out.iter_mut().zip(FIELD_NAMES) {
            let v = node.getattr(name)?;
            *o = v.as_ptr();
            keep.push(v);
        }
        Ok(out)
    }

    /// The text of a str object; compact ASCII strings (nearly every fx name) are read in place.
    ///
    /// # Safety
    /// `obj` must be a live object, kept alive for the returned lifetime.
    unsafe fn text_of<'s>(&self, obj: *mut ffi::PyObject) -> PyResult<&'s str> {
        if ffi::PyUnicode_Check(obj) == 0 {
            return Err(Error::Invalid("not a str".into()).into());
        }
        if let Some(text) = ascii_bytes(obj) {
            return Ok(std::str::from_utf8_unchecked(text));
        }
        // Other strings: CPython's cached UTF-8 form (fails for lone surrogates).
        let mut len: ffi::Py_ssize_t = 0;
        let data = ffi::PyUnicode_AsUTF8AndSize(obj, &mut len);
        if data.is_null() {
            return Err(PyErr::fetch(self.py));
        }
        Ok(std::str::from_utf8_unchecked(std::slice::from_raw_parts(
            data as *const u8,
            len as usize,
        )))
    }

    /// A node's kwargs, `n` of them: `key, value` pairs into the slots of [`Program::args`]
    /// reserved from `start` on.
    ///
    /// # Safety
    /// `kw` must be a live dict (or subclass) of `n` items that no Python code mutates during
    /// the call.
    unsafe fn kwargs(
        &mut self,
        kw: *mut ffi::PyObject,
        start: usize,
        n: usize,
        ctx: &NodeCtx<'_, 'py>,
    ) -> PyResult<()> {
        let (mut pos, mut key, mut value) = (0, std::ptr::null_mut(), std::ptr::null_mut());
        let mut k = 0;
        while k < n && ffi::PyDict_Next(kw, &mut pos, &mut key, &mut value) != 0 {
            // Keys are mostly the same interned str objects: store each text once.
            let key_slot = match self.key_spans.get(&(key as usize)) {
                Some(&(slot, _)) => slot,
                None if ffi::PyUnicode_Check(key) == 0 => {
                    return Err(node_error(
                        ctx.node,
                        "a keyword argument's key is not a str",
                    ))
                }
                None => {
                    let owned = Bound::from_borrowed_ptr(self.py, key);
                    match self.text_of(key) {
                        Ok(text) => {
                            let s = self.prog.push_str(text);
                            let slot = self.prog.pack(Arg::Str(s));
                            self.key_spans.insert(key as usize, (slot, owned));
                            slot
                        }
                        // A key text cannot hold (lone surrogate) is passed as a pooled str.
                        Err(_) => self.prog.pack(Arg::Const(self.pool.intern(&owned))),
                    }
                }
            };
            let v = self.value(value, ctx, 0)?;
            self.prog.args[start + 2 * k] = key_slot;
            self.prog.args[start + 2 * k + 1] = v;
            k += 1;
        }
        Ok(())
    }

    /// The child module at dotted path `path` of `gm`: `gm._modules[path]` for a plain name
    /// (the entry after the last one found, else looked up with the node's own target string),
    /// else a walk through `_modules` dicts; `get_submodule` is the fallback for modules that
    /// keep children elsewhere.
    fn child(
        &self,
        gm: &Bound<'py, PyAny>,
        children: &Children<'_, 'py>,
        key: &Bound<'py, PyAny>,
        path: &str,
    ) -> Option<Bound<'py, PyAny>> {
        let lookup = |m: &Bound<'py, PyAny>, part: &str| -> Option<Bound<'py, PyAny>> {
            let d = m.getattr(intern!(self.py, "_modules")).ok()?;
            d.cast_into::<PyDict>().ok()?.get_item(part).ok().flatten()
        };
        let found = if !path.contains('.') {
            // SAFETY: `key` is held.
            let next = unsafe { children.next_if(self.py, key.as_ptr(), path) };
            next.or_else(|| {
                let d = children.dict?;
                // SAFETY: a borrowed lookup (the dict holds the value), taken as owned at once.
                let v = unsafe { ffi::PyDict_GetItemWithError(d.as_ptr(), key.as_ptr()) };
                if v.is_null() {
                    PyErr::take(self.py); // a lookup error falls back to get_submodule
                    return None;
                }
                // SAFETY: `v` is a live object held by the dict.
                Some(unsafe { Bound::from_borrowed_ptr(self.py, v) })
            })
        } else {
            path.split('.')
                .try_fold(gm.clone(), |m, part| lookup(&m, part))
        };
        match found {
            Some(c) if !c.is_none() => Some(c),
            _ => gm
                .call_method1(intern!(self.py, "get_submodule"), (path,))
                .ok(),
        }
    }

    /// The submodule already registered under `qual` (hash `h`), making the table of names
    /// first if there is none yet.
    fn find_submod(&mut self, h: u64, qual: &str) -> Option<u32> {
        let p = &self.prog;
        let table = self.submods.get_or_insert_with(|| {
            let n = p.submods.len();
            let mut t = Table::with_capacity(2 * n + 64);
            for i in 0..n as u32 {
                t.insert(hash_bytes(p.submod_name(i).as_bytes()), i);
            }
            t
        });
        table.find(h, |i| p.submod_name(i) == qual)
    }

    /// The op of a node: a pointer compare against the interned op names fx uses, else text.
    ///
    /// # Safety
    /// `op` must be a live object.
    unsafe fn op(&self, op: *mut ffi::PyObject, node: &Bound<'py, PyAny>) -> PyResult<Op> {
        if let Some((_, o)) = self.t.ops.iter().find(|(p, _)| *p == op as usize) {
            return Ok(*o);
        }
        let text = self
            .text_of(op)
            .map_err(|_| node_error(node, "op is not a str"))?;
        match OPS.iter().find(|(s, _)| *s == text) {
            Some((_, o)) => Ok(*o),
            None => Err(node_error(node, format!("unknown op {text:?}"))),
        }
    }

    /// The target of a node. May run Python code (the resolver, `get_attr` chains, reading a
    /// child graph), so every pointer read from the node before this call is dead after it.
    /// `node_name` is the span of the node's name, pushed just before.
    ///
    /// # Safety
    /// `t` must be borrowed from `node` (held by the caller).
    #[allow(clippy::too_many_arguments)]
    unsafe fn target(
        &mut self,
        op: Op,
        t: *mut ffi::PyObject,
        gm: &Bound<'py, PyAny>,
        prefix: &str,
        children: &Children<'_, 'py>,
        node: &Bound<'py, PyAny>,
        node_name: Span,
        depth: usize,
    ) -> PyResult<Target> {
        let text = |t: *mut ffi::PyObject| {
            self.text_of(t)
                .map_err(|_| node_error(node, "the target is not a str"))
        };
        Ok(match op {
            Op::Placeholder => Target::Param(self.prog.push_str(text(t)?)),
            Op::Output => Target::None,
            Op::CallMethod => Target::Method(self.prog.push_str(text(t)?)),
            Op::GetAttr => {
                let path = Bound::from_borrowed_ptr(self.py, t);
                let path = path
                    .cast::<PyString>()
                    .map_err(|_| node_error(node, "the target is not a str"))?;
                let path = path.to_str()?;
                let mut obj = gm.clone();
                for part in path.split('.') {
                    obj = obj.getattr(part).map_err(|_| {
                        node_error(node, format!("get_attr target {path:?} does not exist"))
                    })?;
                }
                Target::Const(self.pool.intern(&obj))
            }
            Op::CallModule => {
                let local = text(t)?;
                let qual_buf;
                let qual: &str = if prefix.is_empty() {
                    local
                } else {
                    qual_buf = format!("{prefix}{local}");
                    &qual_buf
                };
                // Python code may run from here on: hold the target (`local` is its text).
                let t = Bound::from_borrowed_ptr(self.py, t);
                // A child that comes as the next entry of `_modules` is new unless a name has
                // come another way (the table then exists and is asked first).
                let next = match &self.submods {
                    None if !local.contains('.') => children.next_if(self.py, t.as_ptr(), local),
                    _ => None,
                };
                // The name's hash, once there is a table to hold it.
                let (child, h) = match next.filter(|c| !c.is_none()) {
                    Some(child) => (child, None),
                    None => {
                        let h = hash_bytes(qual.as_bytes());
                        if let Some(i) = self.find_submod(h, qual) {
                            return Ok(Target::Submod(i));
                        }
                        let child = self.child(gm, children, &t, local).ok_or_else(|| {
                            node_error(node, format!("missing child: no submodule named {local:?}"))
                        })?;
                        (child, Some(h))
                    }
                };
                let i = self.prog.submods.len() as u32;
                // Split graphs name a call after its child: share the node's text then.
                let name = match self.prog.str(node_name) == qual {
                    true => node_name,
                    false => self.prog.push_str(qual),
                };
                self.prog.submods.push(Submod {
                    name,
                    kind: SubmodKind::Opaque,
                });
                // A root-level child's qualified name is its target's text: return that object.
                let same = prefix.is_empty() && t.is_exact_instance_of::<PyString>();
                self.submod_names.push(same.then(|| t.clone()));
                if let (Some(table), Some(h)) = (&mut self.submods, h) {
                    table.insert(h, i);
                }
                let ty = type_ptr(&child);
                let inline = match self.inline_types.get(&ty) {
                    Some(&b) => b,
                    None => {
                        let b = child.is_instance(self.t.graph_module.bind(self.py))?;
                        self.inline_types.insert(ty, b);
                        b
                    }
                };
                if inline && self.writing_root {
                    self.abandoned = true;
                    return Err(node_error(
                        node,
                        "an inlined child of a root written in batches",
                    ));
                }
                if inline {
                    let qual = format!("{}.", self.prog.str(name));
                    let g = self.graph(&child, &qual, depth + 1)?;
                    self.prog.submods[i as usize].kind = SubmodKind::Inline(g);
                }
                Target::Submod(i)
            }
            Op::CallFunction => {
                let id = t as usize;
                if let Some((known, _)) = self.targets.get(&id) {
                    return Ok(*known);
                }
                // The map holds the target so its id cannot be reused while this pass runs.
                let t = Bound::from_borrowed_ptr(self.py, t);
                let resolved = if id == self.t.getitem {
                    Target::Getitem
                } else {
                    let name = match ANSWERS.get(&self.resolver, &t) {
                        Some(name) => Some(name),
                        None => {
                            let name = self.resolver.call1((&t,))?;
                            let name = match name.cast::<PyString>() {
                                Ok(s) => Some(s.to_str()?.to_string())
                                    .filter(|s| names::check_untrusted_call_name(s).is_ok()),
                                Err(_) => None,
                            };
                            if let Some(name) = &name {
                                ANSWERS.put(&self.resolver, &t, name);
                            }
                            name
                        }
                    };
                    match name {
                        Some(name) => Target::Name(self.prog.push_str(&name)),
                        None => Target::Const(self.pool.intern(&t)),
                    }
                };
                self.targets.insert(id, (resolved, t));
                resolved
            }
        })
    }

    /// The argument values [`Extractor::value`] leaves (out of line), packed: every kind but
    /// floats, ints within i64 and nodes already read, which it settles first.
    ///
    /// # Safety
    /// `a` must be a live object that no Python code frees during the call; this function
    /// calls no Python code itself (only C functions of exact builtin and torch types).
    #[inline(never)]
    unsafe fn arg(
        &mut self,
        a: *mut ffi::PyObject,
        ctx: &NodeCtx<'_, 'py>,
        depth: usize,
    ) -> PyResult<Slot> {
        // Packed here, where each kind is known: an `Arg` returned through memory and packed
        // by the caller stalled on store forwarding (stitch 1k: 155 to 187 ns/node).
        let v = self.unpacked_arg(a, ctx, depth)?;
        Ok(self.prog.pack(v))
    }

    /// [`Extractor::arg`] before packing.
    ///
    /// # Safety
    /// As for [`Extractor::arg`].
    #[inline(always)]
    unsafe fn unpacked_arg(
        &mut self,
        a: *mut ffi::PyObject,
        ctx: &NodeCtx<'_, 'py>,
        depth: usize,
    ) -> PyResult<Arg> {
        if depth > MAX_DEPTH {
            return Err(node_error(
                ctx.node,
                "arguments nest too deeply (or contain themselves)",
            ));
        }
        let ty = ffi::Py_TYPE(a);
        let tyu = ty as usize;
        if tyu == self.t.node {
            return self.node_ref(a, ctx);
        }
        if a == ffi::Py_None() {
            return Ok(Arg::None);
        }
        if ty == &raw mut ffi::PyBool_Type {
            return Ok(Arg::Bool(a == ffi::Py_True()));
        }
        if ty == &raw mut ffi::PyLong_Type {
            // Beyond i64 (`value` took the rest).
            let text = Bound::from_borrowed_ptr(self.py, a).str()?;
            return Ok(Arg::BigInt(self.prog.push_str(text.to_str()?)));
        }
        if ty == &raw mut ffi::PyUnicode_Type {
            return Ok(match self.text_of(a) {
                Ok(text) => Arg::Str(self.prog.push_str(text)),
                // Lone surrogates cannot be UTF-8: keep the object itself.
                Err(_) => Arg::Const(self.pool.intern(&Bound::from_borrowed_ptr(self.py, a))),
            });
        }
        if ty == &raw mut ffi::PyBytes_Type {
            let b = Borrowed::from_ptr(self.py, a).cast_unchecked::<PyBytes>();
            return Ok(Arg::Bytes(self.prog.push_bytes(b.as_bytes())));
        }
        if ty == &raw mut ffi::PyTuple_Type {
            let n = ffi::PyTuple_GET_SIZE(a);
            let span = self.items(n, |k| ffi::PyTuple_GET_ITEM(a, k), ctx, depth + 1)?;
            return Ok(Arg::Tuple(span));
        }
        if ty == &raw mut ffi::PyList_Type || tyu == self.t.ilist {
            let n = ffi::PyList_GET_SIZE(a);
            let span = self.items(n, |k| ffi::PyList_GET_ITEM(a, k), ctx, depth + 1)?;
            return Ok(Arg::List(span));
        }
        if ty == &raw mut ffi::PyDict_Type || tyu == self.t.idict {
            let n = ffi::PyDict_Size(a) as usize;
            let span = self.prog.reserve_args(2 * n);
            let (mut pos, mut key, mut value) = (0, std::ptr::null_mut(), std::ptr::null_mut());
            let mut k = 0;
            while k < n && ffi::PyDict_Next(a, &mut pos, &mut key, &mut value) != 0 {
                let kv = self.value(key, ctx, depth + 1)?;
                let vv = self.value(value, ctx, depth + 1)?;
                self.prog.args[span.start as usize + 2 * k] = kv;
                self.prog.args[span.start as usize + 2 * k + 1] = vv;
                k += 1;
            }
            return Ok(Arg::Dict(span));
        }
        let owned = Bound::from_borrowed_ptr(self.py, a);
        if tyu == self.t.device {
            return Ok(Arg::Const(
                self.pool.intern_device(&owned, self.t.device_at)?,
            ));
        }
        // A subclass of Node (a type check in C: no `__class__` lookup, no Python code).
        if ffi::PyType_IsSubtype(ty, self.t.node as *mut ffi::PyTypeObject) != 0 {
            return self.node_ref(a, ctx);
        }
        Ok(Arg::Const(self.pool.intern(&owned)))
    }

    /// The `n` items `item(0..n)` of a sequence, as consecutive argument slots.
    ///
    /// # Safety
    /// As for [`Extractor::arg`], for every item.
    unsafe fn items(
        &mut self,
        n: ffi::Py_ssize_t,
        item: impl Fn(ffi::Py_ssize_t) -> *mut ffi::PyObject,
        ctx: &NodeCtx<'_, 'py>,
        depth: usize,
    ) -> PyResult<Span> {
        let span = self.prog.reserve_args(n as usize);
        self.fill(span, item, ctx, depth)?;
        Ok(span)
    }

    /// Fills the reserved slots of `span` with `item(0)`, `item(1)`, ...
    ///
    /// # Safety
    /// As for [`Extractor::items`].
    #[inline(always)]
    unsafe fn fill(
        &mut self,
        span: Span,
        item: impl Fn(ffi::Py_ssize_t) -> *mut ffi::PyObject,
        ctx: &NodeCtx<'_, 'py>,
        depth: usize,
    ) -> PyResult<()> {
        for k in 0..span.len as usize {
            let v = self.value(item(k as ffi::Py_ssize_t), ctx, depth)?;
            self.prog.args[span.start as usize + k] = v;
        }
        Ok(())
    }

    /// One argument value. The common kinds (a node read before, a float, an int) are settled
    /// here, inline in the caller; the rest go through [`Extractor::arg`].
    ///
    /// # Safety
    /// As for [`Extractor::arg`].
    #[inline(always)]
    unsafe fn value(
        &mut self,
        a: *mut ffi::PyObject,
        ctx: &NodeCtx<'_, 'py>,
        depth: usize,
    ) -> PyResult<Slot> {
        if depth <= MAX_DEPTH {
            let ty = ffi::Py_TYPE(a);
            if ty as usize == self.t.node {
                if let Some(i) = ctx.index.get(a as usize) {
                    self.refs.push(i);
                    return Ok(self.prog.pack(Arg::Node(i)));
                }
            } else if ty == &raw mut ffi::PyFloat_Type {
                return Ok(self.prog.pack(Arg::Float(ffi::PyFloat_AS_DOUBLE(a))));
            } else if ty == &raw mut ffi::PyLong_Type {
                let mut overflow = 0;
                let v = ffi::PyLong_AsLongAndOverflow(a, &mut overflow);
                if overflow == 0 {
                    return Ok(self.prog.pack(Arg::Int(v)));
                }
            }
        }
        self.arg(a, ctx, depth)
    }

    /// # Safety
    /// `a` must be a live object.
    unsafe fn node_ref(&mut self, a: *mut ffi::PyObject, ctx: &NodeCtx<'_, 'py>) -> PyResult<Arg> {
        if let Some(i) = ctx.index.get(a as usize) {
            self.refs.push(i);
            return Ok(Arg::Node(i));
        }
        let a = Bound::from_borrowed_ptr(self.py, a);
        if let Some(loose) = &mut self.loose {
            loose.push(a);
            return Ok(Arg::Node(loose.len() as u32 - 1));
        }
        let name = a
            .getattr(intern!(self.py, "name"))
            .and_then(|n| n.str().map(|s| s.to_string()))
            .unwrap_or_else(|_| "?".into());
        Err(node_error(
            ctx.node,
            format!("argument {name:?} is not a node defined earlier in this graph"),
        ))
    }

    /// Extracts one loose value (vLLM's `_node_ref`): nodes are named, not resolved.
    pub fn loose_arg(&mut self, a: &Bound<'py, PyAny>) -> PyResult<Arg> {
        self.loose = Some(Vec::new());
        let index = NodeIndex::with_capacity(0);
        let ctx = NodeCtx {
            index: &index,
            node: a,
        };
        // SAFETY: `a` is held by the caller; no Python code runs during the walk.
        let v = unsafe { self.value(a.as_ptr(), &ctx, 0)? };
        self.prog.n_consts = self.pool.objects.len() as u32;
        Ok(self.prog.unpack(v))
    }
}
