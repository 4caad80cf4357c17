//! The HLAT model.
