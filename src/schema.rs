//! The schema: which named tensors every sample holds, with dtype and per-token width.
//! Every tensor of a sample has the sample's token count `L` as its first dimension.

use serde::{Deserialize, Serialize};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::quant::Precision;

/// One named tensor of every sample: shape `[L]` when `width` is `None`, else `[L, width]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorSpec {
    pub name: String,
    pub dtype: DType,
    pub width: Option<u64>,
    /// Lossy storage (FP8 with scales); absent: stored in `dtype`, losslessly. `dtype` stays
    /// the type a reader dequantises into.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<Precision>,
}

impl TensorSpec {
    /// Elements per token (1 for a `[L]` tensor).
    pub fn elems_per_row(&self) -> u64 {
        self.width.unwrap_or(1)
    }

    /// Bytes per token, as written and as read (dequantised).
    pub fn row_bytes(&self) -> u64 {
        self.elems_per_row() * self.dtype.size() as u64
    }

    /// Bytes per token as the chunks decode them: `row_bytes`, or for FP8 storage the row's
    /// scales and FP8 bytes (`Precision::row_bytes`).
    pub fn stored_row_bytes(&self) -> u64 {
        match &self.precision {
            Some(p) => p.row_bytes(self.elems_per_row()),
            None => self.row_bytes(),
        }
    }
}

/// The ordered tensors of a dataset's samples. Record tables follow this order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schema {
    pub tensors: Vec<TensorSpec>,
}

/// Widths above this are refused: no real model has a per-token row this large, and the
/// bound keeps every size computed from a file far from overflow.
pub const MAX_WIDTH: u64 = 1 << 24;

impl Schema {
    /// Builds and validates a schema: at least one tensor, unique non-empty names,
    /// widths in `1..=MAX_WIDTH`.
    pub fn new(tensors: Vec<TensorSpec>) -> Result<Schema> {
        let schema = Schema { tensors };
        schema.validate()?;
        Ok(schema)
    }

    fn validate(&self) -> Result<()> {
        if self.tensors.is_empty() {
            return Err(Error::InvalidArgument("schema declares no tensors".into()));
        }
        for (i, t) in self.tensors.iter().enumerate() {
            if t.name.is_empty() {
                return Err(Error::InvalidArgument(format!("schema tensor {i} has an empty name")));
            }
            if self.tensors[..i].iter().any(|u| u.name == t.name) {
                return Err(Error::InvalidArgument(format!(
                    "schema names tensor {:?} twice",
                    t.name
                )));
            }
            if let Some(w) = t.width {
                if w == 0 || w > MAX_WIDTH {
                    return Err(Error::InvalidArgument(format!(
                        "schema tensor {:?} has width {w}; widths must be in 1..={MAX_WIDTH}",
                        t.name
                    )));
                }
            }
            if let Some(p) = &t.precision {
                if !matches!(t.dtype, DType::Bfloat16 | DType::Float32) || t.width.is_none() {
                    return Err(Error::InvalidArgument(format!(
                        "schema tensor {:?}: FP8 storage needs a bfloat16 or float32 tensor of shape [L, width]",
                        t.name
                    )));
                }
                if p.block == Some(0) {
                    return Err(Error::InvalidArgument(format!(
                        "schema tensor {:?}: an FP8 scale block of 0 channels",
                        t.name
                    )));
                }
            }
        }
        Ok(())
    }

    /// Parses the schema JSON stored in shard headers and manifests.
    pub fn from_json(bytes: &[u8]) -> std::result::Result<Schema, String> {
        let schema: Schema = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        schema.validate().map_err(|e| e.to_string())?;
        Ok(schema)
    }

    /// The canonical JSON form (compact, field order as declared).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a schema always serialises")
    }

    /// Bytes of one token across all tensors.
    pub fn token_bytes(&self) -> u64 {
        self.tensors.iter().map(TensorSpec::row_bytes).sum()
    }

    /// Bytes of one token across all tensors as the chunks decode them (FP8 rows with scales).
    pub fn stored_token_bytes(&self) -> u64 {
        self.tensors.iter().map(TensorSpec::stored_row_bytes).sum()
    }

    /// True when some tensor is stored as FP8.
    pub fn has_fp8(&self) -> bool {
        self.tensors.iter().any(|t| t.precision.is_some())
    }

    /// Position of the tensor called `name`.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.tensors.iter().position(|t| t.name == name)
    }
}
