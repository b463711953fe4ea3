//! Text ops: tokenization with a dataset's own tokenizer.
//!
//! A tokenizer is a resource, not a parameter: the query names it (or lets it default to the
//! dataset being read) and whoever runs the op resolves the name through [`Resources`]. A
//! server resolves names to the `tokenizer.json` shipped in a dataset's folder; a client gets
//! the same file from the server, so both sides tokenize with byte-identical vocabularies.
//! Nothing is downloaded at run time.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, ListBuilder, UInt32Builder};
use arrow::datatypes::{DataType, Field};
use tokenizers::Tokenizer;

use crate::op::{Context, Op, OpError, Result, Value, expect_params, int_param};
use crate::resources::{Need, NoResources, Resources};

/// Tokens given to every tokenizer [`train_tokenizer`] makes, in id order: padding is id 0.
pub const SPECIAL_TOKENS: [&str; 3] = ["[PAD]", "[UNK]", "[MASK]"];

/// The file name a dataset's tokenizer has inside the dataset's folder.
pub const TOKENIZER_FILE: &str = "tokenizer.json";

/// Tokenizers by name, with an optional default: what a client holds after fetching them.
#[derive(Debug, Default, Clone)]
pub struct Tokenizers {
    default: Option<String>,
    by_name: HashMap<String, Arc<Tokenizer>>,
}

impl Tokenizers {
    pub fn new(default: Option<String>) -> Self {
        Self {
            default,
            by_name: HashMap::new(),
        }
    }

    pub fn insert(&mut self, name: impl Into<String>, tokenizer: Arc<Tokenizer>) {
        self.by_name.insert(name.into(), tokenizer);
    }

    pub fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }
}

impl Resources for Tokenizers {
    fn tokenizer(&self, name: Option<&str>) -> std::result::Result<Arc<Tokenizer>, String> {
        let Some(name) = name.or(self.default.as_deref()) else {
            return Err("no default tokenizer: name one, e.g. tokenize(body, 256, 'text')".to_owned());
        };
        self.by_name.get(name).cloned().ok_or_else(|| {
            let mut known: Vec<&str> = self.by_name.keys().map(String::as_str).collect();
            known.sort_unstable();
            format!("no tokenizer named '{name}' (known: {})", known.join(", "))
        })
    }
}

/// Parses a `tokenizer.json` for streams: the file's `padding` and `truncation` settings are
/// cleared (a published file often pads and cuts every sequence to 128 for its own model;
/// [`Tokenize`] truncates to the call's `max_len` and never pads), its normalizer,
/// pre-tokenizer, model and post-processor (the special tokens) are kept.
pub fn load_tokenizer(bytes: &[u8]) -> std::result::Result<Tokenizer, String> {
    let mut tokenizer = Tokenizer::from_bytes(bytes).map_err(|e| format!("invalid tokenizer.json: {e}"))?;
    tokenizer.with_padding(None);
    tokenizer
        .with_truncation(None)
        .map_err(|e| format!("invalid tokenizer.json: {e}"))?;
    Ok(tokenizer)
}

/// The prefix of a tokenizer's content id ([`tokenizer_id`]).
pub const TOKENIZER_ID_PREFIX: &str = "sha256:";

/// A tokenizer's name by its content: `sha256:` and the SHA-256 of its `tokenizer.json`
/// bytes in hex. A trainer names the tokenizer it gives the servers by it, so the same file
/// is one entry on a server whoever sends it, and another file never takes its place.
pub fn tokenizer_id(json: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, json);
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("{TOKENIZER_ID_PREFIX}{hex}")
}

/// Trains a BPE tokenizer (whitespace/punctuation pre-tokenization, [`SPECIAL_TOKENS`] first)
/// on `corpus` and returns its JSON. Training is deterministic: the same corpus gives the same
/// bytes.
pub fn train_tokenizer<I, S>(corpus: I, vocab_size: usize) -> std::result::Result<String, String>
where
    I: Iterator<Item = S> + Send,
    S: AsRef<str> + Send,
{
    use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
    use tokenizers::normalizers::NormalizerWrapper;
    use tokenizers::pre_tokenizers::PreTokenizerWrapper;
    use tokenizers::pre_tokenizers::whitespace::Whitespace;
    use tokenizers::processors::PostProcessorWrapper;
    use tokenizers::{AddedToken, DecoderWrapper, TokenizerBuilder};

    let err = |e: tokenizers::Error| e.to_string();
    let mut trainer = BpeTrainerBuilder::new()
        .show_progress(false)
        .vocab_size(vocab_size)
        .min_frequency(2)
        .special_tokens(
            SPECIAL_TOKENS
                .iter()
                .map(|t| AddedToken::from(*t, true))
                .collect(),
        )
        .build();
    let model = BPE::builder()
        .unk_token(SPECIAL_TOKENS[1].to_owned())
        .build()
        .map_err(err)?;
    let mut tokenizer = TokenizerBuilder::<
        BPE,
        NormalizerWrapper,
        PreTokenizerWrapper,
        PostProcessorWrapper,
        DecoderWrapper,
    >::new()
    .with_model(model)
    .with_pre_tokenizer(Some(PreTokenizerWrapper::Whitespace(Whitespace {})))
    .build()
    .map_err(err)?;
    tokenizer.train(&mut trainer, corpus).map_err(err)?;
    let tokenizer: Tokenizer = tokenizer.into();
    tokenizer.to_string(false).map_err(err)
}

