//! Reads torch.fx objects into the IR, one pass per graph: the only code that touches Python
//! objects besides the function list in `lib.rs`. Nodes are matched by identity; constants go
//! to a pool, interned by identity (and `torch.device`s by value).

use pyo3::exceptions::PyTypeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple, PyType};
use rustc_hash::FxHashMap;

use crate::error::{Error, Reason};
use crate::ir::{Arg, Graph, Node, Op, Program, Span, Submod, SubmodKind, Target};
use crate::ir::{MAX_DEPTH, MAX_KWARGS};
use crate::pyident;

/// The torch.fx types and objects the reader compares against, loaded once per process.
struct Types {
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
            let ty = |module: &str, name: &str| -> PyResult<Py<PyType>> {
                Ok(py
                    .import(module)?
                    .getattr(name)?
                    .cast_into::<PyType>()?
                    .unbind())
            };
            Ok(Types {
                node: ty("torch.fx", "Node")?,
                ilist: ty("torch.fx.immutable_collections", "immutable_list")?,
                idict: ty("torch.fx.immutable_collections", "immutable_dict")?,
                device: ty("torch", "device")?,
                graph_module: ty("torch.fx", "GraphModule")?,
                getitem: py.import("operator")?.getattr("getitem")?.unbind(),
                nodes_property: py
                    .import("torch.fx")?
                    .getattr("Graph")?
                    .getattr("nodes")?
                    .unbind(),
            })
        })
    }
}

/// The constant pool being built: slots in order of first appearance.
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

/// An error naming `node` (read back from the object, so it needs no IR).
fn node_error(node: &Bound<'_, PyAny>, reason: Reason) -> PyErr {
    let field = |name: &str| match node.getattr(name) {
        Ok(v) => v.str().map_or_else(|_| "?".into(), |s| s.to_string()),
        Err(_) => "?".into(),
    };
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
    Links {
        node_type: Bound<'py, PyType>,
        root: Bound<'py, PyAny>,
        /// The node returned last (the root before the first).
        at: Bound<'py, PyAny>,
        /// Links left to follow before the list counts as broken.
        left: usize,
    },
}

impl<'py> Iterator for Nodes<'py> {
    type Item = PyResult<Bound<'py, PyAny>>;

    fn next(&mut self) -> Option<Self::Item> {
        let (node_type, root, at, left) = match self {
            Nodes::Iter(it) => return it.next(),
            Nodes::Links {
                node_type,
                root,
                at,
                left,
            } => (node_type, root, at, left),
        };
        let py = root.py();
        loop {
            let next = match at.getattr(intern!(py, "_next")) {
                Ok(next) => next,
                Err(e) => return Some(Err(e)),
            };
            if next.is(&*root) {
                return None;
            }
            let node = match next.is_instance(node_type) {
                Ok(true) if *left > 0 => next,
                Ok(_) => return Some(Err(Error::Invalid(Reason::BrokenNodeList).into())),
                Err(e) => return Some(Err(e)),
            };
            *left -= 1;
            *at = node.clone();
            // A node erased while still linked (as while fx changes a graph) is skipped.
            match node
                .getattr(intern!(py, "_erased"))
                .and_then(|e| e.is_truthy())
            {
                Ok(false) => return Some(Ok(node)),
                Ok(true) => continue,
                Err(e) => return Some(Err(e)),
            }
        }
    }
}

/// The node being read and the nodes before it.
struct Ctx<'a, 'py> {
    node: &'a Bound<'py, PyAny>,
    /// Node object address -> index in its graph (the graph holds the nodes meanwhile).
    index: &'a FxHashMap<usize, u32>,
}

