//! Map layouts: the C structs of keys and values, the maps, and `maps.json`.
//!
//! Every struct the generated program and user space exchange is described
//! once here, as a [`CStruct`] with explicit offsets and explicit padding
//! fields. The template prints the C definitions from these descriptions
//! (with `_Static_assert`s on every size and offset, so clang checks that
//! both sides agree), `maps.json` serializes them, and the encoder
//! ([`crate::encode`]) packs bytes through them. Nothing else knows an
//! offset.

use serde::{Deserialize, Serialize};

/// A C scalar type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scalar {
    U8,
    U16,
    U32,
    U64,
}

impl Scalar {
    pub fn size(self) -> u32 {
        match self {
            Scalar::U8 => 1,
            Scalar::U16 => 2,
            Scalar::U32 => 4,
            Scalar::U64 => 8,
        }
    }
    pub fn c_name(self) -> &'static str {
        match self {
            Scalar::U8 => "__u8",
            Scalar::U16 => "__u16",
            Scalar::U32 => "__u32",
            Scalar::U64 => "__u64",
        }
    }
}

/// What one field of a struct holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CFieldType {
    Scalar {
        scalar: Scalar,
    },
    /// `struct bpf_spin_lock` (4 bytes, user space never writes it).
    SpinLock,
    /// Another struct of this layout, by name.
    Struct {
        name: String,
        size: u32,
        align: u32,
    },
}

impl CFieldType {
    fn size(&self) -> u32 {
        match self {
            CFieldType::Scalar { scalar } => scalar.size(),
            CFieldType::SpinLock => 4,
            CFieldType::Struct { size, .. } => *size,
        }
    }
    fn align(&self) -> u32 {
        match self {
            CFieldType::Scalar { scalar } => scalar.size(),
            CFieldType::SpinLock => 4,
            CFieldType::Struct { align, .. } => *align,
        }
    }
    pub fn c_name(&self) -> String {
        match self {
            CFieldType::Scalar { scalar } => scalar.c_name().to_string(),
            CFieldType::SpinLock => "struct bpf_spin_lock".to_string(),
            CFieldType::Struct { name, .. } => format!("struct {name}"),
        }
    }
}

/// One field: its type, array length (1 for a plain field) and offset.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CField {
    pub name: String,
    #[serde(rename = "type")]
    pub ty: CFieldType,
    /// Elements (1 for a field that is not an array).
    pub count: u32,
    /// Declared as an array (even of one element).
    pub array: bool,
    pub offset: u32,
    /// Size of the whole field (all elements).
    pub size: u32,
}

impl CField {
    pub fn is_padding(&self) -> bool {
        self.name.starts_with("_pad")
    }
    /// The C declaration, e.g. `__u64 lo[8]`.
    pub fn c_decl(&self) -> String {
        if !self.array {
            format!("{} {}", self.ty.c_name(), self.name)
        } else {
            format!("{} {}[{}]", self.ty.c_name(), self.name, self.count)
        }
    }
}

/// A C struct with explicit padding: `sizeof` is the sum of its fields.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CStruct {
    pub name: String,
    pub size: u32,
    pub align: u32,
    pub fields: Vec<CField>,
}

impl CStruct {
    pub fn builder(name: &str) -> StructBuilder {
        StructBuilder { s: CStruct { name: name.to_string(), size: 0, align: 1, fields: vec![] }, pads: 0 }
    }
    pub fn field(&self, name: &str) -> &CField {
        self.fields.iter().find(|f| f.name == name).unwrap_or_else(|| panic!("struct {} has no field {name}", self.name))
    }
    /// This struct as the type of a field of another.
    pub fn as_type(&self) -> CFieldType {
        CFieldType::Struct { name: self.name.clone(), size: self.size, align: self.align }
    }
    /// A zeroed buffer of this struct's size.
    pub fn zeroed(&self) -> Packed<'_> {
        Packed { s: self, bytes: vec![0; self.size as usize] }
    }
}

pub struct StructBuilder {
    s: CStruct,
    pads: u32,
}

