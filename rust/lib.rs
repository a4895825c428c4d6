//! fxcodegen's core: torch.fx split graph → Python source.
//!
//! Read top-down: [`ir`] (the node list), [`serial`] (its versioned binary form, read as
//! untrusted input), [`names`], [`liveness`], [`literal`], [`table`], [`helper`], [`stream`]
//! and [`emit`] are plain Rust; `extract` (feature `python`) is the only reader of Python
//! objects, and the `_core` module below only exposes functions. [`alloc`] is the global
//! allocator: the system's, keeping the large blocks a call frees at its end for the next.

pub mod alloc;
pub mod emit;
pub mod error;
pub mod helper;
pub mod ir;
pub mod literal;
pub mod liveness;
pub mod names;
pub mod out;
pub mod serial;
pub mod stream;
pub mod table;

#[cfg(feature = "python")]
mod extract;

pub use emit::{Layout, Style};
pub use error::{Error, Result};
pub use ir::Program;

#[global_allocator]
static ALLOCATOR: alloc::Retaining = alloc::Retaining;

/// Emits source for a program after checking it against `layout` (the pure-Rust entry point).
pub fn codegen(p: &Program, layout: &Layout) -> Result<String> {
    codegen_pieces(p, layout).map(emit::Source::into_string)
}

/// [`codegen`]'s source in the pieces the threads wrote, for a caller that copies it elsewhere.
pub fn codegen_pieces(p: &Program, layout: &Layout) -> Result<emit::Source> {
    p.validate()?;
    emit::check_layout(p, layout)?;
    Ok(emit::emit_with_threads(p, layout, emit::default_threads()))
}

#[cfg(feature = "python")]
#[pyo3::pymodule(name = "_core")]
mod core_ext {
    use pyo3::prelude::*;
    use pyo3::types::{PyBytes, PyDict, PyList, PyString};

    use crate::emit::{
        check_layout, default_threads, emit_streamed, expected_size, format_arg, one_writer, Count,
        Fill, Layout, Sink, Style, ONCE_PARALLEL_MIN_NODES,
    };
    use crate::error::Error;
    use crate::extract::{Extractor, Pool};
    use crate::helper::{Helper, CHUNK};
    use crate::liveness::Liveness;
    use crate::names::Names;
    use crate::serial;
    use crate::stream::Root;

    /// Sources at least this large are copied into the `str` with a page-populating helper.
    const PREFAULT_MIN_BYTES: usize = 8 << 20;

    /// A root written on the helper whose module is at least this large (and less than
    /// [`SPLIT_MIN_BYTES`]) has that helper populate the `str`'s pages as it is filled: past
    /// glibc's threshold for mapping a block afresh, the `str` mostly gets fresh pages on every
    /// call (stitch 10k's 494 KB: 52 of its 121 pages a call). Populated, stitch 10k took
    /// 163-167 ns a node against 171-172 with a 1 MiB threshold, stitch 5k 218-226 against
    /// 224-230, at the same peak memory (`benches/LOG.md`, thirty-second session). A smaller
    /// one usually lands in memory the call freed, and the helper is ended first, handing its
    /// spare batches back (peak memory).
    const POPULATE_MIN_BYTES: usize = 128 << 10;

    /// A root written on the helper whose module is at least this large is filled in two
    /// halves side by side, the second on a thread of its own (started for it: 50-60 µs on the
    /// VMs fxcodegen is measured on), each thread faulting in its half's pages; the helper is
    /// ended first. At stitch 100k (4.8 MB) that took the fill from 2.1-2.8 ms to 1.6-1.8 ms
    /// (medians of 30 calls, against the populating helper); at 1M the two are level, both
    /// bound by faulting in 12k pages.
    const SPLIT_MIN_BYTES: usize = 4 << 20;

    /// The sizes of `str` that a source written by one thread goes straight into ([`Target`]).
    /// Below, a String over it would not be recognised when freed
    /// ([`crate::alloc::adopt`]), and the copy it saves is small. From 128 KiB, glibc's default
    /// threshold for mapping a block afresh, the str would be mapped, cut, and freed at the cut
    /// size, which leaves the threshold under the next call's `cap`: every call then writes
    /// into fresh pages (inline 10k: 190 page faults a call, 28% slower in a warm loop, 0.96-1.15
    /// of the floor in the bench against 0.60-0.66 with the copy).
    const TARGET_BYTES: std::ops::Range<usize> = crate::alloc::MIN_BLOCK..128 << 10;

    #[pymodule_export]
    use crate::error::CodegenError;