/// Walks graph modules into a [`Program`].
pub struct Reader<'py> {
    py: Python<'py>,
    t: &'static Types,
    resolver: Bound<'py, PyAny>,
    pub prog: Program,
    pub pool: Pool<'py>,
    /// Resolved call_function targets by object (held, so no id is reused meanwhile).
    targets: FxHashMap<usize, (Target, Bound<'py, PyAny>)>,
    /// Keyword keys by str object (held).
    keys: FxHashMap<usize, (Arg, Bound<'py, PyAny>)>,
    /// Submodules by qualified name.
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
    /// For `_node_ref`: nodes met outside any graph, in order.
    pub loose: Option<Vec<Bound<'py, PyAny>>>,
}

impl<'py> Reader<'py> {
    pub fn new(py: Python<'py>, resolver: Bound<'py, PyAny>, pool: Pool<'py>) -> PyResult<Self> {
        Ok(Reader {
            py,
            t: Types::get(py)?,
            resolver,
            prog: Program::default(),
            pool,
            targets: FxHashMap::default(),
            keys: FxHashMap::default(),
            submods: FxHashMap::default(),
            child_types: FxHashMap::default(),
            inlined: FxHashMap::default(),
            submod_names: Vec::new(),
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
        let mut index: FxHashMap<usize, u32> = FxHashMap::default();
        index.reserve(n);
        self.prog.args.reserve(4 * n);
        self.prog.text.reserve(16 * n);
        self.submods.reserve(n / 2);
        for node in list {
            let node = &node?;
            let ctx = Ctx {
                node,
                index: &index,
            };
            // The fields first, then their contents: their loads overlap.
            let op_obj = node.getattr(intern!(py, "op"))?;
            let name_obj = node.getattr(intern!(py, "name"))?;
            let target_obj = node.getattr(intern!(py, "target"))?;
            let args_obj = node.getattr(intern!(py, "_args"))?;
            let kwargs_obj = node.getattr(intern!(py, "_kwargs"))?;
            let op = match op_obj.cast::<PyString>().map(|s| s.to_str()) {
                Ok(Ok(s)) => Op::ALL.into_iter().find(|op| op.as_str() == s),
                _ => None,
            };
            let op = op.ok_or_else(|| {
                let text = op_obj.str().map_or_else(|_| "?".into(), |s| s.to_string());
                node_error(node, Reason::UnknownOp(text))
            })?;
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
                let v = self.value(&a, &ctx, 0)?;
                self.prog.args[all.start as usize + k] = v;
            }
            let mut at = all.start as usize + args.len();
            for (key, value) in kwargs.iter() {
                let key = self.key(&key, &ctx)?;
                let value = self.value(&value, &ctx, 0)?;
                self.prog.args[at] = key;
                self.prog.args[at + 1] = value;
                at += 2;
            }
            index.insert(node.as_ptr() as usize, nodes.len() as u32);
            nodes.push(Node {
                name,
                args: Span {
                    start: all.start,
                    len: args.len() as u32,
                },
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
        let walk = Nodes::Links {
            node_type: self.t.node.bind(py).clone(),
            at: root.clone(),
            root,
            // Far more links than the graph's nodes and any erased ones still linked.
            left: 4 * n + 1024,
        };
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
                let h = hash(&qual);
                if let Some(i) = self.find_submod(h, &qual) {
                    return Ok(Target::Submod(i));
                }
                let child = child(gm, modules, &t, local)
                    .ok_or_else(|| node_error(node, Reason::MissingChild(local.into())))?;
                let i = self.prog.submods.len() as u32;
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
                self.submods.entry(h).or_insert(i);
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

    fn find_submod(&self, h: u64, qual: &str) -> Option<u32> {
        let p = &self.prog;
        match self.submods.get(&h) {
            Some(&i) if p.submod_name(i) == qual => Some(i),
            Some(_) => (0..p.submods.len() as u32).find(|&i| p.submod_name(i) == qual),
            None => None,
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
            return Ok(self.prog.float(f.value()));
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
            let span = self.prog.reserve_args(t.len());
            for (k, item) in t.iter().enumerate() {
                let v = self.value(&item, ctx, depth + 1)?;
                self.prog.args[span.start as usize + k] = v;
            }
            return Ok(Arg::Tuple(self.prog.add_span(span)));
        }
        if ty == self.t.ilist.bind(py).as_type_ptr() || a.is_exact_instance_of::<PyList>() {
            let list = a.cast::<PyList>()?;
            let span = self.prog.reserve_args(list.len());
            for (k, item) in list.iter().enumerate().take(span.len as usize) {
                let v = self.value(&item, ctx, depth + 1)?;
                self.prog.args[span.start as usize + k] = v;
            }
            return Ok(Arg::List(self.prog.add_span(span)));
        }
        if ty == self.t.idict.bind(py).as_type_ptr() || a.is_exact_instance_of::<PyDict>() {
            let dict = a.cast::<PyDict>()?;
            let span = self.prog.reserve_args(2 * dict.len());
            for (k, (key, value)) in dict.iter().enumerate().take(dict.len()) {
                let key = self.value(&key, ctx, depth + 1)?;
                let value = self.value(&value, ctx, depth + 1)?;
                self.prog.args[span.start as usize + 2 * k] = key;
                self.prog.args[span.start as usize + 2 * k + 1] = value;
            }
            return Ok(Arg::Dict(self.prog.add_span(span)));
        }
        if ty == self.t.device.bind(py).as_type_ptr() {
            return Ok(Arg::Const(self.pool.intern_device(a)?));
        }
        if a.is_instance(self.t.node.bind(py))? {
            return self.node_ref(a, ctx);
        }
        Ok(Arg::Const(self.pool.intern(a)))
    }

    fn node_ref(&mut self, a: &Bound<'py, PyAny>, ctx: &Ctx<'_, 'py>) -> PyResult<Arg> {
        if let Some(&i) = ctx.index.get(&(a.as_ptr() as usize)) {
            return Ok(Arg::Node(i));
        }
        if let Some(loose) = &mut self.loose {
            loose.push(a.clone());
            return Ok(Arg::Node(loose.len() as u32 - 1));
        }
        let name = a
            .getattr(intern!(self.py, "name"))
            .and_then(|n| n.str().map(|s| s.to_string()))
            .unwrap_or_else(|_| "?".into());
        Err(node_error(ctx.node, Reason::NotEarlierNode(name)))
    }

    /// One loose value (vLLM's `_node_ref`): nodes are named by their own names.
    pub fn loose_arg(&mut self, a: &Bound<'py, PyAny>) -> PyResult<Arg> {
        self.loose = Some(Vec::new());
        let index = FxHashMap::default();
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
