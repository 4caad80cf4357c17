//! The fingerprint of a segment: everything that decides the programs it lowers to, read in one
//! pass over its operations without lowering anything. Tensor ids are numbered by first
//! appearance and scalar operands are set aside, so two training steps (new tensor ids, a new
//! learning rate) have the same fingerprint, and an executor that has seen one reuses its
//! lowering for the other (`executor::plan_cache`).
//!
//! The operations are written through their `serde` form: every field in order, sequences with
//! their lengths, enum variants by index, so equal fingerprints mean equal operations up to tensor
//! ids (renumbered consistently) and scalar operands.

use std::collections::HashMap;

use burn_ir::{OperationIr, ScalarIr, TensorId};
use serde::Serialize;
use serde::ser;

/// What two segments share when one can reuse the other's lowering: their operations with
/// tensor ids renumbered and scalar operands left out, as bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fingerprint(Vec<u8>);

/// A segment's fingerprint with what it leaves out.
#[derive(Debug, Clone)]
pub struct FingerprintedSegment {
    /// The fingerprint.
    pub fingerprint: Fingerprint,
    /// The segment's tensor ids, indexed by their number in the fingerprint.
    pub tensor_ids: Vec<TensorId>,
    /// The scalar operands of each operation, in the order the operation holds them.
    pub scalars: Vec<Vec<ScalarIr>>,
}

/// An operation the fingerprint cannot write (its `serde` form failed).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("cannot fingerprint operation {index}: {reason}")]
pub struct FingerprintError {
    /// Its position in the segment.
    pub index: usize,
    /// Why.
    pub reason: String,
}

impl FingerprintedSegment {
    /// Fingerprints `operations`.
    pub fn of(operations: &[OperationIr]) -> std::result::Result<Self, FingerprintError> {
        let mut encoder = Encoder::default();
        let mut scalars = Vec::with_capacity(operations.len());
        for (index, operation) in operations.iter().enumerate() {
            operation
                .serialize(&mut encoder)
                .map_err(|error| FingerprintError {
                    index,
                    reason: error.0,
                })?;
            scalars.push(std::mem::take(&mut encoder.scalars));
        }
        Ok(Self {
            fingerprint: Fingerprint(encoder.bytes),
            tensor_ids: encoder.tensor_ids,
            scalars,
        })
    }
}

/// What the next primitive value is.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Next {
    /// Part of the structure: written.
    #[default]
    Structure,
    /// The value of a `TensorId`: renumbered.
    TensorId,
    /// The value of a `ScalarIr`: set aside.
    Scalar,
}

/// Writes operations as fingerprint bytes.
#[derive(Default)]
struct Encoder {
    bytes: Vec<u8>,
    numbers: HashMap<TensorId, u32>,
    tensor_ids: Vec<TensorId>,
    scalars: Vec<ScalarIr>,
    next: Next,
}

/// A failure of the `serde` form of an operation.
#[derive(Debug)]
struct EncodeError(String);

impl std::fmt::Display for EncodeError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(&self.0)
    }
}

impl std::error::Error for EncodeError {}

impl ser::Error for EncodeError {
    fn custom<T: std::fmt::Display>(message: T) -> Self {
        EncodeError(message.to_string())
    }
}

impl Encoder {
    fn write(&mut self, bytes: &[u8]) {
        self.bytes.extend_from_slice(bytes);
    }

    fn length(&mut self, length: Option<usize>) {
        // Lengths are known for every sequence of the IR; an unknown one is marked apart.
        let length = length.map_or(u64::MAX, |length| length as u64);
        self.write(&length.to_le_bytes());
    }

    /// An unsigned integer: a tensor id's number, a scalar operand, or structure.
    fn unsigned(&mut self, value: u64) {
        match std::mem::take(&mut self.next) {
            Next::TensorId => {
                let id = TensorId::new(value);
                let count = self.tensor_ids.len() as u32;
                let number = *self.numbers.entry(id).or_insert(count);
                if number == count {
                    self.tensor_ids.push(id);
                }
                self.write(&number.to_le_bytes());
            }
            Next::Scalar => self.scalars.push(ScalarIr::UInt(value)),
            Next::Structure => self.write(&value.to_le_bytes()),
        }
    }