/// `tokenize(text, max_len[, tokenizer[, special]])`: each text's token ids as the
/// tokenizer's own library gives them, `encode(text, add_special_tokens=True)` with
/// truncation to `max_len`: the text's tokens cut (from the right) to leave room for the
/// special tokens the tokenizer's post-processor adds (`[CLS] … [SEP]`, a BOS), which are
/// kept. `special = 0` leaves the special tokens out (`add_special_tokens=False`). Output:
/// `List<UInt32>`, never padded. The tokenizer defaults to the one shipped with the dataset
/// being read (also when named `''`); a missing one is [`OpError::MissingResource`].
/// Deterministic and, for documents longer than `max_len` tokens' worth of text,
/// data-reducing.
#[derive(Debug)]
pub struct Tokenize;

/// What a `tokenize` call asks for.
struct TokenizeParams<'a> {
    max_len: usize,
    tokenizer: Option<&'a str>,
    special: bool,
}

impl Tokenize {
    fn params(params: &[Value]) -> Result<TokenizeParams<'_>> {
        expect_params("tokenize", params, 1, 3)?;
        let max_len = int_param("tokenize", params, 0, "max_len", 1..=1 << 20, None)? as usize;
        let tokenizer = match params.get(1) {
            None => None,
            Some(Value::Text(n)) if n.is_empty() => None,
            Some(Value::Text(n)) => Some(n.as_str()),
            Some(other) => {
                return Err(OpError::BadArguments {
                    op: "tokenize",
                    reason: format!("the tokenizer must be named by a string literal, got {other}"),
                });
            }
        };
        let special = int_param(
            "tokenize",
            params,
            2,
            "special (1: add special tokens, 0: not)",
            0..=1,
            Some(1),
        )? == 1;
        Ok(TokenizeParams {
            max_len,
            tokenizer,
            special,
        })
    }
}

/// Room for the text's own tokens in `max_len`: what the tokenizer's post-processor adds
/// (when `special`) is kept, so the text is cut shorter, as the library truncates.
fn text_room(tokenizer: &Tokenizer, max_len: usize, special: bool) -> Result<usize> {
    let added = match (special, tokenizer.get_post_processor()) {
        (true, Some(p)) => tokenizers::PostProcessor::added_tokens(p, false),
        _ => 0,
    };
    max_len
        .checked_sub(added)
        .filter(|r| *r > 0)
        .ok_or_else(|| OpError::BadArguments {
            op: "tokenize",
            reason: format!(
                "max_len {max_len} leaves no room for text beside the tokenizer's {added} \
                 special tokens (use a larger max_len, or special = 0)"
            ),
        })
}

/// `text`'s ids as `tokenizer.encode(text, special)` with truncation gives them: the text's
/// own tokens cut to `room` (see [`text_room`]), then post-processed.
fn encode(
    tokenizer: &Tokenizer,
    text: &str,
    room: usize,
    special: bool,
) -> std::result::Result<Vec<u32>, String> {
    let mut encoding = tokenizer.encode_fast(text, false).map_err(|e| e.to_string())?;
    encoding.truncate(room, 0, tokenizers::TruncationDirection::Right);
    if special {
        encoding = tokenizer
            .post_process(encoding, None, true)
            .map_err(|e| e.to_string())?;
    }
    Ok(encoding.get_ids().to_vec())
}

