//! HLAT training.