    fn signed(&mut self, value: i64) {
        match std::mem::take(&mut self.next) {
            Next::Scalar => self.scalars.push(ScalarIr::Int(value)),
            _ => self.write(&value.to_le_bytes()),
        }
    }

    fn float(&mut self, value: f64) {
        match std::mem::take(&mut self.next) {
            Next::Scalar => self.scalars.push(ScalarIr::Float(value)),
            _ => self.write(&value.to_bits().to_le_bytes()),
        }
    }

    fn boolean(&mut self, value: bool) {
        match std::mem::take(&mut self.next) {
            Next::Scalar => self.scalars.push(ScalarIr::Bool(value)),
            _ => self.write(&[value as u8]),
        }
    }
}

type Result<T = ()> = std::result::Result<T, EncodeError>;

/// Serializer methods of primitive values, each widened losslessly to the encoder's method.
macro_rules! forward {
    ($($method:ident($type:ty) => $encode:ident),* $(,)?) => {$(
        fn $method(self, value: $type) -> Result {
            self.$encode(value.into());
            Ok(())
        }
    )*};
}

/// The serializer's methods that start a variant with fields (tuple or struct): its index, then
/// the fields, each through the encoder.
macro_rules! variants_with_fields {
    ($($method:ident),*) => {$(
        fn $method(
            self,
            _name: &'static str,
            index: u32,
            _variant: &'static str,
            _length: usize,
        ) -> Result<Self> {
            self.write(&index.to_le_bytes());
            Ok(self)
        }
    )*};
}

impl ser::Serializer for &mut Encoder {
    type Ok = ();
    type Error = EncodeError;
    type SerializeSeq = Self;
    type SerializeTuple = Self;
    type SerializeTupleStruct = Self;
    type SerializeTupleVariant = Self;
    type SerializeMap = Self;
    type SerializeStruct = Self;
    type SerializeStructVariant = Self;

