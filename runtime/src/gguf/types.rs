//! The vocabulary of the GGUF format: tensor element types ([`GgmlType`]),
//! metadata value types ([`ValueType`]) and metadata values ([`Value`],
//! [`Array`]).
//!
//! Invariants: every [`GgmlType`] knows its block size and block byte size (so
//! the byte size of any tensor of a known type can be checked, supported or
//! not); [`GgmlType::is_supported`] lists the types whose data the runtime can
//! read (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K). Arrays are stored as typed vectors,
//! so a 49152-entry token list is one `Vec<String>`, not 49152 boxed values.

use std::fmt;

/// A tensor element type of ggml, with its numeric id as stored in GGUF.
///
/// Ids 4, 5 (`Q4_2`, `Q4_3`), 31 to 33 and 36 to 38 (the removed interleaved
/// `Q4_0_4_4`-style types) are not valid in current files and are unknown here.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    /// 32-bit IEEE float.
    F32,
    /// 16-bit IEEE float.
    F16,
    /// 32 weights: fp16 scale `d`, 16 bytes of nibbles; `x = d * (q - 8)`.
    Q4_0,
    /// 32 weights: fp16 `d`, fp16 `m`, 16 bytes of nibbles; `x = d * q + m`.
    Q4_1,
    /// 32 weights: fp16 `d`, 32 high bits, 16 bytes of nibbles; `x = d * (q - 16)`.
    Q5_0,
    /// 32 weights: fp16 `d`, fp16 `m`, 32 high bits, 16 bytes of nibbles; `x = d * q + m`.
    Q5_1,
    /// 32 weights: fp16 scale `d`, 32 signed bytes; `x = d * q`.
    Q8_0,
    /// 32 weights, 8-bit, with scale and sum (unsupported).
    Q8_1,
    /// K-quant, 2-bit (unsupported).
    Q2_K,
    /// K-quant, 3-bit (unsupported).
    Q3_K,
    /// K-quant, 4-bit: 256 weights in 8 sub-blocks with 6-bit scales and mins.
    Q4_K,
    /// K-quant, 5-bit: as Q4_K with a fifth bit per weight.
    Q5_K,
    /// K-quant, 6-bit: 256 weights, 16 8-bit scales, one fp16 `d`.
    Q6_K,
    /// K-quant, 8-bit (unsupported).
    Q8_K,
    /// I-quant (unsupported).
    IQ2_XXS,
    /// I-quant (unsupported).
    IQ2_XS,
    /// I-quant (unsupported).
    IQ3_XXS,
    /// I-quant (unsupported).
    IQ1_S,
    /// I-quant (unsupported).
    IQ4_NL,
    /// I-quant (unsupported).
    IQ3_S,
    /// I-quant (unsupported).
    IQ2_S,
    /// I-quant (unsupported).
    IQ4_XS,
    /// 8-bit integer (unsupported).
    I8,
    /// 16-bit integer (unsupported).
    I16,
    /// 32-bit integer (unsupported).
    I32,
    /// 64-bit integer (unsupported).
    I64,
    /// 64-bit IEEE float (unsupported).
    F64,
    /// I-quant (unsupported).
    IQ1_M,
    /// bfloat16.
    BF16,
    /// Ternary quant (unsupported).
    TQ1_0,
    /// Ternary quant (unsupported).
    TQ2_0,
    /// Microscaling FP4 (unsupported).
    MXFP4,
}