    #[pymodule_export]
    #[allow(non_upper_case_globals)]
    const __version__: &str = env!("CARGO_PKG_VERSION");

    /// Reads `FXCODEGEN_RETAIN_MB`: how many MiB of freed large blocks the core may keep for
    /// the next call (see [`crate::alloc`]; 0 keeps none, unset or empty keeps the default),
    /// and guards the cache of them against `fork`.
    #[pymodule_init]
    fn init(_m: &Bound<'_, PyModule>) -> PyResult<()> {
        #[cfg(target_os = "linux")]
        crate::alloc::guard_fork();
        if let Some(v) = std::env::var("FXCODEGEN_RETAIN_MB")
            .ok()
            .filter(|v| !v.trim().is_empty())
        {
            let mb = v.trim().parse::<usize>().map_err(|_| {
                pyo3::exceptions::PyValueError::new_err(format!(
                    "FXCODEGEN_RETAIN_MB must be a whole number of MiB, not {v:?}"
                ))
            })?;
            crate::alloc::set_limit(mb.saturating_mul(1 << 20));
        }
        Ok(())
    }

    /// release_memory() -> int: frees the large blocks kept for reuse; the bytes freed.
    #[pyfunction]
    fn release_memory() -> usize {
        crate::alloc::release()
    }

    fn style(s: &str) -> PyResult<Style> {
        match s {
            "native" => Ok(Style::Native),
            "vllm" => Ok(Style::Vllm),
            _ => Err(Error::Invalid(format!("unknown style {s:?}")).into()),
        }
    }