    forward! {
        serialize_bool(bool) => boolean,
        serialize_i8(i8) => signed,
        serialize_i16(i16) => signed,
        serialize_i32(i32) => signed,
        serialize_i64(i64) => signed,
        serialize_u8(u8) => unsigned,
        serialize_u16(u16) => unsigned,
        serialize_u32(u32) => unsigned,
        serialize_u64(u64) => unsigned,
        serialize_f32(f32) => float,
        serialize_f64(f64) => float,
        serialize_char(char) => unsigned,
    }
    fn serialize_str(self, value: &str) -> Result {
        self.serialize_bytes(value.as_bytes())
    }
    fn serialize_bytes(self, value: &[u8]) -> Result {
        self.length(Some(value.len()));
        self.write(value);
        Ok(())
    }
    fn serialize_none(self) -> Result {
        self.write(&[0]);
        Ok(())
    }
    fn serialize_some<T: ?Sized + Serialize>(self, value: &T) -> Result {
        self.write(&[1]);
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result {
        Ok(())
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result {
        Ok(())
    }
    fn serialize_unit_variant(self, _name: &'static str, index: u32, _variant: &str) -> Result {
        self.write(&index.to_le_bytes());
        Ok(())
    }
    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        name: &'static str,
        index: u32,
        _variant: &'static str,
        value: &T,
    ) -> Result {
        // The kind of a scalar operand is structure (it decides the dtype of its pack); its
        // value is set aside.
        self.write(&index.to_le_bytes());
        if name == "ScalarIr" {
            self.next = Next::Scalar;
        }
        value.serialize(self)
    }
    fn serialize_seq(self, length: Option<usize>) -> Result<Self> {
        self.length(length);
        Ok(self)
    }
    fn serialize_tuple(self, _length: usize) -> Result<Self> {
        Ok(self)
    }
    fn serialize_tuple_struct(self, _name: &'static str, _length: usize) -> Result<Self> {
        Ok(self)
    }
    fn serialize_map(self, length: Option<usize>) -> Result<Self> {
        self.length(length);
        Ok(self)
    }
    fn serialize_struct(self, name: &'static str, _length: usize) -> Result<Self> {
        if name == "TensorId" {
            self.next = Next::TensorId;
        }
        Ok(self)
    }
    variants_with_fields!(serialize_tuple_variant, serialize_struct_variant);
}

/// Elements, fields and entries are written in order, each through the encoder.
macro_rules! compound {
    ($($trait:ident :: $method:ident $(($key:ident))?),* $(,)?) => {$(
        impl ser::$trait for &mut Encoder {
            type Ok = ();
            type Error = EncodeError;
            fn $method<T: ?Sized + Serialize>(
                &mut self,
                $($key: &'static str,)?
                value: &T,
            ) -> Result {
                $(let _ = $key;)?
                value.serialize(&mut **self)
            }
            fn end(self) -> Result {
                Ok(())
            }
        }
    )*};
}

compound!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field,
    SerializeStruct::serialize_field(key),
    SerializeStructVariant::serialize_field(key),
);

impl ser::SerializeMap for &mut Encoder {
    type Ok = ();
    type Error = EncodeError;
    fn serialize_key<T: ?Sized + Serialize>(&mut self, key: &T) -> Result {
        key.serialize(&mut **self)
    }
    fn serialize_value<T: ?Sized + Serialize>(&mut self, value: &T) -> Result {
        value.serialize(&mut **self)
    }
    fn end(self) -> Result {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use burn_backend::{DType, Shape};
    use burn_ir::{BinaryOpIr, NumericOperationIr, ScalarOpIr, TensorIr, TensorStatus};

    use super::*;

    fn tensor(id: u64, length: usize) -> TensorIr {
        TensorIr {
            id: TensorId::new(id),
            shape: Shape::from(vec![length]),
            status: TensorStatus::ReadOnly,
            dtype: DType::F32,
        }
    }

    fn add(lhs: TensorIr, rhs: TensorIr, out: TensorIr) -> OperationIr {
        OperationIr::NumericFloat(
            DType::F32,
            NumericOperationIr::Add(BinaryOpIr { lhs, rhs, out }),
        )
    }

    fn times(lhs: TensorIr, scalar: f64, out: TensorIr) -> OperationIr {
        OperationIr::NumericFloat(
            DType::F32,
            NumericOperationIr::MulScalar(ScalarOpIr {
                lhs,
                rhs: ScalarIr::Float(scalar),
                out,
            }),
        )
    }

    /// `(a · scalar) + b` over tensors numbered from `first`.
    fn step(first: u64, scalar: f64, length: usize) -> Vec<OperationIr> {
        let [a, b, scaled, sum] = [0, 1, 2, 3].map(|i| tensor(first + i, length));
        vec![times(a, scalar, scaled.clone()), add(scaled, b, sum)]
    }

    #[test]
    fn segments_differing_in_tensor_ids_and_scalars_share_a_fingerprint() {
        let first = FingerprintedSegment::of(&step(10, 0.5, 4)).unwrap();
        let second = FingerprintedSegment::of(&step(500, 0.25, 4)).unwrap();
        assert_eq!(first.fingerprint, second.fingerprint);
        assert_eq!(
            second.tensor_ids,
            [500, 502, 501, 503].map(TensorId::new).to_vec()
        );
        assert_eq!(
            second.scalars,
            vec![vec![ScalarIr::Float(0.25)], Vec::new()]
        );
    }

    #[test]
    fn shapes_kinds_and_the_pattern_of_tensor_ids_are_part_of_the_fingerprint() {
        let reference = FingerprintedSegment::of(&step(10, 0.5, 4))
            .unwrap()
            .fingerprint;
        let longer = FingerprintedSegment::of(&step(10, 0.5, 5)).unwrap();
        assert_ne!(longer.fingerprint, reference);
        // `a · s + a` instead of `a · s + b`.
        let [a, scaled, sum] = [10, 12, 13].map(|id| tensor(id, 4));
        let same_input = vec![times(a.clone(), 0.5, scaled.clone()), add(scaled, a, sum)];
        let same_input = FingerprintedSegment::of(&same_input).unwrap();
        assert_ne!(same_input.fingerprint, reference);
        // An integer scalar operand instead of a float one.
        let mut integer = step(10, 0.5, 4);
        if let OperationIr::NumericFloat(_, NumericOperationIr::MulScalar(ir)) = &mut integer[0] {
            ir.rhs = ScalarIr::Int(2);
        }
        let integer = FingerprintedSegment::of(&integer).unwrap();
        assert_ne!(integer.fingerprint, reference);
    }
}
