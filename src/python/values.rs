//! Typed values across the boundary, both ways: manifests and metadata as dicts, the schema as
//! tuples (no JSON text crosses it).

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::{Map, Number, Value};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::quant::{Fp8Type, Precision};
use crate::schema::{Schema, TensorSpec};

/// One schema tensor as `eagle_io.store.schema.TensorSpec` takes it:
/// `(name, dtype, width, precision, scale_block)`.
pub type PyTensorSpec = (String, &'static str, Option<u64>, Option<&'static str>, Option<u32>);

/// The same tuple handed in by Python (`eagle_io.store.writer.ShardWriter`'s schema).
pub type PyTensorSpecIn = (String, String, Option<u64>, Option<String>, Option<u32>);

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

/// The schema of `PyTensorSpec`-shaped tuples (what `eagle_io.store.schema.TensorSpec` holds),
/// validated by [`Schema::new`].
pub fn schema_of(specs: Vec<PyTensorSpecIn>) -> Result<Schema> {
    let tensors = specs
        .into_iter()
        .map(|(name, dtype, width, precision, block)| {
            let dtype = DType::parse(&dtype)
                .ok_or_else(|| Error::InvalidArgument(format!("schema tensor {name:?}: unknown dtype {dtype:?}")))?;
            let precision = match precision {
                None => None,
                Some(p) => Some(Precision {
                    storage: Fp8Type::parse(&p).ok_or_else(|| {
                        Error::InvalidArgument(format!("schema tensor {name:?}: unknown precision {p:?}"))
                    })?,
                    block,
                }),
            };
            Ok(TensorSpec {
                name,
                dtype,
                width,
                precision,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Schema::new(tensors)
}

/// A Python value as JSON: dict (str keys), list, tuple, str, bool, int, finite float, None; any
/// other value, a non-str key or a NaN/Inf is an error naming where it is (`$.a[2]`).
pub fn py_to_json(obj: &Bound<'_, PyAny>) -> std::result::Result<Value, String> {
    fn at(obj: &Bound<'_, PyAny>, path: &mut String) -> std::result::Result<Value, String> {
        if obj.is_none() {
            return Ok(Value::Null);
        }
        if let Ok(b) = obj.cast::<PyBool>() {
            return Ok(Value::Bool(b.is_true()));
        }
        if obj.is_instance_of::<PyInt>() {
            if let Ok(u) = obj.extract::<u64>() {
                return Ok(Value::Number(u.into()));
            }
            return match obj.extract::<i64>() {
                Ok(i) => Ok(Value::Number(i.into())),
                Err(_) => Err(format!("{path}: an integer outside 64 bits")),
            };
        }
        if let Ok(f) = obj.cast::<PyFloat>() {
            return Number::from_f64(f.value())
                .map(Value::Number)
                .ok_or_else(|| format!("{path}: {} (JSON has no NaN or Infinity)", f.value()));
        }
        if let Ok(s) = obj.cast::<PyString>() {
            return Ok(Value::String(
                s.to_str().map_err(|e| format!("{path}: {e}"))?.to_owned(),
            ));
        }
        if let Ok(d) = obj.cast::<PyDict>() {
            let mut map = Map::new();
            for (k, v) in d.iter() {
                let key = k
                    .cast::<PyString>()
                    .map_err(|_| format!("{path}: a key that is not a str ({})", type_name(&k)))?
                    .to_str()
                    .map_err(|e| format!("{path}: {e}"))?
                    .to_owned();
                let len = path.len();
                path.push_str(&format!(".{key}"));
                let value = at(&v, path)?;
                path.truncate(len);
                map.insert(key, value);
            }
            return Ok(Value::Object(map));
        }
        let items: Vec<Bound<'_, PyAny>> = if let Ok(l) = obj.cast::<PyList>() {
            l.iter().collect()
        } else if let Ok(t) = obj.cast::<PyTuple>() {
            t.iter().collect()
        } else {
            return Err(format!("{path}: a {}, not a JSON value", type_name(obj)));
        };
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let len = path.len();
            path.push_str(&format!("[{i}]"));
            out.push(at(item, path)?);
            path.truncate(len);
        }
        Ok(Value::Array(out))
    }
    at(obj, &mut String::from("$"))
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "object".into())
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
