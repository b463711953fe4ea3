//! How deep a Parquet footer's schema nests, read from the footer's Thrift bytes before any
//! decoder builds the tree.
//!
//! The Parquet crate turns the footer's flat list of `SchemaElement`s into a tree by
//! recursion, one stack frame per level and no limit: a footer of a few hundred KiB can
//! nest deeper than any thread's stack, and the overflow aborts the whole server. This walk
//! reads only what the depth needs (each element's `num_children`), iteratively, with no
//! allocation sized by the input, so a hostile footer is refused before the decoder sees it.
//!
//! It is a reader of the Thrift compact protocol restricted to skipping: the Parquet crate's
//! own decoder is private, and the `thrift` crate allocates every string's declared length
//! before reading it (gigabytes for a five-byte lie).

/// Levels under the root of the schema in `metadata` (a footer's `FileMetaData`, as the
/// file's last bytes before its length and magic hold it): 1 for a flat schema, 0 for none.
/// Counting stops past `limit`: a deeper schema reads as `limit + 1`. An error names what is
/// malformed about the bytes the walk reads.
pub(crate) fn schema_depth(metadata: &[u8], limit: usize) -> Result<usize, String> {
    let mut input = Compact {
        bytes: metadata,
        at: 0,
    };
    let mut last_id = 0;
    // struct FileMetaData { 1: i32 version; 2: list<SchemaElement> schema; ... }
    loop {
        let Some((ty, id)) = input.field_header(&mut last_id)? else {
            // No schema at all: nothing nests (the decoder names the missing field).
            return Ok(0);
        };
        if id == 2 && ty == LIST {
            return input.schema_list(limit);
        }
        input.skip(ty)?;
    }
}

// The compact protocol's type codes.
const STOP: u8 = 0;
const TRUE: u8 = 1;
const FALSE: u8 = 2;
const BYTE: u8 = 3;
const I16: u8 = 4;
const I32: u8 = 5;
const I64: u8 = 6;
const DOUBLE: u8 = 7;
const BINARY: u8 = 8;
const LIST: u8 = 9;
const SET: u8 = 10;
const MAP: u8 = 11;
const STRUCT: u8 = 12;
const UUID: u8 = 13;

/// Containers open at once while skipping: what the Parquet crate's own skip allows.
const MAX_SKIP_NESTING: usize = 64;

/// A container being skipped.
enum Open {
    /// Fields until a stop.
    Struct,
    /// `left` values of type `element`.
    List { left: u32, element: u8 },
    /// `left` keys and values alternating, a key first when `left` is even.
    Map { left: u64, key: u8, value: u8 },
}

