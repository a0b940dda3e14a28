//! Element types a schema may declare, with their size and the codec family they use.

use serde::{Deserialize, Serialize};

/// A tensor element type. Names follow torch (`torch.bfloat16` -> `"bfloat16"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    Bool,
    Uint8,
    Int8,
    Int16,
    Int32,
    Int64,
    Float16,
    Bfloat16,
    Float32,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::Bool | DType::Uint8 | DType::Int8 => 1,
            DType::Int16 | DType::Float16 | DType::Bfloat16 => 2,
            DType::Int32 | DType::Float32 => 4,
            DType::Int64 => 8,
        }
    }

    /// True for floating types, which the codec splits into byte planes.
    pub fn is_float(self) -> bool {
        matches!(self, DType::Float16 | DType::Bfloat16 | DType::Float32)
    }

    /// The schema name, e.g. `"bfloat16"`.
    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::Uint8 => "uint8",
            DType::Int8 => "int8",
            DType::Int16 => "int16",
            DType::Int32 => "int32",
            DType::Int64 => "int64",
            DType::Float16 => "float16",
            DType::Bfloat16 => "bfloat16",
            DType::Float32 => "float32",
        }
    }

    /// Parses a schema name; `None` for names this build does not know.
    pub fn parse(name: &str) -> Option<DType> {
        serde_json::from_value(serde_json::Value::String(name.to_owned())).ok()
    }
}
