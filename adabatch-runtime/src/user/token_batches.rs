//! Language-model data: token files as datasets, and the collates that turn their
//! examples into batches.
//!
//! An example is a document ([`TokenDocuments`]) or a window of a token stream
//! ([`TokenWindows`]); its [`Dataset::example_len`] is the positions it occupies, so
//! that `--max-tokens-per-batch` plans global batches and balances ranks by tokens.
//! The engine hands every example to exactly one rank once per epoch; packing is
//! the collate's work, per rank and micro-batch:
//!
//! - [`PackedCollate`] packs a micro-batch's documents into rows of `seq_len`
//!   positions ([`PackedBatch`]), positions restarting per document and a document
//!   id per position for a block-diagonal causal mask;
//! - [`WindowCollate`] stacks windows into inputs and targets shifted by one
//!   ([`WindowBatch`]).
//!
//! Targets are Hugging Face's labels: the next token, or [`IGNORE_INDEX`] where
//! there is none.

use candle_core::{Device, Tensor};

use crate::data::token_files::{TokenDocuments, TokenWindows};
use crate::user::data::{Collate, Dataset};
use crate::user::loss::{per_example_token_cross_entropy, TokenReduction};
use crate::user::train_model::Batch;

/// The target of a position that predicts nothing (Hugging Face's `-100`).
pub const IGNORE_INDEX: i64 = -100;

/// A document's token ids (or any sequence of ids packed as one document).
pub type Document = Vec<u32>;

impl Dataset for TokenDocuments {
    type Item = Document;
    fn len(&self) -> usize {
        TokenDocuments::len(self)
    }
    fn get(&self, index: usize) -> Document {
        self.document(index)
    }
    /// The document's tokens, its EOS included: the positions it fills when packed.
    fn example_len(&self, index: usize) -> usize {
        self.document_len(index)
    }
}

impl Dataset for TokenWindows {
    type Item = Vec<u32>;
    fn len(&self) -> usize {
        TokenWindows::len(self)
    }
    fn get(&self, index: usize) -> Vec<u32> {
        self.window(index)
    }
    /// `seq_len`: the positions a window fills (its extra token is only a target).
    fn example_len(&self, _index: usize) -> usize {
        self.seq_len()
    }
}

/// Packs documents into rows of `seq_len` positions.
///
/// **Packing.** Documents are taken in order; a document longer than `seq_len` is cut
/// into pieces of `seq_len` tokens and a shorter remainder. Each piece goes into the
/// first row with room for all of it, or opens a new row (first fit), so no piece
/// crosses a row boundary and the only padding (`pad_id`) is at the end of rows.
///
/// **Targets.** A position's target is the next token of *its document*, or
/// [`IGNORE_INDEX`] after the document's last token and on padding. The last token
/// of a piece therefore predicts the first token of the next piece, from the
/// piece's context alone (as a window of a token stream does): a document of `n`
/// tokens has `n - 1` targets however it is cut, and all of its losses, every piece
/// included, count towards that document ([`PackedBatch::per_document_sum`]).
///
/// **Attention.** Without cross-document attention every piece is a segment of its
/// own: positions restart at 0 and `document_ids` numbers the segments of the row
/// (padding is one more segment), for a block-diagonal causal mask. With it, a row
/// is one sequence, as nanoGPT trains: positions run `0..seq_len` and the ids are
/// all 0; targets still stop at document ends.
///
/// **Without packing** ([`PackedCollate::with_packing`]`(false)`, the baseline that
/// packing is measured against) every piece has a row of its own, padded to the
/// micro-batch's longest piece (as transformers' `DataCollatorWithPadding` pads to
/// the longest sequence); the rows keep the same layout and losses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackedCollate {
    /// Positions per row.
    pub seq_len: usize,
    /// The id written into padding positions.
    pub pad_id: u32,
    /// Whether a token may attend to earlier documents of its row.
    pub cross_document_attention: bool,
    /// Whether pieces share rows (`true`, the default) or each has its own.
    pub packing: bool,
}