impl StructBuilder {
    fn push(mut self, name: &str, ty: CFieldType, count: u32, array: bool) -> Self {
        let align = ty.align();
        let misalign = self.s.size % align;
        if misalign != 0 {
            self = self.pad(align - misalign);
        }
        let size = ty.size() * count;
        self.s.fields.push(CField { name: name.to_string(), ty, count, array, offset: self.s.size, size });
        self.s.size += size;
        self.s.align = self.s.align.max(align);
        self
    }
    fn pad(mut self, n: u32) -> Self {
        let name = format!("_pad{}", self.pads);
        self.pads += 1;
        self.s.fields.push(CField {
            name,
            ty: CFieldType::Scalar { scalar: Scalar::U8 },
            count: n,
            array: true,
            offset: self.s.size,
            size: n,
        });
        self.s.size += n;
        self
    }
    pub fn scalar(self, name: &str, s: Scalar) -> Self {
        self.push(name, CFieldType::Scalar { scalar: s }, 1, false)
    }
    pub fn array(self, name: &str, s: Scalar, count: u32) -> Self {
        self.push(name, CFieldType::Scalar { scalar: s }, count, true)
    }
    pub fn lock(self) -> Self {
        self.push("lock", CFieldType::SpinLock, 1, false)
    }
    /// A struct field; an array of them when `count` is not 1.
    pub fn nested(self, name: &str, s: &CStruct, count: u32) -> Self {
        self.push(name, s.as_type(), count, count != 1)
    }
    pub fn finish(mut self) -> CStruct {
        let misalign = self.s.size % self.s.align;
        if misalign != 0 {
            let a = self.s.align;
            self = self.pad(a - misalign);
        }
        self.s
    }
}

/// Bytes of one struct value, written field by field in host byte order
/// (what the kernel and the program see).
pub struct Packed<'a> {
    s: &'a CStruct,
    bytes: Vec<u8>,
}

impl Packed<'_> {
    fn put(&mut self, field: &str, index: u32, width: u32, v: u64) -> &mut Self {
        let f = self.s.field(field);
        assert!(index < f.count, "{}.{field}[{index}] out of bounds", self.s.name);
        let elem = f.size / f.count;
        assert_eq!(elem, width, "{}.{field} is {elem} bytes, written as {width}", self.s.name);
        let at = (f.offset + index * elem) as usize;
        self.bytes[at..at + width as usize].copy_from_slice(&v.to_ne_bytes()[..width as usize]);
        self
    }
    pub fn u8(&mut self, field: &str, v: u8) -> &mut Self {
        self.put(field, 0, 1, v as u64)
    }
    pub fn u16(&mut self, field: &str, v: u16) -> &mut Self {
        self.put(field, 0, 2, v as u64)
    }
    pub fn u32(&mut self, field: &str, v: u32) -> &mut Self {
        self.put(field, 0, 4, v as u64)
    }
    pub fn u64(&mut self, field: &str, v: u64) -> &mut Self {
        self.put(field, 0, 8, v)
    }
    pub fn u8_at(&mut self, field: &str, i: u32, v: u8) -> &mut Self {
        self.put(field, i, 1, v as u64)
    }
    pub fn u16_at(&mut self, field: &str, i: u32, v: u16) -> &mut Self {
        self.put(field, i, 2, v as u64)
    }
    pub fn u32_at(&mut self, field: &str, i: u32, v: u32) -> &mut Self {
        self.put(field, i, 4, v as u64)
    }
    pub fn u64_at(&mut self, field: &str, i: u32, v: u64) -> &mut Self {
        self.put(field, i, 8, v)
    }
    /// Raw bytes into a field (big-endian data such as an LPM key or a MAC).
    pub fn bytes(&mut self, field: &str, data: &[u8]) -> &mut Self {
        let f = self.s.field(field);
        assert!(data.len() as u32 <= f.size, "{}.{field} holds {} bytes", self.s.name, f.size);
        let at = f.offset as usize;
        self.bytes[at..at + data.len()].copy_from_slice(data);
        self
    }
    /// Copies a nested struct's bytes into element `i` of a field.
    pub fn nested_at(&mut self, field: &str, i: u32, data: &[u8]) -> &mut Self {
        let f = self.s.field(field);
        let elem = f.size / f.count;
        assert!(i < f.count && data.len() as u32 == elem);
        let at = (f.offset + i * elem) as usize;
        self.bytes[at..at + data.len()].copy_from_slice(data);
        self
    }
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }
    pub fn to_vec(&self) -> Vec<u8> {
        self.bytes.clone()
    }
}

/// Reads fields back out of bytes (for status, sim and tests).
pub fn read_field(s: &CStruct, bytes: &[u8], field: &str, index: u32) -> u64 {
    let f = s.field(field);
    let elem = f.size / f.count;
    let at = (f.offset + index * elem) as usize;
    let mut b = [0u8; 8];
    b[..elem as usize].copy_from_slice(&bytes[at..at + elem as usize]);
    u64::from_ne_bytes(b)
}

/// The kernel map types the program uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MapType {
    Array,
    /// An array with one copy of each value per CPU: the program updates
    /// its own CPU's copy without atomics; user space reads every copy.
    PercpuArray,
    Hash,
    LpmTrie,
    Devmap,
    LruHash,
}

