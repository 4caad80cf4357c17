//! Element types of stored weights, and host-side byte conversions.

use std::str::FromStr;

use burn::tensor::{DType, TensorData};
use half::{bf16, f16};
use safetensors::Dtype;

/// The element type weights are converted to on import or export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightDtype {
    /// 32-bit float.
    F32,
    /// bfloat16.
    BF16,
    /// IEEE half precision.
    F16,
}

impl WeightDtype {
    /// `value` rounded to this type (to nearest, ties to even), as a torch operation on it rounds
    /// its f32 result.
    pub fn round(self, value: f32) -> f32 {
        match self {
            WeightDtype::F32 => value,
            WeightDtype::BF16 => bf16::from_f32(value).to_f32(),
            WeightDtype::F16 => f16::from_f32(value).to_f32(),
        }
    }

    /// The Burn dtype.
    pub fn burn(self) -> DType {
        match self {
            WeightDtype::F32 => DType::F32,
            WeightDtype::BF16 => DType::BF16,
            WeightDtype::F16 => DType::F16,
        }
    }

    /// The safetensors dtype.
    pub fn safetensors(self) -> Dtype {
        match self {
            WeightDtype::F32 => Dtype::F32,
            WeightDtype::BF16 => Dtype::BF16,
            WeightDtype::F16 => Dtype::F16,
        }
    }

    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        match self {
            WeightDtype::F32 => 4,
            WeightDtype::BF16 | WeightDtype::F16 => 2,
        }
    }

    /// The name transformers writes in `config.json` (`dtype` / `torch_dtype`).
    pub fn torch_name(self) -> &'static str {
        match self {
            WeightDtype::F32 => "float32",
            WeightDtype::BF16 => "bfloat16",
            WeightDtype::F16 => "float16",
        }
    }

    /// The weight type of a safetensors dtype, if supported.
    pub fn from_safetensors(dtype: Dtype) -> Option<WeightDtype> {
        match dtype {
            Dtype::F32 => Some(WeightDtype::F32),
            Dtype::BF16 => Some(WeightDtype::BF16),
            Dtype::F16 => Some(WeightDtype::F16),
            _ => None,
        }
    }

    /// The weight type of a Burn dtype, if supported.
    pub fn from_burn(dtype: DType) -> Option<WeightDtype> {
        match dtype {
            DType::F32 => Some(WeightDtype::F32),
            DType::BF16 => Some(WeightDtype::BF16),
            DType::F16 => Some(WeightDtype::F16),
            _ => None,
        }
    }
}

/// Error of [`WeightDtype::from_str`].
#[derive(Debug, thiserror::Error)]
#[error("unknown dtype `{0}` (expected f32, bf16 or f16)")]
pub struct UnknownDtype(String);

impl FromStr for WeightDtype {
    type Err = UnknownDtype;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        match name.to_ascii_lowercase().as_str() {
            "f32" | "float32" => Ok(WeightDtype::F32),
            "bf16" | "bfloat16" => Ok(WeightDtype::BF16),
            "f16" | "float16" => Ok(WeightDtype::F16),
            _ => Err(UnknownDtype(name.to_string())),
        }
    }
}

/// Decodes little-endian `bytes` of `dtype` into tensor data of `shape`; a 2-D tensor is
/// transposed on the way when `transpose` is set (torch `[out, in]` <-> Burn `[in, out]`).
pub fn decode(bytes: &[u8], dtype: WeightDtype, shape: &[usize], transpose: bool) -> TensorData {
    match dtype {
        WeightDtype::F32 => typed(bytes, shape, transpose, |b| {
            f32::from_le_bytes([b[0], b[1], b[2], b[3]])
        }),
        WeightDtype::BF16 => typed(bytes, shape, transpose, |b| {
            bf16::from_bits(u16::from_le_bytes([b[0], b[1]]))
        }),
        WeightDtype::F16 => typed(bytes, shape, transpose, |b| {
            f16::from_bits(u16::from_le_bytes([b[0], b[1]]))
        }),
    }
}

fn typed<E: burn::tensor::Element>(
    bytes: &[u8],
    shape: &[usize],
    transpose: bool,
    read: impl Fn(&[u8]) -> E,
) -> TensorData {
    let values: Vec<E> = bytes.chunks_exact(size_of::<E>()).map(read).collect();
    match (transpose, shape) {
        (true, &[rows, cols]) => TensorData::new(transposed(&values, rows, cols), [cols, rows]),
        _ => TensorData::new(values, shape.to_vec()),
    }
}

/// Encodes tensor data as little-endian bytes of `dtype`, transposing a 2-D tensor first when
/// `transpose` is set. Returns the bytes and the stored shape.
pub fn encode(data: TensorData, dtype: WeightDtype, transpose: bool) -> (Vec<u8>, Vec<usize>) {
    let data = data.convert_dtype(dtype.burn());
    let shape = data.shape().to_vec();
    match dtype {
        WeightDtype::F32 => bytes_of::<f32>(data, &shape, transpose, |v| v.to_le_bytes().to_vec()),
        WeightDtype::BF16 => bytes_of::<bf16>(data, &shape, transpose, |v| {
            v.to_bits().to_le_bytes().to_vec()
        }),
        WeightDtype::F16 => bytes_of::<f16>(data, &shape, transpose, |v| {
            v.to_bits().to_le_bytes().to_vec()
        }),
    }
}

fn bytes_of<E: burn::tensor::Element>(
    data: TensorData,
    shape: &[usize],
    transpose: bool,
    write: impl Fn(E) -> Vec<u8>,
) -> (Vec<u8>, Vec<usize>) {
    let values = data.iter::<E>().collect::<Vec<E>>();
    let (values, shape) = match (transpose, shape) {
        (true, &[rows, cols]) => (transposed(&values, rows, cols), vec![cols, rows]),
        _ => (values, shape.to_vec()),
    };
    (values.into_iter().flat_map(write).collect(), shape)
}

/// The transpose of a row-major `[rows, cols]` matrix.
fn transposed<E: Copy>(values: &[E], rows: usize, cols: usize) -> Vec<E> {
    let mut out = Vec::with_capacity(values.len());
    for col in 0..cols {
        out.extend((0..rows).map(|row| values[row * cols + col]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_then_encode_is_the_identity_and_transposes() {
        let values: Vec<f32> = (0..6).map(|i| i as f32 * 0.5 - 1.0).collect();
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let data = decode(&bytes, WeightDtype::F32, &[2, 3], true);
        assert_eq!(data.shape().to_vec(), vec![3, 2]);
        assert_eq!(
            data.try_to_vec::<f32>().unwrap(),
            vec![-1.0, 0.5, -0.5, 1.0, 0.0, 1.5]
        );
        let (back, shape) = encode(data, WeightDtype::F32, true);
        assert_eq!((back, shape), (bytes, vec![2, 3]));
    }

    #[test]
    fn bf16_bytes_round_trip() {
        let bits: [u16; 3] = [0x3f80, 0xc000, 0x0001];
        let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
        let data = decode(&bytes, WeightDtype::BF16, &[3], false);
        assert_eq!(data.try_to_vec::<bf16>().unwrap()[0], bf16::from_f32(1.0));
        assert_eq!(encode(data, WeightDtype::BF16, false).0, bytes);
    }
}
