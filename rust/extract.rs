//! Reads torch.fx objects into the IR: the only module that touches Python objects, besides
//! the thin function layer in `lib.rs`. One pass per graph; nodes are matched by identity.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple, PyType};
use pyo3::{ffi, intern};
use rustc_hash::FxHashMap;

use crate::error::Error;
use crate::ir::{Arg, Graph, Node, Op, Program, Span, Submod, SubmodKind, Target, MAX_DEPTH};
use crate::names;

static NODE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static IMMUTABLE_LIST: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static IMMUTABLE_DICT: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static GRAPH_MODULE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static DEVICE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static GETITEM: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

fn hash_str(s: &str) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = rustc_hash::FxBuildHasher.build_hasher();
    h.write(s.as_bytes());
    h.finish()
}

fn type_ptr(obj: &Bound<'_, PyAny>) -> usize {
    // SAFETY: `obj` is a live object; reading its type pointer takes no reference.
    unsafe { ffi::Py_TYPE(obj.as_ptr()) as usize }
}

/// Byte offsets of `torch.fx.Node`'s C member slots, read directly instead of through
/// `getattr` when a node's type is exactly `Node` and the members are plain object slots.
#[derive(Clone, Copy)]
struct Slots {
    op: isize,
    name: isize,
    target: isize,
    args: isize,
    kwargs: isize,
}

impl Slots {
    fn load(py: Python<'_>, node_type: &Bound<'_, PyType>) -> Option<Slots> {
        let base = py.import("torch._C").ok()?.getattr("_NodeBase").ok()?;
        let member_type = py
            .import("types")
            .ok()?
            .getattr("MemberDescriptorType")
            .ok()?;
        let offset = |name: &str| -> Option<isize> {
            let d = base.getattr("__dict__").ok()?.get_item(name).ok()?;
            // The descriptor `Node` resolves must be this very member of the C base.
            if !d.get_type().is(&member_type) || !node_type.getattr(name).ok()?.is(&d) {
                return None;
            }
            // SAFETY: `d` is a live member_descriptor, whose C layout is PyMemberDescrObject.
            unsafe {
                let descr = d.as_ptr() as *const ffi::PyMemberDescrObject;
                let member = (*descr).d_member;
                if member.is_null() {
                    return None;
                }
                match (*member).type_code {
                    ffi::Py_T_OBJECT_EX => Some((*member).offset),
                    _ => None,
                }
            }
        };
        Some(Slots {
            op: offset("op")?,
            name: offset("name")?,
            target: offset("target")?,
            args: offset("_args")?,
            kwargs: offset("_kwargs")?,
        })
    }
}

/// Reads an object slot of `obj` at `offset` (None when unset, as getattr would raise).
///
/// # Safety
/// `obj` must be an instance of the type whose member slot lives at `offset`, holding an
/// object pointer or NULL (checked by [`Slots::load`] and the caller's exact type check).
unsafe fn read_slot<'py>(obj: &Bound<'py, PyAny>, offset: isize) -> Option<Bound<'py, PyAny>> {
    let p = *((obj.as_ptr() as *const u8).offset(offset) as *const *mut ffi::PyObject);
    Bound::from_borrowed_ptr_or_opt(obj.py(), p)
}

struct Types<'py> {
    slots: Option<Slots>,
    node: usize,
    ilist: usize,
    idict: usize,
    device: usize,
    node_type: Bound<'py, PyType>,
    graph_module: Bound<'py, PyType>,
    getitem: usize,
}

impl<'py> Types<'py> {
    fn load(py: Python<'py>) -> PyResult<Self> {
        let node_type = NODE.import(py, "torch.fx", "Node")?.clone();
        let ilist =
            IMMUTABLE_LIST.import(py, "torch.fx.immutable_collections", "immutable_list")?;
        let idict =
            IMMUTABLE_DICT.import(py, "torch.fx.immutable_collections", "immutable_dict")?;
        let device = DEVICE.import(py, "torch", "device")?;
        let graph_module = GRAPH_MODULE.import(py, "torch.fx", "GraphModule")?.clone();
        let getitem = GETITEM
            .get_or_try_init(py, || -> PyResult<Py<PyAny>> {
                Ok(py.import("operator")?.getattr("getitem")?.unbind())
            })?
            .bind(py);
        Ok(Types {
            slots: Slots::load(py, &node_type),
            node: node_type.as_ptr() as usize,
            ilist: ilist.as_ptr() as usize,
            idict: idict.as_ptr() as usize,
            device: device.as_ptr() as usize,
            node_type,
            graph_module,
            getitem: getitem.as_ptr() as usize,
        })
    }
}