struct Compact<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Compact<'_> {
    fn byte(&mut self) -> Result<u8, String> {
        let b = *self
            .bytes
            .get(self.at)
            .ok_or_else(|| format!("the metadata ends at byte {} inside a value", self.at))?;
        self.at += 1;
        Ok(b)
    }

    fn advance(&mut self, n: u64) -> Result<(), String> {
        let left = (self.bytes.len() - self.at) as u64;
        if n > left {
            return Err(format!(
                "a value at byte {} claims {n} bytes; {left} remain",
                self.at
            ));
        }
        self.at += n as usize;
        Ok(())
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            value |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(format!("a varint longer than 10 bytes ends at byte {}", self.at))
    }

    fn zigzag(&mut self) -> Result<i64, String> {
        let v = self.varint()?;
        Ok((v >> 1) as i64 ^ -((v & 1) as i64))
    }

    /// The next field's type and id, `None` at the struct's stop.
    fn field_header(&mut self, last_id: &mut i64) -> Result<Option<(u8, i64)>, String> {
        let b = self.byte()?;
        let ty = b & 0x0f;
        if ty == STOP {
            return Ok(None);
        }
        let delta = i64::from(b >> 4);
        *last_id = if delta == 0 {
            self.zigzag()?
        } else {
            *last_id + delta
        };
        Ok(Some((ty, *last_id)))
    }

    /// A list's (or set's) element type and length; the length cannot exceed the bytes left,
    /// each element taking at least one.
    fn list_header(&mut self) -> Result<(u8, u32), String> {
        let b = self.byte()?;
        let element = b & 0x0f;
        let short = u64::from(b >> 4);
        let len = if short == 15 { self.varint()? } else { short };
        self.check_count(len)?;
        Ok((element, len as u32))
    }

    fn check_count(&self, count: u64) -> Result<(), String> {
        let left = (self.bytes.len() - self.at) as u64;
        if count > left {
            return Err(format!(
                "a container at byte {} claims {count} values; {left} bytes remain",
                self.at
            ));
        }
        Ok(())
    }

    /// Skips one value of type `ty`: a primitive at once, a container by opening it.
    /// `in_container`: booleans take a byte there, none in a field header's type.
    fn skip_value(&mut self, ty: u8, in_container: bool, open: &mut Vec<Open>) -> Result<(), String> {
        match ty {
            TRUE | FALSE if in_container => self.advance(1),
            TRUE | FALSE => Ok(()),
            BYTE => self.advance(1),
            I16 | I32 | I64 => self.varint().map(drop),
            DOUBLE => self.advance(8),
            UUID => self.advance(16),
            BINARY => {
                let len = self.varint()?;
                self.advance(len)
            }
            LIST | SET => {
                let (element, left) = self.list_header()?;
                if left > 0 && !is_value_type(element) {
                    return Err(format!("a list of type code {element} at byte {}", self.at));
                }
                open.push(Open::List { left, element });
                Ok(())
            }
            MAP => {
                let entries = self.varint()?;
                self.check_count(entries)?;
                let (key, value) = if entries > 0 {
                    let b = self.byte()?;
                    (b >> 4, b & 0x0f)
                } else {
                    (STOP, STOP)
                };
                if entries > 0 && !(is_value_type(key) && is_value_type(value)) {
                    return Err(format!("a map of type codes {key}, {value} at byte {}", self.at));
                }
                open.push(Open::Map {
                    left: entries * 2,
                    key,
                    value,
                });
                Ok(())
            }
            STRUCT => {
                open.push(Open::Struct);
                Ok(())
            }
            other => Err(format!("type code {other} at byte {}", self.at)),
        }
    }

    /// Skips one value of type `ty`, containers and all, without recursion.
    fn skip(&mut self, ty: u8) -> Result<(), String> {
        let mut open = Vec::new();
        self.skip_value(ty, false, &mut open)?;
        while let Some(top) = open.last_mut() {
            let (next, in_container) = match top {
                Open::Struct => match self.field_header(&mut 0)? {
                    Some((ty, _)) => (ty, false),
                    None => {
                        open.pop();
                        continue;
                    }
                },
                Open::List { left: 0, .. } | Open::Map { left: 0, .. } => {
                    open.pop();
                    continue;
                }
                Open::List { left, element } => {
                    *left -= 1;
                    (*element, true)
                }
                Open::Map { left, key, value } => {
                    *left -= 1;
                    (if *left % 2 == 1 { *key } else { *value }, true)
                }
            };
            self.skip_value(next, in_container, &mut open)?;
            if open.len() > MAX_SKIP_NESTING {
                return Err(format!(
                    "values nest deeper than {MAX_SKIP_NESTING} at byte {}",
                    self.at
                ));
            }
        }
        Ok(())
    }

    /// One `SchemaElement`: its `num_children` (field 5), 0 when absent.
    fn schema_element(&mut self) -> Result<i64, String> {
        let mut last_id = 0;
        let mut children = 0;
        while let Some((ty, id)) = self.field_header(&mut last_id)? {
            if id == 5 && ty == I32 {
                children = self.zigzag()?;
            } else {
                self.skip(ty)?;
            }
        }
        Ok(children)
    }

    /// The schema list's depth: elements are the tree in pre-order, each group followed by
    /// its `num_children` children.
    fn schema_list(&mut self, limit: usize) -> Result<usize, String> {
        let (element, len) = self.list_header()?;
        if len > 0 && element != STRUCT {
            return Err(format!(
                "the schema is a list of type code {element}, not of structs"
            ));
        }
        // Children still to come of each group open above the next element.
        let mut open: Vec<i64> = Vec::new();
        let mut deepest = 0;
        for _ in 0..len {
            deepest = deepest.max(open.len());
            if deepest > limit {
                return Ok(deepest);
            }
            let children = self.schema_element()?;
            if let Some(left) = open.last_mut() {
                *left -= 1;
            }
            if children > 0 {
                open.push(children);
            }
            while open.last() == Some(&0) {
                open.pop();
            }
            if open.is_empty() {
                // The root's tree is complete (elements after it are the decoder's to refuse).
                break;
            }
        }
        Ok(deepest)
    }
}

