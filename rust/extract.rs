//! Reads torch.fx objects into the IR: the only module that touches Python objects, besides
//! the thin function layer in `lib.rs`. One pass per graph; nodes are matched by identity.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple, PyType};
use pyo3::{ffi, intern};
use rustc_hash::FxHashMap;

use crate::error::Error;
use crate::ir::{Arg, Graph, Node, Op, Program, Submod, SubmodKind, Target, MAX_DEPTH};
use crate::names;

static NODE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static IMMUTABLE_LIST: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static IMMUTABLE_DICT: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static GRAPH_MODULE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static DEVICE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static GETITEM: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

fn type_ptr(obj: &Bound<'_, PyAny>) -> usize {
    // SAFETY: `obj` is a live object; reading its type pointer takes no reference.
    unsafe { ffi::Py_TYPE(obj.as_ptr()) as usize }
}

struct Types<'py> {
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
    devices: FxHashMap<String, u32>,
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
        let key = obj.str()?.to_str()?.to_owned();
        if let Some(&k) = self.devices.get(&key) {
            self.by_id.insert(id, k);
            return Ok(k);
        }
        let k = self.intern(obj);
        self.devices.insert(key, k);
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
    submods: FxHashMap<String, u32>,
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
            loose: None,
        })
    }

    /// Extracts `gm` as the root graph and every plain GraphModule child it calls.
    pub fn run(&mut self, gm: &Bound<'py, PyAny>) -> PyResult<()> {
        self.graph(gm, "", 0)?;
        self.prog.n_consts = self.pool.objects.len() as u32;
        self.prog.validate()?;
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
        let mut index: FxHashMap<usize, u32> = FxHashMap::default();
        let mut nodes: Vec<Node> = Vec::new();
        for node in graph.getattr(intern!(py, "nodes"))?.try_iter()? {
            let node = node?;
            let op_obj = node.getattr(intern!(py, "op"))?;
            let op = match op_obj.cast::<PyString>()?.to_str()? {
                "placeholder" => Op::Placeholder,
                "call_module" => Op::CallModule,
                "call_function" => Op::CallFunction,
                "call_method" => Op::CallMethod,
                "get_attr" => Op::GetAttr,
                "output" => Op::Output,
                other => return Err(node_error(&node, format!("unknown op {other:?}"))),
            };
            let name_obj = node.getattr(intern!(py, "name"))?;
            let name = self.prog.push_str(name_obj.cast::<PyString>()?.to_str()?);
            let target_obj = node.getattr(intern!(py, "target"))?;
            let target = self.target(op, &target_obj, gm, prefix, &node, depth)?;
            let ctx = NodeCtx {
                index: &index,
                node: &node,
            };
            let args_obj = node.getattr(intern!(py, "_args"))?;
            let args_t = args_obj.cast::<PyTuple>()?;
            let args = self.prog.reserve_args(args_t.len());
            for (k, a) in args_t.iter().enumerate() {
                let v = self.arg(&a, &ctx, 0)?;
                self.prog.args[args.start as usize + k] = v;
            }
            let kwargs_obj = node.getattr(intern!(py, "_kwargs"))?;
            let kw = kwargs_obj.cast::<PyDict>()?;
            let kwargs = self.prog.reserve_args(2 * kw.len());
            for (k, (key, v)) in kw.iter().enumerate() {
                let key = match key.cast::<PyString>() {
                    Ok(s) => Arg::Str(self.prog.push_str(s.to_str()?)),
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

    fn target(
        &mut self,
        op: Op,
        t: &Bound<'py, PyAny>,
        gm: &Bound<'py, PyAny>,
        prefix: &str,
        node: &Bound<'py, PyAny>,
        depth: usize,
    ) -> PyResult<Target> {
        let text = |t: &Bound<'py, PyAny>| -> PyResult<String> {
            match t.cast::<PyString>() {
                Ok(s) => Ok(s.to_str()?.to_owned()),
                Err(_) => Err(node_error(node, "the target is not a str")),
            }
        };
        Ok(match op {
            Op::Placeholder => Target::Param(self.prog.push_str(&text(t)?)),
            Op::Output => Target::None,
            Op::CallMethod => Target::Method(self.prog.push_str(&text(t)?)),
            Op::GetAttr => {
                let path = text(t)?;
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
                let qual = format!("{prefix}{local}");
                if let Some(&i) = self.submods.get(&qual) {
                    return Ok(Target::Submod(i));
                }
                let child = gm
                    .call_method1(intern!(self.py, "get_submodule"), (local.as_str(),))
                    .map_err(|_| {
                        node_error(node, format!("missing child: no submodule named {local:?}"))
                    })?;
                let i = self.prog.submods.len() as u32;
                let name = self.prog.push_str(&qual);
                self.prog.submods.push(Submod {
                    name,
                    kind: SubmodKind::Opaque,
                });
                self.submods.insert(qual.clone(), i);
                if child.is_instance(&self.t.graph_module)? {
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
                        Ok(s) if names::check_call_name(s.to_str()?).is_ok() => {
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
            let items: Vec<Bound<'py, PyAny>> = l.iter().collect();
            let span = self.prog.reserve_args(items.len());
            for (k, item) in items.iter().enumerate() {
                let v = self.arg(item, ctx, depth + 1)?;
                self.prog.args[span.start as usize + k] = v;
            }
            return Ok(Arg::List(span));
        }
        if a.is_exact_instance_of::<PyDict>() || ty == self.t.idict {
            let d = a.cast::<PyDict>()?;
            let items: Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)> = d.iter().collect();
            let span = self.prog.reserve_args(2 * items.len());
            for (k, (key, v)) in items.iter().enumerate() {
                let kv = self.arg(key, ctx, depth + 1)?;
                let vv = self.arg(v, ctx, depth + 1)?;
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