impl Op for Tokenize {
    fn name(&self) -> &'static str {
        "tokenize"
    }

    fn signature(&self) -> &'static str {
        "tokenize(text, max_len[, tokenizer[, special]])"
    }

    fn needs(&self, params: &[Value]) -> Vec<Need> {
        let name = match params.get(1) {
            Some(Value::Text(name)) if !name.is_empty() => Some(name.clone()),
            _ => None,
        };
        vec![Need::Tokenizer(name)]
    }

    fn output_field(&self, input: &Field, params: &[Value], output: &str) -> Result<Field> {
        Self::params(params)?;
        if !matches!(
            input.data_type(),
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
        ) {
            return Err(OpError::BadArguments {
                op: self.name(),
                reason: format!("expects text, got {}", input.data_type()),
            });
        }
        Ok(Field::new(
            output,
            DataType::List(Arc::new(Field::new_list_field(DataType::UInt32, false))),
            input.is_nullable(),
        ))
    }

    /// With the tokenizer at hand: `List<UInt16>` when its vocabulary fits in 16 bits.
    fn output_field_in(
        &self,
        input: &Field,
        params: &[Value],
        output: &str,
        resources: &dyn crate::Resources,
    ) -> Result<Field> {
        let field = self.output_field(input, params, output)?;
        // A missing tokenizer is refused where the call runs (or plans), by name.
        let Ok(tokenizer) = resources.tokenizer(Self::params(params)?.tokenizer) else {
            return Ok(field);
        };
        Ok(Field::new(
            output,
            DataType::List(Arc::new(Field::new_list_field(ids_type(&tokenizer), false))),
            input.is_nullable(),
        ))
    }

    /// `max_len` ids of 4 bytes, and the list's offset.
    fn max_output_bytes_per_row(&self, input: &Field, params: &[Value]) -> Result<Option<u64>> {
        self.output_field(input, params, "output")?;
        let max_len = Self::params(params)?.max_len;
        Ok(Some(max_len as u64 * 4 + 4))
    }

    fn apply_field(&self, _: &ArrayRef, _: &Field, params: &[Value], _: u64) -> Result<ArrayRef> {
        let name = Self::params(params)?.tokenizer;
        Err(OpError::MissingResource {
            op: self.name(),
            reason: NoResources
                .tokenizer(name)
                .err()
                .unwrap_or_else(|| "needs a tokenizer".to_owned()),
        })
    }

    fn apply_in(
        &self,
        input: &ArrayRef,
        field: &Field,
        params: &[Value],
        ctx: &Context<'_>,
    ) -> Result<ArrayRef> {
        self.output_field(field, params, "check")?;
        let TokenizeParams {
            max_len,
            tokenizer,
            special,
        } = Self::params(params)?;
        let tokenizer = ctx
            .resources
            .tokenizer(tokenizer)
            .map_err(|reason| OpError::MissingResource {
                op: "tokenize",
                reason,
            })?;
        let room = text_room(&tokenizer, max_len, special)?;
        let text = arrow::compute::cast(input, &DataType::Utf8).map_err(|source| OpError::Arrow {
            op: "tokenize",
            cause: source,
        })?;
        let text = text.as_string::<i32>();
        // A token spans at least one byte of text: never reserve more ids than bytes (a
        // huge max_len must not reserve rows × max_len up front).
        let ids = text.values().len().min(text.len().saturating_mul(max_len));
        let mut out = ListBuilder::with_capacity(UInt32Builder::with_capacity(ids), text.len())
            .with_field(Arc::new(Field::new_list_field(DataType::UInt32, false)));
        for (row, value) in text.iter().enumerate() {
            let Some(value) = value else {
                out.append_null();
                continue;
            };
            let ids = encode(&tokenizer, value, room, special).map_err(|reason| OpError::BadValue {
                op: "tokenize",
                row,
                reason,
            })?;
            out.values().append_slice(&ids);
            out.append(true);
        }
        narrowed("tokenize", Arc::new(out.finish()), &ids_type(&tokenizer))
    }
}

/// The type of a tokenizer's ids: `UInt16` when every id of its vocabulary (added tokens
/// included) fits, else `UInt32`. Half the bytes on the wire and in the trainer's memory, as
/// Megatron-LM stores them.
pub fn ids_type(tokenizer: &Tokenizer) -> DataType {
    if tokenizer.get_vocab_size(true) <= 1 << 16 {
        DataType::UInt16
    } else {
        DataType::UInt32
    }
}