/// A packed micro-batch on the host: what [`PackedBatch`] holds, as row-major
/// vectors of `rows * seq_len` values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackedRows {
    /// Rows used (at least 1).
    pub rows: usize,
    /// Positions per row.
    pub seq_len: usize,
    /// Token ids; `pad_id` on padding.
    pub input_ids: Vec<u32>,
    /// Next token of the same document, or [`IGNORE_INDEX`].
    pub targets: Vec<i64>,
    /// Position of each token in its segment (or row, with cross-document attention).
    pub position_ids: Vec<u32>,
    /// Segment of each position within its row (all 0 with cross-document attention).
    pub document_ids: Vec<u32>,
    /// Which document of the micro-batch each position belongs to; the number of
    /// documents on padding.
    pub token_document_index: Vec<u32>,
    /// Documents packed (empty ones included: they occupy no position).
    pub num_documents: usize,
    /// Targets other than [`IGNORE_INDEX`].
    pub num_targets: usize,
    /// Each document's targets other than [`IGNORE_INDEX`] (its length less one).
    pub document_targets: Vec<usize>,
}

/// One piece of a document: `len` tokens from `offset`.
#[derive(Debug, Clone, Copy)]
struct Piece {
    document: usize,
    offset: usize,
    len: usize,
}

impl PackedCollate {
    /// Packing into rows of `seq_len`, padding with `pad_id`, documents not
    /// attending to each other.
    pub fn new(seq_len: usize, pad_id: u32) -> Self {
        Self {
            seq_len,
            pad_id,
            cross_document_attention: false,
            packing: true,
        }
    }

    /// The same, packing pieces into shared rows or giving each a row of its own
    /// padded to the longest piece of the micro-batch.
    pub fn with_packing(self, packing: bool) -> Self {
        Self { packing, ..self }
    }

    /// The same, with tokens attending across documents of a row or not.
    pub fn with_cross_document_attention(self, allowed: bool) -> Self {
        Self {
            cross_document_attention: allowed,
            ..self
        }
    }

    /// Packs `documents` on the host (see the type's docs for the layout).
    pub fn pack(&self, documents: &[Document]) -> candle_core::Result<PackedRows> {
        if self.seq_len == 0 {
            candle_core::bail!("PackedCollate: seq_len must be at least 1");
        }
        if documents.len() >= u32::MAX as usize {
            candle_core::bail!("PackedCollate: {} documents", documents.len());
        }
        let rows = self.place(documents);
        let width = if self.packing {
            self.seq_len
        } else {
            let longest = rows.iter().flatten().map(|piece| piece.len).max();
            longest.unwrap_or(1)
        };
        let cells = rows.len() * width;
        let mut out = PackedRows {
            rows: rows.len(),
            seq_len: width,
            input_ids: Vec::with_capacity(cells),
            targets: Vec::with_capacity(cells),
            position_ids: Vec::with_capacity(cells),
            document_ids: Vec::with_capacity(cells),
            token_document_index: Vec::with_capacity(cells),
            num_documents: documents.len(),
            num_targets: 0,
            // A document's last token predicts nothing, however it is cut.
            document_targets: documents
                .iter()
                .map(|d| d.len().saturating_sub(1))
                .collect(),
        };
        for row in &rows {
            self.write_row(documents, row, &mut out);
        }
        out.num_targets = out.targets.iter().filter(|&&t| t != IGNORE_INDEX).count();
        Ok(out)
    }

    /// First-fit placement of the documents' pieces into rows (at least one row).
    fn place(&self, documents: &[Document]) -> Vec<Vec<Piece>> {
        let mut rows: Vec<Vec<Piece>> = Vec::new();
        let mut fill: Vec<usize> = Vec::new();
        for (document, tokens) in documents.iter().enumerate() {
            for offset in (0..tokens.len()).step_by(self.seq_len) {
                let len = self.seq_len.min(tokens.len() - offset);
                let piece = Piece {
                    document,
                    offset,
                    len,
                };
                let room = |&f: &usize| self.packing && f + len <= self.seq_len;
                match fill.iter().position(room) {
                    Some(r) => {
                        rows[r].push(piece);
                        fill[r] += len;
                    }
                    None => {
                        rows.push(vec![piece]);
                        fill.push(len);
                    }
                }
            }
        }
        if rows.is_empty() {
            rows.push(Vec::new());
        }
        rows
    }

