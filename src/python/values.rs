//! Typed values handed to Python: the manifest as a dict and the schema as tuples, built from the
//! core's structures once per open (no JSON text crosses the boundary).

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use serde_json::Value;

use crate::schema::Schema;

/// One schema tensor as `eagle_io.store.schema.TensorSpec` takes it:
/// `(name, dtype, width, precision, scale_block)`.
pub type PyTensorSpec = (String, &'static str, Option<u64>, Option<&'static str>, Option<u32>);

/// The schema's tensors, in order, as `PyTensorSpec` tuples.
pub fn schema_tuples(schema: &Schema) -> Vec<PyTensorSpec> {
    schema
        .tensors
        .iter()
        .map(|t| {
            let precision = t.precision.as_ref();
            (
                t.name.clone(),
                t.dtype.name(),
                t.width,
                precision.map(|p| p.storage.name()),
                precision.and_then(|p| p.block),
            )
        })
        .collect()
}

/// A JSON value as the Python object `json.loads` makes of it (dict, list, str, int, float, bool, None).
pub fn json_to_py<'py>(py: Python<'py>, value: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match value {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => b.into_pyobject(py)?.to_owned().into_any(),
        Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => u.into_pyobject(py)?.into_any(),
            (None, Some(i)) => i.into_pyobject(py)?.into_any(),
            // A JSON number is an integer or a finite float: no other case is reachable.
            (None, None) => n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any(),
        },
        Value::String(s) => s.into_pyobject(py)?.into_any(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(json_to_py(py, item)?)?;
            }
            list.into_any()
        }
        Value::Object(map) => {
            let dict = PyDict::new(py);
            for (k, v) in map {
                dict.set_item(k, json_to_py(py, v)?)?;
            }
            dict.into_any()
        }
    })
}
