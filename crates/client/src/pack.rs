//! Packing token sequences into fixed-length blocks, for language-model training.
//!
//! Documents (one list of token ids per row, in the loader's order) are concatenated into
//! blocks of exactly `length` tokens, each document followed by `eos_id` when one is given.
//! Every block comes with its `position_ids`: each token's place in its own document, 0 at a
//! document's first token, as FlashAttention's variable-length kernels and flex-attention's
//! document masks take them (Hugging Face's `DataCollatorWithFlattening`).
//!
//! * **Split documents** (the default): a document cut at a block's end continues at the
//!   start of the next block, its positions continuing. No slot is padding.
//! * **Whole documents** (`split_documents = false`): a document that does not fit in what is
//!   left of a block starts the next block; the rest of the block is padding (`pad_id`, with
//!   positions counting from 0 as a segment of its own). A document longer than a block is
//!   cut to the block.
//!
//! A [`Packer`] is a function of its documents alone. Its position, [`PackPos`], says how
//! many documents it has finished and how far into the next one it is: a packer started at
//! that position, given the documents from there, makes the same blocks.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, FixedSizeListArray, Int32Array, UInt16Array, UInt32Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt16Type, UInt32Type, UInt64Type};
use arrow::record_batch::RecordBatch;

use crate::error::{ClientError, Result};

/// What a loader packs, and how (`pack=` in Python).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pack {
    /// The column of token ids (a list of integers per row, as `tokenize` makes).
    pub column: String,
    /// Tokens per block.
    pub length: usize,
    /// Appended to every document (its last token), when given.
    pub eos_id: Option<u32>,
    /// Whether a document may be cut at a block's end and continue in the next block.
    pub split_documents: bool,
    /// The id that fills a block's tail when documents are kept whole (default: `eos_id`,
    /// else 0).
    pub pad_id: Option<u32>,
}

impl From<pushdown_planner::PackStep> for Pack {
    fn from(s: pushdown_planner::PackStep) -> Self {
        Self {
            column: s.column,
            length: s.length,
            eos_id: s.eos_id,
            split_documents: s.split_documents,
            pad_id: s.pad_id,
        }
    }
}

/// The output columns of a packed loader.
pub const TOKENS: &str = "tokens";
pub const POSITION_IDS: &str = "position_ids";

impl Pack {
    /// `column` packed into blocks of `length` tokens, documents split, no end-of-document id.
    pub fn new(column: impl Into<String>, length: usize) -> Self {
        Self {
            column: column.into(),
            length,
            eos_id: None,
            split_documents: true,
            pad_id: None,
        }
    }

    /// Checks the settings against the source's schema: the column must hold lists of
    /// integers.
    pub fn check(&self, schema: &Schema) -> Result<()> {
        if self.length == 0 || self.length > i32::MAX as usize {
            return Err(ClientError::Invalid(format!(
                "pack: length must be 1 or more tokens per block, got {}",
                self.length
            )));
        }
        let field = schema.field_with_name(&self.column).map_err(|_| {
            let names: Vec<_> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            ClientError::Invalid(format!(
                "pack: no column `{}` to pack; the query's columns are {names:?}",
                self.column
            ))
        })?;
        match field.data_type() {
            DataType::List(item) | DataType::LargeList(item) | DataType::FixedSizeList(item, _)
                if item.data_type().is_integer() =>
            {
                let wide = [self.eos_id, self.pad_id]
                    .into_iter()
                    .flatten()
                    .find(|&id| id > u32::from(u16::MAX));
                match (item.data_type(), wide) {
                    (DataType::UInt16, Some(id)) => Err(ClientError::Invalid(format!(
                        "pack: id {id} does not fit the column's 16-bit token ids (the tokenizer's \
                         vocabulary has at most 65,536): give an eos_id and pad_id of the tokenizer's"
                    ))),
                    _ => Ok(()),
                }
            }
            other => Err(ClientError::Invalid(format!(
                "pack: column `{}` is {other}, not a list of token ids (tokenize(text, max_len) \
                 makes one)",
                self.column
            ))),
        }
    }