    /// Appends one row: its pieces in placement order, then padding.
    fn write_row(&self, documents: &[Document], row: &[Piece], out: &mut PackedRows) {
        let cross = self.cross_document_attention;
        let mut column = 0u32;
        for (segment, piece) in row.iter().enumerate() {
            // A slice: `Dataset::get` on `Vec` would shadow `<[u32]>::get`.
            let tokens: &[u32] = &documents[piece.document];
            for (j, &token) in tokens[piece.offset..piece.offset + piece.len]
                .iter()
                .enumerate()
            {
                let next = tokens.get(piece.offset + j + 1);
                out.input_ids.push(token);
                out.targets
                    .push(next.map_or(IGNORE_INDEX, |&t| i64::from(t)));
                out.position_ids.push(if cross { column } else { j as u32 });
                out.document_ids
                    .push(if cross { 0 } else { segment as u32 });
                out.token_document_index.push(piece.document as u32);
                column += 1;
            }
        }
        let padding_segment = if cross { 0 } else { row.len() as u32 };
        for _ in column as usize..out.seq_len {
            out.input_ids.push(self.pad_id);
            out.targets.push(IGNORE_INDEX);
            out.position_ids.push(if cross { column } else { 0 });
            out.document_ids.push(padding_segment);
            out.token_document_index.push(documents.len() as u32);
            column += 1;
        }
    }
}

/// Packed documents on a device: `[rows, seq_len]` tensors (see [`PackedCollate`]).
#[derive(Debug, Clone)]
pub struct PackedBatch {
    /// Token ids, `u32`.
    pub input_ids: Tensor,
    /// Next token of the same document or [`IGNORE_INDEX`], `i64`.
    pub targets: Tensor,
    /// Positions for the model's position embedding or rope, `u32`.
    pub position_ids: Tensor,
    /// Segment of each position within its row, `u32`: position `i` may attend to
    /// `j <= i` where the ids are equal.
    pub document_ids: Tensor,
    /// Document of the micro-batch each position belongs to, `u32`; padding holds
    /// `num_examples()`.
    pub token_document_index: Tensor,
    num_documents: usize,
    num_targets: usize,
    document_targets: Vec<usize>,
}

impl PackedBatch {
    /// Moves host rows to `device`.
    pub fn from_rows(rows: &PackedRows, device: &Device) -> candle_core::Result<Self> {
        let shape = (rows.rows, rows.seq_len);
        let u32s = |v: &[u32]| Tensor::from_slice(v, shape, device);
        Ok(Self {
            input_ids: u32s(&rows.input_ids)?,
            targets: Tensor::from_slice(&rows.targets, shape, device)?,
            position_ids: u32s(&rows.position_ids)?,
            document_ids: u32s(&rows.document_ids)?,
            token_document_index: u32s(&rows.token_document_index)?,
            num_documents: rows.num_documents,
            num_targets: rows.num_targets,
            document_targets: rows.document_targets.clone(),
        })
    }

    /// Each document's sum of `per_token` `[rows, seq_len]` (any float dtype), as
    /// `[num_examples()]`: the pieces of a document add up, padding is left out.
    /// Differentiable (an `index_add`), for [`TrainModel::per_example_loss`]
    /// with `reweight = token_count`.
    ///
    /// [`TrainModel::per_example_loss`]: crate::TrainModel::per_example_loss
    pub fn per_document_sum(&self, per_token: &Tensor) -> candle_core::Result<Tensor> {
        if per_token.dims() != self.input_ids.dims() {
            candle_core::bail!(
                "per_document_sum: the batch is {:?} but the values are {:?}",
                self.input_ids.dims(),
                per_token.dims()
            );
        }
        // Padding lands in one extra slot, then cut off.
        let slots = Tensor::zeros(
            self.num_documents + 1,
            per_token.dtype(),
            per_token.device(),
        )?;
        let index = self.token_document_index.flatten_all()?;
        slots
            .index_add(&index, &per_token.flatten_all()?, 0)?
            .narrow(0, 0, self.num_documents)
    }