impl GgmlType {
    /// Every known type, in id order.
    pub const ALL: [GgmlType; 32] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_K,
        GgmlType::IQ2_XXS,
        GgmlType::IQ2_XS,
        GgmlType::IQ3_XXS,
        GgmlType::IQ1_S,
        GgmlType::IQ4_NL,
        GgmlType::IQ3_S,
        GgmlType::IQ2_S,
        GgmlType::IQ4_XS,
        GgmlType::I8,
        GgmlType::I16,
        GgmlType::I32,
        GgmlType::I64,
        GgmlType::F64,
        GgmlType::IQ1_M,
        GgmlType::BF16,
        GgmlType::TQ1_0,
        GgmlType::TQ2_0,
        GgmlType::MXFP4,
    ];

    /// The type with GGUF id `id`, or `None` for an unknown or removed id.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        GgmlType::ALL.into_iter().find(|t| t.id() == id)
    }

    /// The numeric id stored in GGUF tensor infos.
    pub fn id(self) -> u32 {
        use GgmlType::*;
        match self {
            F32 => 0,
            F16 => 1,
            Q4_0 => 2,
            Q4_1 => 3,
            Q5_0 => 6,
            Q5_1 => 7,
            Q8_0 => 8,
            Q8_1 => 9,
            Q2_K => 10,
            Q3_K => 11,
            Q4_K => 12,
            Q5_K => 13,
            Q6_K => 14,
            Q8_K => 15,
            IQ2_XXS => 16,
            IQ2_XS => 17,
            IQ3_XXS => 18,
            IQ1_S => 19,
            IQ4_NL => 20,
            IQ3_S => 21,
            IQ2_S => 22,
            IQ4_XS => 23,
            I8 => 24,
            I16 => 25,
            I32 => 26,
            I64 => 27,
            F64 => 28,
            IQ1_M => 29,
            BF16 => 30,
            TQ1_0 => 34,
            TQ2_0 => 35,
            MXFP4 => 39,
        }
    }

    /// ggml's name of the type (`"q4_1"`, `"f32"`, ...).
    pub fn name(self) -> &'static str {
        use GgmlType::*;
        match self {
            F32 => "f32",
            F16 => "f16",
            Q4_0 => "q4_0",
            Q4_1 => "q4_1",
            Q5_0 => "q5_0",
            Q5_1 => "q5_1",
            Q8_0 => "q8_0",
            Q8_1 => "q8_1",
            Q2_K => "q2_K",
            Q3_K => "q3_K",
            Q4_K => "q4_K",
            Q5_K => "q5_K",
            Q6_K => "q6_K",
            Q8_K => "q8_K",
            IQ2_XXS => "iq2_xxs",
            IQ2_XS => "iq2_xs",
            IQ3_XXS => "iq3_xxs",
            IQ1_S => "iq1_s",
            IQ4_NL => "iq4_nl",
            IQ3_S => "iq3_s",
            IQ2_S => "iq2_s",
            IQ4_XS => "iq4_xs",
            I8 => "i8",
            I16 => "i16",
            I32 => "i32",
            I64 => "i64",
            F64 => "f64",
            IQ1_M => "iq1_m",
            BF16 => "bf16",
            TQ1_0 => "tq1_0",
            TQ2_0 => "tq2_0",
            MXFP4 => "mxfp4",
        }
    }

    /// Elements per block (1 for plain scalar types). A tensor's first
    /// dimension must be a multiple of it.
    pub fn block_size(self) -> u64 {
        use GgmlType::*;
        match self {
            F32 | F16 | BF16 | I8 | I16 | I32 | I64 | F64 => 1,
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 | IQ4_NL | MXFP4 => 32,
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | Q8_K | IQ2_XXS | IQ2_XS | IQ3_XXS | IQ1_S | IQ3_S | IQ2_S
            | IQ4_XS | IQ1_M | TQ1_0 | TQ2_0 => 256,
        }
    }

    /// Bytes per block (ggml's `type_size`).
    pub fn block_bytes(self) -> u64 {
        use GgmlType::*;
        match self {
            F32 => 4,
            F16 => 2,
            BF16 => 2,
            I8 => 1,
            I16 => 2,
            I32 => 4,
            I64 => 8,
            F64 => 8,
            Q4_0 => 18,
            Q4_1 => 20,
            Q5_0 => 22,
            Q5_1 => 24,
            Q8_0 => 34,
            Q8_1 => 36,
            Q2_K => 84,
            Q3_K => 110,
            Q4_K => 144,
            Q5_K => 176,
            Q6_K => 210,
            Q8_K => 292,
            IQ2_XXS => 66,
            IQ2_XS => 74,
            IQ3_XXS => 98,
            IQ1_S => 50,
            IQ4_NL => 18,
            IQ3_S => 110,
            IQ2_S => 82,
            IQ4_XS => 136,
            IQ1_M => 56,
            TQ1_0 => 54,
            TQ2_0 => 66,
            MXFP4 => 17,
        }
    }

    /// Whether the runtime can read (view and dequantize) tensors of this type.
    pub fn is_supported(self) -> bool {
        use GgmlType::*;
        matches!(self, F32 | F16 | BF16 | Q8_0 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q4_K | Q5_K | Q6_K)
    }

    /// The dequant kernels' format of this type (every supported type but
    /// F32), or `None`.
    pub fn quant_format(self) -> Option<kernels::dequant::QuantFormat> {
        use kernels::dequant::QuantFormat as Q;
        Some(match self {
            GgmlType::F16 => Q::F16,
            GgmlType::BF16 => Q::BF16,
            GgmlType::Q4_0 => Q::Q4_0,
            GgmlType::Q4_1 => Q::Q4_1,
            GgmlType::Q8_0 => Q::Q8_0,
            GgmlType::Q5_0 => Q::Q5_0,
            GgmlType::Q5_1 => Q::Q5_1,
            GgmlType::Q4_K => Q::Q4_K,
            GgmlType::Q5_K => Q::Q5_K,
            GgmlType::Q6_K => Q::Q6_K,
            _ => return None,
        })
    }

    /// Bytes of `n_elements` values, or `None` when `n_elements` is not a whole
    /// number of blocks or the size overflows `u64`.
    pub fn bytes_for(self, n_elements: u64) -> Option<u64> {
        if !n_elements.is_multiple_of(self.block_size()) {
            return None;
        }
        (n_elements / self.block_size()).checked_mul(self.block_bytes())
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The type tag of a metadata value, with its numeric id as stored in GGUF.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValueType {
    /// `u8` (id 0).
    U8,
    /// `i8` (id 1).
    I8,
    /// `u16` (id 2).
    U16,
    /// `i16` (id 3).
    I16,
    /// `u32` (id 4).
    U32,
    /// `i32` (id 5).
    I32,
    /// `f32` (id 6).
    F32,
    /// `bool`, one byte 0 or 1 (id 7).
    Bool,
    /// UTF-8 string: `u64` length then bytes (id 8).
    String,
    /// Array: element type `u32`, `u64` count, elements (id 9).
    Array,
    /// `u64` (id 10).
    U64,
    /// `i64` (id 11).
    I64,
    /// `f64` (id 12).
    F64,
}

impl ValueType {
    /// The type with GGUF id `id`, or `None` for an unknown id.
    pub fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The numeric id stored in GGUF.
    pub fn id(self) -> u32 {
        use ValueType::*;
        match self {
            U8 => 0,
            I8 => 1,
            U16 => 2,
            I16 => 3,
            U32 => 4,
            I32 => 5,
            F32 => 6,
            Bool => 7,
            String => 8,
            Array => 9,
            U64 => 10,
            I64 => 11,
            F64 => 12,
        }
    }

    /// The fewest bytes one value of this type occupies in a file (a string is at
    /// least its 8-byte length, an array its 4-byte type and 8-byte count). Used
    /// to bound counts by the bytes that remain before allocating.
    pub fn min_encoded_size(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }

    /// Lower-case name of the type, as used in error messages.
    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// [`Value`], [`Array`] and their per-variant methods from one table: each
/// variant, named as its [`ValueType`], holds a value of its type (a
/// [`Value`]) or a vector of them (an [`Array`]). An entry may give the docs
/// of its [`Value`] and [`Array`] variants; by default they name the type.
macro_rules! typed_values {
    (@doc $t:ty, $suffix:literal $(,)?) => {
        concat!("`", stringify!($t), "`", $suffix)
    };
    (@doc $t:ty, $suffix:literal, $doc:literal) => {
        $doc
    };
    ($($variant:ident($t:ty) $(= ($value_doc:literal, $array_doc:literal))?),* $(,)?) => {
        /// A metadata value.
        #[derive(Debug, Clone, PartialEq)]
        pub enum Value {
            $(#[doc = typed_values!(@doc $t, ".", $($value_doc)?)] $variant($t),)*
        }

        /// A homogeneous metadata array, stored as a typed vector.
        #[derive(Debug, Clone, PartialEq)]
        pub enum Array {
            $(#[doc = typed_values!(@doc $t, " elements.", $($array_doc)?)] $variant(Vec<$t>),)*
        }

        impl Value {
            /// The type tag of this value.
            pub fn value_type(&self) -> ValueType {
                match self {
                    $(Value::$variant(_) => ValueType::$variant,)*
                }
            }
        }

        impl Array {
            /// The element type.
            pub fn element_type(&self) -> ValueType {
                match self {
                    $(Array::$variant(_) => ValueType::$variant,)*
                }
            }

            /// Number of elements.
            pub fn len(&self) -> usize {
                match self {
                    $(Array::$variant(v) => v.len(),)*
                }
            }

            /// An empty array of element type `ty` with room for `n` elements.
            pub(crate) fn with_capacity(ty: ValueType, n: usize) -> Array {
                match ty {
                    $(ValueType::$variant => Array::$variant(Vec::with_capacity(n)),)*
                }
            }
        }
    };
}

typed_values! {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String) = ("UTF-8 string.", "String elements."),
    Array(Array) = ("Homogeneous array.", "Nested arrays (each with its own element type)."),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    /// The value as an integer, whatever its integer type; `None` for
    /// non-integers.
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// The value as a float (`f32` or `f64`); `None` otherwise.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => None,
        }
    }

    /// The string, if this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The boolean, if this is one.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The array, if this is one.
    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::String(s.to_string())
    }
}