    /// The packed batches' columns: `tokens` and `position_ids`, each `[rows, length]`; the
    /// tokens as 16-bit ids when `source`'s column holds 16-bit ids (a vocabulary that fits),
    /// else 32-bit.
    pub fn schema(&self, source: &Schema) -> SchemaRef {
        let ids = match source
            .field_with_name(&self.column)
            .map(|f| f.data_type().clone())
        {
            Ok(DataType::List(item) | DataType::LargeList(item) | DataType::FixedSizeList(item, _))
                if item.data_type() == &DataType::UInt16 =>
            {
                DataType::UInt16
            }
            _ => DataType::UInt32,
        };
        let column = |name: &str, item: DataType| {
            let item = Arc::new(Field::new("item", item, false));
            Field::new(name, DataType::FixedSizeList(item, self.length as i32), false).with_metadata(
                [(
                    pushdown_ops::SHAPE_METADATA_KEY.to_string(),
                    self.length.to_string(),
                )]
                .into(),
            )
        };
        Arc::new(Schema::new(vec![
            column(TOKENS, ids),
            column(POSITION_IDS, DataType::Int32),
        ]))
    }

    fn pad(&self) -> u32 {
        self.pad_id.or(self.eos_id).unwrap_or(0)
    }
}

/// One block: its token ids and their positions.
pub type Block = (Vec<u32>, Vec<i32>);

/// Where a packer is in its documents: `done` documents emitted whole, and `offset` tokens
/// of the next one (its end-of-document id counted) already in blocks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PackPos {
    pub done: u64,
    pub offset: u64,
}

/// Blocks from documents, one block at a time.
#[derive(Debug, Clone)]
pub struct Packer {
    pack: Pack,
    pos: PackPos,
    /// The current document (its end-of-document id appended), when one is begun.
    doc: Option<Vec<u32>>,
    tokens: Vec<u32>,
    positions: Vec<i32>,
    /// Token slots filled with padding so far.
    pub padding: u64,
}

impl Packer {
    /// A packer at `pos`: the first document it is given is document `pos.done`, of which the
    /// first `pos.offset` tokens are already in earlier blocks.
    pub fn new(pack: Pack, pos: PackPos) -> Self {
        Self {
            pack,
            pos,
            doc: None,
            tokens: Vec::new(),
            positions: Vec::new(),
            padding: 0,
        }
    }

    /// Where the packer is after the blocks it has made.
    pub fn pos(&self) -> PackPos {
        self.pos
    }

    /// Whether the packer needs a document before it can go on.
    pub fn needs_document(&self) -> bool {
        self.doc.is_none()
    }

    /// Gives the packer its next document's token ids.
    pub fn push_document(&mut self, mut ids: Vec<u32>) {
        debug_assert!(self.doc.is_none());
        if let Some(eos) = self.pack.eos_id {
            ids.push(eos);
        }
        self.doc = Some(ids);
    }

    /// Fills the block being built from the current document. Returns whether a block is
    /// complete (take it with [`Self::take_block`]); otherwise the packer needs a document.
    pub fn fill(&mut self) -> bool {
        let length = self.pack.length;
        let Some(doc) = self.doc.as_ref() else {
            return self.tokens.len() == length;
        };
        let at = self.pos.offset as usize;
        let room = length - self.tokens.len();
        let left = doc.len().saturating_sub(at);
        if !self.pack.split_documents && at == 0 && left > room && !self.tokens.is_empty() {
            // A whole document that does not fit: pad this block, start it in the next.
            self.pad_block();
            return true;
        }
        let n = left.min(room);
        self.tokens.extend_from_slice(&doc[at..at + n]);
        self.positions.extend((at..at + n).map(|p| p as i32));
        self.pos.offset += n as u64;
        let ended = at + n == doc.len() || (!self.pack.split_documents && self.tokens.len() == length);
        if ended {
            // Whole documents longer than a block are cut to it: the rest is dropped.
            self.doc = None;
            self.pos = PackPos {
                done: self.pos.done + 1,
                offset: 0,
            };
        }
        self.tokens.len() == length
    }

    fn pad_block(&mut self) {
        let room = self.pack.length - self.tokens.len();
        self.tokens.extend(std::iter::repeat_n(self.pack.pad(), room));
        self.positions.extend((0..room).map(|p| p as i32));
        self.padding += room as u64;
    }

    /// The complete block: its tokens and positions.
    pub fn take_block(&mut self) -> Block {
        debug_assert_eq!(self.tokens.len(), self.pack.length);
        (
            std::mem::take(&mut self.tokens),
            std::mem::take(&mut self.positions),
        )
    }
}