/// A list of `UInt32` ids as a list of `item` ids (every id fits: the vocabulary says so).
fn narrowed(op: &'static str, list: ArrayRef, item: &DataType) -> Result<ArrayRef> {
    if item == &DataType::UInt32 {
        return Ok(list);
    }
    let to = match list.data_type() {
        DataType::FixedSizeList(_, n) => {
            DataType::FixedSizeList(Arc::new(Field::new_list_field(item.clone(), false)), *n)
        }
        _ => DataType::List(Arc::new(Field::new_list_field(item.clone(), false))),
    };
    arrow::compute::cast_with_options(
        &list,
        &to,
        &arrow::compute::CastOptions {
            safe: false,
            ..Default::default()
        },
    )
    .map_err(|source| OpError::Arrow { op, cause: source })
}

/// `pad_tokens(tokens, len[, pad_id])`: token lists cut or padded (with `pad_id`, default 0 =
/// `[PAD]`) to exactly `len`, as `FixedSizeList<UInt32, len>` (`UInt16` when the ids and the
/// pad id are 16-bit): a fixed-shape tensor a trainer gets as one contiguous buffer. Nulls
/// become all-padding rows.
#[derive(Debug)]
pub struct PadTokens;

impl PadTokens {
    /// The output ids' type: 16-bit ids stay 16-bit when the pad id fits.
    fn item(input: &Field, pad: u32) -> DataType {
        match input.data_type() {
            DataType::List(item) | DataType::LargeList(item) | DataType::FixedSizeList(item, _)
                if item.data_type() == &DataType::UInt16 && pad <= u32::from(u16::MAX) =>
            {
                DataType::UInt16
            }
            _ => DataType::UInt32,
        }
    }

    fn params(params: &[Value]) -> Result<(usize, u32)> {
        expect_params("pad_tokens", params, 1, 2)?;
        let len = int_param("pad_tokens", params, 0, "len", 1..=1 << 20, None)? as usize;
        let pad = int_param("pad_tokens", params, 1, "pad_id", 0..=u32::MAX as i64, Some(0))? as u32;
        Ok((len, pad))
    }
}

impl Op for PadTokens {
    fn name(&self) -> &'static str {
        "pad_tokens"
    }

    fn signature(&self) -> &'static str {
        "pad_tokens(tokens, len[, pad_id])"
    }

    fn output_field(&self, input: &Field, params: &[Value], output: &str) -> Result<Field> {
        let (len, pad) = Self::params(params)?;
        match input.data_type() {
            DataType::List(item) | DataType::LargeList(item) | DataType::FixedSizeList(item, _)
                if item.data_type().is_integer() => {}
            other => {
                return Err(OpError::BadArguments {
                    op: self.name(),
                    reason: format!("expects lists of integer token ids, got {other}"),
                });
            }
        }
        Ok(Field::new(
            output,
            DataType::FixedSizeList(
                Arc::new(Field::new_list_field(Self::item(input, pad), false)),
                len as i32,
            ),
            false,
        )
        .with_metadata(HashMap::from([(
            crate::op::SHAPE_METADATA_KEY.to_owned(),
            len.to_string(),
        )])))
    }

    fn apply_field(&self, input: &ArrayRef, field: &Field, params: &[Value], _: u64) -> Result<ArrayRef> {
        self.output_field(field, params, "check")?;
        let (len, pad) = Self::params(params)?;
        let arrow_err = |source| OpError::Arrow {
            op: "pad_tokens",
            cause: source,
        };
        let item = Arc::new(Field::new_list_field(DataType::UInt32, true));
        let as_list = arrow::compute::cast(input, &DataType::LargeList(item)).map_err(arrow_err)?;
        let list = as_list.as_list::<i64>();
        let values = list.values().as_primitive::<arrow::datatypes::UInt32Type>();
        let mut flat: Vec<u32> = Vec::with_capacity(list.len() * len);
        for row in 0..list.len() {
            let start = flat.len();
            if list.is_valid(row) {
                let (a, b) = (
                    list.value_offsets()[row] as usize,
                    list.value_offsets()[row + 1] as usize,
                );
                let b = b.min(a + len);
                if values.null_count() > 0 && (a..b).any(|i| values.is_null(i)) {
                    return Err(OpError::BadValue {
                        op: "pad_tokens",
                        row,
                        reason: "null token id".to_owned(),
                    });
                }
                flat.extend_from_slice(&values.values()[a..b]);
            }
            flat.resize(start + len, pad);
        }
        let values = arrow::array::UInt32Array::from(flat);
        let out = arrow::array::FixedSizeListArray::try_new(
            Arc::new(Field::new_list_field(DataType::UInt32, false)),
            len as i32,
            Arc::new(values),
            None,
        )
        .map_err(arrow_err)?;
        narrowed("pad_tokens", Arc::new(out), &Self::item(field, pad))
    }
}