/// `From` for the types a [`Value`] variant holds as they are.
macro_rules! value_from {
    ($($t:ty => $variant:ident),* $(,)?) => {
        $(
            impl From<$t> for Value {
                fn from(v: $t) -> Value {
                    Value::$variant(v)
                }
            }
        )*
    };
}

value_from!(String => String, u32 => U32, f32 => F32, bool => Bool, Array => Array);

impl Array {
    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// An empty array of element type `ty`.
    pub fn empty(ty: ValueType) -> Array {
        Array::with_capacity(ty, 0)
    }

    /// The elements as integers (any integer element type), or `None` for
    /// non-integer arrays.
    pub fn to_i128_vec(&self) -> Option<Vec<i128>> {
        fn conv<T: Copy + Into<i128>>(v: &[T]) -> Vec<i128> {
            v.iter().map(|&x| x.into()).collect()
        }
        Some(match self {
            Array::U8(v) => conv(v),
            Array::I8(v) => conv(v),
            Array::U16(v) => conv(v),
            Array::I16(v) => conv(v),
            Array::U32(v) => conv(v),
            Array::I32(v) => conv(v),
            Array::U64(v) => conv(v),
            Array::I64(v) => conv(v),
            _ => return None,
        })
    }

    /// The elements, if this is a string array.
    pub fn as_strings(&self) -> Option<&[String]> {
        match self {
            Array::String(v) => Some(v),
            _ => None,
        }
    }
}