    /// Each document's summed cross-entropy over its targets, `[num_examples()]`,
    /// from `logits` `[rows, seq_len, vocab]`: what `per_example_loss` returns with
    /// `reweight = token_count`.
    pub fn per_document_cross_entropy(&self, logits: &Tensor) -> candle_core::Result<Tensor> {
        let (rows, seq_len, vocab) = logits.dims3()?;
        if [rows, seq_len] != self.input_ids.dims() {
            candle_core::bail!(
                "per_document_cross_entropy: the batch is {:?} but the logits are {:?}",
                self.input_ids.dims(),
                logits.dims()
            );
        }
        // Every position as an example of one token: its own loss, 0 when ignored.
        let per_token = per_example_token_cross_entropy(
            &logits.reshape((rows * seq_len, 1, vocab))?,
            &self.targets.reshape((rows * seq_len, 1))?,
            Some(IGNORE_INDEX),
            TokenReduction::Sum,
        )?;
        self.per_document_sum(&per_token.reshape((rows, seq_len))?)
    }
}

impl Batch for PackedBatch {
    /// Documents, empty ones included.
    fn num_examples(&self) -> usize {
        self.num_documents
    }
    /// Targets other than [`IGNORE_INDEX`].
    fn num_tokens(&self) -> usize {
        self.num_targets
    }
    /// Each document's targets.
    fn example_tokens(&self) -> Option<Vec<usize>> {
        Some(self.document_targets.clone())
    }
}

impl Collate<Document> for PackedCollate {
    type Batch = PackedBatch;
    fn collate(&self, items: &[Document], device: &Device) -> candle_core::Result<PackedBatch> {
        PackedBatch::from_rows(&self.pack(items)?, device)
    }

    /// Not with cross-document attention: a document then attends to the
    /// earlier documents of its row.
    fn examples_independent(&self) -> bool {
        !self.cross_document_attention
    }
}

/// Stacks windows of `seq_len + 1` tokens (all of one length) into a
/// [`WindowBatch`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WindowCollate;

/// Windows on a device: `[windows, seq_len]` tensors.
#[derive(Debug, Clone)]
pub struct WindowBatch {
    /// A window's first `seq_len` ids, `u32`.
    pub input_ids: Tensor,
    /// Its last `seq_len` ids (each input's next token), `i64`.
    pub targets: Tensor,
    /// `0..seq_len` in every row, `u32`.
    pub position_ids: Tensor,
}

impl Batch for WindowBatch {
    fn num_examples(&self) -> usize {
        self.input_ids.dims()[0]
    }
    /// Every position has a target.
    fn num_tokens(&self) -> usize {
        self.input_ids.elem_count()
    }
}