/// The constant pool being built: slots in order of first appearance, interned by identity and,
/// for `torch.device` (the immutable torch type that is not a singleton), by value.
pub struct Pool<'py> {
    pub objects: Vec<Bound<'py, PyAny>>,
    by_id: FxHashMap<usize, u32>,
    devices: FxHashMap<isize, Vec<u32>>,
    /// Slots that existed before this pass (an external vLLM-style pool).
    pub preexisting: usize,
}

impl<'py> Pool<'py> {
    pub fn new() -> Self {
        Pool {
            objects: Vec::new(),
            by_id: FxHashMap::default(),
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

    fn intern_device(&mut self, obj: &Bound<'py, PyAny>) -> PyResult<u32> {
        let id = obj.as_ptr() as usize;
        if let Some(&k) = self.by_id.get(&id) {
            return Ok(k);
        }
        // torch.device hashes and compares in C: no string is built per device.
        let h = obj.hash()?;
        if let Some(slots) = self.devices.get(&h) {
            for &k in slots {
                if self.objects[k as usize].eq(obj)? {
                    self.by_id.insert(id, k);
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

/// Walks graph modules into a [`Program`].
pub struct Extractor<'py> {
    py: Python<'py>,
    pub prog: Program,
    pub pool: Pool<'py>,
    t: Types<'py>,
    resolver: Bound<'py, PyAny>,
    targets: FxHashMap<usize, Target>,
    /// Hash of a qualified child name -> its submodule index (names compared on hit).
    submods: FxHashMap<u64, u32>,
    /// Text spans of keyword keys by str object (kept alive by the graph).
    key_spans: FxHashMap<usize, Span>,
    /// Whether a child of this type is a plain GraphModule (inlined), by type pointer.
    inline_types: FxHashMap<usize, bool>,
    /// For `_node_ref`: nodes met outside any graph, named by their own names.
    pub loose: Option<Vec<String>>,
}

struct NodeCtx<'a, 'py> {
    index: &'a FxHashMap<usize, u32>,
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
            t: Types::load(py)?,
            resolver,
            targets: FxHashMap::default(),
            submods: FxHashMap::default(),
            key_spans: FxHashMap::default(),
            inline_types: FxHashMap::default(),
            loose: None,
        })
    }

    /// Extracts `gm` as the root graph and every plain GraphModule child it calls.
    pub fn run(&mut self, gm: &Bound<'py, PyAny>) -> PyResult<()> {
        self.graph(gm, "", 0)?;
        self.prog.n_consts = self.pool.objects.len() as u32;
        // Arguments are valid by construction (earlier nodes of the same graph, slots of this
        // pool, strings from Python); the per-node rules still need checking.
        for gi in 0..self.prog.graphs.len() as u32 {
            self.prog.check_shapes(gi)?;
        }
        debug_assert!(self.prog.validate().is_ok());
        Ok(())
    }

    fn graph(&mut self, gm: &Bound<'py, PyAny>, prefix: &str, depth: usize) -> PyResult<u32> {
        let py = self.py;
        if depth > MAX_DEPTH {
            return Err(Error::Invalid("graph modules nest too deeply".into()).into());
        }
        let gi = self.prog.graphs.len() as u32;
        self.prog.graphs.push(Graph::default());
        let graph = gm.getattr(intern!(py, "graph"))?;
        let modules = gm
            .getattr(intern!(py, "_modules"))
            .ok()
            .and_then(|d| d.cast_into::<PyDict>().ok());
        let mut index: FxHashMap<usize, u32> = FxHashMap::default();
        let n_nodes = graph.getattr(intern!(py, "nodes"))?.len().unwrap_or(0);
        index.reserve(n_nodes);
        self.prog.args.reserve(n_nodes * 4);
        self.prog.text.reserve(n_nodes * 16);
        let mut nodes: Vec<Node> = Vec::with_capacity(n_nodes);
        for node in graph.getattr(intern!(py, "nodes"))?.try_iter()? {
            let node = node?;
            let fields = match self.t.slots {
                // SAFETY: the node's type is exactly torch.fx.Node, whose slots `Slots::load`
                // checked; a NULL slot falls back to getattr (which raises).
                Some(sl) if type_ptr(&node) == self.t.node => unsafe {
                    (
                        read_slot(&node, sl.op),
                        read_slot(&node, sl.name),
                        read_slot(&node, sl.target),
                        read_slot(&node, sl.args),
                        read_slot(&node, sl.kwargs),
                    )
                },
                _ => (None, None, None, None, None),
            };
            let get = |v: Option<Bound<'py, PyAny>>, attr: &Bound<'py, PyString>| match v {
                Some(v) => Ok(v),
                None => node.getattr(attr),
            };
            let op_obj = get(fields.0, intern!(py, "op"))?;
            let op = self.op(&op_obj, &node)?;
            let name_obj = get(fields.1, intern!(py, "name"))?;
            let name = self.prog.push_str(name_obj.cast::<PyString>()?.to_str()?);
            let target_obj = get(fields.2, intern!(py, "target"))?;
            let target =
                self.target(op, &target_obj, gm, prefix, modules.as_ref(), &node, depth)?;
            let args_obj = get(fields.3, intern!(py, "_args"))?;
            let kwargs_obj = get(fields.4, intern!(py, "_kwargs"))?;
            let ctx = NodeCtx {
                index: &index,
                node: &node,
            };
            let args_t = args_obj.cast::<PyTuple>()?;
            let args = self.prog.reserve_args(args_t.len());
            for (k, a) in args_t.iter().enumerate() {
                let v = self.arg(&a, &ctx, 0)?;
                self.prog.args[args.start as usize + k] = v;
            }
            let kw = kwargs_obj.cast::<PyDict>()?;
            let kwargs = self.prog.reserve_args(2 * kw.len());
            for (k, (key, v)) in kw.iter().enumerate() {
                let key = match key.cast::<PyString>() {
                    // Keys are mostly the same interned str objects: store each text once.
                    Ok(s) => match self.key_spans.get(&(s.as_ptr() as usize)) {
                        Some(&span) => Arg::Str(span),
                        None => match s.to_str() {
                            Ok(text) => {
                                let span = self.prog.push_str(text);
                                self.key_spans.insert(s.as_ptr() as usize, span);
                                Arg::Str(span)
                            }
                            // A key text cannot hold (lone surrogate) is passed as a pooled str.
                            Err(_) => Arg::Const(self.pool.intern(&key)),
                        },
                    },
                    Err(_) => {
                        return Err(node_error(&node, "a keyword argument's key is not a str"))
                    }
                };
                let v = self.arg(&v, &ctx, 0)?;
                self.prog.args[kwargs.start as usize + 2 * k] = key;
                self.prog.args[kwargs.start as usize + 2 * k + 1] = v;
            }
            index.insert(node.as_ptr() as usize, nodes.len() as u32);
            nodes.push(Node {
                op,
                name,
                target,
                args,
                kwargs,
            });
        }
        self.prog.graphs[gi as usize] = Graph { nodes };
        Ok(gi)
    }

    /// The child module at dotted path `path` of `gm`: `gm._modules[path]` for a plain name
    /// (looked up with the node's own target string), else a walk through `_modules` dicts;
    /// `get_submodule` is the fallback for modules that keep children elsewhere.
    fn child(
        &self,
        gm: &Bound<'py, PyAny>,
        modules: Option<&Bound<'py, PyDict>>,
        key: &Bound<'py, PyAny>,
        path: &str,
    ) -> Option<Bound<'py, PyAny>> {
        let lookup = |m: &Bound<'py, PyAny>, part: &str| -> Option<Bound<'py, PyAny>> {
            let d = m.getattr(intern!(self.py, "_modules")).ok()?;
            d.cast_into::<PyDict>().ok()?.get_item(part).ok().flatten()
        };
        let found = if !path.contains('.') {
            modules.and_then(|d| d.get_item(key).ok().flatten())
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

    /// The submodule already registered under `qual` (hash `h`).
    fn find_submod(&self, h: u64, qual: &str) -> Option<u32> {
        let i = *self.submods.get(&h)?;
        if self.prog.submod_name(i) == qual {
            return Some(i);
        }
        // A true 64-bit hash collision: fall back to a scan.
        (0..self.prog.submods.len() as u32).find(|&k| self.prog.submod_name(k) == qual)
    }

    /// The op of a node: a pointer compare against the interned op names fx uses, else text.
    fn op(&self, op: &Bound<'py, PyAny>, node: &Bound<'py, PyAny>) -> PyResult<Op> {
        let py = self.py;
        let known = [
            (intern!(py, "call_function"), Op::CallFunction),
            (intern!(py, "call_module"), Op::CallModule),
            (intern!(py, "placeholder"), Op::Placeholder),
            (intern!(py, "call_method"), Op::CallMethod),
            (intern!(py, "get_attr"), Op::GetAttr),
            (intern!(py, "output"), Op::Output),
        ];
        if let Some((_, o)) = known.iter().find(|(s, _)| s.is(op)) {
            return Ok(*o);
        }
        let text = op.cast::<PyString>()?.to_str()?;
        match known.iter().find(|(s, _)| s.to_str().ok() == Some(text)) {
            Some((_, o)) => Ok(*o),
            None => Err(node_error(node, format!("unknown op {text:?}"))),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn target(
        &mut self,
        op: Op,
        t: &Bound<'py, PyAny>,
        gm: &Bound<'py, PyAny>,
        prefix: &str,
        modules: Option<&Bound<'py, PyDict>>,
        node: &Bound<'py, PyAny>,
        depth: usize,
    ) -> PyResult<Target> {
        let text = |t: &Bound<'py, PyAny>| -> PyResult<Bound<'py, PyString>> {
            match t.cast::<PyString>() {
                Ok(s) => Ok(s.clone()),
                Err(_) => Err(node_error(node, "the target is not a str")),
            }
        };
        Ok(match op {
            Op::Placeholder => Target::Param(self.prog.push_str(text(t)?.to_str()?)),
            Op::Output => Target::None,
            Op::CallMethod => Target::Method(self.prog.push_str(text(t)?.to_str()?)),
            Op::GetAttr => {
                let path = text(t)?;
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
                let local_s = text(t)?;
                let local = local_s.to_str()?;
                let qual_buf;
                let qual: &str = if prefix.is_empty() {
                    local
                } else {
                    qual_buf = format!("{prefix}{local}");
                    &qual_buf
                };
                let h = hash_str(qual);
                if let Some(i) = self.find_submod(h, qual) {
                    return Ok(Target::Submod(i));
                }
                let child = self.child(gm, modules, t, local).ok_or_else(|| {
                    node_error(node, format!("missing child: no submodule named {local:?}"))
                })?;
                let i = self.prog.submods.len() as u32;
                let name = self.prog.push_str(qual);
                self.prog.submods.push(Submod {
                    name,
                    kind: SubmodKind::Opaque,
                });
                self.submods.entry(h).or_insert(i);
                let ty = type_ptr(&child);
                let inline = match self.inline_types.get(&ty) {
                    Some(&b) => b,
                    None => {
                        let b = child.is_instance(&self.t.graph_module)?;
                        self.inline_types.insert(ty, b);
                        b
                    }
                };
                if inline {
                    let g = self.graph(&child, &format!("{qual}."), depth + 1)?;
                    self.prog.submods[i as usize].kind = SubmodKind::Inline(g);
                }
                Target::Submod(i)
            }
            Op::CallFunction => {
                let id = t.as_ptr() as usize;
                if let Some(&known) = self.targets.get(&id) {
                    return Ok(known);
                }
                let resolved = if id == self.t.getitem {
                    Target::Getitem
                } else {
                    let name = self.resolver.call1((t,))?;
                    match name.cast::<PyString>() {
                        Ok(s) if names::check_untrusted_call_name(s.to_str()?).is_ok() => {
                            Target::Name(self.prog.push_str(s.to_str()?))
                        }
                        _ => Target::Const(self.pool.intern(t)),
                    }
                };
                self.targets.insert(id, resolved);
                resolved
            }
        })
    }

    fn arg(
        &mut self,
        a: &Bound<'py, PyAny>,
        ctx: &NodeCtx<'_, 'py>,
        depth: usize,
    ) -> PyResult<Arg> {
        if depth > MAX_DEPTH {
            return Err(node_error(
                ctx.node,
                "arguments nest too deeply (or contain themselves)",
            ));
        }
        let ty = type_ptr(a);
        if ty == self.t.node {
            return self.node_ref(a, ctx);
        }
        if a.is_none() {
            return Ok(Arg::None);
        }
        if a.is_exact_instance_of::<PyBool>() {
            return Ok(Arg::Bool(a.is_truthy()?));
        }
        if a.is_exact_instance_of::<PyInt>() {
            return Ok(match a.extract::<i64>() {
                Ok(v) => Arg::Int(v),
                Err(_) => Arg::BigInt(self.prog.push_str(a.str()?.to_str()?)),
            });
        }
        if a.is_exact_instance_of::<PyFloat>() {
            return Ok(Arg::Float(a.extract::<f64>()?));
        }
        if let Ok(s) = a.cast_exact::<PyString>() {
            return Ok(match s.to_str() {
                Ok(text) => Arg::Str(self.prog.push_str(text)),
                // Lone surrogates cannot be UTF-8: keep the object itself.
                Err(_) => Arg::Const(self.pool.intern(a)),
            });
        }
        if let Ok(b) = a.cast_exact::<PyBytes>() {
            return Ok(Arg::Bytes(self.prog.push_bytes(b.as_bytes())));
        }
        if let Ok(t) = a.cast_exact::<PyTuple>() {
            let span = self.prog.reserve_args(t.len());
            for (k, item) in t.iter().enumerate() {
                let v = self.arg(&item, ctx, depth + 1)?;
                self.prog.args[span.start as usize + k] = v;
            }
            return Ok(Arg::Tuple(span));
        }
        if a.is_exact_instance_of::<PyList>() || ty == self.t.ilist {
            let l = a.cast::<PyList>()?;
            let span = self.prog.reserve_args(l.len());
            for (k, item) in l.iter().enumerate().take(span.len as usize) {
                let v = self.arg(&item, ctx, depth + 1)?;
                self.prog.args[span.start as usize + k] = v;
            }
            return Ok(Arg::List(span));
        }
        if a.is_exact_instance_of::<PyDict>() || ty == self.t.idict {
            let d = a.cast::<PyDict>()?;
            let span = self.prog.reserve_args(2 * d.len());
            for (k, (key, v)) in d.iter().enumerate().take(span.len as usize / 2) {
                let kv = self.arg(&key, ctx, depth + 1)?;
                let vv = self.arg(&v, ctx, depth + 1)?;
                self.prog.args[span.start as usize + 2 * k] = kv;
                self.prog.args[span.start as usize + 2 * k + 1] = vv;
            }
            return Ok(Arg::Dict(span));
        }
        if ty == self.t.device {
            return Ok(Arg::Const(self.pool.intern_device(a)?));
        }
        if a.is_instance(&self.t.node_type)? {
            return self.node_ref(a, ctx);
        }
        Ok(Arg::Const(self.pool.intern(a)))
    }

    fn node_ref(&mut self, a: &Bound<'py, PyAny>, ctx: &NodeCtx<'_, 'py>) -> PyResult<Arg> {
        if let Some(&i) = ctx.index.get(&(a.as_ptr() as usize)) {
            return Ok(Arg::Node(i));
        }
        if let Some(loose) = &mut self.loose {
            loose.push(a.getattr(intern!(self.py, "name"))?.str()?.to_string());
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
        let index = FxHashMap::default();
        let ctx = NodeCtx {
            index: &index,
            node: a,
        };
        let v = self.arg(a, &ctx, 0)?;
        self.prog.n_consts = self.pool.objects.len() as u32;
        Ok(v)
    }
}