    /// A Python str of `len` bytes that `write` writes through a [`Fill`]. Emitted code is
    /// ASCII (every non-ASCII character of a literal is escaped), so it is written straight
    /// into a compact ASCII string, each piece checked right after it is copied (while it is in
    /// cache; checking the whole source first cost a pass over it); should one not be ASCII, or
    /// the pieces not fill exactly `len` bytes, the string is dropped and `text` gives the
    /// source instead.
    fn str_of<'py>(
        py: Python<'py>,
        len: usize,
        helper: Option<Helper>,
        write: impl FnOnce(&mut Fill),
        text: impl FnOnce() -> PyResult<String>,
    ) -> PyResult<Bound<'py, PyString>> {
        // SAFETY: only the fill writes the str's bytes (bounds-checked) before anything else
        // can see the object; it is kept only if every byte was written, all ASCII, and is
        // zeroed and dropped otherwise.
        unsafe {
            let (obj, data) = unfilled_ascii(py, len)?;
            let mut fill = Fill::raw(data, len);
            {
                let _helper = prefault(data, len, helper);
                write(&mut fill);
            }
            if fill.ascii && fill.full() {
                return Ok(obj.cast_into_unchecked());
            }
            std::ptr::write_bytes(data, 0, len);
        }
        Ok(PyString::new(py, &text()?))
    }

    /// A new compact ASCII str of `len` bytes, not yet written, and its data.
    ///
    /// # Safety
    /// Nothing else may see the str until all `len` bytes are written, all ASCII.
    #[inline(always)]
    unsafe fn unfilled_ascii(py: Python<'_>, len: usize) -> PyResult<(Bound<'_, PyAny>, *mut u8)> {
        // SAFETY: PyUnicode_New(n, 127) makes a compact ASCII string with an n-byte buffer.
        unsafe {
            let obj = pyo3::ffi::PyUnicode_New(len as pyo3::ffi::Py_ssize_t, 127);
            if obj.is_null() {
                return Err(PyErr::fetch(py));
            }
            let data = pyo3::ffi::PyUnicode_1BYTE_DATA(obj);
            Ok((Bound::from_owned_ptr(py, obj), data))
        }
    }

    /// The generated source (in pieces) as one Python str.
    fn source_str<'py, 's>(
        py: Python<'py>,
        parts: impl Iterator<Item = &'s str> + Clone,
    ) -> PyResult<Bound<'py, PyString>> {
        let len: usize = parts.clone().map(str::len).sum();
        let write = |w: &mut Fill| parts.clone().for_each(|s| w.put(s.as_bytes()));
        str_of(py, len, None, write, || Ok(parts.clone().collect()))
    }

    /// A large source lands in fresh pages: a helper (`helper`, or one started for a source of
    /// [`PREFAULT_MIN_BYTES`]) that faults in all but the first quarter of the `len` bytes at
    /// `data` while this thread writes them (join it, by dropping it, after writing).
    fn prefault(data: *mut u8, len: usize, helper: Option<Helper>) -> Option<Helper> {
        let spawn = || {
            (len >= PREFAULT_MIN_BYTES && default_threads() > 1)
                .then(|| Helper::start(None))
                .flatten()
        };
        helper.or_else(spawn).inspect(|pf| {
            let (start, end) = (data as usize + len / 4, data as usize + len);
            for at in (start..end).step_by(CHUNK) {
                pf.request(at, (at + CHUNK).min(end));
            }
        })
    }

    /// The module around a root the helper wrote ([`crate::emit::Body`]), assembled straight
    /// into a Python str.
    fn root_str<'py>(
        py: Python<'py>,
        layout: &Layout,
        root: &Root,
        names: &Names,
        live: &Liveness,
        helper: Option<Helper>,
    ) -> PyResult<Bound<'py, PyString>> {
        let whole = |w: &mut Fill| root.body.module(layout, names, live, w);
        let n = root.body.nodes();
        let split = helper.is_none() && root.len >= SPLIT_MIN_BYTES && default_threads() > 1;
        let write = |w: &mut Fill| match split {
            true => w.split(
                root.at,
                |w| {
                    root.body.head(layout, names, w);
                    root.body.statements(0..root.mid, names, live, w);
                },
                |w| {
                    root.body.statements(root.mid..n, names, live, w);
                    root.body.tail(w);
                },
            ),
            false => whole(w),
        };
        // Only when the str could not be filled: counted again, so that a length the helper
        // got wrong can never show in the source.
        let text = || {
            let mut count = Count::default();
            root.body.module(layout, names, live, &mut count);
            let mut bytes = vec![0; count.0];
            whole(&mut Fill::new(&mut bytes));
            String::from_utf8(bytes)
                .map_err(|_| Error::Invalid("generated source is not UTF-8".into()).into())
        };
        str_of(py, root.len, helper, write, text)
    }

    fn submod_names(p: &crate::Program) -> Vec<String> {
        (0..p.submods.len() as u32)
            .map(|i| p.submod_name(i).to_string())
            .collect()
    }

    /// The submodule names as a list of str, reusing (taking over) the target objects that
    /// spell them. The list is made at its length and filled in place: collecting the names
    /// first grew a vector by doubling (64 KiB at stitch 10k, while the peak was reached).
    fn submod_list<'py>(py: Python<'py>, ex: &mut Extractor<'py>) -> PyResult<Bound<'py, PyList>> {
        let p = &ex.prog;
        let n = p.submods.len();
        // SAFETY: a new list of `n` empty slots, each set once below before the list is shared
        // (a list dropped part-filled, on an error, skips its empty slots).
        unsafe {
            let list = pyo3::ffi::PyList_New(n as pyo3::ffi::Py_ssize_t);
            if list.is_null() {
                return Err(PyErr::fetch(py));
            }
            let list = Bound::from_owned_ptr(py, list).cast_into_unchecked::<PyList>();
            let mut objs = std::mem::take(&mut ex.submod_names).into_iter();
            for i in 0..n {
                let obj = match objs.next() {
                    Some(Some(obj)) => obj,
                    _ => source_str(py, std::iter::once(p.submod_name(i as u32)))?.into_any(),
                };
                pyo3::ffi::PyList_SET_ITEM(
                    list.as_ptr(),
                    i as pyo3::ffi::Py_ssize_t,
                    obj.into_ptr(),
                );
            }
            Ok(list)
        }
    }

    /// generate(gm, resolver, style="native", fn_name="execution_fn", with_submod=True,
    /// consts=None, const_index=None, header=True) -> (code, submod_names, consts)
    #[pyfunction]
    #[pyo3(signature = (gm, resolver, style="native", fn_name="execution_fn", with_submod=true, consts=None, const_index=None, header=true))]
    #[allow(clippy::too_many_arguments)]
    fn generate<'py>(
        py: Python<'py>,
        gm: &Bound<'py, PyAny>,
        resolver: &Bound<'py, PyAny>,
        style: &str,
        fn_name: &str,
        with_submod: bool,
        consts: Option<&Bound<'py, PyList>>,
        const_index: Option<&Bound<'py, PyDict>>,
        header: bool,
    ) -> PyResult<(Bound<'py, PyString>, Bound<'py, PyList>, Bound<'py, PyList>)> {
        let layout = Layout {
            style: self::style(style)?,
            fn_name,
            with_submod,
            header,
        };
        let pool = || match (consts, const_index) {
            (Some(c), Some(i)) => Pool::seeded(c, i),
            (Some(c), None) => Pool::seeded(c, &PyDict::new(py)),
            _ => Ok(Pool::new()),
        };
        // Reads `gm`, a stitching root's statements written on the helper unless `statements`
        // is false; None when reading stopped for an inlined child of such a root.
        let read = |statements: bool| -> PyResult<Option<Extractor<'py>>> {
            let mut ex = Extractor::new(py, resolver.clone(), pool()?)?;
            ex.stream_for(&layout);
            if !statements {
                ex.without_statements();
            }
            match ex.run(gm) {
                Ok(()) => Ok(Some(ex)),
                Err(_) if ex.abandoned => Ok(None),
                Err(e) => Err(e),
            }
        };
        // Only a root written on the helper is abandoned.
        let whole =
            || read(false)?.ok_or_else(|| PyErr::from(Error::Invalid("reading stopped".into())));
        let mut ex = match read(true)? {
            Some(ex) => ex,
            // The root calls an inlined child: read it again, keeping every node.
            None => whole()?,
        };
        check_layout(&ex.prog, &layout)?;
        if ex.handed_over {
            // The helper was handed the root in full: while it finishes (its last batches, the
            // names, last uses and the module's length), this thread lists the submodules and
            // hands the program back. The program holds no node of the root, which is the
            // only graph (an inlined child would have stopped the read).
            let names = submod_list(py, &mut ex)?;
            ex.discard_program();
            let written = ex
                .take_streamed()
                .into_iter()
                .find_map(|s| Some((s.root?, s.names, s.live)));
            match written {
                Some((root, parts, live)) => {
                    let out = write_back(py, &ex.pool, consts, const_index)?;
                    // The helper hands its scratch back before the str takes memory (peak).
                    let helper = match root.len >= POPULATE_MIN_BYTES {
                        true if root.len < SPLIT_MIN_BYTES => ex.settled_helper(),
                        _ => {
                            ex.end_helper();
                            None
                        }
                    };
                    let over = parts.over(&root.text);
                    let source = root_str(py, &layout, &root, &over, &live, helper)?;
                    let _keep = crate::alloc::Keep::new();
                    drop(root);
                    return Ok((source, names, out));
                }
                // The helper ended without writing the root (its thread failed): read again,
                // keeping every node.
                None => {
                    drop(ex);
                    ex = whole()?;
                }
            }
        }
        let streamed = ex.take_streamed();
        let prog = &ex.prog;
        let threads = default_threads();
        // Written by one thread, the source goes straight into the str (`target` is declared
        // before `code`, so an early return drops the String over its data first).
        let (into, target) = match one_writer(prog, threads, ONCE_PARALLEL_MIN_NODES) {
            // Half as much again as the emitter expects: outgrowing the str costs a copy of
            // the source and the pages written, while its untouched bytes cost nothing (inline
            // 1k writes 74 bytes a node where the emitter expects 76).
            true => Target::new(py, expected_size(prog).1 * 3 / 2)?.unzip(),
            false => (None, None),
        };
        let code = py.detach(|| {
            emit_streamed(
                prog,
                &layout,
                threads,
                ONCE_PARALLEL_MIN_NODES,
                streamed,
                into,
            )
        });
        let names = submod_list(py, &mut ex)?;
        let out = write_back(py, &ex.pool, consts, const_index)?;
        // Free the node list before the source is copied into a str (peak memory).
        drop(ex);
        if let Some(target) = target {
            return Ok((target.finish(py, code)?, names, out));
        }
        let source = source_str(py, code.pieces())?;
        // The output buffers are kept for the next call (what this one freed before was
        // handed back, lowering its peak).
        let _keep = crate::alloc::Keep::new();
        drop(code);
        Ok((source, names, out))
    }

    /// A str of `cap` bytes that the emitter writes the source into, through a String over its
    /// data ([`crate::alloc::adopt`]); [`Target::finish`] cuts it to the source's length. A
    /// source written elsewhere (one that outgrew `cap`) is copied into a str of its own
    /// instead. This saves a copy of the source and, in a call's peak memory, the fresh pages
    /// the second buffer took (inline 1k: 2.8-2.9 times the source to 2.3-2.4; stitch 1k:
    /// 3.8-4.0 to 3.6-3.9, in fresh processes).
    struct Target<'py> {
        /// Compact ASCII, `cap` bytes, unfilled; referenced from nowhere else.
        obj: Bound<'py, PyAny>,
        data: *mut u8,
    }

    impl<'py> Target<'py> {
        /// None for a `cap` out of [`TARGET_BYTES`], or when the str cannot be written through
        /// a String.
        fn new(py: Python<'py>, cap: usize) -> PyResult<Option<(String, Target<'py>)>> {
            if !TARGET_BYTES.contains(&cap) {
                return Ok(None);
            }
            // SAFETY: only the String adopted here writes the str's bytes until `finish`.
            unsafe {
                let (obj, data) = unfilled_ascii(py, cap)?;
                Ok(crate::alloc::adopt(data, cap).map(|into| (into, Target { obj, data })))
            }
        }

        /// The source as a str: this one, cut to the source's length, when `code` is the text
        /// of its buffer, all ASCII (emitted code is, unless a name is not), else a copy.
        fn finish(
            self,
            py: Python<'py>,
            code: crate::emit::Source,
        ) -> PyResult<Bound<'py, PyString>> {
            let len = code
                .whole()
                .filter(|s| s.as_ptr() == self.data && s.is_ascii())
                .map(str::len);
            let Some(len) = len else {
                let source = source_str(py, code.pieces());
                drop(code); // before the str its buffer may lie in
                return source;
            };
            drop(code); // forgets the buffer: the str's data
            let mut obj = self.obj.into_ptr();
            // SAFETY: the str is only referenced here, unhashed and not interned, and its
            // first `len` bytes are the source, all ASCII: PyUnicode_Resize may cut it to
            // them. It keeps the str when it fails.
            unsafe {
                let failed =
                    pyo3::ffi::PyUnicode_Resize(&mut obj, len as pyo3::ffi::Py_ssize_t) != 0;
                let obj = Bound::from_owned_ptr(py, obj);
                match failed {
                    true => Err(PyErr::fetch(py)),
                    false => Ok(obj.cast_into_unchecked()),
                }
            }
        }
    }

    fn write_back<'py>(
        py: Python<'py>,
        pool: &Pool<'py>,
        consts: Option<&Bound<'py, PyList>>,
        const_index: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyList>> {
        match consts {
            Some(list) => {
                for obj in &pool.objects[pool.preexisting..] {
                    list.append(obj)?;
                }
                if let Some(index) = const_index {
                    for (id, k) in pool.new_ids() {
                        index.set_item(id, k)?;
                    }
                }
                Ok(list.clone())
            }
            None => PyList::new(py, &pool.objects),
        }
    }

    /// serialize(gm, resolver) -> bytes: the versioned serialized node list.
    #[pyfunction]
    fn serialize<'py>(
        py: Python<'py>,
        gm: &Bound<'py, PyAny>,
        resolver: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let mut ex = Extractor::new(py, resolver.clone(), Pool::new())?;
        ex.run(gm)?;
        let prog = &ex.prog;
        let data = py.detach(|| serial::write(prog));
        Ok(PyBytes::new(py, &data))
    }

    /// emit(data, style="native", fn_name="execution_fn") -> (code, submod_names).
    /// `data` is untrusted: any defect raises CodegenError.
    #[pyfunction]
    #[pyo3(signature = (data, style="native", fn_name="execution_fn"))]
    fn emit<'py>(
        py: Python<'py>,
        data: &[u8],
        style: &str,
        fn_name: &str,
    ) -> PyResult<(Bound<'py, PyString>, Vec<String>)> {
        let layout = Layout {
            style: self::style(style)?,
            fn_name,
            with_submod: true,
            header: true,
        };
        // The node list is freed before the str is made, and the pieces go straight into it.
        let (code, names) = py.detach(|| -> crate::Result<_> {
            let prog = serial::read(data)?;
            Ok((crate::codegen_pieces(&prog, &layout)?, submod_names(&prog)))
        })?;
        Ok((source_str(py, code.pieces())?, names))
    }

    /// node_ref(arg, consts, const_index, style="vllm", resolver=None) -> str: one value as
    /// generated code writes it, pooling what is not a literal into `consts`.
    #[pyfunction]
    #[pyo3(signature = (arg, consts, const_index, resolver, style="vllm"))]
    fn node_ref<'py>(
        py: Python<'py>,
        arg: &Bound<'py, PyAny>,
        consts: &Bound<'py, PyList>,
        const_index: &Bound<'py, PyDict>,
        resolver: &Bound<'py, PyAny>,
        style: &str,
    ) -> PyResult<String> {
        let style = self::style(style)?;
        let mut ex = Extractor::new(py, resolver.clone(), Pool::seeded(consts, const_index)?)?;
        let a = ex.loose_arg(arg)?;
        let loose = ex.loose.take().unwrap_or_default();
        let list = loose
            .iter()
            .map(|node| Ok(node.getattr("name")?.str()?.to_string()))
            .collect::<PyResult<Vec<String>>>()?;
        let names = Names::from_list(&list);
        let text = format_arg(&ex.prog, a, &names, style);
        write_back(py, &ex.pool, Some(consts), Some(const_index))?;
        Ok(text)
    }
}