impl Collate<Vec<u32>> for WindowCollate {
    type Batch = WindowBatch;
    fn collate(&self, items: &[Vec<u32>], device: &Device) -> candle_core::Result<WindowBatch> {
        let span = items.first().map_or(0, Vec::len);
        if span < 2 || items.iter().any(|w| w.len() != span) {
            let lengths: Vec<usize> = items.iter().map(Vec::len).collect();
            candle_core::bail!("WindowCollate: windows of one length of at least 2 tokens, got lengths {lengths:?}");
        }
        let seq_len = span - 1;
        let shape = (items.len(), seq_len);
        let inputs: Vec<u32> = items
            .iter()
            .flat_map(|w| w[..seq_len].iter().copied())
            .collect();
        let targets: Vec<i64> = items
            .iter()
            .flat_map(|w| w[1..].iter().map(|&t| i64::from(t)))
            .collect();
        let positions = Tensor::arange(0u32, seq_len as u32, device)?;
        Ok(WindowBatch {
            input_ids: Tensor::from_vec(inputs, shape, device)?,
            targets: Tensor::from_vec(targets, shape, device)?,
            position_ids: positions.unsqueeze(0)?.broadcast_as(shape)?.contiguous()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Var;
    use proptest::prelude::*;

    const PAD: u32 = 99;
    const X: i64 = IGNORE_INDEX;

    fn pack(docs: &[&[u32]], seq_len: usize, cross: bool) -> PackedRows {
        let docs: Vec<Document> = docs.iter().map(|d| d.to_vec()).collect();
        PackedCollate::new(seq_len, PAD)
            .with_cross_document_attention(cross)
            .pack(&docs)
            .unwrap()
    }

    #[test]
    fn documents_go_to_the_first_row_with_room() {
        let p = pack(&[&[1, 2, 3], &[4, 5], &[6]], 4, false);
        assert_eq!(p.rows, 2);
        assert_eq!(p.input_ids, [1, 2, 3, 6, 4, 5, PAD, PAD]);
        assert_eq!(p.targets, [2, 3, X, X, 5, X, X, X]);
        assert_eq!(p.position_ids, [0, 1, 2, 0, 0, 1, 0, 0]);
        assert_eq!(p.document_ids, [0, 0, 0, 1, 0, 0, 1, 1]);
        assert_eq!(p.token_document_index, [0, 0, 0, 2, 1, 1, 3, 3]);
        assert_eq!((p.num_documents, p.num_targets), (3, 3));
    }

    #[test]
    fn a_document_of_exactly_seq_len_fills_a_row() {
        let p = pack(&[&[1, 2, 3]], 3, false);
        assert_eq!((p.rows, p.input_ids.as_slice()), (1, [1, 2, 3].as_slice()));
        assert_eq!(p.targets, [2, 3, X]);
    }

    #[test]
    fn a_long_document_is_cut_into_pieces_whose_last_token_predicts_the_next_piece() {
        let doc: Vec<u32> = (1..=10).collect();
        let p = pack(&[&doc], 4, false);
        assert_eq!(p.rows, 3);
        assert_eq!(p.input_ids, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, PAD, PAD]);
        assert_eq!(p.targets, [2, 3, 4, 5, 6, 7, 8, 9, 10, X, X, X]);
        assert_eq!(p.position_ids, [0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 0, 0]);
        assert_eq!(p.token_document_index, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1]);
        // n tokens, n - 1 targets, however the document is cut.
        assert_eq!(p.num_targets, 9);
    }

    /// A document reads only itself unless rows are one sequence.
    #[test]
    fn documents_are_independent_without_cross_document_attention() {
        let separate = PackedCollate::new(8, PAD);
        assert!(Collate::<Document>::examples_independent(&separate));
        let shared = separate.with_cross_document_attention(true);
        assert!(!Collate::<Document>::examples_independent(&shared));
    }

    #[test]
    fn cross_document_attention_makes_a_row_one_sequence() {
        let p = pack(&[&[1, 2], &[3]], 4, true);
        assert_eq!(p.input_ids, [1, 2, 3, PAD]);
        assert_eq!(p.targets, [2, X, X, X]);
        assert_eq!(p.position_ids, [0, 1, 2, 3]);
        assert_eq!(p.document_ids, [0, 0, 0, 0]);
        assert_eq!(p.token_document_index, [0, 0, 1, 2]);
    }

    #[test]
    fn empty_documents_count_as_examples_without_positions() {
        let p = pack(&[&[], &[]], 3, false);
        assert_eq!((p.rows, p.num_documents, p.num_targets), (1, 2, 0));
        assert_eq!(p.token_document_index, [2, 2, 2]);
    }

    #[test]
    fn a_zero_seq_len_is_an_error_not_a_panic() {
        let err = PackedCollate::new(0, 0).pack(&[vec![1]]).unwrap_err();
        assert!(err.to_string().contains("seq_len"), "{err}");
    }

    fn batch(docs: &[&[u32]], seq_len: usize) -> PackedBatch {
        let docs: Vec<Document> = docs.iter().map(|d| d.to_vec()).collect();
        PackedCollate::new(seq_len, PAD)
            .collate(&docs, &Device::Cpu)
            .unwrap()
    }

    #[test]
    fn per_document_sums_add_pieces_and_leave_padding_out_with_gradients() {
        let b = batch(&[&[1, 2, 3, 4, 5, 6], &[7, 8]], 4);
        assert_eq!((b.num_examples(), b.num_tokens()), (2, 6));
        assert_eq!(b.input_ids.dims(), [2, 4]);
        // Rows [1 2 3 4] [5 6 7 8]: position p holds 10^p, so the sums show who got what.
        let values: Vec<f32> = (0..8).map(|p| 10f32.powi(p)).collect();
        let v = Var::from_tensor(&Tensor::from_vec(values, (2, 4), &Device::Cpu).unwrap()).unwrap();
        let sums = b.per_document_sum(v.as_tensor()).unwrap();
        assert_eq!(
            sums.to_vec1::<f32>().unwrap(),
            [1.0 + 10.0 + 100.0 + 1e3 + 1e4 + 1e5, 1e6 + 1e7]
        );
        let grads = sums.sum_all().unwrap().backward().unwrap();
        let g = grads.get(&v).unwrap().flatten_all().unwrap();
        assert_eq!(g.to_vec1::<f32>().unwrap(), [1.0; 8]);

        let padded = batch(&[&[1, 2], &[3]], 4);
        let ones = Tensor::ones((1, 4), candle_core::DType::F32, &Device::Cpu).unwrap();
        let sums = padded.per_document_sum(&ones).unwrap();
        assert_eq!(
            sums.to_vec1::<f32>().unwrap(),
            [2.0, 1.0],
            "padding is left out"
        );
        assert!(padded.per_document_sum(&ones.reshape(4).unwrap()).is_err());
    }

    #[test]
    fn per_document_cross_entropy_sums_each_documents_targets() {
        let b = batch(&[&[1, 2, 3, 4, 5], &[6, 7], &[8]], 4);
        let vocab = 10;
        // Uniform logits: every target costs ln(vocab).
        // Rows [1 2 3 4] [5 6 7 8]: the short pieces share the second row.
        assert_eq!(b.input_ids.dims(), [2, 4]);
        let logits = Tensor::zeros((2, 4, vocab), candle_core::DType::F32, &Device::Cpu).unwrap();
        assert!(b
            .per_document_cross_entropy(&logits.narrow(0, 0, 1).unwrap())
            .is_err());
        let got = b
            .per_document_cross_entropy(&logits)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let ln = (vocab as f32).ln();
        for (g, targets) in got.iter().zip([4.0, 1.0, 0.0]) {
            assert!((g - targets * ln).abs() < 1e-5, "{got:?}");
        }
    }

    #[test]
    fn windows_stack_into_inputs_and_shifted_targets() {
        let b = WindowCollate
            .collate(&[vec![1, 2, 3], vec![4, 5, 6]], &Device::Cpu)
            .unwrap();
        assert_eq!(b.input_ids.to_vec2::<u32>().unwrap(), [[1, 2], [4, 5]]);
        assert_eq!(b.targets.to_vec2::<i64>().unwrap(), [[2, 3], [5, 6]]);
        assert_eq!(b.position_ids.to_vec2::<u32>().unwrap(), [[0, 1], [0, 1]]);
        assert_eq!((b.num_examples(), b.num_tokens()), (2, 4));
        assert!(WindowCollate
            .collate(&[vec![1, 2], vec![3]], &Device::Cpu)
            .is_err());
        assert!(WindowCollate.collate(&[vec![1]], &Device::Cpu).is_err());
    }

    #[test]
    fn token_files_are_datasets_with_lengths_in_positions() {
        use crate::data::token_files::{TokenFile, TokenWidth};
        let dir = std::env::temp_dir().join(format!("adabatch-user-tokens-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("docs.bin");
        let tokens: [u16; 7] = [5, 6, 0, 7, 0, 8, 9];
        std::fs::write(
            &path,
            tokens
                .iter()
                .flat_map(|t| t.to_le_bytes())
                .collect::<Vec<_>>(),
        )
        .unwrap();
        let open = || TokenFile::open(&path, TokenWidth::U16, 10).unwrap();
        let docs = TokenDocuments::new(open(), 0).unwrap();
        assert_eq!(Dataset::len(&docs), 3);
        assert_eq!(Dataset::get(&docs, 1), [7, 0]);
        assert_eq!(
            (0..3).map(|i| docs.example_len(i)).collect::<Vec<_>>(),
            [3, 2, 2]
        );
        let windows = TokenWindows::new(open(), 2).unwrap();
        assert_eq!((Dataset::len(&windows), windows.example_len(0)), (2, 2));
        assert_eq!(Dataset::get(&windows, 1), [7, 0, 8]);
    }

    /// Each segment of `p`: (row, first column, document, tokens).
    fn segments(p: &PackedRows) -> Vec<(usize, usize, usize, usize)> {
        let mut out = Vec::new();
        for row in 0..p.rows {
            let at = |c: usize| p.token_document_index[row * p.seq_len + c] as usize;
            let mut c = 0;
            while c < p.seq_len && at(c) < p.num_documents {
                let start = c;
                while c < p.seq_len && at(c) == at(start) {
                    c += 1;
                }
                out.push((row, start, at(start), c - start));
            }
            // Padding only at the tail.
            assert_padding_tail(p, row, c);
        }
        out
    }

    fn assert_padding_tail(p: &PackedRows, row: usize, from: usize) {
        for c in from..p.seq_len {
            let i = row * p.seq_len + c;
            assert_eq!(p.token_document_index[i] as usize, p.num_documents);
            assert_eq!((p.input_ids[i], p.targets[i]), (PAD, X));
        }
    }

    /// Checks one segment's positions, segment ids and targets; returns its tokens.
    fn check_segment(
        p: &PackedRows,
        seg: (usize, usize, usize, usize),
        ordinal: usize,
        doc: &[u32],
        offset: usize,
        cross: bool,
    ) -> Vec<u32> {
        let (row, start, _, len) = seg;
        (0..len)
            .map(|j| {
                let i = row * p.seq_len + start + j;
                let position = if cross { start + j } else { j };
                assert_eq!(p.position_ids[i] as usize, position);
                assert_eq!(p.document_ids[i] as usize, if cross { 0 } else { ordinal });
                let next = doc.get(offset + j + 1).map_or(X, |&t| i64::from(t));
                assert_eq!(p.targets[i], next, "the next token of the same document");
                p.input_ids[i]
            })
            .collect()
    }

    fn check_packing(docs: &[Document], seq_len: usize, cross: bool, packing: bool) {
        let p = PackedCollate::new(seq_len, PAD)
            .with_cross_document_attention(cross)
            .with_packing(packing)
            .pack(docs)
            .unwrap();
        for v in [
            &p.input_ids,
            &p.position_ids,
            &p.document_ids,
            &p.token_document_index,
        ] {
            assert_eq!(v.len(), p.rows * p.seq_len);
        }
        let pieces: usize = docs.iter().map(|d| d.len().div_ceil(seq_len)).sum();
        if packing {
            assert_eq!(p.seq_len, seq_len);
            assert!(p.rows <= pieces.max(1));
        } else {
            // A row per piece, as wide as the longest.
            let longest = docs.iter().map(|d| d.len().min(seq_len)).max().unwrap_or(0);
            assert_eq!((p.rows, p.seq_len), (pieces.max(1), longest.max(1)));
        }
        let segs = segments(&p);
        let mut rebuilt = vec![Vec::new(); docs.len()];
        // A document's full pieces come in row order; only its last piece may be
        // shorter, and first fit may place it in an earlier row.
        let mut order: Vec<usize> = (0..segs.len()).collect();
        order.sort_by_key(|&s| (segs[s].2, segs[s].3 < seq_len));
        for s in order {
            let (row, _, d, len) = segs[s];
            assert!(len <= seq_len);
            let ordinal = segs
                .iter()
                .filter(|o| o.0 == row && o.1 < segs[s].1)
                .count();
            let offset = rebuilt[d].len();
            let tokens = check_segment(&p, segs[s], ordinal, &docs[d], offset, cross);
            rebuilt[d].extend(tokens);
        }
        assert_eq!(rebuilt, docs, "every token once, in order");
        let targets = p.targets.iter().filter(|&&t| t != X).count();
        let want: usize = docs.iter().map(|d| d.len().saturating_sub(1)).sum();
        assert_eq!((p.num_targets, targets), (want, want));
        if !cross {
            for row in 0..p.rows {
                let segments = segs.iter().filter(|s| s.0 == row).count();
                let last = p.document_ids[(row + 1) * p.seq_len - 1] as usize;
                assert!(last == segments || last + 1 == segments);
            }
        }
    }

    proptest! {
        #[test]
        fn packing_keeps_every_token_once_in_segments_that_restart(
            docs in prop::collection::vec(prop::collection::vec(0u32..50, 0..20), 1..12),
            seq_len in 1usize..10,
            cross in any::<bool>(),
            packing in any::<bool>(),
        ) {
            check_packing(&docs, seq_len, cross, packing);
        }
    }
}