/// The token ids of row `row` of a list column, as `u32` (ids past `u32::MAX` or negative
/// are refused, naming the row).
pub fn token_ids(column: &ArrayRef, row: usize) -> Result<Vec<u32>> {
    let values = match column.data_type() {
        DataType::List(_) => column.as_list::<i32>().value(row),
        DataType::LargeList(_) => column.as_list::<i64>().value(row),
        DataType::FixedSizeList(_, _) => column.as_fixed_size_list().value(row),
        other => {
            return Err(ClientError::Invalid(format!(
                "pack: {other} is not a list of token ids"
            )));
        }
    };
    let bad = |v: String| ClientError::Invalid(format!("pack: token id {v} in row {row} is not a u32"));
    match values.data_type() {
        DataType::UInt32 => Ok(values.as_primitive::<UInt32Type>().values().to_vec()),
        DataType::UInt16 => Ok(values
            .as_primitive::<UInt16Type>()
            .values()
            .iter()
            .map(|&v| u32::from(v))
            .collect()),
        DataType::UInt64 => values
            .as_primitive::<UInt64Type>()
            .values()
            .iter()
            .map(|&v| u32::try_from(v).map_err(|_| bad(v.to_string())))
            .collect(),
        _ => {
            let wide = arrow::compute::cast(&values, &DataType::Int64)
                .map_err(|e| ClientError::Invalid(format!("pack: {e}")))?;
            wide.as_primitive::<arrow::datatypes::Int64Type>()
                .values()
                .iter()
                .map(|&v| u32::try_from(v).map_err(|_| bad(v.to_string())))
                .collect()
        }
    }
}

/// Blocks as a record batch of `schema` (`Pack::schema`).
pub fn blocks_batch(
    schema: &SchemaRef,
    length: usize,
    blocks: &[(Vec<u32>, Vec<i32>)],
) -> Result<RecordBatch> {
    let tokens: Vec<u32> = blocks.iter().flat_map(|(t, _)| t.iter().copied()).collect();
    let positions: Vec<i32> = blocks.iter().flat_map(|(_, p)| p.iter().copied()).collect();
    let list = |values: ArrayRef, item: DataType| -> Result<ArrayRef> {
        let item = Arc::new(Field::new("item", item, false));
        Ok(Arc::new(FixedSizeListArray::try_new(
            item,
            length as i32,
            values,
            None,
        )?))
    };
    let tokens: ArrayRef = match schema.field_with_name(TOKENS).map(|f| f.data_type().clone()) {
        Ok(DataType::FixedSizeList(item, _)) if item.data_type() == &DataType::UInt16 => {
            // The source's ids are 16-bit: every one fits.
            Arc::new(UInt16Array::from_iter_values(tokens.iter().map(|&t| t as u16)))
        }
        _ => Arc::new(UInt32Array::from(tokens)),
    };
    let item = tokens.data_type().clone();
    let columns = vec![
        list(tokens, item)?,
        list(Arc::new(Int32Array::from(positions)), DataType::Int32)?,
    ];
    Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
}