impl MapType {
    pub fn c_name(self) -> &'static str {
        match self {
            MapType::Array => "BPF_MAP_TYPE_ARRAY",
            MapType::PercpuArray => "BPF_MAP_TYPE_PERCPU_ARRAY",
            MapType::Hash => "BPF_MAP_TYPE_HASH",
            MapType::LpmTrie => "BPF_MAP_TYPE_LPM_TRIE",
            MapType::Devmap => "BPF_MAP_TYPE_DEVMAP",
            MapType::LruHash => "BPF_MAP_TYPE_LRU_HASH",
        }
    }
}

/// The type of a key or value: a plain scalar or a struct.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum KV {
    Scalar { scalar: Scalar },
    Struct(CStruct),
}

impl KV {
    pub fn size(&self) -> u32 {
        match self {
            KV::Scalar { scalar } => scalar.size(),
            KV::Struct(s) => s.size,
        }
    }
    pub fn c_name(&self) -> String {
        match self {
            KV::Scalar { scalar } => scalar.c_name().to_string(),
            KV::Struct(s) => format!("struct {}", s.name),
        }
    }
    pub fn as_struct(&self) -> &CStruct {
        match self {
            KV::Struct(s) => s,
            KV::Scalar { .. } => panic!("not a struct"),
        }
    }
}

/// What a map is for (so that tools can find maps without parsing names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MapRole {
    Generation,
    Config,
    Roots,
    Exact,
    Lpm,
    Sorted,
    Leaves,
    Updates,
    Egress,
    Devmap,
    /// Packets and bytes handed to each logical port's egress, per CPU.
    PortStats,
    /// Runs of the program that entered and left the tables, per CPU: what
    /// an updater polls instead of waiting for a grace period.
    Runs,
    Record,
    State,
    /// The naive benchmark program's rule list.
    Rules,
    /// A bit-vector group's interval tables, rows, order and leaves (`bits.rs`).
    BitIntervals,
    BitRows,
    BitOrder,
    BitLeaves,
    /// Receiver groups' member words (more than 512 ports; `audience.rs`).
    Members,
    /// Label mode (`labels.rs`): planes and ingress, the plane counter,
    /// the F-BM rows, the device's own endpoints.
    LabelConfig,
    LabelSent,
    LabelRows,
    LabelHosts,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapDef {
    /// The map's name in the object (and its pin name).
    pub name: String,
    pub role: MapRole,
    #[serde(rename = "type")]
    pub map_type: MapType,
    pub key: KV,
    pub value: KV,
    pub max_entries: u32,
    /// `BPF_F_*` flags as written in C (`BPF_F_NO_PREALLOC`), if any.
    pub flags: Option<String>,
    /// Only in objects built with this preprocessor symbol defined.
    pub only_if: Option<String>,
    /// For state maps: the state variable's name in the spec.
    pub state: Option<String>,
}

impl MapDef {
    pub fn key_struct(&self) -> &CStruct {
        self.key.as_struct()
    }
    pub fn value_struct(&self) -> &CStruct {
        self.value.as_struct()
    }
    /// Whether the map is created `BPF_F_MMAPABLE` (an array whose values a
    /// loader may write word by word through a memory mapping: the
    /// partial writes of [`MapOp`](crate::MapOp)).
    pub fn mmapable(&self) -> bool {
        self.map_type == MapType::Array && self.flags.as_deref().is_some_and(|f| f.split('|').any(|f| f.trim() == "BPF_F_MMAPABLE"))
    }
    /// Bytes of memory this map needs at most (an estimate for the report,
    /// one CPU's copy of a per-CPU map: the kernel's own figure is in
    /// `/proc/<pid>/fdinfo`).
    pub fn approx_bytes(&self) -> u64 {
        (self.key.size() as u64 + self.value.size() as u64) * self.max_entries as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_is_explicit_and_natural() {
        let next = CStruct::builder("n").scalar("state", Scalar::U32).scalar("level", Scalar::U16).finish();
        assert_eq!(next.size, 8);
        assert_eq!(next.fields.last().unwrap().name, "_pad0");
        let s = CStruct::builder("k").scalar("a", Scalar::U8).scalar("b", Scalar::U64).lock().array("c", Scalar::U16, 3).finish();
        let offs: Vec<(&str, u32)> = s.fields.iter().map(|f| (f.name.as_str(), f.offset)).collect();
        assert_eq!(offs, vec![("a", 0), ("_pad0", 1), ("b", 8), ("lock", 16), ("c", 20), ("_pad1", 26)]);
        assert_eq!(s.size, 32);
        let mut p = s.zeroed();
        p.u64("b", 0x0102).u16_at("c", 2, 7);
        let b = p.into_bytes();
        assert_eq!(read_field(&s, &b, "b", 0), 0x0102);
        assert_eq!(read_field(&s, &b, "c", 2), 7);
    }
}