/// A type code a value can have (not the stop).
fn is_value_type(ty: u8) -> bool {
    (TRUE..=UUID).contains(&ty)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use parquet::basic::{Repetition, Type as Physical};
    use parquet::file::metadata::ParquetMetaDataReader;
    use parquet::file::writer::SerializedFileWriter;
    use parquet::schema::types::Type;

    use super::*;

    /// The metadata bytes of a file written by the Parquet crate with `schema`, and the
    /// depth of the schema as the crate decodes it again.
    fn written(schema: Type) -> (Vec<u8>, usize) {
        let mut file = Vec::new();
        let writer =
            SerializedFileWriter::new(&mut file, Arc::new(schema), Default::default()).expect("writer");
        writer.close().expect("close");
        let len = u32::from_le_bytes(file[file.len() - 8..file.len() - 4].try_into().unwrap());
        let metadata = file[file.len() - 8 - len as usize..file.len() - 8].to_vec();
        let decoded = ParquetMetaDataReader::decode_metadata(&metadata).expect("decode");
        let depth = tree_depth(decoded.file_metadata().schema_descr().root_schema());
        (metadata, depth)
    }

    /// Levels under the root (1 for a flat schema), counted without recursion: the oracle of
    /// the footer walk's depth.
    fn tree_depth(root: &Type) -> usize {
        let mut deepest = 0;
        let mut stack = vec![(root, 0usize)];
        while let Some((node, depth)) = stack.pop() {
            deepest = deepest.max(depth);
            if node.is_group() {
                stack.extend(node.get_fields().iter().map(|f| (f.as_ref(), depth + 1)));
            }
        }
        deepest
    }

    #[test]
    fn the_oracle_counts_levels_under_the_root() {
        use parquet::schema::parser::parse_message_type;
        let flat = parse_message_type("message m { required int32 a; optional binary b; }").expect("flat");
        assert_eq!(tree_depth(&flat), 1);
        let nested = parse_message_type(
            "message m { optional group g { optional group h { required int32 x; } } required int32 y; }",
        )
        .expect("nested");
        assert_eq!(tree_depth(&nested), 3);
    }

    fn leaf(name: &str) -> Arc<Type> {
        Arc::new(
            Type::primitive_type_builder(name, Physical::INT64)
                .with_repetition(Repetition::OPTIONAL)
                .build()
                .expect("leaf"),
        )
    }

    fn group(name: &str, fields: Vec<Arc<Type>>) -> Type {
        Type::group_type_builder(name)
            .with_repetition(Repetition::OPTIONAL)
            .with_fields(fields)
            .build()
            .expect("group")
    }

    fn root(fields: Vec<Arc<Type>>) -> Type {
        Type::group_type_builder("schema")
            .with_fields(fields)
            .build()
            .expect("root")
    }

    #[test]
    fn depths_agree_with_the_parquet_crates_own_tree() {
        let chain = |levels: usize| {
            let mut node = leaf("leaf");
            for level in 0..levels {
                node = Arc::new(group(&format!("g{level}"), vec![node]));
            }
            node
        };
        let schemas = vec![
            root(vec![leaf("a")]),
            root(vec![leaf("a"), leaf("b"), leaf("c")]),
            root(vec![chain(3), leaf("b")]),
            // The deep branch last, after a shallow sibling closes.
            root(vec![Arc::new(group("s", vec![leaf("x")])), chain(7), leaf("z")]),
            root(vec![
                chain(2),
                Arc::new(group("wide", vec![chain(1), chain(5), leaf("y")])),
            ]),
            root(vec![chain(40)]),
        ];
        for schema in schemas {
            let (metadata, want) = written(schema);
            assert_eq!(schema_depth(&metadata, 64), Ok(want));
        }
    }

    #[test]
    fn counting_stops_past_the_limit() {
        let mut node = leaf("leaf");
        for level in 0..20 {
            node = Arc::new(group(&format!("g{level}"), vec![node]));
        }
        let (metadata, want) = written(root(vec![node]));
        assert_eq!(want, 21);
        assert_eq!(schema_depth(&metadata, 10), Ok(11));
        assert_eq!(schema_depth(&metadata, 21), Ok(21));
    }

    #[test]
    fn malformed_bytes_are_named_never_a_panic() {
        let (metadata, _) = written(root(vec![leaf("a"), leaf("b")]));
        // Every prefix: cut short inside some value, or after the schema (which is all the
        // walk reads: the rest is the decoder's).
        let whole = schema_depth(&metadata, 64);
        assert_eq!(whole, Ok(1));
        let mut cut_in_schema = 0;
        for end in 0..metadata.len() {
            match schema_depth(&metadata[..end], 64) {
                Err(reason) => {
                    assert!(
                        reason.contains("ends at byte") || reason.contains("remain"),
                        "{reason}"
                    );
                    cut_in_schema += 1;
                }
                ok => assert_eq!(ok, whole, "cut at {end}"),
            }
        }
        assert!(cut_in_schema > 10, "{cut_in_schema}");
        // A string claiming far more than remains, inside the first schema element.
        let lie = [0x15, 0x02, 0x19, 0x1c, 0x48, 0xff, 0xff, 0xff, 0xff, 0x0f];
        let err = schema_depth(&lie, 64).expect_err("a lying length");
        assert!(err.contains("claims"), "{err}");
        // A list claiming more elements than bytes remain.
        let err = schema_depth(&[0x19, 0xfc, 0xff, 0xff, 0xff, 0xff, 0x0f], 64).expect_err("a lying count");
        assert!(err.contains("claims"), "{err}");
        // Structs nested in an unknown field, deeper than any skip allows.
        let mut nested = vec![0x1c; 100];
        nested.extend([0x00; 100]);
        let err = schema_depth(&nested, 64).expect_err("nested");
        assert!(err.contains("nest deeper"), "{err}");
        // Seeded garbage of every length: an answer or an error, never a panic or a hang.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for len in 0..2_000 {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let _ = schema_depth(&bytes, 64);
        }
    }
}
