//! fxcodegen's core: torch.fx split graph → Python source.
//!
//! Read top-down: [`ir`] is the node list; [`validate`] checks it; [`names`], [`liveness`] and
//! [`literal`] feed [`emit`], which writes the source; [`serial`] is the node list's versioned
//! binary form, read as untrusted input. [`pyident`] and [`ir`] import nothing from the crate.
//! `read` (feature `python`) is the only reader of Python objects, and the `_core` module
//! below only lists functions.

pub mod emit;
pub mod error;
pub mod ir;
pub mod literal;
pub mod liveness;
pub mod names;
pub mod pyident;
pub mod serial;
pub mod validate;

#[cfg(feature = "python")]
mod read;

#[cfg(test)]
#[path = "tests/builder.rs"]
mod builder;

pub use emit::{Layout, Style};
pub use error::{Error, Reason, Result};
pub use ir::Program;

/// Source from untrusted input may be at most this many bytes per input byte...
pub const OUTPUT_PER_INPUT_BYTE: u64 = 64;
/// ...plus this many.
pub const OUTPUT_SLACK: u64 = 1 << 20;

/// Emits source for a program after checking it (trusted: call names need only be safe).
pub fn codegen(p: &Program, layout: &Layout) -> Result<String> {
    validate::validate(p, false)?;
    emit::check_layout(p, layout)?;
    Ok(emit::emit(p, layout))
}

/// Emits source for a serialized node list, which is untrusted: bad input, and input whose
/// source could outgrow [`OUTPUT_PER_INPUT_BYTE`] times its size, is an error.
pub fn codegen_serialized(data: &[u8], layout: &Layout) -> Result<(String, Vec<String>)> {
    let p = serial::read(data)?;
    emit::check_layout(&p, layout)?;
    let bound = emit::size_bound(&p, layout);
    let limit = OUTPUT_PER_INPUT_BYTE * data.len() as u64 + OUTPUT_SLACK;
    if bound > limit {
        return Err(Error::Invalid(Reason::TooLarge { bound, limit }));
    }
    let names = (0..p.submods.len() as u32)
        .map(|i| p.submod_name(i).to_string())
        .collect();
    Ok((emit::emit(&p, layout), names))
}

#[cfg(feature = "python")]
#[pyo3::pymodule(name = "_core")]
mod core_ext {
    use pyo3::prelude::*;
    use pyo3::types::{PyBytes, PyDict, PyList, PyString};

    use crate::emit::{format_arg, Layout, Style};
    use crate::error::{Error, Reason};
    use crate::names::Names;
    use crate::read::{Pool, Reader};
    use crate::{serial, validate};

    #[pymodule_export]
    use crate::error::CodegenError;

    #[pymodule_export]
    #[allow(non_upper_case_globals)]
    const __version__: &str = env!("CARGO_PKG_VERSION");

    /// None for the node attributes on the class: an error about no one node, or one raised in
    /// Python, has them too.
    #[pymodule_init]
    fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
        let class = m.py().get_type::<CodegenError>();
        let none = |attr| class.setattr(attr, m.py().None());
        crate::error::NODE_ATTRS.into_iter().try_for_each(none)
    }

    fn style(s: &str) -> PyResult<Style> {
        match s {
            "native" => Ok(Style::Native),
            "vllm" => Ok(Style::Vllm),
            _ => Err(Error::Invalid(Reason::UnknownStyle(s.into())).into()),
        }
    }

    /// Appends the slots this pass added to `consts` (and their ids to `const_index`), or
    /// returns the pool as a new list.
    fn write_back<'py>(
        py: Python<'py>,
        pool: &Pool<'py>,
        consts: Option<&Bound<'py, PyList>>,
        const_index: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let Some(list) = consts else {
            return PyList::new(py, &pool.objects);
        };
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

    /// generate(gm, *, resolver, style="native", fn_name="execution_fn", with_submod=True,
    /// consts=None, const_index=None, header=True) -> (code, submod_names, consts)
    #[pyfunction]
    #[pyo3(signature = (gm, *, resolver, style="native", fn_name="execution_fn", with_submod=true, consts=None, const_index=None, header=true))]
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
        let pool = match (consts, const_index) {
            (Some(c), Some(i)) => Pool::seeded(c, i)?,
            (Some(c), None) => Pool::seeded(c, &PyDict::new(py))?,
            _ => Pool::default(),
        };
        let mut reader = Reader::new(py, resolver.clone(), pool)?;
        reader.read(gm)?;
        let code = crate::codegen(&reader.prog, &layout)?;
        let names = reader
            .submod_names
            .iter()
            .enumerate()
            .map(|(i, obj)| match obj {
                Some(obj) => obj.clone(),
                None => PyString::new(py, reader.prog.submod_name(i as u32)).into_any(),
            });
        let names = PyList::new(py, names)?;
        let out = write_back(py, &reader.pool, consts, const_index)?;
        // The node list is freed before the source is copied into a str (peak memory).
        drop(reader);
        Ok((PyString::new(py, &code), names, out))
    }

    /// serialize(gm, resolver) -> bytes: the versioned serialized node list.
    #[pyfunction]
    fn serialize<'py>(
        py: Python<'py>,
        gm: &Bound<'py, PyAny>,
        resolver: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let mut reader = Reader::new(py, resolver.clone(), Pool::default())?;
        reader.read(gm)?;
        validate::validate(&reader.prog, false)?;
        Ok(PyBytes::new(py, &serial::write(&reader.prog)))
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
            ..Layout::native()
        };
        let (code, names) = py.detach(|| crate::codegen_serialized(data, &layout))?;
        Ok((PyString::new(py, &code), names))
    }

    /// node_ref(arg, consts, const_index, resolver, style="vllm") -> str: one value as
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
        let mut reader = Reader::new(py, resolver.clone(), Pool::seeded(consts, const_index)?)?;
        let a = reader.loose_arg(arg)?;
        let loose = reader.loose.take().unwrap_or_default();
        let list = loose
            .iter()
            .map(|node| Ok(node.getattr("name")?.str()?.to_string()))
            .collect::<PyResult<Vec<String>>>()?;
        let text = format_arg(&reader.prog, a, &Names::from_list(&list), style);
        write_back(py, &reader.pool, Some(consts), Some(const_index))?;
        Ok(text)
    }
}