/// The documents of packed blocks, split where a position is 0 (what a trainer's attention
/// masks do): each document's tokens, in order, the first one possibly begun before.
pub fn documents_of(tokens: &[u32], positions: &[i32]) -> Vec<Vec<u32>> {
    let mut out: Vec<Vec<u32>> = Vec::new();
    for (&t, &p) in tokens.iter().zip(positions) {
        match out.last_mut() {
            Some(doc) if p != 0 => doc.push(t),
            _ => out.push(vec![t]),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn docs(seed: u64, n: usize, max: usize) -> Vec<Vec<u32>> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        (0..n)
            .map(|d| {
                let len = rng.random_range(1..=max);
                (0..len).map(|i| (d * 1000 + i) as u32 + 1).collect()
            })
            .collect()
    }

    /// Packs `docs` from `pos`, taking `blocks` blocks.
    fn run(pack: &Pack, docs: &[Vec<u32>], pos: PackPos, blocks: usize) -> (Vec<Block>, PackPos, u64) {
        let mut packer = Packer::new(pack.clone(), pos);
        let mut next = pos.done as usize;
        let mut out = Vec::new();
        while out.len() < blocks {
            if packer.fill() {
                out.push(packer.take_block());
            } else {
                packer.push_document(docs[next].clone());
                next += 1;
            }
        }
        (out, packer.pos(), packer.padding)
    }

    #[test]
    fn split_documents_are_recovered_whole_from_the_positions() {
        for (seed, length, max) in [(1, 16, 40), (2, 16, 10), (3, 7, 7), (4, 128, 300)] {
            let all = docs(seed, 200, max);
            let mut pack = Pack::new("t", length);
            pack.eos_id = Some(0);
            let (blocks, pos, padding) = run(&pack, &all, PackPos::default(), 40);
            assert_eq!(padding, 0, "no padding when documents split");
            let tokens: Vec<u32> = blocks.iter().flat_map(|b| b.0.clone()).collect();
            let positions: Vec<i32> = blocks.iter().flat_map(|b| b.1.clone()).collect();
            let got = documents_of(&tokens, &positions);
            // Every document finished so far, its eos last, in order.
            for (i, doc) in got.iter().take(pos.done as usize).enumerate() {
                let mut want = all[i].clone();
                want.push(0);
                assert_eq!(doc, &want, "seed {seed}: document {i}");
            }
            assert_eq!(got.len() as u64, pos.done + u64::from(pos.offset > 0));
        }
    }

    #[test]
    fn a_packer_resumed_at_any_block_makes_the_same_blocks() {
        for split in [true, false] {
            let all = docs(9, 300, 50);
            let mut pack = Pack::new("t", 32);
            pack.split_documents = split;
            pack.eos_id = Some(7);
            let (whole, _, _) = run(&pack, &all, PackPos::default(), 60);
            for cut in [1, 2, 17, 59] {
                let (first, pos, _) = run(&pack, &all, PackPos::default(), cut);
                let (rest, _, _) = run(&pack, &all, pos, 60 - cut);
                assert_eq!([first, rest].concat(), whole, "split {split}, cut at {cut}");
            }
        }
    }

    #[test]
    fn whole_documents_start_blocks_and_long_ones_are_cut() {
        let all = vec![vec![1; 5], vec![2; 4], vec![3; 20], vec![4; 2], vec![5; 8]];
        let mut pack = Pack::new("t", 8);
        pack.split_documents = false;
        pack.pad_id = Some(9);
        let (blocks, pos, padding) = run(&pack, &all, PackPos::default(), 4);
        let rows: Vec<Vec<u32>> = blocks.iter().map(|b| b.0.clone()).collect();
        assert_eq!(rows[0], [1, 1, 1, 1, 1, 9, 9, 9]);
        assert_eq!(blocks[0].1, [0, 1, 2, 3, 4, 0, 1, 2]);
        assert_eq!(rows[1], [2, 2, 2, 2, 9, 9, 9, 9]);
        assert_eq!(rows[2], [3; 8], "cut to the block");
        assert_eq!(blocks[2].1, (0..8).collect::<Vec<_>>());
        assert_eq!(&rows[3][..2], [4, 4]);
        assert_eq!(padding, 3 + 4 + 6);
        assert_eq!(pos, PackPos { done: 4, offset: 0 });
    }

    #[test]
    fn token_ids_read_every_integer_list_and_refuse_what_is_not_a_u32() {
        use arrow::array::{ListArray, types::Int64Type};
        let list: ArrayRef = Arc::new(ListArray::from_iter_primitive::<Int64Type, _, _>(vec![
            Some(vec![Some(1), Some(2)]),
            Some(vec![Some(-1)]),
        ]));
        assert_eq!(token_ids(&list, 0).expect("ids"), [1, 2]);
        let e = token_ids(&list, 1).expect_err("negative").to_string();
        assert!(e.contains("-1") && e.contains("row 1"), "{e}");
        let mut pack = Pack::new("body", 8);
        let schema = Schema::new(vec![Field::new("body", DataType::Utf8, true)]);
        assert!(
            pack.check(&schema)
                .expect_err("text")
                .to_string()
                .contains("not a list of token ids")
        );
        pack.column = "nope".into();
        assert!(
            pack.check(&schema)
                .expect_err("missing")
                .to_string()
                .contains("no column `nope`")
        );
    }

    #[test]
    fn random_documents_pack_without_loss() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        for _ in 0..20 {
            let length = rng.random_range(1..100);
            let all = docs(rng.random(), 400, rng.random_range(1..200));
            let pack = Pack::new("t", length);
            let (blocks, pos, _) = run(&pack, &all, PackPos::default(), 50);
            let tokens: Vec<u32> = blocks.iter().flat_map(|b| b.0.clone()).collect();
            let want: Vec<u32> = all.iter().flatten().copied().take(tokens.len()).collect();
            assert_eq!(tokens, want);
            let emitted: u64 = all[..pos.done as usize]
                .iter()
                .map(|d| d.len() as u64)
                .sum::<u64>()
                + pos.offset;
            assert_eq!(emitted, tokens.len() as u64);
        }
    }
}
